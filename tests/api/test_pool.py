"""pool2d and pool3d: values against a direct-loop NumPy reference, shapes,
first and second derivatives, and errors."""
import numpy as np
import pytest

import cyback as K

from gradcheck import check_grads

RS = np.random.RandomState(11)


def rand(*shape, dtype="float64"):
    return RS.uniform(-1, 1, size=shape).astype(dtype)


def kc(a, dtype=None):
    return K.constant(a, dtype=dtype or a.dtype.name)


def cf(a):
    return np.ascontiguousarray(np.moveaxis(a, -1, 1))


def ref_pool(x, pool, strides, padding, mode):
    """channels_last x; padded cells are never in a max or an average."""
    r = x.ndim - 2
    sizes = x.shape[1:-1]
    if padding == "valid":
        outs = [(n - k) // s + 1 for n, k, s in zip(sizes, pool, strides)]
        before = [0] * r
    else:
        outs = [-(-n // s) for n, s in zip(sizes, strides)]
        before = [max((o - 1) * s + k - n, 0) // 2
                  for o, n, k, s in zip(outs, sizes, pool, strides)]
    y = np.zeros((x.shape[0],) + tuple(outs) + (x.shape[-1],), x.dtype)
    for n in range(x.shape[0]):
        for pos in np.ndindex(*outs):
            sl = []
            for i in range(r):
                lo = pos[i] * strides[i] - before[i]
                sl.append(slice(max(lo, 0), min(lo + pool[i], sizes[i])))
            win = x[(n,) + tuple(sl)].reshape(-1, x.shape[-1])
            y[(n,) + pos] = win.max(0) if mode == "max" else win.mean(0)
    return y


CASES_2D = [
    ((4, 4), (2, 2), (2, 2), "valid"),
    ((5, 7), (3, 2), (1, 1), "valid"),
    ((5, 7), (3, 3), (2, 2), "same"),
    ((5, 6), (2, 3), (3, 1), "same"),
    ((3, 3), (1, 1), (2, 2), "same"),
    ((2, 5), (2, 4), (4, 1), "same"),  # stride larger than the window
    ((1, 1), (1, 1), (1, 1), "valid"),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", CASES_2D)
def test_pool2d_values(case, fmt, mode, dtype):
    sp, pool, st, pad = case
    cl = fmt == "channels_last"
    x = rand(2, *sp, 3, dtype=dtype)
    want = ref_pool(x, pool, st, pad, mode)
    y = K.eval(K.pool2d(K.variable(x if cl else cf(x), dtype=dtype), pool, st, pad, fmt, mode))
    assert y.dtype == dtype
    np.testing.assert_allclose(y, want if cl else cf(want), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", [((4, 4, 4), (2, 2, 2), (2, 2, 2), "valid"),
                                  ((3, 5, 4), (2, 3, 2), (1, 2, 3), "same"),
                                  ((3, 4, 5), (3, 1, 2), (2, 1, 1), "valid")])
def test_pool3d_values(case, fmt, mode):
    sp, pool, st, pad = case
    cl = fmt == "channels_last"
    x = rand(2, *sp, 2)
    want = ref_pool(x, pool, st, pad, mode)
    y = K.eval(K.pool3d(kc(x if cl else cf(x)), pool, st, pad, fmt, mode))
    np.testing.assert_allclose(y, want if cl else cf(want), rtol=1e-12, atol=1e-12)


def test_defaults_ints_and_float16():
    x = rand(1, 4, 4, 2)
    y = K.eval(K.pool2d(kc(x), 2, strides=2))
    np.testing.assert_allclose(y, ref_pool(x, (2, 2), (2, 2), "valid", "max"))
    K.set_image_data_format("channels_first")
    y = K.eval(K.pool2d(kc(cf(x)), (2, 2)))
    np.testing.assert_allclose(y, cf(ref_pool(x, (2, 2), (1, 1), "valid", "max")))
    h = K.eval(K.pool2d(kc(cf(x), "float16"), (2, 2), padding="same", pool_mode="avg"))
    assert h.dtype == np.float16
    np.testing.assert_allclose(
        h, cf(ref_pool(x.astype(np.float16).astype(np.float64), (2, 2), (1, 1), "same",
                       "avg")), rtol=2e-3, atol=2e-3)


def test_none_batch_and_spatial():
    xp = K.placeholder((None, 5, 6, 3), dtype="float64")
    y = K.pool2d(xp, (2, 2), (2, 2), "same")
    assert K.int_shape(y) == (None, 3, 3, 3)
    xq = K.placeholder((None, 3, None, None), dtype="float64")
    z = K.pool2d(xq, (3, 2), (2, 2), "valid", "channels_first", "avg")
    assert K.int_shape(z) == (None, 3, None, None)
    f = K.function([xp, xq], [y, z])
    for n in (1, 4):
        x = rand(n, 5, 6, 3)
        a, b = f([x, cf(x)])
        np.testing.assert_allclose(a, ref_pool(x, (2, 2), (2, 2), "same", "max"))
        np.testing.assert_allclose(b, cf(ref_pool(x, (3, 2), (2, 2), "valid", "avg")),
                                   rtol=1e-12)


def test_empty_and_non_contiguous():
    xp = K.placeholder((None, 4, 4, 3), dtype="float64")
    f = K.function([xp], [K.pool2d(xp, (2, 2), (2, 2), "same", pool_mode="avg")])
    assert f([np.zeros((0, 4, 4, 3))])[0].shape == (0, 2, 2, 3)
    x = rand(2, 3, 4, 4).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(f([x])[0], ref_pool(x, (2, 2), (2, 2), "same", "avg"))
    g = K.gradients(K.sum(K.pool2d(xp, (2, 2))), [xp])[0]
    assert K.function([xp], [g])([np.zeros((0, 4, 4, 3))])[0].shape == (0, 4, 4, 3)
    # channels may be empty too
    e = K.eval(K.pool2d(kc(np.zeros((1, 4, 4, 0))), (2, 2)))
    assert e.shape == (1, 3, 3, 0)


# ------------------------------------------------------------------ gradients

@pytest.mark.parametrize("mode", ["max", "avg"])
def test_pool2d_grads(mode, one_thread):
    x = rand(2, 5, 4, 2)
    check_grads(lambda a: K.pool2d(a, (2, 2), (2, 2), "same", pool_mode=mode), x)
    check_grads(lambda a: K.pool2d(a, (3, 2), (1, 1), "valid", "channels_first", mode), cf(x))


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_pool3d_grads(mode, one_thread):
    check_grads(lambda a: K.pool3d(a, (2, 2, 2), (1, 2, 2), "same", pool_mode=mode),
                rand(1, 3, 4, 3, 2))


def test_max_grad_goes_to_the_first_maximum():
    x = np.zeros((1, 2, 2, 1))
    x[0, 1, 0, 0] = 1.0
    x[0, 1, 1, 0] = 1.0
    xv = K.variable(x, dtype="float64")
    g = K.eval(K.gradients(K.sum(K.pool2d(xv, (2, 2))), [xv])[0])
    np.testing.assert_array_equal(g[0, :, :, 0], [[0, 0], [1, 0]])


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_second_derivatives(mode, one_thread):
    def build(a):
        y = K.pool2d(a * a, (2, 2), (1, 1), "same", pool_mode=mode)
        return K.gradients(K.sum(y * y), [a])[0]
    check_grads(build, rand(1, 3, 4, 2), rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ errors

def _err(exc, match, fn, *args, **kw):
    with pytest.raises(exc, match=match):
        fn(*args, **kw)


def test_errors():
    x = K.placeholder((None, 5, 5, 3))
    _err(ValueError, "pool2d: x must be 4-D", K.pool2d, K.placeholder((None, 5, 3)), (2, 2))
    _err(ValueError, "pool3d: x must be 5-D", K.pool3d, x, (2, 2, 2))
    _err(ValueError, "pool2d: pool_mode must be 'max' or 'avg'", K.pool2d, x, (2, 2),
         pool_mode="sum")
    _err(ValueError, "pool2d: padding must be one of", K.pool2d, x, (2, 2), padding="causal")
    _err(ValueError, "pool2d: data_format", K.pool2d, x, (2, 2), data_format="NHWC")
    _err(ValueError, "pool2d: pool_size must have 2 entries", K.pool2d, x, (2, 2, 2))
    _err(ValueError, "pool2d: pool_size must be positive", K.pool2d, x, (0, 2))
    _err(ValueError, "pool2d: strides must be positive", K.pool2d, x, (2, 2), (1, -1))
    _err(TypeError, "pool2d: strides must be an int or a tuple", K.pool2d, x, (2, 2), None)
    _err(ValueError, "pool2d: pool_size .* is larger than the input", K.pool2d, x, (6, 2))
    _err(TypeError, "pool2d: x must be a float tensor", K.pool2d,
         K.placeholder((None, 5, 5, 3), dtype="int32"), (2, 2))
    xq = K.placeholder((None, None, None, 3))
    f = K.function([xq], [K.pool2d(xq, (3, 3))])
    _err(ValueError, "pool2d: pool_size .* is larger", f, [np.zeros((1, 2, 4, 3), "float32")])


def test_pool_ops_keep_their_identity_after_running():
    # prepared kernel calls live outside the op: CSE keys and pickles are unchanged
    import pickle

    from cyback.ops.pool import Pool
    xv = np.random.default_rng(3).standard_normal((2, 6, 6, 3)).astype(np.float32)
    x = K.placeholder((None, 6, 6, 3))
    a = K.pool2d(x, (2, 2), (2, 2))
    f = K.function([x], [a])
    want = f([xv])[0]
    op = a.node.op
    assert isinstance(op, Pool) and op.key() == Pool(*op._params()).key()
    g = K.function([x], [a, K.pool2d(x, (2, 2), (2, 2))])
    assert len(g.plan_ops(0)) == 1              # the two pools merged
    h = pickle.loads(pickle.dumps(f))
    np.testing.assert_array_equal(h([xv])[0], want)
