# The LSTM (included by rnn_cell.pyx): Keras's LSTMCell, gates i, f, c, o
# (u columns each, in this order in zx, R and the records). Per step
# z = zx_t + hm @ R, c = f * c_prev + i * g, h = o * act(c), with i, f, o
# activated by ract and g by act. Forward on the row blocks or in a units
# split; backward on the row blocks.


cdef struct LstmFwd:
    Seq s
    void *zx            # (T, B, 4u) input projection, or with pj the one-step ring
    const void *c0      # (B, u) initial cell
    const void *y0      # (B, u) initial output
    void *hs            # (T, B, u) states (without keep a ring of two steps)
    void *cs            # (T, B, u) cells (the same)
    void *ys            # (T, B, u) outputs
    void *gates         # (T, B, 4u) activated gates (without keep one step)
    void *hm            # (B, u) scratch for the masked h
    bint keep
    const float *lanes  # cb_act_lanes_f's factors (float32, _gate_lanes), or NULL
    const Proj *pj      # the projection inside the steps, or NULL


cdef struct LstmBwd:
    Seq s
    const void *dys     # (T, B, u) gradients of the outputs
    void *dh            # (B, u) running gradients of h, c and the last output
    void *dc
    void *dy
    const void *c0      # (B, u) initial cell
    const void *cs      # (T, B, u) the forward's records
    const void *gates   # (T, B, 4u)
    void *dz            # (T, B, 4u) out: the pre-activations' gradients
    void *dhm           # (B, u) scratch
    void *tcs           # (B, u) scratch: act(c)


# The lanes of cb_act_lanes_f (or None) by (dtype, units, gate kinds), built once.
_LANES = {}


cpdef _gate_lanes(dt, Py_ssize_t u, tuple kinds):
    """For float32 gates whose activations are all tanh or sigmoid, the per-lane
    factors of cb_act_lanes_f (include/cyback_act.h) for gates of u units
    with these activation codes (a tuple), in order; None otherwise (the
    per-gate loops). Cached: a batch-1 call is a few dozen microseconds."""
    key = (dt, u, kinds)
    try:
        return _LANES[key]
    except KeyError:
        pass
    return _new_gate_lanes(key, dt, u, kinds)


def _new_gate_lanes(key, dt, Py_ssize_t u, kinds):
    lanes = None
    if dt == np.float32 and all(k in (0, 1) for k in kinds):
        tanh = np.repeat(np.array([k == 0 for k in kinds]), u)
        lanes = np.concatenate([np.where(tanh, -2.0, -1.0), np.where(tanh, 2.0, 1.0),
                                np.where(tanh, 1.0, 0.0)]).astype(np.float32)
    if len(_LANES) >= 64:
        _LANES.clear()
    _LANES[key] = lanes
    return lanes


cdef inline void _lstm_step_lanes(const LstmFwd *a, Py_ssize_t b0, Py_ssize_t b1, Py_ssize_t t,
                                  Py_ssize_t ti, Py_ssize_t tp, Py_ssize_t tg, float *tc,
                                  const float *lanes) noexcept nogil:
    """The rest of an LSTM step for rows b0..b1 once the product is in the
    gates: each pass over all the rows (the gates' activations, the cells, c's
    activation in tc, b1 - b0 rows of u, then h), the same operations per
    value as the per-row loop of _lstm_fwd_rows."""
    cdef Py_ssize_t B = a.s.B, u = a.s.u, G = 4 * u, b, j
    cdef const unsigned char *mask = a.s.mask
    cdef const float *h0 = <const float*>a.s.h0
    cdef const float *c0 = <const float*>a.c0
    cdef const float *y0 = <const float*>a.y0
    cdef float *hs = <float*>a.hs
    cdef float *cs = <float*>a.cs
    cdef float *ys = <float*>a.ys
    cdef float *gates = <float*>a.gates
    cdef const float *hp
    cdef const float *cp
    cdef const float *yp
    cdef float *z
    cdef float *tr
    cdef float *hr
    cdef float *cr
    cdef float *yr
    cdef float c, h
    cb_act_lanes_f(gates + (tg * B + b0) * G, b1 - b0, G, G, lanes)
    for b in range(b0, b1):
        cp = _state_row(c0, cs, t, tp, B, b, u)
        z = gates + (tg * B + b) * G
        tr = tc + (b - b0) * u
        cr = cs + (ti * B + b) * u
        if mask != NULL and not mask[t * B + b]:
            hp = _state_row(h0, hs, t, tp, B, b, u)
            yp = _state_row(y0, ys, t, t - 1, B, b, u)
            hr = hs + (ti * B + b) * u
            yr = ys + (t * B + b) * u
            for j in range(u):
                hr[j] = hp[j]
                cr[j] = cp[j]
                yr[j] = yp[j]
                tr[j] = 0
            continue
        for j in range(u):
            c = z[u + j] * cp[j] + z[j] * z[2 * u + j]
            cr[j] = c
            tr[j] = c
    cb_act_row_f(tc, (b1 - b0) * u, a.s.act)
    for b in range(b0, b1):
        if mask != NULL and not mask[t * B + b]:
            continue
        z = gates + (tg * B + b) * G
        tr = tc + (b - b0) * u
        hr = hs + (ti * B + b) * u
        yr = ys + (t * B + b) * u
        for j in range(u):
            h = z[3 * u + j] * tr[j]
            hr[j] = h
            yr[j] = h


cdef void _lstm_fwd_rows(const LstmFwd *a, Py_ssize_t b0, Py_ssize_t b1, Py_ssize_t j0,
                         Py_ssize_t j1, Py_ssize_t t0, Py_ssize_t t1, const floating *Wp,
                         Py_ssize_t FB, Py_ssize_t ps, floating *hm, Split *sp,
                         const float *lanes, const Proj *pj) noexcept nogil:
    """Steps t0..t1 for rows b0..b1 and units j0..j1. Row blocks (sp NULL)
    take all units and Wp is R packed whole (or NULL: BLAS); in a units split
    Wp holds the four gates' columns of this thread's units, packed ps values
    apart, and the threads meet after each step. hm: b1 - b0 rows of u for
    the masked h. lanes (float32 row blocks only, else NULL): the gates' kinds
    for cb_act_lanes_f (_gate_lanes), which then activates a step's rows in
    one pass. pj (row blocks only, else NULL): a.zx is a one-step ring that
    each step first fills with its rows' projection."""
    cdef Py_ssize_t B = a.s.B, u = a.s.u, G = 4 * u, n = j1 - j0
    cdef Py_ssize_t ti, tp, tg, tz = 0
    cdef Py_ssize_t t, b, j, q
    cdef const unsigned char *mask = a.s.mask
    cdef const floating *R = <const floating*>a.s.R
    cdef const floating *rmask = <const floating*>a.s.rmask
    cdef const floating *h0 = <const floating*>a.s.h0
    cdef const floating *c0 = <const floating*>a.c0
    cdef const floating *y0 = <const floating*>a.y0
    cdef floating *zx = <floating*>a.zx
    cdef floating *hs = <floating*>a.hs
    cdef floating *cs = <floating*>a.cs
    cdef floating *ys = <floating*>a.ys
    cdef floating *gates = <floating*>a.gates
    cdef const floating *hp
    cdef const floating *cp
    cdef const floating *yp
    cdef floating *z
    cdef floating *hr
    cdef floating *cr
    cdef floating *yr
    cdef floating c, h
    if b1 <= b0:
        return
    for t in range(t0, t1):
        if sp == NULL and cb_intr_poll(a.s.intr):
            return
        _ring(a.keep, t, &ti, &tp, &tg)
        hp = _recurrent_input(t, tp, b0, b1, B, u, h0, hs, rmask, hm)
        if pj != NULL:
            _project(pj, t, b0, b1, G, <floating*>pj.scratch + b0 * pj.width, zx + b0 * G)
        else:
            tz = t
        if sp == NULL:
            _rec_product_onto(b1 - b0, u, G, hp, R, Wp, FB, zx + (tz * B + b0) * G,
                              gates + (tg * B + b0) * G)
        else:
            for q in range(4):
                _product_ld(b1 - b0, u, n, hp, Wp + q * ps, FB,
                            zx + (tz * B + b0) * G + q * u + j0,
                            gates + (tg * B + b0) * G + q * u + j0, G)
        if floating is float:
            if lanes != NULL:
                _lstm_step_lanes(a, b0, b1, t, ti, tp, tg, hm, lanes)
                continue
        for b in range(b0, b1):
            hp = _state_row(h0, hs, t, tp, B, b, u)
            cp = _state_row(c0, cs, t, tp, B, b, u)
            yp = _state_row(y0, ys, t, t - 1, B, b, u)
            z = gates + (tg * B + b) * G
            hr = hs + (ti * B + b) * u
            cr = cs + (ti * B + b) * u
            yr = ys + (t * B + b) * u
            # Masked rows too (the backward pass skips them): their records
            # are those of every path (_lstm_step_lanes activates whole rows).
            _act_row(z + j0, n, a.s.ract)
            _act_row(z + u + j0, n, a.s.ract)
            _act_row(z + 2 * u + j0, n, a.s.act)
            _act_row(z + 3 * u + j0, n, a.s.ract)
            if mask != NULL and not mask[t * B + b]:
                for j in range(j0, j1):
                    hr[j] = hp[j]
                    cr[j] = cp[j]
                    yr[j] = yp[j]
                continue
            for j in range(j0, j1):
                c = z[u + j] * cp[j] + z[j] * z[2 * u + j]
                cr[j] = c
                hr[j] = c
            _act_row(hr + j0, n, a.s.act)
            for j in range(j0, j1):
                h = z[3 * u + j] * hr[j]
                hr[j] = h
                yr[j] = h
        if sp != NULL and _step_end(sp, t, a.s.intr):
            return


cdef void _lstm_fwd_block(const void *args, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil:
    # every step of rows b0..b1 (_row_blocks_run)
    cdef const LstmFwd *a = <const LstmFwd*>args
    cdef Py_ssize_t u = a.s.u
    if a.s.dbl:
        _lstm_fwd_rows(a, b0, b1, 0, u, 0, a.s.T, <const double*>a.s.Wp, a.s.FB, 0,
                       <double*>a.hm + b0 * u, NULL, a.lanes, a.pj)
    else:
        _lstm_fwd_rows(a, b0, b1, 0, u, 0, a.s.T, <const float*>a.s.Wp, a.s.FB, 0,
                       <float*>a.hm + b0 * u, NULL, a.lanes, a.pj)


cdef void _lstm_fwd_split(const LstmFwd *a, int nsplit, const floating *Wfull,
                          Py_ssize_t FBfull, floating *Wp, Py_ssize_t FB, Py_ssize_t ps,
                          floating *hm, Py_ssize_t lead) noexcept nogil:
    # The units split (see _split_threads), joined late (cb_step_join): thread
    # 0 runs whole steps (Wfull, FBfull: the row path's operand) until the
    # others are there. Wp: 4 * ps values per thread, hm B * u per thread.
    cdef Py_ssize_t T = a.s.T, B = a.s.B, u = a.s.u
    cdef const floating *R = <const floating*>a.s.R
    cdef Py_ssize_t j0 = 0, j1 = 0, q = 0, t = 0     # firstprivate in the block
    cdef int stops[2]
    cdef int tid = 0, nth = 0
    cdef Split sp
    cdef cb_step_join join
    cdef cb_step_count *counts = cb_step_counts_new(nsplit)
    if counts == NULL:
        # no memory for the counts: one thread takes every unit
        _lstm_fwd_rows(a, 0, B, 0, u, 0, T, Wfull, FBfull, 0, hm, NULL, a.lanes, NULL)
        return
    stops[0] = stops[1] = 0
    cb_join_init(&join)
    with parallel(num_threads=nsplit):
        # assigned whole, sp is private to each thread (a field assignment
        # would leave it shared)
        tid = cb_get_thread_num()
        nth = cb_get_num_threads()
        sp = Split(tid=tid, nth=nth, meets=1, stops=&stops[0], counts=counts)
        j0 = _unit_start(tid, nth, u)
        j1 = _unit_start(tid + 1, nth, u)
        t = 0
        if tid == 0:
            while _alone(&join, nth, lead, t, T):
                _lstm_fwd_rows(a, 0, B, 0, u, t, t + 1, Wfull, FBfull, 0, hm, NULL, a.lanes,
                               NULL)
                t = T if a.s.intr.stop else t + 1
        if tid != 0 or t < T:
            for q in range(4):
                _pack_ld(R + q * u + j0, u, j1 - j0, 4 * u, FB, Wp + (4 * tid + q) * ps)
        t = _join_split(&join, tid, nth, lead, t, T)
        if t < T:
            _lstm_fwd_rows(a, 0, B, j0, j1, t, T, Wp + 4 * tid * ps, FB, ps, hm + tid * B * u,
                           &sp, NULL, NULL)
    cb_step_counts_free(counts)


def lstm_forward(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                 const floating[:, ::1] c0, const floating[:, ::1] y0, const floating[:, ::1] R,
                 rmask, mask, int act, int ract, bint keep=True):
    """Run the sequence; returns ``(hs, cs, ys, gates)`` (see the module doc).
    With ``keep`` off (no gradient to come) nothing is recorded: hs and cs
    hold two steps, step t in row ``t % 2``, and gates one."""
    return _lstm_run(zx, h0, c0, y0, R, rmask, mask, act, ract, keep, NULL, "lstm_forward")


def lstm_forward_projected(x, W, xb, const floating[:, ::1] h0, const floating[:, ::1] c0,
                           const floating[:, ::1] y0, const floating[:, ::1] R, rmask, mask,
                           int act, int ract, bint keep=True):
    """lstm_forward of zx = x @ W (+ xb), x (T, B, I) with its last axis
    contiguous (a transposed view of a batch-major input is read as it is),
    W (I, 4u), xb (4u,) or None: each thread projects its own rows at the
    start of each step (see Proj). The sums are those of the product
    followed by the bias."""
    fname = "lstm_forward_projected"
    dt = np.float32 if floating is float else np.float64
    cdef Proj pj
    keep_alive = _proj_setup(&pj, x, W, xb, h0.shape[0], 4 * R.shape[0], dt, fname)
    cdef floating[:, :, ::1] ring = np.empty((1, h0.shape[0], 4 * R.shape[0]), dt)
    return _lstm_run(ring, h0, c0, y0, R, rmask, mask, act, ract, keep, &pj, fname)


cdef tuple _lstm_run(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                     const floating[:, ::1] c0, const floating[:, ::1] y0,
                     const floating[:, ::1] R, rmask, mask, int act, int ract, bint keep,
                     Proj *pj, fname):
    # zx: the projection, or with pj the one-step ring the row blocks fill
    cdef Py_ssize_t T = pj.T if pj != NULL else zx.shape[0], B = zx.shape[1], u = R.shape[0]
    cdef Py_ssize_t G = 4 * u
    dt = np.float32 if floating is float else np.float64
    if R.shape[1] != G or zx.shape[2] != G or h0.shape[0] != B or h0.shape[1] != u \
            or c0.shape[0] != B or c0.shape[1] != u or y0.shape[0] != B or y0.shape[1] != u:
        raise ValueError("%s: shapes zx %s, h0 %s, c0 %s, y0 %s, R %s do not agree"
                         % (fname, np.shape(zx), np.shape(h0), np.shape(c0), np.shape(y0),
                            np.shape(R)))
    cdef cnp.ndarray hs = _steps(keep, 2, T, B, u, dt), cs = _steps(keep, 2, T, B, u, dt)
    cdef cnp.ndarray ys = _empty3(T, B, u, dt), gates = _steps(keep, 1, T, B, G, dt)
    cdef cnp.ndarray hm, wsplit, hsplit
    cdef Py_ssize_t FB, ps, FBfull, lead
    cdef int nsplit = _split_threads(T, B, u, 4, sizeof(floating))
    cdef cb_intr intr
    cb_intr_init(&intr)
    # One row whose gates are whole vectors gains nothing from the one pass
    # over the per-gate loops.
    lane_kinds = _gate_lanes(dt, u, (ract, ract, act, ract)) if B > 1 or u % 8 else None
    # the masks as the kernels read them, alive until they return
    rm, mk = _rmask(rmask, B, u, dt), _mask(mask, T, B)
    cdef LstmFwd a
    a.c0, a.y0 = &c0[0, 0], &y0[0, 0]
    a.hs, a.cs, a.ys, a.gates = cnp.PyArray_DATA(hs), cnp.PyArray_DATA(cs), \
        cnp.PyArray_DATA(ys), cnp.PyArray_DATA(gates)
    a.keep, a.lanes, a.pj = keep, <const float*>_address(lane_kinds), pj
    if nsplit > 1:
        if pj != NULL:
            zx = _projected_whole(pj, zx)
            a.pj = NULL
        wsplit, ps, FB, hsplit = _split_operand(nsplit, u, 4, B, dt)
        packed, FBfull = _recurrent_operand(R, B, False)
        _seq_init(&a.s, dt, T, B, u, G, &h0[0, 0], &R[0, 0], packed, FBfull, rm, mk, act,
                  ract, &intr)
        a.zx = <void*>&zx[0, 0, 0]
        lead = _TUNE["split_lead_steps"]
        with nogil:
            _lstm_fwd_split(&a, nsplit, <const floating*>a.s.Wp, FBfull,
                            <floating*>cnp.PyArray_DATA(wsplit), FB, ps,
                            <floating*>cnp.PyArray_DATA(hsplit), lead)
        check_interrupt(&intr)
        return hs, cs, ys, gates
    hm = np.empty((max(1, B), u), dt)
    packed, FB = _recurrent_operand(R, B, False)
    _seq_init(&a.s, dt, T, B, u, G, &h0[0, 0], &R[0, 0], packed, FB, rm, mk, act, ract, &intr)
    a.zx, a.hm = <void*>&zx[0, 0, 0], cnp.PyArray_DATA(hm)
    with nogil:
        _row_blocks_run(_lstm_fwd_block, &a, B, 2.0 * T * B * G * u)
    check_interrupt(&intr)
    return hs, cs, ys, gates


cdef void _lstm_bwd_rows(const LstmBwd *a, Py_ssize_t b0, Py_ssize_t b1, const floating *Wp,
                         floating *dh) noexcept nogil:
    """Every step, last first, for rows b0..b1. Wp: R^T packed, or NULL;
    dh: a.dh (its type picks the element type)."""
    cdef Py_ssize_t T = a.s.T, B = a.s.B, u = a.s.u, G = 4 * u
    cdef Py_ssize_t t, b, j
    cdef const unsigned char *mask = a.s.mask
    cdef const floating *rmask = <const floating*>a.s.rmask
    cdef const floating *c0 = <const floating*>a.c0
    cdef const floating *cs = <const floating*>a.cs
    cdef const floating *gates = <const floating*>a.gates
    cdef const floating *dys = <const floating*>a.dys
    cdef floating *dc = <floating*>a.dc
    cdef floating *dy = <floating*>a.dy
    cdef floating *dz = <floating*>a.dz
    cdef floating *tcs = <floating*>a.tcs
    cdef const floating *cp
    cdef const floating *g
    cdef const floating *dyr
    cdef floating *d
    cdef floating *tr
    cdef floating ig, fg, gg, og, tc, dH, dC
    if b1 <= b0:
        return
    for t in range(T - 1, -1, -1):
        if cb_intr_poll(a.s.intr):
            return
        for b in range(b0, b1):
            d = dz + (t * B + b) * G
            dyr = dys + (t * B + b) * u
            if mask != NULL and not mask[t * B + b]:
                # States pass through; the output's gradient goes to the
                # previous output.
                memset(d, 0, G * sizeof(floating))
                for j in range(u):
                    dy[b * u + j] = dy[b * u + j] + dyr[j]
                continue
            cp = _state_row(c0, cs, t, t - 1, B, b, u)
            g = gates + (t * B + b) * G
            tr = tcs + b * u
            memcpy(tr, cs + (t * B + b) * u, u * sizeof(floating))
            _act_row(tr, u, a.s.act)
            for j in range(u):
                ig = g[j]
                fg = g[u + j]
                gg = g[2 * u + j]
                og = g[3 * u + j]
                tc = tr[j]
                dH = dh[b * u + j] + dyr[j] + dy[b * u + j]
                dC = dc[b * u + j] + dH * og * _dact(tc, a.s.act)
                d[j] = dC * gg * _dact(ig, a.s.ract)
                d[u + j] = dC * cp[j] * _dact(fg, a.s.ract)
                d[2 * u + j] = dC * ig * _dact(gg, a.s.act)
                d[3 * u + j] = dH * tc * _dact(og, a.s.ract)
                dc[b * u + j] = dC * fg
                dh[b * u + j] = 0
                dy[b * u + j] = 0
        _state_grad(b0, b1, u, G, dz + (t * B + b0) * G, <const floating*>a.s.R, Wp, a.s.FB,
                    rmask, dh, <floating*>a.dhm, NULL)


cdef void _lstm_bwd_block(const void *args, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil:
    # every step of rows b0..b1 (_row_blocks_run)
    cdef const LstmBwd *a = <const LstmBwd*>args
    if a.s.dbl:
        _lstm_bwd_rows(a, b0, b1, <const double*>a.s.Wp, <double*>a.dh)
    else:
        _lstm_bwd_rows(a, b0, b1, <const float*>a.s.Wp, <float*>a.dh)


def lstm_backward(const floating[:, :, ::1] dys, dhT, dcT, dyT, const floating[:, ::1] h0,
                  const floating[:, ::1] c0, const floating[:, ::1] R, rmask, mask, int act,
                  int ract, const floating[:, :, ::1] hs, const floating[:, :, ::1] cs,
                  const floating[:, :, ::1] gates):
    """Backprop through time: ``(dz, dh0, dc0, dy0, dR)`` from the gradients of
    the outputs ``dys`` and of the final states (h, c, and the last output,
    which only a mask makes different from h)."""
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = R.shape[0]
    dt = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] dh = np.array(dhT, dtype=dt, order="C", copy=True)
    cdef floating[:, ::1] dc = np.array(dcT, dtype=dt, order="C", copy=True)
    cdef floating[:, ::1] dy = np.array(dyT, dtype=dt, order="C", copy=True)
    cdef cnp.ndarray dz = np.empty((T, B, 4 * u), dt)
    cdef cnp.ndarray dhm = np.empty((B, u), dt), tcs = np.empty((B, u), dt)
    cdef Py_ssize_t FB
    packed, FB = _recurrent_operand(R, B, True)
    cdef cb_intr intr
    cb_intr_init(&intr)
    cdef LstmBwd a
    rm, mk = _rmask(rmask, B, u, dt), _mask(mask, T, B)
    _seq_init(&a.s, dt, T, B, u, 4 * u, &h0[0, 0], &R[0, 0], packed, FB, rm, mk, act, ract,
              &intr)
    a.dys, a.dh, a.dc, a.dy = &dys[0, 0, 0], &dh[0, 0], &dc[0, 0], &dy[0, 0]
    a.c0, a.cs, a.gates = &c0[0, 0], &cs[0, 0, 0], &gates[0, 0, 0]
    a.dz, a.dhm, a.tcs = cnp.PyArray_DATA(dz), cnp.PyArray_DATA(dhm), cnp.PyArray_DATA(tcs)
    with nogil:
        _row_blocks_run(_lstm_bwd_block, &a, B, 2.0 * T * B * (4 * u) * u)
    check_interrupt(&intr)
    dR = _recurrent_grad(np.asarray(hs), np.asarray(h0), rmask, dz, dt)
    return dz, np.asarray(dh), np.asarray(dc), np.asarray(dy), dR
