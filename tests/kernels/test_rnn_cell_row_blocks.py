"""The row-block driver every fused cell pass runs on (cyback/kernels/rnn_rows.pxi):
batch rows are independent sequences, so each pass's outputs are the same
bytes whether one thread runs all the rows or they are cut into a block per
thread (even or uneven blocks, more threads than rows), for every entry
point, forward and backward."""
import numpy as np
import pytest

from cyback import config
from cyback.kernels import rnn_cell as rc
from cyback.kernels import runtime

from .test_rnn_cell import _case
from .test_rnn_cell_gru import _gru_case


def _on_threads(n, fn):
    """fn() with row blocks for n threads (the team takes any work)."""
    old, cutoff = config.get_num_threads(), runtime.parallel_min_work()
    config.set_num_threads(n)
    runtime.set_parallel_min_work(0)
    try:
        assert runtime.team_threads(1e9) == n
        return fn()
    finally:
        config.set_num_threads(old)
        runtime.set_parallel_min_work(cutoff)


def _passes(dtype, T, B, u, with_rmask, with_mask):
    """(name, fn) of every entry point on one case; each fn returns arrays."""
    zx, h0, c0, y0, R, rmask, mask = _case(T, B, u, 4, dtype, with_rmask, with_mask, seed=B)
    rs = np.random.RandomState(B + 1)
    dys = rs.randn(T, B, u).astype(dtype)
    dh, dc, dy = (rs.randn(B, u).astype(dtype) for _ in range(3))
    x = rs.randn(T, B, 3).astype(dtype)
    out = []

    def lstm():
        hs, cs, ys, gates = rc.lstm_forward(zx, h0, c0, y0, R, rmask, mask, 0, 1)
        return (hs, cs, ys, gates) + rc.lstm_backward(dys, dh, dc, dy, h0, c0, R, rmask, mask,
                                                      0, 1, hs, cs, gates)
    out.append(("lstm", lstm))
    W = rs.randn(3, 4 * u).astype(dtype)
    out.append(("lstm_projected", lambda: rc.lstm_forward_projected(
        x, W, None, h0, c0, y0, R, rmask, mask, 0, 1)))

    szx, _, _, _, sR, _, _ = _case(T, B, u, 1, dtype, False, False, seed=B + 2)

    def simple():
        hs, ys, acts = rc.simple_forward(szx, h0, y0, sR, rmask, mask, 0)
        return (hs, ys, acts) + rc.simple_backward(dys, dh, dy, h0, sR, rmask, mask, 0, hs, acts)
    out.append(("simple", simple))

    for reset_after in (True, False):
        gzx, _, _, gR, Rh, rb, _, _ = _gru_case(T, B, u, dtype, reset_after, True, False, False,
                                                seed=B + 3)
        gW = rs.randn(3, 3 * u).astype(dtype)

        def gru(gzx=gzx, gR=gR, Rh=Rh, rb=rb, reset_after=reset_after, gW=gW):
            hs, ys, gates, ph = rc.gru_forward(gzx, h0, y0, gR, Rh, rb, rmask, mask,
                                               reset_after, True, 0, 1)
            back = rc.gru_backward(dys, dh, dy, h0, gR, Rh, rb, rmask, mask, reset_after, True,
                                   0, 1, hs, gates, ph)
            projected = rc.gru_forward_projected(x, gW, None, h0, y0, gR, Rh, rb, rmask, mask,
                                                 reset_after, False, 0, 1)
            return (hs, ys, gates, ph) + back + projected
        out.append(("gru_reset_after" if reset_after else "gru", gru))
    return out


# T, B, u: blocks even and uneven, one row, fewer rows than threads, none
CASES = [(4, 6, 5), (3, 7, 16), (2, 1, 9), (3, 2, 3), (2, 0, 4)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("T,B,u", CASES)
@pytest.mark.parametrize("with_rmask,with_mask", [(False, False), (True, True)])
def test_row_blocks_do_not_change_a_bit(dtype, T, B, u, with_rmask, with_mask):
    # the units split off: it is not the row blocks (test_rnn_cell_split.py)
    rc._TUNE["split_max_rows"] = 0
    for name, fn in _passes(dtype, T, B, u, with_rmask, with_mask):
        want = [a for a in _on_threads(1, fn) if a is not None]
        for n in (2, 3):
            got = [a for a in _on_threads(n, fn) if a is not None]
            assert len(got) == len(want)
            for i, (a, b) in enumerate(zip(got, want)):
                assert a.dtype == b.dtype and a.shape == b.shape, (name, n, i)
                assert a.tobytes() == b.tobytes(), "%s on %d threads: output %d differs" \
                    % (name, n, i)
