"""pool_forward / pool_backward against slow NumPy loops."""
import itertools
import zlib

import numpy as np
import pytest

from cyback.kernels import pool, runtime
from cyback.kernels.pool import pool_backward, pool_forward

from instruction_sets import instruction_set


def same_pads(size, k, s):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return (total // 2, total - total // 2)


def windows(spatial, ks, ss, ps):
    """Yield (out index, list of valid input indices in D,H,W order)."""
    outs = [(spatial[d] + ps[d][0] + ps[d][1] - ks[d]) // ss[d] + 1 for d in range(len(spatial))]
    for o in itertools.product(*[range(n) for n in outs]):
        ranges = []
        for d in range(len(spatial)):
            lo = o[d] * ss[d] - ps[d][0]
            ranges.append([i for i in range(lo, lo + ks[d]) if 0 <= i < spatial[d]])
        yield o, list(itertools.product(*ranges)), outs


def ref_forward(x, ks, ss, ps, cl, mode):
    xc = x if cl else np.moveaxis(x, 1, -1)
    spatial = xc.shape[1:-1]
    outs = None
    vals = {}
    for o, cells, outs in windows(spatial, ks, ss, ps):
        stack = np.stack([xc[(slice(None),) + c] for c in cells])
        vals[o] = stack.max(0) if mode == 'max' else stack.sum(0) / len(cells)
    y = np.empty((x.shape[0],) + tuple(outs) + (xc.shape[-1],), x.dtype)
    for o, v in vals.items():
        y[(slice(None),) + o] = v
    return y if cl else np.moveaxis(y, -1, 1)


def ref_backward(x, dy, ks, ss, ps, cl, mode):
    xc = x if cl else np.moveaxis(x, 1, -1)
    dyc = dy if cl else np.moveaxis(dy, 1, -1)
    dx = np.zeros(xc.shape, np.float64)
    for o, cells, _ in windows(xc.shape[1:-1], ks, ss, ps):
        g = dyc[(slice(None),) + o].astype(np.float64)
        if mode == 'avg':
            for c in cells:
                dx[(slice(None),) + c] += g / len(cells)
        else:
            stack = np.stack([xc[(slice(None),) + c] for c in cells])
            first = stack.argmax(0)  # argmax returns the first maximum
            for i, c in enumerate(cells):
                dx[(slice(None),) + c] += np.where(first == i, g, 0)
    dx = dx.astype(x.dtype)
    return dx if cl else np.moveaxis(dx, -1, 1)


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)


CASES = [
    # spatial, channels, pool, strides, padding
    ((7,), 3, (2,), (2,), 'same'),
    ((9,), 5, (3,), (1,), 'valid'),
    ((6, 7), 4, (2, 2), (2, 2), 'same'),
    ((7, 5), 3, (3, 3), (2, 2), 'same'),
    ((5, 8), 2, (3, 2), (1, 3), 'valid'),
    ((8, 8), 17, (3, 3), (1, 1), 'same'),
    ((4, 5, 6), 3, (2, 2, 2), (2, 2, 2), 'same'),
    ((5, 4, 7), 2, (3, 2, 3), (2, 1, 2), 'same'),
    ((3, 3, 3), 1, (3, 3, 3), (1, 1, 1), 'valid'),
]


def make_pads(spatial, ks, ss, padding):
    if padding == 'valid':
        return tuple((0, 0) for _ in spatial)
    return tuple(same_pads(n, k, s) for n, k, s in zip(spatial, ks, ss))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cl", [True, False])
@pytest.mark.parametrize("mode", ['max', 'avg'])
def test_forward_backward(case, dtype, cl, mode):
    spatial, c, ks, ss, padding = case
    rng = np.random.default_rng(zlib.crc32(repr((case, cl, mode)).encode()))
    n = 2
    shape = (n,) + spatial + (c,) if cl else (n, c) + spatial
    # Integer-valued data makes ties common, which exercises the first-max rule.
    x = rng.integers(-3, 4, size=shape).astype(dtype)
    ps = make_pads(spatial, ks, ss, padding)
    y = pool_forward(x, ks, ss, ps, channels_last=cl, mode=mode)
    yr = ref_forward(x, ks, ss, ps, cl, mode)
    assert y.dtype == dtype and y.shape == yr.shape
    np.testing.assert_allclose(y, yr, **tol(dtype))
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = pool_backward(x, y, dy, ks, ss, ps, channels_last=cl, mode=mode)
    np.testing.assert_allclose(dx, ref_backward(x, dy, ks, ss, ps, cl, mode), **tol(dtype))
    # y=None recomputes the forward pass
    dx2 = pool_backward(x, None, dy, ks, ss, ps, channels_last=cl, mode=mode)
    np.testing.assert_array_equal(dx, dx2)


@pytest.mark.parametrize("cl", [True, False])
def test_padding_never_wins_max(cl):
    x = -np.ones((1, 3, 3, 1) if cl else (1, 1, 3, 3), np.float32) * 5
    y = pool_forward(x, 3, 1, ((1, 1), (1, 1)), channels_last=cl, mode='max')
    assert np.all(y == -5)
    ya = pool_forward(x, 3, 1, ((1, 1), (1, 1)), channels_last=cl, mode='avg')
    np.testing.assert_allclose(ya, -5)


def test_random_configs_and_noncontiguous():
    rng = np.random.default_rng(0)
    for trial in range(25):
        nd = rng.integers(1, 4)
        cl = bool(rng.integers(2))
        mode = ['max', 'avg'][rng.integers(2)]
        dtype = [np.float32, np.float64][rng.integers(2)]
        ks = tuple(int(v) for v in rng.integers(1, 4, nd))
        ss = tuple(int(v) for v in rng.integers(1, 4, nd))
        spatial = tuple(int(k + v) for k, v in zip(ks, rng.integers(0, 5, nd)))
        c = int(rng.integers(1, 40))
        n = int(rng.integers(1, 4))
        padding = ['same', 'valid'][rng.integers(2)]
        ps = make_pads(spatial, ks, ss, padding)
        shape = (n,) + spatial + (c,) if cl else (n, c) + spatial
        big = rng.standard_normal(tuple(2 * s for s in shape)).astype(dtype)
        x = big[tuple(slice(None, None, 2) for _ in shape)]  # non-contiguous view
        assert not x.flags.c_contiguous or x.size <= 1
        y = pool_forward(x, ks, ss, ps, channels_last=cl, mode=mode)
        np.testing.assert_allclose(y, ref_forward(x, ks, ss, ps, cl, mode), **tol(dtype))
        dy = rng.standard_normal(y.shape).astype(dtype)
        dx = pool_backward(x, y, dy.T.copy().T, ks, ss, ps, channels_last=cl, mode=mode)
        np.testing.assert_allclose(dx, ref_backward(x, dy, ks, ss, ps, cl, mode), **tol(dtype))


@pytest.mark.parametrize("cl", [True, False])
def test_thread_count_invariant(cl):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 13, 11, 64) if cl else (1, 64, 13, 11)).astype(np.float32)
    ps = ((1, 1), (1, 1))
    old = runtime.get_max_threads()
    try:
        res = []
        for nt in (1, 2):
            runtime.set_num_threads(nt)
            for mode in ('max', 'avg'):
                y = pool_forward(x, 3, 1, ps, cl, mode)
                dx = pool_backward(x, y, y * 1.5, 3, 1, ps, cl, mode)
                res.append((y, dx))
    finally:
        runtime.set_num_threads(old)
    for a, b in zip(res[:2], res[2:]):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_empty_batch():
    x = np.zeros((0, 5, 5, 3), np.float32)
    y = pool_forward(x, 2, 2, ((0, 1), (0, 1)))
    assert y.shape == (0, 3, 3, 3)
    dx = pool_backward(x, y, y, 2, 2, ((0, 1), (0, 1)))
    assert dx.shape == x.shape
    x = np.zeros((0, 3, 5, 5), np.float64)
    assert pool_forward(x, 2, 2, ((0, 0), (0, 0)), channels_last=False).shape == (0, 3, 2, 2)


def test_bad_arguments():
    x = np.zeros((2, 5, 5, 3), np.float32)
    p = ((0, 0), (0, 0))
    with pytest.raises(ValueError, match="mode"):
        pool_forward(x, 2, 2, p, mode='min')
    with pytest.raises(TypeError, match="float32 or float64"):
        pool_forward(x.astype(np.int32), 2, 2, p)
    with pytest.raises(ValueError, match="spatial"):
        pool_forward(np.zeros((2, 3), np.float32), 2, 2, p)
    with pytest.raises(ValueError, match="pool_size"):
        pool_forward(x, (2, 2, 2), 2, p)
    with pytest.raises(ValueError, match="pads"):
        pool_forward(x, 2, 2, ((0, 0),))
    with pytest.raises(ValueError, match="pad"):
        pool_forward(x, 2, 2, ((2, 0), (0, 0)))
    with pytest.raises(ValueError, match="positive"):
        pool_forward(x, 2, 0, p)
    with pytest.raises(ValueError, match="larger"):
        pool_forward(x, 6, 1, p)
    with pytest.raises(TypeError, match="pads"):
        pool_forward(x, 2, 2, 3)
    y = pool_forward(x, 2, 2, p)
    with pytest.raises(ValueError, match="dy has shape"):
        pool_backward(x, y, y[:1], 2, 2, p)
    with pytest.raises(TypeError, match="dtype"):
        pool_backward(x, y, y.astype(np.float64), 2, 2, p)
    with pytest.raises(ValueError, match="y has shape"):
        pool_backward(x, y[:1], y, 2, 2, p)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_2x2_windows_keep_the_cell_order_with_nan_and_inf(dtype):
    # Full 2x2 windows take a path of their own: it compares the cells in
    # the general loop's order (a NaN in the first cell wins, later NaNs lose
    # to it), so its bits are the general loop's; windows cut by the input's
    # edge (odd sizes, 'same' padding) run the general loop beside it.
    rng = np.random.default_rng(7)
    for h, w, c, ps in [(6, 8, 16, ((0, 0), (0, 0))), (5, 7, 3, ((0, 1), (0, 1))),
                        (4, 4, 64, ((0, 0), (0, 0)))]:
        x = rng.standard_normal((2, h, w, c)).astype(dtype)
        x[rng.random(x.shape) < 0.1] = np.nan
        x[rng.random(x.shape) < 0.05] = np.inf
        x[rng.random(x.shape) < 0.05] = -np.inf
        got = pool_forward(x, (2, 2), (2, 2), ps, True, 'max')
        want = np.empty_like(got)
        for oh in range(got.shape[1]):
            for ow in range(got.shape[2]):
                cells = [x[:, i, j] for i in range(2 * oh - ps[0][0], 2 * oh - ps[0][0] + 2)
                         for j in range(2 * ow - ps[1][0], 2 * ow - ps[1][0] + 2)
                         if 0 <= i < h and 0 <= j < w]
                m = cells[0].copy()
                for cell in cells[1:]:
                    m = np.where(cell > m, cell, m)
                want[:, oh, ow] = m
        np.testing.assert_array_equal(got, want)
        finite = np.nan_to_num(x, nan=0.0)
        np.testing.assert_array_equal(pool_forward(finite, (2, 2), (2, 2), ps, True, 'max'),
                                      ref_forward(finite, (2, 2), (2, 2), ps, True, 'max'))


# Channels_last stride-1 rows of fewer than 64 channels take the row path
# (_fwd_row_s1): per channel the same bits as the per-pixel path, which a
# layer of 70 channels takes, NaNs included.
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("xs,pool_size,pads", [
    ((2, 9, 11, 70), (3, 3), ((1, 1), (1, 1))),
    ((1, 7, 6, 70), (5, 5), ((2, 2), (2, 2))),
    ((1, 8, 8, 70), (3, 3), ((0, 0), (0, 0))),
    ((3, 5, 4, 70), (1, 3), ((0, 0), (1, 1))),
    ((1, 6, 9, 70), (3, 2), ((1, 1), (0, 0))),
])
@pytest.mark.parametrize("channels", [1, 5, 11, 22])
def test_row_path_gives_the_per_pixel_bits(mode, xs, pool_size, pads, channels):
    rng = np.random.default_rng(channels)
    wide = rng.standard_normal(xs).astype(np.float32)
    wide[0, 1, 2, :] = np.nan
    wide[0, 0, 0, ::3] = np.nan
    narrow = np.ascontiguousarray(wide[..., :channels])
    want = pool_forward(wide, pool_size, (1, 1), pads, True, mode)[..., :channels]
    got = pool_forward(narrow, pool_size, (1, 1), pads, True, mode)
    np.testing.assert_array_equal(got, want)
    call = pool.forward_call(narrow.shape, pool_size, (1, 1), pads, True, mode, np.float32)
    np.testing.assert_array_equal(call(narrow), want)


# Channels_last windows of fewer than 32 channels off the row path (strided,
# or 3-D) run in registers (_window_small): per channel the same bits as the
# per-pixel path, which a layer of 40 channels takes, NaNs and infinities
# included; the windows at the array's end, whose register reads would pass
# it, stay on the per-pixel path.
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("xs,pool_size,strides,pads", [
    ((2, 13, 11, 40), (3, 3), (2, 2), ((0, 0), (0, 0))),
    ((1, 9, 9, 40), (3, 3), (2, 2), ((1, 1), (1, 1))),
    ((3, 7, 8, 40), (2, 3), (2, 3), ((0, 1), (1, 1))),
    ((1, 5, 5, 40), (5, 5), (1, 2), ((2, 2), (2, 2))),
    ((1, 1, 9, 40), (1, 3), (1, 2), ((0, 0), (1, 1))),
])
@pytest.mark.parametrize("channels", [1, 3, 11, 16, 17, 22, 31])
def test_small_channel_windows_give_the_per_pixel_bits(dtype, mode, xs, pool_size, strides,
                                                        pads, channels):
    rng = np.random.default_rng(channels)
    wide = rng.standard_normal(xs).astype(dtype)
    wide[0, min(1, xs[1] - 1), 2, :] = np.nan
    wide[0, 0, 0, ::3] = np.nan
    wide[-1, -1, -1, ::2] = np.inf
    wide[-1, 0, -1, 1::2] = -np.inf
    narrow = np.ascontiguousarray(wide[..., :channels])
    want = pool_forward(wide, pool_size, strides, pads, True, mode)[..., :channels]
    got = pool_forward(narrow, pool_size, strides, pads, True, mode)
    np.testing.assert_array_equal(got, want)
    finite = np.nan_to_num(narrow, nan=0.0, posinf=7.0, neginf=-7.0)
    ref = ref_forward(finite, pool_size, strides, pads, True, mode)
    np.testing.assert_allclose(pool_forward(finite, pool_size, strides, pads, True, mode), ref,
                               rtol=1e-6, atol=1e-6)


# Channels_last float32 windows off the row and small-channel paths run in
# AVX-512 or AVX2 registers (include/cyback_pool.h): the bits of the
# baseline per-pixel path, NaNs, infinities and signed zeros included, for
# channel counts across the 64-channel chunks and partial windows.
@pytest.mark.parametrize("which", ["avx512", "avx2"])
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("xs,pool_size,strides,pads", [
    ((2, 9, 11), (3, 3), (1, 1), ((1, 1), (1, 1))),
    ((1, 13, 11), (3, 3), (2, 2), ((0, 0), (0, 0))),
    ((1, 7, 8), (2, 3), (2, 3), ((0, 1), (1, 1))),
    ((1, 5, 5), (5, 5), (1, 2), ((2, 2), (2, 2))),
    ((1, 4, 6, 5), (2, 3, 2), (1, 2, 1), ((1, 0), (1, 1), (0, 1))),
])
@pytest.mark.parametrize("channels", [64, 65, 88, 129, 176])
def test_vector_windows_give_the_baseline_bits(which, mode, xs, pool_size, strides, pads,
                                               channels):
    rng = np.random.default_rng(channels)
    x = rng.standard_normal(xs + (channels,)).astype(np.float32)
    x[0, 0, 0, ::3] = np.nan
    x[-1, -1, -1, ::2] = np.inf
    x[-1, 0, -1, 1::2] = -np.inf
    x[0, 1, 1, ::2] = 0.0
    x[0, 1, 2, ::2] = -0.0
    x[0, 2, 1, 1::2] = -0.0
    with instruction_set(pool, "baseline"):
        want = pool_forward(x, pool_size, strides, pads, True, mode)
    with instruction_set(pool, which):
        got = pool_forward(x, pool_size, strides, pads, True, mode)
        call = pool.forward_call(x.shape, pool_size, strides, pads, True, mode, np.float32)
        again = call(x)
    for y in (got, again):
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y, want)
        assert np.array_equal(np.signbit(y), np.signbit(want))
    finite = np.nan_to_num(x, nan=0.0, posinf=7.0, neginf=-7.0)
    with instruction_set(pool, which):
        np.testing.assert_allclose(pool_forward(finite, pool_size, strides, pads, True, mode),
                                   ref_forward(finite, pool_size, strides, pads, True, mode),
                                   rtol=1e-6, atol=1e-6)


# The channels_first max starts from each window's first cell, as the
# channels_last paths do: the same bits for NaN and infinite cells (a window
# of NaNs is NaN, never -inf).
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,pool_size,strides,pads", [
    ((2, 3, 7, 9), (3, 3), (2, 2), ((1, 1), (1, 1))),
    ((1, 2, 6, 6), (2, 2), (2, 2), ((0, 0), (0, 0))),
    ((1, 4, 5, 8), (1, 3), (1, 3), ((0, 0), (1, 1))),
    ((2, 2, 5, 5), (1, 1), (2, 2), ((0, 0), (0, 0))),
])
def test_channels_first_max_keeps_nans_as_channels_last_does(dtype, xs, pool_size, strides,
                                                               pads):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(xs).astype(dtype)
    x[0, 0, :2, :2] = np.nan
    x[..., ::3, 1::4] = np.nan
    x[-1, -1, -1, :] = -np.inf
    got = pool_forward(x, pool_size, strides, pads, False, 'max')
    last = pool_forward(np.ascontiguousarray(np.moveaxis(x, 1, -1)), pool_size, strides, pads,
                        True, 'max')
    np.testing.assert_array_equal(got, np.moveaxis(last, -1, 1))
    assert np.isnan(got[0, 0, 0, 0])
    assert not np.isneginf(got[np.isnan(got)]).any()
