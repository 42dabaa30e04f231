"""Reverse-mode gradients checked against finite differences (float64)."""
import numpy as np
import pytest

import cyback as K
from cyback.ops import elementwise as ew
from cyback.ops import reduction as red

from gradcheck import check_grads

RS = np.random.RandomState(42)


def _pos(*shape):
    return RS.uniform(0.5, 2.0, size=shape)


def _any(*shape):
    return RS.uniform(-2.0, 2.0, size=shape)


# ------------------------------------------------------------------ unary table

UNARY_DOMAIN = {"log": _pos, "sqrt": _pos, "log1p": _pos, "reciprocal": _pos}
SMOOTH_UNARY = [n for n, (_, rule) in ew.UNARY.items() if rule is not None]
FLAT_UNARY = [n for n, (_, rule) in ew.UNARY.items() if rule is None]


@pytest.mark.parametrize("name", SMOOTH_UNARY)
def test_unary_table_gradients(name):
    fn = getattr(ew, name if hasattr(ew, name) else name + "_")
    x = UNARY_DOMAIN.get(name, _any)(3, 4)
    if name == "abs":
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    check_grads(fn, x, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", FLAT_UNARY)
def test_unary_table_no_gradient_gives_zeros(name):
    if name == "logical_not":
        pytest.skip("bool result")
    fn = getattr(ew, name if hasattr(ew, name) else name + "_")
    v = K.variable(_any(2, 3), dtype="float64")
    g = K.gradients(K.sum(fn(v) * v), [v])[0]
    # d/dv (f(v) * v) = f(v) when f is piecewise constant
    np.testing.assert_allclose(K.eval(g), K.eval(fn(v)))


# ------------------------------------------------------------------ binary table

def _binary_inputs(name):
    if name == "power":
        return _pos(3, 4), _any(3, 4)
    if name == "divide":
        return _any(3, 4), _pos(3, 4) * np.sign(_any(3, 4))
    if name == "mod":
        return RS.uniform(0.1, 0.9, (3, 4)) + RS.randint(0, 3, (3, 4)), np.full((3, 4), 1.3)
    if name in ("maximum", "minimum"):
        a = _any(3, 4)
        return a, a + np.where(RS.rand(3, 4) > 0.5, 0.5, -0.5)
    return _any(3, 4), _any(3, 4)


SMOOTH_BINARY = [n for n, (_, gx, _) in ew.BINARY.items() if gx is not None]
FLAT_BINARY = [n for n, (_, gx, _) in ew.BINARY.items() if gx is None]


@pytest.mark.parametrize("name", SMOOTH_BINARY)
def test_binary_table_gradients(name):
    fn = getattr(ew, name)
    check_grads(fn, *_binary_inputs(name))


@pytest.mark.parametrize("name", FLAT_BINARY)
def test_binary_table_no_gradient(name):
    a, b = K.variable(_any(2, 2), dtype="float64"), K.variable(_any(2, 2), dtype="float64")
    out = getattr(ew, name)(a, b)
    loss = K.sum(K.cast(out, "float64") * a)
    ga, gb = K.gradients(loss, [a, b])
    np.testing.assert_allclose(K.eval(ga), K.eval(K.cast(out, "float64")))
    np.testing.assert_allclose(K.eval(gb), 0)


@pytest.mark.parametrize("sa,sb", [((3, 1), (1, 4)), ((4,), (3, 4)), ((), (2, 3)),
                                   ((2, 1, 3), (4, 1)), ((1, 1), (2, 3))])
@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide", "maximum"])
def test_broadcasting_gradients(name, sa, sb):
    a = _pos(*sa)
    b = _pos(*sb) + 3.0   # keeps maximum away from ties
    check_grads(getattr(ew, name), a, b)


def test_scalar_operand_gradients():
    check_grads(lambda x: x * 3.0 + 2.0 - x / 4.0 + 2.0 ** x + x ** 3 + 1.0 / x, _pos(2, 3))


# ------------------------------------------------------------------ other element-wise

def test_clip_where_cast_gradients():
    x = np.array([[-2.0, -0.5, 0.3], [0.7, 1.5, 3.0]])
    check_grads(lambda t: K.clip(t, -1.0, 1.0), x)
    check_grads(lambda t: ew.where(K.greater(t, 0.5), t * 2, K.square(t)), x)
    v = K.variable(x, dtype="float64")
    g = K.gradients(K.sum(K.cast(K.cast(v, "float32"), "float64") * v), [v])[0]
    assert g.dtype == "float64"
    np.testing.assert_allclose(K.eval(g), 2 * x, rtol=1e-6)


def test_api_math_gradients():
    x = _pos(3, 4)
    check_grads(K.sqrt, x)
    check_grads(lambda t: K.pow(t, 3), x)
    check_grads(lambda t: K.pow(t, 0.5), x)
    check_grads(K.exp, _any(3, 4))
    check_grads(K.log, x)
    check_grads(K.sin, x)
    check_grads(K.cos, x)
    check_grads(K.abs, _any(3, 4) + 0.01)
    check_grads(K.square, _any(3, 4))


# ------------------------------------------------------------------ reductions

@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "prod", "var", "std",
                                  "logsumexp"])
@pytest.mark.parametrize("axis", [None, 0, -1, [0, 2], (1,)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_gradients(kind, axis, keepdims):
    x = _pos(2, 3, 4) + np.arange(24).reshape(2, 3, 4) * 0.01   # no ties
    check_grads(lambda t: getattr(K, kind)(t, axis=axis, keepdims=keepdims), x)


def test_max_min_ties_split_the_gradient():
    v = K.variable([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], dtype="float64")
    np.testing.assert_allclose(K.eval(K.gradients(K.sum(K.max(v, axis=1)), [v])[0]),
                               [[0, 0.5, 0.5], [1 / 3.0] * 3])
    np.testing.assert_allclose(K.eval(K.gradients(K.min(v), [v])[0]),
                               [[1, 0, 0], [0, 0, 0]])
    w = K.variable([[2.0, 1.0, 1.0], [1.0, 1.0, 5.0]], dtype="float64")
    np.testing.assert_allclose(K.eval(K.gradients(K.min(w), [w])[0]),
                               [[0, 0.25, 0.25], [0.25, 0.25, 0]])


def test_prod_gradient_with_axis_list():
    check_grads(lambda t: K.prod(t, axis=[0, 1], keepdims=True), _pos(2, 3, 2))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_cumprod_gradients(axis):
    check_grads(lambda t: K.cumsum(t, axis=axis), _any(3, 4))
    check_grads(lambda t: K.cumprod(t, axis=axis), _pos(3, 4))


def test_mean_gradient_with_symbolic_batch():
    x = K.placeholder((None, 3), dtype="float64")
    g = K.gradients(K.mean(x), [x])[0]
    f = K.function([x], [g])
    np.testing.assert_allclose(f([np.ones((4, 3))])[0], np.full((4, 3), 1 / 12.0))
    np.testing.assert_allclose(f([np.ones((2, 3))])[0], np.full((2, 3), 1 / 6.0))


def test_broadcast_gradient_with_symbolic_batch():
    x = K.placeholder((None, 3), dtype="float64")
    b = K.variable(np.zeros(3), dtype="float64")
    g = K.gradients(K.sum(x * 2 + b), [b])[0]
    f = K.function([x], [g])
    np.testing.assert_allclose(f([np.ones((5, 3))])[0], [5, 5, 5])


# ------------------------------------------------------------------ linear algebra

@pytest.mark.parametrize("sa,sb", [((2, 3), (3, 4)), ((2, 3), (4, 3, 5)), ((2, 3, 4), (4, 5)),
                                   ((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)),
                                   ((2, 2, 3), (2, 3, 4))])
def test_dot_gradients(sa, sb):
    check_grads(K.dot, _any(*sa), _any(*sb))


@pytest.mark.parametrize("sa,sb,axes", [((2, 2), (2, 2), 1), ((3, 4, 2), (3, 5, 4), (1, 2)),
                                        ((3, 4), (3, 4, 5), (1, 1)), ((3, 2, 4), (3, 4, 5), None),
                                        ((2, 5, 1), (2, 3, 5), [1, 2]), ((3, 4), (3, 4), None)])
def test_batch_dot_gradients(sa, sb, axes):
    check_grads(lambda a, b: K.batch_dot(a, b, axes=axes), _any(*sa), _any(*sb))


def test_transpose_gradient():
    check_grads(K.transpose, _any(2, 3, 4))


# ------------------------------------------------------------------ graph-level

def test_stop_gradient_blocks():
    v = K.variable([1.0, 2.0, 3.0])
    g = K.gradients(K.sum(K.stop_gradient(v) * v), [v])[0]
    np.testing.assert_allclose(K.eval(g), [1, 2, 3])
    a, b = K.stop_gradient([v, v * 2])
    assert K.eval(K.gradients(K.sum(a + b), [v])[0]).tolist() == [0, 0, 0]


def test_unconnected_variable_gets_zeros():
    v = K.variable([1.0, 2.0, 3.0])
    u = K.variable(np.ones((2, 2)), dtype="float64")
    gv, gu = K.gradients(K.sum(v * 2), [v, u])
    np.testing.assert_allclose(K.eval(gv), [2, 2, 2])
    np.testing.assert_array_equal(K.eval(gu), np.zeros((2, 2)))
    assert K.eval(gu).dtype == np.float64


def test_second_derivative_of_cube():
    v = K.variable([1.0, 2.0, -3.0])
    d1 = K.gradients(K.sum(v ** 3), [v])[0]
    d2 = K.gradients(K.sum(d1), [v])[0]
    np.testing.assert_allclose(K.eval(d1), [3, 12, 27])
    np.testing.assert_allclose(K.eval(d2), [6, 12, -18])
    x = K.placeholder((3,), dtype="float64")
    d2x = K.gradients(K.gradients(K.sum(K.sin(x) * x), x), x)
    xv = np.array([0.1, 0.5, 2.0])
    np.testing.assert_allclose(K.function([x], d2x)([xv])[0], 2 * np.cos(xv) - xv * np.sin(xv))


def test_hessian_vector_through_dot_and_tanh():
    w = K.placeholder((3, 2), dtype="float64")
    xv = _any(4, 3)
    loss = K.sum(K.tanh(K.dot(K.constant(xv, dtype="float64"), w)) ** 2)
    g = K.gradients(loss, w)
    check_grads(lambda t: K.gradients(K.sum(K.tanh(K.dot(K.constant(xv, dtype="float64"), t))
                                            ** 2), t)[0], _any(3, 2), rtol=1e-4, atol=1e-6)
    assert K.int_shape(g[0]) == (3, 2)


def test_non_scalar_loss_is_summed():
    v = K.variable([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_allclose(K.eval(K.gradients(v * v, [v])[0]), [[2, 4], [6, 8]])


def test_single_variable_returns_list_like_keras():
    v = K.variable([1.0, 2.0])
    g = K.gradients(K.sum(v), v)
    assert isinstance(g, list) and len(g) == 1


def test_float32_gradients_keep_dtype():
    v = K.variable(np.ones((2, 3)), dtype="float32")
    g = K.gradients(K.mean(K.square(v * 2.0)), [v])[0]
    assert g.dtype == "float32"
    np.testing.assert_allclose(K.eval(g), np.full((2, 3), 8 / 6.0), rtol=1e-6)


def test_gradient_through_int_cast_is_none():
    v = K.variable([1.5, 2.5])
    g = K.gradients(K.sum(K.cast(K.cast(v, "int32"), "float32") * 2), [v])[0]
    np.testing.assert_array_equal(K.eval(g), [0, 0])


def test_bad_gradient_arguments():
    v = K.variable([1.0])
    with pytest.raises(TypeError, match="gradients"):
        K.gradients(K.sum(v), [np.ones(1)])
    with pytest.raises(TypeError, match="float"):
        K.gradients(K.cast(v, "int32"), [v])


def test_gradient_of_cumulative_reverse_and_count_ratio_helpers():
    # Direct use of reduction helpers with keepdims and negative axes.
    x = _pos(2, 3)
    check_grads(lambda t: red.reduce(t, "mean", -1, True), x)
