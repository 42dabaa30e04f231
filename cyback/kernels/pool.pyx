"""Max and average pooling over 1, 2 or 3 spatial dims, forward and backward.

Every call is brought to a 3-D problem by giving missing spatial dims size 1,
and to a channels-last array ``(B, D, H, W, C)``: channels_first input
``(N, C, *spatial)`` is viewed as ``(N*C, *spatial, 1)``, so each
(sample, channel) plane is an independent "sample" with one channel.

Padding is explicit, ``pads = ((before, after), ...)`` per spatial dim. Padded
cells are skipped, never read: they cannot win a max, and the average divides
by the number of real cells in the window (TensorFlow's rule). Each side's pad
must be smaller than the window, so every window holds at least one real cell.
"""
import numpy as np
cimport cython
cimport numpy as cnp
from cython.parallel cimport prange, parallel
from libc.stdlib cimport malloc, free
from libc.string cimport memset

from cyback.kernels import settings as _settings
from cyback.kernels._blas cimport floating
from cyback.kernels.runtime cimport threads_for
from cyback.kernels._arrays cimport fits
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt
from cyback.kernels._checks import check_float, float_dtype, int_tuple, pad_pairs, remembered

cnp.import_array()


cdef extern from "cyback_pool.h" nogil:
    int cb_pool_window_f(const float* x, float* y, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                         Py_ssize_t d0, Py_ssize_t d1, Py_ssize_t h0, Py_ssize_t h1,
                         Py_ssize_t w0, Py_ssize_t w1, int is_max, float inv)
    int cb_simd_has_avx2()
    int cb_simd_use_avx2(int on)
    int cb_simd_use_avx512(int on)
    void cb_simd_set_default_cap(int cap)


cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)


def _use_avx2(bint on):
    """Run the float32 windows' AVX2 set when the CPU has it (the default),
    or the baseline per-pixel path (for tests). Returns whether AVX2 now
    runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let the float32 windows' AVX-512 set run when the CPU has it (the
    default), or cap them at AVX2 (for tests). Returns whether AVX-512 now
    runs."""
    return bool(cb_simd_use_avx512(on))


cdef inline Py_ssize_t _imax(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return a if a > b else b


cdef inline Py_ssize_t _imin(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return a if a < b else b


# The helpers below take raw pointers so gcc sees plain unit-stride loops over
# channels and vectorizes them; the selects are written out so no store is
# conditional.
cdef inline void _vmax(floating* y, const floating* x, Py_ssize_t c) noexcept nogil:
    cdef Py_ssize_t i
    cdef floating a, b
    for i in range(c):
        a = x[i]
        b = y[i]
        y[i] = a if a > b else b


cdef inline void _vmax4(floating* y, const floating* x0, const floating* x1,
                        const floating* x2, const floating* x3, Py_ssize_t c) noexcept nogil:
    # A full 2x2 window (MaxPooling2D(2)'s): the four cells in _vmax's order,
    # in registers, one store per value instead of a read-modify-write per cell.
    cdef Py_ssize_t i
    cdef floating m, a
    for i in range(c):
        m = x0[i]
        a = x1[i]
        m = a if a > m else m
        a = x2[i]
        m = a if a > m else m
        a = x3[i]
        y[i] = a if a > m else m


cdef inline void _vadd(floating* y, const floating* x, Py_ssize_t c) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(c):
        y[i] = y[i] + x[i]


cdef inline void _vaxpy(floating* y, const floating* x, floating a, Py_ssize_t c) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(c):
        y[i] = y[i] + a * x[i]


cdef inline void _vscale(floating* y, floating a, Py_ssize_t c) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(c):
        y[i] = y[i] * a


cdef inline void _vcopy(floating* y, const floating* x, Py_ssize_t c) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(c):
        y[i] = x[i]


# The max-gradient step is written in C, where restrict can promise that the
# four arrays do not overlap and the select can be written as bit masks.
# ``rem`` holds the gradient not yet routed; the first cell equal to the max
# takes all of it and zeroes it, so later ties get nothing.
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* The select is done on bit masks: gcc does not if-convert a ?: between
       float loads here (it reports control flow), but it vectorizes this.
       One body for both precisions, T the float type and U the unsigned
       integer of its width. */
    #define CB_POOL_MAXGRAD(NAME, T, U)                                           \
    static inline void NAME(T *restrict dx, T *restrict rem, const T *restrict x, \
                            const T *restrict y, Py_ssize_t c) {                  \
        for (Py_ssize_t i = 0; i < c; i++) {                                      \
            U r, m, take, keep;                                                   \
            T tf, kf;                                                             \
            memcpy(&r, &rem[i], sizeof r);                                        \
            m = -(U)(x[i] == y[i]);                                               \
            take = r & m;                                                         \
            keep = r & ~m;                                                        \
            memcpy(&tf, &take, sizeof tf);                                        \
            memcpy(&kf, &keep, sizeof kf);                                        \
            dx[i] += tf;                                                          \
            rem[i] = kf;                                                          \
        }                                                                         \
    }
    CB_POOL_MAXGRAD(cb_pool_maxgrad_f, float, uint32_t)
    CB_POOL_MAXGRAD(cb_pool_maxgrad_d, double, uint64_t)
    """
    void cb_pool_maxgrad_f(float* dx, float* rem, const float* x, const float* y,
                           Py_ssize_t c) noexcept nogil
    void cb_pool_maxgrad_d(double* dx, double* rem, const double* x, const double* y,
                           Py_ssize_t c) noexcept nogil


cdef inline void _vmax_grad(floating* dx, floating* rem, const floating* x,
                            const floating* y, Py_ssize_t c) noexcept nogil:
    if floating is float:
        cb_pool_maxgrad_f(dx, rem, x, y, c)
    else:
        cb_pool_maxgrad_d(dx, rem, x, y, c)


cdef struct OutRow:
    # An output row of the forward kernels' B * OD * OH: its sample b, depth
    # od and row oh, and the input cells its windows cover along D and H,
    # [d0, d1) and [h0, h1) (padded cells are never read).
    Py_ssize_t b, od, oh, d0, d1, h0, h1


cdef inline OutRow _out_row(Py_ssize_t r, Py_ssize_t OD, Py_ssize_t OH, Py_ssize_t D,
                            Py_ssize_t H, Py_ssize_t kd, Py_ssize_t kh, Py_ssize_t sd,
                            Py_ssize_t sh, Py_ssize_t pd, Py_ssize_t ph) noexcept nogil:
    # Returned, not written through pointers: Cython only privatizes a prange
    # variable that it sees assigned.
    cdef OutRow o
    o.b = r // (OD * OH)
    o.od = (r // OH) % OD
    o.oh = r % OH
    o.d0 = _imax(o.od * sd - pd, 0)
    o.d1 = _imin(o.od * sd - pd + kd, D)
    o.h0 = _imax(o.oh * sh - ph, 0)
    o.h1 = _imin(o.oh * sh - ph + kh, H)
    return o


# Channels_last rows of fewer channels than this take _fwd_row_s1 (stride 1
# along W); wider ones fill the vectors per pixel already.
cdef enum:
    ROW_PATH_MAX_C = 64


cdef void _fwd_row_s1(const floating[:, :, :, :, ::1] x, floating* yr, OutRow row,
                      Py_ssize_t kw, Py_ssize_t pw, bint is_max) noexcept nogil:
    """One output row of a stride-1 window along W, channels_last: each tap
    of the window is one pass over the run of output pixels it covers, a
    contiguous (pixels * C) block of the input row, so the loops vectorise
    whatever C is (per pixel, a few channels leave the vectors nearly
    empty: NASNet's 11). Every output takes its taps in the per-pixel
    path's order (the first valid one copied, then (d, h, w) order), so the
    values are the same bits."""
    cdef Py_ssize_t W = x.shape[3], C = x.shape[4], OW
    cdef Py_ssize_t i, j, kx, lo, hi, lo_prev, mid, ow, w0, w1, n
    cdef bint first
    cdef floating inv
    OW = W + 2 * pw - kw + 1
    if not is_max:
        memset(yr, 0, OW * C * sizeof(floating))
    first = True
    for i in range(row.d0, row.d1):
        for j in range(row.h0, row.h1):
            lo_prev = OW
            for kx in range(kw):
                lo = _imax(pw - kx, 0)
                hi = _imin(OW, W + pw - kx)
                if hi <= lo:
                    continue
                if is_max and first:
                    # outputs whose first valid tap this is take a copy
                    mid = _imin(lo_prev, hi)
                    if mid > lo:
                        _vcopy(yr + lo * C, &x[row.b, i, j, lo - pw + kx, 0], (mid - lo) * C)
                    if hi > mid:
                        _vmax(yr + mid * C, &x[row.b, i, j, mid - pw + kx, 0], (hi - mid) * C)
                    lo_prev = lo
                elif is_max:
                    _vmax(yr + lo * C, &x[row.b, i, j, lo - pw + kx, 0], (hi - lo) * C)
                else:
                    _vadd(yr + lo * C, &x[row.b, i, j, lo - pw + kx, 0], (hi - lo) * C)
            first = False
    if not is_max:
        n = (row.d1 - row.d0) * (row.h1 - row.h0)
        for ow in range(OW):
            w0 = _imax(ow - pw, 0)
            w1 = _imin(ow - pw + kw, W)
            inv = <floating>1 / <floating>(n * (w1 - w0))
            _vscale(yr + ow * C, inv, C)


# One output pixel of C < CB_POOL_SMALL_C channels: the window's cells
# reduced into 16 or 32 lanes kept in registers (lanes past C read the next
# pixel's values and are dropped; the caller keeps those reads inside the
# array), in the per-pixel path's order: the first cell copied (max) or added to zeros,
# then (d, h, w) order, so the values are the same bits. The per-pixel path
# loops over the C channels in a call per cell, which for NASNet's 11 costs
# several times the arithmetic.
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #define CB_POOL_SMALL_C 32
    typedef float cb_pool_v4f __attribute__((vector_size(16)));
    typedef int32_t cb_pool_v4i __attribute__((vector_size(16)));
    typedef double cb_pool_v2d __attribute__((vector_size(16)));
    typedef int64_t cb_pool_v2i __attribute__((vector_size(16)));
    /* 16-byte vectors, which every x86-64 CPU has; the max's select is on bit
       masks (GCC keeps a ?: between loads scalar, a compare and a branch per
       lane). */
    #define CB_POOL_WINDOW_SMALL(SUF, T, V, VI, LANES)                              \
    static void cb_pool_window_small_##SUF(const T *x, T *y, Py_ssize_t H,          \
            Py_ssize_t W, Py_ssize_t C, Py_ssize_t d0, Py_ssize_t d1, Py_ssize_t h0, \
            Py_ssize_t h1, Py_ssize_t w0, Py_ssize_t w1, int is_max) {              \
        enum { L = sizeof(V) / sizeof(T), NV = (LANES) / L };                       \
        V acc[NV], a;                                                               \
        VI m;                                                                       \
        T out[LANES];                                                               \
        Py_ssize_t i, j, k, q, c;                                                   \
        const T *p = x + ((d0 * H + h0) * W + w0) * C;                              \
        if (is_max) {                                                               \
            /* the first cell again changes nothing: a > acc is false */            \
            memcpy(acc, p, sizeof acc);                                             \
            for (i = d0; i < d1; i++)                                               \
                for (j = h0; j < h1; j++) {                                         \
                    p = x + ((i * H + j) * W + w0) * C;                             \
                    for (k = w0; k < w1; k++, p += C)                               \
                        for (q = 0; q < NV; q++) {                                  \
                            memcpy(&a, p + q * L, sizeof a);                        \
                            m = a > acc[q];                                         \
                            acc[q] = (V)(((VI)a & m) | ((VI)acc[q] & ~m));          \
                        }                                                           \
                }                                                                   \
        } else {                                                                    \
            const T inv = (T)1 / (T)((d1 - d0) * (h1 - h0) * (w1 - w0));           \
            for (q = 0; q < NV; q++) acc[q] = (V){0};                               \
            for (i = d0; i < d1; i++)                                               \
                for (j = h0; j < h1; j++) {                                         \
                    p = x + ((i * H + j) * W + w0) * C;                             \
                    for (k = w0; k < w1; k++, p += C)                               \
                        for (q = 0; q < NV; q++) {                                  \
                            memcpy(&a, p + q * L, sizeof a);                        \
                            acc[q] += a;                                            \
                        }                                                           \
                }                                                                   \
            for (q = 0; q < NV; q++) acc[q] *= inv;                                 \
        }                                                                           \
        memcpy(out, acc, sizeof out);                                               \
        for (c = 0; c < C; c++) y[c] = out[c];                                      \
    }
    /* lanes: 16 for up to 16 channels, 32 for up to 31 (NASNet's 11 and 22;
       at 32 the per-pixel path is as fast) */
    CB_POOL_WINDOW_SMALL(f16, float, cb_pool_v4f, cb_pool_v4i, 16)
    CB_POOL_WINDOW_SMALL(d16, double, cb_pool_v2d, cb_pool_v2i, 16)
    CB_POOL_WINDOW_SMALL(f32, float, cb_pool_v4f, cb_pool_v4i, 32)
    CB_POOL_WINDOW_SMALL(d32, double, cb_pool_v2d, cb_pool_v2i, 32)
    #define CB_POOL_WINDOW_PICK(SUF, T)                                             \
    static void cb_pool_window_small_##SUF(const T *x, T *y, Py_ssize_t H,          \
            Py_ssize_t W, Py_ssize_t C, Py_ssize_t d0, Py_ssize_t d1, Py_ssize_t h0, \
            Py_ssize_t h1, Py_ssize_t w0, Py_ssize_t w1, int is_max) {              \
        (C <= 16 ? cb_pool_window_small_##SUF##16 : cb_pool_window_small_##SUF##32)( \
            x, y, H, W, C, d0, d1, h0, h1, w0, w1, is_max);                         \
    }
    CB_POOL_WINDOW_PICK(f, float)
    CB_POOL_WINDOW_PICK(d, double)
    """
    enum: CB_POOL_SMALL_C
    void cb_pool_window_small_f(const float* x, float* y, Py_ssize_t H, Py_ssize_t W,
                                Py_ssize_t C, Py_ssize_t d0, Py_ssize_t d1, Py_ssize_t h0,
                                Py_ssize_t h1, Py_ssize_t w0, Py_ssize_t w1,
                                int is_max) noexcept nogil
    void cb_pool_window_small_d(const double* x, double* y, Py_ssize_t H, Py_ssize_t W,
                                Py_ssize_t C, Py_ssize_t d0, Py_ssize_t d1, Py_ssize_t h0,
                                Py_ssize_t h1, Py_ssize_t w0, Py_ssize_t w1,
                                int is_max) noexcept nogil


cdef inline void _window_small(const floating* x, floating* yp, Py_ssize_t H, Py_ssize_t W,
                               Py_ssize_t C, Py_ssize_t d0, Py_ssize_t d1, Py_ssize_t h0,
                               Py_ssize_t h1, Py_ssize_t w0, Py_ssize_t w1,
                               bint is_max) noexcept nogil:
    if floating is float:
        cb_pool_window_small_f(x, yp, H, W, C, d0, d1, h0, h1, w0, w1, is_max)
    else:
        cb_pool_window_small_d(x, yp, H, W, C, d0, d1, h0, h1, w0, w1, is_max)


cdef void _fwd(const floating[:, :, :, :, ::1] x, floating[:, :, :, :, ::1] y,
               Py_ssize_t kd, Py_ssize_t kh, Py_ssize_t kw,
               Py_ssize_t sd, Py_ssize_t sh, Py_ssize_t sw,
               Py_ssize_t pd, Py_ssize_t ph, Py_ssize_t pw, bint is_max,
        cb_intr* intr) noexcept nogil:
    cdef Py_ssize_t B = x.shape[0], D = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t C = x.shape[4]
    cdef Py_ssize_t OD = y.shape[1], OH = y.shape[2], OW = y.shape[3]
    cdef Py_ssize_t r, b, od, oh, ow, d0, d1, h0, h1, w0, w1, i, j, k
    cdef OutRow row
    cdef floating* yp
    cdef floating inv
    # float32 windows in vector registers (include/cyback_pool.h) beat the
    # row path too, but for rows of fewer channels than a vector holds
    cdef bint vector_windows = cb_simd_has_avx2()
    # Work: every output element reads its window once and is written once.
    cdef int nt = threads_for(<double>(B * OD * OH * OW * C) * (kd * kh * kw + 1))
    # One task per output row: rows never share output, and B*OD*OH is large
    # enough to balance threads even when the batch is tiny.
    for r in prange(B * OD * OH, schedule='static', num_threads=nt):
        if cb_intr_poll(intr):
            continue
        row = _out_row(r, OD, OH, D, H, kd, kh, sd, sh, pd, ph)
        b, od, oh, d0, d1, h0, h1 = row.b, row.od, row.oh, row.d0, row.d1, row.h0, row.h1
        if sw == 1 and C < ROW_PATH_MAX_C and OW == W + 2 * pw - kw + 1 and \
                d1 > d0 and h1 > h0 and kw <= W + pw and pw < kw and \
                not (floating is float and vector_windows and C >= 16):
            _fwd_row_s1(x, &y[b, od, oh, 0, 0], row, kw, pw, is_max)
            continue
        for ow in range(OW):
            w0 = _imax(ow * sw - pw, 0)
            w1 = _imin(ow * sw - pw + kw, W)
            yp = &y[b, od, oh, ow, 0]
            if floating is float and cb_pool_window_f(
                    &x[b, 0, 0, 0, 0], yp, H, W, C, d0, d1, h0, h1, w0, w1, is_max,
                    <float>1 / <float>((d1 - d0) * (h1 - h0) * (w1 - w0))):
                pass
            elif C < CB_POOL_SMALL_C and \
                    (((b * D + d1 - 1) * H + h1 - 1) * W + w1) * C + CB_POOL_SMALL_C - C \
                    <= B * D * H * W * C:
                # (the lanes past C of the window's last cell stay in x)
                _window_small(&x[b, 0, 0, 0, 0], yp, H, W, C, d0, d1, h0, h1, w0, w1, is_max)
            elif is_max and d1 - d0 == 1 and h1 - h0 == 2 and w1 - w0 == 2:
                _vmax4(yp, &x[b, d0, h0, w0, 0], &x[b, d0, h0, w0 + 1, 0],
                       &x[b, d0, h0 + 1, w0, 0], &x[b, d0, h0 + 1, w0 + 1, 0], C)
            elif is_max:
                _vcopy(yp, &x[b, d0, h0, w0, 0], C)
                for i in range(d0, d1):
                    for j in range(h0, h1):
                        for k in range(w0, w1):
                            _vmax(yp, &x[b, i, j, k, 0], C)
            else:
                memset(yp, 0, C * sizeof(floating))
                for i in range(d0, d1):
                    for j in range(h0, h1):
                        for k in range(w0, w1):
                            _vadd(yp, &x[b, i, j, k, 0], C)
                inv = <floating>1 / <floating>((d1 - d0) * (h1 - h0) * (w1 - w0))
                _vscale(yp, inv, C)


cdef inline Py_ssize_t _cdiv(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    # ceil(a / b) for b > 0 and any sign of a
    if a <= 0:
        return -((-a) // b)
    return (a + b - 1) // b


# Output columns ow whose input column ow*sw + off lies in [0, W) form
# [_ow_lo, _ow_hi). Returned rather than written through pointers: Cython
# only privatizes a prange variable that it sees assigned.
cdef inline Py_ssize_t _ow_lo(Py_ssize_t off, Py_ssize_t sw) noexcept nogil:
    return _imax(_cdiv(-off, sw), 0)


cdef inline Py_ssize_t _ow_hi(Py_ssize_t off, Py_ssize_t sw, Py_ssize_t W, Py_ssize_t OW,
                              Py_ssize_t lo) noexcept nogil:
    return _imax(_imin(_cdiv(W - off, sw), OW), lo)


cdef inline void _row_max(floating* y, const floating* x, Py_ssize_t off, Py_ssize_t sw,
                          Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    # y[ow] = max(y[ow], x[ow*sw + off]); strides 1 and 2 get constant-stride
    # loops that gcc can vectorize.
    cdef Py_ssize_t ow
    cdef floating a, b
    if sw == 1:
        for ow in range(lo, hi):
            a = x[ow + off]
            b = y[ow]
            y[ow] = a if a > b else b
    elif sw == 2:
        for ow in range(lo, hi):
            a = x[2 * ow + off]
            b = y[ow]
            y[ow] = a if a > b else b
    else:
        for ow in range(lo, hi):
            a = x[ow * sw + off]
            b = y[ow]
            y[ow] = a if a > b else b


cdef inline void _row_add(floating* y, const floating* x, Py_ssize_t off, Py_ssize_t sw,
                          Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    cdef Py_ssize_t ow
    if sw == 1:
        for ow in range(lo, hi):
            y[ow] = y[ow] + x[ow + off]
    elif sw == 2:
        for ow in range(lo, hi):
            y[ow] = y[ow] + x[2 * ow + off]
    else:
        for ow in range(lo, hi):
            y[ow] = y[ow] + x[ow * sw + off]


cdef void _fwd_c1(const floating[:, :, :, ::1] x, floating[:, :, :, ::1] y,
                  Py_ssize_t kd, Py_ssize_t kh, Py_ssize_t kw,
                  Py_ssize_t sd, Py_ssize_t sh, Py_ssize_t sw,
                  Py_ssize_t pd, Py_ssize_t ph, Py_ssize_t pw, bint is_max,
        cb_intr* intr) noexcept nogil:
    # Single-channel planes (channels_first): a window is only a few cells,
    # so instead of looping over windows, each window offset sweeps a whole
    # output row at once.
    cdef Py_ssize_t B = x.shape[0], D = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t OD = y.shape[1], OH = y.shape[2], OW = y.shape[3]
    cdef Py_ssize_t r, b, od, oh, ow, d0, d1, h0, h1, i, j, kx, off, lo, hi, n
    cdef OutRow row
    cdef floating* yr
    cdef const floating* xr
    cdef int nt = threads_for(<double>(B * OD * OH * OW) * (kd * kh * kw + 1))
    for r in prange(B * OD * OH, schedule='static', num_threads=nt):
        if cb_intr_poll(intr):
            continue
        row = _out_row(r, OD, OH, D, H, kd, kh, sd, sh, pd, ph)
        b, od, oh, d0, d1, h0, h1 = row.b, row.od, row.oh, row.d0, row.d1, row.h0, row.h1
        yr = &y[b, od, oh, 0]
        # the max starts from each window's first cell, as the channels_last
        # paths do: a window of NaNs gives NaN, not -inf
        for ow in range(OW):
            yr[ow] = x[b, d0, h0, _imax(ow * sw - pw, 0)] if is_max else 0
        for i in range(d0, d1):
            for j in range(h0, h1):
                xr = &x[b, i, j, 0]
                for kx in range(kw):
                    off = kx - pw
                    lo = _ow_lo(off, sw)
                    hi = _ow_hi(off, sw, W, OW, lo)
                    if is_max:
                        _row_max(yr, xr, off, sw, lo, hi)
                    else:
                        _row_add(yr, xr, off, sw, lo, hi)
        if not is_max:
            n = (d1 - d0) * (h1 - h0)
            for ow in range(OW):
                yr[ow] = yr[ow] / <floating>(n * (_imin(ow * sw - pw + kw, W)
                                                  - _imax(ow * sw - pw, 0)))


cdef void _bwd(const floating[:, :, :, :, ::1] x, const floating[:, :, :, :, ::1] y,
               const floating[:, :, :, :, ::1] dy, floating[:, :, :, :, ::1] dx,
               Py_ssize_t kd, Py_ssize_t kh, Py_ssize_t kw,
               Py_ssize_t sd, Py_ssize_t sh, Py_ssize_t sw,
               Py_ssize_t pd, Py_ssize_t ph, Py_ssize_t pw, bint is_max,
               Py_ssize_t cblk, int nt,
        cb_intr* intr) noexcept nogil:
    # Overlapping windows scatter into the same dx cells, so each task owns a
    # whole (sample, channel block) and walks its windows in order: no races,
    # and every cell accumulates in the same order whatever the thread count.
    cdef Py_ssize_t B = x.shape[0], D = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t C = x.shape[4]
    cdef Py_ssize_t OD = dy.shape[1], OH = dy.shape[2], OW = dy.shape[3]
    cdef Py_ssize_t nblk = (C + cblk - 1) // cblk
    cdef Py_ssize_t t, b, c0, cn, od, oh, ow, d0, d1, h0, h1, w0, w1, i, j, k
    cdef floating* rem = NULL
    cdef floating inv
    with parallel(num_threads=nt):
        rem = <floating*>malloc(cblk * sizeof(floating))
        for t in prange(B * nblk, schedule='static'):
            b = t // nblk
            c0 = (t % nblk) * cblk
            cn = _imin(cblk, C - c0)
            if cn == C:
                memset(&dx[b, 0, 0, 0, 0], 0, D * H * W * C * sizeof(floating))
            else:
                for i in range(D):
                    for j in range(H):
                        for k in range(W):
                            memset(&dx[b, i, j, k, c0], 0, cn * sizeof(floating))
            for od in range(OD):
                if cb_intr_poll(intr):
                    break
                d0 = _imax(od * sd - pd, 0)
                d1 = _imin(od * sd - pd + kd, D)
                for oh in range(OH):
                    h0 = _imax(oh * sh - ph, 0)
                    h1 = _imin(oh * sh - ph + kh, H)
                    for ow in range(OW):
                        w0 = _imax(ow * sw - pw, 0)
                        w1 = _imin(ow * sw - pw + kw, W)
                        if is_max:
                            _vcopy(rem, &dy[b, od, oh, ow, c0], cn)
                            for i in range(d0, d1):
                                for j in range(h0, h1):
                                    for k in range(w0, w1):
                                        _vmax_grad(&dx[b, i, j, k, c0], rem,
                                                   &x[b, i, j, k, c0],
                                                   &y[b, od, oh, ow, c0], cn)
                        else:
                            inv = <floating>1 / <floating>((d1 - d0) * (h1 - h0) * (w1 - w0))
                            for i in range(d0, d1):
                                for j in range(h0, h1):
                                    for k in range(w0, w1):
                                        _vaxpy(&dx[b, i, j, k, c0],
                                               &dy[b, od, oh, ow, c0], inv, cn)
        free(rem)


cdef void _bwd_c1(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] y,
                  const floating[:, :, :, ::1] dy, floating[:, :, :, ::1] dx,
                  Py_ssize_t kd, Py_ssize_t kh, Py_ssize_t kw,
                  Py_ssize_t sd, Py_ssize_t sh, Py_ssize_t sw,
                  Py_ssize_t pd, Py_ssize_t ph, Py_ssize_t pw, bint is_max,
        cb_intr* intr) noexcept nogil:
    # Single-channel planes: one task per plane (so overlapping windows never
    # race), sweeping whole output rows per window offset as in _fwd_c1.
    # Offsets are visited in (d, h, w) order, so for every output column the
    # first cell equal to the max is the one that takes its gradient.
    cdef Py_ssize_t B = x.shape[0], D = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t OD = dy.shape[1], OH = dy.shape[2], OW = dy.shape[3]
    cdef Py_ssize_t b, od, oh, ow, d0, d1, h0, h1, i, j, kx, off, lo, hi, n
    cdef floating* rem = NULL
    cdef floating* dxr
    cdef const floating* xr
    cdef const floating* yr
    # Work: dx is zeroed, then each window cell reads x, y and dy and updates dx.
    cdef int nt = threads_for(<double>(B * D * H * W)
                                 + 4.0 * (B * OD * OH * OW) * (kd * kh * kw))
    with parallel(num_threads=nt):
        rem = <floating*>malloc(OW * sizeof(floating))
        for b in prange(B, schedule='static'):
            memset(&dx[b, 0, 0, 0], 0, D * H * W * sizeof(floating))
            for od in range(OD):
                if cb_intr_poll(intr):
                    break
                d0 = _imax(od * sd - pd, 0)
                d1 = _imin(od * sd - pd + kd, D)
                for oh in range(OH):
                    h0 = _imax(oh * sh - ph, 0)
                    h1 = _imin(oh * sh - ph + kh, H)
                    yr = &y[b, od, oh, 0]
                    if is_max:
                        for ow in range(OW):
                            rem[ow] = dy[b, od, oh, ow]
                    else:
                        n = (d1 - d0) * (h1 - h0)
                        for ow in range(OW):
                            rem[ow] = dy[b, od, oh, ow] / <floating>(
                                n * (_imin(ow * sw - pw + kw, W) - _imax(ow * sw - pw, 0)))
                    for i in range(d0, d1):
                        for j in range(h0, h1):
                            xr = &x[b, i, j, 0]
                            dxr = &dx[b, i, j, 0]
                            for kx in range(kw):
                                off = kx - pw
                                lo = _ow_lo(off, sw)
                                hi = _ow_hi(off, sw, W, OW, lo)
                                if is_max:
                                    for ow in range(lo, hi):
                                        _vmax_grad(&dxr[ow * sw + off], &rem[ow],
                                                   &xr[ow * sw + off], &yr[ow], 1)
                                else:
                                    for ow in range(lo, hi):
                                        dxr[ow * sw + off] = dxr[ow * sw + off] + rem[ow]
        free(rem)


# One entry per kernel, typed with the fused float type: Cython picks the
# float or double specialisation from the arrays it is given.
def _run_fwd(const floating[:, :, :, :, ::1] x, floating[:, :, :, :, ::1] y, k, s, p,
             bint is_max):
    cdef cb_intr intr
    cb_intr_init(&intr)
    _fwd[floating](x, y, k[0], k[1], k[2], s[0], s[1], s[2], p[0], p[1], p[2], is_max, &intr)
    check_interrupt(&intr)


def _run_fwd_c1(const floating[:, :, :, ::1] x, floating[:, :, :, ::1] y, k, s, p,
                bint is_max):
    cdef cb_intr intr
    cb_intr_init(&intr)
    _fwd_c1[floating](x, y, k[0], k[1], k[2], s[0], s[1], s[2], p[0], p[1], p[2], is_max,
                      &intr)
    check_interrupt(&intr)


def _run_bwd(const floating[:, :, :, :, ::1] x, const floating[:, :, :, :, ::1] y,
             const floating[:, :, :, :, ::1] dy, floating[:, :, :, :, ::1] dx, k, s, p,
             bint is_max, Py_ssize_t cblk, int nt):
    cdef cb_intr intr
    cb_intr_init(&intr)
    _bwd[floating](x, y, dy, dx, k[0], k[1], k[2], s[0], s[1], s[2], p[0], p[1], p[2], is_max,
                   cblk, nt, &intr)
    check_interrupt(&intr)


def _run_bwd_c1(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] y,
                const floating[:, :, :, ::1] dy, floating[:, :, :, ::1] dx, k, s, p,
                bint is_max):
    cdef cb_intr intr
    cb_intr_init(&intr)
    _bwd_c1[floating](x, y, dy, dx, k[0], k[1], k[2], s[0], s[1], s[2], p[0], p[1], p[2],
                      is_max, &intr)
    check_interrupt(&intr)


_GEOMETRIES = {}


def _setup(name, x, pool_size, strides, pads, channels_last, mode):
    """Validate; return (x as float array, 3-D params, out spatial, out shape).
    The geometry is remembered per argument tuple: a model pools the same
    few shapes on every call, and checking them again cost as long as a
    batch-1 pooling."""
    if mode not in ('max', 'avg'):
        raise ValueError("%s: mode must be 'max' or 'avg', got %r" % (name, mode))
    x = np.asarray(x)
    check_float(name, x)
    geo = remembered(_GEOMETRIES, (x.shape, pool_size, strides, pads, bool(channels_last)),
                     _geometry, name, x.shape, pool_size, strides, pads, channels_last)
    return (x,) + geo


@cython.wraparound(True)
def _geometry(name, shape, pool_size, strides, pads, channels_last):
    nd = len(shape) - 2
    if nd not in (1, 2, 3):
        raise ValueError("%s: expected a 3-D, 4-D or 5-D input (1-3 spatial dims), got shape %s"
                         % (name, shape))
    ks = int_tuple(name, "pool_size", pool_size, nd)
    ss = int_tuple(name, "strides", strides, nd)
    ps = pad_pairs(name, pads, nd)
    spatial = shape[1:-1] if channels_last else shape[2:]
    out = []
    for d in range(nd):
        k, s, (pb, pa) = ks[d], ss[d], ps[d]
        if pb >= k or pa >= k:
            raise ValueError("%s: each pad must be in [0, pool_size), got pads %r for pool_size %r"
                             % (name, ps, ks))
        span = spatial[d] + pb + pa
        if span < k:
            raise ValueError("%s: window %r larger than padded input %s (pads %r)"
                             % (name, ks, spatial, ps))
        out.append((span - k) // s + 1)
    k3 = (1,) * (3 - nd) + ks
    s3 = (1,) * (3 - nd) + ss
    p3 = (0,) * (3 - nd) + tuple(p[0] for p in ps)
    n, c = shape[0], (shape[-1] if channels_last else shape[1])
    if channels_last:
        out_shape = (n,) + tuple(out) + (c,)
    else:
        out_shape = (n, c) + tuple(out)
    return nd, k3, s3, p3, tuple(spatial), tuple(out), out_shape


@cython.wraparound(True)
def _shape5(shape, nd, spatial, channels_last):
    """(B, D, H, W, C) (channels_last) or (B, D, H, W) planes for ``shape``."""
    sp = (1,) * (3 - nd) + tuple(spatial)
    if channels_last:
        return (shape[0],) + sp + (shape[-1],)
    return (shape[0] * shape[1],) + sp


def _as5(a, nd, spatial, channels_last):
    """View as (B, D, H, W, C) (channels_last) or (B, D, H, W) planes."""
    return np.ascontiguousarray(a).reshape(_shape5(a.shape, nd, spatial, channels_last))


@cython.wraparound(True)
def pool_forward(x, pool_size, strides, pads, channels_last=True, mode='max'):
    """Max or average pooling.

    x: float32/float64, (N, *spatial, C) if channels_last else (N, C, *spatial),
    1 to 3 spatial dims. pool_size, strides: int or one int per spatial dim.
    pads: ((before, after), ...) per spatial dim, each pad < pool size.
    Returns the pooled array in the same layout and dtype.
    """
    name = "pool_forward"
    x, nd, k3, s3, p3, spatial, out, out_shape = _setup(
        name, x, pool_size, strides, pads, channels_last, mode)
    y = np.empty(out_shape, dtype=x.dtype)
    if y.size == 0:
        return y
    xv = _as5(x, nd, spatial, channels_last)
    yv = _as5(y, nd, out, channels_last)
    is_max = mode == 'max'
    if channels_last:
        _run_fwd(xv, yv, k3, s3, p3, is_max)
    else:
        _run_fwd_c1(xv, yv, k3, s3, p3, is_max)
    return y


cdef class ForwardCall:
    """``pool_forward`` for one input shape, dtype and window, validated once
    by ``forward_call``: a call checks the array's type, dtype, shape and
    contiguity and runs the kernel on its 5-D (or plane) view. An array that
    does not fit takes pool_forward, which converts or raises."""
    cdef tuple x_shape, y_shape, x5, y5, args
    cdef int typenum
    cdef bint last, is_max
    cdef Py_ssize_t k[3]
    cdef Py_ssize_t s[3]
    cdef Py_ssize_t p[3]

    def __call__(self, x):
        if not fits(x, self.typenum, self.x_shape):
            return pool_forward(x, *self.args)
        y = np.empty(self.y_shape, x.dtype)
        if self.typenum == cnp.NPY_FLOAT:
            self._run_f(x.reshape(self.x5), y.reshape(self.y5))
        else:
            self._run_d(x.reshape(self.x5), y.reshape(self.y5))
        return y

    cdef _run_f(self, xv, yv):
        cdef cb_intr intr
        cb_intr_init(&intr)
        if self.last:
            _fwd[float](xv, yv, self.k[0], self.k[1], self.k[2], self.s[0], self.s[1],
                        self.s[2], self.p[0], self.p[1], self.p[2], self.is_max, &intr)
        else:
            _fwd_c1[float](xv, yv, self.k[0], self.k[1], self.k[2], self.s[0], self.s[1],
                           self.s[2], self.p[0], self.p[1], self.p[2], self.is_max, &intr)
        check_interrupt(&intr)

    cdef _run_d(self, xv, yv):
        cdef cb_intr intr
        cb_intr_init(&intr)
        if self.last:
            _fwd[double](xv, yv, self.k[0], self.k[1], self.k[2], self.s[0], self.s[1],
                         self.s[2], self.p[0], self.p[1], self.p[2], self.is_max, &intr)
        else:
            _fwd_c1[double](xv, yv, self.k[0], self.k[1], self.k[2], self.s[0], self.s[1],
                            self.s[2], self.p[0], self.p[1], self.p[2], self.is_max, &intr)
        check_interrupt(&intr)


@cython.wraparound(True)
def forward_call(x_shape, pool_size, strides, pads, channels_last, mode, dtype):
    """A prepared ``pool_forward(x, pool_size, strides, pads, channels_last,
    mode)`` for float32 / float64 arrays of shape ``x_shape``: ``call(x)``.
    The checks (and their errors) are pool_forward's, made here once; an
    input with no output runs pool_forward every time."""
    name = "pool_forward"
    cdef ForwardCall call = ForwardCall()
    dtype = float_dtype(name, dtype)
    if mode not in ('max', 'avg'):
        raise ValueError("%s: mode must be 'max' or 'avg', got %r" % (name, mode))
    x_shape = tuple(int(d) for d in x_shape)
    nd, k3, s3, p3, spatial, out, out_shape = remembered(
        _GEOMETRIES, (x_shape, pool_size, strides, pads, bool(channels_last)), _geometry, name,
        x_shape, pool_size, strides, pads, channels_last)
    call.args = (pool_size, strides, pads, channels_last, mode)
    call.x_shape, call.y_shape = x_shape, out_shape
    call.x5 = _shape5(x_shape, nd, spatial, channels_last)
    call.y5 = _shape5(out_shape, nd, out, channels_last)
    call.last, call.is_max = bool(channels_last), mode == 'max'
    for i in range(3):
        call.k[i], call.s[i], call.p[i] = k3[i], s3[i], p3[i]
    call.typenum = dtype.num if 0 not in out_shape else -1
    return call


@cython.wraparound(True)
def pool_backward(x, y, dy, pool_size, strides, pads, channels_last=True, mode='max'):
    """Gradient of ``pool_forward`` with respect to x.

    y is the forward output (used by 'max'; may be None, then recomputed).
    Max routes each window's gradient to the first cell (in D, H, W order)
    equal to the window max; average spreads dy / (number of real cells).
    """
    name = "pool_backward"
    x, nd, k3, s3, p3, spatial, out, out_shape = _setup(
        name, x, pool_size, strides, pads, channels_last, mode)
    dy = np.asarray(dy)
    if dy.shape != out_shape:
        raise ValueError("%s: dy has shape %s, expected %s for input %s"
                         % (name, dy.shape, out_shape, x.shape))
    check_float(name, x, dy)
    is_max = mode == 'max'
    if is_max:
        if y is None:
            y = pool_forward(x, pool_size, strides, pads, channels_last, mode)
        y = np.asarray(y)
        if y.shape != out_shape or y.dtype != x.dtype:
            raise ValueError("%s: y has shape %s and dtype %s, expected %s and %s"
                             % (name, y.shape, y.dtype, out_shape, x.dtype))
    else:
        y = dy  # unused by the average path
    dx = np.empty(x.shape, dtype=x.dtype)
    if dx.size == 0:
        return dx
    if dy.size == 0:
        dx[...] = 0
        return dx
    xv = _as5(x, nd, spatial, channels_last)
    yv = _as5(y, nd, out, channels_last)
    dyv = _as5(dy, nd, out, channels_last)
    dxv = _as5(dx, nd, spatial, channels_last)
    if channels_last:
        # Work: dx is zeroed, then each window cell reads x, y and dy and
        # updates dx. Split channels only when samples alone cannot keep every
        # thread busy (the split does not change any result).
        nt = threads_for(<double>x.size
                            + 4.0 * dy.size * (k3[0] * k3[1] * k3[2]))
        c = xv.shape[4]
        cblk = c
        if nt > 1 and xv.shape[0] < 2 * nt and c >= 32:
            nblk = min((2 * nt + xv.shape[0] - 1) // xv.shape[0], c // 16)
            cblk = (c + nblk - 1) // nblk
        _run_bwd(xv, yv, dyv, dxv, k3, s3, p3, is_max, cblk, nt)
    else:
        _run_bwd_c1(xv, yv, dyv, dxv, k3, s3, p3, is_max)
    return dx
