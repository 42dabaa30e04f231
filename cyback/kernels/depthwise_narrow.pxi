# Narrow channels_first planes and the layout swap (included by depthwise.pyx).
#
# channels_first rows narrower than a vector leave the plane kernels scalar:
# such planes run through the channels_last row kernels a block of channels
# at a time, transposed in and out of per-thread buffers, or whole arrays
# change layout (_to_layout).


cdef inline void _transpose(const floating* src, Py_ssize_t ls, floating* dst, Py_ssize_t ld,
                            Py_ssize_t R, Py_ssize_t S) noexcept nogil:
    # dst[j*ld + i] = src[i*ls + j] for i < R, j < S (cyback_depthwise_transpose.h).
    if floating is float:
        cb_depthwise_transpose_f(src, ls, dst, ld, R, S)
    else:
        cb_depthwise_transpose_d(src, ls, dst, ld, R, S)


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


cdef bint _narrow_cf(bint channels_last, Py_ssize_t OW, Py_ssize_t M):
    # Whether a channels_first pass with OW outputs a row runs through the
    # channels_last kernels: rows under CF_NARROW_OW outputs, M == 1.
    return not channels_last and M == 1 and _staging and OW < CF_NARROW_OW


cdef inline Py_ssize_t _cf_narrow_width(Py_ssize_t W, Py_ssize_t OW, Py_ssize_t KW,
                                        _Geom g) noexcept nogil:
    # Pixels of a staged row of _fwd_cf_narrow: g.pw zeros, W, then zeros as
    # far as the last output's taps reach.
    return W + g.pw + _imax(0, (OW - 1) * g.sw + (KW - 1) * g.dil_w - g.pw - (W - 1))


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
                    ih = oh * g.sh - g.ph + ky * g.dil_h
                    xr[ky] = xt + ih * Ws * BC if 0 <= ih < H else NULL
                _cl_row(xr, kp + c0 * T, yt + oh * OW * cb, cb, BC, Ws, KH, KW, OW, g.sw,
                        g.dil_w, 0, bias + c0 if bias != NULL else NULL, act)
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
                        ih = oh * g.sh - g.ph + ky * g.dil_h
                        xr[ky] = xt + ih * W * BC if 0 <= ih < H else NULL
                    _kg_row(xr, dyt + oh * OW * BC, acc, cb, BC, BC, W, KH, KW, OW, g.sw, g.dil_w,
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

