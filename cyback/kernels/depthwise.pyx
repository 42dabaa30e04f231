"""Direct depthwise convolution (Keras ``depthwise_conv2d``), forward and backward.

Kernel layout (kh, kw, C, M) with depth multiplier M; output channel c*M + m
is input channel c filtered by kernel[:, :, c, m]. Inputs are 2-D images
(N, H, W, C) / (N, C, H, W), or 1-D sequences (N, W, C) / (N, C, W) with a
(kw, C, M) kernel, which run as images of height 1 (separable_conv1d).

Padding is explicit, ``pads = ((top, bottom), (left, right))`` (one pair for
1-D); out = (in + before + after - ((k - 1) * dilation + 1)) // stride + 1.

Why direct loops rather than im2col + GEMM: each output channel sees only one
input channel, so a GEMM would be a batch of (k*k)-long dot products and the
patch matrix would cost more memory traffic than the convolution itself.

This module holds the entries, the runners that pick a path for each pass,
and the test switches; the paths are in its included parts:
depthwise_args.pxi (argument checks, geometry), depthwise_rows.pxi
(channels_last input rows), depthwise_last.pxi (channels_last passes),
depthwise_narrow.pxi (narrow channels_first planes through the channels_last
rows, layout swap), depthwise_first.pxi (channels_first passes) and
depthwise_prepared.pxi (forward_call). Their C kernels are in
include/cyback_depthwise.h and the headers it names.
"""
from cyback.kernels import settings as _settings
import numpy as np
cimport cython
cimport numpy as cnp
from cython.parallel cimport prange, parallel
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset

from cyback.kernels._blas cimport floating
from cyback.kernels._checks import check_float, float_dtype, int_tuple, pad_pairs, remembered
from cyback.kernels.runtime cimport team_done, threads_for
from cyback.kernels._arrays cimport fits
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt

cnp.import_array()

cdef extern from "cyback_depthwise.h" nogil:
    int cb_simd_use_avx2(int on)
    int cb_simd_has_avx2()
    void cb_simd_set_default_cap(int cap)
    int cb_depthwise_use_k3(int on)
    int cb_depthwise_read_edges(int on)
    void cb_depthwise_sum_groups_f(const float* t, float* d, Py_ssize_t n, Py_ssize_t M)
    void cb_depthwise_sum_groups_d(const double* t, double* d, Py_ssize_t n, Py_ssize_t M)
    bint cb_depthwise_fwd_cf_same3_f(
        const float* x, Py_ssize_t H, Py_ssize_t W, const float* k, Py_ssize_t ks, float* y,
        const float* zero, float bias, int act)
    bint cb_depthwise_fwd_cf_same3_d(
        const double* x, Py_ssize_t H, Py_ssize_t W, const double* k, Py_ssize_t ks, double* y,
        const double* zero, double bias, int act)
    void cb_depthwise_transpose_f(const float* src, Py_ssize_t ls, float* dst, Py_ssize_t ld,
                                  Py_ssize_t R, Py_ssize_t S)
    void cb_depthwise_transpose_d(const double* src, Py_ssize_t ls, double* dst, Py_ssize_t ld,
                                  Py_ssize_t R, Py_ssize_t S)
    void cb_depthwise_fwd_cl_row_f(
        const float** xr, const float* k, float* y, Py_ssize_t C, Py_ssize_t xs, Py_ssize_t W,
        Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dil_w,
        Py_ssize_t pw, const float* bias, int act, const void* pf, Py_ssize_t pfb)
    void cb_depthwise_fwd_cl_row_d(
        const double** xr, const double* k, double* y, Py_ssize_t C, Py_ssize_t xs,
        Py_ssize_t W, Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dil_w,
        Py_ssize_t pw, const double* bias, int act, const void* pf, Py_ssize_t pfb)
    void cb_depthwise_kgrad_cl_row_f(
        const float** xr, const float* dy, float* part, Py_ssize_t C, Py_ssize_t xs,
        Py_ssize_t ys, Py_ssize_t W, Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t OW, Py_ssize_t sw,
        Py_ssize_t dil_w, Py_ssize_t pw, const void* pf, Py_ssize_t pfb, const void* pf2,
        Py_ssize_t pf2b)
    void cb_depthwise_kgrad_cl_row_d(
        const double** xr, const double* dy, double* part, Py_ssize_t C, Py_ssize_t xs,
        Py_ssize_t ys, Py_ssize_t W, Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t OW, Py_ssize_t sw,
        Py_ssize_t dil_w, Py_ssize_t pw, const void* pf, Py_ssize_t pfb, const void* pf2,
        Py_ssize_t pf2b)
    void cb_depthwise_pad_plane_f(
        const float* src, Py_ssize_t H, Py_ssize_t W, float* buf, Py_ssize_t Hp, Py_ssize_t Wp,
        Py_ssize_t pt, Py_ssize_t pl, Py_ssize_t sw, Py_ssize_t uh, Py_ssize_t uw)
    void cb_depthwise_pad_plane_d(
        const double* src, Py_ssize_t H, Py_ssize_t W, double* buf, Py_ssize_t Hp,
        Py_ssize_t Wp, Py_ssize_t pt, Py_ssize_t pl, Py_ssize_t sw, Py_ssize_t uh, Py_ssize_t uw)
    void cb_depthwise_fwd_cf_plane_f(
        const float* x, Py_ssize_t rs, const float* k, Py_ssize_t ks, float* y, Py_ssize_t OH,
        Py_ssize_t OW, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dil_h, Py_ssize_t dil_w,
        Py_ssize_t KH, Py_ssize_t KW, int accumulate, float bias, int act)
    void cb_depthwise_fwd_cf_plane_d(
        const double* x, Py_ssize_t rs, const double* k, Py_ssize_t ks, double* y,
        Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dil_h,
        Py_ssize_t dil_w, Py_ssize_t KH, Py_ssize_t KW, int accumulate, double bias, int act)
    void cb_depthwise_kgrad_cf_plane_f(
        const float* x, Py_ssize_t rs, const float* dy, Py_ssize_t OH, Py_ssize_t OW,
        Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dil_h, Py_ssize_t dil_w, Py_ssize_t KH,
        Py_ssize_t KW, float* acc)
    void cb_depthwise_kgrad_cf_plane_d(
        const double* x, Py_ssize_t rs, const double* dy, Py_ssize_t OH, Py_ssize_t OW,
        Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dil_h, Py_ssize_t dil_w, Py_ssize_t KH,
        Py_ssize_t KW, double* acc)

# CYBACK_AVX512=0 caps this module's vector kernels at AVX2 (the registry reads it).
cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)


cdef inline Py_ssize_t _imax(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return a if a > b else b


cdef inline Py_ssize_t _imin(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return a if a < b else b


cdef inline Py_ssize_t _cdiv(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    # ceil(a / b) for b > 0 and any sign of a
    if a <= 0:
        return -((-a) // b)
    return (a + b - 1) // b


include "depthwise_args.pxi"
include "depthwise_rows.pxi"
include "depthwise_last.pxi"
include "depthwise_narrow.pxi"
include "depthwise_first.pxi"
include "depthwise_prepared.pxi"


# ---------------------------------------------------------------- runners
# One per pass, specialised by Cython for the arrays' dtype; each owns the
# call's interrupt state.

def _forward(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] k,
             floating[:, :, :, ::1] y, bint channels_last, tuple geom, const floating[::1] bias,
             int act):
    cdef cb_intr intr
    cdef _Geom g = _geom(geom)
    cdef cnp.ndarray kp
    cb_intr_init(&intr)
    if channels_last:
        _fwd_cl(x, k, y, g, bias, act, &intr)
    elif (_narrow_cf(False, y.shape[3], k.shape[3])
          and x.shape[2] * _cf_narrow_width(x.shape[3], y.shape[3], k.shape[1], g)
          * NARROW_BLOCK_BYTES
          <= STAGE_MAX_BYTES):
        kp = np.empty(max(1, k.shape[0] * k.shape[1] * k.shape[2]),
                      np.float32 if floating is float else np.float64)
        _fwd_cf_narrow(x, k, y, g, &bias[0] if bias.shape[0] > 0 else NULL, act,
                       <floating*>cnp.PyArray_DATA(kp), &intr)
    else:
        _planes_cf(x, k, y, False, g, 1, 1, &bias[0] if bias.shape[0] > 0 else NULL, act,
                   &intr)
    check_interrupt(&intr)


def _backward_input(const floating[:, :, :, ::1] dy, const floating[:, :, :, ::1] k,
                    floating[:, :, :, ::1] dx, bint channels_last, bint flipped, tuple geom):
    # flipped: k is the spatially flipped kernel and the pads of geom its
    # padding of dy, so that dx is a stride-1 forward pass over dy upsampled
    # by the strides (only channels_first takes strides > 1).
    cdef cb_intr intr
    cdef _Geom g = _geom(geom), s1 = g
    s1.sh = s1.sw = 1
    cb_intr_init(&intr)
    if flipped and channels_last:
        _bwd_in_cl_s1(dy, k, dx, g, &intr)
    elif flipped:
        _planes_cf(dy, k, dx, True, s1, g.sh, g.sw, NULL, 0, &intr)
    elif channels_last:
        _bwd_in_cl(dy, k, dx, g, &intr)
    else:
        _bwd_in_cf(dy, k, dx, g, &intr)
    check_interrupt(&intr)


def _backward_kernel(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] dy,
                     floating[:, :, :, ::1] dk, floating[:, :, :, :, ::1] part,
                     bint channels_last, tuple geom, bint narrow=False):
    # channels_last sums into the fixed number of partial kernels part, then
    # adds them up in order; narrow channels_first planes go a block of
    # channels at a time through the channels_last rows (part unused).
    cdef cb_intr intr
    cdef _Geom g = _geom(geom)
    cb_intr_init(&intr)
    if narrow:
        _bwd_k_cf_narrow(x, dy, dk, g, &intr)
    elif channels_last:
        _bwd_k_cl(x, dy, part, g, &intr)
        if not intr.stop:
            _reduce_parts(&part[0, 0, 0, 0, 0], part.shape[0],
                          dk.shape[0] * dk.shape[1] * dk.shape[2] * dk.shape[3], &dk[0, 0, 0, 0])
    else:
        _bwd_k_cf(x, dy, dk, g, &intr)
    check_interrupt(&intr)


# ---------------------------------------------------------------- Python API

def _use_avx2(bint on):
    """Run the AVX2 + FMA row kernels when the CPU has them (the default), or
    the baseline ones (for tests). Returns whether the AVX2 ones now run."""
    return bool(cb_simd_use_avx2(on))


def _stage_rows(bint on):
    """Stage channels_last input rows where that is faster (the default), or
    read them in place unless a depth multiplier expands them (for tests).
    Returns the new setting."""
    global _staging
    _staging = on
    return bool(_staging)


def _read_edges(bint on):
    """Let the 3x3 "same" channels_first plane kernel read the planes' edges
    (the default), or pad every plane into a buffer first (for tests).
    Returns the new setting."""
    return bool(cb_depthwise_read_edges(on))


def _use_k3(bint on):
    """Run 3x3 channels_first planes at row stride 1 or 2 and unit row
    dilation through their row-reuse tiles (the default), or through the
    general ones (for tests). Returns whether the row-reuse tiles now run."""
    return bool(cb_depthwise_use_k3(on))


@cython.wraparound(True)
def depthwise_forward(x, kernel, strides, dilation, pads, channels_last=True, bias=None,
                      activation=None):
    """Depthwise convolution.

    x: (N, H, W, C) if channels_last else (N, C, H, W); or 1-D (N, W, C) /
    (N, C, W). kernel: (kh, kw, C, M) (1-D: (kw, C, M)), same float dtype.
    strides, dilation: int or per-dim ints. pads: ((before, after), ...).
    Optional epilogue, fused into the pass over each output row: bias, (C*M,)
    of the same dtype, added per output channel; then activation None,
    'linear', 'relu' or 'relu6' (min(max(v, 0), 6)).
    Returns (N, OH, OW, C*M) / (N, C*M, OH, OW) (1-D: without OH).
    """
    name = "depthwise_forward"
    x = np.asarray(x)
    kernel = np.asarray(kernel)
    check_float(name, x, kernel)
    nd, ss, ds, ps, spatial, out = _params(name, x.shape, kernel.shape, strides, dilation,
                                           pads, channels_last)
    C, M = kernel.shape[-2], kernel.shape[-1]
    if activation not in _ACTIVATIONS:
        raise ValueError("%s: activation must be one of None, 'linear', 'relu', 'relu6', got %r"
                         % (name, activation))
    act = _ACTIVATIONS[activation]
    if bias is None:
        bias = np.empty(0, dtype=x.dtype)
    else:
        bias = np.ascontiguousarray(bias)
        if bias.dtype != x.dtype or bias.shape != (C * M,):
            raise ValueError("%s: bias must be a %s array of shape (%d,), got %s %s"
                             % (name, x.dtype, C * M, bias.dtype, bias.shape))
    y = np.empty(_out_shape(x.shape[0], C * M, out, nd, channels_last), dtype=x.dtype)
    if y.size == 0:
        return y
    xv, kv, yv = _img(x, nd, channels_last), _ker(kernel, nd), _img(y, nd, channels_last)
    _forward(xv, kv, yv, channels_last, ss + ds + (ps[0][0], ps[1][0]), bias, act)
    return y


@cython.wraparound(True)
def depthwise_backward_input(dy, kernel, x_shape, strides, dilation, pads, channels_last=True):
    """Gradient of depthwise_forward with respect to x; returns an array of x_shape."""
    name = "depthwise_backward_input"
    dy = np.asarray(dy)
    kernel = np.asarray(kernel)
    check_float(name, dy, kernel)
    x_shape = tuple(int(s) for s in x_shape)
    nd, ss, ds, ps, spatial, out = _params(name, x_shape, kernel.shape, strides, dilation,
                                           pads, channels_last)
    C, M = kernel.shape[-2], kernel.shape[-1]
    want = _out_shape(x_shape[0], C * M, out, nd, channels_last)
    if dy.shape != want:
        raise ValueError("%s: dy has shape %s, expected %s for input %s and kernel %s"
                         % (name, dy.shape, want, x_shape, kernel.shape))
    dx = np.empty(x_shape, dtype=dy.dtype)
    if dx.size == 0:
        return dx
    dyv, kv, dxv = _img(dy, nd, channels_last), _ker(kernel, nd), _img(dx, nd, channels_last)
    spans = ((kv.shape[0] - 1) * ds[0], (kv.shape[1] - 1) * ds[1])
    before = all(a <= e for (a, b), e in zip(ps, spans))
    after = all(b <= e for (a, b), e in zip(ps, spans))
    if _narrow_cf(channels_last, dyv.shape[3], M):
        if before and ss == (1, 1):
            # The forward pass over dy with the flipped kernel: narrow
            # planes through the channels_last rows a block of channels at
            # a time, in cache (_fwd_cf_narrow; dx 8 or more wide, or past
            # the staging budget: _planes_cf). Transposing dy and dx whole
            # would take two more passes over memory.
            _forward(dyv, np.ascontiguousarray(kv[::-1, ::-1]), dxv, False,
                     ss + ds + (spans[0] - ps[0][0], spans[1] - ps[1][0]),
                     np.empty(0, dtype=dy.dtype), 0)
            return dx
        # Strided, or a leading pad past the kernel's span: through
        # channels_last.
        dxl = depthwise_backward_input(_to_layout(dyv, True), kv, _cl_shape(dxv.shape), ss,
                                       ds, ps)
        _to_layout(dxl, False, dxv)
        return dx
    if before and (not channels_last or ss == (1, 1) and after):
        # A forward pass over dy with the flipped kernel (_bwd_in_cl_s1 at
        # stride 1; _planes_cf, over dy upsampled by the strides), at forward
        # speed and with no scatter.
        kf = np.ascontiguousarray(kv[::-1, ::-1])
        _backward_input(dyv, kf, dxv, channels_last, True,
                        ss + ds + (spans[0] - ps[0][0], spans[1] - ps[1][0]))
        return dx
    _backward_input(dyv, kv, dxv, channels_last, False, ss + ds + (ps[0][0], ps[1][0]))
    return dx


@cython.wraparound(True)
def depthwise_backward_kernel(x, dy, kernel_shape, strides, dilation, pads, channels_last=True):
    """Gradient of depthwise_forward with respect to the kernel (kernel_shape).

    Deterministic: the same result for any thread count.
    """
    name = "depthwise_backward_kernel"
    x = np.asarray(x)
    dy = np.asarray(dy)
    check_float(name, x, dy)
    kernel_shape = tuple(int(s) for s in kernel_shape)
    nd, ss, ds, ps, spatial, out = _params(name, x.shape, kernel_shape, strides, dilation,
                                           pads, channels_last)
    C, M = kernel_shape[-2], kernel_shape[-1]
    want = _out_shape(x.shape[0], C * M, out, nd, channels_last)
    if dy.shape != want:
        raise ValueError("%s: dy has shape %s, expected %s for input %s and kernel %s"
                         % (name, dy.shape, want, x.shape, kernel_shape))
    dk = np.empty(kernel_shape, dtype=x.dtype)
    if dk.size == 0:
        return dk
    if x.shape[0] == 0:
        dk[...] = 0
        return dk
    xv, dyv = _img(x, nd, channels_last), _img(dy, nd, channels_last)
    dkv = _ker(dk, nd)
    if _narrow_cf(channels_last, dyv.shape[3], M):
        if ((xv.shape[2] * xv.shape[3] + dyv.shape[2] * dyv.shape[3]) * NARROW_BLOCK_BYTES
                <= STAGE_MAX_BYTES
                and C * x.itemsize >= NARROW_KGRAD_MIN_BLOCKS * NARROW_BLOCK_BYTES):
            # A block of channels at a time, in cache: transposing x and dy
            # whole would take two more passes over memory. Its tasks are the
            # blocks: with fewer, the whole-array path below splits the
            # rows over the team instead.
            _backward_kernel(xv, dyv, dkv, np.empty((0,) + dkv.shape, dtype=x.dtype), False,
                             ss + ds + (ps[0][0], ps[1][0]), True)
        else:
            dkv[...] = depthwise_backward_kernel(_to_layout(xv, True), _to_layout(dyv, True),
                                                 dkv.shape, ss, ds, ps)
        return dk
    P = min(x.shape[0] * out[0], KGRAD_CHUNKS) if channels_last else 0
    part = np.empty((P,) + dkv.shape, dtype=x.dtype)
    _backward_kernel(xv, dyv, dkv, part, channels_last, ss + ds + (ps[0][0], ps[1][0]))
    return dk
