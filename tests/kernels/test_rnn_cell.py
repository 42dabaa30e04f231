"""The fused recurrent cell kernels against NumPy reference loops and finite
differences."""
import numpy as np
import pytest

from cyback.kernels import rnn_cell as rc

from instruction_sets import instruction_set

ACTS = {
    "tanh": np.tanh,
    "sigmoid": lambda v: 0.5 + 0.5 * np.tanh(0.5 * v),
    "hard_sigmoid": lambda v: np.clip(0.2 * v + 0.5, 0, 1),
    "linear": lambda v: v,
}


def lstm_ref(zx, h0, c0, y0, R, rmask, mask, act, ract):
    """Keras's LSTMCell (gates i, f, c, o) with rnn's masking."""
    f_act, f_ract = ACTS[act], ACTS[ract]
    u = R.shape[0]
    h, c, y = h0, c0, y0
    ys = []
    for t in range(zx.shape[0]):
        hm = h * rmask if rmask is not None else h
        z = zx[t] + hm @ R
        i, f = f_ract(z[:, :u]), f_ract(z[:, u:2 * u])
        g, o = f_act(z[:, 2 * u:3 * u]), f_ract(z[:, 3 * u:])
        cn = f * c + i * g
        hn = o * f_act(cn)
        keep = mask[t][:, None] if mask is not None else np.ones((len(h), 1), bool)
        h, c, y = np.where(keep, hn, h), np.where(keep, cn, c), np.where(keep, hn, y)
        ys.append(y)
    return np.array(ys).reshape(zx.shape[:2] + (u,)), h, c, y


def simple_ref(zx, h0, y0, R, rmask, mask, act):
    f_act = ACTS[act]
    h, y = h0, y0
    ys = []
    for t in range(zx.shape[0]):
        hm = h * rmask if rmask is not None else h
        hn = f_act(zx[t] + hm @ R)
        keep = mask[t][:, None] if mask is not None else np.ones((len(h), 1), bool)
        h, y = np.where(keep, hn, h), np.where(keep, hn, y)
        ys.append(y)
    return np.array(ys).reshape(zx.shape[:2] + (R.shape[0],)), h, y


def _f64(a):
    return None if a is None else a.astype(np.float64)


def _case(T, B, u, G, dtype, with_rmask, with_mask, seed=0):
    rs = np.random.RandomState(seed)
    zx = rs.randn(T, B, G * u).astype(dtype)
    R = (rs.randn(u, G * u) * 0.4).astype(dtype)
    h0, c0, y0 = [rs.randn(B, u).astype(dtype) for _ in range(3)]
    rmask = (rs.rand(B, u) > 0.3).astype(dtype) / 0.7 if with_rmask else None
    mask = rs.rand(T, B) > 0.3 if with_mask else None
    return zx, h0, c0, y0, R, rmask, mask


CASES = [(5, 3, 4, False, False), (5, 3, 4, True, True), (1, 1, 1, False, True),
         (4, 2, 7, True, False), (0, 3, 4, False, False), (3, 0, 4, True, True),
         # batch > GEMV_ROWS: a product per step; pixel tiles and channel
         # blocks with remainders
         (3, 9, 5, True, True), (3, 13, 20, True, True), (2, 40, 17, False, True)]


@pytest.fixture(autouse=True, params=["avx512", "avx2", "baseline"])
def isa(request):
    """The AVX-512 recurrent product, the AVX2 + FMA kernels (where the CPU has
    them) and the baseline ones."""
    with instruction_set(rc, request.param) as which:
        yield which


@pytest.fixture(autouse=True, params=["packed", "blas"])
def recurrent_product(request):
    """Batches above GEMV_ROWS multiply by R packed once per sequence (the
    default) or through BLAS: every test runs both."""
    old = dict(rc._TUNE)
    rc._TUNE["packed"] = request.param == "packed"
    try:
        yield request.param
    finally:
        rc._TUNE.update(old)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("T,B,u,with_rmask,with_mask", CASES)
@pytest.mark.parametrize("act,ract", [("tanh", "sigmoid"), ("tanh", "hard_sigmoid"),
                                      ("sigmoid", "tanh")])
def test_lstm_forward_matches_reference(dtype, T, B, u, with_rmask, with_mask, act, ract):
    zx, h0, c0, y0, R, rmask, mask = _case(T, B, u, 4, dtype, with_rmask, with_mask)
    hs, cs, ys, gates = rc.lstm_forward(zx, h0, c0, y0, R, rmask, mask,
                                        rc.ACTIVATIONS[act], rc.ACTIVATIONS[ract])
    ref_ys, ref_h, ref_c, _ = lstm_ref(*map(_f64, (zx, h0, c0, y0, R, rmask)), mask, act, ract)
    tol = dict(rtol=1e-5, atol=2e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    assert ys.dtype == dtype and ys.shape == (T, B, u)
    np.testing.assert_allclose(ys, ref_ys, **tol)
    if T:
        np.testing.assert_allclose(hs[-1], ref_h, **tol)
        np.testing.assert_allclose(cs[-1], ref_c, **tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("T,B,u,with_rmask,with_mask", CASES)
@pytest.mark.parametrize("act", ["tanh", "sigmoid", "linear"])
def test_simple_forward_matches_reference(dtype, T, B, u, with_rmask, with_mask, act):
    zx, h0, _, y0, R, rmask, mask = _case(T, B, u, 1, dtype, with_rmask, with_mask)
    hs, ys, _ = rc.simple_forward(zx, h0, y0, R, rmask, mask, rc.ACTIVATIONS[act])
    ref_ys, ref_h, _ = simple_ref(zx.astype(np.float64), h0.astype(np.float64),
                                  y0.astype(np.float64), R.astype(np.float64),
                                  None if rmask is None else rmask.astype(np.float64), mask, act)
    tol = dict(rtol=1e-5, atol=2e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ys, ref_ys, **tol)
    if T:
        np.testing.assert_allclose(hs[-1], ref_h, **tol)


def _numeric(loss, arrays, eps=1e-6):
    out = []
    for a in arrays:
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + eps
            hi = loss()
            a[idx] = old - eps
            lo = loss()
            a[idx] = old
            g[idx] = (hi - lo) / (2 * eps)
        out.append(g)
    return out


@pytest.mark.parametrize("with_rmask,with_mask", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("act,ract", [("tanh", "sigmoid"), ("sigmoid", "tanh")])
@pytest.mark.parametrize("B", [3, 6])
def test_lstm_backward_matches_finite_differences(with_rmask, with_mask, act, ract, B):
    zx, h0, c0, y0, R, rmask, mask = _case(4, B, 3, 4, "float64", with_rmask, with_mask, seed=1)
    rs = np.random.RandomState(2)
    w = [rs.randn(4, B, 3), rs.randn(B, 3), rs.randn(B, 3), rs.randn(B, 3)]
    a, ra = rc.ACTIVATIONS[act], rc.ACTIVATIONS[ract]

    def loss():
        hs, cs, ys, _ = rc.lstm_forward(zx, h0, c0, y0, R, rmask, mask, a, ra)
        return (ys * w[0]).sum() + (hs[-1] * w[1]).sum() + (cs[-1] * w[2]).sum() + \
            (ys[-1] * w[3]).sum()
    hs, cs, ys, gates = rc.lstm_forward(zx, h0, c0, y0, R, rmask, mask, a, ra)
    # The last output's own gradient and the sequence's last row add up.
    dz, dh0, dc0, dy0, dR = rc.lstm_backward(w[0], w[1], w[2], w[3], h0, c0, R, rmask, mask,
                                             a, ra, hs, cs, gates)
    num = _numeric(loss, [zx, h0, c0, y0, R])
    for got, want in zip((dz, dh0, dc0, dy0, dR), num):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("with_rmask,with_mask", [(False, False), (True, True)])
@pytest.mark.parametrize("B", [3, 6])
def test_simple_backward_matches_finite_differences(with_rmask, with_mask, B):
    zx, h0, _, y0, R, rmask, mask = _case(4, B, 3, 1, "float64", with_rmask, with_mask, seed=3)
    rs = np.random.RandomState(4)
    w = [rs.randn(4, B, 3), rs.randn(B, 3), rs.randn(B, 3)]

    def loss():
        hs, ys, _ = rc.simple_forward(zx, h0, y0, R, rmask, mask, 0)
        return (ys * w[0]).sum() + (hs[-1] * w[1]).sum() + (ys[-1] * w[2]).sum()
    hs, ys, acts = rc.simple_forward(zx, h0, y0, R, rmask, mask, 0)
    dz, dh0, dy0, dR = rc.simple_backward(w[0], w[1], w[2], h0, R, rmask, mask, 0, hs, acts)
    for got, want in zip((dz, dh0, dy0, dR), _numeric(loss, [zx, h0, y0, R])):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("K,N", [(5, 3), (7, 17), (16, 40), (33, 77), (0, 9)])
@pytest.mark.parametrize("with_base", [False, True])
def test_packed_product_matches_numpy(dtype, K, N, with_base):
    # every row count up to 20 cuts into tiles of a different set of heights
    rs = np.random.RandomState(1)
    W = rs.randn(K, N).astype(dtype)
    for B in range(1, 21):
        h = rs.randn(B, K).astype(dtype)
        base = rs.randn(B, N).astype(dtype) if with_base else None
        got = rc._packed_rows(h, W, base)
        want = h.astype(np.float64) @ W.astype(np.float64)
        if with_base:
            want += base
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
        assert got.dtype == dtype and got.shape == (B, N)
        np.testing.assert_allclose(got, want, **tol)


def test_packed_product_bad_shapes_name_the_function():
    with pytest.raises(ValueError, match="_packed_rows"):
        rc._packed_rows(np.ones((3, 4), np.float32), np.ones((5, 2), np.float32), None)


def test_activations_stay_finite_and_saturate():
    x = np.array([-1e4, -100, -88.5, -20, -1e-3, 0, 1e-3, 20, 88.5, 100, 1e4], np.float32)
    zx = x.reshape(-1, 1, 1)
    zero = np.zeros((1, 1), np.float32)
    for act, f in (("tanh", np.tanh), ("sigmoid", ACTS["sigmoid"])):
        _, ys, _ = rc.simple_forward(zx, zero, zero, zero, None, None, rc.ACTIVATIONS[act])
        assert np.all(np.isfinite(ys))
        np.testing.assert_allclose(ys.ravel(), f(x.astype(np.float64)), atol=2e-7)


@pytest.mark.parametrize("u", [8, 19, 64])
def test_activation_rows_match_reference_over_the_range(u):
    # rows of u values: whole vectors and a scalar tail (19), from saturation
    # on both sides through zero
    x = np.concatenate([np.linspace(-30, 30, 20 * u - 8), [-1e4, -100, -88.5, 88.5, 100, 1e4,
                                                           -1e-3, 1e-3]]).astype(np.float32)
    zx = x.reshape(-1, 1, u)
    zero = np.zeros((1, u), np.float32)
    R = np.zeros((u, u), np.float32)
    for act, f in (("tanh", np.tanh), ("sigmoid", ACTS["sigmoid"])):
        _, ys, _ = rc.simple_forward(zx, zero, zero, R, None, None, rc.ACTIVATIONS[act])
        assert np.all(np.isfinite(ys))
        np.testing.assert_allclose(ys.ravel(), f(x.astype(np.float64)), atol=2e-7)


def test_bad_shapes_name_the_function():
    zx, h0, c0, y0, R, _, _ = _case(3, 2, 4, 4, "float32", False, False)
    with pytest.raises(ValueError, match="lstm_forward"):
        rc.lstm_forward(zx, h0[:1], c0, y0, R, None, None, 0, 1)
    with pytest.raises(ValueError, match="simple_forward"):
        rc.simple_forward(zx, h0, y0, R, None, None, 0)
    with pytest.raises((TypeError, ValueError)):
        rc.lstm_forward(zx.astype(np.float64), h0, c0, y0, R, None, None, 0, 1)


@pytest.mark.parametrize("T,B,u,with_rmask,with_mask", CASES)
def test_forward_without_records_gives_the_same_outputs(T, B, u, with_rmask, with_mask):
    # keep=False (inference): the states in a ring of two steps, no records.
    zx, h0, c0, y0, R, rmask, mask = _case(T, B, u, 4, "float32", with_rmask, with_mask)
    hs, cs, ys, _ = rc.lstm_forward(zx, h0, c0, y0, R, rmask, mask, 0, 1)
    rhs, rcs, rys, gates = rc.lstm_forward(zx, h0, c0, y0, R, rmask, mask, 0, 1, keep=False)
    assert rhs.shape[0] == rcs.shape[0] == 2 and gates.shape[0] == 1
    np.testing.assert_array_equal(rys, ys)
    if T:
        np.testing.assert_array_equal(rhs[(T - 1) % 2], hs[-1])
        np.testing.assert_array_equal(rcs[(T - 1) % 2], cs[-1])
    zx1 = zx[:, :, :u].copy()
    R1 = R[:, :u].copy()
    hs, ys, _ = rc.simple_forward(zx1, h0, y0, R1, rmask, mask, 0)
    rhs, rys, pre = rc.simple_forward(zx1, h0, y0, R1, rmask, mask, 0, keep=False)
    assert rhs.shape[0] == 2 and pre.shape[0] == 1
    np.testing.assert_array_equal(rys, ys)
    if T:
        np.testing.assert_array_equal(rhs[(T - 1) % 2], hs[-1])


@pytest.mark.parametrize("T,B,u,with_rmask,with_mask", CASES + [(4, 32, 36, True, True)])
@pytest.mark.parametrize("act,ract", [("tanh", "sigmoid"), ("sigmoid", "tanh")])
def test_lstm_step_in_one_pass_equals_per_gate_loops(monkeypatch, T, B, u, with_rmask, with_mask,
                                                     act, ract):
    # float32 tanh/sigmoid gates activate a step's rows in one pass over
    # per-lane factors (cb_act_lanes_f): bit for bit the per-gate loops'
    # values, records of masked rows included, whatever the tails (u = 36).
    zx, h0, c0, y0, R, rmask, mask = _case(T, B, u, 4, "float32", with_rmask, with_mask)
    args = (zx, h0, c0, y0, R, rmask, mask, rc.ACTIVATIONS[act], rc.ACTIVATIONS[ract])
    assert rc._gate_lanes(np.float32, u, (1, 1, 0, 1)) is not None
    one_pass = rc.lstm_forward(*args)
    monkeypatch.setattr(rc, "_gate_lanes", lambda *a: None)
    per_gate = rc.lstm_forward(*args)
    for a, b in zip(one_pass, per_gate):
        np.testing.assert_array_equal(a, b)


def test_gate_lanes_only_for_float32_tanh_and_sigmoid():
    lanes = rc._gate_lanes(np.float32, 3, (1, 0))
    np.testing.assert_array_equal(lanes, [-1, -1, -1, -2, -2, -2, 1, 1, 1, 2, 2, 2,
                                          0, 0, 0, 1, 1, 1])
    assert lanes.dtype == np.float32
    assert rc._gate_lanes(np.float64, 3, (1, 0)) is None
    assert rc._gate_lanes(np.float32, 3, (1, 2)) is None
    assert rc._gate_lanes(np.float32, 3, (3, 1)) is None
