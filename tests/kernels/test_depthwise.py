"""Depthwise convolution kernels against a slow NumPy reference."""
import zlib

import numpy as np
import pytest

from cyback.kernels import depthwise as dw_module
from cyback.kernels import runtime
from cyback.kernels.depthwise import (
    depthwise_backward_input,
    depthwise_backward_kernel,
    depthwise_forward,
)

from instruction_sets import instruction_set


def ref_forward(x, k, ss, ds, ps, cl):
    """Channels-last 2-D reference, float64: explicit zero padding + taps."""
    x = np.asarray(x, np.float64)
    if not cl:
        x = np.moveaxis(x, 1, -1)
    n, h, w, c = x.shape
    kh, kw, _, m = k.shape
    xp = np.zeros((n, h + ps[0][0] + ps[0][1], w + ps[1][0] + ps[1][1], c))
    xp[:, ps[0][0]:ps[0][0] + h, ps[1][0]:ps[1][0] + w] = x
    oh = (xp.shape[1] - (kh - 1) * ds[0] - 1) // ss[0] + 1
    ow = (xp.shape[2] - (kw - 1) * ds[1] - 1) // ss[1] + 1
    y = np.zeros((n, oh, ow, c, m))
    for i in range(oh):
        for j in range(ow):
            for a in range(kh):
                for b in range(kw):
                    pix = xp[:, i * ss[0] + a * ds[0], j * ss[1] + b * ds[1]]  # (n, c)
                    y[:, i, j] += pix[:, :, None] * k[a, b][None]
    y = y.reshape(n, oh, ow, c * m)
    return y if cl else np.moveaxis(y, -1, 1)


def numeric_grads(x, k, dy, ss, ds, ps, cl):
    """Gradients of sum(forward * dy) by linearity, via the reference."""
    x64, k64 = x.astype(np.float64), k.astype(np.float64)
    dx = np.zeros(x.shape)
    for idx in np.ndindex(*x.shape):
        e = np.zeros(x.shape)
        e[idx] = 1
        dx[idx] = np.sum(ref_forward(e, k64, ss, ds, ps, cl) * dy)
    dk = np.zeros(k.shape)
    for idx in np.ndindex(*k.shape):
        e = np.zeros(k.shape)
        e[idx] = 1
        dk[idx] = np.sum(ref_forward(x64, e, ss, ds, ps, cl) * dy)
    return dx, dk


def ref_grads(x, k, dy, ss, ds, ps, cl):
    """Direct adjoint loops (cheaper than numeric_grads; checked against it below)."""
    x64 = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    if not cl:
        x64 = np.moveaxis(x64, 1, -1)
        dy = np.moveaxis(dy, 1, -1)
    n, h, w, c = x64.shape
    kh, kw, _, m = k.shape
    xp = np.zeros((n, h + ps[0][0] + ps[0][1], w + ps[1][0] + ps[1][1], c))
    xp[:, ps[0][0]:ps[0][0] + h, ps[1][0]:ps[1][0] + w] = x64
    dxp = np.zeros_like(xp)
    dk = np.zeros(k.shape)
    g = dy.reshape(dy.shape[:3] + (c, m))
    for i in range(g.shape[1]):
        for j in range(g.shape[2]):
            for a in range(kh):
                for b in range(kw):
                    r, s = i * ss[0] + a * ds[0], j * ss[1] + b * ds[1]
                    dxp[:, r, s] += np.einsum('ncm,cm->nc', g[:, i, j], k[a, b])
                    dk[a, b] += np.einsum('ncm,nc->cm', g[:, i, j], xp[:, r, s])
    dx = dxp[:, ps[0][0]:ps[0][0] + h, ps[1][0]:ps[1][0] + w]
    return (dx if cl else np.moveaxis(dx, -1, 1)), dk


@pytest.fixture(params=["avx2", "baseline"])
def isa(request):
    """Each case runs with the AVX2 + FMA row kernels (where the CPU has them)
    and with the baseline vector ones."""
    with instruction_set(dw_module, request.param) as which:
        yield which


def tol(dtype):
    return dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)


def same_pads(size, k, s, d):
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return (total // 2, total - total // 2)


def run_case(rng, n, h, w, c, m, kh, kw, ss, ds, padding, cl, dtype, noncontig=False):
    if padding == 'same':
        ps = (same_pads(h, kh, ss[0], ds[0]), same_pads(w, kw, ss[1], ds[1]))
    else:
        ps = ((0, 0), (0, 0))
    shape = (n, h, w, c) if cl else (n, c, h, w)
    if noncontig:
        x = rng.standard_normal(shape[::-1]).astype(dtype).T  # reversed strides
        k = rng.standard_normal((kh, kw, c, m * 2)).astype(dtype)[..., ::2]
    else:
        x = rng.standard_normal(shape).astype(dtype)
        k = rng.standard_normal((kh, kw, c, m)).astype(dtype)
    y = depthwise_forward(x, k, ss, ds, ps, channels_last=cl)
    yr = ref_forward(x, k.astype(np.float64), ss, ds, ps, cl)
    assert y.shape == yr.shape and y.dtype == dtype
    np.testing.assert_allclose(y, yr, **tol(dtype))
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = depthwise_backward_input(dy, k, x.shape, ss, ds, ps, channels_last=cl)
    dk = depthwise_backward_kernel(x, dy, k.shape, ss, ds, ps, channels_last=cl)
    dxr, dkr = ref_grads(x, k.astype(np.float64), dy, ss, ds, ps, cl)
    np.testing.assert_allclose(dx, dxr, **tol(dtype))
    np.testing.assert_allclose(dk, dkr, **tol(dtype))


def test_reference_adjoint_is_right():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 5, 3))
    k = rng.standard_normal((2, 3, 3, 2))
    ss, ds, ps = (2, 1), (1, 2), ((1, 0), (1, 2))
    dy = rng.standard_normal(ref_forward(x, k, ss, ds, ps, True).shape)
    a = ref_grads(x, k, dy, ss, ds, ps, True)
    b = numeric_grads(x, k, dy, ss, ds, ps, True)
    np.testing.assert_allclose(a[0], b[0], atol=1e-10)
    np.testing.assert_allclose(a[1], b[1], atol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cl", [True, False])
@pytest.mark.parametrize("cfg", [
    # n, h, w, c, m, kh, kw, strides, dilation, padding
    (1, 7, 7, 3, 1, 3, 3, (1, 1), (1, 1), 'same'),
    (2, 8, 9, 4, 2, 3, 3, (2, 2), (1, 1), 'same'),
    (3, 6, 5, 5, 3, 2, 3, (1, 2), (1, 1), 'valid'),
    (2, 9, 8, 2, 1, 3, 2, (1, 1), (2, 3), 'same'),
    (1, 5, 11, 7, 1, 1, 5, (3, 2), (1, 1), 'valid'),
    (2, 4, 4, 33, 1, 3, 3, (1, 1), (1, 1), 'same'),
    # Rows long enough for the vector paths of the row kernels (4-pixel
    # blocks channels_last; two-vector, overlapping-last and scalar-tail
    # columns channels_first), channel counts with a vector tail, and depth
    # multipliers > 1 at stride 1 (expanded rows; flipped-kernel gradient,
    # summed over the multiplier: M = 2 and 3 here, M = 4 below).
    (2, 5, 37, 9, 1, 3, 3, (1, 1), (1, 1), 'same'),
    (1, 4, 19, 13, 2, 3, 3, (1, 1), (1, 1), 'same'),
    (2, 6, 23, 8, 3, 3, 3, (1, 1), (1, 2), 'same'),
    (1, 7, 21, 16, 2, 2, 5, (1, 1), (2, 1), 'valid'),
    (1, 3, 9, 24, 1, 3, 3, (1, 3), (1, 1), 'same'),
    # M = 4: its own sum over the multiplier in the input gradient.
    (2, 5, 17, 6, 4, 3, 3, (1, 1), (1, 1), 'same'),
])
def test_configs(isa, cfg, cl, dtype):
    rng = np.random.default_rng(zlib.crc32(repr(cfg).encode()))
    n, h, w, c, m, kh, kw, ss, ds, padding = cfg
    run_case(rng, n, h, w, c, m, kh, kw, ss, ds, padding, cl, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("w", [1, 3, 8, 13, 16, 21, 29, 35])
def test_channels_first_plane_blocks(isa, w, dtype):
    # channels_first planes run in blocks of 4, 2 and 1 output rows (3, 2 and
    # 1 for 3x3 at row stride 1 or 2 and unit row dilation; the heights below
    # leave each remainder) by pairs of vectors along the row;
    # the widths cover rows narrower than a vector (scalar), one and two
    # vectors, an overlapping last vector or pair, and the accumulating
    # input gradient of M > 1 (single vectors, then scalars). Kernel widths
    # 5 and 7 split the kernel gradient's taps into blocks of 4 + 1 and 4 + 3.
    # Stride 2 along the row splits padded rows into even and odd halves
    # (left pads 0 and 1, odd and even counts; strided input gradients).
    rng = np.random.default_rng(zlib.crc32(repr((w, dtype)).encode()))
    for n, h, c, m, kh, kw, ss, ds, padding in [
            (2, 7, 3, 1, 3, 3, (1, 1), (1, 1), 'same'),
            (1, 6, 2, 2, 3, 3, (1, 1), (1, 1), 'same'),
            (1, 9, 2, 1, 3, 5, (2, 1), (1, 2), 'same'),
            (2, 5, 1, 3, 2, 7, (1, 1), (2, 1), 'same'),
            (1, 5, 2, 2, 3, 3, (2, 2), (1, 1), 'same'),
            (1, 4, 2, 1, 3, 3, (1, 2), (1, 1), 'valid'),
            (1, 8, 2, 1, 3, 1, (1, 1), (1, 1), 'valid'),
            (1, 10, 2, 1, 3, 3, (1, 1), (1, 2), 'same'),
            (1, 8, 2, 1, 3, 3, (1, 2), (1, 1), 'valid')]:
        if padding == 'same' or w >= (kw - 1) * ds[1] + 1:
            run_case(rng, n, h, w, c, m, kh, kw, ss, ds, padding, False, dtype)


def test_random_noncontiguous(isa):
    rng = np.random.default_rng(1)
    for _ in range(20):
        kh, kw = (int(v) for v in rng.integers(1, 4, 2))
        ss = tuple(int(v) for v in rng.integers(1, 3, 2))
        ds = tuple(int(v) for v in rng.integers(1, 3, 2))
        h = int((kh - 1) * ds[0] + 1 + rng.integers(0, 5))
        w = int((kw - 1) * ds[1] + 1 + rng.integers(0, 5))
        run_case(rng, int(rng.integers(1, 4)), h, w, int(rng.integers(1, 9)),
                 int(rng.integers(1, 4)), kh, kw, ss, ds, ['same', 'valid'][rng.integers(2)],
                 bool(rng.integers(2)), [np.float32, np.float64][rng.integers(2)],
                 noncontig=True)


@pytest.mark.parametrize("cl", [True, False])
def test_1d_matches_2d_height_one(cl):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 10, 4) if cl else (2, 4, 10))
    k = rng.standard_normal((3, 4, 2))
    x2 = x[:, None] if cl else x[:, :, None]
    y = depthwise_forward(x, k, 2, 1, ((1, 1),), channels_last=cl)
    y2 = depthwise_forward(x2, k[None], (1, 2), 1, ((0, 0), (1, 1)), channels_last=cl)
    np.testing.assert_allclose(y, y2[:, 0] if cl else y2[:, :, 0])
    dy = rng.standard_normal(y.shape)
    dy2 = dy[:, None] if cl else dy[:, :, None]
    dx = depthwise_backward_input(dy, k, x.shape, 2, 1, ((1, 1),), channels_last=cl)
    dx2 = depthwise_backward_input(dy2, k[None], x2.shape, (1, 2), 1, ((0, 0), (1, 1)), cl)
    np.testing.assert_allclose(dx, dx2.reshape(dx.shape))
    dk = depthwise_backward_kernel(x, dy, k.shape, 2, 1, ((1, 1),), channels_last=cl)
    dk2 = depthwise_backward_kernel(x2, dy2, (1,) + k.shape, (1, 2), 1, ((0, 0), (1, 1)), cl)
    np.testing.assert_allclose(dk, dk2[0])


@pytest.mark.parametrize("cl", [True, False])
def test_thread_count_invariant(isa, cl):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 17, 15, 40) if cl else (3, 40, 17, 15)).astype(np.float32)
    k = rng.standard_normal((3, 3, 40, 1)).astype(np.float32)
    ps = ((1, 1), (1, 1))
    old = runtime.get_max_threads()
    res = []
    try:
        for nt in (1, 2, 3):
            runtime.set_num_threads(nt)
            y = depthwise_forward(x, k, 1, 1, ps, cl)
            res.append((y, depthwise_backward_input(y, k, x.shape, 1, 1, ps, cl),
                        depthwise_backward_kernel(x, y, k.shape, 1, 1, ps, cl)))
    finally:
        runtime.set_num_threads(old)
    for r in res[1:]:
        for a, b in zip(res[0], r):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cl", [True, False])
def test_empty_batch(cl):
    x = np.zeros((0, 5, 5, 3), np.float32)
    if not cl:
        x = x.transpose(0, 3, 1, 2)
    k = np.ones((3, 3, 3, 2), np.float32)
    ps = ((1, 1), (1, 1))
    y = depthwise_forward(x, k, 1, 1, ps, cl)
    assert y.shape == ((0, 5, 5, 6) if cl else (0, 6, 5, 5))
    assert depthwise_backward_input(y, k, x.shape, 1, 1, ps, cl).shape == x.shape
    dk = depthwise_backward_kernel(x, y, k.shape, 1, 1, ps, cl)
    assert dk.shape == k.shape and np.all(dk == 0)


def test_bad_arguments():
    x = np.zeros((2, 5, 5, 3), np.float32)
    k = np.zeros((3, 3, 3, 1), np.float32)
    p = ((0, 0), (0, 0))
    with pytest.raises(TypeError, match="float32 or float64"):
        depthwise_forward(x.astype(int), k.astype(int), 1, 1, p)
    with pytest.raises(TypeError, match="mismatch"):
        depthwise_forward(x, k.astype(np.float64), 1, 1, p)
    with pytest.raises(ValueError, match="input channels"):
        depthwise_forward(x, np.zeros((3, 3, 4, 1), np.float32), 1, 1, p)
    with pytest.raises(ValueError, match="kernel must be"):
        depthwise_forward(x, np.zeros((3, 3, 3), np.float32), 1, 1, p)
    with pytest.raises(ValueError, match="strides"):
        depthwise_forward(x, k, 0, 1, p)
    with pytest.raises(ValueError, match="pads"):
        depthwise_forward(x, k, 1, 1, ((0, 0),))
    with pytest.raises(ValueError, match="larger"):
        depthwise_forward(x, np.zeros((7, 3, 3, 1), np.float32), 1, 1, p)
    with pytest.raises(ValueError, match="expected a 3-D"):
        depthwise_forward(np.zeros((5, 3), np.float32), k, 1, 1, p)
    y = depthwise_forward(x, k, 1, 1, p)
    with pytest.raises(ValueError, match="dy has shape"):
        depthwise_backward_input(y[:, :2], k, x.shape, 1, 1, p)
    with pytest.raises(ValueError, match="dy has shape"):
        depthwise_backward_kernel(x, y[:1], k.shape, 1, 1, p)


@pytest.mark.parametrize("cl", [True, False])
def test_stride1_pads_beyond_kernel(isa, cl):
    # Pads wider than the kernel span: outputs that read only padding, and a
    # stride-1 input gradient that cannot be the flipped-kernel forward pass.
    rng = np.random.default_rng(5)
    for ps in (((3, 0), (4, 1)), ((0, 2), (1, 3))):
        x = rng.standard_normal((2, 4, 6, 10) if cl else (2, 10, 4, 6))
        k = rng.standard_normal((2, 3, 10, 2))
        y = depthwise_forward(x, k, 1, 1, ps, cl)
        np.testing.assert_allclose(y, ref_forward(x, k, (1, 1), (1, 1), ps, cl), atol=1e-12)
        dy = rng.standard_normal(y.shape)
        dxr, dkr = ref_grads(x, k, dy, (1, 1), (1, 1), ps, cl)
        np.testing.assert_allclose(depthwise_backward_input(dy, k, x.shape, 1, 1, ps, cl), dxr,
                                   atol=1e-12)
        np.testing.assert_allclose(depthwise_backward_kernel(x, dy, k.shape, 1, 1, ps, cl), dkr,
                                   atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw,sw,dw", [(5, 1, 1), (7, 1, 1), (5, 2, 1), (7, 2, 1), (3, 2, 1),
                                      (3, 3, 1), (5, 1, 2), (3, 1, 3)])
def test_channels_last_rows_of_every_width(isa, kw, sw, dw, dtype):
    # Rows of 1 to 26 outputs: interior blocks of eight and four pixels, the
    # edge pixels in groups of up to four, rows with no interior at all, and
    # pads up to past the kernel's span; channels below, at and past a vector.
    rng = np.random.default_rng(kw * 100 + sw * 10 + dw)
    span = (kw - 1) * dw + 1
    for w in range(1, 27, 1 if dtype == np.float32 else 5):
        for c in (3, 13, 44):
            for pl, pr in ((span // 2, span - 1 - span // 2), (span - 1, 0), (span + 1, 2)):
                if (w + pl + pr - span) // sw + 1 < 1:
                    continue
                x = rng.standard_normal((2, 3, w, c)).astype(dtype)
                k = rng.standard_normal((2, kw, c, 1)).astype(dtype)
                b = rng.standard_normal(c).astype(dtype)
                ps = ((1, 0), (pl, pr))
                y = depthwise_forward(x, k, (1, sw), (1, dw), ps, True, bias=b, activation="relu")
                yr = np.maximum(ref_forward(x, k, (1, sw), (1, dw), ps, True) + b, 0)
                np.testing.assert_allclose(y, yr, **tol(dtype))


@pytest.mark.parametrize("activation", [None, "linear", "relu", "relu6"])
@pytest.mark.parametrize("cl", [True, False])
def test_bias_and_activation_epilogue(isa, cl, activation):
    # The fused epilogue equals bias + activation applied afterwards, on the
    # vector and scalar paths (stride 1 and 2, channel tails, M > 1, rows
    # read in place and staged).
    rng = np.random.default_rng(6)
    for dtype, (n, h, w, c, m, ss) in [(np.float32, (2, 5, 19, 11, 1, (1, 1))),
                                       (np.float64, (1, 6, 9, 5, 3, (2, 2))),
                                       (np.float32, (2, 4, 21, 8, 2, (1, 2))),
                                       (np.float32, (1, 4, 13, 67, 1, (1, 1)))]:
        x = (3 * rng.standard_normal((n, h, w, c) if cl else (n, c, h, w))).astype(dtype)
        k = rng.standard_normal((3, 3, c, m)).astype(dtype)
        b = (3 * rng.standard_normal(c * m)).astype(dtype)
        ps = ((1, 1), (1, 1))
        plain = depthwise_forward(x, k, ss, 1, ps, cl)
        want = plain + (b if cl else b[:, None, None])
        if activation in ("relu", "relu6"):
            want = np.maximum(want, 0)
        if activation == "relu6":
            want = np.minimum(want, 6)
        got = depthwise_forward(x, k, ss, 1, ps, cl, bias=b, activation=activation)
        np.testing.assert_allclose(got, want, **tol(dtype))
    # The default epilogue is none: the same bits as before.
    np.testing.assert_array_equal(depthwise_forward(x, k, ss, 1, ps, cl, bias=None), plain)


@pytest.mark.parametrize("cl", [True, False])
def test_empty_rows_read_only_padding(cl):
    # H == 0 with padding: every output reads only padding, so it is the bias.
    x = np.zeros((2, 0, 4, 3) if cl else (2, 3, 0, 4), np.float32)
    k = np.ones((3, 3, 3, 2), np.float32)
    b = np.arange(6, dtype=np.float32)
    y = depthwise_forward(x, k, 1, 1, ((2, 2), (1, 1)), cl, bias=b)
    assert y.shape == ((2, 2, 4, 6) if cl else (2, 6, 2, 4))
    np.testing.assert_array_equal(y, np.broadcast_to(b if cl else b[:, None, None], y.shape))


def test_bad_epilogue_arguments():
    x = np.zeros((2, 5, 5, 3), np.float32)
    k = np.zeros((3, 3, 3, 2), np.float32)
    p = ((1, 1), (1, 1))
    with pytest.raises(ValueError, match="depthwise_forward: activation"):
        depthwise_forward(x, k, 1, 1, p, activation="tanh")
    with pytest.raises(ValueError, match="depthwise_forward: bias"):
        depthwise_forward(x, k, 1, 1, p, bias=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="depthwise_forward: bias"):
        depthwise_forward(x, k, 1, 1, p, bias=np.zeros(6, np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_3x3_row_reuse_equals_general_tiles(isa, dtype):
    # The row-reuse tiles sum each output's taps in the general tiles' order:
    # the same bits, forward (bias, relu) and input gradient (M > 1 sums
    # into its planes), over heights leaving each remainder of 3 rows,
    # rows with vector tails, column dilation, stride 2 along the row, row
    # stride 2 (and the unit-stride pass of its input gradient). The first
    # case's "same" planes are read in place (cb_depthwise_fwd_cf_same3), which
    # the switch turns off with the row-reuse tiles.
    rng = np.random.default_rng(zlib.crc32(repr(dtype).encode()))
    for h, w, m, ss, ds, ps in [(9, 40, 1, (1, 1), (1, 1), ((1, 1), (1, 1))),
                                (7, 33, 2, (1, 1), (1, 2), ((1, 1), (2, 2))),
                                (8, 21, 3, (1, 2), (1, 1), ((0, 0), (1, 0))),
                                (11, 26, 1, (2, 2), (1, 1), ((1, 1), (1, 1))),
                                (14, 19, 2, (2, 1), (1, 1), ((0, 1), (1, 1))),
                                (5, 17, 2, (1, 1), (1, 1), ((0, 0), (0, 0)))]:
        x = rng.standard_normal((2, 3, h, w)).astype(dtype)
        k = rng.standard_normal((3, 3, 3, m)).astype(dtype)
        b = rng.standard_normal(3 * m).astype(dtype)
        got = []
        try:
            for on in (True, False):
                dw_module._use_k3(on)
                y = depthwise_forward(x, k, ss, ds, ps, False, bias=b, activation="relu")
                dx = depthwise_backward_input(y, k, x.shape, ss, ds, ps, False)
                got.append((y, dx))
        finally:
            dw_module._use_k3(True)
        np.testing.assert_array_equal(got[0][0], got[1][0])
        np.testing.assert_array_equal(got[0][1], got[1][1])
        want = np.maximum(ref_forward(x, k.astype(np.float64), ss, ds, ps, False)
                          + b[:, None, None], 0)
        np.testing.assert_allclose(got[0][0], want, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same3_planes_read_edges_as_padded_planes(isa, dtype):
    # channels_first 3x3 "same" planes at stride 1 are read in place, their
    # edges by shuffles and a zero row; they must give the bits of the
    # padded planes, forward (bias, relu6) and input gradient, over heights
    # with every remainder of 3 rows (and too few rows), widths under, at and
    # between vector widths (tiles overlapping at either end), M = 2 (whose
    # input gradient accumulates through the padded planes), and the
    # reference values.
    rng = np.random.default_rng(zlib.crc32(repr(dtype).encode()) + 3)
    for h in (1, 2, 3, 4, 5, 7):
        for w in (1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 24, 31, 32, 33, 40, 47, 49, 56, 65):
            for m in (1, 2):
                x = rng.standard_normal((2, 3, h, w)).astype(dtype)
                k = rng.standard_normal((3, 3, 3, m)).astype(dtype)
                b = rng.standard_normal(3 * m).astype(dtype)
                ps = ((1, 1), (1, 1))
                got = []
                try:
                    for on in (True, False):
                        dw_module._read_edges(on)
                        y = depthwise_forward(x, k, 1, 1, ps, False, bias=b, activation="relu6")
                        dx = depthwise_backward_input(y, k, x.shape, 1, 1, ps, False)
                        got.append((y, dx))
                finally:
                    dw_module._read_edges(True)
                np.testing.assert_array_equal(got[0][0], got[1][0])
                np.testing.assert_array_equal(got[0][1], got[1][1])
                want = np.clip(ref_forward(x, k.astype(np.float64), (1, 1), (1, 1), ps, False)
                               + b[:, None, None], 0, 6)
                np.testing.assert_allclose(got[0][0], want, **tol(dtype))
                want_dx, _ = ref_grads(x, k, got[0][0], (1, 1), (1, 1), ps, False)
                np.testing.assert_allclose(got[0][1], want_dx, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_3tap_column_reuse_equals_general_tiles(isa, dtype):
    # channels_last rows of 3-tap stride-1 kernels run in blocks of 8 pixels
    # that load each input column once; they sum each output's taps in the
    # general tiles' order: the same bits (bias, relu6), over every row width
    # to 26 (blocks of 8, the last one overlapping; blocks at the edges that
    # read one padding column, on either side or both; wider padding pixel by
    # pixel), channel tails, M > 1 and 'valid' rows; and the reference values.
    rng = np.random.default_rng(zlib.crc32(repr(dtype).encode()))
    for w in range(1, 27):
        for c, m, ps in [(8, 1, ((1, 1), (1, 1))), (11, 1, ((0, 2), (1, 1))),
                         (16, 2, ((1, 1), (1, 1))), (5, 1, ((0, 0), (0, 0))),
                         (8, 1, ((1, 1), (2, 2))), (8, 1, ((1, 1), (0, 1))),
                         (8, 1, ((1, 1), (1, 0)))]:
            if w + sum(ps[1]) < 3:
                continue
            x = (2 * rng.standard_normal((1, 4, w, c))).astype(dtype)
            k = rng.standard_normal((3, 3, c, m)).astype(dtype)
            b = rng.standard_normal(c * m).astype(dtype)
            got = []
            try:
                for on in (True, False):
                    dw_module._use_k3(on)
                    got.append(depthwise_forward(x, k, 1, 1, ps, True, bias=b,
                                                 activation="relu6"))
            finally:
                dw_module._use_k3(True)
            np.testing.assert_array_equal(got[0], got[1])
            want = np.clip(ref_forward(x, k.astype(np.float64), (1, 1), (1, 1), ps, True) + b,
                           0, 6)
            np.testing.assert_allclose(got[0], want, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_staged_rows_equal_rows_read_in_place(isa, dtype):
    # channels_last rows of 256 bytes a pixel or more are staged per thread
    # with their zero columns, and rows whose pixels are a multiple of 1 kB
    # apart with one more cache line a pixel (the kernel gradient stages only
    # those). The forward pass and both gradients give the bits of rows read
    # in place and the reference values, over strides, dilations, wide and
    # one-sided pads, channel tails, M > 1, several samples and 1 to 3
    # threads (a thread reuses its staged rows across its output rows).
    wide = 256 // np.dtype(dtype).itemsize
    kb = 1024 // np.dtype(dtype).itemsize
    rng = np.random.default_rng(zlib.crc32(repr(dtype).encode()))
    old = runtime.get_max_threads()
    for n, h, w, c, m, kh, kw, ss, ds, ps in [
            (2, 5, 11, wide, 1, 3, 3, (1, 1), (1, 1), ((1, 1), (1, 1))),
            (2, 5, 11, wide + 3, 1, 3, 3, (1, 1), (1, 1), ((1, 1), (2, 2))),
            (1, 6, 9, wide // 2, 2, 3, 3, (2, 2), (1, 1), ((0, 1), (0, 1))),
            (1, 4, 7, kb, 1, 3, 3, (1, 1), (1, 1), ((0, 0), (0, 0))),
            (2, 4, 13, kb, 1, 3, 3, (1, 1), (1, 1), ((1, 1), (1, 1))),
            (3, 7, 10, wide + 1, 1, 5, 3, (1, 2), (2, 1), ((2, 2), (1, 1))),
            (1, 3, 12, kb // 2, 2, 1, 3, (1, 1), (1, 2), ((0, 0), (2, 2)))]:
        x = rng.standard_normal((n, h, w, c)).astype(dtype)
        k = rng.standard_normal((kh, kw, c, m)).astype(dtype)
        got = []
        try:
            for stage, nt in [(True, 1), (True, 2), (True, 3), (False, 2)]:
                dw_module._stage_rows(stage)
                runtime.set_num_threads(nt)
                y = depthwise_forward(x, k, ss, ds, ps, True)
                got.append((y, depthwise_backward_input(y, k, x.shape, ss, ds, ps, True),
                            depthwise_backward_kernel(x, y, k.shape, ss, ds, ps, True)))
        finally:
            dw_module._stage_rows(True)
            runtime.set_num_threads(old)
        for r in got[1:]:
            for a, b in zip(r, got[0]):
                np.testing.assert_array_equal(a, b)
        y, dx, dk = got[0]
        np.testing.assert_allclose(y, ref_forward(x, k.astype(np.float64), ss, ds, ps, True),
                                   **tol(dtype))
        dxr, dkr = ref_grads(x, k.astype(np.float64), y.astype(np.float64), ss, ds, ps, True)
        np.testing.assert_allclose(dx, dxr, **tol(dtype))
        np.testing.assert_allclose(dk, dkr, rtol=tol(dtype)["rtol"], atol=10 * tol(dtype)["atol"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_narrow_channels_first_rows_equal_plane_kernels(isa, dtype):
    # channels_first planes with rows under 8 outputs (M == 1) run through
    # the channels_last row kernel in blocks of 256 bytes of channels: the
    # same bits as the plane kernels (rows read in place), over strides,
    # dilations, pads, a tail block, bias + relu6, batch 1 and several
    # samples and threads; and the reference values. The input gradient at
    # stride 1 is that forward pass with the flipped kernel (dilated, pads
    # past the kernel's span after); the kernel gradient runs the
    # channels_last gradient rows a block of channels at a time from 4
    # blocks on, else the whole arrays transposed, as does the strided
    # input gradient: the same bits on 1 and 2 threads, and the reference
    # values.
    wide = 256 // np.dtype(dtype).itemsize
    rng = np.random.default_rng(zlib.crc32(repr(dtype).encode()) + 1)
    old = runtime.get_max_threads()
    for n, c, h, w, kh, kw, ss, ds, ps in [
            (2, wide + 6, 7, 7, 3, 3, (1, 1), (1, 1), ((1, 1), (1, 1))),
            (1, 2 * wide + 1, 4, 5, 3, 3, (2, 2), (1, 1), ((1, 1), (1, 0))),
            (3, 5, 6, 9, 2, 3, (1, 2), (2, 1), ((0, 1), (2, 2))),
            (1, wide, 3, 4, 1, 5, (1, 1), (1, 1), ((0, 0), (2, 2))),
            (2, 7, 5, 6, 3, 2, (1, 1), (2, 1), ((2, 1), (1, 0))),
            (1, 9, 5, 6, 3, 3, (1, 1), (1, 1), ((1, 1), (0, 3))),
            (2, 4 * wide + 3, 3, 5, 3, 3, (1, 1), (1, 1), ((1, 1), (1, 1)))]:
        x = rng.standard_normal((n, c, h, w)).astype(dtype)
        k = rng.standard_normal((kh, kw, c, 1)).astype(dtype)
        b = rng.standard_normal(c).astype(dtype)
        got = []
        try:
            for stage, nt in [(True, 1), (True, 2), (False, 2)]:
                dw_module._stage_rows(stage)
                runtime.set_num_threads(nt)
                y = depthwise_forward(x, k, ss, ds, ps, False, bias=b, activation="relu6")
                got.append((y, depthwise_backward_input(y, k, x.shape, ss, ds, ps, False),
                            depthwise_backward_kernel(x, y, k.shape, ss, ds, ps, False)))
        finally:
            dw_module._stage_rows(True)
            runtime.set_num_threads(old)
        y, dx, dk = got[0]
        assert y.shape[3] < 8
        for r in got[1:]:
            np.testing.assert_array_equal(r[0], y)
        np.testing.assert_array_equal(got[1][1], dx)
        np.testing.assert_array_equal(got[1][2], dk)
        want = np.clip(ref_forward(x, k.astype(np.float64), ss, ds, ps, False)
                       + b[:, None, None], 0, 6)
        np.testing.assert_allclose(y, want, **tol(dtype))
        dxr, dkr = ref_grads(x, k.astype(np.float64), y.astype(np.float64), ss, ds, ps, False)
        np.testing.assert_allclose(dx, dxr, **tol(dtype))
        np.testing.assert_allclose(dk, dkr, rtol=tol(dtype)["rtol"], atol=10 * tol(dtype)["atol"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prefetching_the_next_rows_changes_no_bits(isa, dtype):
    # The channels_last forward, stride-1 input gradient and kernel gradient
    # ask for the next output row's rows while a row computes (from 16 MB of
    # data and 8 kB rows; here from any size): the same bits as without, the
    # reference values, over strides, dilations, pads, M > 1, a thread's
    # last row of a sample and of the call, and 1 to 3 threads.
    rng = np.random.default_rng(zlib.crc32(b"prefetch" + repr(dtype).encode()))
    old_threads = runtime.get_max_threads()
    for n, h, w, c, m, kh, kw, ss, ds, ps in [
            (2, 9, 12, 24, 1, 3, 3, (1, 1), (1, 1), ((1, 1), (1, 1))),
            (3, 8, 11, 70, 1, 3, 3, (2, 2), (1, 1), ((1, 1), (1, 1))),
            (2, 10, 9, 16, 2, 3, 3, (1, 1), (2, 2), ((2, 2), (2, 2))),
            (1, 7, 16, 8, 1, 5, 3, (3, 1), (1, 1), ((0, 2), (1, 1)))]:
        x = rng.standard_normal((n, h, w, c)).astype(dtype)
        k = rng.standard_normal((kh, kw, c, m)).astype(dtype)
        got = []
        old = dw_module._use_prefetch(True, 0, 0)
        try:
            for on, nt in [(False, 1), (True, 1), (True, 2), (True, 3)]:
                dw_module._use_prefetch(on)
                runtime.set_num_threads(nt)
                y = depthwise_forward(x, k, ss, ds, ps, True, activation="relu")
                got.append((y, depthwise_backward_input(y, k, x.shape, ss, ds, ps, True),
                            depthwise_backward_kernel(x, y, k.shape, ss, ds, ps, True)))
        finally:
            dw_module._use_prefetch(*old)
            runtime.set_num_threads(old_threads)
        for r in got[1:]:
            for a, b in zip(r, got[0]):
                np.testing.assert_array_equal(a, b)
        y, dx, dk = got[0]
        ref = np.maximum(ref_forward(x, k.astype(np.float64), ss, ds, ps, True), 0)
        np.testing.assert_allclose(y, ref, **tol(dtype))
        dxr, dkr = ref_grads(x, k.astype(np.float64), y.astype(np.float64), ss, ds, ps, True)
        np.testing.assert_allclose(dx, dxr, **tol(dtype))
        np.testing.assert_allclose(dk, dkr, rtol=tol(dtype)["rtol"], atol=10 * tol(dtype)["atol"])


@pytest.mark.parametrize("cl", [True, False])
def test_long_rows_past_the_staging_budget(cl):
    # Rows whose staged copies would take more than a few MB per thread (a
    # long sequence; tall planes of a narrow channels_first call) are read in
    # place: the reference values, forward and both gradients.
    rng = np.random.default_rng(12)
    shape = (1, 1, 20000, 64) if cl else (1, 64, 3000, 4)
    x = rng.standard_normal(shape).astype(np.float32)
    k = rng.standard_normal((1, 3, 64, 1) if cl else (3, 3, 64, 1)).astype(np.float32)
    ps = ((0, 0), (1, 1)) if cl else ((1, 1), (1, 1))
    y = depthwise_forward(x, k, 1, 1, ps, cl)
    np.testing.assert_allclose(y, ref_forward(x, k.astype(np.float64), (1, 1), (1, 1), ps, cl),
                               **tol(np.float32))
    dx = depthwise_backward_input(y, k, x.shape, 1, 1, ps, cl)
    dk = depthwise_backward_kernel(x, y, k.shape, 1, 1, ps, cl)
    dxr, dkr = ref_grads(x, k.astype(np.float64), y.astype(np.float64), (1, 1), (1, 1), ps, cl)
    np.testing.assert_allclose(dx, dxr, **tol(np.float32))
    np.testing.assert_allclose(dk, dkr, rtol=1e-3, atol=1e-2)
