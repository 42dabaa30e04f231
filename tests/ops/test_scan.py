"""The Scan machinery through map_fn, foldl and foldr: values against Python
loops, gradients against finite differences, invariants, int dtypes, empty
sequences, symbolic lengths, and the loop's structure (lifting, hoisting)."""
import numpy as np
import pytest

import cyback as K
from cyback.graph.function import topo_nodes
from cyback.ops import scan_cells
from cyback.ops.scan import Scan, build_scan

import gradcheck


def C(v):
    v = np.asarray(v)
    return K.constant(v, dtype=v.dtype.name)


def _scans(t):
    return [n.op for n in topo_nodes([t]) if isinstance(n.op, Scan)]


# ----------------------------------------------------------------- map_fn

@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_map_fn_values(dtype):
    xv = np.random.RandomState(0).randn(5, 3, 2).astype(dtype)
    x = K.placeholder((None, 3, 2), dtype=dtype)
    out = K.map_fn(lambda r: K.sum(r * r, axis=0) + K.max(r), x)
    assert K.int_shape(out) == (None, 2)
    got = K.function([x], [out])([xv])[0]
    ref = np.stack([(r * r).sum(0) + r.max() for r in xv])
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    assert got.dtype == dtype


def test_map_fn_seed_style_and_dtype():
    x = K.variable(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    out = K.map_fn(lambda r: r[0] > 2, x, dtype="int32", name="gt")
    np.testing.assert_array_equal(K.eval(out), [0, 1, 1])
    assert K.dtype(out) == "int32"
    sq = K.map_fn(lambda r: r * r, C(np.arange(6.0).reshape(3, 2)))
    np.testing.assert_allclose(K.eval(sq), np.arange(6.0).reshape(3, 2) ** 2)


def test_map_fn_empty_and_single():
    x = K.placeholder((None, 2))
    out = K.map_fn(lambda r: r * 2 + 1, x)
    f = K.function([x], [out])
    assert f([np.zeros((0, 2), "float32")])[0].shape == (0, 2)
    np.testing.assert_allclose(f([np.ones((1, 2), "float32")])[0], [[3, 3]])


def test_map_fn_noncontiguous():
    xv = np.random.RandomState(1).randn(4, 6).astype("float32")[:, ::2]
    x = K.placeholder((None, 3))
    f = K.function([x], [K.map_fn(lambda r: K.exp(r) * r, x)])
    np.testing.assert_allclose(f([xv])[0], np.exp(xv) * xv, rtol=1e-6)


def test_map_fn_gradient():
    rs = np.random.RandomState(2)
    wv = rs.randn(3, 2)

    def build(x, w):
        return K.map_fn(lambda r: K.tanh(K.dot(K.reshape(r, (1, 3)), w)) * r[0], x)
    gradcheck.check_grads(build, rs.randn(4, 3), wv)


def test_map_fn_closure_over_placeholder_and_variable():
    """Tensors from outside the step (a placeholder, a variable) are invariants."""
    v = K.variable(np.array([1.0, 2.0]))
    p = K.placeholder((2,))
    x = K.placeholder((None, 2))
    out = K.map_fn(lambda r: r * v + p, x)
    # r * v + p applies to all rows at once: the whole step leaves the loop
    (scan,) = _scans(out)
    assert not scan.steps
    f = K.function([x, p], [out])
    got = f([np.ones((3, 2), "float32"), np.array([10.0, 20.0], "float32")])[0]
    np.testing.assert_allclose(got, [[11, 22]] * 3)
    g = K.gradients(K.sum(out * out), [v, p])
    gv, gp = K.function([x, p], g)([np.ones((3, 2), "float32"),
                                    np.array([10.0, 20.0], "float32")])
    np.testing.assert_allclose(gv, 2 * 3 * np.array([11, 22]))
    np.testing.assert_allclose(gp, 2 * 3 * np.array([11, 22]))


# ---------------------------------------------------------------- folds

@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_foldl_foldr_values(dtype):
    xv = (np.random.RandomState(3).randn(6, 2) * 3).astype(dtype)
    x = K.placeholder((None, 2), dtype=dtype)
    fl = K.foldl(lambda acc, r: acc * 2 - r, x)
    fr = K.foldr(lambda acc, r: acc * 2 - r, x)
    fi = K.foldl(lambda acc, r: acc + K.sum(r), x, initializer=K.zeros((), dtype=dtype))
    f = K.function([x], [fl, fr, fi])
    got = f([xv])
    acc = xv[0]
    for r in xv[1:]:
        acc = acc * 2 - r
    np.testing.assert_allclose(got[0], acc, rtol=1e-6)
    acc = xv[-1]
    for r in xv[-2::-1]:
        acc = acc * 2 - r
    np.testing.assert_allclose(got[1], acc, rtol=1e-6)
    np.testing.assert_allclose(got[2], xv.sum(), rtol=1e-5)
    assert got[0].dtype == dtype and K.int_shape(fl) == (2,)


def test_fold_seed_examples():
    """Keras docs: foldl(lambda acc, x: acc + x, elems) sums; foldr starts at elems[-1]."""
    x = K.variable(np.array([1.0, 2.0, 3.0, 4.0]))
    assert float(K.eval(K.foldl(lambda a, b: a + b, x))) == 10.0
    assert float(K.eval(K.foldr(lambda a, b: a * 10 + b, x))) == 4321.0
    assert float(K.eval(K.foldl(lambda a, b: a * 10 + b, x))) == 1234.0
    assert float(K.eval(K.foldl(lambda a, b: a + b, x, initializer=100.0))) == 110.0
    # a single element with no initializer is its own result
    assert float(K.eval(K.foldr(lambda a, b: a + b, C(np.array([7.0]))))) == 7.0


def test_fold_accumulator_of_other_shape():
    xv = np.arange(12.0).reshape(4, 3)
    acc = K.foldl(lambda a, r: K.concatenate([a[1:], K.reshape(K.sum(r), (1,))]), C(xv),
                  initializer=C(np.zeros(2)))
    np.testing.assert_allclose(K.eval(acc), xv.sum(1)[-2:])


def test_fold_gradients():
    rs = np.random.RandomState(4)
    gradcheck.check_grads(lambda x: K.foldl(lambda a, r: a * r + K.sin(a), x), rs.randn(5, 3))
    gradcheck.check_grads(lambda x, i: K.foldr(lambda a, r: a * r + r, x, initializer=i),
                          rs.randn(4, 2), rs.randn(2))


def test_fold_symbolic_length_and_empty():
    x = K.placeholder((None, 2))
    s = K.foldl(lambda a, r: a + r, x, initializer=K.zeros((2,)))
    f = K.function([x], [s])
    np.testing.assert_allclose(f([np.ones((3, 2), "float32")])[0], [3, 3])
    np.testing.assert_allclose(f([np.ones((0, 2), "float32")])[0], [0, 0])


def test_bad_arguments():
    with pytest.raises(TypeError, match="map_fn.*callable"):
        K.map_fn(3, K.zeros((2,)))
    with pytest.raises(ValueError, match="map_fn.*rank"):
        K.map_fn(lambda r: r, K.variable(1.0))
    with pytest.raises(TypeError, match="foldl.*callable"):
        K.foldl(None, K.zeros((2,)))
    with pytest.raises(ValueError, match="foldr.*empty"):
        K.foldr(lambda a, b: a + b, K.zeros((0, 2)))
    with pytest.raises(ValueError, match="foldl.*rank"):
        K.foldl(lambda a, r: K.sum(a), K.zeros((3, 2)))
    with pytest.raises(ValueError, match="foldl.*shape"):
        K.foldl(lambda a, r: K.concatenate([a, r]), K.zeros((3, 2)))


# --------------------------------------------------------- build_scan internals

def test_invariants_lifted_and_projection_hoisted():
    """Work that does not depend on the step's placeholders runs once outside
    the loop; element-wise work on sequence slices runs on whole sequences."""
    w = K.variable(np.ones((3, 3)))
    x = K.placeholder((None, None, 3))
    h0 = K.placeholder((None, 3))

    def step(slices, states):
        xt = slices[0]
        proj = K.exp(K.dot(xt, w) * 2.0)          # hoisted: one product over all steps
        inv = K.exp(w) + 1.0                       # lifted out of the loop
        h = K.dot(states[0] * 0.5, inv) + proj     # stays in the loop
        return [h], [h]
    (outs,), (final,) = build_scan(step, [x], [h0])
    (scan,) = _scans(outs)
    ops = [type(s[0]).__name__ for s in scan.steps]
    assert ops.count("TensorDot") == 1
    assert not any(getattr(s[0], "name", None) == "exp" for s in scan.steps)
    xv = np.random.RandomState(5).randn(4, 2, 3).astype("float32") * 0.1
    hv = np.zeros((2, 3), "float32")
    got = K.function([x, h0], [outs, final])([xv, hv])
    h, ref = hv, []
    for t in range(4):
        h = (h * 0.5) @ (np.exp(np.ones((3, 3))) + 1) + np.exp(xv[t] @ np.ones((3, 3)) * 2)
        ref.append(h)
    np.testing.assert_allclose(got[0], np.stack(ref), rtol=1e-5)
    np.testing.assert_allclose(got[1], h, rtol=1e-5)


def test_scan_state_outputs_and_unused_sequences():
    x = K.placeholder((None, 2))
    y = K.placeholder((None, 2))

    def step(slices, states):
        return [states[0] + 0.0], [states[0] + slices[0]]
    (outs,), (final,) = build_scan(step, [x, y], [K.zeros((2,))])
    f = K.function([x, y], [outs, final])
    xv = np.arange(6.0, dtype="float32").reshape(3, 2)
    got = f([xv, np.zeros((3, 2), "float32")])
    np.testing.assert_allclose(got[0], np.cumsum(xv, 0) - xv)
    np.testing.assert_allclose(got[1], xv.sum(0))
    with pytest.raises(ValueError, match="length"):
        f([xv, np.zeros((4, 2), "float32")])


def test_second_function_reuses_scan():
    """One Scan op serves a forward-only function and a training function."""
    w = K.variable(np.array([0.5, -0.5]))
    x = K.placeholder((None, 2))
    acc = K.foldl(lambda a, r: a * w + r, x, initializer=K.zeros((2,)))
    f = K.function([x], [acc])
    xv = np.ones((3, 2), "float32")
    v1 = f([xv])[0]
    g = K.function([x], K.gradients(K.sum(acc), [w]))([xv])[0]
    np.testing.assert_allclose(f([xv])[0], v1)
    # acc = ((r)*w + r)*w + r = w^2 + w + 1 (per component) -> d/dw = 2w + 1
    np.testing.assert_allclose(g, 2 * np.array([0.5, -0.5]) + 1)


def test_second_derivative_reports_clearly():
    w = K.variable(np.array([0.5, -0.5]))
    x = K.placeholder((None, 2))
    acc = K.foldl(lambda a, r: a * w + r, x, initializer=K.zeros((2,)))
    g = K.gradients(K.sum(acc), [w])[0]
    with pytest.raises(NotImplementedError, match="second derivatives"):
        K.gradients(K.sum(g), [w])


def test_nested_loops_and_gradient():
    """A fold inside a map: the inner Scan runs in the outer loop's body and
    its gradient inside the outer backward loop."""
    w = K.variable(np.array([0.5, 1.5]), dtype="float64")
    xv = np.random.RandomState(7).randn(3, 4, 2)

    def ref(wv):
        out = []
        for m in xv:
            a = m[0]
            for r in m[1:]:
                a = a * wv + np.sin(r)
            out.append(a)
        return np.array(out)
    x = K.placeholder((None, 4, 2), dtype="float64")
    y = K.map_fn(lambda m: K.foldl(lambda a, r: a * w + K.sin(r), m), x)
    got, gw = K.function([x], [y] + K.gradients(K.sum(y * y), [w]))([xv])
    np.testing.assert_allclose(got, ref(np.array([0.5, 1.5])))
    num = gradcheck.numeric_grad(lambda wv: float((ref(wv) ** 2).sum()), np.array([0.5, 1.5]))
    np.testing.assert_allclose(gw, num, rtol=1e-6)


def test_map_fn_several_outputs():
    xv = np.arange(6.0).reshape(3, 2)
    a, (b, c) = K.map_fn(lambda r: (r * 2, [K.sum(r), r[0] > 1]), C(xv),
                         dtype=("float64", ("float64", "int32")))
    np.testing.assert_allclose(K.eval(a), xv * 2)
    np.testing.assert_allclose(K.eval(b), xv.sum(1))
    np.testing.assert_array_equal(K.eval(c), [0, 1, 1])
    assert K.dtype(c) == "int32"


def test_forward_plans_skip_the_gradient_records(monkeypatch):
    monkeypatch.setattr(scan_cells, "ENABLED", False)   # a general Scan
    # Building a gradient must not make inference record residuals: only a
    # plan that reads them (through ScanGrad) runs the recording loop.
    x = K.placeholder((None, 4, 3))
    w = K.variable(np.random.RandomState(0).randn(3, 3) * 0.5)

    def step(x_t, states):
        h = K.tanh(K.dot(x_t, w) + K.dot(states[0], w))
        return h, [h]

    h0 = K.zeros_like(x[:, 0, :])
    _, outputs, _ = K.rnn(step, x, [h0])
    scan = next(n.op for n in topo_nodes([outputs]) if isinstance(n.op, Scan))
    grad, = K.gradients(K.sum(outputs), [w])
    xv = np.random.RandomState(1).randn(2, 4, 3).astype("float32")
    predict = K.function([x], [outputs])
    predict([xv])
    assert scan._loop_rec is None
    K.function([x], [grad])([xv])
    assert scan._loop_rec is not None
