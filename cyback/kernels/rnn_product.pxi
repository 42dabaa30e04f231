# The recurrent product of every cell (included by rnn_cell.pyx): ``h @ R``
# per step, and ``dz @ R^T`` backward, on R packed once per sequence
# (include/cyback_rnn_product.h) or through BLAS (GEMV for a few rows, GEMM
# above), with the packing and the columns-of-R variants the units split
# reads (_pack_ld, _product_ld).


# Through BLAS, batches up to this size multiply by R one row at a time
# (GEMV): a GEMM call packs all of R first, which at batch 1 costs ten times
# the product itself.
DEF GEMV_ROWS = 4


cdef extern from "cyback_rnn_product.h" nogil:
    Py_ssize_t cb_rp_block(int dbl, Py_ssize_t N)
    void cb_rp_pack_f(const float* w, Py_ssize_t K, Py_ssize_t N, Py_ssize_t FB, float* wp)
    void cb_rp_pack_d(const double* w, Py_ssize_t K, Py_ssize_t N, Py_ssize_t FB, double* wp)
    void cb_rp_product_f(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const float* h,
                         const float* wp, Py_ssize_t FB, const float* base, float* out)
    void cb_rp_product_d(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const double* h,
                         const double* wp, Py_ssize_t FB, const double* base, double* out)
    void cb_rp_pack_ld_f(const float* w, Py_ssize_t K, Py_ssize_t N, Py_ssize_t ldw,
                         Py_ssize_t FB, float* wp)
    void cb_rp_pack_ld_d(const double* w, Py_ssize_t K, Py_ssize_t N, Py_ssize_t ldw,
                         Py_ssize_t FB, double* wp)
    void cb_rp_product_ld_f(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const float* h,
                            const float* wp, Py_ssize_t FB, const float* base, float* out,
                            Py_ssize_t ld)
    void cb_rp_product_ld_d(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const double* h,
                            const double* wp, Py_ssize_t FB, const double* base, double* out,
                            Py_ssize_t ld)


def _pack_product(W, Py_ssize_t FB=0):
    """W (K, N) packed for the recurrent product (include/cyback_rnn_product.h)
    as ``(packed, FB)``: packed once per sequence, the recurrent kernel is not
    re-packed by BLAS at every step."""
    W = np.ascontiguousarray(W)
    cdef bint dbl = W.dtype == np.float64
    cdef Py_ssize_t K = W.shape[0], N = W.shape[1]
    if FB == 0:
        FB = cb_rp_block(dbl, N)
    packed = np.empty(max(1, (N + FB - 1) // FB * FB * K), W.dtype)
    cdef float[::1] wf, pf
    cdef double[::1] wd, pd
    if W.size:
        if dbl:
            wd, pd = W.reshape(-1), packed
            cb_rp_pack_d(&wd[0], K, N, FB, &pd[0])
        else:
            wf, pf = W.reshape(-1), packed
            cb_rp_pack_f(&wf[0], K, N, FB, &pf[0])
    return packed, FB


def _packed_rows(const floating[:, ::1] h, W, base):
    """``h @ W (+ base)`` through the packed product (for tests)."""
    dt = np.float32 if floating is float else np.float64
    cdef Py_ssize_t FB
    packed, FB = _pack_product(np.asarray(W, dtype=dt))
    cdef Py_ssize_t B = h.shape[0], K = h.shape[1], N = W.shape[1]
    if W.shape[0] != K:
        raise ValueError("_packed_rows: shapes h %s, W %s do not agree"
                         % (np.shape(h), np.shape(W)))
    out = np.empty((B, N), dt)
    cdef floating[:, ::1] o = out
    cdef const floating[:, ::1] b_
    cdef const floating *bp = NULL
    if base is not None:
        b_ = np.ascontiguousarray(np.broadcast_to(base, (B, N)), dtype=dt)
        if B and N:
            bp = &b_[0, 0]
    cdef const floating *wp = <const floating*>_address(packed)
    cdef const floating *hp = NULL
    if B and N:
        hp = &o[0, 0]               # K = 0: no value of h is read
        if K:
            hp = &h[0, 0]
        _packed_product(B, K, N, hp, wp, FB, bp, &o[0, 0])
    return out


cpdef tuple _recurrent_operand(R, Py_ssize_t B, bint trans, Py_ssize_t FB=0):
    """(packed R, or R^T with ``trans``, and its block width) for a batch of
    B rows, or (None, 0) where the rows go to GEMV or BLAS. FB: the block
    width to pack in (0: the kernel set's width for R's columns)."""
    if B <= _TUNE["gemv_max_rows"] or not _TUNE["packed"]:
        return None, 0
    R = np.asarray(R)
    return _pack_product(R.T if trans else R, FB)


cdef const void* _address(arr):
    # the data of a C-contiguous ndarray the caller keeps alive, or NULL for
    # None (not arr.ctypes: a microsecond per call at batch 1)
    return NULL if arr is None else cnp.PyArray_DATA(<cnp.ndarray?>arr)


cdef inline void _packed_product(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const floating *h,
                                 const floating *Wp, Py_ssize_t FB, const floating *base,
                                 floating *out) noexcept nogil:
    """out = h @ W (+ base, shaped like out, unless NULL; it may be out): h
    (B, K), out (B, N), W packed by _pack_product."""
    if floating is float:
        cb_rp_product_f(B, K, N, h, Wp, FB, base, out)
    else:
        cb_rp_product_d(B, K, N, h, Wp, FB, base, out)


cdef inline void _rec_product_onto(Py_ssize_t B, Py_ssize_t u, Py_ssize_t G, const floating *h,
                                   const floating *R, const floating *Wp, Py_ssize_t FB,
                                   const floating *base, floating *out) noexcept nogil:
    """out = base + h @ R (see _rec_product): the packed kernel reads base as
    it writes out, the other paths copy it first."""
    if Wp != NULL:
        _packed_product(B, u, G, h, Wp, FB, base, out)
        return
    memcpy(out, base, B * G * sizeof(floating))
    _rec_product(False, B, u, G, h, R, Wp, FB, 1, out)


cdef inline void _rec_product(bint trans, Py_ssize_t B, Py_ssize_t u, Py_ssize_t G,
                              const floating *h, const floating *R, const floating *Wp,
                              Py_ssize_t FB, floating beta, floating *out) noexcept nogil:
    """out = h @ R + beta * out (h: (B, u), out: (B, G)), or with ``trans``
    out = h @ R^T + beta * out (h: (B, G), out: (B, u)); all row-major; beta
    is 0 or 1. Wp: the product's right operand (R, or R^T with ``trans``)
    packed by _pack_product, or NULL for BLAS."""
    cdef int m = <int>G, n = <int>u, one = 1, b
    cdef char op = b'T' if trans else b'N'
    cdef floating alpha = 1
    if Wp != NULL:
        if trans:
            _packed_product(B, G, u, h, Wp, FB, out if beta != 0 else NULL, out)
        else:
            _packed_product(B, u, G, h, Wp, FB, out if beta != 0 else NULL, out)
        return
    if B > GEMV_ROWS:
        if trans:
            gemm(False, True, <int>B, <int>u, <int>G, alpha, h, <int>G, R, <int>G, beta,
                 out, <int>u)
        else:
            gemm(False, False, <int>B, <int>G, <int>u, alpha, h, <int>u, R, <int>G, beta,
                 out, <int>G)
        return
    # Row-major R (u, G) is column-major R^T (G, u): 'N' gives R^T h_b, 'T' gives R x_b.
    for b in range(B):
        if floating is float:
            sgemv(&op, &m, &n, &alpha, <float*>R, &m,
                  <float*>(h + b * (G if trans else u)), &one, &beta,
                  out + b * (u if trans else G), &one)
        else:
            dgemv(&op, &m, &n, &alpha, <double*>R, &m,
                  <double*>(h + b * (G if trans else u)), &one, &beta,
                  out + b * (u if trans else G), &one)


cdef inline void _pack_ld(const floating *w, Py_ssize_t K, Py_ssize_t N, Py_ssize_t ldw,
                          Py_ssize_t FB, floating *wp) noexcept nogil:
    """wp = the N columns of w from its first (K rows, ldw apart) packed for
    _product_ld: a thread's columns of each gate in the units split."""
    if floating is float:
        cb_rp_pack_ld_f(w, K, N, ldw, FB, wp)
    else:
        cb_rp_pack_ld_d(w, K, N, ldw, FB, wp)


cdef inline void _product_ld(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const floating *h,
                             const floating *Wp, Py_ssize_t FB, const floating *base,
                             floating *out, Py_ssize_t ld) noexcept nogil:
    """out = h @ W (+ base) for W packed by _pack_ld: B rows of N columns,
    out's and base's rows ld apart (N of a gate's columns inside wider rows)."""
    if floating is float:
        cb_rp_product_ld_f(B, K, N, h, Wp, FB, base, out, ld)
    else:
        cb_rp_product_ld_d(B, K, N, h, Wp, FB, base, out, ld)

