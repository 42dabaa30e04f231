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
    G = 4 if cell == "lstm" else 1
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


@pytest.mark.parametrize("cell", ["lstm", "simple"])
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


def test_unrecognised_step_keeps_the_scan():
    args = ("lstm", "float64", 3, 4, 2, 5, False, False, False, "tanh", "sigmoid")
    _, ops = _build(*args, fused=True, extra=0.1)
    assert Scan in ops and FusedRecurrent not in ops


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


@pytest.mark.parametrize("cell", ["lstm", "simple"])
def test_fused_gradients_match_finite_differences(cell):
    rs = np.random.RandomState(7)
    u, n_in, T = 3, 2, 4
    G = 4 if cell == "lstm" else 1
    w, r = rs.randn(n_in, G * u) * 0.5, rs.randn(u, G * u) * 0.5
    bias = K.constant(np.zeros(G * u), dtype="float64")
    mask = K.constant(np.array([[1, 1, 0, 1], [1, 0, 1, 1]], bool))
    rmask = K.constant(rs.rand(2, u) * 2, dtype="float64")

    def build(x, h0, W, R):
        step = lstm_step(W, R, bias, u, rmask) if cell == "lstm" else \
            simple_step(W, R, bias, rmask)
        init = [h0, h0 * 0.5] if cell == "lstm" else [h0]
        _, outs, states = K.rnn(step, x, init, mask=mask)
        assert FusedRecurrent in _ops([outs])
        return K.concatenate([K.flatten(outs)] + [K.flatten(s) for s in states])
    gradcheck.check_grads(build, rs.randn(2, T, n_in), rs.randn(2, u), w, r,
                          rtol=1e-6, atol=1e-8)
