# The GRU (included by rnn_cell.pyx): Keras's GRUCell (implementation 2),
# forward on the row blocks or in a units split, backward on the row blocks.
#
# With ``reset_after`` the reset gate multiplies the recurrent product: one
# product per step, ``P = hm @ R + rb`` (R: (u, 3u), rb: the recurrent bias),
# and
#     z = ract(xz + P_z), r = ract(xr + P_r), hh = act(xh + r * P_h).
# Without, it multiplies h before a second product: ``P = hm @ R`` (R: (u, 2u))
# gives z and r, then hh = act(xh + (r * hm) @ Rh).
# The new state is ``z * hx + (1 - z) * hh``, hx being hm (Keras mixes the
# dropped-out h when recurrent dropout is on) or h with ``mix_masked`` off.
# Records: gates (T, B, 3u) = z, r, hh; ph (T, B, u) = P_h (reset_after).
# Masked rows record zeros there, so that products over all rows stay finite.


cdef struct GruFwd:
    Seq s
    void *zx            # (T, B, 3u) input projection, or with pj the one-step ring
    const void *y0      # (B, u) initial output
    const void *Rh      # (u, u) candidate kernel (without reset_after)
    const void *Whp     # Rh packed for the product, or NULL
    const void *rb      # (3u,) recurrent bias (reset_after), or NULL
    bint reset_after, mix_masked, keep
    void *hs            # (T, B, u) states (without keep a ring of two steps)
    void *ys            # (T, B, u) outputs
    void *gates         # (T, B, 3u) z, r, hh (without keep one step)
    void *ph            # (T, B, u) P_h (reset_after; without keep one step)
    void *hm            # (B, u) scratch for the masked h
    void *P             # (B, NR) scratch: the recurrent product
    void *Q             # (B, u) scratch: r * hm (without reset_after)
    const Proj *pj      # the projection inside the steps, or NULL


cdef struct GruBwd:
    Seq s
    const void *dys     # (T, B, u) gradients of the outputs
    void *dh            # (B, u) running gradients of h and the last output
    void *dy
    const void *Rh      # (u, u) candidate kernel (without reset_after)
    const void *Whp     # Rh^T packed for the product, or NULL
    bint reset_after, mix_masked
    const void *hs      # (T, B, u) the forward's records
    const void *gates   # (T, B, 3u)
    const void *ph      # (T, B, u) (reset_after)
    void *D             # (T, B, NR) out: the gradients of the gates' sums
    void *Dh            # (T, B, u) out: the candidate's
    void *dhm           # (B, u) scratch: the masked h's gradient
    void *dq            # (B, u) scratch: (r * hm)'s gradient
    void *dx            # (B, u) scratch: the unmasked h's gradient


cdef void _gru_fwd_rows(const GruFwd *a, Py_ssize_t b0, Py_ssize_t b1, Py_ssize_t j0,
                        Py_ssize_t j1, Py_ssize_t t0, Py_ssize_t t1, const floating *Wp,
                        const floating *Whp, Py_ssize_t FB, Py_ssize_t ps, floating *hm,
                        Split *sp, const Proj *pj) noexcept nogil:
    """Steps t0..t1 for rows b0..b1 and units j0..j1, as _lstm_fwd_rows. In a
    units split Wp holds this thread's columns of the gates' products: of R
    for z, r and h with reset_after, else of R for z and r and of Rh, whose
    product reads r * h of every unit: the threads also meet before it.
    Whp: Rh packed (row blocks), or NULL. hm: b1 - b0 rows of u for the
    masked h. pj: as _lstm_fwd_rows."""
    cdef Py_ssize_t B = a.s.B, u = a.s.u, NR = a.s.NR, G = 3 * u
    cdef Py_ssize_t ti, tp, tg, tz = 0
    cdef Py_ssize_t t, b, j, q, n = b1 - b0, nu = j1 - j0
    cdef bint reset_after = a.reset_after
    cdef const unsigned char *mask = a.s.mask
    cdef const floating *R = <const floating*>a.s.R
    cdef const floating *Rh = <const floating*>a.Rh
    cdef const floating *rb = <const floating*>a.rb
    cdef const floating *rmask = <const floating*>a.s.rmask
    cdef const floating *h0 = <const floating*>a.s.h0
    cdef const floating *y0 = <const floating*>a.y0
    cdef floating *zx = <floating*>a.zx
    cdef floating *hs = <floating*>a.hs
    cdef floating *ys = <floating*>a.ys
    cdef floating *gates = <floating*>a.gates
    cdef floating *ph = <floating*>a.ph
    cdef floating *P = <floating*>a.P
    cdef floating *Q = <floating*>a.Q
    cdef const floating *hp
    cdef const floating *hmp
    cdef const floating *hx
    cdef const floating *x
    cdef floating *g
    cdef floating *pr
    cdef floating *hr
    cdef floating *yr
    cdef floating zz, h
    if n <= 0:
        return
    for t in range(t0, t1):
        if sp == NULL and cb_intr_poll(a.s.intr):
            return
        _ring(a.keep, t, &ti, &tp, &tg)
        if pj != NULL:
            _project(pj, t, b0, b1, G, <floating*>pj.scratch + b0 * pj.width, zx + b0 * G)
        else:
            tz = t
        hmp = _recurrent_input(t, tp, b0, b1, B, u, h0, hs, rmask, hm)
        if sp == NULL:
            if rb != NULL:
                for b in range(b0, b1):
                    memcpy(P + b * NR, rb, NR * sizeof(floating))
            _rec_product(False, n, u, NR, hmp, R, Wp, FB, 1 if rb != NULL else 0, P + b0 * NR)
        else:
            for q in range(3 if reset_after else 2):
                if rb != NULL:
                    for b in range(b0, b1):
                        memcpy(P + b * NR + q * u + j0, rb + q * u + j0, nu * sizeof(floating))
                _product_ld(n, u, nu, hmp, Wp + q * ps, FB,
                            P + b0 * NR + q * u + j0 if rb != NULL else NULL,
                            P + b0 * NR + q * u + j0, NR)
        for b in range(b0, b1):
            g = gates + (tg * B + b) * G
            x = zx + (tz * B + b) * G
            if mask != NULL and not mask[t * B + b]:
                for q in range(3):
                    memset(g + q * u + j0, 0, nu * sizeof(floating))
                memset(Q + b * u + j0, 0, nu * sizeof(floating))
                if reset_after:
                    memset(ph + (tg * B + b) * u + j0, 0, nu * sizeof(floating))
                continue
            pr = P + b * NR
            for j in range(j0, j1):
                g[j] = x[j] + pr[j]
                g[u + j] = x[u + j] + pr[u + j]
            _act_row(g + j0, nu, a.s.ract)
            _act_row(g + u + j0, nu, a.s.ract)
            if reset_after:
                hr = ph + (tg * B + b) * u
                for j in range(j0, j1):
                    hr[j] = pr[2 * u + j]
                    g[2 * u + j] = x[2 * u + j] + g[u + j] * pr[2 * u + j]
            else:
                for j in range(j0, j1):
                    Q[b * u + j] = g[u + j] * hmp[(b - b0) * u + j]
        if not reset_after and sp == NULL:
            # The candidate's product reads r * hm: a second GEMM per step.
            _rec_product(False, n, u, u, Q + b0 * u, Rh, Whp, FB, 0, P + b0 * NR)
        elif not reset_after:
            # every unit's r * hm is in Q: the candidate's pre-activation
            # goes straight into the gates, zx's part added after the sum as
            # in the row path; masked rows keep zeros there
            _step_meet(sp, t)
            for b in range(b0, b1):
                memcpy(gates + (tg * B + b) * G + 2 * u + j0, zx + (tz * B + b) * G + 2 * u + j0,
                       nu * sizeof(floating))
            _product_ld(n, u, nu, Q + b0 * u, Wp + 2 * ps, FB,
                        gates + (tg * B + b0) * G + 2 * u + j0,
                        gates + (tg * B + b0) * G + 2 * u + j0, G)
            if mask != NULL:
                for b in range(b0, b1):
                    if not mask[t * B + b]:
                        memset(gates + (tg * B + b) * G + 2 * u + j0, 0, nu * sizeof(floating))
        for b in range(b0, b1):
            hr = hs + (ti * B + b) * u
            yr = ys + (t * B + b) * u
            if mask != NULL and not mask[t * B + b]:
                hp = _state_row(h0, hs, t, tp, B, b, u)
                x = _state_row(y0, ys, t, t - 1, B, b, u)
                memcpy(hr + j0, hp + j0, nu * sizeof(floating))
                memcpy(yr + j0, x + j0, nu * sizeof(floating))
                continue
            g = gates + (tg * B + b) * G
            if not reset_after and sp == NULL:
                # P is (n, u) here: the product above wrote rows of width u.
                x = zx + (tz * B + b) * G
                pr = P + b0 * NR
                for j in range(u):
                    g[2 * u + j] = x[2 * u + j] + pr[(b - b0) * u + j]
            _act_row(g + 2 * u + j0, nu, a.s.act)
            hp = _state_row(h0, hs, t, tp, B, b, u)
            hx = <const floating*>hm + (b - b0) * u if (a.mix_masked and rmask != NULL) else hp
            for j in range(j0, j1):
                zz = g[j]
                h = zz * hx[j] + (1 - zz) * g[2 * u + j]
                hr[j] = h
                yr[j] = h
        if sp != NULL and _step_end(sp, t, a.s.intr):
            return


cdef void _gru_fwd_block(const void *args, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil:
    # every step of rows b0..b1 (_row_blocks_run)
    cdef const GruFwd *a = <const GruFwd*>args
    cdef Py_ssize_t u = a.s.u
    if a.s.dbl:
        _gru_fwd_rows(a, b0, b1, 0, u, 0, a.s.T, <const double*>a.s.Wp,
                      <const double*>a.Whp, a.s.FB, 0, <double*>a.hm + b0 * u, NULL, a.pj)
    else:
        _gru_fwd_rows(a, b0, b1, 0, u, 0, a.s.T, <const float*>a.s.Wp,
                      <const float*>a.Whp, a.s.FB, 0, <float*>a.hm + b0 * u, NULL, a.pj)


cdef void _gru_fwd_split(const GruFwd *a, int nsplit, const floating *Wfull,
                         const floating *Whfull, Py_ssize_t FBfull, floating *Wp, Py_ssize_t FB,
                         Py_ssize_t ps, floating *hm, Py_ssize_t lead) noexcept nogil:
    # The units split of a GRU, joined late (see _lstm_fwd_split); Wfull,
    # Whfull: the row path's operands for the steps thread 0 runs alone.
    # Wp: 3 * ps values per thread, hm B * u per thread.
    cdef Py_ssize_t T = a.s.T, B = a.s.B, u = a.s.u, NR = a.s.NR
    cdef const floating *R = <const floating*>a.s.R
    cdef const floating *Rh = <const floating*>a.Rh
    cdef Py_ssize_t j0 = 0, j1 = 0, q = 0, t = 0     # firstprivate in the block
    cdef int stops[2]
    cdef int tid = 0, nth = 0
    cdef Split sp
    cdef cb_step_join join
    cdef cb_step_count *counts = cb_step_counts_new(nsplit)
    if counts == NULL:
        _gru_fwd_rows(a, 0, B, 0, u, 0, T, Wfull, Whfull, FBfull, 0, hm, NULL, NULL)
        return
    stops[0] = stops[1] = 0
    cb_join_init(&join)
    with parallel(num_threads=nsplit):
        tid = cb_get_thread_num()
        nth = cb_get_num_threads()
        sp = Split(tid=tid, nth=nth, meets=1 if a.reset_after else 2, stops=&stops[0],
                   counts=counts)
        j0 = _unit_start(tid, nth, u)
        j1 = _unit_start(tid + 1, nth, u)
        t = 0
        if tid == 0:
            while _alone(&join, nth, lead, t, T):
                _gru_fwd_rows(a, 0, B, 0, u, t, t + 1, Wfull, Whfull, FBfull, 0, hm, NULL, NULL)
                t = T if a.s.intr.stop else t + 1
        if tid != 0 or t < T:
            for q in range(3 if a.reset_after else 2):
                _pack_ld(R + q * u + j0, u, j1 - j0, NR, FB, Wp + (3 * tid + q) * ps)
            if not a.reset_after:
                _pack_ld(Rh + j0, u, j1 - j0, u, FB, Wp + (3 * tid + 2) * ps)
        t = _join_split(&join, tid, nth, lead, t, T)
        if t < T:
            _gru_fwd_rows(a, 0, B, j0, j1, t, T, Wp + 3 * tid * ps, <const floating*>NULL, FB,
                          ps, hm + tid * B * u, &sp, NULL)
    cb_step_counts_free(counts)


def _gru_check(name, zx, h0, y0, R, Rh, rb, bint reset_after):
    T, B, u = zx.shape[0], zx.shape[1], h0.shape[1]
    ok = zx.shape[2] == 3 * u and tuple(h0.shape) == (B, u) and tuple(y0.shape) == (B, u) \
        and tuple(R.shape) == (u, (3 if reset_after else 2) * u) \
        and (reset_after or (Rh is not None and tuple(Rh.shape) == (u, u))) \
        and (rb is None or (reset_after and tuple(rb.shape) == (3 * u,)))
    if not ok:
        raise ValueError("%s: shapes zx %s, h0 %s, y0 %s, R %s, Rh %s, rb %s do not agree "
                         "(reset_after=%s)" % (name, np.shape(zx), np.shape(h0), np.shape(y0),
                                               np.shape(R), np.shape(Rh), np.shape(rb),
                                               reset_after))


cpdef tuple _candidate_operand(Rh, Py_ssize_t B, bint trans, dt, Py_ssize_t FB):
    """The GRU's candidate kernel Rh as a contiguous array (a 1x1 stand-in
    with ``reset_after``, which has none) and its packed form for the
    per-step product, or None (see _recurrent_operand), in R's block width FB:
    the kernels take one width for both."""
    rh = np.ascontiguousarray(Rh if Rh is not None else np.zeros((1, 1)), dtype=dt)
    return rh, (_recurrent_operand(rh, B, trans, FB)[0] if Rh is not None else None)


def gru_forward(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                const floating[:, ::1] y0, const floating[:, ::1] R, Rh, rb, rmask, mask,
                bint reset_after, bint mix_masked, int act, int ract, bint keep=True):
    """Run a GRU sequence (see above); returns ``(hs, ys, gates, ph)``. ``Rh``
    is None with ``reset_after``; ``rb`` is None without a recurrent bias;
    ``keep``: see lstm_forward."""
    return _gru_run(zx, h0, y0, R, Rh, rb, rmask, mask, reset_after, mix_masked, act, ract,
                    keep, NULL, "gru_forward")


def gru_forward_projected(x, W, xb, const floating[:, ::1] h0, const floating[:, ::1] y0,
                          const floating[:, ::1] R, Rh, rb, rmask, mask, bint reset_after,
                          bint mix_masked, int act, int ract, bint keep=True):
    """gru_forward of zx = x @ W (+ xb), W (I, 3u): as lstm_forward_projected."""
    fname = "gru_forward_projected"
    dt = np.float32 if floating is float else np.float64
    cdef Proj pj
    keep_alive = _proj_setup(&pj, x, W, xb, h0.shape[0], 3 * h0.shape[1], dt, fname)
    cdef floating[:, :, ::1] ring = np.empty((1, h0.shape[0], 3 * h0.shape[1]), dt)
    return _gru_run(ring, h0, y0, R, Rh, rb, rmask, mask, reset_after, mix_masked, act, ract,
                    keep, &pj, fname)


cdef tuple _gru_run(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                    const floating[:, ::1] y0, const floating[:, ::1] R, Rh, rb, rmask, mask,
                    bint reset_after, bint mix_masked, int act, int ract, bint keep, Proj *pj,
                    fname):
    # zx: the projection, or with pj the one-step ring the row blocks fill
    dt = np.float32 if floating is float else np.float64
    _gru_check(fname, zx, h0, y0, R, Rh, rb, reset_after)
    cdef Py_ssize_t T = pj.T if pj != NULL else zx.shape[0], B = zx.shape[1], u = h0.shape[1]
    cdef cnp.ndarray hs = _steps(keep, 2, T, B, u, dt), ys = _empty3(T, B, u, dt)
    cdef cnp.ndarray gates = _steps(keep, 1, T, B, 3 * u, dt)
    cdef cnp.ndarray ph = _steps(keep, 1, T, B, u, dt) if reset_after else np.zeros((1, 1, 1), dt)
    cdef cnp.ndarray P = np.empty((B, R.shape[1]), dt), Q = np.empty((B, u), dt)
    cdef cnp.ndarray hm, wsplit, hsplit
    cdef Py_ssize_t FB = 0, ps = 0, FBfull, lead
    cdef int nsplit = _split_threads(T, B, u, 3, sizeof(floating))
    cdef cb_intr intr
    cb_intr_init(&intr)
    # the operands and masks as the kernels read them, alive until they return
    rb_a = np.ascontiguousarray(rb, dtype=dt) if rb is not None else None
    rm, mk = _rmask(rmask, B, u, dt), _mask(mask, T, B)
    cdef GruFwd a
    a.y0, a.rb = &y0[0, 0], _address(rb_a)
    a.reset_after, a.mix_masked, a.keep, a.pj = reset_after, mix_masked, keep, pj
    a.hs, a.ys, a.gates, a.ph = cnp.PyArray_DATA(hs), cnp.PyArray_DATA(ys), \
        cnp.PyArray_DATA(gates), cnp.PyArray_DATA(ph)
    a.P, a.Q = cnp.PyArray_DATA(P), cnp.PyArray_DATA(Q)
    if nsplit > 1:
        if pj != NULL:
            zx = _projected_whole(pj, zx)
            a.pj = NULL
        wsplit, ps, FB, hsplit = _split_operand(nsplit, u, 3, B, dt)
    packed, FBfull = _recurrent_operand(R, B, False)
    rh_arr, packed_h = _candidate_operand(Rh, B, False, dt, FBfull)
    _seq_init(&a.s, dt, T, B, u, R.shape[1], &h0[0, 0], &R[0, 0], packed, FBfull, rm, mk, act,
              ract, &intr)
    a.zx, a.Rh, a.Whp = <void*>&zx[0, 0, 0], _address(rh_arr), _address(packed_h)
    if nsplit > 1:
        lead = _TUNE["split_lead_steps"]
        with nogil:
            _gru_fwd_split(&a, nsplit, <const floating*>a.s.Wp, <const floating*>a.Whp, FBfull,
                           <floating*>cnp.PyArray_DATA(wsplit), FB, ps,
                           <floating*>cnp.PyArray_DATA(hsplit), lead)
    else:
        hm = np.empty((max(1, B), u), dt)
        a.hm = cnp.PyArray_DATA(hm)
        with nogil:
            _row_blocks_run(_gru_fwd_block, &a, B, 2.0 * T * B * 3 * u * u)
    check_interrupt(&intr)
    return hs, ys, gates, ph


cdef void _gru_bwd_rows(const GruBwd *a, Py_ssize_t b0, Py_ssize_t b1, const floating *Wp,
                        floating *dh) noexcept nogil:
    """Every step, last first, for rows b0..b1. Wp: R^T packed, or NULL;
    dh: a.dh (its type picks the element type)."""
    cdef Py_ssize_t T = a.s.T, B = a.s.B, u = a.s.u, NR = a.s.NR
    cdef Py_ssize_t t, b, j, n = b1 - b0
    cdef bint reset_after = a.reset_after, mix_masked = a.mix_masked
    cdef int act = a.s.act, ract = a.s.ract
    cdef const unsigned char *mask = a.s.mask
    cdef const floating *rmask = <const floating*>a.s.rmask
    cdef const floating *h0 = <const floating*>a.s.h0
    cdef const floating *hs = <const floating*>a.hs
    cdef const floating *gates = <const floating*>a.gates
    cdef const floating *ph = <const floating*>a.ph
    cdef const floating *dys = <const floating*>a.dys
    cdef floating *dy = <floating*>a.dy
    cdef floating *D = <floating*>a.D
    cdef floating *Dh = <floating*>a.Dh
    cdef floating *dhm = <floating*>a.dhm
    cdef floating *dq = <floating*>a.dq
    cdef floating *dx = <floating*>a.dx
    cdef const floating *hp
    cdef const floating *g
    cdef const floating *dyr
    cdef floating *d
    cdef floating dH, zz, rr, hh, hmj, hx, dah
    if n <= 0:
        return
    for t in range(T - 1, -1, -1):
        if cb_intr_poll(a.s.intr):
            return
        for b in range(b0, b1):
            d = D + (t * B + b) * NR
            dyr = dys + (t * B + b) * u
            if mask != NULL and not mask[t * B + b]:
                # States pass through; the output's gradient goes to the
                # previous output.
                memset(d, 0, NR * sizeof(floating))
                memset(Dh + (t * B + b) * u, 0, u * sizeof(floating))
                memset(dhm + b * u, 0, u * sizeof(floating))
                memset(dx + b * u, 0, u * sizeof(floating))
                for j in range(u):
                    dy[b * u + j] = dy[b * u + j] + dyr[j]
                continue
            hp = _state_row(h0, hs, t, t - 1, B, b, u)
            g = gates + (t * B + b) * 3 * u
            for j in range(u):
                zz = g[j]
                rr = g[u + j]
                hh = g[2 * u + j]
                hmj = hp[j] * rmask[b * u + j] if rmask != NULL else hp[j]
                hx = hmj if mix_masked else hp[j]
                dH = dh[b * u + j] + dyr[j] + dy[b * u + j]
                d[j] = dH * (hx - hh) * _dact(zz, ract)
                dah = dH * (1 - zz) * _dact(hh, act)
                Dh[(t * B + b) * u + j] = dah
                if reset_after:
                    d[u + j] = dah * ph[(t * B + b) * u + j] * _dact(rr, ract)
                    d[2 * u + j] = dah * rr
                if mix_masked:
                    dhm[b * u + j] = dH * zz
                    dx[b * u + j] = 0
                else:
                    dhm[b * u + j] = 0
                    dx[b * u + j] = dH * zz
                dh[b * u + j] = 0
                dy[b * u + j] = 0
        if not reset_after:
            # r multiplied hm before the candidate's product: its gradient
            # needs dah @ Rh^T first.
            _rec_product(True, n, u, u, Dh + (t * B + b0) * u, <const floating*>a.Rh,
                         <const floating*>a.Whp, a.s.FB, 0, dq + b0 * u)
            for b in range(b0, b1):
                if mask != NULL and not mask[t * B + b]:
                    continue
                hp = _state_row(h0, hs, t, t - 1, B, b, u)
                g = gates + (t * B + b) * 3 * u
                d = D + (t * B + b) * NR
                for j in range(u):
                    rr = g[u + j]
                    hmj = hp[j] * rmask[b * u + j] if rmask != NULL else hp[j]
                    d[u + j] = dq[b * u + j] * hmj * _dact(rr, ract)
                    dhm[b * u + j] += dq[b * u + j] * rr
        _state_grad(b0, b1, u, NR, D + (t * B + b0) * NR, <const floating*>a.s.R, Wp, a.s.FB,
                    rmask, dh, dhm, dx)


cdef void _gru_bwd_block(const void *args, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil:
    # every step of rows b0..b1 (_row_blocks_run)
    cdef const GruBwd *a = <const GruBwd*>args
    if a.s.dbl:
        _gru_bwd_rows(a, b0, b1, <const double*>a.s.Wp, <double*>a.dh)
    else:
        _gru_bwd_rows(a, b0, b1, <const float*>a.s.Wp, <float*>a.dh)


def gru_backward(const floating[:, :, ::1] dys, dhT, dyT, const floating[:, ::1] h0,
                 const floating[:, ::1] R, Rh, rb, rmask, mask, bint reset_after,
                 bint mix_masked, int act, int ract, const floating[:, :, ::1] hs,
                 const floating[:, :, ::1] gates, ph):
    """Backprop through time of ``gru_forward``: ``(dxz, dxr, dxh, dh0, dy0, dR,
    dRh, drb)``, the first three being the gradients of the three slices of the
    input projection; dRh is None with ``reset_after``, drb None without rb."""
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = h0.shape[1]
    dt = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] dh = np.array(dhT, dtype=dt, order="C", copy=True)
    cdef floating[:, ::1] dy = np.array(dyT, dtype=dt, order="C", copy=True)
    cdef cnp.ndarray D = np.empty((T, B, R.shape[1]), dt), Dh = np.empty((T, B, u), dt)
    cdef cnp.ndarray dhm = np.empty((B, u), dt), dq = np.empty((B, u), dt)
    cdef cnp.ndarray dx = np.empty((B, u), dt)
    cdef Py_ssize_t FB
    packed, FB = _recurrent_operand(R, B, True)
    rh_arr, packed_h = _candidate_operand(Rh, B, True, dt, FB)
    cdef const floating[:, :, ::1] ph_ = np.ascontiguousarray(ph, dtype=dt)
    rm, mk = _rmask(rmask, B, u, dt), _mask(mask, T, B)
    cdef cb_intr intr
    cb_intr_init(&intr)
    cdef GruBwd a
    _seq_init(&a.s, dt, T, B, u, R.shape[1], &h0[0, 0], &R[0, 0], packed, FB, rm, mk, act, ract,
              &intr)
    a.dys, a.dh, a.dy = &dys[0, 0, 0], &dh[0, 0], &dy[0, 0]
    a.Rh, a.Whp = _address(rh_arr), _address(packed_h)
    a.reset_after, a.mix_masked = reset_after, mix_masked
    a.hs, a.gates, a.ph = &hs[0, 0, 0], &gates[0, 0, 0], &ph_[0, 0, 0]
    a.D, a.Dh, a.dhm, a.dq, a.dx = cnp.PyArray_DATA(D), cnp.PyArray_DATA(Dh), \
        cnp.PyArray_DATA(dhm), cnp.PyArray_DATA(dq), cnp.PyArray_DATA(dx)
    with nogil:
        _row_blocks_run(_gru_bwd_block, &a, B, 2.0 * T * B * 3 * u * u)
    check_interrupt(&intr)
    prev = _previous_states(np.asarray(hs), np.asarray(h0), rmask, dt)
    dR = _stacked_tn(prev, D, dt)
    dRh = None
    if not reset_after:
        # The candidate's product read r * hm.
        prev *= np.asarray(gates)[:, :, u:2 * u]
        dRh = _stacked_tn(prev, Dh, dt)
    drb = D.sum(axis=(0, 1)) if rb is not None else None
    return D[:, :, :u], D[:, :, u:2 * u], Dh, np.asarray(dh), np.asarray(dy), dR, dRh, drb
