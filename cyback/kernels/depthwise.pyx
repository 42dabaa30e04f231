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
"""
from cyback.kernels import settings as _settings
import numpy as np
cimport cython
cimport numpy as cnp
from cython.parallel cimport prange, parallel
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset

from cyback.kernels._blas cimport floating
from cyback.kernels._checks import check_float, remembered
from cyback.kernels.runtime cimport team_done, threads_for
from cyback.kernels._arrays cimport fits
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt

cnp.import_array()

cdef extern from "cyback_depthwise.h" nogil:
    int cb_simd_use_avx2(int on)
    void cb_simd_set_default_cap(int cap)
    int cb_depthwise_use_k3(int on)
    int cb_depthwise_read_edges(int on)
    void cb_depthwise_sum_groups_f(const float* t, float* d, Py_ssize_t n, Py_ssize_t M)
    void cb_depthwise_sum_groups_d(const double* t, double* d, Py_ssize_t n, Py_ssize_t M)
    bint cb_depthwise_fwd_cf_same3_f(const float* x, Py_ssize_t H, Py_ssize_t W, const float* k,
                              Py_ssize_t ks, float* y, const float* zero, float bias, int act)
    bint cb_depthwise_fwd_cf_same3_d(const double* x, Py_ssize_t H, Py_ssize_t W, const double* k,
                              Py_ssize_t ks, double* y, const double* zero, double bias,
                              int act)
    void cb_depthwise_transpose_f(const float* src, Py_ssize_t ls, float* dst, Py_ssize_t ld,
                           Py_ssize_t R, Py_ssize_t S)
    void cb_depthwise_transpose_d(const double* src, Py_ssize_t ls, double* dst, Py_ssize_t ld,
                           Py_ssize_t R, Py_ssize_t S)
    void cb_depthwise_fwd_cl_row_f(const float** xr, const float* k, float* y, Py_ssize_t C,
                            Py_ssize_t xs, Py_ssize_t W, Py_ssize_t KH, Py_ssize_t KW,
                            Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dw, Py_ssize_t pw,
                            const float* bias, int act, const void* pf,
                            Py_ssize_t pfb)
    void cb_depthwise_fwd_cl_row_d(const double** xr, const double* k, double* y, Py_ssize_t C,
                            Py_ssize_t xs, Py_ssize_t W, Py_ssize_t KH, Py_ssize_t KW,
                            Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dw, Py_ssize_t pw,
                            const double* bias, int act, const void* pf,
                            Py_ssize_t pfb)
    void cb_depthwise_kgrad_cl_row_f(const float** xr, const float* dy, float* part, Py_ssize_t C,
                              Py_ssize_t xs, Py_ssize_t ys, Py_ssize_t W, Py_ssize_t KH,
                              Py_ssize_t KW, Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dw,
                              Py_ssize_t pw, const void* pf, Py_ssize_t pfb,
                              const void* pf2, Py_ssize_t pf2b)
    void cb_depthwise_kgrad_cl_row_d(const double** xr, const double* dy, double* part, Py_ssize_t C,
                              Py_ssize_t xs, Py_ssize_t ys, Py_ssize_t W, Py_ssize_t KH,
                              Py_ssize_t KW, Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dw,
                              Py_ssize_t pw, const void* pf, Py_ssize_t pfb,
                              const void* pf2, Py_ssize_t pf2b)
    void cb_depthwise_pad_plane_f(const float* src, Py_ssize_t H, Py_ssize_t W, float* buf,
                           Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t pt, Py_ssize_t pl,
                           Py_ssize_t sw, Py_ssize_t uh, Py_ssize_t uw)
    void cb_depthwise_pad_plane_d(const double* src, Py_ssize_t H, Py_ssize_t W, double* buf,
                           Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t pt, Py_ssize_t pl,
                           Py_ssize_t sw, Py_ssize_t uh, Py_ssize_t uw)
    void cb_depthwise_fwd_cf_plane_f(const float* x, Py_ssize_t rs, const float* k, Py_ssize_t ks,
                              float* y, Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t sh,
                              Py_ssize_t sw, Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t KH,
                              Py_ssize_t KW, int accumulate, float bias, int act)
    void cb_depthwise_fwd_cf_plane_d(const double* x, Py_ssize_t rs, const double* k, Py_ssize_t ks,
                              double* y, Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t sh,
                              Py_ssize_t sw, Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t KH,
                              Py_ssize_t KW, int accumulate, double bias, int act)
    void cb_depthwise_kgrad_cf_plane_f(const float* x, Py_ssize_t rs, const float* dy, Py_ssize_t OH,
                                Py_ssize_t OW, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dh,
                                Py_ssize_t dw, Py_ssize_t KH, Py_ssize_t KW, float* acc)
    void cb_depthwise_kgrad_cf_plane_d(const double* x, Py_ssize_t rs, const double* dy,
                                Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t sh, Py_ssize_t sw,
                                Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t KH, Py_ssize_t KW,
                                double* acc)

# CYBACK_AVX512=0 caps this module's vector kernels at AVX2 (the registry reads it).
cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)

# Fixed number of partial sums for the channels_last kernel gradient: fixed,
# not per thread, so the reduction order (and the result) does not depend on
# how many threads run.
cdef Py_ssize_t KGRAD_CHUNKS = 32

# Channels per register block in the channels_last M == 1 loops.
DEF CB = 16


# Strides, dilations and leading pads (rows, columns) of one call.
ctypedef struct _Geom:
    Py_ssize_t sh, sw, dh, dw, ph, pw


cdef _Geom _geom(tuple t):
    # (sh, sw, dh, dw, ph, pw) as a _Geom
    cdef _Geom g
    g.sh, g.sw, g.dh, g.dw, g.ph, g.pw = t
    return g


cdef inline Py_ssize_t _imax(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return a if a > b else b


cdef inline Py_ssize_t _imin(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return a if a < b else b


cdef inline Py_ssize_t _cdiv(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    # ceil(a / b) for b > 0 and any sign of a
    if a <= 0:
        return -((-a) // b)
    return (a + b - 1) // b


cdef inline void _tap_t(floating* dx, const floating* dy, const floating* k,
                        Py_ssize_t C, Py_ssize_t M) noexcept nogil:
    # Transposed tap: dx[c] += sum_m dy[c*M + m] * k[c*M + m]
    cdef Py_ssize_t c, m
    cdef floating s
    if M == 1:
        for c in range(C):
            dx[c] = dx[c] + dy[c] * k[c]
    else:
        for c in range(C):
            s = 0
            for m in range(M):
                s = s + dy[c * M + m] * k[c * M + m]
            dx[c] = dx[c] + s


# ---------------------------------------------------------------- row kernels
# The vectorised row kernels live in include/cyback_depthwise.h; these pick
# the float or double one.

cdef inline void _cl_row(const floating** xr, const floating* k, floating* y, Py_ssize_t C,
                         Py_ssize_t xs, Py_ssize_t W, Py_ssize_t KH, Py_ssize_t KW,
                         Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dw, Py_ssize_t pw,
                         const floating* bias=NULL, int act=0, const void* pf=NULL,
                         Py_ssize_t pfb=0) noexcept nogil:
    # Input pixels are xs values apart (C when read in place). pf: pfb bytes
    # the next row will read, prefetched while this one computes.
    if floating is float:
        cb_depthwise_fwd_cl_row_f(xr, k, y, C, xs, W, KH, KW, OW, sw, dw, pw, bias, act, pf, pfb)
    else:
        cb_depthwise_fwd_cl_row_d(xr, k, y, C, xs, W, KH, KW, OW, sw, dw, pw, bias, act, pf, pfb)


cdef inline void _kg_row(const floating** xr, const floating* dy, floating* part, Py_ssize_t C,
                         Py_ssize_t xs, Py_ssize_t ys, Py_ssize_t W, Py_ssize_t KH,
                         Py_ssize_t KW, Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dw,
                         Py_ssize_t pw, const void* pf=NULL, Py_ssize_t pfb=0,
                         const void* pf2=NULL, Py_ssize_t pf2b=0) noexcept nogil:
    # Pixels of the input rows are xs values apart, of dy ys. pf, pf2: pfb
    # and pf2b bytes the next row will read, prefetched meanwhile.
    if floating is float:
        cb_depthwise_kgrad_cl_row_f(xr, dy, part, C, xs, ys, W, KH, KW, OW, sw, dw, pw, pf, pfb, pf2,
                             pf2b)
    else:
        cb_depthwise_kgrad_cl_row_d(xr, dy, part, C, xs, ys, W, KH, KW, OW, sw, dw, pw, pf, pfb, pf2,
                             pf2b)


cdef inline void _transpose(const floating* src, Py_ssize_t ls, floating* dst, Py_ssize_t ld,
                            Py_ssize_t R, Py_ssize_t S) noexcept nogil:
    # dst[j*ld + i] = src[i*ls + j] for i < R, j < S (cyback_depthwise.h).
    if floating is float:
        cb_depthwise_transpose_f(src, ls, dst, ld, R, S)
    else:
        cb_depthwise_transpose_d(src, ls, dst, ld, R, S)


cdef inline void _cl_rows(const floating** xr, const floating[:, :, :, ::1] x, Py_ssize_t n,
                          Py_ssize_t ih0, Py_ssize_t dh, Py_ssize_t KH) noexcept nogil:
    # xr[ky] = row ih0 + ky*dh of sample n, read in place, or NULL where that
    # row is padding.
    cdef Py_ssize_t H = x.shape[1], ky, ih
    for ky in range(KH):
        ih = ih0 + ky * dh
        xr[ky] = NULL if ih < 0 or ih >= H else &x[n, ih, 0, 0]


cdef inline Py_ssize_t _pixel_stride(Py_ssize_t CM, Py_ssize_t itemsize) noexcept nogil:
    # Values between the staged pixels of a row of CM channels. Pixels a
    # multiple of 1 kB apart put one channel of every pixel in 4 or fewer
    # sets of an 8-way L1; a row kernel that reads 30 of them per channel
    # block then thrashes (512 or 1024 channels run several times slower
    # than 528 or 1040). One more cache line per pixel spreads them over
    # all sets.
    if CM > 0 and (CM * itemsize) % 1024 == 0:
        return CM + 64 // itemsize
    return CM


cdef inline bint _row_needed(Py_ssize_t tag, Py_ssize_t n, Py_ssize_t H, Py_ssize_t ih0,
                             Py_ssize_t dh, Py_ssize_t KH) noexcept nogil:
    # Whether row tag (n*H + ih) is one of rows ih0 + ky*dh of sample n.
    cdef Py_ssize_t d = tag - (n * H + ih0)
    return d >= 0 and d % dh == 0 and d // dh < KH and 0 <= ih0 + d < H


cdef inline void _stage(const floating* src, floating* dst, Py_ssize_t W, Py_ssize_t C,
                        Py_ssize_t M, Py_ssize_t xs) noexcept nogil:
    # dst[w*xs + c*M + m] = src[w*C + c]: an input row with pixels xs apart
    # and every channel repeated M times, so that a depth multiplier M runs
    # as M == 1 over C*M channels with the kernel (KH, KW, C, M) read as
    # (KH, KW, C*M).
    cdef Py_ssize_t w, c, m, n = C
    cdef floating v
    cdef floating* d
    if xs == C * M:  # one run of W*C values
        n = W * C
        W = 1
    for w in range(W):
        d = dst + w * xs
        if M == 1:
            memcpy(d, src + w * C, n * sizeof(floating))
        elif M == 2:  # the common multiplier, in a loop the compiler vectorises
            for c in range(n):
                v = src[w * C + c]
                d[2 * c] = v
                d[2 * c + 1] = v
        else:
            for c in range(n):
                v = src[w * C + c]
                for m in range(M):
                    d[c * M + m] = v


cdef inline void _staged_rows(const floating** xr, const floating[:, :, :, ::1] x,
                              floating* ring, Py_ssize_t* tags, Py_ssize_t n, Py_ssize_t ih0,
                              Py_ssize_t dh, Py_ssize_t KH, Py_ssize_t M, Py_ssize_t xs,
                              Py_ssize_t Ws, Py_ssize_t pl) noexcept nogil:
    # xr[ky] = row ih0 + ky*dh of sample n staged (_stage) in one of the KH
    # slots of ring, or NULL where that row is padding. A slot holds Ws
    # pixels xs apart: pl zeros, the row's W pixels, zeros (written when the
    # ring was allocated). tags[s] = n*H + ih of the row slot s holds (-1:
    # none): the next output row of the same thread finds the KH - sh rows
    # it shares already there.
    cdef Py_ssize_t H = x.shape[1], W = x.shape[2], C = x.shape[3]
    cdef Py_ssize_t ky, s, ih
    for ky in range(KH):
        xr[ky] = NULL
        ih = ih0 + ky * dh
        if 0 <= ih < H:
            for s in range(KH):
                if tags[s] == n * H + ih:
                    xr[ky] = ring + s * Ws * xs
    for ky in range(KH):
        ih = ih0 + ky * dh
        if xr[ky] != NULL or ih < 0 or ih >= H:
            continue
        # A row is missing, so fewer than KH slots hold needed rows.
        s = 0
        while s < KH - 1 and _row_needed(tags[s], n, H, ih0, dh, KH):
            s += 1
        _stage(&x[n, ih, 0, 0], ring + (s * Ws + pl) * xs, W, C, M, xs)
        tags[s] = n * H + ih
        xr[ky] = ring + s * Ws * xs


# Stage channels_last input rows as _row_plan says; tests turn it off to
# compare with rows read in place (staged only to expand a depth multiplier).
cdef bint _staging = True


# How the row kernel reads the input rows of a channels_last correlation.
ctypedef struct _Rows:
    bint staged       # copied per thread (_staged_rows), else read in place
    Py_ssize_t xs     # values between pixels
    Py_ssize_t pl     # zero pixels staged before each row
    Py_ssize_t Ws     # pixels per staged row


# Most bytes of a thread's staged rows (KH of them) for the staging that
# only speeds a call up: longer rows (long 1-D sequences) are read in place.
cdef Py_ssize_t STAGE_MAX_BYTES = 4 << 20


cdef _Rows _row_plan(Py_ssize_t W, Py_ssize_t CM, Py_ssize_t M, Py_ssize_t OW, Py_ssize_t KH,
                     Py_ssize_t KW, Py_ssize_t sw, Py_ssize_t dw, Py_ssize_t pw,
                     Py_ssize_t itemsize, bint columns=True) noexcept nogil:
    # Rows of W pixels (CM values each after a depth multiplier M expands
    # them) read by OW outputs. They are staged when M > 1, when their
    # pixel stride is a multiple of 1 kB (_pixel_stride), and (if columns)
    # with their zero columns when they are padded and hold 256 bytes a
    # pixel or more: the row kernel then runs every pixel in its register
    # blocks, with no edge pixels, and the copy streams the input once, in
    # order. Narrower rows are faster read in place; the row kernel handles
    # their edges. Past STAGE_MAX_BYTES only M > 1 stages, as it must.
    cdef _Rows rp
    # Zero pixels after the row: as many as the last output's taps reach.
    cdef Py_ssize_t pr = _imax(0, (OW - 1) * sw + (KW - 1) * dw - pw - (W - 1))
    cdef bint faster = _staging and KH * (W + pw + pr) * (CM + 64) * itemsize <= STAGE_MAX_BYTES
    cdef bint padded = columns and faster and (pw > 0 or pr > 0) and CM * itemsize >= 256
    rp.xs = _pixel_stride(CM, itemsize) if faster else CM
    rp.staged = M > 1 or rp.xs != CM or padded
    rp.pl = pw if padded else 0
    rp.Ws = W + (pw + pr if padded else 0)
    return rp


cdef inline void* _ring_new(Py_ssize_t KH, _Rows rp, Py_ssize_t itemsize) noexcept nogil:
    # A thread's KH staged rows, zeroed (their padding columns stay zero);
    # NULL when rp reads rows in place.
    return calloc(KH * rp.Ws * rp.xs, itemsize) if rp.staged else NULL


cdef inline Py_ssize_t* _tags_new(Py_ssize_t KH, _Rows rp) noexcept nogil:
    # The tags of a thread's staged rows, none yet (_staged_rows); NULL when
    # rp reads rows in place.
    cdef Py_ssize_t s
    cdef Py_ssize_t* tags = NULL
    if rp.staged:
        tags = <Py_ssize_t*>malloc(KH * sizeof(Py_ssize_t))
        for s in range(KH):
            tags[s] = -1
    return tags


cdef inline void _rows_of(const floating** xr, const floating[:, :, :, ::1] x, _Rows rp,
                          floating* ring, Py_ssize_t* tags, Py_ssize_t n, Py_ssize_t ih0,
                          Py_ssize_t dh, Py_ssize_t KH, Py_ssize_t M) noexcept nogil:
    # xr[ky] = row ih0 + ky*dh of sample n as rp says, NULL where padding.
    if rp.staged:
        _staged_rows(xr, x, ring, tags, n, ih0, dh, KH, M, rp.xs, rp.Ws, rp.pl)
    else:
        _cl_rows(xr, x, n, ih0, dh, KH)


# From PREFETCH_MIN_BYTES of input and output on, and input rows of
# PREFETCH_MIN_ROW_BYTES or more, the channels_last row passes (the forward,
# the stride-1 input gradient through the same row kernel, and the kernel
# gradient, which also asks for the next output-gradient row) ask for the
# rows of a thread's next output row while the row kernel runs, a few lines
# per vector of channels (tests turn it off to compare). The hardware's
# prefetchers follow each row's stream but not the jump to the next one, so
# without this a call from DRAM runs far below its speed from cache. The
# prefetches are spread over the row: a burst before it saves nothing (the
# requests queue behind each other, as the row's copy does). The size
# bounds exist because calls whose data stay in the caches run slower with
# it, and short rows (the next one as near as the stream's own prefetch
# reaches) gain nothing (benchmarks/bench_pool.py --only depthwise).
cdef bint _prefetch_rows = True
cdef Py_ssize_t PREFETCH_MIN_BYTES = 16 << 20, PREFETCH_MIN_ROW_BYTES = 8 << 10


def _use_prefetch(bint on, min_bytes=None, min_row_bytes=None):
    """Whether the channels_last row passes prefetch the next row's rows
    (tests, benchmarks), and from which sizes; returns the old setting."""
    global _prefetch_rows, PREFETCH_MIN_BYTES, PREFETCH_MIN_ROW_BYTES
    old = (_prefetch_rows, PREFETCH_MIN_BYTES, PREFETCH_MIN_ROW_BYTES)
    _prefetch_rows = on
    if min_bytes is not None:
        PREFETCH_MIN_BYTES = min_bytes
    if min_row_bytes is not None:
        PREFETCH_MIN_ROW_BYTES = min_row_bytes
    return old


cdef inline bint _prefetch_big(const floating[:, :, :, ::1] x,
                               const floating[:, :, :, ::1] y) noexcept nogil:
    # Whether a channels_last pass from rows of x to rows of y prefetches.
    return _prefetch_rows and x.shape[2] * x.shape[3] * sizeof(floating) >= \
        PREFETCH_MIN_ROW_BYTES and (x.shape[0] * x.shape[1] * x.shape[2] * x.shape[3] +
                                    y.shape[0] * y.shape[1] * y.shape[2] * y.shape[3]) * \
        sizeof(floating) >= PREFETCH_MIN_BYTES


cdef inline const void* _next_rows(const floating[:, :, :, ::1] x, Py_ssize_t r, Py_ssize_t OH,
                                   _Geom g, Py_ssize_t KH, Py_ssize_t* nbytes) noexcept nogil:
    # The input rows output row r (n * OH + oh) reads that row r - 1 did not
    # (one at stride 1), as one contiguous range: its start, and its length
    # in *nbytes; NULL when there are none.
    cdef Py_ssize_t H = x.shape[1], n = r // OH, oh = r % OH
    cdef Py_ssize_t lo = oh * g.sh - g.ph + max(0, KH - g.sh) * g.dh
    cdef Py_ssize_t hi = oh * g.sh - g.ph + (KH - 1) * g.dh
    if n >= x.shape[0]:
        return NULL
    lo = max(lo, 0)
    hi = min(hi, H - 1)
    if hi < lo:
        return NULL
    nbytes[0] = (hi - lo + 1) * x.shape[2] * x.shape[3] * sizeof(floating)
    return &x[n, lo, 0, 0]


cdef void _fwd_cl(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] k,
                  floating[:, :, :, ::1] y, _Geom g, const floating[::1] bias, int act,
                  cb_intr* intr) noexcept nogil:
    # One task per output row; its input rows (KH * W * C) stay in L1/L2,
    # read as _row_plan says. bias (C*M values, or none) and the activation
    # code act are applied to each finished output row while it is in
    # registers (cyback_depthwise.h).
    cdef Py_ssize_t N = x.shape[0], W = x.shape[2], C = x.shape[3]
    cdef Py_ssize_t KH = k.shape[0], KW = k.shape[1], M = k.shape[3]
    cdef Py_ssize_t OH = y.shape[1], OW = y.shape[2]
    cdef _Rows rp = _row_plan(W, C * M, M, OW, KH, KW, g.sw, g.dw, g.pw, sizeof(floating))
    cdef Py_ssize_t r, n, oh, pfb = 0
    cdef bint prefetch = _prefetch_big(x, y)
    cdef const floating** xr = NULL
    cdef const void* pf = NULL
    cdef floating* ring = NULL
    cdef Py_ssize_t* tags = NULL
    cdef int nt = threads_for(2.0 * N * OH * OW * C * M * KH * KW)
    with parallel(num_threads=nt):
        xr = <const floating**>malloc(KH * sizeof(floating*))
        # Assigned here, so that each thread has its own.
        ring = <floating*>_ring_new(KH, rp, sizeof(floating))
        tags = _tags_new(KH, rp)
        for r in prange(N * OH, schedule='static'):
            # Rows take well under a microsecond: poll every 8th.
            if intr.stop or (r % 8 == 0 and cb_intr_poll(intr)):
                continue
            n = r // OH
            oh = r % OH
            _rows_of(xr, x, rp, ring, tags, n, oh * g.sh - g.ph, g.dh, KH, M)
            pfb = 0     # assigned here: each thread's own
            pf = _next_rows(x, r + 1, OH, g, KH, &pfb) if prefetch else NULL
            _cl_row(xr, &k[0, 0, 0, 0], &y[n, oh, 0, 0], C * M, rp.xs, rp.Ws, KH, KW, OW, g.sw,
                    g.dw, g.pw - rp.pl, &bias[0] if bias.shape[0] > 0 else NULL, act, pf, pfb)
        free(tags)
        free(ring)
        free(<void*>xr)
    team_done(nt)


# channels_first planes with rows narrower than this run through the
# channels_last row kernel (_fwd_cf_narrow): the plane kernels vectorise
# along a row, and a 7-pixel row leaves them scalar (an order of magnitude
# slower than the same call channels_last).
cdef Py_ssize_t CF_NARROW_OW = 8


# Narrow channels_first planes go through the channels_last kernels in
# blocks of this many bytes of channels (64 floats, 32 doubles); their
# kernel gradient block by block (one task each) from this many blocks on.
cdef Py_ssize_t NARROW_BLOCK_BYTES = 256
cdef Py_ssize_t NARROW_KGRAD_MIN_BLOCKS = 4


cdef inline Py_ssize_t _cf_narrow_width(Py_ssize_t W, Py_ssize_t OW, Py_ssize_t KW,
                                        _Geom g) noexcept nogil:
    # Pixels of a staged row of _fwd_cf_narrow: g.pw zeros, W, then zeros as
    # far as the last output's taps reach.
    return W + g.pw + _imax(0, (OW - 1) * g.sw + (KW - 1) * g.dw - g.pw - (W - 1))


cdef void _fwd_cf_narrow(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] k,
                         floating[:, :, :, ::1] y, _Geom g, const floating* bias, int act,
                         floating* kp, cb_intr* intr) noexcept nogil:
    # The forward pass of channels_first planes (M == 1) as channels_last
    # rows: one task per (sample, block of BC channels), whose planes a
    # thread transposes into its (H, Ws, BC) buffer (zero columns around
    # each row, as _row_plan stages them), filters with the row kernel into
    # (OH, OW, cb) and transposes back. Tail blocks keep the buffer's pixel
    # stride, so that the zero columns stay zero. kp: room for C*KH*KW
    # values. A thread's buffers hold H * Ws pixels of NARROW_BLOCK_BYTES
    # (_forward keeps that within STAGE_MAX_BYTES).
    cdef Py_ssize_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t KH = k.shape[0], KW = k.shape[1], T = KH * KW
    cdef Py_ssize_t OH = y.shape[2], OW = y.shape[3]
    cdef Py_ssize_t BC = NARROW_BLOCK_BYTES // sizeof(floating)
    cdef Py_ssize_t nb = _cdiv(C, BC)
    cdef Py_ssize_t Ws = _cf_narrow_width(W, OW, KW, g)
    cdef Py_ssize_t task, blk, n, c0, cb, j, r, t, ky, ih, oh
    cdef const floating** xr = NULL
    cdef floating* xt = NULL
    cdef floating* yt = NULL
    # The kernel's block of channels from c0, (T, cb) values from kp + c0*T:
    # the row kernel's layout for that block.
    for blk in range(nb):
        c0 = blk * BC
        cb = _imin(BC, C - c0)
        for t in range(T):
            for j in range(cb):
                kp[c0 * T + t * cb + j] = k[t // KW, t % KW, c0 + j, 0]
    cdef int nt = threads_for(2.0 * N * OH * OW * C * T)
    with parallel(num_threads=nt):
        xr = <const floating**>malloc(KH * sizeof(floating*))
        xt = <floating*>calloc(H * Ws * BC, sizeof(floating))
        yt = <floating*>malloc(_imax(H * W, OH * OW) * BC * sizeof(floating))
        for task in prange(N * nb, schedule='static'):
            if intr.stop or (task % 8 == 0 and cb_intr_poll(intr)):
                continue
            n = task // nb
            c0 = (task % nb) * BC
            cb = _imin(BC, C - c0)
            # The planes as (H*W, BC) in yt (free until the rows are
            # filtered), then each row to its place between zero columns.
            _transpose(&x[n, c0, 0, 0], H * W, yt, BC, cb, H * W)
            for r in range(H):
                memcpy(xt + (r * Ws + g.pw) * BC, yt + r * W * BC, W * BC * sizeof(floating))
            for oh in range(OH):
                for ky in range(KH):
                    ih = oh * g.sh - g.ph + ky * g.dh
                    xr[ky] = xt + ih * Ws * BC if 0 <= ih < H else NULL
                _cl_row(xr, kp + c0 * T, yt + oh * OW * cb, cb, BC, Ws, KH, KW, OW, g.sw,
                        g.dw, 0, bias + c0 if bias != NULL else NULL, act)
            _transpose(yt, cb, &y[n, c0, 0, 0], OH * OW, OH * OW, cb)
        free(yt)
        free(xt)
        free(<void*>xr)
    team_done(nt)


cdef void _bwd_k_cf_narrow(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] dy,
                           floating[:, :, :, ::1] dk, _Geom g, cb_intr* intr) noexcept nogil:
    # The kernel gradient of channels_first planes (M == 1) through the
    # channels_last kernel-gradient rows: one task per block of BC channels,
    # which owns dk's values for them and sums over the samples in order
    # (the same result for any thread count). For each sample a thread
    # transposes the block's planes of x and dy into (H*W, BC) and (OH*OW,
    # BC) buffers (no zero columns: they would change the sums' rounding)
    # and adds each output row's taps into its (KH*KW, cb) sums. A thread's
    # buffers hold H*W + OH*OW pixels of NARROW_BLOCK_BYTES
    # (depthwise_backward_kernel keeps that within STAGE_MAX_BYTES).
    cdef Py_ssize_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t KH = dk.shape[0], KW = dk.shape[1], T = KH * KW
    cdef Py_ssize_t OH = dy.shape[2], OW = dy.shape[3]
    cdef Py_ssize_t BC = NARROW_BLOCK_BYTES // sizeof(floating)
    cdef Py_ssize_t nb = _cdiv(C, BC)
    cdef Py_ssize_t task, n, c0, cb, j, t, ky, ih, oh
    cdef const floating** xr = NULL
    cdef floating* xt = NULL
    cdef floating* dyt = NULL
    cdef floating* acc = NULL
    cdef int nt = threads_for(2.0 * N * OH * OW * C * T)
    with parallel(num_threads=nt):
        xr = <const floating**>malloc(KH * sizeof(floating*))
        xt = <floating*>malloc(H * W * BC * sizeof(floating))
        dyt = <floating*>malloc(OH * OW * BC * sizeof(floating))
        acc = <floating*>malloc(T * BC * sizeof(floating))
        for task in prange(nb, schedule='static'):
            c0 = task * BC
            cb = _imin(BC, C - c0)
            memset(acc, 0, T * cb * sizeof(floating))
            for n in range(N):
                if intr.stop or cb_intr_poll(intr):
                    break
                _transpose(&x[n, c0, 0, 0], H * W, xt, BC, cb, H * W)
                _transpose(&dy[n, c0, 0, 0], OH * OW, dyt, BC, cb, OH * OW)
                for oh in range(OH):
                    for ky in range(KH):
                        ih = oh * g.sh - g.ph + ky * g.dh
                        xr[ky] = xt + ih * W * BC if 0 <= ih < H else NULL
                    _kg_row(xr, dyt + oh * OW * BC, acc, cb, BC, BC, W, KH, KW, OW, g.sw, g.dw,
                            g.pw)
            for t in range(T):
                for j in range(cb):
                    dk[t // KW, t % KW, c0 + j, 0] = acc[t * cb + j]
        free(acc)
        free(dyt)
        free(xt)
        free(<void*>xr)
    team_done(nt)


cdef void _swap_layout(const floating[:, :, :, ::1] src, floating[:, :, :, ::1] dst,
                       bint to_last) noexcept nogil:
    # dst = src moved between (N, C, H, W) and (N, H, W, C) (to_last: from
    # the first), in tasks of a sample's block of 64 float channels.
    cdef bint cf = to_last
    cdef Py_ssize_t N = src.shape[0], C = src.shape[1] if cf else src.shape[3]
    cdef Py_ssize_t P = src.shape[2] * src.shape[3] if cf else src.shape[1] * src.shape[2]
    cdef Py_ssize_t BC = NARROW_BLOCK_BYTES // sizeof(floating), nb = _cdiv(C, BC)
    cdef Py_ssize_t task, n, c0
    cdef int nt = threads_for(0.5 * N * C * P)
    for task in prange(N * nb, num_threads=nt, schedule='static'):
        n = task // nb
        c0 = (task % nb) * BC
        if cf:
            _transpose(&src[n, c0, 0, 0], P, &dst[n, 0, 0, c0], C, _imin(BC, C - c0), P)
        else:
            _transpose(&src[n, 0, 0, c0], C, &dst[n, c0, 0, 0], P, P, _imin(BC, C - c0))
    team_done(nt)


def _to_layout(a, bint to_last, out=None):
    """The 4-D array a (C-contiguous) in the other layout, into out (a new
    array if None): (N, C, H, W) to (N, H, W, C) when to_last, else back."""
    if out is None:
        out = np.empty(_cl_shape(a.shape) if to_last else
                       (a.shape[0], a.shape[3], a.shape[1], a.shape[2]), a.dtype)
    if out.size:
        if a.dtype == np.float32:
            _swap_layout[float](a, out, to_last)
        else:
            _swap_layout[double](a, out, to_last)
    return out


cdef void _bwd_in_cl_s1(const floating[:, :, :, ::1] dy, const floating[:, :, :, ::1] kf,
                        floating[:, :, :, ::1] dx, _Geom g, cb_intr* intr) noexcept nogil:
    # Stride 1: the input gradient is the forward convolution of dy (C*M
    # channels) with the spatially flipped kernel kf, padded by g.ph, g.pw;
    # with M > 1 each group of M channels of that product sums into its
    # input channel.
    cdef Py_ssize_t N = dx.shape[0], H = dx.shape[1], W = dx.shape[2], C = dx.shape[3]
    cdef Py_ssize_t KH = kf.shape[0], KW = kf.shape[1], M = kf.shape[3]
    cdef Py_ssize_t OW = dy.shape[2]
    # dy has C*M channels: read as a channels_last image with M == 1.
    cdef _Rows rp = _row_plan(OW, C * M, 1, W, KH, KW, 1, g.dw, g.pw, sizeof(floating))
    cdef Py_ssize_t r, n, ih, pfb = 0
    cdef bint prefetch = _prefetch_big(dy, dx)
    cdef const void* pf = NULL
    cdef const floating** xr = NULL
    cdef floating* ring = NULL
    cdef Py_ssize_t* tags = NULL
    cdef floating* t = NULL
    cdef floating* dxp
    cdef int nt = threads_for(2.0 * N * H * W * C * M * KH * KW)
    with parallel(num_threads=nt):
        xr = <const floating**>malloc(KH * sizeof(floating*))
        # Assigned here, so that each thread has its own.
        ring = <floating*>_ring_new(KH, rp, sizeof(floating))
        tags = _tags_new(KH, rp)
        t = NULL
        if M > 1:
            t = <floating*>malloc(W * C * M * sizeof(floating))
        for r in prange(N * H, schedule='static'):
            if intr.stop or (r % 8 == 0 and cb_intr_poll(intr)):
                continue
            n = r // H
            ih = r % H
            _rows_of(xr, dy, rp, ring, tags, n, ih - g.ph, g.dh, KH, 1)
            pfb = 0     # assigned here: each thread's own
            pf = _next_rows(dy, r + 1, H, g, KH, &pfb) if prefetch else NULL
            dxp = &dx[n, ih, 0, 0]
            if M == 1:
                _cl_row(xr, &kf[0, 0, 0, 0], dxp, C, rp.xs, rp.Ws, KH, KW, W, 1, g.dw,
                        g.pw - rp.pl, NULL, 0, pf, pfb)
            else:
                _cl_row(xr, &kf[0, 0, 0, 0], t, C * M, rp.xs, rp.Ws, KH, KW, W, 1, g.dw,
                        g.pw - rp.pl, NULL, 0, pf, pfb)
                if floating is float:
                    cb_depthwise_sum_groups_f(t, dxp, W * C, M)
                else:
                    cb_depthwise_sum_groups_d(t, dxp, W * C, M)
        free(t)
        free(tags)
        free(ring)
        free(<void*>xr)


cdef void _bwd_k_cl(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] dy,
                    floating[:, :, :, :, ::1] part, _Geom g, cb_intr* intr) noexcept nogil:
    # part[p] = kernel gradient from the p-th contiguous block of output rows.
    cdef Py_ssize_t N = x.shape[0], W = x.shape[2], C = x.shape[3]
    cdef Py_ssize_t P = part.shape[0], KH = part.shape[1], KW = part.shape[2]
    cdef Py_ssize_t M = part.shape[4]
    cdef Py_ssize_t OH = dy.shape[1], OW = dy.shape[2]
    cdef Py_ssize_t rows = N * OH
    # No zero columns: they would add terms, and change the sums' rounding.
    cdef _Rows rp = _row_plan(W, C * M, M, OW, KH, KW, g.sw, g.dw, g.pw, sizeof(floating),
                              False)
    # dy's rows are copied to the same pixel stride when that is wider.
    cdef Py_ssize_t ys = rp.xs
    cdef Py_ssize_t p, r, n, oh, pfb = 0, pf2b = 0
    cdef Py_ssize_t dy_row = OW * C * M * sizeof(floating)
    cdef bint prefetch = _prefetch_big(x, dy)
    cdef const void* pf = NULL
    cdef const void* pf2 = NULL
    cdef const floating** xr = NULL
    cdef floating* ring = NULL
    cdef Py_ssize_t* tags = NULL
    cdef floating* dyr = NULL
    cdef const floating* dyp
    cdef int nt = threads_for(2.0 * N * OH * OW * C * M * KH * KW)
    with parallel(num_threads=nt):
        xr = <const floating**>malloc(KH * sizeof(floating*))
        # Assigned here, so that each thread has its own.
        ring = <floating*>_ring_new(KH, rp, sizeof(floating))
        tags = _tags_new(KH, rp)
        dyr = NULL
        if ys != C * M:
            dyr = <floating*>malloc(OW * ys * sizeof(floating))
        for p in prange(P, schedule='static'):
            memset(&part[p, 0, 0, 0, 0], 0, KH * KW * C * M * sizeof(floating))
            for r in range(p * rows // P, (p + 1) * rows // P):
                if cb_intr_poll(intr):
                    break
                n = r // OH
                oh = r % OH
                _rows_of(xr, x, rp, ring, tags, n, oh * g.sh - g.ph, g.dh, KH, M)
                dyp = &dy[n, oh, 0, 0]
                pf = pf2 = NULL
                pfb = pf2b = 0      # assigned here: each thread's own
                if prefetch and r + 1 < (p + 1) * rows // P:
                    pf = _next_rows(x, r + 1, OH, g, KH, &pfb)
                    pf2, pf2b = &dy[(r + 1) // OH, (r + 1) % OH, 0, 0], dy_row
                if dyr != NULL:
                    _stage(dyp, dyr, OW, C * M, 1, ys)
                    dyp = dyr
                _kg_row(xr, dyp, &part[p, 0, 0, 0, 0], C * M, rp.xs, ys, W, KH, KW, OW,
                        g.sw, g.dw, g.pw, pf, pfb, pf2, pf2b)
        free(dyr)
        free(tags)
        free(ring)
        free(<void*>xr)


cdef inline Py_ssize_t _row_span(Py_ssize_t Wp, Py_ssize_t sw) noexcept nogil:
    # Values per padded row: sw phases of ceil(Wp / sw) (cyback_depthwise.h).
    return (Wp + sw - 1) // sw * sw


cdef inline const floating* _padded(const floating* src, Py_ssize_t H, Py_ssize_t W,
                                    floating* buf, Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t pt,
                                    Py_ssize_t pl, Py_ssize_t sw, Py_ssize_t uh,
                                    Py_ssize_t uw) noexcept nogil:
    # Plane src (H, W) as the channels_first kernels read it: Hp rows of Wp,
    # upsampled by (uh, uw), shifted down by pt and right by pl, zeros
    # around, in sw phases along the row (cyback_depthwise.h). buf holds
    # Hp * _row_span(Wp, sw) values, zeroed when allocated: only the input's
    # values are written, over the same places for every plane of a call.
    # Returns src itself (rows W apart) when that needs no padding.
    if pt == 0 and pl == 0 and Hp <= H and Wp <= W and sw == 1 and uh == 1 and uw == 1:
        return src
    if floating is float:
        cb_depthwise_pad_plane_f(src, H, W, buf, Hp, Wp, pt, pl, sw, uh, uw)
    else:
        cb_depthwise_pad_plane_d(src, H, W, buf, Hp, Wp, pt, pl, sw, uh, uw)
    return buf


cdef inline void _cf_plane(const floating* rows, Py_ssize_t rs, const floating* k,
                           Py_ssize_t ks, floating* dst, Py_ssize_t OH, Py_ssize_t OW,
                           Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dh, Py_ssize_t dw,
                           Py_ssize_t KH, Py_ssize_t KW, bint accumulate, floating bias=0,
                           int act=0) noexcept nogil:
    # dst (OH, OW) (+)= the correlation of the padded plane (rows rs apart)
    # with the taps k[(ky*KW + kx) * ks], plus bias, through the activation
    # act (bias and act only when not accumulating).
    if floating is float:
        cb_depthwise_fwd_cf_plane_f(rows, rs, k, ks, dst, OH, OW, sh, sw, dh, dw, KH, KW, accumulate,
                             bias, act)
    else:
        cb_depthwise_fwd_cf_plane_d(rows, rs, k, ks, dst, OH, OW, sh, sw, dh, dw, KH, KW, accumulate,
                             bias, act)


cdef inline bint _cf_same3(const floating* plane, Py_ssize_t H, Py_ssize_t W,
                           const floating* k, Py_ssize_t ks, floating* dst, const floating* zero,
                           floating bias, int act) noexcept nogil:
    # dst (H, W) = act(bias + the 3x3 "same" correlation of the unpadded
    # plane), when the kernel takes the plane (see cyback_depthwise.h); zero
    # holds a row of W zeros.
    if floating is float:
        return cb_depthwise_fwd_cf_same3_f(plane, H, W, k, ks, dst, zero, bias, act)
    else:
        return cb_depthwise_fwd_cf_same3_d(plane, H, W, k, ks, dst, zero, bias, act)


cdef void _planes_cf(const floating[:, :, :, ::1] src, const floating[:, :, :, ::1] k,
                     floating[:, :, :, ::1] dst, bint fan_in, _Geom g, Py_ssize_t uh,
                     Py_ssize_t uw, const floating* bias, int act, cb_intr* intr) noexcept nogil:
    # The channels_first correlations, one task per (n, c), each plane padded
    # once into a per-thread buffer (unless read in place, below). The
    # forward pass (not fan_in) filters plane src[n, c] into its M planes
    # dst[n, c*M + m] (bias: C*M values or NULL, then the activation act).
    # The input gradient (fan_in: src is dy
    # upsampled by the forward strides (uh, uw), k the flipped kernel, stride
    # 1) sums the M planes src[n, c*M + m], filtered, into dst[n, c]. 3x3
    # "same" planes at stride 1 skip the padding where nothing accumulates:
    # the kernel reads their edges (its zero row is the buffer's first row,
    # which padding never writes).
    cdef Py_ssize_t N = dst.shape[0], SH = src.shape[2], SW = src.shape[3]
    cdef Py_ssize_t KH = k.shape[0], KW = k.shape[1], C = k.shape[2], M = k.shape[3]
    cdef Py_ssize_t OH = dst.shape[2], OW = dst.shape[3]
    cdef Py_ssize_t Hp = (OH - 1) * g.sh + (KH - 1) * g.dh + 1
    cdef Py_ssize_t Wp = (OW - 1) * g.sw + (KW - 1) * g.dw + 1, span = _row_span(Wp, g.sw)
    cdef Py_ssize_t t, n, c, m, rs = 0
    cdef bint same3 = (KH == 3 and KW == 3 and g.sh == 1 and g.sw == 1 and g.dh == 1
                       and g.dw == 1 and g.ph == 1 and g.pw == 1 and uh == 1 and uw == 1
                       and OH == SH and OW == SW)
    cdef floating* buf = NULL
    cdef floating* out
    cdef const floating* plane = NULL
    cdef const floating* rows = NULL
    cdef int nt = threads_for(2.0 * N * OH * OW * C * M * KH * KW)
    with parallel(num_threads=nt):
        buf = <floating*>calloc(Hp * span, sizeof(floating))
        for t in prange(N * C, schedule='static'):
            if cb_intr_poll(intr):
                continue
            n = t // C
            c = t % C
            rows = NULL
            for m in range(M):
                if fan_in or m == 0:
                    plane = &src[n, c * M + m if fan_in else c, 0, 0]
                    rows = NULL
                out = &dst[n, c if fan_in else c * M + m, 0, 0]
                if (same3 and not (fan_in and m > 0)
                        and _cf_same3(plane, SH, SW, &k[0, 0, c, m], C * M, out, buf,
                                      bias[c * M + m] if bias != NULL else 0, act)):
                    continue
                if rows == NULL:
                    rows = _padded(plane, SH, SW, buf, Hp, Wp, g.ph, g.pw, g.sw, uh, uw)
                    rs = SW if rows == plane else span
                _cf_plane(rows, rs, &k[0, 0, c, m], C * M, out, OH, OW, g.sh, g.sw, g.dh,
                          g.dw, KH, KW, fan_in and m > 0,
                          bias[c * M + m] if bias != NULL else 0, act)
        free(buf)
    team_done(nt)


cdef inline Py_ssize_t _src(Py_ssize_t t, Py_ssize_t s, Py_ssize_t n) noexcept nogil:
    # The output index o with o*s == t, or -1 if there is none in [0, n).
    # Stride 1 (the common case) skips the division.
    if t < 0:
        return -1
    if s != 1:
        if t % s != 0:
            return -1
        t = t // s
    return t if t < n else -1


cdef inline Py_ssize_t _bin_pix_blocks(floating* dxp, const floating* gn, const floating* k,
                                       Py_ssize_t C, Py_ssize_t OH, Py_ssize_t OW,
                                       Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t th,
                                       Py_ssize_t tw, Py_ssize_t sh, Py_ssize_t sw,
                                       Py_ssize_t dh, Py_ssize_t dw) noexcept nogil:
    # One input pixel's gradient, M == 1, CB channels at a time with the sums
    # in registers (gather from the outputs that read this pixel); th, tw are
    # the pixel's padded coordinates. Used for strides > 1.
    cdef floating acc[CB]
    cdef Py_ssize_t c0 = 0, c, ky, kx, oh, ow
    cdef const floating* gp
    cdef const floating* kp
    while c0 + CB <= C:
        for c in range(CB):
            acc[c] = 0
        for ky in range(KH):
            oh = _src(th - ky * dh, sh, OH)
            if oh < 0:
                continue
            for kx in range(KW):
                ow = _src(tw - kx * dw, sw, OW)
                if ow < 0:
                    continue
                gp = gn + (oh * OW + ow) * C + c0
                kp = k + (ky * KW + kx) * C + c0
                for c in range(CB):
                    acc[c] = acc[c] + gp[c] * kp[c]
        for c in range(CB):
            dxp[c0 + c] = acc[c]
        c0 = c0 + CB
    return c0


cdef void _bwd_in_cl(const floating[:, :, :, ::1] dy, const floating[:, :, :, ::1] k,
                     floating[:, :, :, ::1] dx, _Geom g, cb_intr* intr) noexcept nogil:
    # Gather form: each input pixel collects from the outputs that read it,
    # so rows of dx are independent tasks and nothing races.
    cdef Py_ssize_t N = dx.shape[0], H = dx.shape[1], W = dx.shape[2], C = dx.shape[3]
    cdef Py_ssize_t KH = k.shape[0], KW = k.shape[1], M = k.shape[3]
    cdef Py_ssize_t OH = dy.shape[1], OW = dy.shape[2]
    cdef Py_ssize_t r, n, ih, iw, ky, kx, oh, ow, c0, c
    cdef floating* dxp
    cdef const floating* gp
    cdef const floating* kp
    cdef int nt = threads_for(2.0 * N * OH * OW * C * M * KH * KW)
    for r in prange(N * H, schedule='static', num_threads=nt):
        if cb_intr_poll(intr):
            continue
        n = r // H
        ih = r % H
        for iw in range(W):
            dxp = &dx[n, ih, iw, 0]
            c0 = 0
            if M == 1:
                c0 = _bin_pix_blocks(dxp, &dy[n, 0, 0, 0], &k[0, 0, 0, 0], C, OH, OW, KH, KW,
                                     ih + g.ph, iw + g.pw, g.sh, g.sw, g.dh, g.dw)
            if c0 == C:
                continue
            memset(dxp + c0, 0, (C - c0) * sizeof(floating))
            for ky in range(KH):
                oh = _src(ih + g.ph - ky * g.dh, g.sh, OH)
                if oh < 0:
                    continue
                for kx in range(KW):
                    ow = _src(iw + g.pw - kx * g.dw, g.sw, OW)
                    if ow < 0:
                        continue
                    _tap_t(dxp + c0, &dy[n, oh, ow, c0 * M], &k[ky, kx, c0, 0], C - c0, M)


cdef void _reduce_parts(const floating* part, Py_ssize_t P, Py_ssize_t L,
                        floating* out) noexcept nogil:
    # out[j] = sum over p of part[p * L + j], in order of p.
    cdef Py_ssize_t j, p, blk, j0, j1
    cdef Py_ssize_t nblk = (L + 255) // 256
    # Work: P*L elements read, L written.
    cdef int nt = threads_for(<double>(P + 1) * L)
    for blk in prange(nblk, schedule='static', num_threads=nt):
        j0 = blk * 256
        j1 = _imin(j0 + 256, L)
        for j in range(j0, j1):
            out[j] = part[j]
        for p in range(1, P):
            for j in range(j0, j1):
                out[j] = out[j] + part[p * L + j]


# Output columns ow whose input column ow*sw + off lies in [0, W) form the
# range [_ow_lo, _ow_hi). They are returned, not written through pointers:
# Cython only makes a prange variable private when it sees it assigned.
cdef inline Py_ssize_t _ow_lo(Py_ssize_t off, Py_ssize_t sw) noexcept nogil:
    return _imax(_cdiv(-off, sw), 0)


cdef inline Py_ssize_t _ow_hi(Py_ssize_t off, Py_ssize_t sw, Py_ssize_t W, Py_ssize_t OW,
                              Py_ssize_t lo) noexcept nogil:
    return _imax(_imin(_cdiv(W - off, sw), OW), lo)


cdef void _bwd_in_cf(const floating[:, :, :, ::1] dy, const floating[:, :, :, ::1] k,
                     floating[:, :, :, ::1] dx, _Geom g, cb_intr* intr) noexcept nogil:
    # One task per input plane (n, c): it owns dx[n, c] and scatters into it
    # from the M output planes that read it, so nothing races.
    cdef Py_ssize_t N = dx.shape[0], C = dx.shape[1], H = dx.shape[2], W = dx.shape[3]
    cdef Py_ssize_t KH = k.shape[0], KW = k.shape[1], M = k.shape[3]
    cdef Py_ssize_t OH = dy.shape[2], OW = dy.shape[3]
    cdef Py_ssize_t t, n, c, m, oh, ky, kx, ih, off, lo, hi, ow
    cdef floating kv
    cdef floating* xr
    cdef const floating* gr
    cdef int nt = threads_for(2.0 * N * OH * OW * C * M * KH * KW)
    for t in prange(N * C, schedule='static', num_threads=nt):
        if cb_intr_poll(intr):
            continue
        n = t // C
        c = t % C
        memset(&dx[n, c, 0, 0], 0, H * W * sizeof(floating))
        for m in range(M):
            for oh in range(OH):
                gr = &dy[n, c * M + m, oh, 0]
                for ky in range(KH):
                    ih = oh * g.sh - g.ph + ky * g.dh
                    if ih < 0 or ih >= H:
                        continue
                    xr = &dx[n, c, ih, 0]
                    for kx in range(KW):
                        kv = k[ky, kx, c, m]
                        off = kx * g.dw - g.pw
                        lo = _ow_lo(off, g.sw)
                        hi = _ow_hi(off, g.sw, W, OW, lo)
                        if g.sw == 1:
                            for ow in range(lo, hi):
                                xr[ow + off] = xr[ow + off] + kv * gr[ow]
                        else:
                            for ow in range(lo, hi):
                                xr[ow * g.sw + off] = xr[ow * g.sw + off] + kv * gr[ow]


cdef void _bwd_k_cf(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] dy,
                    floating[:, :, :, ::1] dk, _Geom g, cb_intr* intr) noexcept nogil:
    # One task per input channel c, summing over the batch in order: plane
    # x[n, c] is padded once, then correlated with its M output-gradient
    # planes. Each tap sums into 8 partial lanes (vector-wide), added up at
    # the end; the order depends on the shapes only.
    cdef Py_ssize_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t KH = dk.shape[0], KW = dk.shape[1], M = dk.shape[3]
    cdef Py_ssize_t OH = dy.shape[2], OW = dy.shape[3]
    cdef Py_ssize_t Hp = (OH - 1) * g.sh + (KH - 1) * g.dh + 1
    cdef Py_ssize_t Wp = (OW - 1) * g.sw + (KW - 1) * g.dw + 1, span = _row_span(Wp, g.sw)
    cdef Py_ssize_t T = KH * KW
    cdef Py_ssize_t c, n, m, tap, rs, j
    cdef floating* buf = NULL
    cdef floating* acc = NULL
    cdef const floating* rows
    cdef floating s
    cdef int nt = threads_for(2.0 * N * OH * OW * C * M * KH * KW)
    with parallel(num_threads=nt):
        buf = <floating*>calloc(Hp * span, sizeof(floating))
        acc = <floating*>malloc(M * T * 8 * sizeof(floating))
        for c in prange(C, schedule='static'):
            memset(acc, 0, M * T * 8 * sizeof(floating))
            for n in range(N):
                if cb_intr_poll(intr):
                    break
                rows = _padded(&x[n, c, 0, 0], H, W, buf, Hp, Wp, g.ph, g.pw, g.sw, 1, 1)
                rs = W if rows == &x[n, c, 0, 0] else span
                for m in range(M):
                    if floating is float:
                        cb_depthwise_kgrad_cf_plane_f(rows, rs, &dy[n, c * M + m, 0, 0], OH, OW, g.sh,
                                               g.sw, g.dh, g.dw, KH, KW, acc + m * T * 8)
                    else:
                        cb_depthwise_kgrad_cf_plane_d(rows, rs, &dy[n, c * M + m, 0, 0], OH, OW, g.sh,
                                               g.sw, g.dh, g.dw, KH, KW, acc + m * T * 8)
            for m in range(M):
                for tap in range(T):
                    s = 0
                    for j in range(8):
                        s = s + acc[(m * T + tap) * 8 + j]
                    dk[tap // KW, tap % KW, c, m] = s
        free(acc)
        free(buf)


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
def _pair(name, what, v, nd):
    if isinstance(v, (int, np.integer)):
        v = (int(v),) * nd
    try:
        v = tuple(int(a) for a in v)
    except TypeError:
        raise TypeError("%s: %s must be an int or a tuple of ints, got %r" % (name, what, v))
    if len(v) != nd or any(a < 1 for a in v):
        raise ValueError("%s: %s must be %d positive ints, got %r" % (name, what, nd, v))
    return v


_PARAMS = {}


def _params(name, x_shape, k_shape, strides, dilation, pads, channels_last):
    """_compute_params, remembered per argument tuple."""
    return remembered(_PARAMS, (tuple(x_shape), tuple(k_shape), strides, dilation, pads,
                                bool(channels_last)),
                      _compute_params, name, x_shape, k_shape, strides, dilation, pads,
                      channels_last)


@cython.wraparound(True)
def _compute_params(name, x_shape, k_shape, strides, dilation, pads, channels_last):
    """Validate and return 2-D params plus out spatial shape."""
    nd = len(x_shape) - 2
    if nd not in (1, 2):
        raise ValueError("%s: expected a 3-D (1 spatial dim) or 4-D input, got shape %s"
                         % (name, tuple(x_shape)))
    if len(k_shape) != nd + 2:
        raise ValueError("%s: kernel must be %d-D (%s, C, M) for input %s, got %s"
                         % (name, nd + 2, "kh, kw" if nd == 2 else "kw", tuple(x_shape),
                            tuple(k_shape)))
    c = x_shape[-1] if channels_last else x_shape[1]
    if k_shape[nd] != c:
        raise ValueError("%s: kernel %s has %d input channels, input %s has %d"
                         % (name, tuple(k_shape), k_shape[nd], tuple(x_shape), c))
    ss = _pair(name, "strides", strides, nd)
    ds = _pair(name, "dilation", dilation, nd)
    try:
        ps = tuple((int(p[0]), int(p[1])) for p in pads)
    except (TypeError, IndexError):
        raise TypeError("%s: pads must be (before, after) pairs, got %r" % (name, pads))
    if len(ps) != nd or any(a < 0 or b < 0 for a, b in ps):
        raise ValueError("%s: pads must be %d non-negative (before, after) pairs, got %r"
                         % (name, nd, ps))
    spatial = tuple(x_shape[1:-1] if channels_last else x_shape[2:])
    out = []
    for d in range(nd):
        span = (k_shape[d] - 1) * ds[d] + 1
        o = (spatial[d] + ps[d][0] + ps[d][1] - span) // ss[d] + 1
        if k_shape[d] < 1 or o < 1:
            raise ValueError("%s: dilated kernel %s larger than padded input %s (pads %r)"
                             % (name, tuple(k_shape[:nd]), spatial, ps))
        out.append(o)
    if nd == 1:
        ss, ds, ps, spatial, out = (1,) + ss, (1,) + ds, ((0, 0),) + ps, (1,) + spatial, [1] + out
    return nd, ss, ds, ps, spatial, tuple(out)


cdef bint _narrow_cf(bint channels_last, Py_ssize_t OW, Py_ssize_t M):
    # Whether a channels_first pass with OW outputs a row runs through the
    # channels_last kernels: rows under CF_NARROW_OW outputs, M == 1.
    return not channels_last and M == 1 and _staging and OW < CF_NARROW_OW


def _cl_shape(shape):
    return (shape[0], shape[2], shape[3], shape[1])


@cython.wraparound(True)
def _img(a, nd, channels_last):
    """C-contiguous 4-D view; 1-D data gets height 1."""
    a = np.ascontiguousarray(a)
    if nd == 1:
        return a[:, None] if channels_last else a[:, :, None]
    return a


def _ker(k, nd):
    k = np.ascontiguousarray(k)
    return k[None] if nd == 1 else k


@cython.wraparound(True)
def _out_shape(n, ch, out, nd, channels_last):
    sp = out[1:] if nd == 1 else out
    return (n,) + sp + (ch,) if channels_last else (n, ch) + sp


_ACTIVATIONS = {None: 0, "linear": 0, "relu": 1, "relu6": 2}


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


cdef class ForwardCall:
    """``depthwise_forward`` for one 2-D channels_last geometry, dtype and
    epilogue, validated once by ``forward_call`` (see conv.ForwardCall: at
    batch 1 the checks take about as long as the kernel). A call checks each
    array's type, dtype, shape and contiguity and runs the row kernel;
    arrays that do not fit take depthwise_forward, which converts or raises."""
    cdef tuple x_shape, k_shape, b_shape, y_shape, args
    cdef object activation, dtype, no_bias
    cdef int typenum, act
    cdef bint has_bias
    cdef _Geom g
    cdef cnp.npy_intp y_dims[4]

    def __call__(self, x, kernel, bias=None):
        cdef cnp.ndarray y
        if not fits(x, self.typenum, self.x_shape) or \
                not fits(kernel, self.typenum, self.k_shape) or \
                (bias is not None) != self.has_bias or \
                (self.has_bias and not fits(bias, self.typenum, self.b_shape)):
            return depthwise_forward(x, kernel, *self.args, bias=bias,
                                     activation=self.activation)
        y = cnp.PyArray_EMPTY(4, self.y_dims, self.typenum, 0)
        if self.typenum == cnp.NPY_FLOAT:
            _forward_cl_call[float](x, kernel, y, self.g,
                                    bias if self.has_bias else self.no_bias, self.act)
        else:
            _forward_cl_call[double](x, kernel, y, self.g,
                                     bias if self.has_bias else self.no_bias, self.act)
        return y


cdef _forward_cl_call(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] k,
                      floating[:, :, :, ::1] y, _Geom g, const floating[::1] bias, int act):
    cdef cb_intr intr
    cb_intr_init(&intr)
    _fwd_cl(x, k, y, g, bias, act, &intr)
    check_interrupt(&intr)


@cython.wraparound(True)
def forward_call(x_shape, k_shape, strides, dilation, pads, channels_last, dtype,
                 bint has_bias=False, activation=None):
    """A prepared ``depthwise_forward(x, kernel, strides, dilation, pads,
    channels_last, bias, activation)`` for arrays of these shapes and dtype
    (float32 or float64): ``call(x, kernel, bias)``. The checks (and their
    errors) are depthwise_forward's, made here once. Only 2-D channels_last
    inputs with outputs take the row kernel directly; others always go
    through depthwise_forward."""
    name = "depthwise_forward"
    cdef ForwardCall call = ForwardCall()
    dtype = np.dtype(dtype)
    if dtype != np.float32 and dtype != np.float64:
        raise TypeError("%s: expected float32 or float64 arrays, got %s" % (name, dtype))
    x_shape = tuple(int(d) for d in x_shape)
    k_shape = tuple(int(d) for d in k_shape)
    nd, ss, ds, ps, spatial, out = _params(name, x_shape, k_shape, strides, dilation, pads,
                                           channels_last)
    if activation not in _ACTIVATIONS:
        raise ValueError("%s: activation must be one of None, 'linear', 'relu', 'relu6', got %r"
                         % (name, activation))
    C, M = k_shape[-2], k_shape[-1]
    call.y_shape = _out_shape(x_shape[0], C * M, out, nd, channels_last)
    call.args = (strides, dilation, pads, channels_last)
    call.activation, call.dtype = activation, dtype
    call.no_bias = np.empty(0, dtype)
    call.act = _ACTIVATIONS[activation]
    call.has_bias = has_bias
    call.b_shape = (C * M,)
    call.k_shape = k_shape
    call.g = _geom(ss + ds + (ps[0][0], ps[1][0]))
    if nd == 2 and channels_last and 0 not in call.y_shape:
        call.x_shape, call.typenum = x_shape, dtype.num
        for i in range(4):
            call.y_dims[i] = call.y_shape[i]
    else:
        # no array fits: every call goes through depthwise_forward
        call.x_shape, call.typenum = (), -1
    return call


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
