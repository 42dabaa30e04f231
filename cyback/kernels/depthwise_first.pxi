# channels_first passes (included by depthwise.pyx): one task per (n, c)
# plane, padded once into a per-thread buffer for the plane kernels of
# include/cyback_depthwise_first.h. The forward pass, the input gradient (a
# forward pass over dy upsampled by the strides, or a scatter into the
# plane) and the kernel gradient (a task per channel, summing over the batch
# in order).


cdef inline Py_ssize_t _row_span(Py_ssize_t Wp, Py_ssize_t sw) noexcept nogil:
    # Values per padded row: sw phases of ceil(Wp / sw) (cyback_depthwise_first.h).
    return (Wp + sw - 1) // sw * sw


cdef inline const floating* _padded(const floating* src, Py_ssize_t H, Py_ssize_t W,
                                    floating* buf, Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t pt,
                                    Py_ssize_t pl, Py_ssize_t sw, Py_ssize_t uh,
                                    Py_ssize_t uw) noexcept nogil:
    # Plane src (H, W) as the channels_first kernels read it: Hp rows of Wp,
    # upsampled by (uh, uw), shifted down by pt and right by pl, zeros
    # around, in sw phases along the row (cyback_depthwise_first.h). buf holds
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
                           Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dil_h, Py_ssize_t dil_w,
                           Py_ssize_t KH, Py_ssize_t KW, bint accumulate, floating bias=0,
                           int act=0) noexcept nogil:
    # dst (OH, OW) (+)= the correlation of the padded plane (rows rs apart)
    # with the taps k[(ky*KW + kx) * ks], plus bias, through the activation
    # act (bias and act only when not accumulating).
    if floating is float:
        cb_depthwise_fwd_cf_plane_f(rows, rs, k, ks, dst, OH, OW, sh, sw, dil_h, dil_w, KH, KW,
                                    accumulate, bias, act)
    else:
        cb_depthwise_fwd_cf_plane_d(rows, rs, k, ks, dst, OH, OW, sh, sw, dil_h, dil_w, KH, KW,
                                    accumulate, bias, act)


cdef inline bint _cf_same3(const floating* plane, Py_ssize_t H, Py_ssize_t W,
                           const floating* k, Py_ssize_t ks, floating* dst, const floating* zero,
                           floating bias, int act) noexcept nogil:
    # dst (H, W) = act(bias + the 3x3 "same" correlation of the unpadded
    # plane), when the kernel takes the plane (see cyback_depthwise_first.h); zero
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
    cdef Py_ssize_t Hp = (OH - 1) * g.sh + (KH - 1) * g.dil_h + 1
    cdef Py_ssize_t Wp = (OW - 1) * g.sw + (KW - 1) * g.dil_w + 1, span = _row_span(Wp, g.sw)
    cdef Py_ssize_t t, n, c, m, rs = 0
    cdef bint same3 = (KH == 3 and KW == 3 and g.sh == 1 and g.sw == 1 and g.dil_h == 1
                       and g.dil_w == 1 and g.ph == 1 and g.pw == 1 and uh == 1 and uw == 1
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
                _cf_plane(rows, rs, &k[0, 0, c, m], C * M, out, OH, OW, g.sh, g.sw, g.dil_h,
                          g.dil_w, KH, KW, fan_in and m > 0,
                          bias[c * M + m] if bias != NULL else 0, act)
        free(buf)
    team_done(nt)


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
                    ih = oh * g.sh - g.ph + ky * g.dil_h
                    if ih < 0 or ih >= H:
                        continue
                    xr = &dx[n, c, ih, 0]
                    for kx in range(KW):
                        kv = k[ky, kx, c, m]
                        off = kx * g.dil_w - g.pw
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
    cdef Py_ssize_t Hp = (OH - 1) * g.sh + (KH - 1) * g.dil_h + 1
    cdef Py_ssize_t Wp = (OW - 1) * g.sw + (KW - 1) * g.dil_w + 1, span = _row_span(Wp, g.sw)
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
                        cb_depthwise_kgrad_cf_plane_f(rows, rs, &dy[n, c * M + m, 0, 0], OH,
                                                      OW, g.sh, g.sw, g.dil_h, g.dil_w, KH, KW,
                                                      acc + m * T * 8)
                    else:
                        cb_depthwise_kgrad_cf_plane_d(rows, rs, &dy[n, c * M + m, 0, 0], OH,
                                                      OW, g.sh, g.sw, g.dil_h, g.dil_w, KH, KW,
                                                      acc + m * T * 8)
            for m in range(M):
                for tap in range(T):
                    s = 0
                    for j in range(8):
                        s = s + acc[(m * T + tap) * 8 + j]
                    dk[tap // KW, tap % KW, c, m] = s
        free(acc)
        free(buf)
