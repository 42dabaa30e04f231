# SimpleRNN (included by rnn_cell.pyx): h = act(zx_t + hm @ R), forward and
# backward on the row blocks. Records: acts (T, B, u), the new h of each step
# before masking.


cdef struct SimpleFwd:
    Seq s
    const void *zx      # (T, B, u) input projection
    const void *y0      # (B, u) initial output
    void *hs            # (T, B, u) states (without keep a ring of two steps)
    void *ys            # (T, B, u) outputs
    void *pre           # (T, B, u) activated sums (without keep one step)
    void *hm            # (B, u) scratch for the masked h
    bint keep


cdef struct SimpleBwd:
    Seq s
    const void *dys     # (T, B, u) gradients of the outputs
    void *dh            # (B, u) running gradients of h and the last output
    void *dy
    const void *acts    # (T, B, u) the forward's records
    void *dz            # (T, B, u) out: the sums' gradients
    void *dhm           # (B, u) scratch


cdef void _simple_fwd_rows(const SimpleFwd *a, Py_ssize_t b0, Py_ssize_t b1, const floating *Wp,
                           floating *hm) noexcept nogil:
    """Every step for rows b0..b1. Wp: R packed, or NULL; hm: b1 - b0 rows
    of u for the masked h."""
    cdef Py_ssize_t T = a.s.T, B = a.s.B, u = a.s.u
    cdef Py_ssize_t ti, tp, tg
    cdef Py_ssize_t t, b, j
    cdef const unsigned char *mask = a.s.mask
    cdef const floating *h0 = <const floating*>a.s.h0
    cdef const floating *y0 = <const floating*>a.y0
    cdef const floating *zx = <const floating*>a.zx
    cdef floating *hs = <floating*>a.hs
    cdef floating *ys = <floating*>a.ys
    cdef floating *pre = <floating*>a.pre
    cdef const floating *hp
    cdef const floating *yp
    cdef floating *pr
    cdef floating *hr
    cdef floating *yr
    if b1 <= b0:
        return
    for t in range(T):
        if cb_intr_poll(a.s.intr):
            return
        _ring(a.keep, t, &ti, &tp, &tg)
        hp = _recurrent_input(t, tp, b0, b1, B, u, h0, hs, <const floating*>a.s.rmask, hm)
        _rec_product_onto(b1 - b0, u, u, hp, <const floating*>a.s.R, Wp, a.s.FB,
                          zx + (t * B + b0) * u, pre + (tg * B + b0) * u)
        for b in range(b0, b1):
            hp = _state_row(h0, hs, t, tp, B, b, u)
            yp = _state_row(y0, ys, t, t - 1, B, b, u)
            hr = hs + (ti * B + b) * u
            yr = ys + (t * B + b) * u
            if mask != NULL and not mask[t * B + b]:
                for j in range(u):
                    hr[j] = hp[j]
                    yr[j] = yp[j]
                continue
            pr = pre + (tg * B + b) * u
            _act_row(pr, u, a.s.act)
            for j in range(u):
                hr[j] = pr[j]
                yr[j] = pr[j]


cdef void _simple_fwd_block(const void *args, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil:
    # every step of rows b0..b1 (_row_blocks_run)
    cdef const SimpleFwd *a = <const SimpleFwd*>args
    if a.s.dbl:
        _simple_fwd_rows(a, b0, b1, <const double*>a.s.Wp, <double*>a.hm + b0 * a.s.u)
    else:
        _simple_fwd_rows(a, b0, b1, <const float*>a.s.Wp, <float*>a.hm + b0 * a.s.u)


def simple_forward(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                   const floating[:, ::1] y0, const floating[:, ::1] R, rmask, mask, int act,
                   bint keep=True):
    """SimpleRNN: ``h = act(zx_t + (h * rmask) @ R)``; returns ``(hs, ys, acts)``
    (``keep``: see lstm_forward)."""
    cdef Py_ssize_t T = zx.shape[0], B = zx.shape[1], u = R.shape[0]
    dt = np.float32 if floating is float else np.float64
    if R.shape[1] != u or zx.shape[2] != u or h0.shape[0] != B or h0.shape[1] != u \
            or y0.shape[0] != B or y0.shape[1] != u:
        raise ValueError("simple_forward: shapes zx %s, h0 %s, y0 %s, R %s do not agree"
                         % (np.shape(zx), np.shape(h0), np.shape(y0), np.shape(R)))
    cdef cnp.ndarray hs = _steps(keep, 2, T, B, u, dt), ys = _empty3(T, B, u, dt)
    cdef cnp.ndarray pre = _steps(keep, 1, T, B, u, dt), hm = np.empty((B, u), dt)
    rm, mk = _rmask(rmask, B, u, dt), _mask(mask, T, B)
    cdef Py_ssize_t FB
    packed, FB = _recurrent_operand(R, B, False)
    cdef cb_intr intr
    cb_intr_init(&intr)
    cdef SimpleFwd a
    _seq_init(&a.s, dt, T, B, u, u, &h0[0, 0], &R[0, 0], packed, FB, rm, mk, act, 0, &intr)
    a.zx, a.y0 = &zx[0, 0, 0], &y0[0, 0]
    a.hs, a.ys, a.pre, a.hm = cnp.PyArray_DATA(hs), cnp.PyArray_DATA(ys), \
        cnp.PyArray_DATA(pre), cnp.PyArray_DATA(hm)
    a.keep = keep
    with nogil:
        _row_blocks_run(_simple_fwd_block, &a, B, 2.0 * T * B * u * u)
    check_interrupt(&intr)
    return hs, ys, pre


cdef void _simple_bwd_rows(const SimpleBwd *a, Py_ssize_t b0, Py_ssize_t b1, const floating *Wp,
                           floating *dh) noexcept nogil:
    """Every step, last first, for rows b0..b1. Wp: R^T packed, or NULL;
    dh: a.dh (its type picks the element type)."""
    cdef Py_ssize_t T = a.s.T, B = a.s.B, u = a.s.u
    cdef Py_ssize_t t, b, j
    cdef const unsigned char *mask = a.s.mask
    cdef const floating *rmask = <const floating*>a.s.rmask
    cdef const floating *dys = <const floating*>a.dys
    cdef const floating *acts = <const floating*>a.acts
    cdef floating *dy = <floating*>a.dy
    cdef floating *dz = <floating*>a.dz
    cdef const floating *dyr
    cdef const floating *ar
    cdef floating *d
    if b1 <= b0:
        return
    for t in range(T - 1, -1, -1):
        if cb_intr_poll(a.s.intr):
            return
        for b in range(b0, b1):
            d = dz + (t * B + b) * u
            dyr = dys + (t * B + b) * u
            if mask != NULL and not mask[t * B + b]:
                for j in range(u):
                    d[j] = 0
                    dy[b * u + j] = dy[b * u + j] + dyr[j]
                continue
            ar = acts + (t * B + b) * u
            for j in range(u):
                d[j] = (dh[b * u + j] + dyr[j] + dy[b * u + j]) * _dact(ar[j], a.s.act)
                dh[b * u + j] = 0
                dy[b * u + j] = 0
        _state_grad(b0, b1, u, u, dz + (t * B + b0) * u, <const floating*>a.s.R, Wp, a.s.FB,
                    rmask, dh, <floating*>a.dhm, NULL)


cdef void _simple_bwd_block(const void *args, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil:
    # every step of rows b0..b1 (_row_blocks_run)
    cdef const SimpleBwd *a = <const SimpleBwd*>args
    if a.s.dbl:
        _simple_bwd_rows(a, b0, b1, <const double*>a.s.Wp, <double*>a.dh)
    else:
        _simple_bwd_rows(a, b0, b1, <const float*>a.s.Wp, <float*>a.dh)


def simple_backward(const floating[:, :, ::1] dys, dhT, dyT, const floating[:, ::1] h0,
                    const floating[:, ::1] R, rmask, mask, int act, const floating[:, :, ::1] hs,
                    const floating[:, :, ::1] acts):
    """Backprop through time of ``simple_forward``: ``(dz, dh0, dy0, dR)``."""
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = R.shape[0]
    dt = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] dh = np.array(dhT, dtype=dt, order="C", copy=True)
    cdef floating[:, ::1] dy = np.array(dyT, dtype=dt, order="C", copy=True)
    cdef cnp.ndarray dz = np.empty((T, B, u), dt), dhm = np.empty((B, u), dt)
    rm, mk = _rmask(rmask, B, u, dt), _mask(mask, T, B)
    cdef Py_ssize_t FB
    packed, FB = _recurrent_operand(R, B, True)
    cdef cb_intr intr
    cb_intr_init(&intr)
    cdef SimpleBwd a
    _seq_init(&a.s, dt, T, B, u, u, &h0[0, 0], &R[0, 0], packed, FB, rm, mk, act, 0, &intr)
    a.dys, a.dh, a.dy, a.acts = &dys[0, 0, 0], &dh[0, 0], &dy[0, 0], &acts[0, 0, 0]
    a.dz, a.dhm = cnp.PyArray_DATA(dz), cnp.PyArray_DATA(dhm)
    with nogil:
        _row_blocks_run(_simple_bwd_block, &a, B, 2.0 * T * B * u * u)
    check_interrupt(&intr)
    dR = _recurrent_grad(np.asarray(hs), np.asarray(h0), rmask, dz, dt)
    return dz, np.asarray(dh), np.asarray(dy), dR
