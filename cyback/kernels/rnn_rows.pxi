# The row-block driver every cell's pass runs on (included by rnn_cell.pyx),
# and what the passes share inside their steps.
#
# Batch rows are independent sequences: _row_blocks_run gives each thread
# one block of rows, for which a cell's block function runs every step (its
# own products included); the threads meet once, at the end, not at every
# step (a descheduled thread delays only its rows, not every step of the
# others). A pass hands the driver its arguments as one struct (a Seq first,
# then its own arrays) and a block function that switches on the element
# type once per block: the loops inside are typed, with no call through a
# pointer. A struct holds no memoryview, so the arrays go by address, all
# C-contiguous: row b of step t of a (steps, B, w) array is at
# ``a + (t * B + b) * w``.
#
# Backward, every cell ends a step the same way: dh_{t-1} += (dz_t @ R^T) *
# rmask (_state_grad).


cdef struct Seq:
    # What every pass of a cell reads. The pointers are to the pass's element
    # type (float, or double with dbl).
    bint dbl
    Py_ssize_t T, B, u, NR      # steps, batch rows, units, R's columns
    const void *h0              # (B, u) initial state
    const void *R               # (u, NR) recurrent kernel
    const void *Wp              # R (R^T backward) packed for the product, or NULL: BLAS
    Py_ssize_t FB               # the packed operand's block width
    const void *rmask           # (B, u) recurrent dropout mask, or NULL
    const unsigned char *mask   # (T, B) Keras mask, or NULL
    int act, ract               # activation codes (ACTIVATIONS)
    cb_intr *intr               # Ctrl-C, polled at every step


ctypedef void (*block_fn)(const void *args, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil


cdef void _seq_init(Seq *s, dt, Py_ssize_t T, Py_ssize_t B, Py_ssize_t u, Py_ssize_t NR,
                    const void *h0, const void *R, packed, Py_ssize_t FB, rmask, mask, int act,
                    int ract, cb_intr *intr):
    """Fill s; packed: R's packed operand or None, rmask and mask: the
    C-contiguous arrays (_rmask, _mask) or None where absent."""
    s.dbl = dt is np.float64
    s.T, s.B, s.u, s.NR = T, B, u, NR
    s.h0, s.R, s.Wp, s.FB = h0, R, _address(packed), FB
    s.rmask = _address(rmask)
    s.mask = <const unsigned char*>_address(mask)
    s.act, s.ract, s.intr = act, ract, intr


cdef inline Py_ssize_t _row_blocks(double flops, Py_ssize_t B) noexcept nogil:
    """Blocks of batch rows (one per thread) for a sequence of ``flops``."""
    cdef Py_ssize_t n = threads_for(flops)
    if n > B:
        n = B if B > 0 else 1
    return n


cdef void _row_blocks_run(block_fn rows, const void *args, Py_ssize_t B,
                          double flops) noexcept nogil:
    """rows(args, b0, b1) over the B batch rows: one block per thread of a
    sequence of ``flops``, or all rows on the calling thread."""
    cdef Py_ssize_t ci, nchunk = _row_blocks(flops, B)
    cdef cb_tiles joined
    cdef double join = join_seconds()
    if nchunk <= 1:
        rows(args, 0, B)
        return
    # The thread done first with its rows spins for the others before the
    # region ends (include/cyback_tiles.h).
    cb_tiles_init(&joined)
    with parallel(num_threads=nchunk):
        for ci in prange(nchunk, schedule='static'):
            rows(args, ci * B // nchunk, (ci + 1) * B // nchunk)
        cb_tiles_join(&joined, cb_get_num_threads(), join)


cdef inline void _ring(bint keep, Py_ssize_t t, Py_ssize_t *ti, Py_ssize_t *tp,
                       Py_ssize_t *tg) noexcept nogil:
    """Where step t writes its states (ti), reads the previous ones (tp) and
    writes its gates (tg): the step itself, or without records (keep off) a
    ring of two steps for the states and one for the gates."""
    if keep:
        ti[0], tp[0], tg[0] = t, t - 1, t
    else:
        ti[0], tp[0], tg[0] = t & 1, (t - 1) & 1, 0


cdef inline const floating *_state_row(const floating *first, const floating *recs,
                                       Py_ssize_t t, Py_ssize_t tp, Py_ssize_t B, Py_ssize_t b,
                                       Py_ssize_t w) noexcept nogil:
    """Row b of the state step t starts from: of ``first`` (B rows of w) at
    step 0, else of step tp of the records ``recs``."""
    if t == 0:
        return first + b * w
    return recs + (tp * B + b) * w


cdef inline const floating *_recurrent_input(Py_ssize_t t, Py_ssize_t tp, Py_ssize_t b0,
                                             Py_ssize_t b1, Py_ssize_t B, Py_ssize_t u,
                                             const floating *h0, const floating *hs,
                                             const floating *rmask,
                                             floating *hm) noexcept nogil:
    """Rows b0..b1 of the recurrent product's left operand: h_{t-1} (h0 at
    step 0, else the states' step tp), times the recurrent dropout mask
    unless it is NULL (then written into hm, b1 - b0 rows of u)."""
    cdef Py_ssize_t b, j
    cdef const floating *hp = _state_row(h0, hs, t, tp, B, b0, u)
    if rmask == NULL:
        return hp
    for b in range(b0, b1):
        for j in range(u):
            hm[(b - b0) * u + j] = hp[(b - b0) * u + j] * rmask[b * u + j]
    return hm


cdef inline void _act_row(floating *p, Py_ssize_t n, int kind) noexcept nogil:
    """p[:n] = act(p[:n]) (vectorised loops in cyback_act.h)."""
    if floating is float:
        cb_act_row_f(p, n, kind)
    else:
        cb_act_row_d(p, n, kind)


cdef inline floating _dact(floating y, int kind) noexcept nogil:
    """Derivative of the activation, from its output ``y``."""
    if kind == 0:
        return 1 - y * y
    if kind == 1:
        return y * (1 - y)
    if kind == 2:
        return 0.2 if (y > 0 and y < 1) else 0
    return 1


cdef inline void _state_grad(Py_ssize_t b0, Py_ssize_t b1, Py_ssize_t u, Py_ssize_t G,
                             const floating *dz, const floating *R, const floating *Wp,
                             Py_ssize_t FB, const floating *rmask, floating *dh, floating *dhm,
                             const floating *dx) noexcept nogil:
    """The end of a backward step for rows b0..b1: dh_{t-1} += (dz_t @ R^T) *
    rmask. dz: the step's rows b0..b1 (of G); dh, dhm, dx and rmask (NULL
    without recurrent dropout): all B rows of u. Without dx, dhm is scratch.
    With dx (the GRU), dhm already holds the step's other terms of the masked
    state's gradient, the product adds onto them, and dx, those of the
    unmasked state, goes to dh too."""
    cdef Py_ssize_t i, n = b1 - b0
    dh += b0 * u
    dhm += b0 * u
    if rmask != NULL:
        rmask += b0 * u
    if dx == NULL and rmask == NULL:
        _rec_product(True, n, u, G, dz, R, Wp, FB, 1, dh)
        return
    _rec_product(True, n, u, G, dz, R, Wp, FB, 0 if dx == NULL else 1, dhm)
    if dx == NULL:
        for i in range(n * u):
            dh[i] += dhm[i] * rmask[i]
        return
    dx += b0 * u
    if rmask == NULL:
        for i in range(n * u):
            dh[i] += dhm[i] + dx[i]
    else:
        for i in range(n * u):
            dh[i] += dhm[i] * rmask[i] + dx[i]
