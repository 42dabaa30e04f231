"""An inference plan takes a zero padding of a relu's output into the max pool
that reads it (Pool.rewrite): the pool's kernel skips padded cells, which
gives the same maxima where the real cells are >= 0 and every window holds
one. Everything else keeps its padded copy."""
import pickle

import numpy as np
import pytest
from unoptimized import optimized_and_plain

import cyback as K
from cyback.ops import pool as pool_ops


def _pad(x, rank, pads, fmt):
    if rank == 2:
        return K.spatial_2d_padding(x, pads, data_format=fmt)
    return K.spatial_3d_padding(x, pads, data_format=fmt)


def _pool(x, rank, size, strides, padding, fmt, mode="max"):
    fn = K.pool2d if rank == 2 else K.pool3d
    return fn(x, size, strides=strides, padding=padding, data_format=fmt, pool_mode=mode)


# rank, spatial size, pads, pool size, strides: ResNet50's (1, 1) before a
# 3x3 / 2 pool; asymmetric pads; pads one short of the window; a map of one
# cell; 3-D.
CASES = [
    (2, (9, 10), ((1, 1), (1, 1)), (3, 3), (2, 2)),
    (2, (7, 8), ((0, 2), (1, 0)), (3, 3), (1, 2)),
    (2, (5, 6), ((1, 1), (1, 1)), (2, 2), (2, 2)),
    (2, (1, 1), ((2, 2), (2, 2)), (3, 3), (1, 1)),
    (3, (4, 5, 3), ((1, 0), (0, 1), (1, 1)), (2, 2, 2), (1, 2, 1)),
]


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("rank,size,pads,window,strides", CASES)
@pytest.mark.parametrize("max_value", [None, 6.0])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_padding_of_a_relu_goes_into_the_max_pool(fmt, rank, size, pads, window, strides,
                                                  max_value, dtype):
    rng = np.random.default_rng(rank + len(pads[0]))
    c = 3
    shape = (None,) + size + (c,) if fmt == "channels_last" else (None, c) + size
    x = K.placeholder(shape, dtype=dtype)
    y = _pool(_pad(K.relu(x, max_value=max_value), rank, pads, fmt), rank, window, strides,
              "valid", fmt)
    # mostly negative inputs: many windows' real cells are all 0 after the relu
    feed = (rng.standard_normal((2,) + shape[1:]) * 4 - 2).astype(dtype)
    got, want, ops, f = optimized_and_plain([x], y, [feed])
    assert "Pad" not in ops
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # another batch size and an empty batch take the same step
    np.testing.assert_array_equal(f([feed[:1]])[0], want[:1])
    assert f([feed[:0]])[0].shape == (0,) + want.shape[1:]


def _kept(y_of, shape=(None, 9, 10, 3), feed_scale=4.0):
    rng = np.random.default_rng(3)
    x = K.placeholder(shape)
    feed = (rng.standard_normal((2,) + shape[1:]) * feed_scale).astype("float32")
    got, want, ops, _ = optimized_and_plain([x], y_of(x), [feed])
    np.testing.assert_array_equal(got, want)
    return ops


def test_padding_stays_where_the_pool_would_see_negative_values_or_no_real_cell():
    pad = ((1, 1), (1, 1))

    def pool(h, size=(3, 3), mode="max"):
        return _pool(h, 2, size, (2, 2), "valid", "channels_last", mode)

    # values that may be negative: the padded zeros win over them
    assert "Pad" in _kept(lambda x: pool(K.spatial_2d_padding(x, pad)))
    assert "Pad" in _kept(lambda x: pool(K.spatial_2d_padding(K.relu(x, alpha=0.1), pad)))
    assert "Pad" in _kept(lambda x: pool(K.spatial_2d_padding(K.relu(x, threshold=-1.0), pad)))
    # an average counts the padded zeros
    assert "Pad" in _kept(lambda x: pool(K.spatial_2d_padding(K.relu(x), pad), mode="avg"))
    # a pad as wide as the window: a window of padding only would give 0
    assert "Pad" in _kept(lambda x: pool(K.spatial_2d_padding(K.relu(x), ((2, 2), (2, 2))),
                                         size=(2, 2)))
    # a 'same' pool adds pads of its own, which with these could reach the window
    assert "Pad" in _kept(lambda x: _pool(K.spatial_2d_padding(K.relu(x), ((1, 2), (2, 1))), 2,
                                          (3, 3), (1, 1), "same", "channels_last"))
    # a padding of the channels
    assert "Pad" in _kept(lambda x: pool(K.spatial_2d_padding(
        K.permute_dimensions(K.relu(x), (0, 1, 3, 2)), ((1, 1), (0, 0)))),
        shape=(None, 9, 3, 10))


def test_the_op_with_pads_taken_in_pickles_and_keeps_its_identity():
    op = pool_ops.Pool("pool2d", (3, 3), (2, 2), "valid", True, "max", ((1, 1), (1, 1)))
    back = pickle.loads(pickle.dumps(op))
    assert back.extra_pads == ((1, 1), (1, 1))
    assert back._params() == op._params()
    assert op._params() != pool_ops.Pool("pool2d", (3, 3), (2, 2), "valid", True,
                                         "max")._params()
    # an op pickled before extra_pads existed reads as having none
    old = pool_ops.Pool("pool2d", (3, 3), (2, 2), "valid", True, "max")
    del old.__dict__["extra_pads"]
    assert pickle.loads(pickle.dumps(old)).extra_pads is None
    x = np.arange(2 * 5 * 6 * 2, dtype=np.float32).reshape(2, 5, 6, 2)
    assert op.infer(K.placeholder((None, 5, 6, 2)))[0][0] == (None, 3, 3, 2)
    assert op.compute(x)[0].shape == (2, 3, 3, 2)
