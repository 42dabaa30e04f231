"""An inference plan joins a depthwise convolution with the 1x1 convolutions
around it into one DepthwiseBlock step (ops/depthwise_block.py) where the
tensor between them is large: the same values as the graph as written."""
import numpy as np
import pytest
from unoptimized import run_unoptimized

import cyback as K
from cyback.ops import depthwise_block as db


@pytest.fixture
def join_small(monkeypatch):
    """Join blocks of any size (the tests' maps are small)."""
    monkeypatch.setattr(db, "MIN_INTERMEDIATE_BYTES", 0)
    monkeypatch.setattr(db, "MIN_ROW_PIXELS", 1)


def _var(rng, shape, dtype, scale=0.4):
    return K.variable(rng.standard_normal(shape) * scale, dtype=dtype)


def _relu6(t):
    return K.relu(t, max_value=6.0)


def _blocks(f):
    return [op for op in f.plan_ops() if isinstance(op, db.DepthwiseBlock)]


def _check(inputs, output, feed, joined, rtol=1e-5):
    f = K.function(inputs, [output])
    got = f([feed])[0]
    want = run_unoptimized(inputs, [output], [feed])[0]
    tol = rtol if output.dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert len(_blocks(f)) == joined, [type(op).__name__ for op in f.plan_ops()]
    return f


def _inverted_residual(x, rng, c, e, f, strides, dtype, residual):
    h = K.conv2d(x, _var(rng, (1, 1, c, e), dtype))
    h = _relu6(K.bias_add(h, _var(rng, (e,), dtype)))
    if strides == (2, 2):
        h = K.spatial_2d_padding(h, ((0, 1), (0, 1)))
        h = K.depthwise_conv2d(h, _var(rng, (3, 3, e, 1), dtype), strides=strides,
                               padding="valid")
    else:
        h = K.depthwise_conv2d(h, _var(rng, (3, 3, e, 1), dtype), padding="same")
    h = _relu6(K.bias_add(h, _var(rng, (e,), dtype)))
    h = K.bias_add(K.conv2d(h, _var(rng, (1, 1, e, f), dtype)), _var(rng, (f,), dtype))
    return h + x if residual else h


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("strides,residual", [((1, 1), True), ((1, 1), False), ((2, 2), False)])
def test_inverted_residual_is_one_step(join_small, dtype, strides, residual):
    rng = np.random.default_rng(1)
    c = 6
    x = K.placeholder((None, 9, 10, c), dtype=dtype)
    y = _inverted_residual(x, rng, c, 24, c if residual else 5, strides, dtype, residual)
    feed = rng.standard_normal((3, 9, 10, c)).astype(dtype)
    f = _check([x], y, feed, joined=1)
    op = _blocks(f)[0]
    assert op.expand and op.project and op.residual == residual
    # one image, and an empty batch
    np.testing.assert_allclose(f([feed[:1]])[0], f([feed])[0][:1], rtol=1e-6, atol=1e-6)
    assert f([feed[:0]])[0].shape[0] == 0


def test_depthwise_separable_pairs(join_small):
    # MobileNet: depthwise -> 1x1 -> depthwise -> 1x1: each depthwise takes the
    # 1x1 after it; the first 1x1 stays the second block's input
    rng = np.random.default_rng(2)
    x = K.placeholder((None, 12, 12, 4))
    h = x
    for cin, cout in ((4, 8), (8, 16)):
        h = K.relu(K.depthwise_conv2d(h, _var(rng, (3, 3, cin, 1), "float32"), padding="same"))
        h = K.relu(K.conv2d(h, _var(rng, (1, 1, cin, cout), "float32")))
    feed = rng.standard_normal((2, 12, 12, 4)).astype("float32")
    f = _check([x], h, feed, joined=2)
    assert all(not op.expand and op.project for op in _blocks(f))


def test_expansion_and_depthwise_without_projection(join_small):
    rng = np.random.default_rng(3)
    x = K.placeholder((None, 8, 8, 3))
    h = K.relu(K.conv2d(x, _var(rng, (1, 1, 3, 12), "float32")))
    h = K.depthwise_conv2d(h, _var(rng, (5, 5, 12, 1), "float32"), strides=(2, 2),
                           padding="same")
    y = K.pool2d(h, (2, 2))
    f = _check([x], y, rng.standard_normal((2, 8, 8, 3)).astype("float32"), joined=1)
    assert _blocks(f)[0].expand and not _blocks(f)[0].project


def test_what_stays_separate(join_small):
    rng = np.random.default_rng(4)
    x = K.placeholder((None, 8, 8, 3))
    e = K.relu(K.conv2d(x, _var(rng, (1, 1, 3, 6), "float32")))
    dilated = K.depthwise_conv2d(e, _var(rng, (3, 3, 6, 1), "float32"), padding="same",
                                 dilation_rate=(2, 2))
    multiplied = K.depthwise_conv2d(e, _var(rng, (3, 3, 6, 2), "float32"), padding="same")
    y = K.conv2d(dilated, _var(rng, (1, 1, 6, 4), "float32")) + \
        K.conv2d(multiplied, _var(rng, (1, 1, 12, 4), "float32"))
    feed = rng.standard_normal((2, 8, 8, 3)).astype("float32")
    # e has two readers; a dilated kernel and a depth multiplier of 2 do not join
    _check([x], y, feed, joined=0)
    # channels_first stays as it is
    xf = K.placeholder((None, 3, 8, 8))
    h = K.conv2d(xf, _var(rng, (1, 1, 3, 6), "float32"), data_format="channels_first")
    h = K.depthwise_conv2d(h, _var(rng, (3, 3, 6, 1), "float32"), padding="same",
                           data_format="channels_first")
    y = K.conv2d(h, _var(rng, (1, 1, 6, 4), "float32"), data_format="channels_first")
    _check([xf], y, rng.standard_normal((2, 3, 8, 8)).astype("float32"), joined=0)


def test_expanded_tensor_read_elsewhere_keeps_the_expansion(join_small):
    rng = np.random.default_rng(5)
    x = K.placeholder((None, 8, 8, 3))
    e = K.relu(K.conv2d(x, _var(rng, (1, 1, 3, 6), "float32")))
    h = K.depthwise_conv2d(e, _var(rng, (3, 3, 6, 1), "float32"), padding="same")
    y = K.conv2d(h, _var(rng, (1, 1, 6, 4), "float32"))
    f = K.function([x], [y, K.sum(e)])
    feed = rng.standard_normal((2, 8, 8, 3)).astype("float32")
    got = f([feed])
    want = run_unoptimized([x], [y, K.sum(e)], [feed])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    (op,) = _blocks(f)
    assert not op.expand and op.project


def test_small_maps_stay_separate():
    # with the shipped thresholds: a 14x14 map's 1x1 layers run as packed
    # products, faster than the rows of a block
    rng = np.random.default_rng(6)
    x = K.placeholder((None, 14, 14, 16))
    y = _inverted_residual(x, rng, 16, 96, 16, (1, 1), "float32", True)
    _check([x], y, rng.standard_normal((1, 14, 14, 16)).astype("float32"), joined=0)
    x = K.placeholder((None, 56, 56, 24))
    y = _inverted_residual(x, rng, 24, 144, 24, (1, 1), "float32", True)
    _check([x], y, rng.standard_normal((1, 56, 56, 24)).astype("float32"), joined=1)


def test_training_plan_keeps_the_layers(join_small):
    rng = np.random.default_rng(7)
    x = K.placeholder((None, 8, 8, 3))
    k = _var(rng, (1, 1, 3, 6), "float32")
    y = _inverted_residual(x, rng, 3, 6, 3, (1, 1), "float32", True)
    loss = K.mean(K.square(y + K.sum(k)))
    train = K.function([x], [loss], updates=[K.update_sub(k, 0.1 * K.gradients(loss, [k])[0])])
    train([rng.standard_normal((2, 8, 8, 3)).astype("float32")])
    assert not _blocks(train)


def test_weights_changed_after_the_first_call(join_small):
    rng = np.random.default_rng(8)
    x = K.placeholder((None, 8, 8, 3))
    kd = _var(rng, (3, 3, 6, 1), "float32")
    h = K.relu(K.conv2d(x, _var(rng, (1, 1, 3, 6), "float32")))
    y = K.conv2d(K.depthwise_conv2d(h, kd, padding="same"), _var(rng, (1, 1, 6, 2), "float32"))
    f = K.function([x], [y])
    feed = rng.standard_normal((2, 8, 8, 3)).astype("float32")
    before = f([feed])[0]
    K.set_value(kd, K.get_value(kd) * -2)
    after = f([feed])[0]
    assert _blocks(f)
    np.testing.assert_allclose(after, run_unoptimized([x], [y], [feed])[0], rtol=1e-5,
                               atol=1e-5)
    assert not np.allclose(after, before)
