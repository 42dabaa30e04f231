# The input projection inside the steps (included by rnn_cell.pyx).
#
# An LSTM's or GRU's input projection zx = x @ W + b is a product over all
# steps before the loop; on the row blocks each thread then reads its rows
# of zx from wherever the product's threads wrote them, often another
# core's cache, which is much slower than reading its own.
# With a Proj, each thread projects its own rows at the start of each step
# into a one-step ring of zx instead (lstm_forward_projected,
# gru_forward_projected): x, W and the ring stay in its cache, and zx over
# all steps is never written.


cdef struct Proj:
    const void *x           # x[t, b, :] at x + t * st + b * sb (elements), rows contiguous
    Py_ssize_t st, sb, width, T  # width: I, the input's last axis
    const void *W           # W (I, G) packed by _pack_product with block width FB
    Py_ssize_t FB
    const void *b           # the bias (G,), or NULL
    void *scratch           # per thread: rows x I for the rows of x (B * I values)


cdef inline void _project(const Proj *pj, Py_ssize_t t, Py_ssize_t b0, Py_ssize_t b1,
                          Py_ssize_t G, floating *xs, floating *out) noexcept nogil:
    """out (b1 - b0 rows of G) = x[t, b0:b1] @ W + b: the sum over k in
    order, then the bias, as the separate product's. xs: scratch for the
    rows of x (b1 - b0 rows of I), which the product reads I apart."""
    cdef const floating *x = <const floating*>pj.x
    cdef const floating *bias = <const floating*>pj.b
    cdef Py_ssize_t I = pj.width, b
    for b in range(b0, b1):
        memcpy(xs + (b - b0) * I, x + t * pj.st + b * pj.sb, I * sizeof(floating))
        if bias != NULL:
            memcpy(out + (b - b0) * G, bias, G * sizeof(floating))
    _packed_product(b1 - b0, I, G, xs, <const floating*>pj.W, pj.FB,
                    out if bias != NULL else NULL, out)


cdef tuple _proj_setup(Proj *pj, x, W, xb, Py_ssize_t B, Py_ssize_t G, dt, fname):
    """Fill pj for zx = x @ W (+ xb) of G columns, checking the arguments;
    returns the arrays pj points into (the caller keeps them alive)."""
    cdef Py_ssize_t isz = np.dtype(dt).itemsize
    x = np.asarray(x)
    if x.ndim != 3 or x.shape[1] != B or x.dtype != dt or x.size and (
            (x.shape[2] > 1 and x.strides[2] != isz) or any(st % isz for st in x.strides)):
        raise ValueError("%s: x must be a (T, %d, I) %s array with its last axis contiguous, "
                         "got %s %s with strides %s" % (fname, B, np.dtype(dt).name,
                                                        x.shape, x.dtype, x.strides))
    W = np.ascontiguousarray(W, dt)
    if W.ndim != 2 or W.shape[0] != x.shape[2] or W.shape[1] != G:
        raise ValueError("%s: W must be (%d, %d), got %s" % (fname, x.shape[2], G, W.shape))
    if xb is not None:
        xb = np.ascontiguousarray(xb, dt)
        if xb.shape != (G,):
            raise ValueError("%s: xb must be (%d,), got %s" % (fname, G, xb.shape))
    packed, FB = _pack_product(W)
    scratch = np.empty(max(1, B * x.shape[2]), dt)
    pj.x = _address(x) if x.size else NULL
    pj.st, pj.sb = x.strides[0] // isz, x.strides[1] // isz
    pj.width, pj.T = x.shape[2], x.shape[0]
    pj.W, pj.FB, pj.b = _address(packed), FB, _address(xb)
    pj.scratch = cnp.PyArray_DATA(scratch)
    return x, packed, xb, scratch


cdef _projected_whole(const Proj *pj, const floating[:, :, ::1] ring):
    """The projection of every step and row, (T, B, G) for a ring of (1, B, G):
    the units split reads every row of zx at every step, so it projects
    first, by the same kernel."""
    cdef Py_ssize_t T = pj.T, B = ring.shape[1], G = ring.shape[2], t
    dt = np.float32 if floating is float else np.float64
    cdef floating[:, :, ::1] full = np.empty((T, B, G), dt)
    if T and B:
        with nogil:
            for t in range(T):
                _project(pj, t, 0, B, G, <floating*>pj.scratch, &full[t, 0, 0])
    return full
