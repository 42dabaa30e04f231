# im2col / col2im + GEMM (included by conv.pyx): the general path, taken by
# whatever no special case takes.
#
# Work is cut into blocks of output positions, each im2col'ed into a
# per-thread buffer small enough to stay in L2 and multiplied with a
# single-threaded GEMM, with OpenMP over the blocks (_forward). A
# channels_last call with few output positions builds its whole patch
# matrix and multiplies it in the 1x1 GEMM tiles (_use_short_im2col). A
# strided input gradient that the phases (conv_phases.pxi) do not take is
# GEMM + col2im over slabs of output rows (_backward_input); a kernel
# gradient that neither the direct kernel nor the stride-1 taps take sums
# patches^T @ dy per group of blocks (_backward_kernel). The groups'
# partial gradients and their fixed-order sum (_groups, _sum_parts) serve
# the taps and the direct kernel gradient too.


# Partial kernel gradients summed at the end; a constant (not the thread count)
# so that the summation order never changes.
cdef enum:
    MAX_GROUPS = 8
    GROUP_BYTES = 64 << 20


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


cdef inline Py_ssize_t _row_run(const Geom* g, Py_ssize_t p, Py_ssize_t end, Py_ssize_t* od,
                                Py_ssize_t* oh, Py_ssize_t* ow) noexcept nogil:
    # Output position p of a sample as (od, oh, ow), and how many positions
    # from p on lie in its output row before `end` (the rest of the row,
    # within a block).
    cdef Py_ssize_t seg
    _position(g, p, od, oh, ow)
    seg = g.OW - ow[0]
    return seg if seg < end - p else end - p


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
            i_d = od * g.sd - g.pd + kd * g.dil_d
            if i_d < 0 or i_d >= g.D:
                memset(dst, 0, g.KH * rsz)
                dst += g.KH * rowlen
                continue
            for kh in range(g.KH):
                ih = oh * g.sh - g.ph + kh * g.dil_h
                if ih < 0 or ih >= g.H:
                    memset(dst, 0, rsz)
                else:
                    src = x + ((n * g.D + i_d) * g.H + ih) * g.W * C
                    if g.dil_w == 1 and iw0 >= 0 and iw0 + g.KW <= g.W:
                        # The whole kernel row is one contiguous run of KW*C values.
                        memcpy(dst, src + iw0 * C, rsz)
                    else:
                        for kw in range(g.KW):
                            iw = iw0 + kw * g.dil_w
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
            i_d = od * g.sd - g.pd + kd * g.dil_d
            if i_d < 0 or i_d >= g.D:
                src += g.KH * rowlen
                continue
            for kh in range(g.KH):
                ih = oh * g.sh - g.ph + kh * g.dil_h
                if ih >= 0 and ih < g.H:
                    dst = dx + ((n * g.D + i_d) * g.H + ih) * g.W * C
                    if g.dil_w == 1 and iw0 >= 0 and iw0 + g.KW <= g.W:
                        dst += iw0 * C
                        for j in range(rowlen):
                            dst[j] += src[j]
                    else:
                        for kw in range(g.KW):
                            iw = iw0 + kw * g.dil_w
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
        seg = _row_run(g, p, p0 + npos, &od, &oh, &ow0)
        ow1 = ow0 + seg
        k = 0
        for kd in range(g.KD):
            i_d = od * g.sd - g.pd + kd * g.dil_d
            for kh in range(g.KH):
                ih = oh * g.sh - g.ph + kh * g.dil_h
                row_ok = i_d >= 0 and i_d < g.D and ih >= 0 and ih < g.H
                for kw in range(g.KW):
                    b = kw * g.dil_w - g.pw
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
        seg = _row_run(g, p, p0 + npos, &od, &oh, &ow0)
        ow1 = ow0 + seg
        k = 0
        for kd in range(g.KD):
            i_d = od * g.sd - g.pd + kd * g.dil_d
            for kh in range(g.KH):
                ih = oh * g.sh - g.ph + kh * g.dil_h
                if i_d < 0 or i_d >= g.D or ih < 0 or ih >= g.H:
                    k += g.KW * g.C
                    continue
                for kw in range(g.KW):
                    b = kw * g.dil_w - g.pw
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


cdef void _sum_parts(const floating* parts, floating* dk, Py_ssize_t KF,
                     Py_ssize_t ngroups) noexcept nogil:
    """dk = the sum of the groups' partial kernel gradients (KF values each),
    added in group order whatever the thread count."""
    cdef Py_ssize_t i, gi
    cdef floating s
    for i in prange(KF, schedule='static', num_threads=threads_for(<double>(ngroups + 1) * KF)):
        s = parts[i]
        for gi in range(1, ngroups):
            s = s + parts[gi * KF + i]
        dk[i] = s


def _groups(Py_ssize_t nitems, Py_ssize_t kf, Py_ssize_t itemsize):
    """Groups of a kernel gradient's work items (consecutive runs of
    ceil(nitems / groups)): each sums into a partial gradient of its own, so
    at most MAX_GROUPS and GROUP_BYTES of partials; none is left empty (it
    would leave its partial unset)."""
    ngroups = max(1, min(MAX_GROUPS, nitems, GROUP_BYTES // (kf * itemsize)))
    per = (nitems + ngroups - 1) // ngroups
    return (nitems + per - 1) // per


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
                      floating[::1] dk, floating[::1] bufs, Py_ssize_t bufstride,
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
        _sum_parts(&parts[0], &dk[0], KF, ngroups)
    check_interrupt(&intr)


cdef enum:
    IM2COL_ROWS = 8    # patches per task of _im2col_rows


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


def _run_forward_im2col(x, kernel, y, g, bint last, bint pointwise, Py_ssize_t B, int nt):
    """y = conv(x, kernel) in blocks of B output positions, each im2col'ed
    (a pointwise geometry's input rows are its patches) and multiplied."""
    bufs, stride = _work_bufs(g, 1 if pointwise else B, x.dtype, nt)
    _forward(_flat(x), _flat(kernel), _flat(y), bufs, stride, g, last, pointwise, B, nt)


def _run_short_im2col(x, kernel, y, g, bias, residual, int act, int nt):
    """y = conv(x, kernel) (with the epilogue) as the whole patch matrix
    times the kernel in the 1x1 GEMM tiles (see _use_short_im2col)."""
    cols = np.empty(g["N"] * g["P"] * g["K"], dtype=x.dtype)
    _im2col_rows(_flat(x), cols, g, nt)
    _run_pointwise(cols, kernel, y, {"N": 1, "P": g["N"] * g["P"], "C": g["K"], "F": g["F"]},
                   bias, residual, act, nt)


@cython.wraparound(True)
@cython.boundscheck(True)
def _run_backward_input_col2im(dy, kernel, x_shape, g, bint last, int nt):
    """dx of shape x_shape by GEMM + col2im over slabs of output rows
    (_backward_input); dy and kernel C-contiguous of the compute dtype."""
    dy = _writable(dy)
    kernel = _writable(kernel)
    dx = np.zeros(x_shape, dtype=dy.dtype)
    # Slab axis: the outermost output axis longer than 1 (the ones before it
    # are 1, so a slab is a contiguous range of output positions).
    outs = (g["OD"], g["OH"], g["OW"])
    ks = (g["KD"], g["KH"], g["KW"])
    ss = (g["sd"], g["sh"], g["sw"])
    ds = (g["dil_d"], g["dil_h"], g["dil_w"])
    a = 0
    while a < 2 and outs[a] == 1:
        a += 1
    inner = 1
    for i in range(a + 1, 3):
        inner *= outs[i]
    B = _block_rows(g, dy.itemsize)
    t_min = ((ks[a] - 1) * ds[a] + 1 + ss[a] - 1) // ss[a]
    T = max(t_min, (B + inner - 1) // inner)
    bufs, stride = _work_bufs(g, B, dy.dtype, nt)
    _backward_input(_flat(dy), _flat(kernel), _flat(dx), bufs, stride, g, last, B, T, outs[a],
                    inner, nt)
    return dx


def _run_backward_kernel_im2col(x, dy, dk, g, bint last, bint pointwise, int nt):
    """dk = the kernel gradient as patches^T @ dy over blocks of output
    positions, summed per group (_backward_kernel). A pointwise kernel
    gradient would be one GEMM with a very long inner dimension, which
    OpenBLAS does not split across threads: it runs here too, the input
    rows standing in for the patches."""
    B = _block_rows(g, x.itemsize)
    if last:
        nitems = (g["N"] * g["P"] + B - 1) // B
    else:
        nitems = g["N"] * ((g["P"] + B - 1) // B)
    kf = g["K"] * g["F"]
    ngroups = _groups(nitems, kf, x.itemsize)
    parts = np.empty(ngroups * kf, dtype=x.dtype)
    bufs, stride = _work_bufs(g, B, x.dtype, nt)
    _backward_kernel(_flat(x), _flat(dy), parts, _flat(dk), bufs, stride, g, last, pointwise, B,
                     ngroups, nt)
