"""An inference plan takes a zero padding of a convolution's input into the
convolution's own pads (Conv.rewrite): the same values as the graph as written,
without the padded copy."""
import pickle

import numpy as np
import pytest
from unoptimized import optimized_and_plain

import cyback as K
from cyback.ops import conv as cv
from cyback.ops.manip import Pad


def _same_sums(got, want):
    # float32 inference plans may run a convolution on the packed kernel,
    # whose sums BLAS's im2col product (the graph as written) orders otherwise
    if got.dtype == np.float64:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _pad(x, rank, pads, fmt):
    if rank == 1:
        return K.temporal_padding(x, pads[0])
    if rank == 2:
        return K.spatial_2d_padding(x, pads, data_format=fmt)
    return K.spatial_3d_padding(x, pads, data_format=fmt)


def _conv(x, k, rank, strides, padding, fmt, depthwise):
    if depthwise:
        return K.depthwise_conv2d(x, k, strides=strides, padding=padding, data_format=fmt)
    fn = {1: K.conv1d, 2: K.conv2d, 3: K.conv3d}[rank]
    if rank == 1:
        return fn(x, k, strides=strides[0], padding=padding, data_format=fmt)
    return fn(x, k, strides=strides, padding=padding, data_format=fmt)


CASES = [
    # rank, spatial size, pads, strides, depthwise
    (1, (9,), ((2, 1),), (2,), False),
    (2, (7, 8), ((0, 1), (0, 1)), (2, 2), False),
    (2, (7, 8), ((0, 1), (0, 1)), (2, 2), True),
    (2, (5, 6), ((3, 0), (1, 2)), (1, 2), True),
    (2, (1, 1), ((1, 1), (1, 1)), (1, 1), False),
    (3, (4, 5, 3), ((1, 0), (0, 2), (1, 1)), (1, 2, 1), False),
]


# temporal_padding pads axis 1: a channels_last padding only
FORMATS = [(fmt,) + case for case in CASES for fmt in ("channels_last", "channels_first")
           if case[0] > 1 or fmt == "channels_last"]


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("fmt,rank,size,pads,strides,depthwise", FORMATS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_padding_goes_into_the_convolution(fmt, padding, rank, size, pads, strides, depthwise,
                                           dtype):
    rng = np.random.default_rng(rank)
    c = 3
    shape = (None,) + size + (c,) if fmt == "channels_last" else (None, c) + size
    x = K.placeholder(shape, dtype=dtype)
    kshape = (3,) * rank + (c, 2 if depthwise else 4)
    k = K.variable(rng.standard_normal(kshape), dtype=dtype)
    y = _conv(_pad(x, rank, pads, fmt), k, rank, strides, padding, fmt, depthwise)
    feed = rng.standard_normal((2,) + shape[1:]).astype(dtype)
    got, want, ops, _ = optimized_and_plain([x], y, [feed])
    assert "Pad" not in ops
    assert got.dtype == want.dtype and got.shape == want.shape
    _same_sums(got, want)


def test_with_batchnorm_bias_and_relu_fused():
    rng = np.random.default_rng(1)
    x = K.placeholder((None, 8, 8, 4))
    k = K.variable(rng.standard_normal((3, 3, 4, 1)).astype("float32"))
    gamma = K.variable(rng.uniform(0.5, 1.5, 4).astype("float32"))
    beta = K.variable(rng.standard_normal(4).astype("float32"))
    y = K.depthwise_conv2d(K.spatial_2d_padding(x, ((0, 1), (0, 1))), k, strides=(2, 2))
    y = K.relu(y * gamma + beta, max_value=6.0)
    feed = rng.standard_normal((3, 8, 8, 4)).astype("float32")
    got, want, ops, _ = optimized_and_plain([x], y, [feed])
    assert "Pad" not in ops
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_padding_read_elsewhere_too_still_gives_both_values():
    rng = np.random.default_rng(2)
    x = K.placeholder((None, 5, 5, 2))
    p = K.spatial_2d_padding(x, ((1, 1), (1, 1)))
    k = K.variable(rng.standard_normal((3, 3, 2, 3)).astype("float32"))
    y = K.conv2d(p, k)
    f = K.function([x], [y, p])
    feed = rng.standard_normal((1, 5, 5, 2)).astype("float32")
    got_y, got_p = f([feed])
    np.testing.assert_array_equal(got_p, np.pad(feed, ((0, 0), (1, 1), (1, 1), (0, 0))))
    K.set_graph_optimizer(False)
    try:
        want_y = K.function([x], [y])([feed])[0]
    finally:
        K.set_graph_optimizer(True)
    np.testing.assert_array_equal(got_y, want_y)


def test_a_padding_of_the_channels_stays_a_padding():
    rng = np.random.default_rng(3)
    x = K.placeholder((None, 4, 4, 2))
    p = K.spatial_2d_padding(x, ((1, 1), (1, 1)), data_format="channels_first")  # axes 2, 3
    k = K.variable(rng.standard_normal((3, 3, 4, 3)).astype("float32"))
    y = K.conv2d(p, k)
    feed = rng.standard_normal((1, 4, 4, 2)).astype("float32")
    got, want, ops, _ = optimized_and_plain([x], y, [feed])
    assert "Pad" in ops
    _same_sums(got, want)


def test_training_plans_keep_the_padding():
    rng = np.random.default_rng(4)
    x = K.placeholder((None, 5, 5, 2))
    k = K.variable(rng.standard_normal((3, 3, 2, 3)).astype("float32"))
    y = K.conv2d(K.spatial_2d_padding(x, ((1, 0), (0, 1))), k)
    loss = K.sum(y)
    f = K.function([x], [loss], updates=[K.update_sub(k, 0.0 * K.gradients(loss, [k])[0])])
    assert "Pad" in [type(op).__name__ for op in f.plan_ops()]


def test_geometry_with_extra_pads_pickles_and_older_state_loads():
    g = cv.Geometry("conv2d", "conv", 2, (1, 1), (1, 1), "valid", True)
    h = g.with_extra_pads(((0, 1), (2, 3)))
    assert h.extra_pads == ((0, 1), (2, 3)) and h != g
    assert pickle.loads(pickle.dumps(h)) == h
    assert h.with_extra_pads(((1, 1), (1, 1))).extra_pads == ((1, 2), (3, 4))
    old = cv.Geometry.__new__(cv.Geometry)
    old.__setstate__(g.as_tuple()[:-1])          # a pickle made before the field existed
    assert old.extra_pads is None and old == g
    assert h.y_shape((1, 4, 4, 2), (3, 3, 2, 5)) == (1, 3, 7, 5)
    assert isinstance(Pad(((0, 0),)), Pad)
