"""K.rnn with standard cells: the fused recurrent op against the general Scan,
NumPy reference loops and finite differences."""
import numpy as np
import pytest

import cyback as K
from cyback.graph.function import topo_nodes
from cyback.ops import scan_cells
from cyback.ops.rnn_cell import FusedRecurrent
from cyback.ops.scan import Scan

import gradcheck

SIG = {"sigmoid": K.sigmoid, "hard_sigmoid": K.hard_sigmoid, "tanh": K.tanh}


def lstm_step(W, R, b, u, rmask=None, act="tanh", ract="sigmoid", extra=None):
    """Keras 2.3's LSTMCell step (implementation 2), written out."""
    f_act, f_ract = SIG[act], SIG[ract]

    def step(x, states):
        h, c = states[0], states[1]
        hm = h * rmask if rmask is not None else h
        z = K.dot(x, W) + K.dot(hm, R)
        z = K.bias_add(z, b)
        i = f_ract(z[:, :u])
        f = f_ract(z[:, u:2 * u])
        c = f * c + i * f_act(z[:, 2 * u:3 * u])
        o = f_ract(z[:, 3 * u:])
        h = o * f_act(c)
        if extra is not None:
            h = h + extra
        return h, [h, c]
    return step


def lstm_impl1_step(W, R, b, u, rmask=None, act="tanh", ract="sigmoid"):
    """Keras 2.2's default LSTMCell step (implementation 1): one product per
    gate, on slices of the kernels."""
    f_act, f_ract = SIG[act], SIG[ract]

    def step(x, states):
        h, c = states[0], states[1]
        hm = h * rmask if rmask is not None else h
        pre = [K.bias_add(K.dot(x, W[:, k * u:(k + 1) * u]), b[k * u:(k + 1) * u]) +
               K.dot(hm, R[:, k * u:(k + 1) * u]) for k in range(4)]
        c = f_ract(pre[1]) * c + f_ract(pre[0]) * f_act(pre[2])
        h = f_ract(pre[3]) * f_act(c)
        return h, [h, c]
    return step


def gru_step(W, R, b, u, rmask=None, act="tanh", ract="sigmoid", reset_after=False, rb=None,
             extra=None):
    """Keras 2.3's GRUCell step (implementation 2), written out; with
    ``reset_after``, ``rb`` is the recurrent bias."""
    f_act, f_ract = SIG[act], SIG[ract]

    def step(x, states):
        h = states[0]
        if rmask is not None:
            h = h * rmask       # Keras mixes the dropped-out h too
        xz = K.bias_add(K.dot(x, W), b)
        if reset_after:
            inner = K.dot(h, R)
            if rb is not None:
                inner = K.bias_add(inner, rb)
        else:
            inner = K.dot(h, R[:, :2 * u])
        z = f_ract(xz[:, :u] + inner[:, :u])
        r = f_ract(xz[:, u:2 * u] + inner[:, u:2 * u])
        if reset_after:
            rec_h = r * inner[:, 2 * u:]
        else:
            rec_h = K.dot(r * h, R[:, 2 * u:])
        hh = f_act(xz[:, 2 * u:] + rec_h)
        out = z * h + (1 - z) * hh
        if extra is not None:
            out = out + extra * hh
        return out, [out]
    return step


def simple_step(W, R, b, rmask=None, act="tanh"):
    def step(x, states):
        h = states[0] * rmask if rmask is not None else states[0]
        out = SIG[act](K.bias_add(K.dot(x, W), b) + K.dot(h, R))
        return out, [out]
    return step


def _ops(tensors):
    return [type(n.op) for n in topo_nodes(tensors)]


def _build(cell, dtype, n_in, u, B, T, mask, go_backwards, rdrop, act, ract, fused, extra=None,
           seed=0):
    rs = np.random.RandomState(seed)
    G = {"lstm": 4, "lstm_impl1": 4, "simple": 1}.get(cell, 3)
    W = K.variable(rs.randn(n_in, G * u) * 0.5, dtype=dtype)
    R = K.variable(rs.randn(u, G * u) * 0.5, dtype=dtype)
    b = K.variable(rs.randn(G * u) * 0.1, dtype=dtype)
    rm = K.constant((rs.rand(B, u) > 0.4) / 0.6, dtype=dtype) if rdrop else None
    x = K.placeholder((None, T, n_in), dtype=dtype)
    h0 = K.placeholder((None, u), dtype=dtype)
    m = K.placeholder((None, T), dtype="bool") if mask else None
    if cell == "lstm":
        step = lstm_step(W, R, b, u, rm, act, ract, extra)
        init = [h0, h0 * 0.5]
    elif cell == "lstm_impl1":
        step = lstm_impl1_step(W, R, b, u, rm, act, ract)
        init = [h0, h0 * 0.5]
    elif cell.startswith("gru"):
        rb = K.variable(rs.randn(G * u) * 0.1, dtype=dtype) if cell == "gru_ra" else None
        step = gru_step(W, R, b, u, rm, act, ract, reset_after=cell == "gru_ra", rb=rb,
                        extra=extra)
        init = [h0]
    else:
        step = simple_step(W, R, b, rm, act)
        init = [h0]
    scan_cells.ENABLED = fused
    try:
        last, outs, states = K.rnn(step, x, init, mask=m, go_backwards=go_backwards)
    finally:
        scan_cells.ENABLED = True
    loss = K.sum(outs * K.constant(rs.rand(B, T, u), dtype=dtype)) + K.sum(states[-1] * 2) + \
        K.sum(last)
    ins = [x, h0] + ([m] if mask else [])
    grads = K.gradients(loss, [W, R, b, x, h0])
    f = K.function(ins, [last, outs] + list(states) + grads)
    xv = rs.randn(B, T, n_in).astype(dtype)
    hv = rs.randn(B, u).astype(dtype)
    feed = [xv, hv] + ([rs.rand(B, T) > 0.3] if mask else [])
    return f(feed), _ops([outs] + list(states) + grads)


CONFIGS = [dict(mask=False, go_backwards=False, rdrop=False),
           dict(mask=True, go_backwards=False, rdrop=False),
           dict(mask=True, go_backwards=True, rdrop=True),
           dict(mask=False, go_backwards=True, rdrop=True)]


@pytest.mark.parametrize("cell", ["lstm", "simple", "gru", "gru_ra", "lstm_impl1"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_fused_matches_general_scan(cell, dtype, cfg):
    args = (cell, dtype, 3, 5, 4, 6, cfg["mask"], cfg["go_backwards"], cfg["rdrop"],
            "tanh", "sigmoid")
    fused, ops_f = _build(*args, fused=True)
    general, ops_g = _build(*args, fused=False)
    assert FusedRecurrent in ops_f and Scan not in ops_f
    assert Scan in ops_g and FusedRecurrent not in ops_g
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == "float32" else dict(rtol=1e-9, atol=1e-10)
    for a, b in zip(fused, general):
        np.testing.assert_allclose(a, b, **tol)


@pytest.mark.parametrize("act,ract", [("tanh", "hard_sigmoid"), ("sigmoid", "tanh")])
def test_other_activations_fall_back_or_match(act, ract):
    args = ("lstm", "float64", 3, 4, 2, 5, True, False, False, act, ract)
    fused, _ = _build(*args, fused=True)
    general, _ = _build(*args, fused=False)
    for a, b in zip(fused, general):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_unrecognised_step_keeps_the_scan(cell):
    args = (cell, "float64", 3, 4, 2, 5, False, False, False, "tanh", "sigmoid")
    fused, ops = _build(*args, fused=True, extra=0.1)
    assert Scan in ops and FusedRecurrent not in ops
    general, _ = _build(*args, fused=False, extra=0.1)
    for a, b in zip(fused, general):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_values_match_numpy_loop():
    rs = np.random.RandomState(5)
    n_in, u, B, T = 3, 4, 2, 6
    w, r, bias = rs.randn(n_in, 4 * u) * 0.5, rs.randn(u, 4 * u) * 0.5, rs.randn(4 * u) * 0.1
    W, R, b = [K.variable(v, dtype="float64") for v in (w, r, bias)]
    x = K.placeholder((None, T, n_in), dtype="float64")
    h0 = K.placeholder((None, u), dtype="float64")
    _, outs, _ = K.rnn(lstm_step(W, R, b, u), x, [h0, h0], go_backwards=True)
    assert FusedRecurrent in _ops([outs])
    xv, hv = rs.randn(B, T, n_in), rs.randn(B, u)
    got = K.function([x, h0], [outs])([xv, hv])[0]
    sig = lambda v: 1 / (1 + np.exp(-v))   # noqa: E731
    h, c, ref = hv, hv, []
    for t in range(T - 1, -1, -1):
        z = xv[:, t] @ w + h @ r + bias
        c = sig(z[:, u:2 * u]) * c + sig(z[:, :u]) * np.tanh(z[:, 2 * u:3 * u])
        h = sig(z[:, 3 * u:]) * np.tanh(c)
        ref.append(h)
    np.testing.assert_allclose(got, np.stack(ref, 1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cell", ["lstm", "simple", "gru", "gru_ra"])
def test_fused_gradients_match_finite_differences(cell):
    rs = np.random.RandomState(7)
    u, n_in, T = 3, 2, 4
    G = {"lstm": 4, "simple": 1}.get(cell, 3)
    w, r = rs.randn(n_in, G * u) * 0.5, rs.randn(u, G * u) * 0.5
    bias = K.constant(np.zeros(G * u), dtype="float64")
    mask = K.constant(np.array([[1, 1, 0, 1], [1, 0, 1, 1]], bool))
    rmask = K.constant(rs.rand(2, u) * 2, dtype="float64")

    def build(x, h0, W, R):
        if cell == "lstm":
            step = lstm_step(W, R, bias, u, rmask)
        elif cell.startswith("gru"):
            step = gru_step(W, R, bias, u, rmask, reset_after=cell == "gru_ra",
                            rb=bias if cell == "gru_ra" else None)
        else:
            step = simple_step(W, R, bias, rmask)
        init = [h0, h0 * 0.5] if cell == "lstm" else [h0]
        _, outs, states = K.rnn(step, x, init, mask=mask)
        assert FusedRecurrent in _ops([outs])
        return K.concatenate([K.flatten(outs)] + [K.flatten(s) for s in states])
    gradcheck.check_grads(build, rs.randn(2, T, n_in), rs.randn(2, u), w, r,
                          rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("cell", ["lstm", "gru", "simple"])
def test_inference_plans_record_nothing(cell, monkeypatch):
    # A function without gradients runs the kernel without its records (the
    # states in a ring of two steps); one with gradients records every step.
    from cyback.ops import rnn_cell
    kernel = {"lstm": "lstm_forward", "gru": "gru_forward", "simple": "simple_forward"}[cell]
    seen = []
    real = getattr(rnn_cell._k, kernel)

    def spy(*args, **kw):
        seen.append(kw.get("keep", True))
        return real(*args, **kw)
    monkeypatch.setattr(rnn_cell._k, kernel, spy)
    rs = np.random.RandomState(3)
    u, n_in, T, B = 4, 3, 5, 2
    G = {"lstm": 4, "simple": 1}.get(cell, 3)
    W, R, b = [K.variable(rs.randn(*s) * 0.5) for s in ((n_in, G * u), (u, G * u), (G * u,))]
    step = {"lstm": lambda: lstm_step(W, R, b, u), "gru": lambda: gru_step(W, R, b, u),
            "simple": lambda: simple_step(W, R, b)}[cell]()
    x = K.placeholder((None, T, n_in))
    h0 = K.placeholder((None, u))
    init = [h0, h0] if cell == "lstm" else [h0]
    last, outs, states = K.rnn(step, x, init)
    assert FusedRecurrent in _ops([outs])
    xv, hv = rs.randn(B, T, n_in).astype("float32"), rs.randn(B, u).astype("float32")
    infer = K.function([x, h0], [last, outs] + list(states))([xv, hv])
    assert seen == [False]
    loss = K.sum(outs) + K.sum(states[0])
    train = K.function([x, h0], [last, outs] + list(states) + K.gradients(loss, [W, R]))(
        [xv, hv])
    assert seen == [False, True]
    for a, b_ in zip(infer, train):
        np.testing.assert_array_equal(a, b_)
