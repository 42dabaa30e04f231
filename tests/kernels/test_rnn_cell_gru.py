"""The fused GRU kernels against a NumPy reference of Keras's GRUCell
(implementation 2) and finite differences."""
import numpy as np
import pytest

from cyback.kernels import rnn_cell as rc

# the AVX2 / baseline and packed / BLAS parametrisations of every test
from kernels.test_rnn_cell import ACTS, CASES, _numeric, isa, recurrent_product  # noqa: F401


def gru_ref(zx, h0, y0, R, Rh, rb, rmask, mask, reset_after, mix_masked, act, ract):
    """Keras's GRUCell, gates z, r, h, with rnn's masking."""
    f_act, f_ract = ACTS[act], ACTS[ract]
    u = h0.shape[1]
    h, y = h0, y0
    ys = []
    for t in range(zx.shape[0]):
        hm = h * rmask if rmask is not None else h
        P = hm @ R + (rb if rb is not None else 0)
        z = f_ract(zx[t][:, :u] + P[:, :u])
        r = f_ract(zx[t][:, u:2 * u] + P[:, u:2 * u])
        if reset_after:
            hh = f_act(zx[t][:, 2 * u:] + r * P[:, 2 * u:])
        else:
            hh = f_act(zx[t][:, 2 * u:] + (r * hm) @ Rh)
        hn = z * (hm if mix_masked else h) + (1 - z) * hh
        keep = mask[t][:, None] if mask is not None else np.ones((len(h), 1), bool)
        h, y = np.where(keep, hn, h), np.where(keep, hn, y)
        ys.append(y)
    return np.array(ys).reshape(zx.shape[:2] + (u,)), h, y


def _gru_case(T, B, u, dtype, reset_after, with_bias, with_rmask, with_mask, seed=0):
    rs = np.random.RandomState(seed)
    zx = rs.randn(T, B, 3 * u).astype(dtype)
    R = (rs.randn(u, (3 if reset_after else 2) * u) * 0.4).astype(dtype)
    Rh = None if reset_after else (rs.randn(u, u) * 0.4).astype(dtype)
    rb = (rs.randn(3 * u) * 0.3).astype(dtype) if reset_after and with_bias else None
    h0, y0 = [rs.randn(B, u).astype(dtype) for _ in range(2)]
    rmask = (rs.rand(B, u) > 0.3).astype(dtype) / 0.7 if with_rmask else None
    mask = rs.rand(T, B) > 0.3 if with_mask else None
    return zx, h0, y0, R, Rh, rb, rmask, mask


def _f64(a):
    return None if a is None else np.asarray(a, np.float64)


VARIANTS = [(False, False, False), (True, True, False), (True, False, False),
            (False, False, True), (True, True, True)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("T,B,u,with_rmask,with_mask", CASES)
@pytest.mark.parametrize("reset_after,with_bias,mix_masked", VARIANTS)
def test_gru_forward_matches_reference(dtype, T, B, u, with_rmask, with_mask, reset_after,
                                       with_bias, mix_masked):
    zx, h0, y0, R, Rh, rb, rmask, mask = _gru_case(T, B, u, dtype, reset_after, with_bias,
                                                   with_rmask, with_mask)
    hs, ys, gates, ph = rc.gru_forward(zx, h0, y0, R, Rh, rb, rmask, mask, reset_after,
                                       mix_masked, 0, 1)
    ref_ys, ref_h, _ = gru_ref(*map(_f64, (zx, h0, y0, R, Rh, rb, rmask)), mask, reset_after,
                               mix_masked, "tanh", "sigmoid")
    tol = dict(rtol=1e-5, atol=2e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    assert ys.dtype == dtype and ys.shape == (T, B, u)
    np.testing.assert_allclose(ys, ref_ys, **tol)
    if T:
        np.testing.assert_allclose(hs[-1], ref_h, **tol)
    # Masked rows record finite values (the backward's products read every row).
    assert np.all(np.isfinite(gates)) and np.all(np.isfinite(ph))


@pytest.mark.parametrize("act,ract", [("sigmoid", "tanh"), ("tanh", "hard_sigmoid"),
                                      ("linear", "sigmoid")])
def test_gru_forward_other_activations(act, ract):
    zx, h0, y0, R, Rh, rb, rmask, mask = _gru_case(4, 6, 5, "float64", False, False, True, True)
    _, ys, _, _ = rc.gru_forward(zx, h0, y0, R, Rh, rb, rmask, mask, False, True,
                                 rc.ACTIVATIONS[act], rc.ACTIVATIONS[ract])
    ref, _, _ = gru_ref(zx, h0, y0, R, Rh, rb, rmask, mask, False, True, act, ract)
    np.testing.assert_allclose(ys, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("with_rmask,with_mask", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("reset_after,with_bias,mix_masked", VARIANTS)
@pytest.mark.parametrize("B", [3, 6])
def test_gru_backward_matches_finite_differences(with_rmask, with_mask, reset_after, with_bias,
                                                 mix_masked, B):
    u = 3
    zx, h0, y0, R, Rh, rb, rmask, mask = _gru_case(4, B, u, "float64", reset_after, with_bias,
                                                   with_rmask, with_mask, seed=1)
    rs = np.random.RandomState(2)
    w = [rs.randn(4, B, u), rs.randn(B, u), rs.randn(B, u)]

    def run():
        return rc.gru_forward(zx, h0, y0, R, Rh, rb, rmask, mask, reset_after, mix_masked, 0, 1)

    def loss():
        hs, ys, _, _ = run()
        return (ys * w[0]).sum() + (hs[-1] * w[1]).sum() + (ys[-1] * w[2]).sum()
    hs, ys, gates, ph = run()
    got = rc.gru_backward(w[0], w[1], w[2], h0, R, Rh, rb, rmask, mask, reset_after, mix_masked,
                          0, 1, hs, gates, ph)
    dxz, dxr, dxh, dh0, dy0, dR, dRh, drb = got
    wrt = [zx, h0, y0, R] + ([Rh] if Rh is not None else []) + ([rb] if rb is not None else [])
    num = _numeric(loss, wrt)
    np.testing.assert_allclose(np.concatenate([dxz, dxr, dxh], axis=2), num[0], rtol=1e-6,
                               atol=1e-7)
    for g, want in zip([dh0, dy0, dR] + [x for x in (dRh, drb) if x is not None], num[1:]):
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-7)
    assert (dRh is None) == reset_after and (drb is None) == (rb is None)


def test_gru_backward_threads_agree():
    # Rows are split over threads: the result does not depend on the count.
    from cyback import config
    zx, h0, y0, R, Rh, rb, rmask, mask = _gru_case(6, 64, 32, "float64", False, False, True,
                                                   True, seed=5)
    hs, ys, gates, ph = rc.gru_forward(zx, h0, y0, R, Rh, rb, rmask, mask, False, True, 0, 1)
    dys = np.random.RandomState(6).randn(*ys.shape)
    zeros = np.zeros_like(h0)
    results = []
    for n in (1, 2):
        old = config.get_num_threads()
        config.set_num_threads(n)
        try:
            results.append(rc.gru_backward(dys, zeros, zeros, h0, R, Rh, rb, rmask, mask, False,
                                           True, 0, 1, hs, gates, ph))
        finally:
            config.set_num_threads(old)
    for a, b in zip(*results):
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_gru_bad_shapes_name_the_function():
    zx, h0, y0, R, Rh, rb, _, _ = _gru_case(3, 2, 4, "float32", False, False, False, False)
    with pytest.raises(ValueError, match="gru_forward"):
        rc.gru_forward(zx, h0[:1], y0, R, Rh, rb, None, None, False, False, 0, 1)
    with pytest.raises(ValueError, match="gru_forward"):
        rc.gru_forward(zx, h0, y0, R, None, rb, None, None, False, False, 0, 1)
    with pytest.raises(ValueError, match="reset_after"):
        rc.gru_forward(zx, h0, y0, R, Rh, rb, None, None, True, False, 0, 1)


@pytest.mark.parametrize("T,B,u,with_rmask,with_mask", CASES)
@pytest.mark.parametrize("reset_after", [False, True])
def test_gru_forward_without_records_gives_the_same_outputs(T, B, u, with_rmask, with_mask,
                                                           reset_after):
    case = _gru_case(T, B, u, "float32", reset_after, True, with_rmask, with_mask)
    hs, ys, _, _ = rc.gru_forward(*case, reset_after, True, 0, 1)
    rhs, rys, gates, ph = rc.gru_forward(*case, reset_after, True, 0, 1, keep=False)
    assert rhs.shape[0] == 2 and gates.shape[0] == 1
    np.testing.assert_array_equal(rys, ys)
    if T:
        np.testing.assert_array_equal(rhs[(T - 1) % 2], hs[-1])
