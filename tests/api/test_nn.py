"""Activations, crossentropies, normalization, dropout, in_top_k, bias_add."""
import numpy as np
import pytest

import cyback as K

from gradcheck import check_grads

FLOATS = ["float32", "float64"]


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)


def run(fn, *values, dtype=None):
    """fn applied to placeholders with a symbolic batch size, fed values."""
    phs = [K.placeholder(shape=(None,) + v.shape[1:], dtype=dtype or v.dtype.name)
           for v in values]
    out = fn(*phs)
    return K.function(phs, [out])(list(values))[0], out


# ------------------------------------------------------------------ references

def np_relu(x, alpha=0.0, max_value=None, threshold=0.0):
    y = np.where(x > threshold, x, 0) if threshold != 0 else np.maximum(x, 0)
    if max_value is not None:
        y = np.clip(y, 0, max_value)
    return y - alpha * np.maximum(threshold - x, 0)


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


EPS = 1e-7


# ------------------------------------------------------------------ activations

RELU_CASES = [dict(), dict(alpha=0.2), dict(max_value=6.0), dict(max_value=2.5),
              dict(threshold=0.5), dict(alpha=0.3, max_value=2.0, threshold=0.5),
              dict(alpha=0.1, threshold=-0.5), dict(alpha=0.1, max_value=1.0)]


@pytest.mark.parametrize("kw", RELU_CASES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_relu_values(kw, dtype, rng):
    x = (rng.standard_normal((5, 7)) * 3).astype(dtype)
    y, t = run(lambda p: K.relu(p, **kw), x)
    assert y.dtype == dtype and K.int_shape(t) == (None, 7)
    np.testing.assert_allclose(y, np_relu(x.astype("float64"), **kw), **tol(dtype))


@pytest.mark.parametrize("kw", RELU_CASES)
def test_relu_grad(kw, rng):
    # Keep away from the kinks, where finite differences are meaningless.
    x = rng.uniform(-4, 4, (3, 5))
    for k in (0.0, kw.get("threshold", 0.0), kw.get("max_value", 0.0) or 0.0):
        x[np.abs(x - k) < 0.05] += 0.2
    check_grads(lambda p: K.relu(p, **kw), x)


def test_relu_accepts_keras_layer_arguments():
    # Keras's LeakyReLU passes K.cast_to_floatx(alpha), a 0-d array.
    x = np.array([-2.0, 3.0], "float32")
    y = K.eval(K.relu(K.constant(x), alpha=K.cast_to_floatx(0.5)))
    np.testing.assert_allclose(y, [-1.0, 3.0])
    with pytest.raises(TypeError, match="relu"):
        K.relu(K.constant(x), alpha="a")
    with pytest.raises(TypeError, match="relu.*max_value"):
        K.relu(K.constant(x), max_value=[1, 2])


def test_relu_int_input_becomes_float():
    y = K.eval(K.relu(K.constant([-1, 2], dtype="int32")))
    assert y.dtype == K.floatx()
    np.testing.assert_array_equal(y, [0, 2])


@pytest.mark.parametrize("alpha", [1.0, 0.5, 2.0])
@pytest.mark.parametrize("dtype", FLOATS)
def test_elu(alpha, dtype, rng):
    x = (rng.standard_normal((4, 3)) * 2).astype(dtype)
    y, _ = run(lambda p: K.elu(p, alpha), x)
    xd = x.astype("float64")
    np.testing.assert_allclose(y, np.where(xd > 0, xd, alpha * np.expm1(xd)), **tol(dtype))
    xg = rng.standard_normal((3, 4))
    xg[np.abs(xg) < 0.05] = 0.3
    check_grads(lambda p: K.elu(p, alpha), xg)
    # Second derivative (through the where in the gradient).
    check_grads(lambda p: K.gradients(K.sum(K.elu(p, alpha)), [p])[0], xg, rtol=1e-4)


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax(axis, dtype, rng):
    x = (rng.standard_normal((3, 4, 5)) * 4).astype(dtype)
    y, _ = run(lambda p: K.softmax(p, axis), x)
    np.testing.assert_allclose(y, np_softmax(x.astype("float64"), axis), **tol(dtype))
    check_grads(lambda p: K.softmax(p, axis), rng.standard_normal((2, 3, 4)))


def test_softmax_stable_and_odd_shapes():
    big = np.array([[1000.0, 1000.0, -1000.0]], "float32")
    np.testing.assert_allclose(K.eval(K.softmax(K.constant(big))), [[0.5, 0.5, 0.0]])
    np.testing.assert_allclose(K.eval(K.softmax(K.constant([1.0, 1.0]))), [0.5, 0.5])
    assert K.eval(K.softmax(K.constant(np.zeros((0, 3))))).shape == (0, 3)
    np.testing.assert_allclose(K.eval(K.softmax(K.constant(np.zeros((2, 1))))), np.ones((2, 1)))
    x = np.arange(12.0).reshape(3, 4)[:, ::2]   # non-contiguous
    np.testing.assert_allclose(K.eval(K.softmax(K.variable(x))), np_softmax(x), rtol=1e-6)
    with pytest.raises(ValueError, match="softmax.*scalar"):
        K.softmax(K.constant(1.0))
    with pytest.raises(ValueError, match="softmax: axis 2"):
        K.softmax(K.constant(np.zeros((2, 3))), axis=2)


def test_softmax_second_derivative(rng):
    check_grads(lambda p: K.gradients(K.sum(K.softmax(p) * K.constant(
        np.array([1.0, 2.0, 3.0]), dtype="float64")), [p])[0],
        rng.standard_normal((2, 3)), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", FLOATS)
def test_elementwise_activations(dtype, rng):
    x = (rng.standard_normal((4, 5)) * 3).astype(dtype)
    xd = x.astype("float64")
    cases = [(K.sigmoid, 1 / (1 + np.exp(-xd))), (K.tanh, np.tanh(xd)),
             (K.softplus, np.log1p(np.exp(xd))), (K.softsign, xd / (1 + np.abs(xd))),
             (K.hard_sigmoid, np.clip(0.2 * xd + 0.5, 0, 1))]
    for fn, ref in cases:
        y, _ = run(fn, x)
        assert y.dtype == dtype
        np.testing.assert_allclose(y, ref, **tol(dtype), err_msg=fn.__name__)


def test_activation_grads(rng):
    x = rng.uniform(-3, 3, (3, 4))
    x[np.abs(np.abs(x) - 2.5) < 0.05] = 1.0
    for fn in (K.sigmoid, K.tanh, K.softplus, K.softsign, K.hard_sigmoid):
        check_grads(fn, x)


# ------------------------------------------------------------------ crossentropies

def np_cce(t, p, axis=-1):
    p = p / p.sum(axis=axis, keepdims=True)
    p = np.clip(p, EPS, 1 - EPS)
    return -(t * np.log(p)).sum(axis=axis)


@pytest.mark.parametrize("dtype", FLOATS)
def test_categorical_crossentropy(dtype, rng):
    p = rng.uniform(0.0, 1.0, (4, 5)).astype(dtype)
    p[0, 0] = 0.0   # clipped
    t = np.eye(5, dtype=dtype)[[0, 1, 4, 2]]
    y, out = run(K.categorical_crossentropy, t, p)
    assert K.int_shape(out) == (None,) and y.dtype == dtype
    np.testing.assert_allclose(y, np_cce(t.astype("float64"), p.astype("float64")),
                               rtol=1e-5 if dtype == "float32" else 1e-7)
    logits = (rng.standard_normal((4, 5)) * 3).astype(dtype)
    y, _ = run(lambda a, b: K.categorical_crossentropy(a, b, from_logits=True), t, logits)
    ref = -(t * np_log_softmax(logits.astype("float64"))).sum(-1)
    np.testing.assert_allclose(y, ref, **tol(dtype))


def test_categorical_crossentropy_axis_and_grads(rng):
    t = rng.uniform(0, 1, (2, 3, 4))
    p = rng.uniform(0.1, 1, (2, 3, 4))
    got = K.eval(K.categorical_crossentropy(K.constant(t, "float64"), K.constant(p, "float64"),
                                            axis=1))
    np.testing.assert_allclose(got, np_cce(t, p, axis=1), rtol=1e-10)
    logits = rng.standard_normal((2, 3, 4)) * 2
    got = K.eval(K.categorical_crossentropy(K.constant(t, "float64"),
                                            K.constant(logits, "float64"), True, axis=1))
    np.testing.assert_allclose(got, -(t * np_log_softmax(logits, 1)).sum(1), rtol=1e-10)
    # Gradients w.r.t. both target and logits, then w.r.t. probabilities.
    check_grads(lambda a, b: K.categorical_crossentropy(a, b, from_logits=True, axis=1),
                t, logits)
    check_grads(lambda a, b: K.categorical_crossentropy(a, b), t[0], p[0])
    # Second derivative of the fused op with respect to the logits.
    check_grads(lambda b: K.gradients(K.sum(K.categorical_crossentropy(
        K.constant(t[0], "float64"), b, from_logits=True)), [b])[0], logits[0], rtol=1e-4)


def test_categorical_crossentropy_extreme_logits():
    t = K.constant([[0.0, 1.0]])
    y = K.eval(K.categorical_crossentropy(t, K.constant([[1000.0, -1000.0]]), from_logits=True))
    np.testing.assert_allclose(y, [2000.0])


def test_categorical_crossentropy_errors():
    with pytest.raises(ValueError, match="categorical_crossentropy.*same shape.*\\(2, 3\\).*"
                                         "\\(2, 4\\)"):
        K.categorical_crossentropy(K.constant(np.zeros((2, 3))), K.constant(np.ones((2, 4))))
    with pytest.raises(ValueError, match="categorical_crossentropy: axis 2"):
        K.categorical_crossentropy(K.constant(np.zeros((2, 3))), K.constant(np.ones((2, 3))),
                                   axis=2)


def np_scce(labels, p, from_logits=False):
    logits = p if from_logits else np.log(np.clip(p, EPS, 1 - EPS))
    logp = np_log_softmax(logits)
    return -np.take_along_axis(logp, labels[..., None], -1)[..., 0]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("target_dtype", ["int32", "int64", "float32"])
def test_sparse_categorical_crossentropy(dtype, target_dtype, rng):
    p = rng.uniform(0, 1, (5, 4)).astype(dtype)
    p /= p.sum(-1, keepdims=True)
    labels = np.array([0, 3, 1, 1, 2])
    for t in (labels.astype(target_dtype), labels[:, None].astype(target_dtype)):
        y, out = run(K.sparse_categorical_crossentropy, t, p)
        assert y.shape == (5,) and y.dtype == dtype
        np.testing.assert_allclose(y, np_scce(labels, p.astype("float64")),
                                   rtol=1e-5 if dtype == "float32" else 1e-10)
    logits = rng.standard_normal((5, 4)).astype(dtype)
    y, _ = run(lambda a, b: K.sparse_categorical_crossentropy(a, b, from_logits=True),
               labels.astype(target_dtype), logits)
    np.testing.assert_allclose(y, np_scce(labels, logits.astype("float64"), True), **tol(dtype))


def test_sparse_categorical_crossentropy_sequences_and_axis(rng):
    logits = rng.standard_normal((2, 3, 4))
    labels = rng.integers(0, 4, (2, 3))
    ph = K.placeholder((None, None, 4), dtype="float64")
    tph = K.placeholder((None, None, 1), dtype="float32")
    out = K.sparse_categorical_crossentropy(tph, ph, from_logits=True)
    assert K.int_shape(out) == (None, None)
    got = K.function([tph, ph], [out])([labels[..., None], logits])[0]
    np.testing.assert_allclose(got, np_scce(labels, logits, True), rtol=1e-10)
    # channels_first: classes on axis 1
    cf = np.ascontiguousarray(np.moveaxis(logits, -1, 1))
    got = K.eval(K.sparse_categorical_crossentropy(K.constant(labels, "int32"),
                                                   K.constant(cf, "float64"), True, axis=1))
    np.testing.assert_allclose(got, np_scce(labels, logits, True), rtol=1e-10)
    check_grads(lambda b: K.sparse_categorical_crossentropy(K.constant(labels), b, True, axis=1),
                cf)
    check_grads(lambda b: K.sparse_categorical_crossentropy(K.constant(labels), b),
                rng.uniform(0.1, 1, (2, 3, 4)))


def test_sparse_categorical_crossentropy_errors():
    out = K.constant(np.full((2, 3), 1 / 3))
    with pytest.raises(ValueError, match="sparse_categorical_crossentropy: target of shape"):
        K.sparse_categorical_crossentropy(K.constant([0, 1, 2], "int32"), out)
    t = K.placeholder((None,), dtype="int32")
    f = K.function([t], [K.sparse_categorical_crossentropy(t, out)])
    with pytest.raises(ValueError, match="label 3 is out of range for 3 classes"):
        f([np.array([0, 3])])
    with pytest.raises(ValueError, match="does not match"):
        f([np.array([0, 1, 2])])


def np_bce(t, p):
    p = np.clip(p, EPS, 1 - EPS)
    return -(t * np.log(p) + (1 - t) * np.log(1 - p))


@pytest.mark.parametrize("dtype", FLOATS)
def test_binary_crossentropy(dtype, rng):
    p = rng.uniform(0, 1, (4, 3)).astype(dtype)
    p[0, 0], p[1, 1] = 0.0, 1.0
    t = rng.integers(0, 2, (4, 3)).astype(dtype)
    y, _ = run(K.binary_crossentropy, t, p)
    np.testing.assert_allclose(y, np_bce(t.astype("float64"), p.astype("float64")),
                               rtol=2e-4 if dtype == "float32" else 1e-7, atol=1e-7)
    logits = (rng.standard_normal((4, 3)) * 3).astype(dtype)
    logits[0, 0] = 200.0
    y, _ = run(lambda a, b: K.binary_crossentropy(a, b, from_logits=True), t, logits)
    ld = logits.astype("float64")
    ref = np.maximum(ld, 0) - ld * t + np.log1p(np.exp(-np.abs(ld)))
    np.testing.assert_allclose(y, ref, **tol(dtype))
    assert np.all(np.isfinite(y))


def test_binary_crossentropy_grads_and_errors(rng):
    t = rng.uniform(0, 1, (3, 2))
    check_grads(lambda a, b: K.binary_crossentropy(a, b, from_logits=True), t,
                rng.standard_normal((3, 2)))
    check_grads(lambda a, b: K.binary_crossentropy(a, b), t, rng.uniform(0.1, 0.9, (3, 2)))
    with pytest.raises(ValueError, match="binary_crossentropy.*broadcast"):
        K.binary_crossentropy(K.constant(np.zeros((2, 3))), K.constant(np.ones((2, 4))))


# ------------------------------------------------------------------ l2_normalize

@pytest.mark.parametrize("axis", [None, 0, -1, [0, 1]])
def test_l2_normalize(axis, rng):
    x = rng.standard_normal((3, 4)).astype("float32")
    ax = tuple(axis) if isinstance(axis, list) else axis
    ref = x / np.sqrt(np.maximum((x.astype("float64") ** 2).sum(axis=ax, keepdims=True), 1e-12))
    y, _ = run(lambda p: K.l2_normalize(p, axis), x)
    np.testing.assert_allclose(y, ref, rtol=1e-5)
    check_grads(lambda p: K.l2_normalize(p, axis), x.astype("float64"))


def test_l2_normalize_zero_and_errors():
    np.testing.assert_array_equal(K.eval(K.l2_normalize(K.constant(np.zeros((2, 2))), 1)), 0)
    with pytest.raises(ValueError, match="l2_normalize: axis 3"):
        K.l2_normalize(K.constant(np.zeros((2, 2))), 3)


# ------------------------------------------------------------------ in_top_k

def test_in_top_k_values_and_ties():
    p = np.array([[0.1, 0.9, 0.9, 0.3], [0.5, 0.4, 0.3, 0.2], [0.2, 0.2, 0.2, 0.2],
                  [0.1, np.nan, 0.3, 0.2], [0.1, 0.2, 0.3, 0.4]], "float32")
    t = np.array([2, 1, 3, 2, 7], "int32")
    ph = K.placeholder((None, 4))
    tph = K.placeholder((None,), dtype="int32")
    for k, expect in [(1, [True, False, True, False, False]),
                      (2, [True, True, True, False, False]),
                      (0, [False] * 5)]:
        out = K.in_top_k(ph, tph, k)
        assert K.int_shape(out) == (None,) and K.dtype(out) == "bool"
        got = K.function([ph, tph], [out])([p, t])[0]
        np.testing.assert_array_equal(got, expect, err_msg="k=%d" % k)


def test_in_top_k_errors():
    p = K.constant(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="in_top_k: predictions must be 2-D"):
        K.in_top_k(K.constant(np.zeros(3)), K.constant([0], "int32"), 1)
    with pytest.raises(ValueError, match="in_top_k: targets must be 1-D"):
        K.in_top_k(p, K.constant([[0]], "int32"), 1)
    with pytest.raises(ValueError, match="different batch sizes"):
        K.in_top_k(p, K.constant([0, 1, 2], "int32"), 1)
    with pytest.raises(TypeError, match="in_top_k: targets must be int"):
        K.in_top_k(p, K.constant([0.0, 1.0]), 1)
    with pytest.raises(TypeError, match="in_top_k: k must be an int"):
        K.in_top_k(p, K.constant([0, 1], "int32"), 1.5)


# ------------------------------------------------------------------ bias_add

@pytest.mark.parametrize("ndim", [2, 3, 4, 5])
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_bias_add_vector(ndim, data_format, rng):
    shape = (2, 3, 4, 5, 6)[:ndim]
    x = rng.standard_normal(shape).astype("float32")
    cf = data_format == "channels_first" and ndim >= 3
    c = shape[1] if cf else shape[-1]
    b = rng.standard_normal(c).astype("float32")
    bshape = [1] * ndim
    bshape[1 if cf else -1] = c
    y, out = run(lambda p: K.bias_add(p, K.constant(b), data_format), x)
    assert K.int_shape(out) == (None,) + shape[1:]
    np.testing.assert_allclose(y, x + b.reshape(bshape), rtol=1e-6)


def test_bias_add_full_bias_and_grads(rng):
    b = rng.standard_normal((3, 4, 5))
    x = rng.standard_normal((2, 3, 4, 5))
    got = K.eval(K.bias_add(K.constant(x, "float64"), K.constant(b, "float64"), "channels_last"))
    np.testing.assert_allclose(got, x + b, rtol=1e-12)
    # channels_first: Keras reshapes a (spatial..., C) bias to (C, spatial...).
    x2 = rng.standard_normal((2, 5, 3, 4))
    got = K.eval(K.bias_add(K.constant(x2, "float64"), K.constant(b, "float64"),
                            "channels_first"))
    np.testing.assert_allclose(got, x2 + b.reshape((1, 5, 3, 4)), rtol=1e-12)
    for fmt, bias in [("channels_last", rng.standard_normal(3)),
                      ("channels_first", rng.standard_normal(2)),
                      ("channels_first", rng.standard_normal((3, 2)))]:
        check_grads(lambda p, q: K.bias_add(p, q, fmt), rng.standard_normal((2, 2, 3)), bias)


def test_bias_add_errors():
    x = K.placeholder((None, 4, 3))
    with pytest.raises(ValueError, match="bias_add: bias of shape \\(4,\\) does not match the "
                                         "3 channels"):
        K.bias_add(x, K.constant(np.zeros(4)))
    with pytest.raises(ValueError, match="bias_add: unexpected bias dimensions 3"):
        K.bias_add(x, K.constant(np.zeros((1, 1, 3))))
    with pytest.raises(ValueError, match="data_format"):
        K.bias_add(x, K.constant(np.zeros(3)), "channels_middle")
    with pytest.raises(ValueError, match="bias_add: bias of shape \\(4, 4\\) does not match"):
        K.bias_add(x, K.constant(np.zeros((4, 4))))


def test_bias_add_default_data_format():
    K.set_image_data_format("channels_first")
    x = np.zeros((1, 2, 3), "float32")
    y = K.eval(K.bias_add(K.constant(x), K.constant([1.0, 2.0])))
    np.testing.assert_array_equal(y[0, :, 0], [1.0, 2.0])


# ------------------------------------------------------------------ dropout

@pytest.mark.parametrize("dtype", FLOATS)
def test_dropout_statistics(dtype):
    x = K.placeholder((None, 1000), dtype=dtype)
    f = K.function([x], [K.dropout(x, 0.3, seed=1)])
    y = f([np.ones((20, 1000), dtype)])[0]
    assert y.dtype == dtype
    np.testing.assert_allclose(y[y != 0], 1 / 0.7, rtol=1e-6)
    assert abs((y == 0).mean() - 0.3) < 0.01
    y2 = f([np.ones((20, 1000), dtype)])[0]
    assert not np.array_equal(y, y2)    # fresh mask every call


def test_dropout_noise_shape():
    x = K.placeholder((None, 5, 200))
    for ns in [(None, 1, None), (K.shape(x)[0], 1, 200)]:
        y = K.function([x], [K.dropout(x, 0.5, noise_shape=ns, seed=3)])(
            [np.ones((4, 5, 200), "float32")])[0]
        assert y.shape == (4, 5, 200)
        # The mask is shared along axis 1.
        np.testing.assert_array_equal(y, np.broadcast_to(y[:, :1], y.shape))
        assert 0.3 < (y == 0).mean() < 0.7
    with pytest.raises(ValueError, match="dropout: noise_shape .* not broadcastable"):
        K.dropout(x, 0.5, noise_shape=(None, 3, 200))
    with pytest.raises(ValueError, match="dropout: noise_shape .* one entry per axis"):
        K.dropout(x, 0.5, noise_shape=(None, 1))


def test_dropout_seed_reproducible_and_levels():
    a = K.eval(K.dropout(K.ones((10, 10)), 0.5, seed=7))
    b = K.eval(K.dropout(K.ones((10, 10)), 0.5, seed=7))
    np.testing.assert_array_equal(a, b)
    x = K.ones((3, 3))
    np.testing.assert_array_equal(K.eval(K.dropout(x, 0.0)), np.ones((3, 3)))
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="dropout: level must be in the range \\[0, 1\\)"):
            K.dropout(x, bad)
    with pytest.raises(TypeError, match="dropout: seed"):
        K.dropout(x, 0.5, seed="s")


def test_dropout_gradient_uses_the_same_mask():
    v = K.variable(np.ones((50, 40)))
    y = K.dropout(v, 0.4, seed=5)
    f = K.function([], [y, K.gradients(K.sum(y), [v])[0]])
    out, g = f([])
    np.testing.assert_array_equal(out, g)


def test_dropout_symbolic_level():
    level = K.placeholder(())
    x = K.placeholder((None, 500))
    f = K.function([x, level], [K.dropout(x, level, seed=1)])
    y = f([np.ones((10, 500), "float32"), 0.25])[0]
    assert abs((y == 0).mean() - 0.25) < 0.03
    np.testing.assert_allclose(y[y != 0], 1 / 0.75, rtol=1e-6)


# ------------------------------------------------------------------ batch norm

def np_bn(x, mean, var, beta, gamma, eps):
    out = (x - mean) / np.sqrt(var + eps)
    if gamma is not None:
        out = out * gamma
    if beta is not None:
        out = out + beta
    return out


@pytest.mark.parametrize("dtype", FLOATS)
def test_batch_normalization(dtype, rng):
    x = rng.standard_normal((4, 3, 5)).astype(dtype)
    m, v = rng.standard_normal(5).astype(dtype), rng.uniform(0.5, 2, 5).astype(dtype)
    b, g = rng.standard_normal(5).astype(dtype), rng.standard_normal(5).astype(dtype)
    ps = [K.constant(a, dtype) for a in (m, v, b, g)]
    y, out = run(lambda p: K.batch_normalization(p, *ps, epsilon=1e-3), x)
    assert K.int_shape(out) == (None, 3, 5) and y.dtype == dtype
    ref = np_bn(*(a.astype("float64") for a in (x, m, v, b, g)), 1e-3)
    np.testing.assert_allclose(y, ref, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)
    # None beta/gamma
    y = K.eval(K.batch_normalization(K.constant(x), ps[0], ps[1], None, None))
    np.testing.assert_allclose(y, np_bn(x.astype("float64"), m, v, None, None, 1e-3),
                               rtol=1e-5, atol=1e-6)


def test_batch_normalization_axis_and_broadcast_params(rng):
    x = rng.standard_normal((2, 3, 4, 4))
    m, v, b, g = (rng.uniform(0.5, 2, 3) for _ in range(4))
    ref = np_bn(x, *(a.reshape(1, 3, 1, 1) for a in (m, v, b, g)), 1e-3)
    got = K.eval(K.batch_normalization(K.constant(x, "float64"),
                                       *[K.constant(a, "float64") for a in (m, v, b, g)],
                                       axis=1))
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    got = K.eval(K.batch_normalization(
        K.constant(x, "float64"), *[K.constant(a.reshape(1, 3, 1, 1), "float64")
                                    for a in (m, v, b, g)], axis=1))
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    check_grads(lambda p, q, r, s, t: K.batch_normalization(p, q, r, s, t, axis=1),
                x[:, :, :2, :2], m, v, b, g, rtol=1e-4)


def test_batch_normalization_errors():
    x = K.placeholder((None, 3))
    z = K.constant(np.zeros(4))
    with pytest.raises(ValueError, match="batch_normalization: mean of shape \\(4,\\) does not "
                                         "match axis 1"):
        K.batch_normalization(x, z, z, None, None)
    with pytest.raises(ValueError, match="batch_normalization: var must be a tensor"):
        K.batch_normalization(x, K.constant(np.zeros(3)), None, None, None)
    with pytest.raises(ValueError, match="batch_normalization: axis 2"):
        K.batch_normalization(x, z, z, None, None, axis=2)


@pytest.mark.parametrize("axes,shape", [([0], (5, 3)), ([0, 1, 2], (2, 3, 4, 3)),
                                        ([0, 2, 3], (2, 3, 4, 2)), ([0, 1], (2, 3, 4))])
def test_normalize_batch_in_training(axes, shape, rng):
    x = rng.standard_normal(shape) * 2 + 1
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    gamma = rng.uniform(0.5, 2, kept)
    beta = rng.standard_normal(kept)
    ph = K.placeholder((None,) + shape[1:], dtype="float64")
    normed, mean, var = K.normalize_batch_in_training(
        ph, K.constant(gamma, "float64"), K.constant(beta, "float64"), axes, epsilon=1e-3)
    assert K.int_shape(mean) == kept and K.int_shape(var) == kept
    got = K.function([ph], [normed, mean, var])([x])
    m = x.mean(axis=tuple(axes), keepdims=True)
    v = x.var(axis=tuple(axes), keepdims=True)
    exp_shape = [1 if i in axes else d for i, d in enumerate(shape)]
    ref = np_bn(x, m, v, beta.reshape(exp_shape), gamma.reshape(exp_shape), 1e-3)
    np.testing.assert_allclose(got[0], ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1], m.reshape(kept), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[2], v.reshape(kept), rtol=1e-10)


def test_normalize_batch_in_training_grads_and_none(rng):
    x = rng.standard_normal((4, 3))
    g, b = rng.uniform(0.5, 2, 3), rng.standard_normal(3)
    check_grads(lambda p, q, r: K.normalize_batch_in_training(p, q, r, [0])[0], x, g, b,
                rtol=1e-4, atol=1e-6)
    check_grads(lambda p: K.normalize_batch_in_training(p, None, None, [0])[2], x)
    normed, _, _ = K.normalize_batch_in_training(K.constant(x), None, None, [0])
    np.testing.assert_allclose(K.eval(normed), (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-3),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="normalize_batch_in_training: reduction_axes"):
        K.normalize_batch_in_training(K.constant(x), None, None, [])
    with pytest.raises(ValueError, match="normalize_batch_in_training: axis 5"):
        K.normalize_batch_in_training(K.constant(x), None, None, [5])


def test_empty_batch_and_size_one_axes():
    p = K.placeholder((None, 3))
    t = K.placeholder((None, 3))
    lab = K.placeholder((None,), dtype="int32")
    outs = [K.relu(p), K.softmax(p), K.categorical_crossentropy(t, p),
            K.categorical_crossentropy(t, p, from_logits=True),
            K.sparse_categorical_crossentropy(lab, p), K.binary_crossentropy(t, p),
            K.in_top_k(p, lab, 1), K.l2_normalize(p, -1), K.dropout(p, 0.5),
            K.normalize_batch_in_training(p, None, None, [1])[0]]
    f = K.function([p, t, lab], outs)
    empty = np.zeros((0, 3), "float32")
    for o, r in zip(outs, f([empty, empty, np.zeros(0, "int32")])):
        assert r.shape[0] == 0
    one = np.full((1, 3), 0.5, "float32")
    res = f([one, one, np.array([2], "int32")])
    np.testing.assert_allclose(res[1], np.full((1, 3), 1 / 3), rtol=1e-6)
    # A single class: softmax is 1 and the crossentropy 0.
    q = K.placeholder((None, 1))
    g = K.function([q], [K.softmax(q), K.categorical_crossentropy(q * 0 + 1, q, True)])
    s, ce = g([np.array([[3.0], [-2.0]], "float32")])
    np.testing.assert_array_equal(s, [[1.0], [1.0]])
    np.testing.assert_array_equal(ce, [0.0, 0.0])
