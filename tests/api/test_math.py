"""cyback.api.math against NumPy: reductions, scans, element-wise math,
comparisons, dot/batch_dot/transpose."""
import numpy as np
import pytest

import cyback as K

RS = np.random.RandomState(7)


def run(build, *values, dtypes=None):
    """Evaluate ``build`` on placeholders fed with ``values`` (the run-time path)."""
    values = [np.asarray(v) for v in values]
    phs = [K.placeholder(shape=(None,) + v.shape[1:] if v.ndim else (), dtype=v.dtype.name)
           for v in values]
    out = build(*phs)
    return K.function(phs, [out])(values)[0], out


def data(shape, dtype):
    if np.dtype(dtype).kind == "f":
        return RS.uniform(-3, 3, size=shape).astype(dtype)
    return RS.randint(-5, 6, size=shape).astype(dtype)


# ------------------------------------------------------------------ reductions

NP_RED = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean,
          "var": np.var, "std": np.std, "any": np.any, "all": np.all}


def _np_axis(axis):
    return tuple(axis) if isinstance(axis, list) else axis


@pytest.mark.parametrize("kind", sorted(NP_RED))
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("axis", [None, 0, -1, 1, [0, 2], (1, 2), [-1, 0]])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(kind, dtype, axis, keepdims):
    x = data((2, 3, 4), dtype)
    if kind == "prod":
        x = np.clip(np.where(x == 0, 1, x), -2, 2).astype(dtype) if dtype == "int32" else x * 0.5
    got, t = run(lambda p: getattr(K, kind)(p, axis=axis, keepdims=keepdims), x)
    ref = NP_RED[kind](x.astype("float64") if kind in ("mean", "var", "std") else x,
                       axis=_np_axis(axis), keepdims=keepdims)
    assert np.shape(got) == np.shape(ref)
    tol = 1e-5 if dtype != "float64" else 1e-12
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    # static shape matches
    assert t.shape[1:] == np.shape(ref)[1:] or axis is None or not keepdims and 0 in (
        axis if isinstance(axis, (list, tuple)) else [axis])
    if kind in ("any", "all"):
        assert got.dtype == np.bool_
    elif kind in ("mean", "var", "std") and dtype == "int32":
        assert got.dtype == np.float32
    else:
        assert got.dtype == np.dtype(dtype)


@pytest.mark.parametrize("kind", ["sum", "max", "min", "mean", "prod", "var", "std"])
def test_reduction_static_shapes(kind):
    x = K.placeholder((None, 3, 4))
    assert K.int_shape(getattr(K, kind)(x, axis=1)) == (None, 4)
    assert K.int_shape(getattr(K, kind)(x, axis=[1, 2], keepdims=True)) == (None, 1, 1)
    assert K.int_shape(getattr(K, kind)(x)) == ()
    assert K.int_shape(getattr(K, kind)(x, axis=0)) == (3, 4)


@pytest.mark.parametrize("kind", ["sum", "max", "min", "mean", "prod", "any", "all"])
def test_reductions_size_one_and_noncontiguous(kind):
    base = data((4, 1, 6), "float64")
    x = base[::2, :, ::3]        # non-contiguous view (2, 1, 2)
    assert not x.flags.c_contiguous
    got, _ = run(lambda p: getattr(K, kind)(p, axis=1), x)
    np.testing.assert_allclose(got, NP_RED[kind](x, axis=1))
    got, _ = run(lambda p: getattr(K, kind)(p, axis=[0, 2], keepdims=True), x)
    np.testing.assert_allclose(got, NP_RED[kind](x, axis=(0, 2), keepdims=True))


def test_empty_reductions():
    x = np.zeros((0, 3), "float32")
    np.testing.assert_allclose(run(lambda p: K.sum(p, axis=0), x)[0], [0, 0, 0])
    np.testing.assert_allclose(run(lambda p: K.prod(p, axis=0), x)[0], [1, 1, 1])
    np.testing.assert_allclose(run(lambda p: K.max(p, axis=0), x)[0], [-np.inf] * 3)
    np.testing.assert_allclose(run(lambda p: K.min(p, axis=0), x)[0], [np.inf] * 3)
    assert run(lambda p: K.sum(p, axis=1), x)[0].shape == (0,)
    assert run(lambda p: K.max(p, axis=1), x)[0].shape == (0,)
    assert bool(run(lambda p: K.all(p), x)[0]) is True
    assert bool(run(lambda p: K.any(p), x)[0]) is False


def test_bool_reductions():
    b = np.array([[True, False], [True, True]])
    np.testing.assert_array_equal(run(lambda p: K.any(p, axis=1), b)[0], [True, True])
    np.testing.assert_array_equal(run(lambda p: K.all(p, axis=1), b)[0], [False, True])
    assert run(lambda p: K.sum(p), b)[0] == 3
    np.testing.assert_array_equal(run(lambda p: K.sum(p, axis=0), b)[0], [2, 1])


@pytest.mark.parametrize("fn", ["sum", "mean", "max", "argmax", "cumsum", "logsumexp"])
@pytest.mark.parametrize("axis", [3, -4, 1.5, "a", [0, 0]])
def test_bad_axes(fn, axis):
    x = K.placeholder((2, 3, 4))
    if fn in ("argmax", "cumsum") and isinstance(axis, list):
        axis = [0, 1]
    with pytest.raises((ValueError, TypeError), match=fn):
        getattr(K, fn)(x, axis=axis)


# ------------------------------------------------------------------ arg, scans, logsumexp

@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_argmax_argmin(dtype, axis):
    x = data((3, 5), dtype)
    got, t = run(lambda p: K.argmax(p, axis=axis), x)
    np.testing.assert_array_equal(got, np.argmax(x, axis=axis))
    got, _ = run(lambda p: K.argmin(p, axis=axis), x)
    np.testing.assert_array_equal(got, np.argmin(x, axis=axis))
    assert got.dtype == np.int64


def test_argmax_errors():
    with pytest.raises(ValueError, match="argmax"):
        K.argmax(K.placeholder(()))
    with pytest.raises(ValueError, match="argmin"):
        run(lambda p: K.argmin(p, axis=0), np.zeros((0, 2), "float32"))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_cumprod(dtype, axis):
    x = data((3, 4), dtype)
    got, _ = run(lambda p: K.cumsum(p, axis=axis), x)
    np.testing.assert_allclose(got, np.cumsum(x, axis=axis), rtol=1e-6)
    assert got.dtype == np.dtype(dtype)
    got, _ = run(lambda p: K.cumprod(p, axis=axis), x)
    np.testing.assert_allclose(got, np.cumprod(x, axis=axis), rtol=1e-5)
    with pytest.raises(ValueError, match="cumsum"):
        K.cumsum(K.placeholder(()))


@pytest.mark.parametrize("axis", [None, 0, 1, -1, [0, 1]])
@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp(axis, keepdims):
    x = data((3, 4), "float64") * 100   # large values: the naive formula overflows
    got, _ = run(lambda p: K.logsumexp(p, axis=axis, keepdims=keepdims), x)
    m = np.max(x, axis=_np_axis(axis), keepdims=True)
    ref = np.log(np.sum(np.exp(x - m), axis=_np_axis(axis), keepdims=True)) + m
    if not keepdims:
        ref = np.squeeze(ref, axis=_np_axis(axis)) if axis is not None else ref.reshape(())
    np.testing.assert_allclose(got, ref, rtol=1e-12)


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_logsumexp_minus_inf_and_ints():
    x = np.array([[-np.inf, -np.inf], [0.0, -np.inf]], "float32")
    np.testing.assert_allclose(run(lambda p: K.logsumexp(p, axis=1), x)[0], [-np.inf, 0.0])
    got = K.eval(K.logsumexp(K.variable([1, 2], dtype="int32")))
    np.testing.assert_allclose(got, np.log(np.e + np.e ** 2), rtol=1e-6)


# ------------------------------------------------------------------ element-wise

UNARY = [("square", np.square), ("abs", np.abs), ("exp", np.exp), ("sign", np.sign),
         ("round", np.round), ("sin", np.sin), ("cos", np.cos)]


@pytest.mark.parametrize("name,ref", UNARY)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_unary(name, ref, dtype):
    x = data((3, 1, 4), dtype)
    got, _ = run(getattr(K, name), x)
    np.testing.assert_allclose(got, ref(x), rtol=1e-6)
    assert got.dtype == np.dtype(dtype)
    got, _ = run(getattr(K, name), x[:, :, ::2])
    np.testing.assert_allclose(got, ref(x[:, :, ::2]), rtol=1e-6)
    assert run(getattr(K, name), np.zeros((0, 2), dtype))[0].shape == (0, 2)


def test_unary_int_inputs():
    i = np.array([-2, 0, 3], "int32")
    for name in ("square", "abs", "sign"):
        got = run(getattr(K, name), i)[0]
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, dict(UNARY)[name](i))
    for name in ("exp", "sin", "cos"):
        got = run(getattr(K, name), i)[0]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, dict(UNARY)[name](i.astype("float64")), rtol=1e-6)


def test_round_half_to_even():
    np.testing.assert_array_equal(K.eval(K.round(K.variable([0.5, 1.5, 2.5, -0.5, -1.5]))),
                                  [0, 2, 2, 0, -2])


def test_sqrt_and_log():
    x = np.array([4.0, 0.0, -1.0, 2.25], "float32")
    np.testing.assert_allclose(run(K.sqrt, x)[0], [2, 0, 0, 1.5])   # negatives clipped to 0
    np.testing.assert_allclose(run(K.log, np.array([1.0, np.e]))[0], [0, 1])
    assert K.eval(K.sqrt(K.variable([4], dtype="int32"))).dtype == np.float32


@pytest.mark.parametrize("a", [2, 3, 0.5, -1, 0])
def test_pow(a):
    x = np.array([[1.0, 2.0, 4.0]], "float32")
    got = run(lambda p: K.pow(p, a), x)[0]
    np.testing.assert_allclose(got, np.power(x, a), rtol=1e-6)
    assert got.dtype == np.float32
    ints = K.eval(K.pow(K.variable([1, 2, 3], dtype="int32"), 2))
    assert ints.dtype == np.int32 and ints.tolist() == [1, 4, 9]


def test_pow_tensor_exponent():
    np.testing.assert_allclose(K.eval(K.pow(K.variable([2.0, 3.0]), K.variable([3.0, 2.0]))),
                               [8, 9])


def test_clip():
    x = np.array([-3.0, -1.0, 0.5, 2.0, 9.0], "float32")
    np.testing.assert_allclose(run(lambda p: K.clip(p, -1.5, 2.5), x)[0],
                               np.clip(x, -1.5, 2.5))
    np.testing.assert_allclose(run(lambda p: K.clip(p, None, 1.0), x)[0], np.minimum(x, 1))
    np.testing.assert_allclose(run(lambda p: K.clip(p, 0, None), x)[0], np.maximum(x, 0))
    # max < min: everything becomes min, as in Keras
    np.testing.assert_allclose(run(lambda p: K.clip(p, 1.0, 0.0), x)[0], np.ones(5))
    got = run(lambda p: K.clip(p, 0, 3), np.array([-1, 2, 5], "int32"))[0]
    assert got.dtype == np.int32 and got.tolist() == [0, 2, 3]
    assert run(lambda p: K.clip(p, 0.0, 1.0), x)[0].dtype == np.float32


CMP = [("equal", np.equal), ("not_equal", np.not_equal), ("greater", np.greater),
       ("greater_equal", np.greater_equal), ("less", np.less), ("less_equal", np.less_equal)]


@pytest.mark.parametrize("name,ref", CMP)
def test_comparisons(name, ref):
    a = np.array([[1.0, 2.0, 3.0]], "float32")
    b = np.array([[3.0], [2.0]], "float32")
    got = run(getattr(K, name), a, b)[0]
    np.testing.assert_array_equal(got, ref(a, b))
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(run(lambda p: getattr(K, name)(p, 2), a)[0], ref(a, 2))
    ia = np.array([1, 2, 3], "int32")
    np.testing.assert_array_equal(run(lambda p: getattr(K, name)(p, 2.5), ia)[0], ref(ia, 2.5))


@pytest.mark.parametrize("name,ref", [("maximum", np.maximum), ("minimum", np.minimum)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_maximum_minimum(name, ref, dtype):
    a, b = data((2, 3), dtype), data((1, 3), dtype)
    got = run(getattr(K, name), a, b)[0]
    np.testing.assert_array_equal(got, ref(a, b))
    assert got.dtype == np.dtype(dtype)
    got = run(lambda p: getattr(K, name)(p, 0.5), a)[0]
    assert got.dtype == (np.dtype(dtype) if dtype != "int32" else np.float32)


def test_broadcast_errors_name_the_function():
    with pytest.raises(ValueError, match=r"maximum.*\(2, 3\).*\(4,\)|maximum"):
        K.maximum(K.placeholder((2, 3)), K.placeholder((4,)))
    with pytest.raises(ValueError, match="equal"):
        K.equal(K.placeholder((2, 3)), K.placeholder((2, 2)))


def test_weak_python_scalars_keep_dtype():
    x = K.placeholder((2,), dtype="float16")
    assert (x * 2.0).dtype == "float16"
    assert K.maximum(x, 0).dtype == "float16"
    i = K.placeholder((2,), dtype="int32")
    assert (i + 1).dtype == "int32"
    assert (i * 1.5).dtype == "float32"


# ------------------------------------------------------------------ linear algebra

@pytest.mark.parametrize("sa,sb", [((2, 3), (3, 4)), ((32, 28, 3), (3, 4)), ((2, 3), (4, 3, 5)),
                                   ((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)),
                                   ((2, 2, 3), (2, 3, 4)), ((1, 1), (1, 1)), ((0, 3), (3, 2))])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dot(sa, sb, dtype):
    a, b = data(sa, dtype), data(sb, dtype)
    got = K.eval(K.dot(K.variable(a, dtype=dtype), K.variable(b, dtype=dtype)))
    ref = np.tensordot(a, b, axes=([a.ndim - 1], [0 if b.ndim == 1 else b.ndim - 2]))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert got.dtype == np.dtype(dtype)
    assert K.int_shape(K.dot(K.placeholder(sa), K.placeholder(sb))) == ref.shape


def test_dot_symbolic_batch_and_noncontiguous():
    x = K.placeholder((None, 3))
    w = data((3, 4), "float32")
    f = K.function([x], [K.dot(x, K.variable(w))])
    big = data((6, 6), "float32")
    np.testing.assert_allclose(f([big[::2, ::2]])[0], big[::2, ::2].dot(w), rtol=1e-5)
    assert K.int_shape(K.dot(x, K.variable(w))) == (None, 4)


def test_dot_errors():
    with pytest.raises(ValueError, match=r"dot.*\(2, 3\).*\(4, 5\)"):
        K.dot(K.placeholder((2, 3)), K.placeholder((4, 5)))


def test_dot_int_and_mixed():
    got = K.eval(K.dot(K.variable([[1, 2]], dtype="int32"), K.variable([[3], [4]], dtype="int32")))
    assert got.dtype == np.int32 and got.tolist() == [[11]]
    got = K.eval(K.dot(K.variable([[1, 2]], dtype="int32"), K.variable([[0.5], [1.0]])))
    assert got.dtype == np.float32 and got.tolist() == [[2.5]]


def _np_batch_dot(x, y, ax, ay):
    out = np.stack([np.tensordot(x[i], y[i], axes=([ax - 1], [ay - 1])) for i in range(len(x))])
    return out.reshape(len(x), 1) if out.ndim == 1 else out


@pytest.mark.parametrize("sa,sb,axes,ax,ay", [
    ((2, 2), (2, 2), 1, 1, 1), ((4, 20, 1), (4, 30, 20), [1, 2], 1, 2),
    ((3, 4, 2), (3, 5, 4), (1, 2), 1, 2), ((3, 4), (3, 4, 5), (1, 1), 1, 1),
    ((3, 2, 4), (3, 4, 5), None, 2, 1), ((3, 4), (3, 4), None, 1, 1),
    ((3, 2, 4), (3, 5, 4), 2, 2, 2), ((3, 2, 4), (3, 4, 5), (-1, -2), 2, 1),
    ((1, 1), (1, 1), 1, 1, 1)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batch_dot(sa, sb, axes, ax, ay, dtype):
    a, b = data(sa, dtype), data(sb, dtype)
    got = K.eval(K.batch_dot(K.variable(a, dtype=dtype), K.variable(b, dtype=dtype), axes=axes))
    np.testing.assert_allclose(got, _np_batch_dot(a, b, ax, ay), rtol=1e-5, atol=1e-5)
    assert got.dtype == np.dtype(dtype)


def test_batch_dot_symbolic_batch():
    x = K.placeholder((None, 4, 2))
    y = K.placeholder((None, 5, 4))
    out = K.batch_dot(x, y, axes=(1, 2))
    assert K.int_shape(out) == (None, 2, 5)
    a, b = data((3, 4, 2), "float32"), data((3, 5, 4), "float32")
    np.testing.assert_allclose(K.function([x, y], [out])([a, b])[0], _np_batch_dot(a, b, 1, 2),
                               rtol=1e-5)


@pytest.mark.parametrize("sa,sb,axes", [((3, 4), (3, 5), 1), ((3,), (3, 4), None),
                                        ((3, 4), (2, 4), 1), ((3, 4), (3, 4), 0),
                                        ((3, 4), (3, 4), 5), ((3, 4), (3, 4), (1, 1, 1))])
def test_batch_dot_errors(sa, sb, axes):
    with pytest.raises(ValueError, match="batch_dot"):
        K.batch_dot(K.placeholder(sa), K.placeholder(sb), axes=axes)


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (5,), (), (1, 0)])
def test_transpose(shape):
    x = data(shape, "float32")
    got, t = run(K.transpose, x) if shape else (K.eval(K.transpose(K.variable(x))), None)
    np.testing.assert_array_equal(got, np.transpose(x))
    assert K.int_shape(K.transpose(K.placeholder(shape))) == tuple(reversed(shape))
