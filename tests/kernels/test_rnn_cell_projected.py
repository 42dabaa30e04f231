"""The LSTM and GRU that project their input inside their steps
(cyback.kernels.rnn_cell.lstm_forward_projected, gru_forward_projected:
each thread its own rows) against the NumPy reference cells and the kernels
on the projection computed beforehand, on the row blocks and the units
split, with x read through a transposed view."""
import numpy as np
import pytest

from cyback import config
from cyback.kernels import rnn_cell as rc

from .test_rnn_cell import _f64, lstm_ref
from .test_rnn_cell_gru import _gru_case, gru_ref
from .test_rnn_cell_split import _rows_path, split_on  # noqa: F401


def _projected_case(T, B, width, u, dtype, with_rmask, with_mask, bias=True, seed=0):
    rs = np.random.RandomState(seed)
    # batch-major, as a Keras layer's input, read time-major through a view
    x = rs.randn(B, T, width).astype(dtype).transpose(1, 0, 2)
    W = (rs.randn(width, 4 * u) * 0.5).astype(dtype)
    xb = rs.randn(4 * u).astype(dtype) if bias else None
    R = (rs.randn(u, 4 * u) * 0.4).astype(dtype)
    h0, c0, y0 = [rs.randn(B, u).astype(dtype) for _ in range(3)]
    rmask = (rs.rand(B, u) > 0.3).astype(dtype) / 0.7 if with_rmask else None
    mask = rs.rand(T, B) > 0.3 if with_mask else None
    return x, W, xb, h0, c0, y0, R, rmask, mask


def _zx(x, W, xb):
    zx = np.einsum("tbi,ig->tbg", _f64(x), _f64(W))
    return zx if xb is None else zx + _f64(xb)


CASES = [(5, 3, 7, 4), (6, 8, 16, 36), (4, 13, 5, 20), (3, 1, 1, 9), (1, 9, 32, 8),
         (0, 4, 3, 5), (4, 0, 3, 5), (3, 4, 0, 6)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("T,B,width,u", CASES)
@pytest.mark.parametrize("with_rmask,with_mask", [(False, False), (True, True)])
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_matches_the_reference_cell(dtype, T, B, width, u, with_rmask, with_mask, keep, bias,
                                    nthreads):
    x, W, xb, h0, c0, y0, R, rmask, mask = _projected_case(T, B, width, u, dtype, with_rmask,
                                                           with_mask, bias, seed=T + B + width)
    old = config.get_num_threads()
    config.set_num_threads(nthreads)
    try:
        hs, cs, ys, gates = rc.lstm_forward_projected(x, W, xb, h0, c0, y0, R, rmask, mask,
                                                      0, 1, keep=keep)
    finally:
        config.set_num_threads(old)
    ref_ys, ref_h, ref_c, _ = lstm_ref(_zx(x, W, xb), *map(_f64, (h0, c0, y0, R, rmask)), mask,
                                       "tanh", "sigmoid")
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    assert ys.dtype == dtype and ys.shape == (T, B, u)
    np.testing.assert_allclose(ys, ref_ys, **tol)
    if T:
        last = T - 1 if keep else (T - 1) % 2
        np.testing.assert_allclose(hs[last], ref_h, **tol)
        np.testing.assert_allclose(cs[last], ref_c, **tol)
    if keep:
        # the records are those lstm_forward keeps for the gradient
        zx = np.ascontiguousarray(x) @ W
        zx = zx + xb if xb is not None else zx
        want = rc.lstm_forward(zx.astype(dtype), h0, c0, y0, R, rmask, mask, 0, 1)
        for got, w in zip((hs, cs, ys, gates), want):
            np.testing.assert_allclose(got, w, **tol)


@pytest.mark.parametrize("T,B,u", [(7, 1, 32), (4, 3, 48), (3, 6, 40)])
def test_units_split_projects_first(split_on, T, B, u):  # noqa: F811
    # the split reads every row of zx at each step: the whole projection
    # first, by the same kernel, so its values are the row blocks'
    x, W, xb, h0, c0, y0, R, rmask, mask = _projected_case(T, B, 12, u, "float32", True, True)
    old = config.get_num_threads()
    config.set_num_threads(2)
    try:
        assert rc._split_threads(T, B, u, 4, 4) == 2
        split = rc.lstm_forward_projected(x, W, xb, h0, c0, y0, R, rmask, mask, 0, 1)
        rows = _rows_path(lambda: rc.lstm_forward_projected(x, W, xb, h0, c0, y0, R, rmask,
                                                            mask, 0, 1))
    finally:
        config.set_num_threads(old)
    for a, b in zip(split, rows):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_reads_x_through_its_strides_and_copies_nothing_wrong():
    x, W, xb, h0, c0, y0, R, _, _ = _projected_case(5, 8, 6, 9, "float32", False, False)
    contiguous = np.ascontiguousarray(x)
    a = rc.lstm_forward_projected(x, W, xb, h0, c0, y0, R, None, None, 0, 1)
    b = rc.lstm_forward_projected(contiguous, W, xb, h0, c0, y0, R, None, None, 0, 1)
    for p, q in zip(a, b):
        np.testing.assert_array_equal(p, q)
    # every other step of a longer sequence: strided along time only
    longer = np.repeat(contiguous, 2, axis=0)[::2]
    c = rc.lstm_forward_projected(longer, W, xb, h0, c0, y0, R, None, None, 0, 1)
    np.testing.assert_array_equal(c[2], a[2])


def test_bad_arguments_name_the_function():
    x, W, xb, h0, c0, y0, R, _, _ = _projected_case(3, 4, 5, 6, "float32", False, False)
    call = rc.lstm_forward_projected
    with pytest.raises(ValueError, match="lstm_forward_projected: x must be"):
        call(x[:, :3], W, xb, h0, c0, y0, R, None, None, 0, 1)           # batch disagrees
    with pytest.raises(ValueError, match="lstm_forward_projected: x must be"):
        call(x[..., ::2], W[::2], xb, h0, c0, y0, R, None, None, 0, 1)   # strided last axis
    with pytest.raises(ValueError, match="lstm_forward_projected: x must be"):
        call(x.astype(np.float64), W, xb, h0, c0, y0, R, None, None, 0, 1)
    with pytest.raises(ValueError, match="lstm_forward_projected: W must be"):
        call(x, W[:4], xb, h0, c0, y0, R, None, None, 0, 1)
    with pytest.raises(ValueError, match="lstm_forward_projected: xb must be"):
        call(x, W, xb[:5], h0, c0, y0, R, None, None, 0, 1)
    with pytest.raises(ValueError, match="lstm_forward_projected: shapes"):
        call(x, W, xb, h0, c0[:2], y0, R, None, None, 0, 1)


@pytest.mark.parametrize("T,B,width,u", [(5, 3, 7, 4), (6, 8, 16, 36), (4, 13, 5, 20),
                                         (1, 9, 32, 8), (3, 4, 0, 6)])
@pytest.mark.parametrize("reset_after", [True, False])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_gru_matches_the_reference_cell(T, B, width, u, reset_after, with_mask, keep, nthreads):
    _, h0, y0, R, Rh, rb, rmask, mask = _gru_case(T, B, u, "float32", reset_after, True, True,
                                                  with_mask, seed=T + B + u)
    x, W, xb = _projected_case(T, B, width, u, "float32", False, False, seed=u)[:3]
    W, xb = np.ascontiguousarray(W[:, :3 * u]), np.ascontiguousarray(xb[:3 * u])
    old = config.get_num_threads()
    config.set_num_threads(nthreads)
    try:
        hs, ys, gates, ph = rc.gru_forward_projected(x, W, xb, h0, y0, R, Rh, rb, rmask, mask,
                                                     reset_after, False, 0, 1, keep=keep)
    finally:
        config.set_num_threads(old)
    ref_ys, ref_h = gru_ref(_zx(x, W, xb), *map(_f64, (h0, y0, R, Rh, rb, rmask)), mask,
                            reset_after, False, "tanh", "sigmoid")[:2]
    np.testing.assert_allclose(ys, ref_ys, rtol=1e-5, atol=1e-5)
    if T:
        np.testing.assert_allclose(hs[T - 1 if keep else (T - 1) % 2], ref_h, rtol=1e-5,
                                   atol=1e-5)
    if keep:
        zx = (np.ascontiguousarray(x) @ W + xb).astype(np.float32)
        want = rc.gru_forward(zx, h0, y0, R, Rh, rb, rmask, mask, reset_after, False, 0, 1)
        for got, w in zip((hs, ys, gates, ph), want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reset_after", [True, False])
def test_gru_units_split_projects_first(split_on, reset_after):  # noqa: F811
    T, B, u = 5, 2, 40
    _, h0, y0, R, Rh, rb, rmask, mask = _gru_case(T, B, u, "float32", reset_after, True, True,
                                                  True)
    x, W, xb = _projected_case(T, B, 12, u, "float32", False, False)[:3]
    W, xb = np.ascontiguousarray(W[:, :3 * u]), np.ascontiguousarray(xb[:3 * u])
    old = config.get_num_threads()
    config.set_num_threads(2)
    try:
        assert rc._split_threads(T, B, u, 3, 4) == 2
        args = (x, W, xb, h0, y0, R, Rh, rb, rmask, mask, reset_after, False, 0, 1)
        split = rc.gru_forward_projected(*args)
        rows = _rows_path(lambda: rc.gru_forward_projected(*args))
    finally:
        config.set_num_threads(old)
    for a, b in zip(split, rows):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_gru_bad_arguments_name_the_function():
    _, h0, y0, R, Rh, rb, _, _ = _gru_case(3, 4, 6, "float32", True, True, False, False)
    x, W, xb = _projected_case(3, 4, 5, 6, "float32", False, False)[:3]
    W, xb = np.ascontiguousarray(W[:, :18]), np.ascontiguousarray(xb[:18])
    call = rc.gru_forward_projected
    with pytest.raises(ValueError, match="gru_forward_projected: W must be"):
        call(x, W[:, :12], xb, h0, y0, R, Rh, rb, None, None, True, False, 0, 1)
    with pytest.raises(ValueError, match="gru_forward_projected: x must be"):
        call(x[:, :2], W, xb, h0, y0, R, Rh, rb, None, None, True, False, 0, 1)
    with pytest.raises(ValueError, match="gru_forward_projected: shapes"):
        call(x, W, xb, h0, y0, np.ascontiguousarray(R[:, :12]), Rh, rb, None, None, True, False,
             0, 1)
