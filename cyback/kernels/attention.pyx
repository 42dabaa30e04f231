# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Scaled dot-product attention in one pass per (batch, head, block of query
rows): ``softmax(q k^T + bias) v`` with the heads read where a projection
left them.

``q`` is (B, T, H, D), ``k`` (B, S, H, D) and ``v`` (B, S, H, Dv), the layout
of Keras's MultiHeadAttention after its projections, which may be views (the
three slices of one joined projection): the products take a head's rows at
their stride (float32 through the register tiles of include/cyback_attention.h,
which transpose only k into scratch; float64, and CPUs without AVX2, through
BLAS's leading dimensions), so no head is copied out, and the output is
written as (B, T, H, Dv) for the output projection. The scores of a block of query rows (at most about 64 kB) are
formed, biased, turned into probabilities and multiplied by ``v`` while in
cache; the (B, H, T, S) scores are never written. Blocks are independent, so
the result does not depend on the thread count.
"""
import numpy as np
cimport cython
cimport cython.parallel
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdlib cimport free, malloc

from cyback.kernels import settings as _settings
from cyback.kernels._blas cimport floating, gemm
from cyback.kernels.runtime cimport threads_for
from cyback.kernels._softmax_row cimport softmax_row_d
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt

cnp.import_array()

cdef extern from "cyback_vmath.h" nogil:
    void cb_vm_softmax_row_f(const float* x, float* y, Py_ssize_t n)

cdef extern from "cyback_attention.h" nogil:
    Py_ssize_t CB_ATT_PAD(Py_ssize_t n)
    int cb_att_scores_f(const float* q, Py_ssize_t qt, const float* k, Py_ssize_t ks,
                        Py_ssize_t n, Py_ssize_t S, Py_ssize_t D, float* kt, float* scores)
    int cb_att_values_f(const float* p, Py_ssize_t n, Py_ssize_t S, const float* v,
                        Py_ssize_t vs, Py_ssize_t Dv, float* out, Py_ssize_t ldo)
    int cb_simd_use_avx2(int on)
    int cb_simd_use_avx512(int on)
    void cb_simd_set_default_cap(int cap)


cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)


def _use_avx2(bint on):
    """Run the float32 products' and softmax's AVX2 set when the CPU has it
    (the default), or BLAS and the baseline softmax (for tests). Returns
    whether AVX2 now runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let the float32 AVX-512 set run when the CPU has it (the default), or
    cap it at AVX2 (for tests). Returns whether AVX-512 now runs."""
    return bool(cb_simd_use_avx512(on))

# the scores of one block of query rows stay about this size (L2-resident)
cdef Py_ssize_t BLOCK_BYTES = 64 * 1024


cdef struct Layout:
    Py_ssize_t B, T, S, H, D, Dv, rows          # rows: query rows per block
    Py_ssize_t qb, qt, qh, kb, ks, kh, vb, vs, vh   # strides in elements
    Py_ssize_t bb, bh                           # the bias's batch and head strides (0: broadcast)


cdef void _block(const floating* q, const floating* k, const floating* v,
                 const floating* bias, floating* out, const Layout* L,
                 Py_ssize_t task, floating* scores) noexcept nogil:
    cdef Py_ssize_t blocks = (L.T + L.rows - 1) // L.rows
    cdef Py_ssize_t bh = task // blocks, t0 = (task % blocks) * L.rows
    cdef Py_ssize_t b = bh // L.H, h = bh % L.H
    cdef Py_ssize_t r, j, n = L.rows if t0 + L.rows <= L.T else L.T - t0
    cdef const floating* qp = q + b * L.qb + h * L.qh + t0 * L.qt
    cdef const floating* kp = k + b * L.kb + h * L.kh
    cdef const floating* vp = v + b * L.vb + h * L.vh
    cdef floating* op = out + ((b * L.T + t0) * L.H + h) * L.Dv
    cdef const floating* br
    cdef floating* row
    # (float32: k^T in the scratch past the scores, the products in registers)
    if not (floating is float and cb_att_scores_f(qp, L.qt, kp, L.ks, n, L.S, L.D,
                                                  scores + L.rows * L.S, scores)):
        gemm(False, True, <int>n, <int>L.S, <int>L.D, <floating>1, qp, <int>L.qt,
             kp, <int>L.ks, <floating>0, scores, <int>L.S)
    for r in range(n):
        row = scores + r * L.S
        if bias != NULL:
            br = bias + b * L.bb + h * L.bh + (t0 + r) * L.S
            for j in range(L.S):
                row[j] = row[j] + br[j]
        if floating is float:
            cb_vm_softmax_row_f(row, row, L.S)
        else:
            softmax_row_d(row, row, L.S)
    if not (floating is float and cb_att_values_f(scores, n, L.S, vp, L.vs, L.Dv, op,
                                                  L.H * L.Dv)):
        gemm(False, False, <int>n, <int>L.Dv, <int>L.S, <floating>1, scores, <int>L.S,
             vp, <int>L.vs, <floating>0, op, <int>(L.H * L.Dv))


cdef inline Py_ssize_t _scratch(const Layout* L) noexcept nogil:
    # a block's scores, then the transposed k of the float32 products
    return L.rows * L.S + L.D * CB_ATT_PAD(L.S)


cdef void _run(const floating* q, const floating* k, const floating* v,
               const floating* bias, floating* out, const Layout* L, int threads,
               cb_intr* intr, int* nomem) noexcept nogil:
    cdef Py_ssize_t tasks = L.B * L.H * ((L.T + L.rows - 1) // L.rows), i
    cdef floating* scores = NULL
    if threads > 1:
        with cython.parallel.parallel(num_threads=threads):
            scores = <floating*>malloc(_scratch(L) * sizeof(floating))
            if scores == NULL:
                nomem[0] = 1
            for i in prange(tasks, schedule='static'):
                if scores != NULL and not cb_intr_poll(intr):
                    _block(q, k, v, bias, out, L, i, scores)
            free(scores)
    else:
        scores = <floating*>malloc(_scratch(L) * sizeof(floating))
        if scores == NULL:
            nomem[0] = 1
            return
        for i in range(tasks):
            if cb_intr_poll(intr):
                break
            _block(q, k, v, bias, out, L, i, scores)
        free(scores)


def _strides(a, Py_ssize_t itemsize):
    """``a``'s strides in elements, or None where BLAS cannot read it in place
    (its last axis not unit-stride, a stride not a whole number of elements,
    or its rows overlapping)."""
    cdef Py_ssize_t s
    out = []
    for s in a.strides:
        if s < 0 or s % itemsize:
            return None
        out.append(s // itemsize)
    if a.shape[3] > 1 and out[3] != 1:
        return None
    if a.shape[1] <= 1:
        out[1] = max(1, a.shape[3])     # one row: BLAS only checks its leading dimension
    elif out[1] < max(1, a.shape[3]):
        return None
    return out


def _readable(name, a, dtype):
    if not isinstance(a, np.ndarray):
        raise TypeError("attention: %s must be a NumPy array, got %s" % (name, type(a).__name__))
    if a.ndim != 4:
        raise ValueError("attention: %s must be 4-D (batch, positions, heads, channels), got "
                         "shape %s" % (name, a.shape))
    if a.dtype != dtype:
        raise TypeError("attention: q, k and v must have one dtype, got %s for %s and %s for q"
                        % (a.dtype, name, dtype))
    if a.size == 0:     # nothing is read; BLAS still wants leading dimensions >= 1
        return a, [1, max(1, a.shape[2] * a.shape[3]), max(1, a.shape[3]), 1]
    st = _strides(a, a.itemsize)
    if st is None or any(n > 2 ** 31 - 1 for n in st):
        a = np.ascontiguousarray(a)
        st = _strides(a, a.itemsize)
    return a, st


def attention(q, k, v, bias=None):
    """``softmax(q_bh @ k_bh^T + bias_bh) @ v_bh`` for every batch b and head h,
    as a new (B, T, H, Dv) array.

    q: (B, T, H, D); k: (B, S, H, D); v: (B, S, H, Dv), float32 or float64
    (views taken in place where their last axis is contiguous). bias: None or
    an array broadcasting to (B, H, T, S) with its last two axes (T, S), added
    to the scores before the softmax (a mask's large negative values).
    """
    cdef Layout L
    cdef cb_intr intr
    cdef cnp.ndarray out
    cdef const void* bp = NULL
    cdef int threads, nomem = 0
    if not isinstance(q, np.ndarray):
        raise TypeError("attention: q must be a NumPy array, got %s" % type(q).__name__)
    if q.dtype != np.float32 and q.dtype != np.float64:
        raise TypeError("attention: float32 or float64 only, got %s" % q.dtype)
    qa, qs = _readable("q", q, q.dtype)
    ka, ks = _readable("k", k, q.dtype)
    va, vs = _readable("v", v, q.dtype)
    B, T, H, D = qa.shape[0], qa.shape[1], qa.shape[2], qa.shape[3]
    S, Dv = ka.shape[1], va.shape[3]
    if ka.shape[0] != B or va.shape[0] != B or ka.shape[2] != H or va.shape[2] != H \
            or ka.shape[3] != D or va.shape[1] != S:
        raise ValueError("attention: shapes do not match: q %s, k %s, v %s (expected q (B, T, "
                         "H, D), k (B, S, H, D), v (B, S, H, Dv))" % (q.shape, k.shape, v.shape))
    L.bb = L.bh = 0
    if bias is not None:
        ba = np.asarray(bias, dtype=q.dtype)
        if ba.ndim > 4 or ba.ndim < 2:
            raise ValueError("attention: bias must broadcast to (B, H, T, S) = %s, got shape %s"
                             % ((B, H, T, S), ba.shape))
        ba = ba.reshape((1,) * (4 - ba.ndim) + ba.shape)
        if ba.shape[2] != T or ba.shape[3] != S or ba.shape[0] not in (1, B) \
                or ba.shape[1] not in (1, H):
            raise ValueError("attention: bias must have the scores' last two axes (T, S) and "
                             "broadcast to (B, H, T, S) = %s, got shape %s"
                             % ((B, H, T, S), ba.shape))
        ba = np.ascontiguousarray(ba)
        L.bb = 0 if ba.shape[0] == 1 else ba.shape[1] * T * S
        L.bh = 0 if ba.shape[1] == 1 else T * S
        bp = cnp.PyArray_DATA(<cnp.ndarray>ba)
    out = np.empty((B, T, H, Dv), dtype=q.dtype)
    if out.size == 0:
        return out
    if S == 0:              # an empty sum of values
        out[...] = 0
        return out
    L.B, L.T, L.S, L.H, L.D, L.Dv = B, T, S, H, D, Dv
    L.qb, L.qt, L.qh = qs[0], qs[1], qs[2]
    L.kb, L.ks, L.kh = ks[0], ks[1], ks[2]
    L.vb, L.vs, L.vh = vs[0], vs[1], vs[2]
    L.rows = max(1, min(T, BLOCK_BYTES // (S * q.itemsize)))
    threads = threads_for(2.0 * B * H * T * S * (D + Dv))
    cb_intr_init(&intr)
    cdef const void* qp = cnp.PyArray_DATA(<cnp.ndarray>qa)
    cdef const void* kp = cnp.PyArray_DATA(<cnp.ndarray>ka)
    cdef const void* vp = cnp.PyArray_DATA(<cnp.ndarray>va)
    cdef void* outp = cnp.PyArray_DATA(out)
    cdef bint single = q.dtype == np.float32
    with nogil:
        if single:
            _run[float](<const float*>qp, <const float*>kp, <const float*>vp,
                        <const float*>bp, <float*>outp, &L, threads, &intr, &nomem)
        else:
            _run[double](<const double*>qp, <const double*>kp, <const double*>vp,
                         <const double*>bp, <double*>outp, &L, threads, &intr, &nomem)
    check_interrupt(&intr)
    if nomem:
        raise MemoryError("attention: no memory for a block of %d x %d scores" % (L.rows, S))
    return out


cdef bint _same_layout(object a, int typenum, tuple shape, tuple strides):
    # an aligned ndarray of this type, shape and strides (in bytes)
    cdef cnp.ndarray arr
    cdef int i
    if not isinstance(a, cnp.ndarray):
        return False
    arr = <cnp.ndarray> a
    if cnp.PyArray_TYPE(arr) != typenum or cnp.PyArray_NDIM(arr) != 4 or \
            not cnp.PyArray_ISALIGNED(arr) or not cnp.PyArray_ISNOTSWAPPED(arr):
        return False
    for i in range(4):
        if cnp.PyArray_DIM(arr, i) != <Py_ssize_t> shape[i] or \
                cnp.PyArray_STRIDE(arr, i) != <Py_ssize_t> strides[i]:
            return False
    return True


@cython.final
cdef class AttentionCall:
    """``call(q, k, v)``: attention(q, k, v) without a bias for arrays of the
    shapes, dtype and strides it was made for (``attention_call``: views of a
    joined projection included), without the entry's checks and
    conversions; None when the arrays do not fit (a bound plan's step then
    runs its op)."""
    cdef Layout L
    cdef tuple shapes, strides
    cdef int typenum
    cdef double work
    cdef cnp.npy_intp dims[4]

    def __call__(self, q, k, v):
        cdef cb_intr intr
        cdef int threads, nomem = 0
        if not (_same_layout(q, self.typenum, self.shapes[0], self.strides[0]) and
                _same_layout(k, self.typenum, self.shapes[1], self.strides[1]) and
                _same_layout(v, self.typenum, self.shapes[2], self.strides[2])):
            return None
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(4, self.dims, self.typenum, 0)
        cdef const void* qp = cnp.PyArray_DATA(<cnp.ndarray> q)
        cdef const void* kp = cnp.PyArray_DATA(<cnp.ndarray> k)
        cdef const void* vp = cnp.PyArray_DATA(<cnp.ndarray> v)
        cdef void* outp = cnp.PyArray_DATA(out)
        threads = threads_for(self.work)
        cb_intr_init(&intr)
        with nogil:
            if self.typenum == cnp.NPY_FLOAT:
                _run[float](<const float*>qp, <const float*>kp, <const float*>vp, NULL,
                            <float*>outp, &self.L, threads, &intr, &nomem)
            else:
                _run[double](<const double*>qp, <const double*>kp, <const double*>vp, NULL,
                             <double*>outp, &self.L, threads, &intr, &nomem)
        check_interrupt(&intr)
        if nomem:
            raise MemoryError("attention: no memory for a block of %d x %d scores"
                              % (self.L.rows, self.L.S))
        return out


def attention_call(q, k, v):
    """An AttentionCall for arrays like ``q``, ``k``, ``v`` (as attention
    takes them, without a bias), or None where attention would copy one of
    them first or has nothing to compute (an empty size)."""
    cdef AttentionCall call = AttentionCall()
    if not all(isinstance(a, np.ndarray) and a.ndim == 4 for a in (q, k, v)) or \
            q.dtype not in (np.float32, np.float64) or k.dtype != q.dtype or \
            v.dtype != q.dtype or 0 in q.shape or 0 in k.shape or 0 in v.shape:
        return None
    sts = [_strides(a, a.itemsize) for a in (q, k, v)]
    if any(st is None or any(n > 2 ** 31 - 1 for n in st) for st in sts):
        return None
    qs, ks, vs = sts
    B, T, H, D = q.shape
    S, Dv = k.shape[1], v.shape[3]
    if k.shape != (B, S, H, D) or v.shape != (B, S, H, Dv):
        return None
    call.L.bb = call.L.bh = 0
    call.L.B, call.L.T, call.L.S, call.L.H, call.L.D, call.L.Dv = B, T, S, H, D, Dv
    call.L.qb, call.L.qt, call.L.qh = qs[0], qs[1], qs[2]
    call.L.kb, call.L.ks, call.L.kh = ks[0], ks[1], ks[2]
    call.L.vb, call.L.vs, call.L.vh = vs[0], vs[1], vs[2]
    call.L.rows = max(1, min(T, BLOCK_BYTES // (S * q.itemsize)))
    call.work = 2.0 * B * H * T * S * (D + Dv)
    call.shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
    call.strides = (tuple(q.strides), tuple(k.strides), tuple(v.strides))
    call.typenum = cnp.NPY_FLOAT if q.dtype == np.float32 else cnp.NPY_DOUBLE
    call.dims[0], call.dims[1], call.dims[2], call.dims[3] = B, T, H, Dv
    return call
