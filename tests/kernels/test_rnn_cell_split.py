"""The units split of the fused LSTM and GRU forward (a few batch rows: the
threads share each step's units and meet after it) against the NumPy
reference cells and the row-block path, on 2 and 3 threads."""
import time

import numpy as np
import pytest

from cyback import config
from cyback.kernels import rnn_cell as rc
from cyback.kernels import runtime

from .test_rnn_cell import _case, _f64, lstm_ref
from .test_rnn_cell_gru import _gru_case, gru_ref


@pytest.fixture
def split_on():
    """Every sequence of up to 6 rows splits its units (whatever the size of
    R or the host's load; the tests' team takes any work)."""
    saved = dict(rc._TUNE)
    rc._TUNE.update(split_min_bytes=0, split_max_rows=6, split_lead_steps=0)
    runtime.force_host_busy(False)
    runtime.team_rest()     # and no busy-host hold from before
    yield
    rc._TUNE.clear()
    rc._TUNE.update(saved)
    runtime.force_host_busy(None)


def _threads(n):
    old = config.get_num_threads()
    config.set_num_threads(n)
    return old


def _rows_path(fn):
    """fn() on the row blocks (the split off)."""
    saved = rc._TUNE["split_max_rows"]
    rc._TUNE["split_max_rows"] = 0
    try:
        return fn()
    finally:
        rc._TUNE["split_max_rows"] = saved


# T, B, u: units in 8s and not, a thread with fewer units than the other
CASES = [(7, 1, 32), (5, 2, 37), (4, 3, 48), (3, 6, 40), (9, 1, 100), (2, 4, 33)]


@pytest.mark.parametrize("nthreads", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("T,B,u", CASES)
@pytest.mark.parametrize("with_rmask,with_mask", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("keep", [True, False])
def test_lstm_split_matches_reference_and_rows(split_on, nthreads, dtype, T, B, u, with_rmask,
                                                with_mask, keep):
    zx, h0, c0, y0, R, rmask, mask = _case(T, B, u, 4, dtype, with_rmask, with_mask, seed=T + u)
    old = _threads(nthreads)
    try:
        assert rc._split_threads(T, B, u, 4, np.dtype(dtype).itemsize) == min(nthreads, u // 16)
        hs, cs, ys, gates = rc.lstm_forward(zx, h0, c0, y0, R, rmask, mask, 0, 1, keep)
    finally:
        config.set_num_threads(old)
    rhs, rcs, rys, rgates = _rows_path(
        lambda: rc.lstm_forward(zx, h0, c0, y0, R, rmask, mask, 0, 1, keep))
    want, h, c, _ = lstm_ref(*map(_f64, (zx, h0, c0, y0, R, rmask)), mask, "tanh", "sigmoid")
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    assert ys.dtype == dtype
    np.testing.assert_allclose(ys, want, **tol)
    # the row path sums each product over k in the same order (the packed
    # kernel from 5 rows; BLAS's GEMV below, which may differ in the last bits)
    tight = dict(rtol=0, atol=0) if B > 4 else tol
    np.testing.assert_allclose(ys, rys, **tight)
    last = T - 1 if keep else (T - 1) % 2
    np.testing.assert_allclose(hs[last], rhs[last], **tight)
    np.testing.assert_allclose(cs[last], rcs[last], **tight)
    np.testing.assert_allclose(hs[last], h, **tol)
    np.testing.assert_allclose(cs[last], c, **tol)
    if keep:
        # the records the backward pass reads: every step's gates
        np.testing.assert_allclose(gates, rgates, **tight)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("T,B,u", CASES)
@pytest.mark.parametrize("reset_after,with_bias,with_rmask,with_mask,mix_masked",
                         [(True, True, False, False, False), (True, False, True, True, True),
                          (True, True, True, False, False), (True, True, False, True, True),
                          (False, False, False, False, False), (False, False, True, True, True),
                          (False, False, False, True, False)])
@pytest.mark.parametrize("keep", [True, False])
def test_gru_split_matches_reference_and_rows(split_on, dtype, T, B, u, reset_after, with_bias,
                                               with_rmask, with_mask, mix_masked, keep):
    # without reset_after the threads also meet in the middle of each step:
    # the candidate's product reads r * h of every unit
    zx, h0, y0, R, Rh, rb, rmask, mask = _gru_case(T, B, u, dtype, reset_after, with_bias,
                                                   with_rmask, with_mask, seed=T * u)
    old = _threads(2)
    try:
        assert rc._split_threads(T, B, u, 3, np.dtype(dtype).itemsize) == 2
        hs, ys, gates, ph = rc.gru_forward(zx, h0, y0, R, Rh, rb, rmask, mask, reset_after,
                                           mix_masked, 0, 1, keep)
    finally:
        config.set_num_threads(old)
    rhs, rys, rgates, rph = _rows_path(
        lambda: rc.gru_forward(zx, h0, y0, R, Rh, rb, rmask, mask, reset_after, mix_masked, 0, 1,
                               keep))
    want = gru_ref(*map(_f64, (zx, h0, y0, R, Rh, rb, rmask)), mask, reset_after, mix_masked,
                   "tanh", "sigmoid")[0]
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ys, want, **tol)
    tight = dict(rtol=0, atol=0) if B > 4 else tol
    np.testing.assert_allclose(ys, rys, **tight)
    if keep:
        # the records the backward pass reads (masked rows: zeros)
        np.testing.assert_allclose(gates, rgates, **tight)
        if reset_after:
            np.testing.assert_allclose(ph, rph, **tight)


@pytest.mark.parametrize("lead", [1, 3, 9])
@pytest.mark.parametrize("cell", ["lstm", "gru", "gru_reset_before"])
def test_split_opened_late_gives_the_same_sequence(split_on, cell, lead):
    # thread 0 runs the first steps alone (the others still asleep; forced
    # here), then the split takes over; with lead >= T it never does
    T, B, u = 6, 5, 40
    rc._TUNE["split_lead_steps"] = lead
    old = _threads(2)
    try:
        if cell == "lstm":
            zx, h0, c0, y0, R, rmask, mask = _case(T, B, u, 4, "float32", True, True, seed=lead)
            got = rc.lstm_forward(zx, h0, c0, y0, R, rmask, mask, 0, 1)
            want = _rows_path(lambda: rc.lstm_forward(zx, h0, c0, y0, R, rmask, mask, 0, 1))
        else:
            ra = cell == "gru"
            zx, h0, y0, R, Rh, rb, rmask, mask = _gru_case(T, B, u, "float32", ra, ra, True,
                                                           True, seed=lead)
            got = rc.gru_forward(zx, h0, y0, R, Rh, rb, rmask, mask, ra, True, 0, 1)
            want = _rows_path(lambda: rc.gru_forward(zx, h0, y0, R, Rh, rb, rmask, mask, ra,
                                                     True, 0, 1))
        assert rc._last_join() == min(lead, T)
    finally:
        config.set_num_threads(old)
    for g, w in zip(got, want):
        # B > 4: the row path's packed product sums in the same order
        np.testing.assert_array_equal(g, w)


def test_split_choice(split_on):
    old = _threads(2)
    try:
        rc._TUNE.update(split_min_bytes=1 << 17)
        # LSTM(128) at batch 1: 256 kB of R, split (the tests' team takes any
        # work: CYBACK_PARALLEL_MIN_WORK=0)
        assert rc._split_threads(50, 1, 128, 4, 4) == 2
        # R within a core's caches, one step, many rows or few units: rows
        assert rc._split_threads(50, 1, 64, 4, 4) == 1
        assert rc._split_threads(1, 1, 128, 4, 4) == 1
        assert rc._split_threads(50, 7, 128, 4, 4) == 1
        assert rc._split_threads(50, 0, 128, 4, 4) == 1
        rc._TUNE.update(split_min_bytes=0)
        assert rc._split_threads(50, 1, 24, 4, 4) == 1
        # a busy host: a thread waiting for its time slice would stall the
        # other at every step
        runtime.force_host_busy(True)
        runtime.team_rest()
        runtime.host_busy()
        time.sleep(0.11)
        runtime.host_busy()         # one window above the rate: a burst
        time.sleep(0.11)
        assert runtime.host_busy()  # two in a row: busy
        assert rc._split_threads(50, 1, 128, 4, 4) == 1
    finally:
        config.set_num_threads(old)
        runtime.force_host_busy(None)
        runtime.team_rest()
