"""K.rnn against NumPy loops of Keras 2.3.1's SimpleRNN, GRU and LSTM cells:
masks, go_backwards, constants, nested states, unrolled vs looped (values and
gradients), symbolic batch and time sizes, hoisting of the input projection."""
import numpy as np
import pytest

import cyback as K
from cyback.graph.function import topo_nodes
from cyback.ops import elementwise as ew
from cyback.ops import scan_cells
from cyback.ops.linalg import TensorDot
from cyback.ops.scan import Scan

import gradcheck

tanh = getattr(K, "tanh", ew.tanh)
sigmoid = getattr(K, "sigmoid", ew.sigmoid)


def np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ----------------------------------------------------------------- cells

class Cell(object):
    """Weights as NumPy arrays plus a K step function and a NumPy step."""

    def __init__(self, kind, n_in, units, dtype, seed=0):
        rs = np.random.RandomState(seed)
        self.kind, self.units, self.dtype = kind, units, dtype
        gates = {"simple": 1, "gru": 3, "lstm": 4}[kind]
        self.w = (rs.randn(n_in, gates * units) * 0.5).astype(dtype)
        self.r = (rs.randn(units, gates * units) * 0.5).astype(dtype)
        self.b = (rs.randn(gates * units) * 0.1).astype(dtype)
        self.n_states = 2 if kind == "lstm" else 1

    def variables(self):
        return [K.variable(self.w, dtype=self.dtype), K.variable(self.r, dtype=self.dtype),
                K.variable(self.b, dtype=self.dtype)]

    def step(self, W, R, B):
        u = self.units

        def simple(x, states):
            h = tanh(K.dot(x, W) + B + K.dot(states[0], R))
            return h, [h]

        def gru(x, states):
            h = states[0]
            xz = K.dot(x, W) + B
            z = sigmoid(xz[:, :u] + K.dot(h, R[:, :u]))
            r = sigmoid(xz[:, u:2 * u] + K.dot(h, R[:, u:2 * u]))
            hh = tanh(xz[:, 2 * u:] + K.dot(r * h, R[:, 2 * u:]))
            h = z * h + (1 - z) * hh
            return h, [h]

        def lstm(x, states):
            h, c = states[0], states[1]
            z = K.dot(x, W) + K.dot(h, R) + B
            i = sigmoid(z[:, :u])
            f = sigmoid(z[:, u:2 * u])
            c = f * c + i * tanh(z[:, 2 * u:3 * u])
            o = sigmoid(z[:, 3 * u:])
            h = o * tanh(c)
            return h, [h, c]
        return {"simple": simple, "gru": gru, "lstm": lstm}[self.kind]

    def np_step(self, x, states):
        u, W, R, B = self.units, self.w, self.r, self.b
        if self.kind == "simple":
            h = np.tanh(x @ W + B + states[0] @ R)
            return h, [h]
        if self.kind == "gru":
            h = states[0]
            xz = x @ W + B
            z = np_sigmoid(xz[:, :u] + h @ R[:, :u])
            r = np_sigmoid(xz[:, u:2 * u] + h @ R[:, u:2 * u])
            hh = np.tanh(xz[:, 2 * u:] + (r * h) @ R[:, 2 * u:])
            h = z * h + (1 - z) * hh
            return h, [h]
        h, c = states
        z = x @ W + h @ R + B
        i, f, o = np_sigmoid(z[:, :u]), np_sigmoid(z[:, u:2 * u]), np_sigmoid(z[:, 3 * u:])
        c = f * c + i * np.tanh(z[:, 2 * u:3 * u])
        h = o * np.tanh(c)
        return h, [h, c]


def np_rnn(step, x, states, mask=None, go_backwards=False, zero_output_for_mask=False):
    """Reference loop over (B, T, ...) inputs, returning (last, outputs, states)."""
    x = np.asarray(x)
    T = x.shape[1]
    order = range(T - 1, -1, -1) if go_backwards else range(T)
    outs, prev = [], None
    for t in order:
        out, new = step(x[:, t], states)
        if mask is not None:
            m = mask[:, t].astype(bool)
            if prev is None:
                prev = np.zeros_like(out)
            keep = m.reshape((-1,) + (1,) * (out.ndim - 1))
            out = np.where(keep, out, 0 if zero_output_for_mask else prev)
            new = [np.where(m.reshape((-1,) + (1,) * (n.ndim - 1)), n, s)
                   for n, s in zip(new, states)]
        prev = out
        outs.append(out)
        states = new
    outputs = np.stack(outs, 1)
    return outputs[:, -1], outputs, states


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)


def _run_rnn(cell, xv, mask=None, batch_none=True, time_none=True, **kw):
    dtype = cell.dtype
    B, T, I = xv.shape  # noqa: E741  (batch, time, input: the names of the RNN equations)
    x = K.placeholder((None if batch_none else B, None if time_none else T, I), dtype=dtype)
    inits = [K.placeholder((None if batch_none else B, cell.units), dtype=dtype)
             for _ in range(cell.n_states)]
    W, R, Bv = cell.variables()
    m = None
    feeds = [x] + inits
    if mask is not None:
        m = K.placeholder((None if batch_none else B, None if time_none else T), dtype="bool")
        feeds.append(m)
    last, outs, states = K.rnn(cell.step(W, R, Bv), x, inits, mask=m, **kw)
    f = K.function(feeds, [last, outs] + list(states))
    rs = np.random.RandomState(5)
    s0 = [rs.randn(B, cell.units).astype(dtype) for _ in inits]
    vals = [xv] + s0 + ([mask] if mask is not None else [])
    return f(vals), s0, (last, outs, states)


def C(v):
    v = np.asarray(v)
    return K.constant(v, dtype=v.dtype.name)


@pytest.mark.parametrize("kind", ["simple", "gru", "lstm"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cells_match_numpy(kind, dtype):
    cell = Cell(kind, 3, 5, dtype)
    xv = np.random.RandomState(1).randn(4, 7, 3).astype(dtype)
    res, s0, (last, outs, states) = _run_rnn(cell, xv)
    ref_last, ref_outs, ref_states = np_rnn(cell.np_step, xv, s0)
    np.testing.assert_allclose(res[0], ref_last, **_tol(dtype))
    np.testing.assert_allclose(res[1], ref_outs, **_tol(dtype))
    for a, b in zip(res[2:], ref_states):
        np.testing.assert_allclose(a, b, **_tol(dtype))
    assert res[1].dtype == dtype and last.dtype == dtype
    assert K.int_shape(outs) == (None, None, 5)
    assert K.int_shape(last) == (None, 5)
    assert [K.int_shape(s) for s in states] == [(None, 5)] * cell.n_states


@pytest.mark.parametrize("kind", ["simple", "lstm"])
@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("zero_output_for_mask", [False, True])
def test_mask(kind, go_backwards, zero_output_for_mask):
    cell = Cell(kind, 2, 3, "float64")
    rs = np.random.RandomState(2)
    xv = rs.randn(5, 6, 2)
    mask = rs.rand(5, 6) > 0.4
    mask[0] = False          # a fully masked sequence keeps its initial states
    mask[1] = True
    mask[2, -1] = False      # the last step masked: last output repeats / is zero
    res, s0, _ = _run_rnn(cell, xv, mask=mask, go_backwards=go_backwards,
                          zero_output_for_mask=zero_output_for_mask)
    ref = np_rnn(cell.np_step, xv, s0, mask=mask, go_backwards=go_backwards,
                 zero_output_for_mask=zero_output_for_mask)
    np.testing.assert_allclose(res[0], ref[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res[1], ref[1], rtol=1e-10, atol=1e-12)
    for a, b in zip(res[2:], ref[2]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(res[2][0], s0[0][0])


def test_mask_shapes_and_dtypes():
    """(samples, time, 1) masks and float/int masks are accepted."""
    cell = Cell("simple", 2, 3, "float32")
    rs = np.random.RandomState(3)
    xv = rs.randn(3, 4, 2).astype("float32")
    mv = (rs.rand(3, 4) > 0.5)
    s0 = rs.randn(3, 3).astype("float32")
    ref = np_rnn(cell.np_step, xv, [s0], mask=mv)
    W, R, B = cell.variables()
    for m in [mv[:, :, None].astype("float32"), mv.astype("int32"), mv]:
        last, outs, states = K.rnn(cell.step(W, R, B), C(xv), [C(s0)],
                                   mask=K.constant(m))
        np.testing.assert_allclose(K.eval(outs), ref[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(K.eval(states[0]), ref[2][0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("unroll", [False, True])
def test_go_backwards_constants_time_major(unroll):
    rs = np.random.RandomState(4)
    xv = rs.randn(3, 5, 2)
    cv = rs.randn(3, 2)
    s0 = rs.randn(3, 2)

    def step(x, states):
        h, c = states[0], states[1]
        out = h * 0.5 + x * c
        return out, [out]

    def np_step(x, states):
        out = states[0] * 0.5 + x * cv
        return out, [out]
    ref = np_rnn(np_step, xv, [s0], go_backwards=True)
    last, outs, states = K.rnn(step, C(xv), [C(s0)], go_backwards=True,
                               constants=[C(cv)], unroll=unroll)
    np.testing.assert_allclose(K.eval(last), ref[0])
    np.testing.assert_allclose(K.eval(outs), ref[1])
    np.testing.assert_allclose(K.eval(states[0]), ref[2][0])
    # time_major: (T, B, ...) in and out
    last, outs, states = K.rnn(step, C(xv.transpose(1, 0, 2)), [C(s0)],
                               go_backwards=True, constants=[C(cv)], unroll=unroll,
                               time_major=True)
    np.testing.assert_allclose(K.eval(outs), ref[1].transpose(1, 0, 2))
    np.testing.assert_allclose(K.eval(last), ref[0])


def test_nested_states_and_rank4_inputs():
    """States nested as [h, (c, d)]; inputs with two feature axes."""
    rs = np.random.RandomState(6)
    xv = rs.randn(2, 4, 3, 2)
    h0, c0, d0 = rs.randn(2, 3, 2), rs.randn(2, 3), rs.randn(2)
    seen = []

    def step(x, states):
        seen.append(states)
        h, (c, d) = states
        h2 = h * 0.5 + x
        c2 = c + K.sum(x, axis=-1)
        d2 = d + K.sum(c2, axis=-1)
        return h2 * 2, [h2, (c2, d2)]

    last, outs, states = K.rnn(step, C(xv), [C(h0), (C(c0),
                                                                       C(d0))])
    assert isinstance(states, list) and isinstance(states[1], tuple)
    assert isinstance(seen[0][1], tuple)
    h, c, d = h0, c0, d0
    outs_ref = []
    for t in range(4):
        h = h * 0.5 + xv[:, t]
        c = c + xv[:, t].sum(-1)
        d = d + c.sum(-1)
        outs_ref.append(h * 2)
    np.testing.assert_allclose(K.eval(outs), np.stack(outs_ref, 1))
    np.testing.assert_allclose(K.eval(states[0]), h)
    np.testing.assert_allclose(K.eval(states[1][0]), c)
    np.testing.assert_allclose(K.eval(states[1][1]), d)
    assert K.int_shape(outs) == (2, 4, 3, 2)


def test_nested_inputs():
    """Inputs may be a list of tensors (tf.keras): the step gets a list of slices."""
    rs = np.random.RandomState(7)
    av, bv, s0 = rs.randn(2, 3, 4), rs.randn(2, 3, 1), rs.randn(2, 4)

    def step(x, states):
        a, b = x
        h = states[0] * b + a
        return h, [h]
    last, outs, states = K.rnn(step, [C(av), C(bv)], [C(s0)])
    h, ref = s0, []
    for t in range(3):
        h = h * bv[:, t] + av[:, t]
        ref.append(h)
    np.testing.assert_allclose(K.eval(outs), np.stack(ref, 1))
    np.testing.assert_allclose(K.eval(last), h)


@pytest.mark.parametrize("kind", ["simple", "gru", "lstm"])
def test_unroll_equivalence_values_and_gradients(kind):
    cell = Cell(kind, 3, 4, "float64", seed=8)
    rs = np.random.RandomState(9)
    xv = rs.randn(3, 5, 3)
    mv = rs.rand(3, 5) > 0.3
    s0 = [rs.randn(3, 4) for _ in range(cell.n_states)]
    W, R, B = cell.variables()
    x = K.placeholder((None, 5, 3), dtype="float64")
    inits = [K.placeholder((None, 4), dtype="float64") for _ in s0]
    m = K.placeholder((None, 5), dtype="bool")
    wout = C(rs.uniform(0.5, 1.5, (1, 5, 4)))
    results = []
    for unroll in (False, True):
        last, outs, states = K.rnn(cell.step(W, R, B), x, inits, mask=m, unroll=unroll)
        loss = K.sum(outs * wout) + K.sum(last * last) + sum(K.sum(s * 0.3) for s in states)
        grads = K.gradients(loss, [W, R, B, x] + inits)
        f = K.function([x, m] + inits, [loss, outs] + grads)
        results.append(f([xv, mv] + s0))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_gradients_finite_differences(kind):
    cell = Cell(kind, 2, 3, "float64", seed=10)
    rs = np.random.RandomState(11)
    xv = rs.randn(2, 4, 2)
    s0 = [rs.randn(2, 3) for _ in range(cell.n_states)]
    mv = K.constant(np.array([[1, 1, 0, 1], [1, 0, 1, 1]], bool))

    def build(x, w, r, *inits):
        last, outs, states = K.rnn(cell.step(w, r, C(cell.b)), x, list(inits), mask=mv,
                                   go_backwards=True)
        return K.concatenate([K.reshape(outs, (2, -1))] + list(states), axis=-1)
    gradcheck.check_grads(build, xv, cell.w, cell.r, *s0, rtol=1e-6, atol=1e-8)


def test_gradient_float32_matches_float64():
    cell32, cell64 = Cell("lstm", 3, 4, "float32", 12), Cell("lstm", 3, 4, "float64", 12)
    xv = np.random.RandomState(13).randn(2, 6, 3)
    out = []
    for cell in (cell32, cell64):
        W, R, B = cell.variables()
        x = K.placeholder((None, None, 3), dtype=cell.dtype)
        z = K.zeros_like(x[:, 0, :1]) * K.zeros((1, 4), dtype=cell.dtype)
        _, outs, _ = K.rnn(cell.step(W, R, B), x, [z, z])
        g = K.gradients(K.sum(outs * outs), [W, R, B, x])
        out.append(K.function([x], g)([xv.astype(cell.dtype)]))
    for a, b in zip(*out):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_input_projection_is_hoisted(monkeypatch):
    """x_t @ W (and the bias added to it) leave the loop: the step plan has one
    product only, h @ R."""
    # The general Scan's plan, not the fused LSTM cell's.
    monkeypatch.setattr(scan_cells, "ENABLED", False)
    cell = Cell("lstm", 3, 4, "float32")
    W, R, B = cell.variables()
    x = K.placeholder((None, None, 3))
    h0 = K.placeholder((None, 4))

    step = cell.step(W, R, B)
    _, outs, _ = K.rnn(step, x, [h0, h0])
    scans = [n.op for n in topo_nodes([outs]) if isinstance(n.op, Scan)]
    assert len(scans) == 1
    dots = [s for s in scans[0].steps if isinstance(s[0], TensorDot)]
    assert len(dots) == 1
    assert dots[0][1][1].shape == (4, 16)
    # and the outer graph computes x @ W for all steps in one product
    outer = [n for n in topo_nodes([outs]) if isinstance(n.op, TensorDot)]
    assert any(n.inputs[1] is W and n.inputs[0].ndim == 3 for n in outer)


def test_odd_sizes_and_noncontiguous_feed():
    cell = Cell("gru", 3, 2, "float32", 14)
    rs = np.random.RandomState(15)
    for B, T in [(1, 1), (1, 3), (4, 1)]:
        xv = rs.randn(B, T, 3).astype("float32")
        res, s0, _ = _run_rnn(cell, xv)
        ref = np_rnn(cell.np_step, xv, s0)
        np.testing.assert_allclose(res[1], ref[1], rtol=1e-5, atol=1e-6)
    # a transposed (non-contiguous) feed
    xv = np.asfortranarray(rs.randn(3, 4, 3).astype("float32"))
    res, s0, _ = _run_rnn(cell, xv)
    np.testing.assert_allclose(res[1], np_rnn(cell.np_step, xv, s0)[1], rtol=1e-5, atol=1e-6)
    # batch 0
    res, s0, _ = _run_rnn(cell, np.zeros((0, 4, 3), "float32"))
    assert res[1].shape == (0, 4, 2) and res[0].shape == (0, 2)


def test_static_shapes():
    cell = Cell("lstm", 3, 4, "float32")
    W, R, B = cell.variables()
    x = K.placeholder((None, 7, 3))
    h0 = K.placeholder((None, 4))
    for unroll in (False, True):
        last, outs, states = K.rnn(cell.step(W, R, B), x, [h0, h0], unroll=unroll)
        assert K.int_shape(outs) == (None, 7, 4)
        assert K.int_shape(last) == (None, 4)
        assert [K.int_shape(s) for s in states] == [(None, 4), (None, 4)]
        last, outs, states = K.rnn(cell.step(W, R, B), K.placeholder((7, None, 3)), [h0, h0],
                                   unroll=unroll, time_major=True)
        assert K.int_shape(outs) == (7, None, 4)


def test_no_states_and_input_length_ignored():
    xv = np.arange(12.0).reshape(2, 3, 2)

    def step(x, states):
        return x * 2, []
    last, outs, states = K.rnn(step, C(xv), [], input_length=3)
    np.testing.assert_allclose(K.eval(outs), xv * 2)
    np.testing.assert_allclose(K.eval(last), xv[:, -1] * 2)
    assert states == []


def test_learning_phase_inside_step():
    """A dropout-like in_train_phase inside the step follows the fed learning phase."""
    x = K.placeholder((None, 3, 2))
    h0 = K.placeholder((None, 2))

    def step(x_t, states):
        h = states[0] + K.in_train_phase(x_t * 10, x_t)
        return h, [h]
    last, outs, _ = K.rnn(step, x, [h0])
    f = K.function([x, h0, K.learning_phase()], [last])
    xv, hv = np.ones((1, 3, 2), "float32"), np.zeros((1, 2), "float32")
    np.testing.assert_allclose(f([xv, hv, 1])[0], 30)
    np.testing.assert_allclose(f([xv, hv, 0])[0], 3)


@pytest.mark.parametrize("unroll", [False, True])
@pytest.mark.parametrize("how", ["marked", "unmarked", "state_only"])
def test_outputs_say_the_step_uses_the_learning_phase(unroll, how):
    """Keras feeds the learning phase to a model only when its outputs carry
    ``_uses_learning_phase``: a step that reads it (dropout masks from
    in_train_phase) must mark every result of rnn, looped or unrolled, whether
    the step marked its output (Keras cells do), read the phase without marking
    (TF's rnn checks reachability) or only a state depends on it."""
    x = K.placeholder((None, 3, 2))
    h0 = K.placeholder((None, 2))

    def step(x_t, states):
        if how == "unmarked":
            scale = K.switch(K.learning_phase(), 10.0, 1.0)
            h = states[0] + x_t * K.cast(scale, "float32")
            return h, [h]
        noisy = K.in_train_phase(x_t * 10, x_t)
        h = states[0] + noisy
        if how == "state_only":
            return states[0] + x_t, [h]
        return h, [h]
    last, outs, states = K.rnn(step, x, [h0], unroll=unroll, input_length=3)
    for t in [last, outs] + list(states):
        assert t._uses_learning_phase
    f = K.function([x, h0, K.learning_phase()], [states[0]])
    xv, hv = np.ones((1, 3, 2), "float32"), np.zeros((1, 2), "float32")
    np.testing.assert_allclose(f([xv, hv, 1])[0], 30)
    np.testing.assert_allclose(f([xv, hv, 0])[0], 3)


def test_outputs_without_learning_phase_are_not_marked():
    x = K.placeholder((None, 3, 2))
    h0 = K.placeholder((None, 2))

    def step(x_t, states):
        h = states[0] + x_t
        return h, [h]
    last, outs, states = K.rnn(step, x, [h0])
    assert not any(t._uses_learning_phase for t in [last, outs] + list(states))


def test_bad_arguments():
    x = K.placeholder((None, None, 3))
    h0 = K.placeholder((None, 2))

    def step(x_t, states):
        return states[0], [states[0]]
    with pytest.raises(ValueError, match="rnn.*rank"):
        K.rnn(step, K.placeholder((None, 3)), [h0])
    with pytest.raises(ValueError, match="rnn.*unroll"):
        K.rnn(step, x, [h0], unroll=True)
    with pytest.raises(TypeError, match="rnn.*step_function"):
        K.rnn(None, x, [h0])
    with pytest.raises(ValueError, match="rnn.*mask"):
        K.rnn(step, x, [h0], mask=K.placeholder((None, None, 3, 4)))
    with pytest.raises(ValueError, match="rnn.*states"):
        K.rnn(lambda x_t, s: (x_t, [s[0], s[0]]), x, [h0])
    with pytest.raises(ValueError, match="rnn.*rank"):
        K.rnn(lambda x_t, s: (x_t, [K.sum(s[0])]), x, [h0])
    with pytest.raises(ValueError, match="rnn.*time"):
        K.rnn(step, [K.placeholder((None, 3, 1)), K.placeholder((None, 4, 1))], [h0])


@pytest.mark.parametrize("zero_output_for_mask", [False, True])
def test_unrolled_mask_go_backwards_matches_reference(zero_output_for_mask):
    cell = Cell("lstm", 2, 3, "float64", seed=16)
    rs = np.random.RandomState(17)
    xv, mv = rs.randn(3, 4, 2), rs.rand(3, 4) > 0.5
    mv[:, -1] = False
    s0 = [rs.randn(3, 3), rs.randn(3, 3)]
    W, R, B = cell.variables()
    for unroll in (False, True):
        last, outs, states = K.rnn(cell.step(W, R, B), C(xv), [C(s) for s in s0],
                                   mask=K.constant(mv), go_backwards=True, unroll=unroll,
                                   zero_output_for_mask=zero_output_for_mask)
        ref = np_rnn(cell.np_step, xv, s0, mask=mv, go_backwards=True,
                     zero_output_for_mask=zero_output_for_mask)
        np.testing.assert_allclose(K.eval(last), ref[0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(K.eval(outs), ref[1], rtol=1e-10, atol=1e-12)
        for a, b in zip(states, ref[2]):
            np.testing.assert_allclose(K.eval(a), b, rtol=1e-10, atol=1e-12)


def test_gru_projection_slices_are_hoisted(monkeypatch):
    """Slices of the hoisted projection (x_t @ W + b)[:, :u] leave the loop too,
    and slices of the recurrent kernel are loop invariants."""
    # The general Scan's plan, not the fused GRU cell's.
    monkeypatch.setattr(scan_cells, "ENABLED", False)
    cell = Cell("gru", 3, 4, "float32")
    W, R, B = cell.variables()
    _, outs, _ = K.rnn(cell.step(W, R, B), K.placeholder((None, None, 3)),
                       [K.placeholder((None, 4))])
    (scan,) = [n.op for n in topo_nodes([outs]) if isinstance(n.op, Scan)]
    names = [type(s[0]).__name__ for s in scan.steps]
    assert names.count("TensorDot") == 3 and "GetItem" not in names
