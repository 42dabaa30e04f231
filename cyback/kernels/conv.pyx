"""Convolution kernels: im2col/col2im + GEMM for 1-D, 2-D and 3-D convolutions.

Every rank runs through one 3-D code path (1-D is D = H = 1, 2-D is D = 1).

Layouts (the same as Keras):
    x       (N, *spatial, C) when channels_last, else (N, C, *spatial)
    kernel  (*k, C, F)
    y       (N, *out, F) when channels_last, else (N, F, *out)
Padding is explicit: ``pads`` holds one (before, after) pair per spatial axis
(see ``conv_utils.conv_pads``). A transposed convolution is
``conv_backward_input`` with the transposed kernel and the wanted output shape.

Work is cut into blocks of output positions, each im2col'ed into a per-thread
buffer small enough to stay in L2 and multiplied with a single-threaded GEMM,
with OpenMP over the blocks; materialising the whole patch matrix would cost
hundreds of MB on ordinary ResNet shapes. Block sizes and the order of every
sum are fixed by the shapes alone, never by the thread count, so results are
bit-identical for any number of threads.

Special cases, chosen per geometry by the Python entries below:

- Winograd (float32, 3x3 or (KD, 3, 3), stride 1, 12-24+ channels): F(2x2, 3x3) in
  cyback/kernels/winograd.pyx, 2.25x fewer multiplies, channels_first
  through channels_last copies (_use_winograd);
- direct (channels_last forward, few input channels and short patches): the
  register-tiled kernel of include/cyback_conv_direct.h reads the input in
  place and applies the bias / residual / relu epilogue itself (_use_direct);
- pointwise (1x1, stride-1, unpadded): no im2col, the input rows are the
  patches; channels_last with a wide kernel or many pixels runs as fixed
  tiles of the (N*P, C) @ (C, F) product, one single-threaded GEMM and the
  epilogue each, on OpenMP (_use_pointwise_gemm, _pointwise_tiles);
- few output positions (channels_last, one block of patches, up to 4 MB of
  them): the whole patch matrix, then the pointwise tiles, so that its
  columns split over the team (_use_short_im2col);
- stride-1 taps (forward and kernel gradient, C >= 32): with stride 1 each
  kernel tap reads a zero-padded copy of the input at a constant offset, so
  one K = C GEMM per tap runs straight on its rows and no patch matrix is
  built (_tap_rows, _fwd_tap_item);
- a stride-1 input gradient is a forward convolution with the flipped kernel
  (no scatter-add); a strided one (a transposed convolution's forward pass)
  with few enough channels splits into one stride-1 convolution per phase of
  the strides that the direct kernel writes straight into its interleaved
  places (_PhasePlan; channels_first through channels_last copies);
  otherwise the input gradient is GEMM +
  col2im over slabs of output rows that never touch the same input element
  at the same time.
"""
import functools
import os

from cyback.kernels import settings as _settings
import numpy as np
cimport cython
cimport numpy as cnp
from cython.parallel cimport prange, parallel, threadid
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from cyback.kernels._blas cimport floating, gemm
from contextlib import nullcontext
from cyback.kernels._omp cimport cb_get_num_threads
from cyback.kernels.runtime cimport join_seconds, team_done, team_min_work, threads_for
from cyback.kernels._arrays cimport fits
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt
from cyback.kernels._tiles cimport (cb_tiles, cb_tiles_finish, cb_tiles_init, cb_tiles_join,
                                   cb_tiles_take, cb_tiles_wait_done)
from cyback.kernels._checks import remembered
from cyback.kernels.blas_threads import blas_limit
from cyback.kernels import winograd


cnp.import_array()


cdef extern from "cyback_conv_direct.h" nogil:
    ctypedef struct cb_cd_geom:
        Py_ssize_t N, C, F, D, H, W, Wp, pw, OD, OH, OW, KD, KH, KW
        Py_ssize_t sd, sh, sw, dd, dh, dw, pd, ph, FB, nfb
    enum: CB_CD_MAX_ROWS
    enum: CB_CD_MAX_C
    int cb_simd_use_avx2(int on)
    void cb_simd_set_default_cap(int cap)
    int cb_simd_use_avx512(int on)
    int cb_simd_has_avx512()
    Py_ssize_t cb_cd_block(int dbl)
    Py_ssize_t cb_cd_block_for(int dbl, Py_ssize_t F)
    int cb_cd_pads_itself()
    int cb_cd_use_wide_tiles(int w)
    int cb_cd_use_quad_blocks(int on)
    int cb_cd_wide_tiles()
    void cb_cd_prepare(cb_cd_geom* g, Py_ssize_t xw0)
    void cb_cd_pack_block_f(const float* k, const float* bias, float* wp, float* bp,
                            const cb_cd_geom* g, Py_ssize_t b)
    void cb_cd_pack_block_d(const double* k, const double* bias, double* wp, double* bp,
                            const cb_cd_geom* g, Py_ssize_t b)
    void cb_cd_pad_row_f(const float* x, float* xp, const cb_cd_geom* g, Py_ssize_t row)
    void cb_cd_pad_row_d(const double* x, double* xp, const cb_cd_geom* g, Py_ssize_t row)
    void cb_cd_item_f(const float* x, const float* wp, const float* bp, const float* res,
                      int act, float* y, const cb_cd_geom* g, Py_ssize_t it)
    void cb_cd_item_d(const double* x, const double* wp, const double* bp, const double* res,
                      int act, double* y, const cb_cd_geom* g, Py_ssize_t it)
    ctypedef struct cb_cd_out:
        Py_ssize_t D, H, W, d0, h0, w0, sd, sh, sw, xw0
    void cb_cd_item_out_f(const float* x, const float* wp, const float* bp, const float* res,
                          int act, float* y, const cb_cd_geom* g, Py_ssize_t it,
                          const cb_cd_out* out)
    void cb_cd_item_out_d(const double* x, const double* wp, const double* bp,
                          const double* res, int act, double* y, const cb_cd_geom* g,
                          Py_ssize_t it, const cb_cd_out* out)

# CYBACK_AVX512=0 caps this module's vector kernels at AVX2 (the registry reads it).
cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)

cdef extern from "cyback_conv_dw.h" nogil:
    enum: CB_CDW_ROWS
    void cb_cdw_item_f(const float* x, const float* dy, float* part, const cb_cd_geom* g,
                       Py_ssize_t it)
    void cb_cdw_item_d(const double* x, const double* dy, double* part, const cb_cd_geom* g,
                       Py_ssize_t it)


cdef struct Geom:
    Py_ssize_t N, C, F
    Py_ssize_t D, H, W
    Py_ssize_t OD, OH, OW
    Py_ssize_t KD, KH, KW
    Py_ssize_t sd, sh, sw
    Py_ssize_t dd, dh, dw
    Py_ssize_t pd, ph, pw
    Py_ssize_t K       # KD * KH * KW * C: one patch, ordered like the kernel
    Py_ssize_t P       # OD * OH * OW: output positions per sample


# Patch buffer per thread: half of a 2 MB L2 leaves room for the GEMM's own
# packed panels.
cdef enum:
    BUF_BYTES = 1 << 20
# Partial kernel gradients summed at the end; a constant (not the thread count)
# so that the summation order never changes.
cdef enum:
    MAX_GROUPS = 8
    GROUP_BYTES = 64 << 20


# ---------------------------------------------------------------- im2col / col2im

cdef inline Py_ssize_t _valid_lo(Py_ssize_t o0, Py_ssize_t b, Py_ssize_t s) noexcept nogil:
    # First output index o >= o0 with o*s + b >= 0.
    cdef Py_ssize_t lo
    if b >= 0:
        return o0
    lo = (-b + s - 1) // s
    return lo if lo > o0 else o0


cdef inline Py_ssize_t _valid_hi(Py_ssize_t o1, Py_ssize_t b, Py_ssize_t s,
                                 Py_ssize_t size) noexcept nogil:
    # One past the last output index o < o1 with o*s + b < size.
    cdef Py_ssize_t hi
    if size - 1 - b < 0:
        return 0
    hi = (size - 1 - b) // s + 1
    return hi if hi < o1 else o1


cdef inline void _position(const Geom* g, Py_ssize_t p, Py_ssize_t* od, Py_ssize_t* oh,
                           Py_ssize_t* ow) noexcept nogil:
    # Output position p of a sample as (od, oh, ow).
    ow[0] = p % g.OW
    oh[0] = (p // g.OW) % g.OH
    od[0] = p // (g.OW * g.OH)


cdef void _im2col_last(const floating* x, floating* cols, const Geom* g,
                       Py_ssize_t r0, Py_ssize_t nr) noexcept nogil:
    """cols[r, :] = the patch of output row r0 + r (rows run over N * P)."""
    cdef Py_ssize_t r, q, n, p, od, oh, ow, kd, kh, kw, i_d, ih, iw, iw0
    cdef Py_ssize_t C = g.C, rowlen = g.KW * g.C
    cdef size_t csz = C * sizeof(floating), rsz = rowlen * sizeof(floating)
    cdef floating* dst
    cdef const floating* src
    for r in range(nr):
        q = r0 + r
        n = q // g.P
        p = q - n * g.P
        _position(g, p, &od, &oh, &ow)
        dst = cols + r * g.K
        iw0 = ow * g.sw - g.pw
        for kd in range(g.KD):
            i_d = od * g.sd - g.pd + kd * g.dd
            if i_d < 0 or i_d >= g.D:
                memset(dst, 0, g.KH * rsz)
                dst += g.KH * rowlen
                continue
            for kh in range(g.KH):
                ih = oh * g.sh - g.ph + kh * g.dh
                if ih < 0 or ih >= g.H:
                    memset(dst, 0, rsz)
                else:
                    src = x + ((n * g.D + i_d) * g.H + ih) * g.W * C
                    if g.dw == 1 and iw0 >= 0 and iw0 + g.KW <= g.W:
                        # The whole kernel row is one contiguous run of KW*C values.
                        memcpy(dst, src + iw0 * C, rsz)
                    else:
                        for kw in range(g.KW):
                            iw = iw0 + kw * g.dw
                            if iw < 0 or iw >= g.W:
                                memset(dst + kw * C, 0, csz)
                            else:
                                memcpy(dst + kw * C, src + iw * C, csz)
                dst += rowlen


cdef void _col2im_last(const floating* cols, floating* dx, const Geom* g,
                       Py_ssize_t r0, Py_ssize_t nr) noexcept nogil:
    """Adds each patch of cols back onto the input positions it came from."""
    cdef Py_ssize_t r, q, n, p, od, oh, ow, kd, kh, kw, i_d, ih, iw, iw0, c, j
    cdef Py_ssize_t C = g.C, rowlen = g.KW * g.C
    cdef const floating* src
    cdef floating* dst
    for r in range(nr):
        q = r0 + r
        n = q // g.P
        p = q - n * g.P
        _position(g, p, &od, &oh, &ow)
        src = cols + r * g.K
        iw0 = ow * g.sw - g.pw
        for kd in range(g.KD):
            i_d = od * g.sd - g.pd + kd * g.dd
            if i_d < 0 or i_d >= g.D:
                src += g.KH * rowlen
                continue
            for kh in range(g.KH):
                ih = oh * g.sh - g.ph + kh * g.dh
                if ih >= 0 and ih < g.H:
                    dst = dx + ((n * g.D + i_d) * g.H + ih) * g.W * C
                    if g.dw == 1 and iw0 >= 0 and iw0 + g.KW <= g.W:
                        dst += iw0 * C
                        for j in range(rowlen):
                            dst[j] += src[j]
                    else:
                        for kw in range(g.KW):
                            iw = iw0 + kw * g.dw
                            if iw >= 0 and iw < g.W:
                                for c in range(C):
                                    dst[iw * C + c] += src[kw * C + c]
                src += rowlen


cdef void _im2col_first(const floating* x, floating* cols, const Geom* g,
                        Py_ssize_t n, Py_ssize_t p0, Py_ssize_t npos) noexcept nogil:
    """cols[k, j] = patch element k of output position p0 + j of sample n.

    cols is (K, npos): each row is one shifted copy of a channel plane, so the
    copies run along W, reading the NCHW input contiguously.
    """
    cdef Py_ssize_t p, j, seg, od, oh, ow0, ow1, kd, kh, kw, c, i_d, ih, b, lo, hi, o, k
    cdef Py_ssize_t HW = g.H * g.W, DHW = g.D * g.H * g.W
    cdef const floating* src
    cdef floating* dst
    cdef bint row_ok
    p = p0
    while p < p0 + npos:
        j = p - p0
        _position(g, p, &od, &oh, &ow0)
        seg = g.OW - ow0            # the rest of this output row, within the block
        if seg > p0 + npos - p:
            seg = p0 + npos - p
        ow1 = ow0 + seg
        k = 0
        for kd in range(g.KD):
            i_d = od * g.sd - g.pd + kd * g.dd
            for kh in range(g.KH):
                ih = oh * g.sh - g.ph + kh * g.dh
                row_ok = i_d >= 0 and i_d < g.D and ih >= 0 and ih < g.H
                for kw in range(g.KW):
                    b = kw * g.dw - g.pw
                    lo = _valid_lo(ow0, b, g.sw)
                    hi = _valid_hi(ow1, b, g.sw, g.W)
                    if not row_ok or hi <= lo:
                        lo = ow0
                        hi = ow0
                    for c in range(g.C):
                        dst = cols + (k + c) * npos + j - ow0
                        for o in range(ow0, lo):
                            dst[o] = 0
                        if hi > lo:
                            src = x + (n * g.C + c) * DHW + i_d * HW + ih * g.W + b
                        if g.sw == 1:
                            if hi > lo:
                                memcpy(dst + lo, src + lo, (hi - lo) * sizeof(floating))
                        else:
                            for o in range(lo, hi):
                                dst[o] = src[o * g.sw]
                        for o in range(hi, ow1):
                            dst[o] = 0
                    k += g.C
        p += seg


cdef void _col2im_first(const floating* cols, floating* dx, const Geom* g,
                        Py_ssize_t n, Py_ssize_t p0, Py_ssize_t npos) noexcept nogil:
    cdef Py_ssize_t p, j, seg, od, oh, ow0, ow1, kd, kh, kw, c, i_d, ih, b, lo, hi, o, k
    cdef Py_ssize_t HW = g.H * g.W, DHW = g.D * g.H * g.W
    cdef const floating* src
    cdef floating* dst
    p = p0
    while p < p0 + npos:
        j = p - p0
        _position(g, p, &od, &oh, &ow0)
        seg = g.OW - ow0            # the rest of this output row, within the block
        if seg > p0 + npos - p:
            seg = p0 + npos - p
        ow1 = ow0 + seg
        k = 0
        for kd in range(g.KD):
            i_d = od * g.sd - g.pd + kd * g.dd
            for kh in range(g.KH):
                ih = oh * g.sh - g.ph + kh * g.dh
                if i_d < 0 or i_d >= g.D or ih < 0 or ih >= g.H:
                    k += g.KW * g.C
                    continue
                for kw in range(g.KW):
                    b = kw * g.dw - g.pw
                    lo = _valid_lo(ow0, b, g.sw)
                    hi = _valid_hi(ow1, b, g.sw, g.W)
                    if hi > lo:
                        for c in range(g.C):
                            src = cols + (k + c) * npos + j - ow0
                            dst = dx + (n * g.C + c) * DHW + i_d * HW + ih * g.W + b
                            if g.sw == 1:
                                for o in range(lo, hi):
                                    dst[o] += src[o]
                            else:
                                for o in range(lo, hi):
                                    dst[o * g.sw] += src[o]
                    k += g.C
        p += seg


# ---------------------------------------------------------------- work items

cdef void _fwd_last_item(const floating* x, const floating* w, floating* y, floating* buf,
                         const Geom* g, Py_ssize_t r0, Py_ssize_t nr) noexcept nogil:
    _im2col_last(x, buf, g, r0, nr)
    gemm(False, False, <int>nr, <int>g.F, <int>g.K, <floating>1, buf, <int>g.K,
         w, <int>g.F, <floating>0, y + r0 * g.F, <int>g.F)


cdef void _fwd_first_item(const floating* x, const floating* w, floating* y, floating* buf,
                          const Geom* g, Py_ssize_t n, Py_ssize_t p0,
                          Py_ssize_t npos) noexcept nogil:
    # The product is formed as (npos, F) = cols^T @ kernel, the same GEMM shape
    # as channels_last (OpenBLAS is much faster with the long side there than
    # with kernel^T @ cols), then transposed into y[n, :, p0:p0+npos]: a copy
    # K times smaller than the product.
    cdef floating* tmp = buf + g.K * npos
    cdef floating* dst = y + n * g.F * g.P + p0
    cdef Py_ssize_t f, j
    _im2col_first(x, buf, g, n, p0, npos)
    gemm(True, False, <int>npos, <int>g.F, <int>g.K, <floating>1, buf, <int>npos,
         w, <int>g.F, <floating>0, tmp, <int>g.F)
    for f in range(g.F):
        for j in range(npos):
            dst[f * g.P + j] = tmp[j * g.F + f]


cdef void _bwdx_item(const floating* dy, const floating* w, floating* dx, floating* buf,
                     const Geom* g, bint last, Py_ssize_t n, Py_ssize_t p0, Py_ssize_t p1,
                     Py_ssize_t B) noexcept nogil:
    cdef Py_ssize_t p = p0, m
    while p < p1:
        m = p1 - p
        if m > B:
            m = B
        if last:
            # cols (m, K) = dy rows (m, F) @ kernel^T (F, K)
            gemm(False, True, <int>m, <int>g.K, <int>g.F, <floating>1,
                 dy + (n * g.P + p) * g.F, <int>g.F, w, <int>g.F, <floating>0, buf, <int>g.K)
            _col2im_last(buf, dx, g, n * g.P + p, m)
        else:
            # cols (K, m) = kernel (K, F) @ dy[n, :, p:p+m] (F, m)
            gemm(False, False, <int>g.K, <int>m, <int>g.F, <floating>1, w, <int>g.F,
                 dy + n * g.F * g.P + p, <int>g.P, <floating>0, buf, <int>m)
            _col2im_first(buf, dx, g, n, p, m)
        p += m


cdef void _bwdk_group(const floating* x, const floating* dy, floating* part, floating* buf,
                      const Geom* g, bint last, bint direct, Py_ssize_t c0, Py_ssize_t c1,
                      Py_ssize_t B, Py_ssize_t nblk, cb_intr* intr) noexcept nogil:
    """part (K, F) = sum over blocks c0..c1-1 of patches^T @ dy."""
    cdef Py_ssize_t c, r0, m, n, p0
    cdef floating beta = 0
    for c in range(c0, c1):
        if cb_intr_poll(intr):
            return
        if last:
            r0 = c * B
            m = g.N * g.P - r0
            if m > B:
                m = B
            if direct:
                # 1x1, stride 1, unpadded: the patches are the input rows.
                gemm(True, False, <int>g.K, <int>g.F, <int>m, <floating>1, x + r0 * g.C,
                     <int>g.C, dy + r0 * g.F, <int>g.F, beta, part, <int>g.F)
            else:
                _im2col_last(x, buf, g, r0, m)
                gemm(True, False, <int>g.K, <int>g.F, <int>m, <floating>1, buf, <int>g.K,
                     dy + r0 * g.F, <int>g.F, beta, part, <int>g.F)
        else:
            n = c // nblk
            p0 = (c - n * nblk) * B
            m = g.P - p0
            if m > B:
                m = B
            if direct:
                gemm(False, True, <int>g.K, <int>g.F, <int>m, <floating>1,
                     x + n * g.C * g.P + p0, <int>g.P,
                     dy + n * g.F * g.P + p0, <int>g.P, beta, part, <int>g.F)
            else:
                _im2col_first(x, buf, g, n, p0, m)
                gemm(False, True, <int>g.K, <int>g.F, <int>m, <floating>1, buf, <int>m,
                     dy + n * g.F * g.P + p0, <int>g.P, beta, part, <int>g.F)
        beta = 1


# ---------------------------------------------------------------- stride-1 taps

cdef void _pad_row(const floating* x, floating* xp, const Geom* g, Py_ssize_t Dp,
                   Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t row) noexcept nogil:
    """Row `row` (over N * Dp * Hp) of the zero-padded channels_last copy of
    channels_last x (channels_first x is padded by _pad_row_first)."""
    cdef Py_ssize_t n, r, i_d, ih, C = g.C
    cdef floating* dst = xp + row * Wp * C
    n = row // (Dp * Hp)
    r = row - n * Dp * Hp
    i_d = r // Hp - g.pd
    ih = r - (r // Hp) * Hp - g.ph
    if i_d < 0 or i_d >= g.D or ih < 0 or ih >= g.H:
        memset(dst, 0, Wp * C * sizeof(floating))
        return
    if g.pw > 0:
        memset(dst, 0, g.pw * C * sizeof(floating))
    if Wp - g.pw - g.W > 0:
        memset(dst + (g.pw + g.W) * C, 0, (Wp - g.pw - g.W) * C * sizeof(floating))
    memcpy(dst + g.pw * C, x + ((n * g.D + i_d) * g.H + ih) * g.W * C,
           g.W * C * sizeof(floating))


cdef inline Py_ssize_t _grid_run(const Geom* g, Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t q,
                                 Py_ssize_t q1, Py_ssize_t* p) noexcept nogil:
    """The run of grid rows from q (before q1) of the padded (Dp, Hp, Wp)
    grid that the stride-1 tap GEMMs compute: its length, and in p the output
    position of its first row, or -1 when the run lies on the grid's margin
    (rows that are no output)."""
    cdef Py_ssize_t HpWp = Hp * Wp, od, r, oh, ow, seg
    od = q // HpWp
    r = q - od * HpWp
    oh = r // Wp
    ow = r - oh * Wp
    p[0] = -1
    if oh >= g.OH:
        seg = (od + 1) * HpWp - q           # the rest of this depth slice
    elif ow >= g.OW:
        seg = Wp - ow                       # the rest of this row
    else:
        seg = g.OW - ow
        p[0] = (od * g.OH + oh) * g.OW + ow
    return seg if seg < q1 - q else q1 - q


cdef void _fwd_tap_item(const floating* xp, const floating* w, floating* y, floating* tmp,
                        const Geom* g, Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t DpHpWp,
                        Py_ssize_t n, Py_ssize_t q0, Py_ssize_t m) noexcept nogil:
    """Output rows q0..q0+m of sample n on the padded grid (Dp, Hp, Wp),
    channels_last (channels_first: _fwd_tap_item_first).

    With stride 1, kernel tap t reads the padded input at a constant offset
    from the output position, so the rows of that tap's GEMM operand are
    consecutive rows of the padded copy (leading dimension C) and no patch
    matrix is built: one K = C GEMM per tap accumulates into tmp, then the rows
    that are real outputs (not on the padding margin of the grid) go to y.
    """
    cdef Py_ssize_t C = g.C, F = g.F, HpWp = Hp * Wp
    cdef Py_ssize_t kd, kh, kw, t = 0, q, q1 = q0 + m, seg, p
    cdef const floating* base = xp + (n * DpHpWp + q0) * C
    cdef const floating* a
    for kd in range(g.KD):
        for kh in range(g.KH):
            for kw in range(g.KW):
                a = base + (kd * g.dd * HpWp + kh * g.dh * Wp + kw * g.dw) * C
                gemm(False, False, <int>m, <int>F, <int>C, <floating>1, a, <int>C,
                     w + t * C * F, <int>F, <floating>(0 if t == 0 else 1), tmp, <int>F)
                t += 1
    q = q0
    while q < q1:
        seg = _grid_run(g, Hp, Wp, q, q1, &p)
        if p >= 0:
            memcpy(y + (n * g.P + p) * F, tmp + (q - q0) * F, seg * F * sizeof(floating))
        q += seg


cdef void _pad_row_first(const floating* x, floating* xp, const Geom* g, Py_ssize_t Dp,
                         Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t row) noexcept nogil:
    """Row `row` (over N * C * Dp * Hp) of the zero-padded channels_first copy of x."""
    cdef Py_ssize_t nc, r, i_d, ih
    cdef floating* dst = xp + row * Wp
    nc = row // (Dp * Hp)
    r = row - nc * Dp * Hp
    i_d = r // Hp - g.pd
    ih = r - (r // Hp) * Hp - g.ph
    if i_d < 0 or i_d >= g.D or ih < 0 or ih >= g.H:
        memset(dst, 0, Wp * sizeof(floating))
        return
    if g.pw > 0:
        memset(dst, 0, g.pw * sizeof(floating))
    if Wp - g.pw - g.W > 0:
        memset(dst + g.pw + g.W, 0, (Wp - g.pw - g.W) * sizeof(floating))
    memcpy(dst + g.pw, x + (nc * g.D + i_d) * g.H * g.W + ih * g.W, g.W * sizeof(floating))


cdef void _fwd_tap_item_first(const floating* xp, const floating* w, floating* y,
                              floating* tmp, const Geom* g, Py_ssize_t Hp, Py_ssize_t Wp,
                              Py_ssize_t DpHpWp, Py_ssize_t n, Py_ssize_t q0,
                              Py_ssize_t m) noexcept nogil:
    """_fwd_tap_item for channels_first, on a padded channels_first copy (a
    plain row copy, no transpose): tap t's operand is the transpose of the
    (C, m) block of channel planes at a constant offset (leading dimension
    DpHpWp); tmp is the (m, F) product, transposed into y. Not the (F, m)
    product copied into y by rows: OpenBLAS's small NT kernel is slower with
    that operand order."""
    cdef Py_ssize_t C = g.C, F = g.F, HpWp = Hp * Wp
    cdef Py_ssize_t kd, kh, kw, t = 0, q, q1 = q0 + m, seg, p, f, j
    cdef const floating* base = xp + n * C * DpHpWp + q0
    for kd in range(g.KD):
        for kh in range(g.KH):
            for kw in range(g.KW):
                gemm(True, False, <int>m, <int>F, <int>C, <floating>1,
                     base + kd * g.dd * HpWp + kh * g.dh * Wp + kw * g.dw, <int>DpHpWp,
                     w + t * C * F, <int>F, <floating>(0 if t == 0 else 1), tmp, <int>F)
                t += 1
    q = q0
    while q < q1:
        seg = _grid_run(g, Hp, Wp, q, q1, &p)
        if p >= 0:
            for f in range(F):
                for j in range(seg):
                    y[(n * F + f) * g.P + p + j] = tmp[(q - q0 + j) * F + f]
        q += seg


cdef struct TapGrid:
    # The grid the stride-1 tap GEMMs run on: the input padded to (Dp, Hp, Wp)
    # so that every tap reads it at a constant offset from the output position;
    # Qn grid rows per sample (up to its last output) in blocks of B, nblk
    # blocks.
    Py_ssize_t Dp, Hp, Wp, DpHpWp, Qn, nblk


cdef inline TapGrid _tap_grid(const Geom* g, Py_ssize_t B) noexcept nogil:
    cdef TapGrid t
    t.Dp = g.OD + (g.KD - 1) * g.dd
    t.Hp = g.OH + (g.KH - 1) * g.dh
    t.Wp = g.OW + (g.KW - 1) * g.dw
    t.DpHpWp = t.Dp * t.Hp * t.Wp
    t.Qn = ((g.OD - 1) * t.Hp + g.OH - 1) * t.Wp + g.OW
    t.nblk = (t.Qn + B - 1) // B
    return t


cdef const floating* _padded_input(const floating* x, floating* xp, const Geom* g,
                                   const TapGrid* t, bint last, bint copy,
                                   int nt) noexcept nogil:
    """x on the tap grid: the padded copy xp, filled on nt threads (always for
    channels_first, for channels_last when there is padding), else x."""
    cdef Py_ssize_t row
    if not last:
        for row in prange(g.N * g.C * t.Dp * t.Hp, schedule='static', num_threads=nt):
            _pad_row_first(x, xp, g, t.Dp, t.Hp, t.Wp, row)
        return xp
    if copy:
        for row in prange(g.N * t.Dp * t.Hp, schedule='static', num_threads=nt):
            _pad_row(x, xp, g, t.Dp, t.Hp, t.Wp, row)
        return xp
    return x


def _forward_taps(floating[::1] x, floating[::1] w, floating[::1] y, floating[::1] xp,
                   floating[::1] bufs, Py_ssize_t bufstride, Geom g, bint last,
                   bint copy, Py_ssize_t B, int nt):
    cdef Py_ssize_t it, n, q0, m
    cdef floating* buf = NULL
    cdef const floating* src
    cdef cb_intr intr
    cb_intr_init(&intr)
    cdef TapGrid t = _tap_grid(&g, B)
    with nogil:
        src = _padded_input(&x[0], &xp[0], &g, &t, last, copy, nt)
        with parallel(num_threads=nt):
            buf = &bufs[0] + threadid() * bufstride
            for it in prange(g.N * t.nblk, schedule='static'):
                if cb_intr_poll(&intr):
                    continue
                n = it // t.nblk
                q0 = (it - n * t.nblk) * B
                m = t.Qn - q0
                if m > B:
                    m = B
                if last:
                    _fwd_tap_item(src, &w[0], &y[0], buf, &g, t.Hp, t.Wp, t.DpHpWp, n, q0, m)
                else:
                    _fwd_tap_item_first(src, &w[0], &y[0], buf, &g, t.Hp, t.Wp, t.DpHpWp, n,
                                        q0, m)
    check_interrupt(&intr)


cdef void _bwdk_tap_item(const floating* xp, const floating* dy, floating* part,
                        floating* dyt, const Geom* g, bint last, Py_ssize_t Hp, Py_ssize_t Wp,
                        Py_ssize_t DpHpWp, Py_ssize_t n, Py_ssize_t q0, Py_ssize_t m,
                        bint first) noexcept nogil:
    """part[t] (C, F) (+)= padded-input rows of tap t ^T @ dy rows, for output
    rows q0..q0+m of sample n on the padded grid; dy is laid out on that grid
    in dyt first, with zero rows on its margin."""
    cdef Py_ssize_t C = g.C, F = g.F, HpWp = Hp * Wp
    cdef Py_ssize_t kd, kh, kw, t = 0, q, q1 = q0 + m, seg, p, f, j
    cdef const floating* base = xp + (n * DpHpWp + q0) * C
    cdef const floating* src
    cdef floating* dst
    if not last:
        base = xp + n * C * DpHpWp + q0
    q = q0
    while q < q1:
        seg = _grid_run(g, Hp, Wp, q, q1, &p)
        dst = dyt + (q - q0) * F
        if p < 0:
            memset(dst, 0, seg * F * sizeof(floating))
        elif last:
            memcpy(dst, dy + (n * g.P + p) * F, seg * F * sizeof(floating))
        else:
            src = dy + n * F * g.P + p
            for f in range(F):
                for j in range(seg):
                    dst[j * F + f] = src[f * g.P + j]
        q += seg
    for kd in range(g.KD):
        for kh in range(g.KH):
            for kw in range(g.KW):
                if last:
                    gemm(True, False, <int>C, <int>F, <int>m, <floating>1,
                         base + (kd * g.dd * HpWp + kh * g.dh * Wp + kw * g.dw) * C, <int>C,
                         dyt, <int>F, <floating>(0 if first else 1), part + t * C * F, <int>F)
                else:
                    # The (C, m) block of channel planes of the channels_first copy.
                    gemm(False, False, <int>C, <int>F, <int>m, <floating>1,
                         base + kd * g.dd * HpWp + kh * g.dh * Wp + kw * g.dw, <int>DpHpWp,
                         dyt, <int>F, <floating>(0 if first else 1), part + t * C * F, <int>F)
                t += 1


cdef void _sum_parts(const floating* parts, floating* dw, Py_ssize_t KF,
                     Py_ssize_t ngroups) noexcept nogil:
    """dw = the sum of the groups' partial kernel gradients (KF values each),
    added in group order whatever the thread count."""
    cdef Py_ssize_t i, gi
    cdef floating s
    for i in prange(KF, schedule='static', num_threads=threads_for(<double>(ngroups + 1) * KF)):
        s = parts[i]
        for gi in range(1, ngroups):
            s = s + parts[gi * KF + i]
        dw[i] = s


def _groups(Py_ssize_t nitems, Py_ssize_t kf, Py_ssize_t itemsize):
    """Groups of a kernel gradient's work items (consecutive runs of
    ceil(nitems / groups)): each sums into a partial gradient of its own, so
    at most MAX_GROUPS and GROUP_BYTES of partials; none is left empty (it
    would leave its partial unset)."""
    ngroups = max(1, min(MAX_GROUPS, nitems, GROUP_BYTES // (kf * itemsize)))
    per = (nitems + ngroups - 1) // ngroups
    return (nitems + per - 1) // per


def _backward_kernel_taps(floating[::1] x, floating[::1] dy, floating[::1] parts,
                           floating[::1] dw, floating[::1] xp, floating[::1] bufs,
                           Py_ssize_t bufstride, Geom g, bint last, bint copy,
                           Py_ssize_t B, Py_ssize_t ngroups, int nt):
    cdef Py_ssize_t nitems, per, gi, c, n, q0, m, i
    cdef Py_ssize_t KF = g.K * g.F
    cdef floating* buf = NULL
    cdef const floating* src
    cdef cb_intr intr
    cb_intr_init(&intr)
    cdef TapGrid t = _tap_grid(&g, B)
    nitems = g.N * t.nblk
    per = (nitems + ngroups - 1) // ngroups
    with nogil:
        src = _padded_input(&x[0], &xp[0], &g, &t, last, copy, nt)
        with parallel(num_threads=nt):
            buf = &bufs[0] + threadid() * bufstride
            for gi in prange(ngroups, schedule='static'):
                for c in range(gi * per, min(gi * per + per, nitems)):
                    if cb_intr_poll(&intr):
                        break
                    n = c // t.nblk
                    q0 = (c - n * t.nblk) * B
                    m = t.Qn - q0
                    if m > B:
                        m = B
                    _bwdk_tap_item(src, &dy[0], &parts[gi * KF], buf, &g, last, t.Hp, t.Wp,
                                   t.DpHpWp, n, q0, m, c == gi * per)
        _sum_parts(&parts[0], &dw[0], KF, ngroups)
    check_interrupt(&intr)


# ---------------------------------------------------------------- drivers

def _forward(floating[::1] x, floating[::1] w, floating[::1] y, floating[::1] bufs,
              Py_ssize_t bufstride, Geom g, bint last, bint direct,
              Py_ssize_t B, int nt):
    cdef Py_ssize_t nitems, it, nblk = 1, r0, m, n, p0
    cdef floating* buf = NULL
    cdef cb_intr intr
    cb_intr_init(&intr)
    # The caller holds the GIL (it passes memoryviews); release it for the work.
    with nogil:
        if last:
            nitems = (g.N * g.P + B - 1) // B
        else:
            nblk = (g.P + B - 1) // B
            nitems = g.N * nblk
        with parallel(num_threads=nt):
            buf = &bufs[0] + threadid() * bufstride
            for it in prange(nitems, schedule='static'):
                if cb_intr_poll(&intr):
                    continue
                if last:
                    r0 = it * B
                    m = g.N * g.P - r0
                    if m > B:
                        m = B
                    if direct:
                        gemm(False, False, <int>m, <int>g.F, <int>g.C, <floating>1, &x[r0 * g.C],
                             <int>g.C, &w[0], <int>g.F, <floating>0, &y[r0 * g.F], <int>g.F)
                    else:
                        _fwd_last_item(&x[0], &w[0], &y[0], buf, &g, r0, m)
                else:
                    n = it // nblk
                    p0 = (it - n * nblk) * B
                    m = g.P - p0
                    if m > B:
                        m = B
                    if direct:
                        gemm(True, False, <int>g.F, <int>m, <int>g.C, <floating>1, &w[0], <int>g.F,
                             &x[(n * g.C) * g.P + p0], <int>g.P, <floating>0,
                             &y[(n * g.F) * g.P + p0], <int>g.P)
                    else:
                        _fwd_first_item(&x[0], &w[0], &y[0], buf, &g, n, p0, m)
    check_interrupt(&intr)


def _backward_input(floating[::1] dy, floating[::1] w, floating[::1] dx,
                     floating[::1] bufs, Py_ssize_t bufstride, Geom g, bint last,
                     Py_ssize_t B, Py_ssize_t T, Py_ssize_t axis_len,
                     Py_ssize_t inner, int nt):
    """Slabs of T positions along the outermost non-trivial output axis.

    T is large enough that the input footprints of slabs j and j + 2 never
    overlap, so all even slabs run in parallel, then all odd ones: no two
    threads ever add into the same dx element, and each element receives its
    contributions in a fixed order.
    """
    cdef Py_ssize_t nslab = (axis_len + T - 1) // T, phase, cnt, it, n, j, p0, p1
    cdef floating* buf = NULL
    cdef cb_intr intr
    cb_intr_init(&intr)
    # The caller holds the GIL (it passes memoryviews); release it for the work.
    with nogil:
        for phase in range(2):
            cnt = (nslab - phase + 1) // 2
            if cnt <= 0:
                continue
            with parallel(num_threads=nt):
                buf = &bufs[0] + threadid() * bufstride
                for it in prange(g.N * cnt, schedule='static'):
                    if cb_intr_poll(&intr):
                        continue
                    n = it // cnt
                    j = 2 * (it - n * cnt) + phase
                    p0 = j * T * inner
                    p1 = (j + 1) * T
                    if p1 > axis_len:
                        p1 = axis_len
                    p1 = p1 * inner
                    _bwdx_item(&dy[0], &w[0], &dx[0], buf, &g, last, n, p0, p1, B)
    check_interrupt(&intr)


def _backward_kernel(floating[::1] x, floating[::1] dy, floating[::1] parts,
                      floating[::1] dw, floating[::1] bufs, Py_ssize_t bufstride,
                      Geom g, bint last, bint direct, Py_ssize_t B,
                      Py_ssize_t ngroups, int nt):
    cdef Py_ssize_t nblk = 1, nitems, per, gi, c0, c1, i, KF = g.K * g.F
    cdef floating* buf = NULL
    # The partial sums: ngroups * KF elements read, KF written.
    cdef cb_intr intr
    cb_intr_init(&intr)
    # The caller holds the GIL (it passes memoryviews); release it for the work.
    with nogil:
        if last:
            nitems = (g.N * g.P + B - 1) // B
        else:
            nblk = (g.P + B - 1) // B
            nitems = g.N * nblk
        per = (nitems + ngroups - 1) // ngroups
        with parallel(num_threads=nt):
            buf = &bufs[0] + threadid() * bufstride
            for gi in prange(ngroups, schedule='static'):
                c0 = gi * per
                c1 = c0 + per
                if c1 > nitems:
                    c1 = nitems
                _bwdk_group(&x[0], &dy[0], &parts[gi * KF], buf, &g, last, direct, c0, c1, B,
                            nblk, &intr)
        _sum_parts(&parts[0], &dw[0], KF, ngroups)
    check_interrupt(&intr)


# ---------------------------------------------------------------- Python entries

class _Tuning(dict):
    """The kernels' tuning knobs; ``version`` counts changes, so that a
    prepared ForwardCall sees when its choice of path is stale."""
    version = 0

    def __setitem__(self, key, value):
        dict.__setitem__(self, key, value)
        self.version += 1

    def update(self, *args, **kwargs):
        dict.update(self, *args, **kwargs)
        self.version += 1

    def clear(self):
        dict.clear(self)
        self.version += 1


def _env_winograd():
    """CYBACK_WINOGRAD, through the settings registry (a bad value warns and
    leaves Winograd on)."""
    return bool(_settings.get("CYBACK_WINOGRAD"))


cdef enum:
    IM2COL_ROWS = 8    # patches per task of _im2col_rows


# Patch-buffer size per thread, a dict so that benchmarks can sweep it.
_TUNE = _Tuning({"winograd": _env_winograd(), "winograd_channels_first": True,
         "winograd_min_c": None, "winograd_min_f": 16,
         "winograd_min_tiles": 16, "winograd_kernel_per_tile": 8192,
"buf_bytes": BUF_BYTES, "pointwise_gemm": None, "pointwise_gemm_min_cf": 1 << 14,
         "pointwise_gemm_min_macs": 1 << 27, "pointwise_gemm_short_tiles_max_rows": 512,
         "pointwise_gemm_stream_outputs": 8 << 20, "pointwise_gemm_stream_max_c": 64,
         "direct": True, "direct_max_c": 64, "direct_max_k": 1024,
         "direct_wide_max_c": 1024, "direct_wide_max_k": 4608, "direct_wide_min_pixels": 512,
         "flops_per_byte": 8.0,
         "tap_min_c": 32, "tap_mnk": 1000000, "tap_min_rows": 96, "tap_rows": 1024,
         "tap_last_packed": False, "direct_skip_pad": None,
         "phase_split": None, "phase_max_c": 512, "phase_min_w": 24,
         "direct_dw": True, "direct_dw_max_c": 64, "direct_dw_max_bytes": 192 << 10,
         "short_im2col": True, "short_im2col_bytes": 4 << 20})


# ---------------------------------------------------------------- Winograd (channels_last)

@cython.wraparound(True)
@cython.boundscheck(True)
def _use_winograd(g, last, dtype):
    """Whether a forward convolution runs Winograd F(2x2, 3x3)
    (cyback/kernels/winograd.pyx): channels_last float32, a 2-D 3x3 kernel
    or a 3-D (KD, 3, 3) one, stride 1, no dilation, and enough channels and
    tiles. In 3-D the KD depth taps join the channels in the products.

    Winograd beats the direct kernel, batch 1 included, once there are
    enough input channels (_winograd_min_c); with fewer, the input transform
    costs as much as the products save. The transformed kernel (64 C F
    bytes) is streamed once per work item, so a call needs tiles in
    proportion to it (winograd_kernel_per_tile). benchmarks/bench_conv.py
    compares the two ("Winograd" rows); docs/performance.md. channels_first goes through channels_last copies of x and y, made on
    the team in the kernel's own parallel region (_run_winograd).
    CYBACK_WINOGRAD=0 turns it off (results then sum the taps directly)."""
    if not (_TUNE["winograd"] and dtype == np.float32 and winograd.available()):
        return False
    if not last and not _TUNE["winograd_channels_first"]:
        return False
    if (g["KH"], g["KW"]) != (3, 3) or g["sd"] != 1 or g["sh"] != 1 or g["sw"] != 1 or \
            g["dd"] != 1 or g["dh"] != 1 or g["dw"] != 1:
        return False
    if not (_winograd_min_c(g) <= g["C"] <= winograd.MAX_CHANNELS) or \
            g["F"] < _TUNE["winograd_min_f"]:
        return False
    n = winograd.tiles(g["N"], g["OH"], g["OW"], g["OD"])
    return n >= _TUNE["winograd_min_tiles"] and \
        n * _TUNE["winograd_kernel_per_tile"] >= g["KD"] * g["C"] * g["F"]


def _winograd_min_c(g):
    """The fewest input channels that run Winograd: _TUNE["winograd_min_c"],
    or by the kernel set and the kernel's depth when None. The direct
    kernel's 12-pixel AVX-512 tiles beat Winograd on 16 channels, where the
    AVX2 ones (6 pixels) do not: 24 with the former, 16 with the latter.
    With depth taps the direct kernel's patches are KD times longer and its
    packed kernel leaves L1, so 3-D layers take Winograd from 12 channels.
    Where the direct kernel runs 6-pixel AVX-512 tiles (512-bit FMAs at half
    rate), Winograd's two-vector blocks beat it on 16 channels in once there
    are more than 16 out, and its 16-channel blocks (the AVX2 set's) do not.
    benchmarks/bench_conv.py ("Winograd" rows) measures each case."""
    n = _TUNE["winograd_min_c"]
    if n is not None:
        return n
    if g["KD"] > 1:
        return 12
    if not cb_simd_has_avx512() or (_short_avx512_tiles() and g["F"] > 16):
        return 16
    return 24


cdef inline bint _short_avx512_tiles():
    """Whether the direct kernel runs its 6-pixel AVX-512 tiles (where 512-bit
    FMAs run at half rate), which moves the Winograd and 1x1 GEMM-tile rules."""
    return cb_simd_has_avx512() and not cb_cd_wide_tiles()


# (id of a cached geometry dict) -> (that dict, winograd.Winograd), as _DIRECT_GEOMS
_WINOGRADS = {}


@cython.wraparound(True)
@cython.boundscheck(True)
def _winograd(g):
    entry = _WINOGRADS.get(id(g))
    if entry is not None and entry[0] is g:
        return entry[1]
    w = winograd.Winograd(g["N"], g["H"], g["W"], g["C"], g["F"], g["OH"], g["OW"], g["ph"],
                          g["pw"], g["D"], g["OD"], g["KD"], g["pd"])
    if len(_WINOGRADS) >= 512:
        _WINOGRADS.clear()
    _WINOGRADS[id(g)] = (g, w)
    return w


def _run_winograd(w, x, kernel, y, bias, residual, int act, int nt, cache, bint last):
    """Winograd into y; True when the epilogue went in too (channels_first
    leaves a residual, and so the bias and activation after it, to the
    caller)."""
    if last:
        w.run(x, kernel, y, bias, residual, act, nt, cache, True, join_seconds())
        return True
    if residual is None:
        w.run(x, kernel, y, bias, None, act, nt, cache, False, join_seconds())
        return True
    w.run(x, kernel, y, None, None, 0, nt, cache, False, join_seconds())
    return False


# ---------------------------------------------------------------- direct (channels_last)

cdef void _forward_direct(const floating* x, floating* xp, bint copy, const floating* k,
                          const floating* bias, floating* wp, floating* bp, const floating* res,
                          int act, floating* y, cb_cd_geom g, int nt, cb_intr* intr,
                          double join) noexcept:
    """include/cyback_conv_direct.h over work items of one output row and
    one block of output channels, after packing the kernel (and bias) into
    wp (and bp) and, when copy, padding the input along W into xp; bias,
    bp and res are NULL without a bias or residual."""
    cdef Py_ssize_t nprep = g.nfb + (g.N * g.D * g.H if copy else 0)
    # (set here: the parallel block copies them in, firstprivate)
    cdef Py_ssize_t total = g.N * g.OD * g.OH * g.nfb, it = 0, c = 0, last = 0
    # Runs of consecutive items (rows that share input rows, blocks that
    # share a row), about 4 per thread, taken as threads come free.
    cdef Py_ssize_t run = max(1, (total + 4 * nt - 1) // (4 * nt))
    cdef const floating* src = xp if copy else x
    cdef cb_tiles prepared, items
    cb_tiles_init(&prepared)
    cb_tiles_init(&items)
    # One parallel region: waking a sleeping team costs more than a small
    # convolution, so the packing, the padding and the rows share one
    # wake-up. Packed in the region, the kernel also leaves no serial gap
    # before it, which at batch 1 (packing, then the call's Python) can
    # outlast the idle threads' spin and put them to sleep at every call
    # (docs/performance.md, "How idle threads wait"). Both phases hand out their work as threads
    # come free, with no barrier at their start (a prange has one, for the
    # index GCC makes firstprivate and lastprivate): a thread that joins late
    # finds its share taken instead of holding the others at a barrier or
    # in the join. The rows wait for the packed kernel and padded input by
    # count, and the region ends with a bounded spin (include/cyback_tiles.h).
    with nogil, parallel(num_threads=nt):
        it = cb_tiles_take(&prepared)
        while it < nprep:
            if it < g.nfb:
                if floating is float:
                    cb_cd_pack_block_f(k, bias, wp, bp, &g, it)
                else:
                    cb_cd_pack_block_d(k, bias, wp, bp, &g, it)
            elif floating is float:
                cb_cd_pad_row_f(x, xp, &g, it - g.nfb)
            else:
                cb_cd_pad_row_d(x, xp, &g, it - g.nfb)
            cb_tiles_finish(&prepared)
            it = cb_tiles_take(&prepared)
        cb_tiles_wait_done(&prepared, nprep)
        c = cb_tiles_take(&items) * run
        while c < total:
            last = min(c + run, total)
            while c < last and not cb_intr_poll(intr):
                if floating is float:
                    cb_cd_item_f(src, wp, bp, res, act, y, &g, c)
                else:
                    cb_cd_item_d(src, wp, bp, res, act, y, &g, c)
                c = c + 1
            c = cb_tiles_take(&items) * run
        cb_tiles_join(&items, cb_get_num_threads(), join)


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_direct(g, last, bint dbl=False):
    """Whether a forward convolution runs the direct kernel.

    It reads the input in place (no patch matrix) and keeps a 6 x FB output
    tile in registers, which wins while the patch length K = taps * C is
    short, and on wider layers with enough pixels (below); past that,
    im2col + BLAS's packed GEMM is faster (see benchmarks/bench_conv.py,
    "direct" rows). With half a block of output channels or fewer, most of
    the tile's lanes would be idle, so such layers take im2col."""
    if not last or not _TUNE["direct"] or g["KD"] * g["KH"] > CB_CD_MAX_ROWS \
            or g["C"] > CB_CD_MAX_C:
        return False
    if 2 * g["F"] <= cb_cd_block(dbl):
        return False
    if g["C"] <= _TUNE["direct_max_c"] and g["K"] <= _TUNE["direct_max_k"]:
        return True
    # Wider layers: the direct kernel streams a block's packed kernel (K *
    # FB values) once per tile, from L2 while it fits there (K <= 4608:
    # 3x3 x 512 is 288 KB of floats); BLAS packs it once per GEMM, which
    # pays when a call has few pixels: hence the floor on pixels
    # (benchmarks/bench_conv.py, "direct" rows).
    return g["C"] <= min(_TUNE["direct_wide_max_c"], CB_CD_MAX_C) and \
        g["K"] <= _TUNE["direct_wide_max_k"] and \
        g["N"] * g["OD"] * g["OH"] * g["OW"] >= _TUNE["direct_wide_min_pixels"]


cdef class _DirectGeom:
    """The direct kernel's geometry for one convolution geometry and block
    width, with its buffer sizes: built once, not on every call."""
    cdef cb_cd_geom g
    cdef Py_ssize_t wp_size, bp_size, xp_size
    cdef bint copy


# (id of a cached geometry dict, block width) -> (that dict, _DirectGeom);
# the dict is held so that its id is not reused while the entry lives.
_DIRECT_GEOMS = {}


@cython.wraparound(True)
@cython.boundscheck(True)
cdef _DirectGeom _direct_geom(g, Py_ssize_t FB):
    cdef _DirectGeom d
    entry = _DIRECT_GEOMS.get((id(g), FB))
    if entry is not None and entry[0] is g:
        return entry[1]
    d = _DirectGeom()
    nfb = (g["F"] + FB - 1) // FB
    reach = (g["OW"] - 1) * g["sw"] + (g["KW"] - 1) * g["dw"] + 1
    row = g["W"] if _skip_pad() else max(reach, g["pw"] + g["W"])
    geom = dict(N=g["N"], C=g["C"], F=g["F"], D=g["D"], H=g["H"], W=g["W"], Wp=row,
                pw=g["pw"], OD=g["OD"], OH=g["OH"], OW=g["OW"], KD=g["KD"], KH=g["KH"],
                KW=g["KW"], sd=g["sd"], sh=g["sh"], sw=g["sw"], dd=g["dd"], dh=g["dh"],
                dw=g["dw"], pd=g["pd"], ph=g["ph"], FB=FB, nfb=nfb)
    if g["K"] == g["C"] and (g["OD"], g["OH"], g["OW"]) == (g["D"], g["H"], g["W"]) and \
            g["sd"] == g["sh"] == g["sw"] == 1 and g["pd"] == g["ph"] == g["pw"] == 0:
        # A 1x1 convolution reads its input as one run of pixels: rows of up
        # to 128 of them spread a work item's set-up over more tiles than
        # the image's own rows (32 pixels at batch 1 in MobileNet blocks).
        pixels = g["N"] * g["D"] * g["H"] * g["W"]
        cols = _pointwise_row(pixels, g["W"])
        geom.update(N=1, D=1, OD=1, H=pixels // cols, OH=pixels // cols, W=cols, OW=cols,
                    Wp=cols)
    d.g = geom
    cb_cd_prepare(&d.g, 0)
    d.wp_size = nfb * FB * g["K"]
    d.bp_size = nfb * FB
    d.copy = row != g["W"]
    d.xp_size = g["N"] * g["D"] * g["H"] * row * g["C"] if d.copy else 1
    if len(_DIRECT_GEOMS) >= 512:
        _DIRECT_GEOMS.clear()
    _DIRECT_GEOMS[(id(g), FB)] = (g, d)
    return d


def _pointwise_row(Py_ssize_t pixels, Py_ssize_t width):
    """The longest row of at most 128 pixels that divides ``pixels`` into
    whole rows (``width`` itself, a divisor, when it is longer)."""
    cdef Py_ssize_t cols, best = width
    for cols in range(width + 1, 129):
        if pixels % cols == 0:
            best = cols
    return best


def _skip_pad():
    """Whether the direct kernel reads the input rows as they are, its tiles
    at each row's ends checking their taps against the W padding (the vector
    kernels can), rather than a zero-padded copy (the scalar kernel needs
    one; _TUNE["direct_skip_pad"] forces either for tests). The copy is a
    pass over the input and a barrier, a noticeable share of a narrow 3x3
    convolution's time."""
    return bool(cb_cd_pads_itself()) and _TUNE["direct_skip_pad"] is not False


def _run_direct(x, kernel, y, g, bias, residual, int act, int nt):
    cdef bint dbl = x.dtype == np.float64
    cdef _DirectGeom d = _direct_geom(g, cb_cd_block_for(dbl, g["F"]))
    wp = np.empty(d.wp_size, dtype=x.dtype)
    has_bias = bias is not None
    bp = np.empty(d.bp_size if has_bias else 1, dtype=x.dtype)
    has_res = residual is not None
    _direct(d, _flat(x), np.empty(d.xp_size, dtype=x.dtype) if d.copy else bp, _flat(kernel),
            bias if has_bias else bp, has_bias, wp, bp, _flat(residual) if has_res else bp,
            has_res, act, _flat(y), nt)


def _direct(_DirectGeom d, floating[::1] x, floating[::1] xp, floating[::1] k,
            floating[::1] bias, bint has_bias, floating[::1] wp, floating[::1] bp,
            floating[::1] res, bint has_res, int act, floating[::1] y, int nt):
    """The kernel and bias packed into wp and bp, then the direct forward
    convolution (typed with the fused float type: Cython picks the float or
    double specialisation from the arrays)."""
    cdef cb_intr intr
    cdef floating* b = &bp[0] if has_bias else NULL
    cb_intr_init(&intr)
    _forward_direct[floating](&x[0], &xp[0], d.copy, &k[0], &bias[0] if has_bias else NULL,
                              &wp[0], b, &res[0] if has_res else NULL, act, &y[0], d.g, nt,
                              &intr, join_seconds())
    check_interrupt(&intr)


@cython.wraparound(True)
@cython.boundscheck(True)
def _tap_rows(g, pointwise, last):
    """Output rows per tile of the stride-1 tap GEMMs (see _fwd_tap_item), or
    0 for im2col.

    OpenBLAS (SkylakeX and later) multiplies products of up to m * n * k = 1e6
    straight from the operands, with no packing. The tap GEMMs are (rows, C) x
    (C, F): tiles under that bound beat im2col while the bound leaves enough
    rows (_TUNE["tap_min_rows"]; C = F = 64 leaves 240, C = F = 128 only 56).
    Below that channels_last keeps im2col, while channels_first (whose
    im2col is slower) takes larger packed tiles.
    """
    if (pointwise or g["sd"] != 1 or g["sh"] != 1 or g["sw"] != 1
            or g["C"] < _TUNE["tap_min_c"] or g["KD"] * g["KH"] * g["KW"] == 1):
        return 0
    rows = _TUNE["tap_mnk"] // max(1, g["C"] * g["F"]) // 8 * 8
    if rows >= _TUNE["tap_min_rows"]:
        return rows
    return 0 if last and not _TUNE["tap_last_packed"] else _TUNE["tap_rows"]


# The Python-level code indexes tuples with negative indices, so it opts back
# into wraparound and bounds checks, which the build turns off globally.

@cython.wraparound(True)
@cython.boundscheck(True)
def _tuple(v, rank, name, fname, lo):
    try:
        t = tuple(int(e) for e in v)
    except TypeError:
        raise TypeError("%s: %s must be a sequence of %d ints, got %r" % (fname, name, rank, v))
    if len(t) != rank or any(e < lo for e in t):
        raise ValueError("%s: %s must be %d ints >= %d, got %r" % (fname, name, rank, lo, v))
    return t


@cython.wraparound(True)
@cython.boundscheck(True)
def _pads(pads, rank, fname):
    try:
        t = tuple((int(a), int(b)) for a, b in pads)
    except (TypeError, ValueError):
        raise TypeError("%s: pads must be %d (before, after) pairs, got %r" % (fname, rank, pads))
    if len(t) != rank or any(a < 0 or b < 0 for a, b in t):
        raise ValueError("%s: pads must be %d non-negative (before, after) pairs, got %r"
                         % (fname, rank, pads))
    return t


@cython.wraparound(True)
@cython.boundscheck(True)
def _dtype(fname, *arrays):
    dt = arrays[0].dtype
    for a in arrays[1:]:
        if a.dtype != dt:
            raise TypeError("%s: arrays must share one dtype, got %s"
                            % (fname, ", ".join(str(b.dtype) for b in arrays)))
    if dt not in (np.float16, np.float32, np.float64):
        raise TypeError("%s: expected float16, float32 or float64 arrays, got %s" % (fname, dt))
    return dt


_GEOMETRIES = {}


def _geometry(x_shape, k_shape, strides, dilation, pads, channels_last, fname):
    """Validated Geom fields as a dict (shared: read it, never write it), the
    output spatial shape and whether the convolution is pointwise;
    remembered per argument tuple."""
    return remembered(_GEOMETRIES, (x_shape, k_shape, strides, dilation, _pads_key(pads),
                                    bool(channels_last)),
                      _compute_geometry, x_shape, k_shape, strides, dilation, pads,
                      channels_last, fname)


def _pads_key(pads):
    """pads as a hashable key: Keras and the benchmarks pass a list of
    (before, after) pairs, which _geometry would otherwise validate anew at
    every call, a visible share of a batch-1 layer's time outside its
    kernel."""
    if isinstance(pads, list):
        try:
            return tuple([tuple(p) if isinstance(p, (list, tuple)) else p for p in pads])
        except TypeError:
            return pads
    return pads


@cython.wraparound(True)
@cython.boundscheck(True)
def _compute_geometry(x_shape, k_shape, strides, dilation, pads, channels_last, fname):
    x_shape = tuple(int(s) for s in x_shape)
    k_shape = tuple(int(s) for s in k_shape)
    rank = len(x_shape) - 2
    if len(k_shape) == len(x_shape) + 1 and 3 <= len(k_shape) <= 5:
        # the kernel's rank says what the input lacks: its batch axis
        raise ValueError("%s: the input %s has no batch axis: a %d-D kernel %s takes %d-D "
                         "input (batch, %d spatial axes, channels); add one (x[None])"
                         % (fname, x_shape, len(k_shape), k_shape, len(k_shape),
                            len(k_shape) - 2))
    if rank not in (1, 2, 3):
        raise ValueError("%s: input must have 1 to 3 spatial axes, got shape %s"
                         % (fname, x_shape))
    if len(k_shape) != rank + 2:
        raise ValueError("%s: kernel shape %s does not match input shape %s (need %d-D kernel)"
                         % (fname, k_shape, x_shape, rank + 2))
    if any(s < 0 for s in x_shape) or any(s < 1 for s in k_shape[:rank]) or min(k_shape) < 0:
        raise ValueError("%s: invalid shapes %s, kernel %s" % (fname, x_shape, k_shape))
    strides = _tuple(strides, rank, "strides", fname, 1)
    dilation = _tuple(dilation, rank, "dilation", fname, 1)
    pads = _pads(pads, rank, fname)
    if channels_last:
        n, spatial, c = x_shape[0], x_shape[1:-1], x_shape[-1]
    else:
        n, c, spatial = x_shape[0], x_shape[1], x_shape[2:]
    if k_shape[-2] != c:
        raise ValueError("%s: kernel %s expects %d input channels but the input %s has %d (%s)"
                         % (fname, k_shape, k_shape[-2], x_shape, c,
                            "channels_last" if channels_last else "channels_first"))
    out = []
    for i in range(rank):
        span = (k_shape[i] - 1) * dilation[i] + 1
        ext = spatial[i] + pads[i][0] + pads[i][1] - span
        out.append(ext // strides[i] + 1 if ext >= 0 else 0)
    # Per axis (size, kernel, stride, dilation, pad before, pad after, out),
    # as three axes D, H, W: 1-D is W, 2-D is H, W.
    axes = [(1, 1, 1, 1, 0, 0, 1)] * (3 - rank) + \
        [(spatial[i], k_shape[i], strides[i], dilation[i], pads[i][0], pads[i][1], out[i])
         for i in range(rank)]
    # A trailing axis of size 1 with a 1-tap kernel and no padding, such as
    # the W of a (k, 1) kernel on (N, H, 1, C), leaves the memory of x, the
    # kernel and y as they would be without it: drop it, so that the axis
    # before becomes W, along which the kernels tile their rows (rows of
    # one pixel would leave the tiles nearly empty).
    for _ in range(2):
        if axes[2][:2] == (1, 1) and axes[2][4:6] == (0, 0) and \
                any(a[:2] != (1, 1) or a[4:6] != (0, 0) for a in axes[:2]):
            axes = [(1, 1, 1, 1, 0, 0, 1)] + axes[:2]
    sp, ks, ss, ds, ps, _, os = zip(*axes)
    g = dict(N=n, C=c, F=k_shape[-1], D=sp[0], H=sp[1], W=sp[2], OD=os[0], OH=os[1], OW=os[2],
             KD=ks[0], KH=ks[1], KW=ks[2], sd=ss[0], sh=ss[1], sw=ss[2],
             dd=ds[0], dh=ds[1], dw=ds[2], pd=ps[0], ph=ps[1], pw=ps[2],
             K=ks[0] * ks[1] * ks[2] * c, P=os[0] * os[1] * os[2])
    pointwise = (all(k == 1 for k in ks) and all(s == 1 for s in ss)
                 and all(a == 0 and b == 0 for a, b in pads))
    return g, tuple(out), pointwise


@cython.wraparound(True)
@cython.boundscheck(True)
def _padded_buffer(g, last, dtype, dummy):
    """(buffer for the padded channels_last copy of x, whether it is needed):
    no copy when x is channels_last with nothing to pad."""
    dp = g["OD"] + (g["KD"] - 1) * g["dd"]
    hp = g["OH"] + (g["KH"] - 1) * g["dh"]
    wp = g["OW"] + (g["KW"] - 1) * g["dw"]
    if last and (dp, hp, wp) == (g["D"], g["H"], g["W"]) and \
            g["pd"] == 0 and g["ph"] == 0 and g["pw"] == 0:
        return dummy[:1], False
    return np.empty(g["N"] * dp * hp * wp * g["C"], dtype=dtype), True


@cython.wraparound(True)
@cython.boundscheck(True)
def _y_shape(g, out, channels_last):
    return ((g["N"],) + out + (g["F"],)) if channels_last else ((g["N"], g["F"]) + out)


@cython.wraparound(True)
@cython.boundscheck(True)
def _block_rows(g, itemsize):
    b = _TUNE["buf_bytes"] // max(1, g["K"] * itemsize)
    return max(8, min(4096, b))


@cython.wraparound(True)
@cython.boundscheck(True)
def _work_bufs(g, B, dtype, nt):
    """One patch buffer per OpenMP thread, (nt * stride) elements.

    Each holds B patches and B outputs (the channels_first transpose).
    """
    stride = ((g["K"] + g["F"]) * B + 15) // 16 * 16
    return np.empty(max(1, nt) * stride, dtype=dtype), stride


@cython.wraparound(True)
@cython.boundscheck(True)
def _threads(g):
    """(OpenMP threads, BLAS-limit context) for a convolution of this geometry.

    Work is the GEMM flops; small problems stay on the calling thread, and then
    BLAS needs no limit either (OpenBLAS runs GEMMs that small on one thread),
    which saves the locked ctypes calls of switching it. A large problem on
    one OpenMP thread still holds BLAS at one thread, so that its GEMMs run
    exactly as they do on more threads.
    """
    cdef double work = 2.0 * g["N"] * g["P"] * g["K"] * g["F"]
    # The team's cutoff is counted in bytes moved, and a convolution's flop
    # costs about an eighth of a byte (_TUNE["flops_per_byte"]): waking a
    # sleeping team outweighs a small batch-1 convolution's work
    # (benchmarks/bench_conv.py compares 1 and 2 threads at batch 1).
    return (threads_for(work / _TUNE["flops_per_byte"]),
            nullcontext() if work < team_min_work() else blas_limit(1))


def _flat(a):
    return a.reshape(-1)


def _direct_block_width(bint dbl, Py_ssize_t F=0):
    """Output channels per block of the direct kernel set that runs now, for
    F output channels (0: the AVX2 or baseline width)."""
    return cb_cd_block_for(dbl, F)


def _use_avx2(bint on):
    """Run the direct kernel's AVX2 + FMA set when the CPU has it (the
    default), or the baseline one (for tests). Returns whether AVX2 now runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let the direct kernel's AVX-512 set run when the CPU has it (the
    default), or cap it at AVX2 (for tests). Returns whether AVX-512 now runs."""
    return bool(cb_simd_use_avx512(on))


def _use_wide_tiles(wide=None):
    """Run the direct kernel's float32 AVX-512 rows in tiles of 12 pixels
    (True), of 6 (False) or as the CPU suits (None, the default: 6 where
    512-bit FMAs run at half rate, include/cyback_conv_direct.h). The same
    sums either way; for tests and benchmarks. Returns whether the
    12-pixel tiles now run."""
    return bool(cb_cd_use_wide_tiles(-1 if wide is None else int(bool(wide))))


def _use_quad_blocks(bint on=True):
    """Let float32 layers of a multiple of 64 channels take the direct
    kernel's 64-channel blocks where its 6-pixel AVX-512 tiles run (True,
    the default), or keep 32-channel blocks (False): the same sums either
    way; for tests and benchmarks. Prepared calls re-plan."""
    cb_cd_use_quad_blocks(on)
    _TUNE.version += 1
    return on


_ACTIVATIONS = {None: 0, "linear": 0, "relu": 1, "relu6": 2}


@cython.wraparound(True)
@cython.boundscheck(True)
def conv_forward(x, kernel, strides, dilation, pads, channels_last=True, out=None, bias=None,
                 residual=None, activation=None):
    """N-D convolution (cross-correlation, as in Keras), 1 to 3 spatial axes.

    x: (N, *spatial, C) if channels_last else (N, C, *spatial); kernel (*k, C, F);
    strides, dilation: one int per spatial axis; pads: one (before, after) pair
    per spatial axis. Returns y: (N, *out, F) or (N, F, *out), with
    out = (size + before + after - (k - 1) * dilation - 1) // stride + 1.
    Optional epilogue: bias, (F,) of x's dtype, added per output channel after
    the sum; residual, an array of y's shape and x's dtype, added next; then
    activation None, 'linear', 'relu' or 'relu6'. The direct kernel applies
    it in registers, the other paths in one pass over y.
    """
    fname = "conv_forward"
    x = np.asarray(x)
    kernel = np.asarray(kernel)
    dt = _dtype(fname, x, kernel)
    g, osp, pointwise = _geometry(x.shape, kernel.shape, strides, dilation, pads,
                                  channels_last, fname)
    if activation not in _ACTIVATIONS:
        raise ValueError("%s: activation must be one of None, 'linear', 'relu', 'relu6', got %r"
                         % (fname, activation))
    act = _ACTIVATIONS[activation]
    yshape = _y_shape(g, osp, channels_last)
    cdt = np.float32 if dt == np.float16 else dt
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != dt or bias.shape != (g["F"],):
            raise ValueError("%s: bias must be a %s array of shape (%d,), got %s %s"
                             % (fname, dt, g["F"], bias.dtype, bias.shape))
        bias = np.ascontiguousarray(bias, dtype=cdt)
    if residual is not None:
        residual = np.asarray(residual)
        if residual.dtype != dt or residual.shape != yshape:
            raise ValueError("%s: residual must be a %s array of shape %s, got %s %s"
                             % (fname, dt, yshape, residual.dtype, residual.shape))
        residual = np.ascontiguousarray(residual, dtype=cdt)
    if out is not None:
        if (not isinstance(out, np.ndarray) or out.shape != yshape or out.dtype != dt
                or not out.flags.c_contiguous):
            raise ValueError("%s: out must be a C-contiguous %s array of shape %s"
                             % (fname, dt, yshape))
    y = out if (out is not None and cdt == dt) else np.empty(yshape, dtype=cdt)
    if y.size == 0:
        return out if out is not None else y
    done = False
    if g["K"] == 0:
        y[...] = 0
    else:
        done = _run_forward(_writable(np.ascontiguousarray(x, dtype=cdt)),
                            _writable(np.ascontiguousarray(kernel, dtype=cdt)), y, g,
                            channels_last, pointwise, bias, residual, act)
    if not done:
        _epilogue(y, bias, residual, act, channels_last)
    if y is not out and out is not None:
        out[...] = y
        return out
    return y.astype(dt, copy=False)


def _epilogue(y, bias, residual, int act, bint channels_last):
    if bias is not None:
        y += bias if channels_last else bias.reshape((-1,) + (1,) * (y.ndim - 2))
    if residual is not None:
        y += residual
    if act:
        np.maximum(y, 0, out=y)
        if act == 2:
            np.minimum(y, 6, out=y)


cdef inline object _writable(cnp.ndarray a):
    # the memoryviews of the GEMM paths refuse read-only buffers (constants)
    return a if cnp.PyArray_ISWRITEABLE(a) else a.copy()


cdef class ForwardCall:
    """``conv_forward`` for one geometry, dtype (float32 or float64) and
    epilogue, validated once by ``forward_call``.

    A batch-1 convolution's kernel runs for microseconds, about as long as
    conv_forward's checks and set-up take, so a compiled plan calls this
    instead: it checks only what memory safety needs (each array's type,
    dtype, shape and contiguity) and, on the direct kernel's path, packs
    the kernel into a scratch block and runs the kernel on raw pointers. An
    array that does not fit, or tuning changed since (``_TUNE``), takes
    conv_forward with the same arguments, which converts or raises."""
    cdef tuple x_shape, k_shape, b_shape, y_shape, args
    cdef object g, activation, dtype
    cdef int typenum, act, itemsize, version, y_ndim
    cdef cnp.npy_intp y_dims[5]
    cdef bint has_bias, has_res, last, pointwise, direct
    cdef double work
    cdef _DirectGeom d
    cdef object wino, wino_cache

    def __call__(self, x, kernel, bias=None, residual=None):
        cdef int nt
        if self.version != _TUNE.version or not fits(x, self.typenum, self.x_shape) or \
                not fits(kernel, self.typenum, self.k_shape) or \
                (bias is not None) != self.has_bias or (residual is not None) != self.has_res \
                or (self.has_bias and not fits(bias, self.typenum, self.b_shape)) or \
                (self.has_res and not fits(residual, self.typenum, self.y_shape)):
            return conv_forward(x, kernel, *self.args, bias=bias, residual=residual,
                                activation=self.activation)
        y = cnp.PyArray_EMPTY(self.y_ndim, self.y_dims, self.typenum, 0)
        if self.wino is not None:
            nt = threads_for(self.work)
            if not _run_winograd(self.wino, x, kernel, y, bias, residual, self.act, nt,
                                 self.wino_cache, self.last):
                _epilogue(y, bias, residual, self.act, self.last)
            team_done(nt)
        elif self.direct:
            self._direct(x, kernel, bias, residual, y)
        elif not _run_forward(_writable(x), _writable(kernel), y, self.g, self.last,
                              self.pointwise, bias, residual, self.act):
            _epilogue(y, bias, residual, self.act, self.last)
        return y

    cdef _direct(self, cnp.ndarray x, cnp.ndarray k, object bias, object res, cnp.ndarray y):
        cdef cb_intr intr
        cdef _DirectGeom d = self.d
        cdef int nt = threads_for(self.work)
        cdef char* scratch
        cdef char* wp
        cdef char* bp
        cdef char* xp
        cdef const void* b = cnp.PyArray_DATA(<cnp.ndarray> bias) if self.has_bias else NULL
        cdef const void* r = cnp.PyArray_DATA(<cnp.ndarray> res) if self.has_res else NULL
        cdef double join = join_seconds()
        # one block for the packed kernel, the packed bias and the padded input
        scratch = <char*> malloc((d.wp_size + d.bp_size + (d.xp_size if d.copy else 0))
                                 * self.itemsize)
        if scratch == NULL:
            raise MemoryError("conv_forward: no memory for the packed kernel")
        wp = scratch
        bp = wp + d.wp_size * self.itemsize
        xp = bp + d.bp_size * self.itemsize
        cb_intr_init(&intr)
        if self.itemsize == 4:
            _forward_direct[float](<const float*> cnp.PyArray_DATA(x), <float*> xp, d.copy,
                                   <const float*> cnp.PyArray_DATA(k), <const float*> b,
                                   <float*> wp, <float*> bp if b != NULL else NULL,
                                   <const float*> r, self.act, <float*> cnp.PyArray_DATA(y),
                                   d.g, nt, &intr, join)
        else:
            _forward_direct[double](<const double*> cnp.PyArray_DATA(x), <double*> xp, d.copy,
                                    <const double*> cnp.PyArray_DATA(k), <const double*> b,
                                    <double*> wp, <double*> bp if b != NULL else NULL,
                                    <const double*> r, self.act,
                                    <double*> cnp.PyArray_DATA(y), d.g, nt, &intr, join)
        team_done(nt)
        free(scratch)
        check_interrupt(&intr)


# Products a @ b with a short inner axis through the 1x1 convolution kernels
# (small_k_product): (M, K, F, has_bias) -> that shape's ForwardCall.
_PRODUCTS = {}


@cython.wraparound(True)
@cython.boundscheck(True)
def small_k_product(a, b, bias=None):
    """a @ b (+ bias along the last axis) for a C-contiguous float32 (M, K)
    matrix a with a short inner axis and many rows, and a C-contiguous
    (K, F) b, as the 1x1 convolution of M pixels it is; None when the
    product is not of that kind (the caller then runs its GEMM).

    BLAS's packed GEMM spends as long packing and writing (M, F) as it
    multiplies when K is this short; the 1x1 kernels (the direct kernel, or
    where it decides so, GEMM tiles) read a in place and add the bias in
    registers (an LSTM's input projection over all steps is such a
    product). A product of few rows keeps the GEMM, which is faster there
    (benchmarks/bench_linalg.py, "matmul / small_k"). Results do not depend
    on the thread count."""
    if a.ndim != 2 or b.ndim != 2 or a.dtype != np.float32 or b.dtype != np.float32 or \
            not a.flags.c_contiguous or not b.flags.c_contiguous:
        return None
    M, K, F = a.shape[0], a.shape[1], b.shape[1]
    if K > 64 or K < 1 or M < 512 or F < 16 or b.shape[0] != K:
        return None
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (F,)
                             or not bias.flags.c_contiguous):
        return None
    key = (M, K, F, bias is not None)
    known = _PRODUCTS.get(key)
    if known is None:
        rows = M // _product_row(M)
        shape = (rows, M // rows, K)
        known = (forward_call(shape, (1, K, F), (1,), (1,), [(0, 0)], True, np.float32,
                              has_bias=bias is not None), shape)
        if len(_PRODUCTS) >= 64:
            _PRODUCTS.clear()
        _PRODUCTS[key] = known
    call, shape = known
    return call(a.reshape(shape), b.reshape(1, K, F), bias).reshape(M, F)


def _product_row(Py_ssize_t M):
    """Pixels per row of the M-pixel 1x1 convolution small_k_product runs: the
    largest divisor of M from 16 to 128, else M. The direct kernel's work
    items are (row, block of output channels), so with one row of M pixels
    each thread reads all of a, which the calling thread has usually just
    written, from the other core's cache; with rows, each reads only its
    own."""
    cdef Py_ssize_t L
    for L in range(min(M, 128), 15, -1):
        if M % L == 0:
            return L
    return M


@cython.wraparound(True)
@cython.boundscheck(True)
def forward_call(x_shape, k_shape, strides, dilation, pads, channels_last, dtype,
                 bint has_bias=False, bint has_residual=False, activation=None):
    """A ``ForwardCall``: ``call(x, kernel, bias, residual)`` computes
    ``conv_forward(x, kernel, strides, dilation, pads, channels_last,
    bias=bias, residual=residual, activation=activation)`` for arrays of
    these shapes and ``dtype`` (float32 or float64), with the checks of
    conv_forward (the same errors) made here, once."""
    fname = "conv_forward"
    cdef ForwardCall call = ForwardCall()
    dtype = np.dtype(dtype)
    if dtype != np.float32 and dtype != np.float64:
        raise TypeError("%s: a prepared call takes float32 or float64 arrays, got %s"
                        % (fname, dtype))
    x_shape = tuple(int(d) for d in x_shape)
    k_shape = tuple(int(d) for d in k_shape)
    g, osp, pointwise = _geometry(x_shape, k_shape, strides, dilation, pads, channels_last,
                                  fname)
    if activation not in _ACTIVATIONS:
        raise ValueError("%s: activation must be one of None, 'linear', 'relu', 'relu6', got %r"
                         % (fname, activation))
    call.x_shape, call.k_shape, call.b_shape = x_shape, k_shape, (g["F"],)
    call.y_shape = _y_shape(g, osp, channels_last)
    call.y_ndim = len(call.y_shape)
    for i in range(call.y_ndim):
        call.y_dims[i] = call.y_shape[i]
    call.args = (strides, dilation, pads, channels_last)
    call.g, call.activation, call.dtype = g, activation, dtype
    call.typenum, call.itemsize = dtype.num, dtype.itemsize
    call.act = _ACTIVATIONS[activation]
    call.has_bias, call.has_res = has_bias, has_residual
    call.last, call.pointwise = bool(channels_last), pointwise
    call.version = _TUNE.version
    # empty outputs and empty patches take conv_forward's own branches
    empty = g["K"] == 0 or 0 in call.y_shape
    call.work = 2.0 * g["N"] * g["P"] * g["K"] * g["F"] / _TUNE["flops_per_byte"]
    if not empty and _use_winograd(g, channels_last, dtype):
        call.wino = _winograd(g)
        call.wino_cache = winograd.KernelCache()
        return call
    call.direct = not empty and \
        not _use_pointwise_gemm(g, channels_last, pointwise) and \
        _use_direct(g, channels_last, dtype == np.float64)
    if call.direct:
        call.d = _direct_geom(g, cb_cd_block_for(dtype == np.float64, g["F"]))
    elif empty:
        call.version = -1
    return call


# ---------------------------------------------------------------- pointwise (1x1) as GEMM tiles

@functools.lru_cache(maxsize=512)
@cython.wraparound(True)
@cython.boundscheck(True)
def _pointwise_tiles(Py_ssize_t M, Py_ssize_t K, Py_ssize_t F):
    """The output tiles of a 1x1 channels_last convolution run as
    single-threaded GEMMs on the (M, K) view of x: an (n, 4) array of
    (first row, rows, first column, columns), largest first, in the order
    the threads take them.

    OpenBLAS's result for one element depends on the shape of the call that
    computes it (threaded calls and every split tested differ in the last
    bits), so the tiles come from the shape alone, never from the thread
    count. Each GEMM call packs its rows of x (nf times over all: M K
    values each) and its columns of the kernel (nr times: K F), so tiles are
    as large as they can be: rows (times K) within 512 KB, and at least 4
    tiles (else 2), each of 64 rows and columns or more, the split that packs the
    fewest values (a batch-1 call with few rows splits its columns, a call
    with many rows its rows): more, smaller tiles lose to NumPy's threaded
    sgemm of the same shape (benchmarks/bench_conv.py --pointwise).

    An axis cut in 2-4 parts is cut unevenly, its first half of the parts
    twice the size of the others (4 tiles: 1/3, 1/3, 1/6, 1/6): on equal
    threads the halves end together, as with even tiles, but when one
    thread runs at half speed (a virtualised host may slow one virtual CPU
    for spells of a few hundred milliseconds) the fast one takes both small
    tiles and the call ends with the slow one's large tile, at the best
    split of the work between the two, instead of waiting for whichever
    thread took the last even tile (benchmarks/bench_conv.py --pointwise
    compares the tiles with NumPy's sgemm)."""
    cdef Py_ssize_t most_rows = max(64, min(2048, (1 << 17) // max(1, K)))
    cdef Py_ssize_t nr0 = _ceil_div(M, most_rows)
    cdef Py_ssize_t nr = nr0, nf = 1, r, f, want
    cdef double cost, best = -1
    if nr0 < 4:
        # 4 tiles where each keeps 64 rows or columns, else 2 (a 1x1 of 196
        # or 49 rows onto 96-160 columns, MobileNetV2's projections, then
        # still gives a second thread its half), else one.
        for want in (4, 2):
            for f in (1, 2, 4):
                if f > want:
                    continue
                r = max(nr0, _ceil_div(want, f))
                if (f > 1 and _ceil_div(F, f) < 64) or (r > nr0 and _ceil_div(M, r) < 64):
                    continue
                cost = <double>f * M + <double>r * F
                if best < 0 or cost < best:
                    best, nr, nf = cost, r, f
            if best >= 0:
                break
    # uneven cuts pay off with 4 tiles or more (see above); 2 are halves
    rows = _tile_edges(M, nr, nr >= nf and nr * nf >= 4, most_rows)
    cols = _tile_edges(F, nf, nf > nr and nr * nf >= 4, F)
    tiles = np.array([(r0, r1 - r0, f0, f1 - f0)
                      for f0, f1 in zip(cols[:-1], cols[1:])
                      for r0, r1 in zip(rows[:-1], rows[1:])], dtype=np.intp)
    tiles = np.ascontiguousarray(tiles[np.argsort(-tiles[:, 1] * tiles[:, 3], kind="stable")])
    tiles.flags.writeable = False       # remembered for the shape's next call
    return tiles


@cython.wraparound(True)
@cython.boundscheck(True)
def _tile_edges(Py_ssize_t n, Py_ssize_t parts, bint uneven, Py_ssize_t most):
    """Where an axis of n is cut into `parts` (at multiples of 16): evenly,
    or, `uneven` and 2-4 parts, the first half of the parts twice as large
    as the others if those stay within `most` (rounded up to 16)."""
    weights = [1] * parts
    if uneven and 2 <= parts <= 4:
        weights = [2] * ((parts + 1) // 2) + [1] * (parts // 2)
        if _round16(_ceil_div(2 * n, sum(weights))) > _round16(most):
            weights = [1] * parts
    cdef double total = sum(weights), acc = 0
    edges = [0]
    for wgt in weights[:-1]:
        acc += wgt
        cut = _round16(<Py_ssize_t>(n * acc / total + 0.5))
        if edges[-1] < cut < n:
            edges.append(cut)
    edges.append(n)
    return edges


cdef inline Py_ssize_t _round16(Py_ssize_t n) noexcept nogil:
    return n if n < 16 else (n + 15) // 16 * 16


cdef inline Py_ssize_t _ceil_div(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return (a + b - 1) // b


cdef void _tile_epilogue(floating* y, Py_ssize_t m, Py_ssize_t n, Py_ssize_t ld,
                         const floating* bias, const floating* res, int act) noexcept nogil:
    # In conv_forward's order (bias, then residual, then the activation) and
    # with np.maximum's NaN rule, while the tile is still in cache.
    cdef Py_ssize_t i, j
    cdef floating* row
    cdef floating v
    for i in range(m):
        row = y + i * ld
        for j in range(n):
            v = row[j]
            if bias != NULL:
                v = v + bias[j]
            if res != NULL:
                v = v + res[i * ld + j]
            if act != 0:
                if v < 0:
                    v = 0
                if act == 2 and v > 6:
                    v = 6
            row[j] = v


def _forward_pointwise(floating[::1] x, floating[::1] w, floating[::1] y,
                       floating[::1] bias, bint has_bias, floating[::1] res, bint has_res,
                       int act, const Py_ssize_t[:, ::1] tiles, Py_ssize_t K, Py_ssize_t F,
                       int nt, double join):
    """y (M, F) = x (M, K) @ w (K, F) in `tiles` (_pointwise_tiles), one
    single-threaded GEMM each, with the epilogue per tile; the threads meet
    at the end with a bounded spin (include/cyback_tiles.h)."""
    cdef Py_ssize_t total = tiles.shape[0]
    cdef Py_ssize_t it = 0, r0 = 0, f0 = 0, m = 0, n = 0     # firstprivate in the block
    cdef const floating* b = &bias[0] if has_bias else NULL
    cdef const floating* r = &res[0] if has_res else NULL
    cdef cb_intr intr
    cdef cb_tiles tiles_left
    cb_intr_init(&intr)
    cb_tiles_init(&tiles_left)
    with nogil, parallel(num_threads=nt):
        it = cb_tiles_take(&tiles_left)
        while it < total:
            if not cb_intr_poll(&intr):
                r0, m, f0, n = tiles[it, 0], tiles[it, 1], tiles[it, 2], tiles[it, 3]
                gemm(False, False, <int>m, <int>n, <int>K, <floating>1, &x[r0 * K], <int>K,
                     &w[f0], <int>F, <floating>0, &y[r0 * F + f0], <int>F)
                if b != NULL or r != NULL or act != 0:
                    _tile_epilogue(&y[r0 * F + f0], m, n, F, b + f0 if b != NULL else NULL,
                                   r + r0 * F + f0 if r != NULL else NULL, act)
            it = cb_tiles_take(&tiles_left)
        cb_tiles_join(&tiles_left, cb_get_num_threads(), join)
    check_interrupt(&intr)


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_pointwise_gemm(g, bint last, bint pointwise):
    """Whether a channels_last 1x1 convolution runs as GEMM tiles
    (_forward_pointwise) rather than the direct kernel or the row blocks of
    _forward; _TUNE["pointwise_gemm"] True or False forces either.

    The direct kernel streams a block of the kernel (C x 16 values) per tile
    of pixels and wins while C x F is small; BLAS's packed GEMM wins once
    the kernel is wide (pointwise_gemm_min_cf), or the call is large
    (pointwise_gemm_min_macs). Narrow layers stay on the direct kernel: a
    tile's GEMM costs microseconds to set up.

    Where the direct kernel runs its 6-pixel AVX-512 tiles (512-bit FMAs at
    half rate, cyback_conv_direct.h) it also wins on wide kernels once a
    call has a few hundred pixels, so there the tiles keep only calls of
    fewer rows than _TUNE["pointwise_gemm_short_tiles_max_rows"] and those
    the direct kernel does not take (over 1024 channels). Except for few
    input channels and a large output, where the direct kernel does little
    work per output it writes: from _TUNE["pointwise_gemm_stream_outputs"]
    outputs (8M, 32 MB in float32) and up to
    _TUNE["pointwise_gemm_stream_max_c"] channels (64) the tiles run.
    benchmarks/bench_conv.py --pointwise measures both sides."""
    if not (pointwise and last):
        return False
    force = _TUNE["pointwise_gemm"]
    if force is not None:
        return bool(force)
    cf = g["C"] * g["F"]
    rows = g["N"] * g["P"]
    if rows >= _TUNE["pointwise_gemm_short_tiles_max_rows"] and _short_avx512_tiles() and \
            _use_direct(g, last):
        return g["C"] <= _TUNE["pointwise_gemm_stream_max_c"] and \
            rows * g["F"] >= _TUNE["pointwise_gemm_stream_outputs"]
    return cf > _TUNE["pointwise_gemm_min_cf"] or \
        rows * cf >= _TUNE["pointwise_gemm_min_macs"]


def _run_pointwise(x, kernel, y, g, bias, residual, int act, int nt):
    M, K, F = g["N"] * g["P"], g["C"], g["F"]
    tiles = _pointwise_tiles(M, K, F)
    if residual is not None and np.may_share_memory(residual, y):
        # the GEMMs write y before the epilogue reads the residual
        residual = residual.copy()
    dummy = _flat(y)[:1]
    _forward_pointwise(_flat(x), _flat(kernel), _flat(y),
                       dummy if bias is None else bias, bias is not None,
                       dummy if residual is None else _flat(residual), residual is not None,
                       act, tiles, K, F, nt, join_seconds())
    team_done(nt)


@cython.wraparound(True)
@cython.boundscheck(True)
def _run_forward(x, kernel, y, g, bint last, bint pointwise, bias=None, residual=None,
                 int act=0):
    """y = conv(x, kernel); True when the epilogue (bias, residual,
    activation) went in too."""
    nt, limit = _threads(g)
    if _use_winograd(g, last, x.dtype):
        return _run_winograd(_winograd(g), x, kernel, y, bias, residual, act, nt, None, last)
    if _use_pointwise_gemm(g, last, pointwise):
        with limit:
            _run_pointwise(x, kernel, y, g, bias, residual, act, nt)
        return True
    if _use_direct(g, last, x.dtype == np.float64):
        _run_direct(x, kernel, y, g, bias, residual, act, nt)
        return True
    B = _tap_rows(g, pointwise, last)
    if B > 0:
        stride = (B * g["F"] + 15) // 16 * 16
        bufs = np.empty(max(1, nt) * stride, dtype=x.dtype)
        xp, copy = _padded_buffer(g, last, x.dtype, bufs)
        with limit:
            _forward_taps(_flat(x), _flat(kernel), _flat(y), xp, bufs, stride, g, last, copy, B,
                          nt)
        return False
    B = _block_rows(g, x.itemsize)
    if _use_short_im2col(g, last, pointwise, B, x.itemsize):
        cols = np.empty(g["N"] * g["P"] * g["K"], dtype=x.dtype)
        _im2col_rows(_flat(x), cols, g, nt)
        with limit:
            _run_pointwise(cols, kernel, y, {"N": 1, "P": g["N"] * g["P"], "C": g["K"],
                                             "F": g["F"]}, bias, residual, act, nt)
        return True
    bufs, stride = _work_bufs(g, 1 if pointwise else B, x.dtype, nt)
    with limit:
        _forward(_flat(x), _flat(kernel), _flat(y), bufs, stride, g, last, pointwise, B, nt)
    return False


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_short_im2col(g, bint last, bint pointwise, Py_ssize_t B, Py_ssize_t itemsize):
    """Whether a channels_last im2col forward with few output positions
    builds its whole patch matrix first and then multiplies it in the 1x1
    convolution's GEMM tiles (_run_pointwise), rather than in row blocks of
    B patches, one GEMM each on one thread.

    A batch-1 3x3 512 -> 512 on (1, 7, 7) (a ResNet-50 stage-4 layer, too
    few tiles for Winograd) has 49 patches, one block: the whole product
    would run on one thread, while the tiles split its columns over the
    team. Only single-block calls take them (the choice depends on the
    shape alone, so results do not depend on the thread count): where there
    are blocks for the team, the tiles' uneven rows (64, 64, 64 and 4
    patches on (1, 14, 14) 3x3 256 -> 256) are slower. The patch matrix is
    kept to _TUNE["short_im2col_bytes"]."""
    if not last or pointwise or not _TUNE["short_im2col"]:
        return False
    rows = g["N"] * g["P"]
    return rows <= B and rows * g["K"] * itemsize <= _TUNE["short_im2col_bytes"]


def _im2col_rows(floating[::1] x, floating[::1] cols, Geom g, int nt):
    """cols (N * P, K) = every output position's patch (channels_last)."""
    cdef Py_ssize_t rows = g.N * g.P, it, r0
    cdef Py_ssize_t nblk = (rows + IM2COL_ROWS - 1) // IM2COL_ROWS
    with nogil:
        for it in prange(nblk, num_threads=nt, schedule='static'):
            r0 = it * IM2COL_ROWS
            _im2col_last(&x[0], &cols[r0 * g.K], &g, r0, min(IM2COL_ROWS, rows - r0))


# ------------------------------------------------------------ phases of a strided input gradient

cdef struct Phases:
    Py_ssize_t nph, most, wp_size
    Py_ssize_t KH, KW, C, F    # the whole kernel's (*k, C, F) (dx, dy channels)
    cb_cd_geom* geoms
    cb_cd_out* outs
    Py_ssize_t* items
    Py_ssize_t* wp_off
    Py_ssize_t* taps           # per phase: its kernel taps along D, then H, then W, reversed
    Py_ssize_t* taps_off


cdef class _PhasePlan:
    """A strided input gradient (a transposed convolution's forward pass) cut
    into phases, one per residue of the dx position modulo the strides.

    A dx position i (per axis) takes dy[o] * w[k] for every o * s + k * d - p
    = i, so the positions of one residue r = i mod s see only the taps k with
    k * d = r + p (mod s), and each of them the same shift of dy: a phase is
    a stride-1 convolution of dy with a sub-kernel of those taps (reversed,
    channels swapped). The direct kernel runs every phase in one parallel
    region and writes its outputs straight into their interleaved places in
    dx (cb_cd_out), so there is no patch matrix, no scatter-add and no pass
    to interleave. Positions whose residue gets no tap (a kernel shorter
    than the stride) are zero.
    """
    cdef Phases p
    cdef bint zero          # some residues get no tap

    def __cinit__(self, Py_ssize_t nph, Py_ssize_t ntaps):
        self.p.nph = nph
        self.p.geoms = <cb_cd_geom*> malloc(max(1, nph) * sizeof(cb_cd_geom))
        self.p.outs = <cb_cd_out*> malloc(max(1, nph) * sizeof(cb_cd_out))
        self.p.items = <Py_ssize_t*> malloc(max(1, nph) * sizeof(Py_ssize_t))
        self.p.wp_off = <Py_ssize_t*> malloc(max(1, nph) * sizeof(Py_ssize_t))
        self.p.taps = <Py_ssize_t*> malloc(max(1, ntaps) * sizeof(Py_ssize_t))
        self.p.taps_off = <Py_ssize_t*> malloc(max(1, nph) * sizeof(Py_ssize_t))
        if not (self.p.geoms and self.p.outs and self.p.items and self.p.wp_off
                and self.p.taps and self.p.taps_off):
            raise MemoryError("conv_backward_input: no memory for a phase plan")

    def __dealloc__(self):
        free(self.p.geoms)
        free(self.p.outs)
        free(self.p.items)
        free(self.p.wp_off)
        free(self.p.taps)
        free(self.p.taps_off)


@cython.wraparound(True)
@cython.boundscheck(True)
def _axis_phases(Py_ssize_t X, Py_ssize_t K, Py_ssize_t s, Py_ssize_t d, Py_ssize_t p):
    """The phases of one axis of dx (X long; kernel K taps, stride s, dilation
    d, padding p before): (r, positions, taps reversed, sub-kernel dilation,
    sub-convolution padding before) per residue r that has positions.

    Output j of residue r (dx position r + s * j) reads dy[j + c - e * t] * w
    [k0 + step * t] for the taps k0 + step * t (step = s / gcd(s, d), e = d /
    gcd(s, d), c = (r + p - k0 * d) / s): a stride-1 correlation of dy with
    dilation e and the taps reversed, padded by e * (T - 1) - c before."""
    phases = []
    for r in range(min(s, X)):
        J = (X - r + s - 1) // s
        taps = [k for k in range(K) if (k * d - r - p) % s == 0]
        if not taps:
            phases.append((r, J, (), 1, 0))
            continue
        T = len(taps)
        e = (taps[1] - taps[0]) * d // s if T > 1 else 1
        c = (r + p - taps[0] * d) // s
        phases.append((r, J, tuple(reversed(taps)), e, e * (T - 1) - c))
    return phases


@cython.wraparound(True)
@cython.boundscheck(True)
def _phase_plan(g, Py_ssize_t FB):
    """The _PhasePlan of an input gradient of geometry g (run channels_last) with
    direct-kernel blocks of FB channels, or None where the direct kernel
    cannot run a phase: without the vector kernels (the scalar one needs a
    W-padded copy) or with more tap rows than it holds. A phase whose
    padding before is negative (its first output reads past the start of
    dy, as 'same' padding of a strided convolution can give) reads its rows
    from that column on (cb_cd_out's xw0)."""
    if not cb_cd_pads_itself():
        return None
    axes = [_axis_phases(g[X], g[K], g[s], g[d], g[p]) for X, K, s, d, p in
            (("D", "KD", "sd", "dd", "pd"), ("H", "KH", "sh", "dh", "ph"),
             ("W", "KW", "sw", "dw", "pw"))]
    live = [(a, b, c) for a in axes[0] for b in axes[1] for c in axes[2]
            if a[2] and b[2] and c[2]]
    zero = len(live) < len(axes[0]) * len(axes[1]) * len(axes[2])
    if g["F"] > CB_CD_MAX_C or any(len(a[2]) * len(b[2]) > CB_CD_MAX_ROWS for a, b, c in live):
        return None
    cdef _PhasePlan plan = _PhasePlan(len(live), sum(len(a[2]) + len(b[2]) + len(c[2])
                                                     for a, b, c in live))
    cdef Py_ssize_t i, j, off = 0, toff = 0, nfb = (g["C"] + FB - 1) // FB
    plan.zero = zero
    plan.p.most = 0
    plan.p.KH, plan.p.KW, plan.p.C, plan.p.F = g["KH"], g["KW"], g["C"], g["F"]
    for i, (a, b, c) in enumerate(live):
        x0 = max(0, -c[4])
        W = max(0, g["OW"] - x0)
        plan.p.geoms[i] = dict(N=g["N"], C=g["F"], F=g["C"], D=g["OD"], H=g["OH"], W=W,
                             Wp=W, pw=max(0, c[4]), OD=a[1], OH=b[1], OW=c[1], KD=len(a[2]),
                             KH=len(b[2]), KW=len(c[2]), sd=1, sh=1, sw=1, dd=a[3], dh=b[3],
                             dw=c[3], pd=a[4], ph=b[4], FB=FB, nfb=nfb)
        plan.p.outs[i] = dict(D=g["D"], H=g["H"], W=g["W"], d0=a[0], h0=b[0], w0=c[0],
                            sd=g["sd"], sh=g["sh"], sw=g["sw"], xw0=g["OW"] - W)
        cb_cd_prepare(&plan.p.geoms[i], g["OW"] - W)
        plan.p.items[i] = g["N"] * a[1] * b[1] * nfb
        plan.p.most = max(plan.p.most, plan.p.items[i])
        plan.p.wp_off[i] = off
        off += nfb * FB * len(a[2]) * len(b[2]) * len(c[2]) * g["F"]
        plan.p.taps_off[i] = toff
        for j in a[2] + b[2] + c[2]:
            plan.p.taps[toff] = j
            toff += 1
    plan.p.wp_size = max(1, off)
    return plan


_PHASE_PLANS = {}


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_phases(g, bint last, bint dbl):
    """The _PhasePlan a strided input gradient runs, or None for col2im.

    _TUNE["phase_split"] True or False forces the choice where both can run;
    by default the phases run where they beat col2im (benchmarks/
    bench_conv.py --phases):

    - at least half a block of dx channels (with fewer, most of the direct
      kernel's lanes are idle);
    - as few dy channels and as short patches as the direct kernel takes in
      a forward pass, or up to phase_max_c dy channels on dy rows at least
      phase_min_w wide (on narrower rows the 6-pixel tiles waste too much).
      channels_first runs the phases between two transposing copies, which
      eat the margin of the wider layers, so it keeps the first bound.

    A kernel no longer than the stride (one tap per phase) makes col2im one
    plain GEMM with no overlapping adds; the phases still hold their own
    there, so the rule does not single it out."""
    mode = _TUNE["phase_split"]
    if mode is False or g["sd"] * g["sh"] * g["sw"] == 1:
        return None
    if mode is None and not (2 * g["C"] > cb_cd_block(dbl) and (
            g["F"] <= _TUNE["direct_max_c"] and g["K"] // g["C"] * g["F"] <= _TUNE["direct_max_k"]
            or last and g["F"] <= _TUNE["phase_max_c"] and g["OW"] >= _TUNE["phase_min_w"])):
        return None
    # keyed by the geometry's values, not by g's identity: _GEOMETRIES may be
    # cleared and g rebuilt
    FB = cb_cd_block_for(dbl, g["C"])     # the phases' outputs are dx's C channels
    return remembered(_PHASE_PLANS, (tuple(g.values()), FB), _phase_plan, g, FB)


cdef void _pack_phase(const floating* k, floating* wp, const Phases* plan,
                      Py_ssize_t ph) noexcept nogil:
    """Phase ph's sub-kernel, packed for the direct kernel (as cb_cd_pack_block):
    wp[b][t][c][j] = k[tap t][b * FB + j][c], the taps reversed and the
    channels swapped (dy's are the phase's inputs), 0 past the dx channels."""
    cdef const cb_cd_geom* pg = &plan.geoms[ph]
    cdef const Py_ssize_t* td = &plan.taps[plan.taps_off[ph]]
    cdef const Py_ssize_t* th = td + pg.KD
    cdef const Py_ssize_t* tw = th + pg.KH
    cdef Py_ssize_t FB = pg.FB, C = plan.C, F = plan.F, T = pg.KD * pg.KH * pg.KW
    cdef Py_ssize_t b, a, h, w, c, j, f
    cdef const floating* src
    cdef floating* dst
    wp += plan.wp_off[ph]
    for b in range(pg.nfb):
        for a in range(pg.KD):
            for h in range(pg.KH):
                for w in range(pg.KW):
                    src = k + ((td[a] * plan.KH + th[h]) * plan.KW + tw[w]) * C * F
                    dst = wp + (b * T + (a * pg.KH + h) * pg.KW + w) * F * FB
                    for c in range(F):
                        for j in range(FB):
                            f = b * FB + j
                            dst[c * FB + j] = src[f * F + c] if f < C else 0


cdef void _run_phases(const floating* dy, const floating* k, floating* wp, floating* dx,
                      const Phases* plan, int nt, cb_intr* intr) noexcept nogil:
    """Every phase's sub-kernel packed, then all their rows in one parallel
    region, the phases interleaved so that each thread's share holds all of
    them (their costs differ)."""
    cdef Py_ssize_t it, ph, i, nph = plan.nph
    cdef const cb_cd_geom* geoms = plan.geoms
    cdef const cb_cd_out* outs = plan.outs
    cdef const Py_ssize_t* items = plan.items
    cdef const Py_ssize_t* off = plan.wp_off
    for ph in range(nph):
        _pack_phase(k, wp, plan, ph)
    with parallel(num_threads=nt):
        for it in prange(nph * plan.most, schedule='static'):
            if cb_intr_poll(intr):
                continue
            ph = it % nph
            i = it // nph
            if i >= items[ph]:
                continue
            if floating is float:
                cb_cd_item_out_f(dy, wp + off[ph], NULL, NULL, 0, dx, &geoms[ph], i, &outs[ph])
            else:
                cb_cd_item_out_d(dy, wp + off[ph], NULL, NULL, 0, dx, &geoms[ph], i, &outs[ph])


def _backward_input_phases(_PhasePlan plan, cnp.ndarray dy, cnp.ndarray kernel, x_shape,
                           int nt):
    """dx for C-contiguous dy and kernel of the compute dtype, float32 or
    float64 (see _PhasePlan)."""
    cdef cnp.ndarray dx = (np.zeros if plan.zero else np.empty)(x_shape, dtype=dy.dtype)
    cdef cb_intr intr
    cdef bint dbl = cnp.PyArray_TYPE(dy) == cnp.NPY_DOUBLE
    cdef void* wp
    if plan.p.nph == 0:
        return dx
    wp = malloc(plan.p.wp_size * (8 if dbl else 4))
    if wp == NULL:
        raise MemoryError("conv_backward_input: no memory for the packed kernel")
    cb_intr_init(&intr)
    with nogil:
        if dbl:
            _run_phases[double](<const double*> cnp.PyArray_DATA(dy),
                                <const double*> cnp.PyArray_DATA(kernel), <double*> wp,
                                <double*> cnp.PyArray_DATA(dx), &plan.p, nt, &intr)
        else:
            _run_phases[float](<const float*> cnp.PyArray_DATA(dy),
                               <const float*> cnp.PyArray_DATA(kernel), <float*> wp,
                               <float*> cnp.PyArray_DATA(dx), &plan.p, nt, &intr)
    free(wp)
    check_interrupt(&intr)
    return dx


@cython.wraparound(True)
@cython.boundscheck(True)
def conv_backward_input(dy, kernel, x_shape, strides, dilation, pads, channels_last=True):
    """Gradient of conv_forward with respect to x, shape ``x_shape``.

    Also the transposed convolution: with a Keras conv_transpose kernel
    (*k, out_channels, in_channels) and x_shape = the wanted output shape, this
    is ``conv2d_transpose``/``conv3d_transpose`` (dy is then that op's input).
    dy must have exactly the shape conv_forward would give for x_shape.
    """
    fname = "conv_backward_input"
    dy = np.asarray(dy)
    kernel = np.asarray(kernel)
    dt = _dtype(fname, dy, kernel)
    try:
        x_shape = tuple(int(s) for s in x_shape)
    except TypeError:
        raise TypeError("%s: x_shape must be a sequence of ints, got %r" % (fname, x_shape))
    g, osp, pointwise = _geometry(x_shape, kernel.shape, strides, dilation, pads,
                                  channels_last, fname)
    yshape = _y_shape(g, osp, channels_last)
    if dy.shape != yshape:
        raise ValueError("%s: dy has shape %s but a convolution of input %s with kernel %s, "
                         "strides %s, dilation %s, pads %s gives %s"
                         % (fname, dy.shape, x_shape, kernel.shape, tuple(strides),
                            tuple(dilation), tuple(pads), yshape))
    cdt = np.float32 if dt == np.float16 else dt
    if dy.size == 0 or g["K"] == 0 or int(np.prod(x_shape)) == 0:
        return np.zeros(x_shape, dtype=dt)
    rank = len(x_shape) - 2
    spans = [(k - 1) * d for k, d in zip(kernel.shape[:rank], dilation)]
    if (all(int(s) == 1 for s in strides)
            and all(a <= e and b <= e for (a, b), e in zip(pads, spans))):
        # With stride 1 the input gradient is itself a convolution: of dy with
        # the spatially flipped kernel, channels swapped, padded by what the
        # forward pass cut off. That runs at forward speed and needs no
        # scatter-add.
        flipped = np.flip(kernel, axis=tuple(range(rank))).swapaxes(-1, -2)
        fpads = [(e - int(a), e - int(b)) for (a, b), e in zip(pads, spans)]
        dx = conv_forward(dy.astype(cdt, copy=False), np.ascontiguousarray(flipped, dtype=cdt),
                          (1,) * rank, dilation,
                          fpads, channels_last=channels_last)
        return dx.astype(dt, copy=False)
    dy = np.ascontiguousarray(dy, dtype=cdt)
    kernel = np.ascontiguousarray(kernel, dtype=cdt)
    cdef bint last = channels_last
    nt, limit = _threads(g)
    plan = _use_phases(g, last, cdt == np.float64)
    if plan is not None:
        if last:
            return _backward_input_phases(plan, dy, kernel, x_shape, nt).astype(dt, copy=False)
        # channels_first through channels_last copies (see _use_phases)
        dx = _backward_input_phases(plan, np.ascontiguousarray(np.moveaxis(dy, 1, -1)), kernel,
                                    (x_shape[0],) + x_shape[2:] + (x_shape[1],), nt)
        return np.ascontiguousarray(np.moveaxis(dx, -1, 1), dtype=dt)
    dy = _writable(dy)
    kernel = _writable(kernel)
    dx = np.zeros(x_shape, dtype=cdt)
    # Slab axis: the outermost output axis longer than 1 (the ones before it
    # are 1, so a slab is a contiguous range of output positions).
    outs = (g["OD"], g["OH"], g["OW"])
    ks = (g["KD"], g["KH"], g["KW"])
    ss = (g["sd"], g["sh"], g["sw"])
    ds = (g["dd"], g["dh"], g["dw"])
    a = 0
    while a < 2 and outs[a] == 1:
        a += 1
    inner = 1
    for i in range(a + 1, 3):
        inner *= outs[i]
    B = _block_rows(g, dy.itemsize)
    t_min = ((ks[a] - 1) * ds[a] + 1 + ss[a] - 1) // ss[a]
    T = max(t_min, (B + inner - 1) // inner)
    bufs, stride = _work_bufs(g, B, cdt, nt)
    with limit:
        _backward_input(_flat(dy), _flat(kernel), _flat(dx), bufs, stride, g, last, B, T, outs[a],
                        inner, nt)
    return dx.astype(dt, copy=False)


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_direct_dw(g, bint last, bint dbl):
    """Whether a kernel gradient runs the direct kernel (cyback_conv_dw.h):
    channels_last, output channels in whole vector pairs, few input channels
    and a gradient (each group's partial sums, read and written by every
    tile) that stays in L2. Those are the products (taps * C x F outputs over
    every pixel) that BLAS runs slowly. Past those bounds (direct_dw_max_c,
    direct_dw_max_bytes) the tap GEMMs are faster, even with the output
    channels split into ranges whose gradient fits L2."""
    return last and _TUNE["direct_dw"] and cb_cd_pads_itself() and \
        g["F"] % cb_cd_block(dbl) == 0 and g["C"] <= _TUNE["direct_dw_max_c"] and \
        g["K"] * g["F"] * (8 if dbl else 4) <= _TUNE["direct_dw_max_bytes"]


def _backward_kernel_direct(floating[::1] x, floating[::1] dy, floating[::1] parts,
                            floating[::1] dw, cb_cd_geom g, Py_ssize_t nitems,
                            Py_ssize_t ngroups, int nt):
    """Each group of work items (blocks of output rows) sums into its own
    partial gradient; the partials are then added in group order, so the
    result does not depend on the thread count."""
    cdef Py_ssize_t KF = g.KD * g.KH * g.KW * g.C * g.F
    cdef Py_ssize_t per = (nitems + ngroups - 1) // ngroups, gi, it, i
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        for gi in prange(ngroups, schedule='static', num_threads=nt):
            memset(&parts[gi * KF], 0, KF * sizeof(floating))
            for it in range(gi * per, min(gi * per + per, nitems)):
                if cb_intr_poll(&intr):
                    break
                if floating is float:
                    cb_cdw_item_f(&x[0], &dy[0], &parts[gi * KF], &g, it)
                else:
                    cb_cdw_item_d(&x[0], &dy[0], &parts[gi * KF], &g, it)
        _sum_parts(&parts[0], &dw[0], KF, ngroups)
    check_interrupt(&intr)


@cython.wraparound(True)
@cython.boundscheck(True)
def conv_backward_kernel(x, dy, kernel_shape, strides, dilation, pads, channels_last=True):
    """Gradient of conv_forward with respect to the kernel, shape ``kernel_shape``.

    For a transposed convolution's kernel gradient, pass its output gradient as
    x and its input as dy.
    """
    fname = "conv_backward_kernel"
    x = np.asarray(x)
    dy = np.asarray(dy)
    dt = _dtype(fname, x, dy)
    try:
        kernel_shape = tuple(int(s) for s in kernel_shape)
    except TypeError:
        raise TypeError("%s: kernel_shape must be a sequence of ints, got %r"
                        % (fname, kernel_shape))
    g, osp, pointwise = _geometry(x.shape, kernel_shape, strides, dilation, pads,
                                  channels_last, fname)
    yshape = _y_shape(g, osp, channels_last)
    if dy.shape != yshape:
        raise ValueError("%s: dy has shape %s but a convolution of input %s with kernel %s, "
                         "strides %s, dilation %s, pads %s gives %s"
                         % (fname, dy.shape, x.shape, kernel_shape, tuple(strides),
                            tuple(dilation), tuple(pads), yshape))
    cdt = np.float32 if dt == np.float16 else dt
    if dy.size == 0 or g["K"] == 0 or int(np.prod(kernel_shape)) == 0:
        return np.zeros(kernel_shape, dtype=dt)
    x = _writable(np.ascontiguousarray(x, dtype=cdt))
    dy = _writable(np.ascontiguousarray(dy, dtype=cdt))
    dw = np.empty(kernel_shape, dtype=cdt)
    cdef bint last = channels_last
    # A pointwise kernel gradient is one GEMM with a very long inner dimension,
    # which OpenBLAS does not split across threads; it goes through the
    # grouped path below with the input rows standing in for the patches.
    cdef bint direct = pointwise
    cdef cb_cd_geom dg
    nt, limit = _threads(g)
    if _use_direct_dw(g, last, cdt == np.float64):
        nitems = g["N"] * g["OD"] * ((g["OH"] + CB_CDW_ROWS - 1) // CB_CDW_ROWS)
        kf = g["K"] * g["F"]
        ngroups = _groups(nitems, kf, x.itemsize)
        dg = dict(N=g["N"], C=g["C"], F=g["F"], D=g["D"], H=g["H"], W=g["W"], Wp=g["W"],
                  pw=g["pw"], OD=g["OD"], OH=g["OH"], OW=g["OW"], KD=g["KD"], KH=g["KH"],
                  KW=g["KW"], sd=g["sd"], sh=g["sh"], sw=g["sw"], dd=g["dd"], dh=g["dh"],
                  dw=g["dw"], pd=g["pd"], ph=g["ph"], FB=g["F"], nfb=1)
        cb_cd_prepare(&dg, 0)
        with limit:
            _backward_kernel_direct(_flat(x), _flat(dy), np.empty(ngroups * kf, dtype=cdt),
                                    _flat(dw), dg, nitems, ngroups, nt)
        return dw.astype(dt, copy=False)
    B = _tap_rows(g, pointwise, last)
    if B > 0:
        # Stride 1: one GEMM per kernel tap straight from the padded input,
        # as in the forward pass.
        q = ((g["OD"] - 1) * (g["OH"] + (g["KH"] - 1) * g["dh"]) + g["OH"] - 1) \
            * (g["OW"] + (g["KW"] - 1) * g["dw"]) + g["OW"]
        nitems = g["N"] * ((q + B - 1) // B)
        kf = g["K"] * g["F"]
        ngroups = _groups(nitems, kf, x.itemsize)
        parts = np.empty(ngroups * kf, dtype=cdt)
        stride = (B * g["F"] + 15) // 16 * 16
        bufs = np.empty(max(1, nt) * stride, dtype=cdt)
        xp, copy = _padded_buffer(g, last, cdt, bufs)
        with limit:
            _backward_kernel_taps(_flat(x), _flat(dy), parts, _flat(dw), xp, bufs, stride, g,
                                  last, copy, B, ngroups, nt)
        return dw.astype(dt, copy=False)
    B = _block_rows(g, x.itemsize)
    if last:
        nitems = (g["N"] * g["P"] + B - 1) // B
    else:
        nitems = g["N"] * ((g["P"] + B - 1) // B)
    kf = g["K"] * g["F"]
    ngroups = _groups(nitems, kf, x.itemsize)
    parts = np.empty(ngroups * kf, dtype=cdt)
    bufs, stride = _work_bufs(g, B, cdt, nt)
    with limit:
        _backward_kernel(_flat(x), _flat(dy), parts, _flat(dw), bufs, stride, g, last, direct, B,
                         ngroups, nt)
    return dw.astype(dt, copy=False)
