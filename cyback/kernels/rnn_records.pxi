# The arrays around a pass (included by rnn_cell.pyx): the records a forward
# pass returns, the masks as the kernels read them, and the recurrent
# kernel's gradient, one GEMM over all steps after a backward pass.


cdef cnp.ndarray _steps(bint keep, Py_ssize_t ring, Py_ssize_t T, Py_ssize_t B,
                       Py_ssize_t width, dt):
    """A (T, B, width) record of every step, or with ``keep`` off a ring of
    ``ring`` steps."""
    return _empty3(T if keep else ring, B, width, dt)


cdef inline cnp.ndarray _empty3(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c, dt):
    # np.empty((a, b, c), dt) without its argument parsing (0.4 of the
    # microseconds a batch-1 call spends around its kernel)
    cdef cnp.npy_intp dims[3]
    dims[0], dims[1], dims[2] = a, b, c
    return cnp.PyArray_EMPTY(3, dims, cnp.NPY_FLOAT if dt is np.float32 else cnp.NPY_DOUBLE, 0)


cpdef _rmask(rmask, B, u, dt):
    """The recurrent dropout mask as a C-contiguous (B, u) array, or None."""
    if rmask is None:
        return None
    return np.array(np.broadcast_to(rmask, (B, u)), dtype=dt, order="C")


cpdef _mask(mask, T, B):
    """The Keras mask as a C-contiguous (T, B) uint8 array, or None."""
    if mask is None:
        return None
    return np.ascontiguousarray(np.broadcast_to(mask, (T, B)), dtype=np.uint8)


def _recurrent_grad(hs, h0, rmask, dz, dt):
    """``sum_t (h_{t-1} * rmask)^T dz_t``: one GEMM over all steps."""
    return _stacked_tn(_previous_states(hs, h0, rmask, dt), dz, dt)


def _previous_states(hs, h0, rmask, dt):
    """(T, B, u) stack of each step's ``h_{t-1} * rmask``."""
    T = hs.shape[0]
    prev = np.empty(hs.shape, dt)
    if T:
        prev[0] = h0
        prev[1:] = hs[:T - 1]
    if rmask is not None:
        prev *= rmask
    return prev


def _stacked_tn(a, b, dt):
    """``sum_t a_t^T b_t`` over (T, B, .) stacks as one GEMM."""
    T, B, u = a.shape
    out = np.zeros((u, b.shape[2]), dt)
    if T * B and u:
        _gemm_tn(a.reshape(T * B, u), np.ascontiguousarray(b).reshape(T * B, b.shape[2]), out)
    return out


# Column blocks of the recurrent kernel's gradient, one GEMM each, spread over
# the OpenMP threads; fixed, so the result does not depend on the thread count.
DEF DR_BLOCKS = 4


def _gemm_tn(const floating[:, ::1] a, const floating[:, ::1] b, floating[:, ::1] out):
    """``out = a^T @ b`` through BLAS (one thread each), column blocks in parallel."""
    cdef Py_ssize_t n = b.shape[1], blk, c0, c1
    cdef Py_ssize_t width = (n + DR_BLOCKS - 1) // DR_BLOCKS
    cdef int nt = threads_for(2.0 * a.shape[0] * a.shape[1] * n)
    for blk in prange(DR_BLOCKS, nogil=True, schedule='static', num_threads=nt):
        c0 = blk * width
        c1 = c0 + width if c0 + width < n else n
        if c1 > c0:
            gemm(True, False, <int>a.shape[1], <int>(c1 - c0), <int>a.shape[0], <floating>1,
                 &a[0, 0], <int>a.shape[1], &b[0, c0], <int>n, <floating>0, &out[0, c0],
                 <int>n)
