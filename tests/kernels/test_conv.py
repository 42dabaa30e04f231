"""Tests of the convolution kernels against slow NumPy references."""
import contextlib
import itertools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyback.kernels import conv, conv_utils
from cyback.kernels.runtime import (
    get_join_window,
    get_max_threads,
    set_join_window,
    set_num_threads,
)

from instruction_sets import instruction_set

# ---------------------------------------------------------------- references
# All references work channels_last on an explicitly zero-padded input: every
# kernel tap is one strided slice of the padded input.

def _tap_slices(taps, out, strides, dilation):
    return tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                 for t, o, s, d in zip(taps, out, strides, dilation))


def _out_shape(spatial, kshape, strides, dilation, pads):
    out = []
    for n, k, s, d, (a, b) in zip(spatial, kshape, strides, dilation, pads):
        ext = n + a + b - (k - 1) * d - 1
        out.append(ext // s + 1 if ext >= 0 else 0)
    return tuple(out)


def ref_forward(x, w, strides, dilation, pads):
    rank = x.ndim - 2
    xp = np.pad(x.astype(np.float64), [(0, 0)] + list(pads) + [(0, 0)])
    out = _out_shape(x.shape[1:-1], w.shape[:rank], strides, dilation, pads)
    y = np.zeros((x.shape[0],) + out + (w.shape[-1],))
    for taps in itertools.product(*[range(k) for k in w.shape[:rank]]):
        sl = _tap_slices(taps, out, strides, dilation)
        y += xp[(slice(None),) + sl] @ w[taps].astype(np.float64)
    return y


def ref_backward_input(dy, w, x_shape, strides, dilation, pads):
    rank = dy.ndim - 2
    padded = (x_shape[0],) + tuple(n + a + b for n, (a, b) in zip(x_shape[1:-1], pads)) \
        + (x_shape[-1],)
    dxp = np.zeros(padded)
    out = dy.shape[1:-1]
    for taps in itertools.product(*[range(k) for k in w.shape[:rank]]):
        sl = _tap_slices(taps, out, strides, dilation)
        dxp[(slice(None),) + sl] += dy.astype(np.float64) @ w[taps].astype(np.float64).T
    crop = tuple(slice(a, a + n) for n, (a, _) in zip(x_shape[1:-1], pads))
    return dxp[(slice(None),) + crop]


def ref_backward_kernel(x, dy, kshape, strides, dilation, pads):
    rank = x.ndim - 2
    xp = np.pad(x.astype(np.float64), [(0, 0)] + list(pads) + [(0, 0)])
    out = dy.shape[1:-1]
    dw = np.zeros(kshape)
    d2 = dy.reshape(-1, dy.shape[-1]).astype(np.float64)
    for taps in itertools.product(*[range(k) for k in kshape[:rank]]):
        sl = _tap_slices(taps, out, strides, dilation)
        patch = xp[(slice(None),) + sl].reshape(-1, x.shape[-1])
        dw[taps] = patch.T @ d2
    return dw


def ref_conv2d_transpose(x, w, out_hw, strides, pads):
    """Direct scatter: input pixel (i, j) spreads x[i, j] @ w[a, b].T onto
    output pixel (i*s - pad + a, j*s - pad + b). w is (kh, kw, out_c, in_c)."""
    n, h, wd, _ = x.shape
    kh, kw, oc, _ = w.shape
    y = np.zeros((n, out_hw[0], out_hw[1], oc))
    for i in range(h):
        for j in range(wd):
            for a in range(kh):
                for b in range(kw):
                    oi = i * strides[0] - pads[0][0] + a
                    oj = j * strides[1] - pads[1][0] + b
                    if 0 <= oi < out_hw[0] and 0 <= oj < out_hw[1]:
                        y[:, oi, oj, :] += x[:, i, j, :].astype(np.float64) @ w[a, b].T
    return y


def to_first(a):
    return np.moveaxis(a, -1, 1)


def to_last(a):
    return np.moveaxis(a, 1, -1)


def tol(dtype):
    return dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)


def check_all(rng, dtype, n, spatial, c, f, ksize, strides, dilation, pads, channels_last,
              noncontig=False):
    x = rng.standard_normal((n,) + tuple(spatial) + (c,)).astype(dtype)
    w = rng.standard_normal(tuple(ksize) + (c, f)).astype(dtype)
    y_ref = ref_forward(x, w, strides, dilation, pads)
    dy = rng.standard_normal(y_ref.shape).astype(dtype)
    dx_ref = ref_backward_input(dy, w, x.shape, strides, dilation, pads)
    dw_ref = ref_backward_kernel(x, dy, w.shape, strides, dilation, pads)
    xin, dyin = (x, dy) if channels_last else (to_first(x), to_first(dy))
    win = w
    if noncontig:
        # Strided views of bigger arrays, not just transposes.
        big = np.zeros(xin.shape[:-1] + (2 * xin.shape[-1],), dtype)
        big[..., ::2] = xin
        xin = big[..., ::2]
        winbig = np.zeros(w.shape[:-1] + (2 * f,), dtype)
        winbig[..., 1::2] = w
        win = winbig[..., 1::2]
        dyin = np.asfortranarray(dyin)
    y = conv.conv_forward(xin, win, strides, dilation, pads, channels_last=channels_last)
    assert y.dtype == dtype
    xshape = xin.shape
    dx = conv.conv_backward_input(dyin, win, xshape, strides, dilation, pads,
                                  channels_last=channels_last)
    dw = conv.conv_backward_kernel(xin, dyin, w.shape, strides, dilation, pads,
                                   channels_last=channels_last)
    if not channels_last:
        y, dx = to_last(y), to_last(dx)
    np.testing.assert_allclose(y, y_ref, **tol(dtype))
    np.testing.assert_allclose(dx, dx_ref, **tol(dtype))
    scale = max(1.0, np.sqrt(n * np.prod(y_ref.shape[1:-1])))
    t = tol(dtype)
    np.testing.assert_allclose(dw, dw_ref, rtol=t["rtol"], atol=t["atol"] * scale)
    assert dx.shape == x.shape and dw.shape == w.shape


# ---------------------------------------------------------------- conv_utils

@pytest.mark.parametrize("size,k,s,d", [(7, 3, 1, 1), (7, 3, 2, 1), (8, 3, 2, 1), (10, 4, 3, 2),
                                        (5, 5, 1, 1), (1, 3, 2, 1), (9, 2, 2, 3)])
def test_conv_utils_matches_definition(size, k, s, d):
    span = (k - 1) * d + 1
    assert conv_utils.conv_output_length(size, k, s, d, "same") == -(-size // s)
    assert conv_utils.conv_output_length(size, k, s, d, "causal") == -(-size // s)
    want = max(-(-(size - span + 1) // s), 0)
    assert conv_utils.conv_output_length(size, k, s, d, "valid") == want
    for padding in ("valid", "same", "causal", "full"):
        a, b = conv_utils.conv_pads(size, k, s, d, padding)
        out = _out_shape((size,), (k,), (s,), (d,), [(a, b)])[0]
        assert out == conv_utils.conv_output_length(size, k, s, d, padding), padding
    assert conv_utils.conv_pads(size, k, 1, d, "causal") == (span - 1, 0)
    total = max((-(-size // s) - 1) * s + span - size, 0)
    assert conv_utils.conv_pads(size, k, s, d, "same") == (total // 2, total - total // 2)


def test_conv_utils_examples():
    # TensorFlow: 'same' on 5 with k=4, stride 1 pads (1, 2); stride 2 on 8, k=3: (0, 1).
    assert conv_utils.conv_pads(5, 4, 1, 1, "same") == (1, 2)
    assert conv_utils.conv_pads(8, 3, 2, 1, "same") == (0, 1)
    assert conv_utils.conv_output_length(None, 3, 1, 1, "same") is None
    assert conv_utils.deconv_output_length(7, 3, 2, "same") == 14
    assert conv_utils.deconv_output_length(7, 3, 2, "valid") == 15
    assert conv_utils.deconv_output_length(7, 3, 2, "valid", output_padding=1) == 16
    with pytest.raises(ValueError):
        conv_utils.conv_pads(5, 3, 1, 1, "reflect")
    with pytest.raises(ValueError):
        conv_utils.conv_output_length(5, 3, 0, 1, "same")


# ---------------------------------------------------------------- kernels

CASES = [
    # spatial, c, f, k, strides, dilation, pads
    ((9,), 3, 4, (3,), (1,), (1,), [(1, 1)]),
    ((11,), 2, 5, (4,), (2,), (1,), [(3, 0)]),
    ((13,), 4, 3, (3,), (1,), (2,), [(4, 0)]),
    ((7, 6), 3, 5, (3, 3), (1, 1), (1, 1), [(1, 1), (1, 1)]),
    ((9, 8), 2, 3, (3, 2), (2, 3), (1, 1), [(0, 1), (1, 0)]),
    ((8, 9), 3, 2, (2, 3), (1, 2), (2, 1), [(2, 0), (0, 2)]),
    ((10, 10), 3, 4, (5, 5), (3, 3), (1, 1), [(2, 2), (2, 2)]),
    ((5, 5), 4, 6, (1, 1), (1, 1), (1, 1), [(0, 0), (0, 0)]),   # pointwise GEMM path
    ((5, 6), 3, 4, (1, 1), (2, 2), (1, 1), [(0, 0), (0, 0)]),   # strided 1x1
    ((4, 5, 6), 2, 3, (3, 2, 3), (1, 2, 1), (1, 1, 2), [(1, 1), (0, 1), (2, 2)]),
    ((5, 4, 4), 3, 2, (2, 2, 2), (2, 2, 2), (1, 1, 1), [(0, 0), (0, 0), (0, 0)]),
    ((1, 6, 7), 2, 3, (1, 3, 3), (1, 1, 1), (1, 1, 1), [(0, 0), (1, 1), (1, 1)]),
    ((3, 3), 2, 2, (3, 3), (1, 1), (1, 1), [(0, 0), (0, 0)]),   # 1x1 output
    ((4, 4), 2, 2, (2, 2), (5, 5), (1, 1), [(0, 0), (0, 0)]),   # stride > kernel
]


@pytest.fixture(params=["direct", "im2col"])
def forward_path(request):
    """channels_last forwards through the direct kernel (the default for
    these channel counts, too few for Winograd) or through im2col + GEMM."""
    old = dict(conv._TUNE)
    conv._TUNE["direct"] = request.param == "direct"
    try:
        yield request.param
    finally:
        conv._TUNE.clear()
        conv._TUNE.update(old)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fixed_cases(forward_path, case, channels_last, dtype):
    spatial, c, f, k, s, d, p = CASES[case]
    rng = np.random.default_rng(case)
    for n in (1, 3):
        check_all(rng, dtype, n, spatial, c, f, k, s, d, p, channels_last)


@pytest.mark.parametrize("channels_last", [True, False])
def test_noncontiguous_inputs(channels_last):
    rng = np.random.default_rng(5)
    check_all(rng, np.float32, 2, (7, 6), 3, 4, (3, 3), (2, 1), (1, 1), [(1, 1), (1, 1)],
              channels_last, noncontig=True)
    check_all(rng, np.float64, 2, (5, 4, 6), 2, 3, (2, 3, 2), (1, 1, 2), (1, 1, 1),
              [(1, 0), (1, 1), (0, 1)], channels_last, noncontig=True)


@st.composite
def conv_configs(draw):
    rank = draw(st.integers(1, 3))
    ks, ss, ds, ps, sp = [], [], [], [], []
    for _ in range(rank):
        k = draw(st.integers(1, 4))
        s = draw(st.integers(1, 3))
        d = draw(st.integers(1, 2))
        span = (k - 1) * d + 1
        a = draw(st.integers(0, span))
        b = draw(st.integers(0, span))
        n = draw(st.integers(max(1, span - a - b), span + 6 if rank < 3 else span + 3))
        ks.append(k)
        ss.append(s)
        ds.append(d)
        ps.append((a, b))
        sp.append(n)
    return dict(n=draw(st.integers(1, 3)), spatial=tuple(sp), c=draw(st.integers(1, 5)),
                f=draw(st.integers(1, 5)), ksize=tuple(ks), strides=tuple(ss),
                dilation=tuple(ds), pads=ps, channels_last=draw(st.booleans()),
                dtype=draw(st.sampled_from([np.float32, np.float64])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_configs(), st.integers(0, 2 ** 31))
def test_random_configs(cfg, seed):
    check_all(np.random.default_rng(seed), **cfg)


def test_large_blocks_and_slabs():
    # Big enough for several patch blocks per sample and several slabs, so
    # both col2im phases and several kernel-gradient groups run.
    rng = np.random.default_rng(11)
    for cl in (True, False):
        check_all(rng, np.float32, 2, (40, 33), 16, 8, (3, 3), (1, 1), (1, 1),
                  [(1, 1), (1, 1)], cl)
        check_all(rng, np.float64, 1, (300,), 64, 8, (5,), (1,), (1,), [(4, 0)], cl)


@pytest.mark.parametrize("channels_last", [True, False])
def test_thread_count_does_not_change_results(channels_last):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 30, 29, 24)).astype(np.float32)
    if not channels_last:
        x = np.ascontiguousarray(to_first(x))
    nmax = get_max_threads()
    for kshape, args in [((3, 3, 24, 16), ((2, 1), (1, 1), [(1, 1), (0, 1)])),
                         ((3, 2, 24, 16), ((1, 1), (1, 2), [(1, 1), (1, 1)])),
                         ((1, 1, 24, 16), ((1, 1), (1, 1), [(0, 0), (0, 0)]))]:
        w = rng.standard_normal(kshape).astype(np.float32)
        results = []
        try:
            for nt in (1, 2):
                set_num_threads(nt)
                y = conv.conv_forward(x, w, *args, channels_last=channels_last)
                dx = conv.conv_backward_input(y, w, x.shape, *args, channels_last=channels_last)
                dw = conv.conv_backward_kernel(x, y, w.shape, *args, channels_last=channels_last)
                results.append((y, dx, dw))
        finally:
            set_num_threads(nmax)
        for a, b in zip(*results):
            assert np.array_equal(a, b), kshape


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv2d_transpose(padding, dtype):
    rng = np.random.default_rng(7)
    n, h, wd, cin, cout = 2, 5, 4, 3, 4
    strides, k = (2, 3), (3, 4)
    x = rng.standard_normal((n, h, wd, cin)).astype(dtype)
    w = rng.standard_normal(k + (cout, cin)).astype(dtype)  # Keras transpose layout
    minimal = [conv_utils.deconv_output_length(s, kk, st_, padding)
               for s, kk, st_ in zip((h, wd), k, strides)]
    # Minimal output, plus ones with extra rows/cols that receive nothing (or
    # where 'same' rounding allows them).
    extras = [(0, 0), (1, 1), (1, 2)] if padding == "valid" else [(0, 0), (-1, -2)]
    for e in extras:
        out_hw = (minimal[0] + e[0], minimal[1] + e[1])
        pads = [conv_utils.conv_pads(o, kk, st_, 1, padding)
                for o, kk, st_ in zip(out_hw, k, strides)]
        assert all(conv_utils.conv_output_length(o, kk, st_, 1, padding) == i
                   for o, kk, st_, i in zip(out_hw, k, strides, (h, wd)))
        ref = ref_conv2d_transpose(x, w, out_hw, strides, pads)
        for cl in (True, False):
            xin = x if cl else to_first(x)
            shape = (n,) + out_hw + (cout,) if cl else (n, cout) + out_hw
            y = conv.conv_backward_input(xin, w, shape, strides, (1, 1), pads, channels_last=cl)
            np.testing.assert_allclose(y if cl else to_last(y), ref, **tol(dtype))
        # Its gradients: w.r.t. x is a forward conv of dy, w.r.t. the kernel
        # is the kernel gradient with x and dy swapped.
        dy = rng.standard_normal(ref.shape).astype(dtype)
        gx = conv.conv_forward(dy, w, strides, (1, 1), pads)
        np.testing.assert_allclose(gx, ref_forward(dy, w, strides, (1, 1), pads), **tol(dtype))
        gw = conv.conv_backward_kernel(dy, x, w.shape, strides, (1, 1), pads)
        np.testing.assert_allclose(np.sum(gx * x), np.sum(dy * ref), rtol=1e-4)
        np.testing.assert_allclose(np.vdot(gw, w), np.sum(dy * ref), rtol=1e-4)


def test_conv3d_transpose_stride2_same():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 3, 4, 3, 2))
    w = rng.standard_normal((3, 3, 2, 5, 2))
    out = (6, 8, 6)
    pads = [conv_utils.conv_pads(o, k, 2, 1, "same") for o, k in zip(out, w.shape[:3])]
    y = conv.conv_backward_input(x, w, (1,) + out + (5,), (2, 2, 2), (1, 1, 1), pads)
    # Adjoint identity with the (independently checked) forward reference.
    z = rng.standard_normal(y.shape)
    np.testing.assert_allclose(np.sum(y * z),
                               np.sum(ref_forward(z, w, (2, 2, 2), (1, 1, 1), pads) * x))


def test_empty_and_degenerate():
    x = np.zeros((0, 5, 5, 3), np.float32)
    w = np.ones((3, 3, 3, 4), np.float32)
    assert conv.conv_forward(x, w, (1, 1), (1, 1), [(1, 1), (1, 1)]).shape == (0, 5, 5, 4)
    dx = conv.conv_backward_input(np.zeros((0, 5, 5, 4), np.float32), w, x.shape, (1, 1),
                                  (1, 1), [(1, 1), (1, 1)])
    assert dx.shape == x.shape
    dw = conv.conv_backward_kernel(x, np.zeros((0, 5, 5, 4), np.float32), w.shape, (1, 1),
                                   (1, 1), [(1, 1), (1, 1)])
    assert dw.shape == w.shape and not dw.any()
    # Window larger than the input: empty output.
    y = conv.conv_forward(np.ones((2, 2, 2, 3), np.float32), w, (1, 1), (1, 1), [(0, 0), (0, 0)])
    assert y.shape == (2, 0, 0, 4)
    # Zero input channels: zeros.
    y = conv.conv_forward(np.ones((2, 4, 4, 0)), np.ones((3, 3, 0, 2)), (1, 1), (1, 1),
                          [(0, 0), (0, 0)])
    assert y.shape == (2, 2, 2, 2) and not y.any()


def test_float16_and_out():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 5, 3)).astype(np.float16)
    w = rng.standard_normal((2, 2, 3, 4)).astype(np.float16)
    y = conv.conv_forward(x, w, (1, 1), (1, 1), [(0, 1), (1, 0)])
    assert y.dtype == np.float16
    np.testing.assert_allclose(y, ref_forward(x, w, (1, 1), (1, 1), [(0, 1), (1, 0)]),
                               rtol=1e-2, atol=1e-2)
    out = np.empty((2, 6, 5, 4), np.float64)
    r = conv.conv_forward(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1),
                          [(0, 1), (1, 0)], out=out)
    assert r is out
    np.testing.assert_allclose(out, y.astype(np.float64), rtol=1e-2, atol=1e-2)
    for strides in ((1, 1), (2, 1)):
        pads = [(0, 1), (1, 0)]
        y = conv.conv_forward(x, w, strides, (1, 1), pads)
        dx = conv.conv_backward_input(y, w, x.shape, strides, (1, 1), pads)
        dw = conv.conv_backward_kernel(x, y, w.shape, strides, (1, 1), pads)
        assert dx.dtype == dw.dtype == np.float16
        np.testing.assert_allclose(dx, ref_backward_input(y, w, x.shape, strides, (1, 1), pads),
                                   rtol=2e-2, atol=5e-2)
        np.testing.assert_allclose(dw, ref_backward_kernel(x, y, w.shape, strides, (1, 1), pads),
                                   rtol=2e-2, atol=2e-1)


def test_bad_arguments():
    x = np.ones((2, 5, 5, 3), np.float32)
    w = np.ones((3, 3, 3, 4), np.float32)
    p = [(1, 1), (1, 1)]
    with pytest.raises(TypeError):
        conv.conv_forward(x, w.astype(np.float64), (1, 1), (1, 1), p)
    with pytest.raises(TypeError):
        conv.conv_forward(x.astype(np.int32), w.astype(np.int32), (1, 1), (1, 1), p)
    with pytest.raises(ValueError, match="input channels"):
        conv.conv_forward(x, np.ones((3, 3, 2, 4), np.float32), (1, 1), (1, 1), p)
    with pytest.raises(ValueError):
        conv.conv_forward(x, np.ones((3, 3, 4), np.float32), (1, 1), (1, 1), p)
    # one image without its batch axis: the message says so
    with pytest.raises(ValueError, match=r"the input \(5, 5, 3\) has no batch axis"):
        conv.conv_forward(x[0], w, (1, 1), (1, 1), p)
    with pytest.raises(ValueError, match="has no batch axis"):
        conv.conv_forward(np.ones((7, 3), np.float32), np.ones((3, 3, 4), np.float32), (1,),
                          (1,), [(0, 0)])
    with pytest.raises(ValueError):
        conv.conv_forward(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32), (), (), [])
    with pytest.raises(ValueError):
        conv.conv_forward(x, w, (0, 1), (1, 1), p)
    with pytest.raises(ValueError):
        conv.conv_forward(x, w, (1, 1), (1,), p)
    with pytest.raises(ValueError):
        conv.conv_forward(x, w, (1, 1), (1, 1), [(1, 1), (-1, 1)])
    with pytest.raises(TypeError):
        conv.conv_forward(x, w, (1, 1), (1, 1), [1, 1])
    with pytest.raises(ValueError):
        conv.conv_forward(x, w, (1, 1), (1, 1), p, out=np.empty((2, 5, 5, 3), np.float32))
    with pytest.raises(ValueError, match="dy has shape"):
        conv.conv_backward_input(np.ones((2, 4, 5, 4), np.float32), w, x.shape, (1, 1),
                                 (1, 1), p)
    with pytest.raises(ValueError, match="dy has shape"):
        conv.conv_backward_kernel(x, np.ones((2, 5, 5, 5), np.float32), w.shape, (1, 1),
                                  (1, 1), p)
    with pytest.raises(ValueError):
        conv.conv_backward_kernel(x, np.ones((2, 5, 5, 4), np.float32), (3, 3, 2, 4), (1, 1),
                                  (1, 1), p)


# ---------------------------------------------------------------- stride-1 tap GEMMs

@pytest.fixture
def taps_everywhere():
    """Every stride-1 convolution through the per-tap GEMM path, with small
    tiles so that tiles end mid-row and mid-plane."""
    old = dict(conv._TUNE)
    conv._TUNE.update(tap_min_c=1, tap_min_rows=10 ** 9, tap_last_packed=True, tap_rows=7,
                      direct=False)
    try:
        yield
    finally:
        conv._TUNE.clear()
        conv._TUNE.update(old)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fixed_cases_taps(taps_everywhere, case, channels_last, dtype):
    spatial, c, f, k, s, d, p = CASES[case]
    rng = np.random.default_rng(100 + case)
    for n in (1, 3):
        check_all(rng, dtype, n, spatial, c, f, k, s, d, p, channels_last)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(conv_configs(), st.integers(0, 2 ** 31))
def test_random_configs_taps(taps_everywhere, cfg, seed):
    check_all(np.random.default_rng(seed), **cfg)


@pytest.mark.parametrize("channels_last", [True, False])
def test_taps_large_and_thread_invariant(channels_last):
    # Default tiles (the real path for C >= 32), several tiles per sample,
    # no-padding (no copy) and padded inputs, 1 vs 2 threads bit-identical.
    rng = np.random.default_rng(21)
    check_all(rng, np.float32, 2, (30, 40), 32, 40, (3, 3), (1, 1), (1, 1),
              [(1, 1), (1, 1)], channels_last)
    check_all(rng, np.float64, 2, (40,), 32, 8, (3,), (1,), (2,), [(0, 0)], channels_last)
    x = rng.standard_normal((3, 21, 19, 32)).astype(np.float32)
    if not channels_last:
        x = np.ascontiguousarray(to_first(x))
    nmax = get_max_threads()
    for kshape, pads in [((3, 3, 32, 16), [(1, 1), (0, 1)]), ((2, 3, 32, 8), [(0, 0), (0, 0)])]:
        w = rng.standard_normal(kshape).astype(np.float32)
        ys = []
        try:
            for nt in (1, 2):
                set_num_threads(nt)
                ys.append(conv.conv_forward(x, w, (1, 1), (1, 1), pads,
                                            channels_last=channels_last))
        finally:
            set_num_threads(nmax)
        assert np.array_equal(ys[0], ys[1]), kshape


# ---------------------------------------------------------------- trailing unit axes

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("spatial, ksize, strides, dilation, pads", [
    ((23, 1), (5, 1), (1, 1), (1, 1), [(2, 2), (0, 0)]),      # a (k, 1) kernel on a series
    ((23, 1), (3, 1), (2, 3), (2, 1), [(1, 0), (0, 0)]),      # strides, dilation on the W=1 axis
    ((9, 1), (1, 1), (1, 1), (1, 1), [(0, 0), (0, 0)]),       # 1x1 on (N, H, 1, C)
    ((4, 6, 1), (2, 3, 1), (1, 2, 1), (1, 1, 1), [(1, 0), (1, 1), (0, 0)]),
    ((7, 1, 1), (3, 1, 1), (2, 1, 1), (1, 1, 1), [(1, 1), (0, 0), (0, 0)]),
    ((6, 1), (3, 1), (1, 1), (1, 1), [(1, 1), (0, 1)]),       # padded W=1 axis: kept
])
def test_trailing_unit_axes(spatial, ksize, strides, dilation, pads, channels_last, dtype):
    # An axis of size 1 with a 1-tap kernel and no padding at the end is
    # dropped from the geometry (the axis before it becomes the row the
    # kernels tile); forward and both gradients still match the reference.
    rng = np.random.default_rng(37)
    check_all(rng, dtype, 3, spatial, 6, 20, ksize, strides, dilation, pads, channels_last)
    g = conv._geometry((3,) + spatial + (6,), ksize + (6, 20), strides, dilation, pads, True,
                       "t")[0]
    trivial_end = spatial[-1] == 1 and ksize[-1] == 1 and pads[-1] == (0, 0)
    assert (g["W"] == 1) != trivial_end


# ---------------------------------------------------------------- 1x1 convolutions

@pytest.mark.parametrize("tiles", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pointwise_gemm_tiles_and_blocks(tiles, dtype):
    # A channels_last 1x1 convolution runs as single-threaded GEMM tiles of
    # the (N*P, C) view, or (forced off) the direct kernel / row blocks;
    # both against the reference, in 1-D to 3-D, channels_first included
    # (which never takes the tiles).
    old = dict(conv._TUNE)
    conv._TUNE["pointwise_gemm"] = tiles
    rng = np.random.default_rng(31)
    try:
        for spatial in ((5, 5), (7,), (3, 4, 2)):
            r = len(spatial)
            for n in (1, 3):
                for cl in (True, False):
                    check_all(rng, dtype, n, spatial, 5, 7, (1,) * r, (1,) * r, (1,) * r,
                              [(0, 0)] * r, cl, noncontig=(n == 3))
    finally:
        conv._TUNE.clear()
        conv._TUNE.update(old)


@pytest.mark.parametrize("m, k, f", [(1, 3, 1), (15, 2, 17), (196, 256, 1024), (49, 512, 2048),
                                     (3136, 64, 256), (100352, 64, 64), (1000, 7, 5000),
                                     (63, 1024, 63), (300, 64, 200), (6000, 64, 64),
                                     (8000, 64, 64), (196, 576, 96), (49, 960, 160),
                                     (130, 64, 100), (100, 64, 100)])
def test_pointwise_tiles_cover_the_output_once(m, k, f):
    # Tiles depend on the shape only; they cover every output once, at
    # least 4 of them whenever each still keeps 64 rows or columns, largest
    # first; an axis cut in 2-4 parts has its first half of the parts about
    # twice the size of the rest, unless that would take a tile's rows of x
    # past 512 KB.
    tiles = conv._pointwise_tiles(m, k, f)
    assert tiles.dtype == np.intp and tiles.ndim == 2 and tiles.shape[1] == 4
    assert not tiles.flags.writeable and conv._pointwise_tiles(m, k, f) is tiles
    covered = np.zeros((m, f), np.int32)
    for r0, rows, f0, cols in tiles:
        assert rows >= 1 and cols >= 1
        covered[r0:r0 + rows, f0:f0 + cols] += 1
    assert (covered == 1).all()
    sizes = tiles[:, 1] * tiles[:, 3]
    assert (np.diff(sizes) <= 0).all()
    if f >= 256 or m >= 512:
        assert len(tiles) >= 4
    most_rows = max(64, min(2048, (1 << 17) // k))
    assert tiles[:, 1].max() <= most_rows + 15
    for axis in (0, 2):
        starts = np.unique(tiles[:, axis])
        lengths = np.unique(tiles[:, axis:axis + 2], axis=0)[:, 1]
        if 2 <= len(starts) <= 4 and lengths.max() > 1.5 * lengths.min():
            # uneven: the large parts come first and are about twice the small
            assert 1.6 <= lengths.max() / lengths.min() <= 2.4
            assert (np.diff(lengths) <= 16).all()
    if (m, k, f) == (196, 256, 1024):
        assert tiles[:, 3].tolist() == [352, 336, 176, 160] and (tiles[:, 1] == 196).all()
    if (m, k, f) == (8000, 64, 64):
        assert (tiles[:, 1] == 2000).all()          # 2x would pass 2048 rows of 64 values
    if (m, k, f) in ((196, 576, 96), (49, 960, 160), (130, 64, 100)):
        # too small for 4 tiles of 64 rows or columns: 2, so that a second
        # thread has work
        assert len(tiles) == 2
    if (m, k, f) == (100, 64, 100):
        assert len(tiles) == 1


def _pointwise_case(rng, dtype, n=2, hw=(7, 9), c=128, f=160):
    x = rng.standard_normal((n,) + hw + (c,)).astype(dtype)
    w = (rng.standard_normal((1, 1, c, f)) / np.sqrt(c)).astype(dtype)
    return x, w


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", [None, "relu", "relu6"])
def test_pointwise_tiles_epilogue(activation, dtype):
    # bias, residual and activation go in per tile, in conv_forward's order;
    # the auto rule picks the tiles for this width (C x F = 20480).
    rng = np.random.default_rng(33)
    x, w = _pointwise_case(rng, dtype)
    args = ((1, 1), (1, 1), [(0, 0), (0, 0)])
    g = conv._geometry(x.shape, w.shape, *args, True, "t")[0]
    assert conv._use_pointwise_gemm(g, True, True)
    plain = ref_forward(x, w, *args)
    bias = rng.standard_normal(w.shape[-1]).astype(dtype)
    res = (3 * rng.standard_normal(plain.shape)).astype(dtype)
    for b, r in ((bias, None), (None, res), (bias, res), (None, None)):
        want = _ref_epilogue(plain, b, activation, r)
        got = conv.conv_forward(x, w, *args, bias=b, residual=r, activation=activation)
        np.testing.assert_allclose(got, want, **tol(dtype))
        call = conv.forward_call(x.shape, w.shape, *args, True, dtype, b is not None,
                                 r is not None, activation)
        assert np.array_equal(call(x, w, b, r), got)
    # the residual may be the output itself, as on the direct kernel's path
    acc = res.copy()
    conv.conv_forward(x, w, *args, out=acc, bias=bias, residual=acc, activation=activation)
    np.testing.assert_allclose(acc, _ref_epilogue(plain, bias, activation, res), **tol(dtype))


def test_pointwise_tiles_give_way_to_avx512_direct_tiles():
    # Where the direct kernel runs AVX-512 tiles (6 or 12 pixels), a wide 1x1
    # with 512 rows or more runs it instead of the GEMM tiles, unless it has
    # more channels than the direct kernel takes, or few input channels and a
    # large output.
    if not conv._use_avx512(True):
        pytest.skip("needs avx512: AVX-512 is off: no AVX-512F on this CPU, or CYBACK_AVX512=0")
    args = ((1, 1), (1, 1), [(0, 0), (0, 0)])

    def tiles(x_shape, c, f):
        g = conv._geometry(x_shape + (c,), (1, 1, c, f), *args, True, "t")[0]
        return conv._use_pointwise_gemm(g, True, True)
    try:
        for wide in (False, True):
            conv._use_wide_tiles(wide)
            assert not tiles((32, 14, 14), 256, 1024)
            assert not tiles((1, 28, 28), 128, 512)
            assert tiles((1, 14, 14), 256, 1024)               # 196 rows
            assert tiles((32, 7, 7), 2048, 512)                # too wide for the direct kernel
            # few input channels and 8M outputs or more: the tiles again
            assert tiles((32, 56, 56), 64, 256) and tiles((32, 56, 56), 32, 128)
            assert not tiles((32, 28, 28), 64, 256)            # 6.4M outputs
            assert not tiles((32, 56, 56), 128, 256)           # 128 channels
            assert not tiles((32, 56, 56), 256, 64)
        # below AVX-512 the rule is by width and size
        conv._use_avx512(False)
        assert tiles((32, 14, 14), 256, 1024) and tiles((1, 28, 28), 128, 512)
    finally:
        conv._use_wide_tiles(None)
        conv._use_avx512(True)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 24, 24, 64)).astype(np.float32)
    w = rng.standard_normal((1, 1, 64, 512)).astype(np.float32)
    want = ref_forward(x, w, *args)
    for wide in (False, True):
        conv._use_wide_tiles(wide)
        try:
            np.testing.assert_allclose(conv.conv_forward(x, w, *args), want, **tol(np.float32))
        finally:
            conv._use_wide_tiles(None)


def test_pointwise_tiles_ignore_threads_and_keep_nan_like_numpy():
    rng = np.random.default_rng(34)
    x, w = _pointwise_case(rng, np.float32, n=4, hw=(14, 14), c=96, f=300)
    x[0, 1, 2, :] = np.nan
    x[1, 3, 4, 5] = np.inf
    args = ((1, 1), (1, 1), [(0, 0), (0, 0)])
    bias = np.linspace(-3, 3, 300).astype(np.float32)
    for activation in ("relu", "relu6"):
        got = same_on_threads(lambda: conv.conv_forward(x, w, *args, bias=bias,
                                                        activation=activation))
        plain = conv.conv_forward(x, w, *args)
        np.testing.assert_array_equal(got, _ref_epilogue(plain + bias, None, activation))
        assert np.isnan(got[0, 1, 2]).all()


# ---------------------------------------------------------------- direct kernel

@pytest.fixture(params=["avx512", "avx512-6px", "avx2", "baseline"])
def direct_isa(request):
    """The direct kernel's AVX-512 set with float32 tiles of 12 pixels and of
    6, its AVX2 set (where the CPU has them) and its baseline set; the
    packing block width follows the set that runs. Winograd is off, so that
    3x3 cases reach the direct kernel."""
    conv._TUNE["winograd"] = False
    conv._use_wide_tiles(request.param == "avx512")
    try:
        with instruction_set(conv, request.param.split("-")[0]) as which:
            yield which
    finally:
        conv._TUNE["winograd"] = True
        conv._use_wide_tiles(None)


def _ref_epilogue(y, bias, activation, residual=None):
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    if activation in ("relu", "relu6"):
        y = np.maximum(y, 0)
    if activation == "relu6":
        y = np.minimum(y, 6)
    return y


# spatial, c, f, k, strides, dilation, pads: channel counts around the block
# widths (4, 8, 16 floats; 2, 4, 8 doubles), rows shorter and longer than
# the 6-pixel tile, strided and dilated taps, D/H padding rows skipped.
DIRECT_CASES = [
    ((32, 32), 16, 16, (3, 3), (1, 1), (1, 1), [(1, 1), (1, 1)]),
    ((28, 28), 1, 32, (3, 3), (1, 1), (1, 1), [(0, 0), (0, 0)]),
    ((5, 7), 3, 17, (3, 3), (1, 1), (1, 1), [(1, 1), (1, 1)]),
    ((9, 13), 5, 33, (3, 2), (2, 3), (2, 1), [(2, 1), (0, 3)]),
    ((400,), 1, 16, (12,), (4,), (1,), [(0, 0)]),
    ((98,), 16, 9, (12,), (4,), (1,), [(0, 0)]),
    ((11,), 4, 10, (5,), (1,), (2,), [(4, 4)]),
    ((3, 4, 5), 2, 9, (2, 3, 3), (1, 1, 2), (2, 1, 1), [(1, 1), (1, 1), (2, 0)]),
    ((6, 5), 64, 10, (1, 1), (1, 1), (1, 1), [(0, 0), (0, 0)]),
    ((2, 2), 3, 12, (3, 3), (1, 1), (1, 1), [(2, 2), (2, 2)]),   # some rows all padding
    # W padding is skipped by the kernel: rows narrower than the kernel (no
    # pixel reads only inside its row), right-only padding with a stride,
    # dilated taps with wide uneven padding
    ((4, 2), 3, 12, (1, 5), (1, 1), (1, 1), [(0, 0), (2, 2)]),
    ((7, 9), 4, 16, (3, 3), (2, 2), (1, 1), [(0, 1), (0, 1)]),
    ((1, 20), 8, 16, (1, 7), (1, 3), (1, 2), [(0, 0), (5, 6)]),
    ((3, 30), 2, 24, (2, 4), (1, 1), (1, 3), [(0, 1), (9, 0)]),
]


@contextlib.contextmanager
def forced_pad(mode):
    """W padding skipped by the kernel ("skip") or read from a padded copy
    ("copy") while the block runs."""
    old = conv._TUNE["direct_skip_pad"]
    conv._TUNE["direct_skip_pad"] = mode == "skip"
    conv._DIRECT_GEOMS.clear()
    try:
        yield mode
    finally:
        conv._TUNE["direct_skip_pad"] = old
        conv._DIRECT_GEOMS.clear()


@pytest.fixture(params=["skip", "copy"])
def pad_mode(request):
    """Every direct test runs both ways of reading the W padding."""
    with forced_pad(request.param):
        yield request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", [None, "relu", "relu6"])
@pytest.mark.parametrize("case", range(len(DIRECT_CASES)))
def test_direct_kernel_with_epilogue(direct_isa, pad_mode, case, activation, dtype):
    spatial, c, f, k, s, d, p = DIRECT_CASES[case]
    rng = np.random.default_rng(300 + case)
    for n, with_bias, with_res in ((1, True, False), (3, False, True), (2, True, True)):
        x = (3 * rng.standard_normal((n,) + spatial + (c,))).astype(dtype)
        w = rng.standard_normal(k + (c, f)).astype(dtype)
        bias = rng.standard_normal(f).astype(dtype) if with_bias else None
        g, _, _ = conv._geometry(x.shape, w.shape, s, d, p, True, "test")
        assert conv._use_direct(g, True, dtype == np.float64)
        plain = ref_forward(x, w, s, d, p)
        res = rng.standard_normal(plain.shape).astype(dtype) if with_res else None
        y = conv.conv_forward(x, w, s, d, p, True, bias=bias, residual=res,
                              activation=activation)
        want = _ref_epilogue(plain, bias, activation, res)
        assert y.dtype == dtype and y.shape == want.shape
        np.testing.assert_allclose(y, want, **tol(dtype))
        call = conv.forward_call(x.shape, w.shape, s, d, p, True, dtype, with_bias, with_res,
                                 activation)
        np.testing.assert_array_equal(call(x, w, bias, res), y)
        if activation == "relu6":
            assert y.min() >= 0 and y.max() <= 6


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_row_tiles_every_width(direct_isa, dtype):
    # A row of OW pixels runs in tiles of nearly equal size, of at most 6
    # pixels (two vectors of channels per pixel) or 12 (float32 AVX-512),
    # the tiles at its ends checking their taps against the W padding. Every
    # width from 1 to 26 (each tile size, end tiles that are also the first
    # tile), strides and dilations whose padded taps fall inside end tiles,
    # a block of two vectors and one of at most 16 channels: against NumPy,
    # and bit for bit against the same kernel reading a zero-padded copy,
    # which sums the same products in the same order.
    rng = np.random.default_rng(77)
    for ow, (k, s, d, p), f in itertools.product(
            range(1, 27), [(3, 1, 1, (1, 1)), (5, 2, 1, (2, 2)), (3, 1, 3, (3, 3)),
                           (4, 1, 1, (0, 3))], (20, 12)):
        w_in = (ow - 1) * s + 1 + (k - 1) * d - sum(p)
        if w_in < 1:
            continue
        x = rng.standard_normal((2, 3, w_in, 5)).astype(dtype)
        w = rng.standard_normal((1, k, 5, f)).astype(dtype)
        bias = rng.standard_normal(f).astype(dtype)
        args = ((1, s), (1, d), [(0, 0), p])
        want = ref_forward(x, w, *args) + bias
        with forced_pad("skip"):
            skip = conv.conv_forward(x, w, *args, bias=bias)
        with forced_pad("copy"):
            copy = conv.conv_forward(x, w, *args, bias=bias)
        assert skip.shape == want.shape and skip.shape[2] == ow
        np.testing.assert_allclose(skip, want, **tol(dtype))
        np.testing.assert_array_equal(skip, copy)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spatial, c, k, s, d, p", [
    ((5, 14), 3, (3, 7), (1, 2), (1, 1), [(1, 1), (3, 3)]),     # stem-like, H and W padding
    ((6, 9), 16, (3, 3), (1, 1), (1, 1), [(2, 0), (1, 1)]),     # the most channels copied
    ((6, 9), 17, (3, 3), (1, 1), (1, 1), [(0, 2), (1, 1)]),     # per-tap checks past it
    ((4, 30), 16, (2, 3), (1, 1), (1, 40), [(1, 1), (40, 40)]),  # window too long to copy
    ((3, 4, 7), 4, (2, 3, 3), (1, 1, 1), (1, 1, 1), [(1, 0), (1, 1), (1, 1)]),
    ((2, 3, 7), 4, (3, 3, 3), (1, 1, 2), (1, 1, 1), [(1, 1), (0, 0), (2, 2)]),
    ((3, 3, 7), 4, (3, 3, 3), (1, 1, 1), (1, 1, 1), [(1, 1), (1, 1), (1, 1)]),
])
def test_direct_short_patches_with_padding_rows(direct_isa, spatial, c, k, s, d, p, dtype):
    # Short patches run their taps through tables built once per geometry:
    # output rows whose top or bottom tap rows fall in the D/H padding use
    # the tables' first entries (when the rows that exist are one run), and
    # the tiles at a row's ends read a zero-padded copy of their window (up
    # to 16 channels). Against NumPy, and bit for bit against the kernel
    # reading a zero-padded copy of the input rows, which has no row ends;
    # the 3-D cases have tap rows that exist in one run, and not (D and H
    # padding in the same output row).
    rng = np.random.default_rng(91)
    x = rng.standard_normal((2,) + spatial + (c,)).astype(dtype)
    w = rng.standard_normal(k + (c, 20)).astype(dtype)
    bias = rng.standard_normal(20).astype(dtype)
    g, _, _ = conv._geometry(x.shape, w.shape, s, d, p, True, "test")
    assert conv._use_direct(g, True, dtype == np.float64)
    want = ref_forward(x, w, s, d, p) + bias
    with forced_pad("skip"):
        skip = conv.conv_forward(x, w, s, d, p, bias=bias)
    with forced_pad("copy"):
        copy = conv.conv_forward(x, w, s, d, p, bias=bias)
    np.testing.assert_allclose(skip, want, **tol(dtype))
    np.testing.assert_array_equal(skip, copy)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_wide_layers_with_enough_pixels(direct_isa, dtype):
    # Past 64 input channels the direct kernel runs where a call has enough
    # pixels to beat BLAS's packing; with few it leaves them to im2col + GEMM.
    rng = np.random.default_rng(78)
    args = ((1, 1), (1, 1), [(1, 1), (1, 1)])
    for shape, direct in (((2, 16, 16, 96), True), ((1, 7, 7, 96), False),
                          ((1, 40, 13, 130), True)):
        x = rng.standard_normal(shape).astype(dtype)
        w = (rng.standard_normal((3, 3, shape[-1], 40)) / 10).astype(dtype)
        g, _, _ = conv._geometry(x.shape, w.shape, *args, True, "test")
        assert conv._use_direct(g, True, dtype == np.float64) == direct, shape
        np.testing.assert_allclose(conv.conv_forward(x, w, *args), ref_forward(x, w, *args),
                                   **tol(dtype))


def same_on_threads(run, counts=(1, 2, 3)):
    """run() on each thread count in turn, asserting that every output is
    bit-identical to the first; that output."""
    old = get_max_threads()
    outs = []
    try:
        for nt in counts:
            set_num_threads(nt)
            outs.append(run())
    finally:
        set_num_threads(old)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0], equal_nan=True)
    return outs[0]


def test_direct_matches_im2col_and_ignores_threads():
    # Same sums in a different order than the GEMM path: equal to rounding;
    # bit-identical for 1, 2 and 3 threads (rows are split, sums are not).
    rng = np.random.default_rng(41)
    x = rng.standard_normal((3, 17, 19, 24)).astype(np.float32)
    w = rng.standard_normal((3, 3, 24, 40)).astype(np.float32)
    args = ((1, 1), (1, 1), [(1, 1), (1, 1)])
    conv._TUNE["winograd"] = False
    try:
        y_direct = same_on_threads(lambda: conv.conv_forward(x, w, *args))
        conv._TUNE["direct"] = False
        y_gemm = conv.conv_forward(x, w, *args)
    finally:
        conv._TUNE.update(direct=True, winograd=True)
    np.testing.assert_allclose(y_direct, y_gemm, rtol=1e-5, atol=1e-4)


def test_direct_epilogue_off_the_direct_path():
    # channels_first and wide channels apply bias + activation after the GEMM
    # path, float16 runs widened to float32: all as the reference.
    rng = np.random.default_rng(42)
    for c, last, dtype in ((3, False, np.float32), (80, True, np.float32),
                           (3, True, np.float16)):
        x = rng.standard_normal((2, 6, 5, c)).astype(dtype)
        w = rng.standard_normal((3, 3, c, 5)).astype(dtype)
        bias = rng.standard_normal(5).astype(dtype)
        args = ((1, 1), (1, 1), [(1, 1), (1, 1)])
        plain = ref_forward(x, w, *args)
        res = rng.standard_normal(plain.shape).astype(dtype)
        want = _ref_epilogue(plain, bias, "relu6", res)
        xin = x if last else to_first(x)
        y = conv.conv_forward(xin, w, *args, channels_last=last, bias=bias,
                              residual=res if last else to_first(res), activation="relu6")
        y = y if last else to_last(y)
        assert y.dtype == dtype
        t = dict(rtol=2e-2, atol=5e-2) if dtype == np.float16 else tol(dtype)
        np.testing.assert_allclose(y.astype(np.float64), want, **t)


def test_direct_needs_more_than_half_a_block_of_output_channels():
    x = np.ones((1, 9, 9, 4), np.float32)
    fb = conv._direct_block_width(False)
    for f, want in ((fb // 2, False), (fb // 2 + 1, True)):
        g, _, _ = conv._geometry(x.shape, (3, 3, 4, f), (1, 1), (1, 1), [(1, 1)] * 2, True, "t")
        assert conv._use_direct(g, True) == want


def test_direct_many_tap_rows_fall_back():
    # More tap rows (KD * KH) than the direct kernel takes: the GEMM path.
    x = np.ones((1, 9, 9, 4, 2), np.float32)
    w = np.ones((9, 9, 1, 2, 3), np.float32)
    g, _, _ = conv._geometry(x.shape, w.shape, (1, 1, 1), (1, 1, 1), [(0, 0)] * 3, True, "t")
    assert not conv._use_direct(g, True)
    y = conv.conv_forward(x, w, (1, 1, 1), (1, 1, 1), [(0, 0)] * 3)
    np.testing.assert_allclose(y, 162.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel, strides, f", [((3, 3), (1, 1), 48), ((7, 7), (2, 2), 40),
                                                ((1, 1), (1, 1), 64), ((3, 3), (1, 1), 16),
                                                ((5, 5), (2, 2), 11), ((3, 3), (2, 2), 128),
                                                ((7, 7), (2, 2), 64), ((1, 1), (1, 1), 192)])
def test_direct_avx512_and_avx2_sums_agree_bit_for_bit(dtype, kernel, strides, f):
    # Both sets sum each output over (r, kw, c) in the same order with fused
    # multiply-adds; only the number of output channels per vector differs
    # (on AVX-512, up to the AVX2 block width as one vector), the vectors per
    # block (4 in float32 layers of a multiple of 64 channels with 6-pixel
    # tiles) and the pixels per tile (12 or 6 in float32 on AVX-512).
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 13, 15, 24)).astype(dtype)
    w = rng.standard_normal(kernel + (24, f)).astype(dtype)
    b = rng.standard_normal(f).astype(dtype)
    args = (strides, (1, 1), [(1, 2), (3, 0)])
    conv._TUNE["winograd"] = False
    try:
        with instruction_set(conv, "avx512"):
            dbl = dtype == np.float64
            narrow = conv._direct_block_width(dbl)
            quad = not dbl and f % 64 == 0 and not conv._use_wide_tiles(None)
            assert conv._direct_block_width(dbl, f) == \
                (64 if quad else 2 * narrow if f > narrow else narrow)
            assert conv._use_wide_tiles(True)
            wide = conv.conv_forward(x, w, *args, bias=b, activation="relu")
            assert not conv._use_wide_tiles(False)
            assert conv._direct_block_width(dbl, f) == (64 if not dbl and f % 64 == 0
                                                        else 2 * narrow if f > narrow
                                                        else narrow)
            wide6 = conv.conv_forward(x, w, *args, bias=b, activation="relu")
            conv._use_quad_blocks(False)
            assert conv._direct_block_width(dbl, f) == (2 * narrow if f > narrow else narrow)
            wide6_32 = conv.conv_forward(x, w, *args, bias=b, activation="relu")
        with instruction_set(conv, "avx2"):
            narrow = conv.conv_forward(x, w, *args, bias=b, activation="relu")
    finally:
        conv._TUNE["winograd"] = True
        conv._use_wide_tiles(None)
        conv._use_quad_blocks(True)
    np.testing.assert_allclose(wide, np.maximum(ref_forward(x, w, *args) + b, 0), **tol(dtype))
    assert np.array_equal(wide, narrow)
    assert np.array_equal(wide6, narrow)
    assert np.array_equal(wide6_32, narrow)


@pytest.mark.parametrize("kind", ["forward", "residual", "transposed"])
def test_quad_blocks_match_the_reference(kind):
    # 64-channel blocks (4 vectors) through every path of the tile: its
    # epilogue with a residual, the row-end tiles, and the phases of a
    # transposed convolution's input gradient.
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 9, 14, 5)).astype(np.float32)
    conv._TUNE["winograd"] = False
    conv._use_wide_tiles(False)
    try:
        if kind == "transposed":
            w = rng.standard_normal((3, 3, 64, 5)).astype(np.float32)
            dy = x
            pads = [(1, 1), (1, 1)]
            got = conv.conv_backward_input(dy, w, (2, 18, 28, 64), (2, 2), (1, 1), pads)
            conv._use_quad_blocks(False)
            want = conv.conv_backward_input(dy, w, (2, 18, 28, 64), (2, 2), (1, 1), pads)
            np.testing.assert_array_equal(got, want)
            return
        w = rng.standard_normal((3, 3, 5, 128)).astype(np.float32)
        b = rng.standard_normal(128).astype(np.float32)
        args = ((1, 1), (1, 1), [(1, 1), (1, 1)])
        res = rng.standard_normal((2, 9, 14, 128)).astype(np.float32) \
            if kind == "residual" else None
        got = conv.conv_forward(x, w, *args, bias=b, residual=res, activation="relu6")
        ref = ref_forward(x, w, *args) + b + (0 if res is None else res)
        np.testing.assert_allclose(got, np.clip(ref, 0, 6), **tol(np.float32))
        conv._use_quad_blocks(False)
        want = conv.conv_forward(x, w, *args, bias=b, residual=res, activation="relu6")
        np.testing.assert_array_equal(got, want)
    finally:
        conv._TUNE["winograd"] = True
        conv._use_wide_tiles(None)
        conv._use_quad_blocks(True)


def test_wide_tiles_follow_the_cpu_unless_set():
    # 12-pixel float32 tiles except where 512-bit FMAs run at half rate
    # (AMD Zen 4); only meaningful where AVX-512 runs.
    import platform
    x86 = platform.machine() in ("x86_64", "AMD64", "i686", "i386")
    default = conv._use_wide_tiles(None)
    try:
        # only x86 builds have the AVX-512 rows (elsewhere: never wide)
        assert conv._use_wide_tiles(True) is x86
        assert conv._use_wide_tiles(False) is False
    finally:
        assert conv._use_wide_tiles(None) == default
    if not x86 or not os.path.exists("/proc/cpuinfo"):
        return
    with open("/proc/cpuinfo") as f:
        info = f.read()
    if "avx512f" not in info:
        return
    amd = "AuthenticAMD" in info
    family = next((int(line.split(":")[1]) for line in info.splitlines()
                   if line.startswith("cpu family")), None)
    assert default == (not (amd and family == 0x19))


def test_avx512_setting_caps_the_kernels_at_avx2():
    if not conv._use_avx512(True):
        pytest.skip("needs avx512: AVX-512 is off: no AVX-512F on this CPU, or CYBACK_AVX512=0")
    import subprocess
    import sys
    code = ("from cyback.kernels import conv, winograd; "
            "print(conv._direct_block_width(False, 48), winograd._use_avx512(True))")
    for setting, want in (("0", "16 False"), ("1", "32 True")):
        env = dict(os.environ, CYBACK_AVX512=setting)
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             stdout=subprocess.PIPE, text=True).stdout.strip()
        assert out == want


def test_direct_bad_epilogue_arguments():
    x = np.ones((1, 5, 5, 2), np.float32)
    w = np.ones((3, 3, 2, 4), np.float32)
    args = ((1, 1), (1, 1), [(0, 0), (0, 0)])
    with pytest.raises(ValueError, match="bias must be a float32 array of shape \\(4,\\)"):
        conv.conv_forward(x, w, *args, bias=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="bias must be"):
        conv.conv_forward(x, w, *args, bias=np.ones(4, np.float64))
    with pytest.raises(ValueError, match="activation must be one of"):
        conv.conv_forward(x, w, *args, activation="tanh")
    with pytest.raises(ValueError, match="residual must be a float32 array of shape "
                                         "\\(1, 3, 3, 4\\)"):
        conv.conv_forward(x, w, *args, residual=np.ones((1, 3, 3, 3), np.float32))


@pytest.mark.parametrize("activation", ["relu", "relu6"])
def test_in_kernel_activations_keep_nan_like_numpy(direct_isa, activation):
    # The fused epilogue must agree with the unfused np.maximum / np.minimum,
    # NaN included, for the direct conv and for depthwise.
    from cyback.kernels import depthwise
    x = np.ones((1, 3, 8, 16), np.float32)
    x[0, 1, 2, 5] = np.nan
    x[0, 2, 6, 0] = np.inf
    x[0, 0, 0, 3] = -np.inf
    pads = [(1, 1), (1, 1)]
    bias = np.linspace(-8, 8, 16).astype(np.float32)
    k = np.full((3, 3, 16, 16), 0.5, np.float32)
    kd = np.full((3, 3, 16, 1), 0.5, np.float32)
    for fwd, kern in ((conv.conv_forward, k), (depthwise.depthwise_forward, kd)):
        plain = fwd(x, kern, (1, 1), (1, 1), pads, True)
        want = _ref_epilogue(plain + bias, None, activation)
        got = fwd(x, kern, (1, 1), (1, 1), pads, True, bias=bias, activation=activation)
        np.testing.assert_array_equal(got, want)
        assert np.isnan(got).any()


# ---------------------------------------------------------------- phases of strided input gradients

@pytest.fixture(params=[True, False], ids=["phases", "col2im"])
def phase_split(request):
    """Strided input gradients through the phase split (where it can run)
    or through GEMM + col2im."""
    old = conv._TUNE["phase_split"]
    conv._TUNE["phase_split"] = request.param
    try:
        yield request.param
    finally:
        conv._TUNE["phase_split"] = old


def _takes_phases(x_shape, k_shape, strides, dilation, pads, dtype):
    g, _, _ = conv._geometry(x_shape, k_shape, strides, dilation, pads, True, "t")
    return conv._use_phases(g, True, dtype == np.float64) is not None


def _padding_pads(sizes, ksize, strides, dilation, padding):
    return [conv_utils.conv_pads(n, k, s, d, padding)
            for n, k, s, d in zip(sizes, ksize, strides, dilation)]


# dx spatial size, kernel, strides, dilation, padding ('same' / 'valid' as
# Keras computes them from the wanted output size, or explicit pairs), dy
# channels, dx channels
PHASE_CASES = [
    ((8, 8), (3, 3), (2, 2), (1, 1), "same", 5, 4),
    ((9, 7), (3, 3), (2, 2), (1, 1), "same", 3, 6),      # odd sizes
    ((9, 11), (3, 4), (2, 3), (1, 1), "valid", 4, 3),
    ((12, 10), (3, 3), (3, 3), (1, 1), "same", 4, 5),
    ((10, 13), (2, 1), (3, 2), (1, 1), "valid", 3, 3),   # kernel shorter than stride
    ((7, 8), (1, 1), (2, 2), (1, 1), "same", 2, 3),      # 1x1/2: three residues get nothing
    ((11, 9), (3, 3), (2, 2), (2, 2), "same", 3, 4),     # dilation shares a factor with stride
    ((10, 11), (3, 2), (2, 3), (3, 2), "valid", 2, 5),   # and not
    ((9, 8), (4, 3), (2, 2), (1, 1), [(2, 1), (1, 2)], 3, 4),
    ((9, 14), (2, 2), (3, 3), (1, 1), [(2, 1), (3, 0)], 3, 4),  # dy windows start late
    ((7, 6), (3, 3), (2, 2), (1, 1), [(2, 2), (2, 2)], 3, 4),
    ((40,), (4,), (2,), (1,), "same", 6, 20),            # several channel blocks
    ((31,), (5,), (3,), (1,), "valid", 3, 17),
    ((6, 7, 8), (3, 3, 3), (2, 2, 2), (1, 1, 1), "same", 3, 4),
    ((5, 8, 7), (2, 3, 1), (1, 2, 3), (1, 1, 1), "valid", 2, 3),
    ((3, 30, 2), (3, 3, 3), (2, 2, 1), (1, 1, 1), [(1, 1), (1, 1), (1, 1)], 7, 9),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", range(len(PHASE_CASES)))
def test_strided_input_gradient_phases(direct_isa, phase_split, case, dtype):
    sizes, ks, strides, dil, padding, f, c = PHASE_CASES[case]
    last = case % 3 != 1    # a third of the cases channels_first
    rng = np.random.default_rng(100 + case)
    pads = padding if isinstance(padding, list) else \
        _padding_pads(sizes, ks, strides, dil, padding)
    w = rng.standard_normal(ks + (c, f)).astype(dtype)
    for n in (1, 3):
        x_shape = (n,) + sizes + (c,)
        out = _out_shape(sizes, ks, strides, dil, pads)
        dy = rng.standard_normal((n,) + out + (f,)).astype(dtype)
        assert _takes_phases(x_shape, w.shape, strides, dil, pads, dtype) == phase_split
        if last:
            dx = conv.conv_backward_input(dy, w, x_shape, strides, dil, pads)
        else:
            dx = to_last(conv.conv_backward_input(to_first(dy), w, to_first(np.empty(x_shape))
                                                  .shape, strides, dil, pads, False))
        assert dx.dtype == dtype and dx.shape == x_shape
        np.testing.assert_allclose(dx, ref_backward_input(dy, w, x_shape, strides, dil, pads),
                                   **tol(dtype))


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_conv_transpose_phases_match_col2im(padding):
    # A transposed convolution (dy is its input) through both paths, with the
    # wanted output one longer than the minimum where Keras allows it.
    rng = np.random.default_rng(21)
    for rank, strides, ks in ((1, (3,), (5,)), (2, (2, 2), (3, 3)), (2, (3, 2), (2, 4)),
                              (3, (2, 2, 2), (3, 2, 3))):
        sp = (6, 5, 4)[:rank]
        x = rng.standard_normal((2,) + sp + (24,)).astype(np.float32)
        w = rng.standard_normal(ks + (20, 24)).astype(np.float32)
        for extra in (0, 1):
            out = tuple(conv_utils.deconv_output_length(n, k, s, padding) + extra
                        for n, k, s in zip(sp, ks, strides))
            pads = _padding_pads(out, ks, strides, (1,) * rank, padding)
            if _out_shape(out, ks, strides, (1,) * rank, pads) != sp:
                continue
            shape = (2,) + out + (20,)
            got = {}
            for mode in (True, False):
                conv._TUNE["phase_split"] = mode
                try:
                    got[mode] = conv.conv_backward_input(x, w, shape, strides, (1,) * rank, pads)
                finally:
                    conv._TUNE["phase_split"] = None
            np.testing.assert_allclose(got[True], got[False], rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(got[True], ref_backward_input(x, w, shape, strides,
                                                                     (1,) * rank, pads),
                                       rtol=1e-4, atol=1e-4)


def test_phases_float16_empty_and_thread_invariant(phase_split):
    rng = np.random.default_rng(22)
    w = rng.standard_normal((3, 3, 5, 4)).astype(np.float16)
    pads = [(0, 1), (1, 1)]
    dy = rng.standard_normal((2, 4, 3, 4)).astype(np.float16)
    dx = conv.conv_backward_input(dy, w, (2, 8, 5, 5), (2, 2), (1, 1), pads)
    assert dx.dtype == np.float16
    np.testing.assert_allclose(dx, ref_backward_input(dy, w, (2, 8, 5, 5), (2, 2), (1, 1), pads),
                               rtol=2e-2, atol=5e-2)
    # channels_first, read-only arrays
    dyf, wf = to_first(dy).astype(np.float32), w.astype(np.float32)
    dyf.flags.writeable = wf.flags.writeable = False
    dx = conv.conv_backward_input(dyf, wf, (2, 5, 8, 5), (2, 2), (1, 1), pads, False)
    assert dx.flags.c_contiguous
    np.testing.assert_allclose(to_last(dx), ref_backward_input(dy, w, (2, 8, 5, 5), (2, 2),
                                                               (1, 1), pads), **tol(np.float32))
    empty = conv.conv_backward_input(np.zeros((0, 4, 3, 4), np.float32), w.astype(np.float32),
                                     (0, 8, 5, 5), (2, 2), (1, 1), pads)
    assert empty.shape == (0, 8, 5, 5)
    w = rng.standard_normal((3, 3, 24, 40)).astype(np.float32)
    dy = rng.standard_normal((3, 15, 16, 40)).astype(np.float32)
    args = ((2, 2), (1, 1), [(1, 1), (1, 1)])
    dx = same_on_threads(lambda: conv.conv_backward_input(dy, w, (3, 30, 31, 24), *args))
    np.testing.assert_allclose(dx, ref_backward_input(dy, w, (3, 30, 31, 24), *args),
                               **tol(np.float32))


def test_phases_fall_back_where_they_cannot_run():
    # More tap rows per phase than the direct kernel holds: col2im, even
    # when forced.
    rng = np.random.default_rng(23)
    conv._TUNE["phase_split"] = True
    try:
        w = rng.standard_normal((9, 9, 2, 2, 3)).astype(np.float32)
        args = ((1, 1, 2), (1, 1, 1), [(0, 0), (0, 0), (1, 0)])
        assert not _takes_phases((1, 10, 9, 5, 2), w.shape, *args, np.float32)
        dy = rng.standard_normal((1, 2, 1, 3, 3)).astype(np.float32)
        dx = conv.conv_backward_input(dy, w, (1, 10, 9, 5, 2), *args)
        np.testing.assert_allclose(dx, ref_backward_input(dy, w, (1, 10, 9, 5, 2), *args),
                                   **tol(np.float32))
    finally:
        conv._TUNE["phase_split"] = None


def test_phases_chosen_by_default_where_they_won():
    fb = conv._direct_block_width(False)
    same = [(0, 1), (0, 1)]
    # transposed 3x3/2, 64 -> 32 channels: phases
    assert _takes_phases((16, 56, 56, 32), (3, 3, 32, 64), (2, 2), (1, 1), same, np.float32)
    # too few dx channels for a block: col2im
    assert not _takes_phases((16, 56, 56, fb // 2), (3, 3, fb // 2, 64), (2, 2), (1, 1), same,
                             np.float32)
    # many dy channels: phases on wide dy rows, col2im on narrow ones
    assert _takes_phases((16, 56, 56, 64), (3, 3, 64, 128), (2, 2), (1, 1), same, np.float32)
    assert not _takes_phases((16, 28, 28, 128), (3, 3, 128, 256), (2, 2), (1, 1), same,
                             np.float32)
    assert not _takes_phases((16, 56, 56, 64), (3, 3, 64, 1024), (2, 2), (1, 1), same,
                             np.float32)
    # channels_first: only the first bound
    g = conv._geometry((16, 64, 56, 56), (3, 3, 64, 128), (2, 2), (1, 1), same, False, "t")[0]
    assert conv._use_phases(g, False, False) is None
    g = conv._geometry((16, 32, 56, 56), (3, 3, 32, 64), (2, 2), (1, 1), same, False, "t")[0]
    assert conv._use_phases(g, False, False) is not None
    # single-tap phases (2x2/2)
    assert _takes_phases((16, 56, 56, 64), (2, 2, 64, 64), (2, 2), (1, 1), [(0, 0)] * 2,
                         np.float32)


@pytest.mark.parametrize("channels_last", [True, False])
def test_kernel_gradient_of_read_only_arrays(channels_last):
    # Constants and arrays from np.broadcast_to are read-only; every path of
    # the kernel gradient (direct, tap GEMMs, im2col, 1x1, strided) takes them.
    rng = np.random.default_rng(79)
    for c, k, s, p in ((4, 3, 1, 1), (64, 3, 1, 1), (64, 1, 1, 0), (40, 3, 2, 1)):
        x = rng.standard_normal((2, 9, 8, c)).astype(np.float32)
        w_shape = (k, k, c, 24)
        args = ((s, s), (1, 1), [(p, p), (p, p)])
        dy = rng.standard_normal(ref_forward(x, np.zeros(w_shape, np.float32), *args).shape)
        dy = dy.astype(np.float32)
        want = ref_backward_kernel(x, dy, w_shape, *args)
        xi, dyi = (x, dy) if channels_last else (to_first(x), to_first(dy))
        xi, dyi = np.array(xi), np.array(dyi)
        xi.flags.writeable = dyi.flags.writeable = False
        got = conv.conv_backward_kernel(xi, dyi, w_shape, *args, channels_last=channels_last)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


# ---------------------------------------------------------------- direct kernel gradient

# spatial, C, F (in vector pairs of the AVX2 float set: 16), kernel, strides,
# dilation, pads: narrow 3x3, row blocks with a short last one, strides,
# dilation, uneven padding, padding wider than the kernel reaches, 1-D and 3-D,
# 1x1, channel counts that are not multiples of the 6-channel tile
DW_CASES = [
    ((12, 11), 16, 16, (3, 3), (1, 1), (1, 1), [(1, 1), (1, 1)]),
    ((19, 9), 7, 32, (3, 3), (2, 2), (1, 1), [(1, 0), (0, 1)]),
    ((9, 13), 5, 16, (3, 2), (2, 3), (2, 1), [(2, 1), (0, 3)]),
    ((30,), 3, 16, (5,), (1,), (2,), [(4, 4)]),
    ((4, 5, 6), 2, 16, (2, 3, 3), (1, 1, 2), (2, 1, 1), [(1, 1), (1, 1), (2, 0)]),
    ((6, 5), 13, 32, (1, 1), (1, 1), (1, 1), [(0, 0), (0, 0)]),
    ((2, 2), 1, 16, (3, 3), (1, 1), (1, 1), [(2, 2), (2, 2)]),
    ((3, 20), 8, 16, (1, 7), (1, 3), (1, 2), [(0, 0), (5, 6)]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", range(len(DW_CASES)))
def test_direct_kernel_gradient(direct_isa, case, dtype):
    spatial, c, f, k, s, d, p = DW_CASES[case]
    rng = np.random.default_rng(500 + case)
    for n in (1, 3):
        x = rng.standard_normal((n,) + spatial + (c,)).astype(dtype)
        w_shape = k + (c, f)
        g, _, _ = conv._geometry(x.shape, w_shape, s, d, p, True, "test")
        assert conv._use_direct_wgrad(g, True, dtype == np.float64)
        dy = rng.standard_normal(ref_forward(x, np.zeros(w_shape, dtype), s, d, p).shape)
        dy = dy.astype(dtype)
        got = conv.conv_backward_kernel(x, dy, w_shape, s, d, p)
        assert got.dtype == dtype and got.shape == w_shape
        np.testing.assert_allclose(got, ref_backward_kernel(x, dy, w_shape, s, d, p),
                                   **tol(dtype))


def test_direct_kernel_gradient_paths_and_threads():
    # Bit-identical for 1, 2 and 3 threads (row blocks are grouped by shape);
    # equal to rounding to the GEMM paths; F not in whole vector pairs, or a
    # gradient too large for L2, takes those paths.
    rng = np.random.default_rng(81)
    x = rng.standard_normal((5, 17, 19, 24)).astype(np.float32)
    dy = rng.standard_normal((5, 17, 19, 32)).astype(np.float32)
    args = ((1, 1), (1, 1), [(1, 1), (1, 1)])
    dw = same_on_threads(lambda: conv.conv_backward_kernel(x, dy, (3, 3, 24, 32), *args))
    conv._TUNE["direct_wgrad"] = False
    try:
        gemm = conv.conv_backward_kernel(x, dy, (3, 3, 24, 32), *args)
    finally:
        conv._TUNE["direct_wgrad"] = True
    np.testing.assert_allclose(dw, gemm, rtol=1e-5, atol=1e-3)
    for shape in ((3, 3, 24, 20), (3, 3, 64, 128)):
        g, _, _ = conv._geometry((5, 17, 19, shape[2]), shape, *args, True, "test")
        assert not conv._use_direct_wgrad(g, True, False), shape
    g, _, _ = conv._geometry((5, 24, 17, 19), (3, 3, 24, 32), *args, False, "test")
    assert not conv._use_direct_wgrad(g, False, False)


def test_direct_kernel_gradient_of_an_empty_batch():
    x = np.zeros((0, 6, 6, 4), np.float32)
    dy = np.zeros((0, 6, 6, 16), np.float32)
    got = conv.conv_backward_kernel(x, dy, (3, 3, 4, 16), (1, 1), (1, 1), [(1, 1), (1, 1)])
    assert got.shape == (3, 3, 4, 16) and not got.any()


@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 30, 30), (1, 1, 131), (4, 2, 2, 2)])
def test_pointwise_direct_rows_of_the_flattened_input(shape):
    # a 1x1 direct convolution runs over rows of up to 128 pixels of the
    # flattened input (conv._pointwise_row), whatever the image's own rows
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    x = rng.standard_normal(shape + (8,)).astype(np.float32)
    w = rng.standard_normal((1,) * (len(shape) - 1) + (8, 20)).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    res = rng.standard_normal(shape + (20,)).astype(np.float32)
    nsp = len(shape) - 1
    ref = _ref_epilogue(np.einsum("...c,cf->...f", x.astype(np.float64),
                                  w.reshape(8, 20).astype(np.float64)), b, "relu6", res)
    y = same_on_threads(lambda: conv.conv_forward(x, w, (1,) * nsp, (1,) * nsp,
                                                  [(0, 0)] * nsp, bias=b, residual=res,
                                                  activation="relu6"))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_pointwise_row_lengths():
    assert conv._pointwise_row(1024, 32) == 128
    assert conv._pointwise_row(49, 7) == 49
    assert conv._pointwise_row(131, 131) == 131       # a prime longer than 128
    assert conv._pointwise_row(2 * 131, 131) == 131
    assert conv._pointwise_row(105, 7) == 105
    assert conv._pointwise_row(1800, 30) == 120


@pytest.mark.parametrize("c, f", [(64, 96), (200, 48), (48, 200)])
def test_wide_pointwise_convolutions_take_the_direct_kernel(c, f):
    # 1x1 convolutions past 2048 channel pairs run the register tile too (it
    # beat BLAS's GEMM on the flattened rows once its loops were unrolled);
    # values as the reference, bit-identical on 1-3 threads.
    rng = np.random.default_rng(c + f)
    x = rng.standard_normal((2, 16, 17, c)).astype(np.float32)
    w = rng.standard_normal((1, 1, c, f)).astype(np.float32)
    g, _, _ = conv._geometry(x.shape, w.shape, (1, 1), (1, 1), [(0, 0), (0, 0)], True, "t")
    assert c * f > 2048 and conv._use_direct(g, True)
    y = same_on_threads(lambda: conv.conv_forward(x, w, (1, 1), (1, 1), [(0, 0), (0, 0)],
                                                  activation="relu"))
    ref = np.maximum(x.astype(np.float64) @ w.reshape(c, f).astype(np.float64), 0)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------- the regions' joins

# (x shape, kernel shape, strides, pads, channels_last, tune): one case per
# region that ends in include/cyback_tiles.h's join. The direct kernel packs
# its kernel (a block width that does not divide F, with a bias) and pads
# its input in the region before the rows; Winograd transforms its kernel
# (and, channels_first, copies x and y) around the items.
JOIN_CASES = [
    ((1, 9, 9, 64), (1, 1, 64, 200), (1, 1), [(0, 0), (0, 0)], True, "tiles",
     {"pointwise_gemm": True}),
    ((2, 7, 9, 12), (3, 3, 12, 40), (1, 1), [(1, 1), (0, 1)], True, "direct",
     {"direct_skip_pad": False, "winograd": False}),
    ((2, 11, 10, 24), (3, 3, 24, 20), (2, 2), [(1, 1), (1, 1)], True, "direct",
     {"winograd": False}),
    ((2, 10, 12, 32), (3, 3, 32, 24), (1, 1), [(1, 1), (1, 1)], True, "winograd",
     {"winograd": True}),
    ((2, 32, 10, 12), (3, 3, 32, 24), (1, 1), [(1, 1), (1, 1)], False, "winograd",
     {"winograd": True}),
]


def _forward_path(x_shape, k_shape, strides, pads, last):
    g, _, pointwise = conv._geometry(x_shape, k_shape, strides, (1,) * len(strides), pads,
                                     last, "test")
    if conv._use_winograd(g, last, np.float32):
        return "winograd"
    if conv._use_pointwise_gemm(g, last, pointwise):
        return "tiles"
    return "direct" if conv._use_direct(g, last) else "other"


@pytest.mark.parametrize("case", range(len(JOIN_CASES)))
def test_region_joins_same_bits_for_any_spin_and_team(case):
    # The join's spin bound (0: libgomp's barrier alone; the default; a long
    # one) and the team size (4 threads outnumber a 2-core machine, where
    # the join does not spin) change when threads wait, never what they
    # compute: every combination gives the same bits, and the reference.
    xs, ks, strides, pads, last, path, tune = JOIN_CASES[case]
    rng = np.random.default_rng(700 + case)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ks) * 0.2).astype(np.float32)
    bias = rng.standard_normal(ks[-1]).astype(np.float32)
    x_last = x if last else np.moveaxis(x, 1, -1)
    ref = ref_forward(x_last.astype(np.float64), w.astype(np.float64), strides, (1, 1), pads)
    ref = ref + bias
    if not last:
        ref = np.moveaxis(ref, -1, 1)
    old, nmax, window = dict(conv._TUNE), get_max_threads(), get_join_window()
    outs = []
    try:
        conv._TUNE.update(tune)
        conv._DIRECT_GEOMS.clear()
        assert _forward_path(xs, ks, strides, pads, last) == path
        for join in (0.0, window, 5e-3):
            set_join_window(join)
            for nt in (1, 2, 4):
                set_num_threads(nt)
                outs.append(conv.conv_forward(x, w, strides, (1, 1), pads, channels_last=last,
                                              bias=bias))
    finally:
        set_num_threads(nmax)
        set_join_window(window)
        conv._TUNE.clear()
        conv._TUNE.update(old)
        conv._DIRECT_GEOMS.clear()
    np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-4)
    for y in outs[1:]:
        assert np.array_equal(y, outs[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs, ks, strides, pads", [
    ((1, 5, 6, 80), (3, 3, 80, 72), (1, 1), [(1, 1), (1, 1)]),
    ((2, 9, 9, 70), (3, 3, 70, 40), (2, 2), [(0, 1), (1, 0)]),
    ((1, 12, 70), (5, 70, 130), (1,), [(2, 2)]),
])
def test_short_im2col_tiles(dtype, xs, ks, strides, pads):
    # Few output positions (one row block): the whole patch matrix, then the
    # 1x1 GEMM tiles with the epilogue in them; against the row blocks and
    # the reference, and the same bits on 1 and 2 threads.
    rng = np.random.default_rng(sum(xs) + sum(ks))
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ks) * 0.1).astype(dtype)
    dil = (1,) * len(strides)
    yshape = ref_forward(x, w, strides, dil, pads).shape
    bias = rng.standard_normal(ks[-1]).astype(dtype)
    res = rng.standard_normal(yshape).astype(dtype)
    ref = _ref_epilogue(ref_forward(x.astype(np.float64), w.astype(np.float64), strides, dil,
                                    pads), bias, "relu6", res)
    g = conv._geometry(xs, ks, strides, dil, pads, True, "test")[0]
    B = conv._block_rows(g, np.dtype(dtype).itemsize)
    old, nmax = dict(conv._TUNE), get_max_threads()
    outs = {}
    try:
        conv._TUNE.update(winograd=False, direct=False)
        for short in (True, False):
            conv._TUNE["short_im2col"] = short
            assert conv._use_short_im2col(g, True, False, B, np.dtype(dtype).itemsize) is short
            for nt in (1, 2):
                set_num_threads(nt)
                outs[short, nt] = conv.conv_forward(x, w, strides, dil, pads, bias=bias,
                                                    residual=res, activation="relu6")
    finally:
        set_num_threads(nmax)
        conv._TUNE.clear()
        conv._TUNE.update(old)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for y in outs.values():
        np.testing.assert_allclose(y, ref, rtol=tol, atol=tol)
    assert np.array_equal(outs[True, 1], outs[True, 2])


def test_geometry_with_list_pads_is_remembered():
    # Keras passes pads as a list of pairs: the validated geometry is kept
    # for the next call all the same, and a bad list is refused every time.
    args = ((2, 9, 9, 4), (3, 3, 4, 5), (1, 1), (1, 1))
    first = conv._geometry(*args, [(1, 1), [0, 2]], True, "test")
    assert conv._geometry(*args, [(1, 1), (0, 2)], True, "test") is first
    assert conv._geometry(*args, ((1, 1), (0, 2)), True, "test")[0] == first[0]
    for bad in ([(1, 1, 1), (0, 2)], [(1, 1, 1), (0, 2)], [({}, 1), (0, 2)]):
        with pytest.raises(TypeError, match="pads must be 2 .before, after. pairs"):
            conv._geometry(*args, bad, True, "test")
