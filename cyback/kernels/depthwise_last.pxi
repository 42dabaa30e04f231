# channels_last passes (included by depthwise.pyx): the forward pass, the
# input gradient (at stride 1 a forward pass over dy with the flipped kernel,
# else a gather per input pixel) and the kernel gradient (fixed partial sums,
# added up in order), over the rows of depthwise_rows.pxi.


# Fixed number of partial sums for the channels_last kernel gradient: fixed,
# not per thread, so the reduction order (and the result) does not depend on
# how many threads run.
cdef Py_ssize_t KGRAD_CHUNKS = 32

# Channels per register block in the channels_last M == 1 loops.
DEF CB = 16


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


cdef void _fwd_cl(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] k,
                  floating[:, :, :, ::1] y, _Geom g, const floating[::1] bias, int act,
                  cb_intr* intr) noexcept nogil:
    # One task per output row; its input rows (KH * W * C) stay in L1/L2,
    # read as _row_plan says. bias (C*M values, or none) and the activation
    # code act are applied to each finished output row while it is in
    # registers (cyback_depthwise_last.h).
    cdef Py_ssize_t N = x.shape[0], W = x.shape[2], C = x.shape[3]
    cdef Py_ssize_t KH = k.shape[0], KW = k.shape[1], M = k.shape[3]
    cdef Py_ssize_t OH = y.shape[1], OW = y.shape[2]
    cdef _Rows rp = _row_plan(W, C * M, M, OW, KH, KW, g.sw, g.dil_w, g.pw, sizeof(floating))
    cdef Py_ssize_t r, n, oh, pfb = 0
    cdef bint prefetch = _prefetch_big(x, y)
    cdef const floating** xr = NULL
    cdef const void* pf = NULL
    cdef _Ring ring = _Ring(NULL, NULL, NULL)
    cdef int nt = threads_for(2.0 * N * OH * OW * C * M * KH * KW)
    with parallel(num_threads=nt):
        # Assigned here, so that each thread has its own.
        ring = _ring_new(KH, rp, sizeof(floating))
        for r in prange(N * OH, schedule='static'):
            # Rows take well under a microsecond: poll every 8th.
            if intr.stop or (r % 8 == 0 and cb_intr_poll(intr)):
                continue
            n = r // OH
            oh = r % OH
            xr = _rows_of(ring, x, rp, n, oh * g.sh - g.ph, g.dil_h, KH, M)
            pfb = 0     # assigned here: each thread's own
            pf = _next_rows(x, r + 1, OH, g, KH, &pfb) if prefetch else NULL
            _cl_row(xr, &k[0, 0, 0, 0], &y[n, oh, 0, 0], C * M, rp.xs, rp.Ws, KH, KW, OW, g.sw,
                    g.dil_w, g.pw - rp.pl, &bias[0] if bias.shape[0] > 0 else NULL, act, pf, pfb)
        _ring_free(ring)
    team_done(nt)


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
    cdef _Rows rp = _row_plan(OW, C * M, 1, W, KH, KW, 1, g.dil_w, g.pw, sizeof(floating))
    cdef Py_ssize_t r, n, ih, pfb = 0
    cdef bint prefetch = _prefetch_big(dy, dx)
    cdef const void* pf = NULL
    cdef const floating** xr = NULL
    cdef _Ring ring = _Ring(NULL, NULL, NULL)
    cdef floating* t = NULL
    cdef floating* dxp
    cdef int nt = threads_for(2.0 * N * H * W * C * M * KH * KW)
    with parallel(num_threads=nt):
        # Assigned here, so that each thread has its own.
        ring = _ring_new(KH, rp, sizeof(floating))
        t = NULL
        if M > 1:
            t = <floating*>malloc(W * C * M * sizeof(floating))
        for r in prange(N * H, schedule='static'):
            if intr.stop or (r % 8 == 0 and cb_intr_poll(intr)):
                continue
            n = r // H
            ih = r % H
            xr = _rows_of(ring, dy, rp, n, ih - g.ph, g.dil_h, KH, 1)
            pfb = 0     # assigned here: each thread's own
            pf = _next_rows(dy, r + 1, H, g, KH, &pfb) if prefetch else NULL
            dxp = &dx[n, ih, 0, 0]
            if M == 1:
                _cl_row(xr, &kf[0, 0, 0, 0], dxp, C, rp.xs, rp.Ws, KH, KW, W, 1, g.dil_w,
                        g.pw - rp.pl, NULL, 0, pf, pfb)
            else:
                _cl_row(xr, &kf[0, 0, 0, 0], t, C * M, rp.xs, rp.Ws, KH, KW, W, 1, g.dil_w,
                        g.pw - rp.pl, NULL, 0, pf, pfb)
                if floating is float:
                    cb_depthwise_sum_groups_f(t, dxp, W * C, M)
                else:
                    cb_depthwise_sum_groups_d(t, dxp, W * C, M)
        free(t)
        _ring_free(ring)


cdef void _bwd_k_cl(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] dy,
                    floating[:, :, :, :, ::1] part, _Geom g, cb_intr* intr) noexcept nogil:
    # part[p] = kernel gradient from the p-th contiguous block of output rows.
    cdef Py_ssize_t N = x.shape[0], W = x.shape[2], C = x.shape[3]
    cdef Py_ssize_t P = part.shape[0], KH = part.shape[1], KW = part.shape[2]
    cdef Py_ssize_t M = part.shape[4]
    cdef Py_ssize_t OH = dy.shape[1], OW = dy.shape[2]
    cdef Py_ssize_t rows = N * OH
    # No zero columns: they would add terms, and change the sums' rounding.
    cdef _Rows rp = _row_plan(W, C * M, M, OW, KH, KW, g.sw, g.dil_w, g.pw, sizeof(floating),
                              False)
    # dy's rows are copied to the same pixel stride when that is wider.
    cdef Py_ssize_t ys = rp.xs
    cdef Py_ssize_t p, r, n, oh, pfb = 0, pf2b = 0
    cdef Py_ssize_t dy_row = OW * C * M * sizeof(floating)
    cdef bint prefetch = _prefetch_big(x, dy)
    cdef const void* pf = NULL
    cdef const void* pf2 = NULL
    cdef const floating** xr = NULL
    cdef _Ring ring = _Ring(NULL, NULL, NULL)
    cdef floating* dyr = NULL
    cdef const floating* dyp
    cdef int nt = threads_for(2.0 * N * OH * OW * C * M * KH * KW)
    with parallel(num_threads=nt):
        # Assigned here, so that each thread has its own.
        ring = _ring_new(KH, rp, sizeof(floating))
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
                xr = _rows_of(ring, x, rp, n, oh * g.sh - g.ph, g.dil_h, KH, M)
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
                        g.sw, g.dil_w, g.pw, pf, pfb, pf2, pf2b)
        free(dyr)
        _ring_free(ring)


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
                                       Py_ssize_t dil_h, Py_ssize_t dil_w) noexcept nogil:
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
            oh = _src(th - ky * dil_h, sh, OH)
            if oh < 0:
                continue
            for kx in range(KW):
                ow = _src(tw - kx * dil_w, sw, OW)
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
                                     ih + g.ph, iw + g.pw, g.sh, g.sw, g.dil_h, g.dil_w)
            if c0 == C:
                continue
            memset(dxp + c0, 0, (C - c0) * sizeof(floating))
            for ky in range(KH):
                oh = _src(ih + g.ph - ky * g.dil_h, g.sh, OH)
                if oh < 0:
                    continue
                for kx in range(KW):
                    ow = _src(iw + g.pw - kx * g.dil_w, g.sw, OW)
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
