"""Matrix products on the OpenMP thread pool: ``matmul`` (one GEMM split across
threads), ``small_k_product`` (a product with a short inner axis, run as the
1x1 convolution it is), the small dense layers' kernels and ``batch_gemm``
(the kernel behind ``batch_dot``).

cyback keeps BLAS single-threaded and does all its parallelism on OpenMP:
two pools on the same cores slow each other down even when they never run at
once, because idle workers of one spin while the other works (a small
convnet's training step runs several times slower with both pools at full
size; docs/performance.md, "One thread pool"). So a large product is split
here into one single-threaded GEMM per thread.
"""
from cyback.kernels import settings as _settings
import numpy as np
cimport cython
cimport numpy as cnp
from cython.parallel cimport prange
from libc.limits cimport INT_MAX

from cyback.kernels._blas cimport floating, gemm
from cyback.kernels.runtime cimport team_done, team_parts, threads_for
from cyback.kernels._arrays cimport fits, fits_layout
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt
from cyback.kernels.conv import forward_call

cnp.import_array()

# Below this many multiply-adds per matrix, OpenMP over the batch beats
# splitting each matrix across threads in turn (benchmarks/bench_linalg.py
# measures both sides of the cutoff).
cdef long SMALL_GEMM = 256 * 256 * 256
# A large matmul runs as row blocks of about this many flops (tens of ms), so
# that Ctrl-C is seen between blocks.
cdef double CHUNK_FLOPS = 2.0 ** 31


cdef void _chunked_gemm(bint ta, bint tb, int m, int n, int k, const floating* a, int lda,
                        const floating* b, int ldb, floating beta, floating* c, int ldc,
                        int parts, int nt, cb_intr* intr) noexcept nogil:
    """_split_gemm over blocks of rows of C (fixed by the shapes), polling for
    Ctrl-C between blocks."""
    cdef int rows = <int>(CHUNK_FLOPS / (2.0 * n * k)), r0, mr
    if rows < 64 * parts:
        rows = 64 * parts
    r0 = 0
    while r0 < m:
        if cb_intr_poll(intr):
            return
        mr = m - r0 if m - r0 < rows else rows
        _split_gemm(ta, tb, mr, n, k, a + (r0 if ta else <long>r0 * lda), lda, b, ldb, beta,
                    c + <long>r0 * ldc, ldc, parts, nt)
        r0 += mr


cdef void _split_gemm(bint ta, bint tb, int m, int n, int k, const floating* a, int lda,
                      const floating* b, int ldb, floating beta, floating* c, int ldc,
                      int parts, int nt) noexcept nogil:
    """C[m, n] = op(A) @ op(B) + beta * C (row-major) as ``parts``
    single-threaded GEMMs over blocks of rows of C (or of columns when C is
    short and wide, batch 1), run on ``nt`` threads. BLAS rounds an element
    differently with the block it falls in, so the blocks depend on
    ``parts`` (the shapes and the thread setting) and never on ``nt`` (the
    team's state)."""
    cdef int t
    if parts <= 1:
        gemm(ta, tb, m, n, k, <floating>1, a, lda, b, ldb, beta, c, ldc)
        return
    if nt <= 1:
        for t in range(parts):
            _gemm_part(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, t, parts)
        return
    for t in prange(parts, schedule='static', num_threads=nt):
        _gemm_part(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, t, parts)


cdef inline void _gemm_part(bint ta, bint tb, int m, int n, int k, const floating* a, int lda,
                            const floating* b, int ldb, floating beta, floating* c, int ldc,
                            int t, int parts) noexcept nogil:
    """Part ``t`` of ``parts`` of _split_gemm's product."""
    cdef int lo, hi
    if m >= n or m >= 4 * parts:
        lo = <int>((<long>m * t) // parts)
        hi = <int>((<long>m * (t + 1)) // parts)
        if hi > lo:
            # Rows lo:hi of op(A): row offset when A is stored as is,
            # column offset when it is stored transposed.
            gemm(ta, tb, hi - lo, n, k, <floating>1,
                 a + (lo if ta else <long>lo * lda), lda, b, ldb, beta,
                 c + <long>lo * ldc, ldc)
    else:
        lo = <int>((<long>n * t) // parts)
        hi = <int>((<long>n * (t + 1)) // parts)
        if hi > lo:
            gemm(ta, tb, m, hi - lo, k, <floating>1, a, lda,
                 b + (<long>lo * ldb if tb else lo), ldb, beta, c + lo, ldc)


def _operand(x):
    """(C-contiguous buffer, transposed?) for a 2-D array, copying only when
    neither x nor x.T is C-contiguous."""
    if x.flags.c_contiguous:
        return x, False
    if x.flags.f_contiguous:
        return x.T, True
    return np.ascontiguousarray(x), False


cdef inline double _matmul_work(double m, double n, double k) noexcept nogil:
    # A product of a few rows (batch-1 Dense layers) streams B once: its
    # cost is B's size, not the flops. Larger products count a quarter of
    # their flops against the cutoff: a sleeping team's wake-up outweighs the
    # split of a small product.
    return 0.5 * m * n * k if m > 4 else n * k


def matmul(a, b, bias=None):
    """a @ b (+ bias, a vector added to every row) for 2-D float32/float64
    arrays (either may be a transposed view), split across the OpenMP threads
    when the product is large. The bias is C's initial value: BLAS then
    accumulates onto it, with no pass of its own."""
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        raise TypeError("matmul: expected two NumPy arrays, got %s and %s"
                        % (type(a).__name__, type(b).__name__))
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError("matmul: expected 2-D arrays, got shapes %s and %s" % (a.shape, b.shape))
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        raise TypeError("matmul: expected two float32 or two float64 arrays, got %s and %s"
                        % (a.dtype, b.dtype))
    cdef int m = a.shape[0], k = a.shape[1], n = b.shape[1]
    cdef bint ta, tb
    if b.shape[0] != k:
        raise ValueError("matmul: cannot multiply shapes %s and %s" % (a.shape, b.shape))
    if bias is not None and (np.shape(bias) != (n,) or np.asarray(bias).dtype != a.dtype):
        raise ValueError("matmul: bias must be a %s vector of %d, got %s %s"
                         % (a.dtype, n, np.asarray(bias).dtype, np.shape(bias)))
    out = np.empty((m, n), dtype=a.dtype)
    if m == 0 or n == 0:
        return out
    if bias is not None:
        out[...] = bias
    elif k == 0:
        out[...] = 0
    if k == 0:
        return out
    a, ta = _operand(a)
    b, tb = _operand(b)
    cdef double work = _matmul_work(m, n, k)
    cdef int parts = team_parts(work), nt = threads_for(work)
    cdef float[:, ::1] af, bf, of
    cdef double[:, ::1] ad, bd, od
    cdef cb_intr intr
    cb_intr_init(&intr)
    if out.dtype == np.float32:
        af, bf, of = _writable(a), _writable(b), out
        with nogil:
            _chunked_gemm[float](ta, tb, m, n, k, &af[0, 0], af.shape[1], &bf[0, 0],
                                 bf.shape[1], 1 if bias is not None else 0, &of[0, 0], n, parts,
                                 nt, &intr)
    else:
        ad, bd, od = _writable(a), _writable(b), out
        with nogil:
            _chunked_gemm[double](ta, tb, m, n, k, &ad[0, 0], ad.shape[1], &bd[0, 0],
                                  bd.shape[1], 1 if bias is not None else 0, &od[0, 0], n, parts,
                                  nt, &intr)
    team_done(nt)
    check_interrupt(&intr)
    return out


# Products a @ b with a short inner axis through the 1x1 convolution kernels
# (small_k_product): (M, K, F, has_bias) -> that shape's ForwardCall.
_PRODUCTS = {}


@cython.wraparound(True)
@cython.boundscheck(True)
def small_k_product(a, b, bias=None):
    """a @ b (+ bias along the last axis) for a C-contiguous float32 (M, K)
    matrix a with a short inner axis and many rows, and a C-contiguous
    (K, F) b, as the 1x1 convolution of M pixels it is; None when the
    product is not of that kind (the caller then runs its GEMM).

    BLAS's packed GEMM spends as long packing and writing (M, F) as it
    multiplies when K is this short; the 1x1 kernels (the direct kernel, or
    where it decides so, GEMM tiles) read a in place and add the bias in
    registers (an LSTM's input projection over all steps is such a
    product). A product of few rows keeps the GEMM, which is faster there
    (benchmarks/bench_linalg.py, "matmul / small_k"). Results do not depend
    on the thread count."""
    if a.ndim != 2 or b.ndim != 2 or a.dtype != np.float32 or b.dtype != np.float32 or \
            not a.flags.c_contiguous or not b.flags.c_contiguous:
        return None
    M, K, F = a.shape[0], a.shape[1], b.shape[1]
    if K > 64 or K < 1 or M < 512 or F < 16 or b.shape[0] != K:
        return None
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (F,)
                             or not bias.flags.c_contiguous):
        return None
    key = (M, K, F, bias is not None)
    known = _PRODUCTS.get(key)
    if known is None:
        rows = M // _product_row(M)
        shape = (rows, M // rows, K)
        known = (forward_call(shape, (1, K, F), (1,), (1,), [(0, 0)], True, np.float32,
                              has_bias=bias is not None), shape)
        if len(_PRODUCTS) >= 64:
            _PRODUCTS.clear()
        _PRODUCTS[key] = known
    call, shape = known
    return call(a.reshape(shape), b.reshape(1, K, F), bias).reshape(M, F)


def _product_row(Py_ssize_t M):
    """Pixels per row of the M-pixel 1x1 convolution small_k_product runs: the
    largest divisor of M from 16 to 128, else M. The direct kernel's work
    items are (row, block of output channels), so with one row of M pixels
    each thread reads all of a, which the calling thread has usually just
    written, from the other core's cache; with rows, each reads only its
    own."""
    cdef Py_ssize_t L
    for L in range(min(M, 128), 15, -1):
        if M % L == 0:
            return L
    return M


# dense_rows takes products of at most this many rows, with a weight matrix of
# at most this many values (128 kB of float32: it stays in L2 between calls).
DENSE_MAX_ROWS = 4
DENSE_MAX_WEIGHTS = 32768

cdef extern from "cyback_dense_t.h" nogil:
    int cb_simd_use_avx2(int on)
    void cb_simd_set_default_cap(int cap)
    int cb_simd_use_avx512(int on)
    void cb_dt_rows_f(const float *x, Py_ssize_t m, Py_ssize_t k, const float *wt, Py_ssize_t n,
                      const float *b, int act, float *y)
    void cb_dt_rows_d(const double *x, Py_ssize_t m, Py_ssize_t k, const double *wt,
                      Py_ssize_t n, const double *b, int act, double *y)

# CYBACK_AVX512=0 caps this module's vector kernels at AVX2 (the registry reads it).
cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)

# Products dense_t takes: one row. It reads wt once per row, where a product
# of several rows reads the kernel once for all, so NumPy's product is
# faster from two rows on.
DENSE_T_MAX_ROWS = 1


cdef void _dense_rows(const floating* x, const floating* w, const floating* b, floating* y,
                      Py_ssize_t m, Py_ssize_t k, Py_ssize_t n, int act) noexcept nogil:
    """y (m, n) = act(x (m, k) @ w (k, n) + b): each output row starts as the
    bias and takes one scaled row of w per input value, so w is read in
    order, once per row."""
    cdef Py_ssize_t i, kk, j
    cdef floating v
    cdef floating* yi
    cdef const floating* wr
    for i in range(m):
        yi = y + i * n
        for j in range(n):
            yi[j] = b[j] if b != NULL else 0
        for kk in range(k):
            v = x[i * k + kk]
            wr = w + kk * n
            for j in range(n):
                yi[j] = yi[j] + v * wr[j]
        _activate(yi, n, act)


cdef void _activate(floating* y, Py_ssize_t size, int act) noexcept nogil:
    """relu (act 1) or relu6 (act 2) in place; NaN stays NaN, as through
    np.maximum / np.minimum."""
    cdef Py_ssize_t j
    cdef floating v
    # select loops, no branches: they vectorise, and a branch per value
    # mispredicts on about half of them
    if act == 0:
        return
    for j in range(size):
        v = y[j]
        y[j] = 0 if v < 0 else v
    if act == 2:
        for j in range(size):
            v = y[j]
            y[j] = 6 if v > 6 else v


cdef void _dense_gemm(const floating* x, const floating* w, const floating* b, floating* y,
                      int m, int k, int n, int act) noexcept nogil:
    """y (m, n) = act(x (m, k) @ w (k, n) + b) as one GEMM on this thread whose
    initial value is the bias rows, then the activation while y is in cache."""
    cdef Py_ssize_t i, j
    if b != NULL:
        for i in range(m):
            for j in range(n):
                y[i * n + j] = b[j]
    gemm(False, False, m, n, k, <floating>1, x, k, w, n, <floating>(1 if b != NULL else 0),
         y, n)
    _activate(y, <Py_ssize_t>m * n, act)


cdef tuple _dense_shape(x, w, bias, int act, bint transposed=False):
    """(type number, m, k, n) when x (m, k), w (k, n) (with ``transposed``,
    (n, k)) and bias (n,) or None are aligned, C-contiguous arrays of one
    float type in the machine's byte order and act is an activation code;
    else None."""
    cdef Py_ssize_t m, k, n
    if not isinstance(x, cnp.ndarray) or cnp.PyArray_NDIM(<cnp.ndarray> x) != 2:
        return None
    cdef int typenum = cnp.PyArray_TYPE(<cnp.ndarray> x)
    if (typenum != cnp.NPY_FLOAT and typenum != cnp.NPY_DOUBLE) or act < 0 or act > 2 or \
            not fits_layout(x, typenum) or not fits_layout(w, typenum) or \
            cnp.PyArray_NDIM(<cnp.ndarray> w) != 2:
        return None
    m, k = cnp.PyArray_DIM(<cnp.ndarray> x, 0), cnp.PyArray_DIM(<cnp.ndarray> x, 1)
    n = cnp.PyArray_DIM(<cnp.ndarray> w, 0 if transposed else 1)
    if cnp.PyArray_DIM(<cnp.ndarray> w, 1 if transposed else 0) != k:
        return None
    if bias is not None and (not fits_layout(bias, typenum) or
                             cnp.PyArray_NDIM(<cnp.ndarray> bias) != 1 or
                             cnp.PyArray_DIM(<cnp.ndarray> bias, 0) != n):
        return None
    return typenum, m, k, n


# _dense_run's kernels: one GEMM, dense_rows' pass, dense_t's dot products
cdef enum:
    DENSE_GEMM, DENSE_ROWS, DENSE_TRANSPOSED


cdef inline void _dense_kernel(const floating* xp, const floating* wp, const floating* bp,
                               floating* yp, Py_ssize_t m, Py_ssize_t k, Py_ssize_t n,
                               int act, int kernel) noexcept nogil:
    if kernel == DENSE_TRANSPOSED:
        if floating is float:
            cb_dt_rows_f(xp, m, k, wp, n, bp, act, yp)
        else:
            cb_dt_rows_d(xp, m, k, wp, n, bp, act, yp)
    elif kernel == DENSE_ROWS:
        _dense_rows(xp, wp, bp, yp, m, k, n, act)
    else:
        _dense_gemm(xp, wp, bp, yp, <int> m, <int> k, <int> n, act)


cdef cnp.ndarray _dense_run(x, w, bias, int act, int typenum, Py_ssize_t m, Py_ssize_t k,
                            Py_ssize_t n, int kernel):
    """The checked product (see _dense_shape) by _dense_gemm, _dense_rows or
    cb_dt_rows (w then given transposed)."""
    cdef cnp.npy_intp dims[2]
    cdef const void* xp = cnp.PyArray_DATA(<cnp.ndarray> x)
    cdef const void* wp = cnp.PyArray_DATA(<cnp.ndarray> w)
    cdef const void* bp = NULL if bias is None else cnp.PyArray_DATA(<cnp.ndarray> bias)
    dims[0], dims[1] = m, n
    cdef cnp.ndarray y = cnp.PyArray_EMPTY(2, dims, typenum, 0)
    cdef void* yp = cnp.PyArray_DATA(y)
    with nogil:
        if typenum == cnp.NPY_FLOAT:
            _dense_kernel(<const float*> xp, <const float*> wp, <const float*> bp,
                          <float*> yp, m, k, n, act, kernel)
        else:
            _dense_kernel(<const double*> xp, <const double*> wp, <const double*> bp,
                          <double*> yp, m, k, n, act, kernel)
    return y


def dense_rows(x, w, bias=None, int act=0):
    """act(x @ w + bias) for a product of a few rows (a batch-1 Dense layer):
    x (m, k) with m <= DENSE_MAX_ROWS, w (k, n) with k * n <= DENSE_MAX_WEIGHTS,
    bias (n,) or None, all C-contiguous float32 or all float64; act 0 (none),
    1 (relu) or 2 (relu6). One pass over w on the calling thread, with no
    BLAS call and no pass of its own for the bias or the activation: for
    such a product those cost more than the arithmetic. Returns None when
    the arrays are not of that kind (the caller takes another path)."""
    shape = _dense_shape(x, w, bias, act)
    if shape is None:
        return None
    typenum, m, k, n = shape
    if m > DENSE_MAX_ROWS or k * n > DENSE_MAX_WEIGHTS:
        return None
    return _dense_run(x, w, bias, act, typenum, m, k, n, DENSE_ROWS)


def dense_t(x, wt, bias=None, int act=0):
    """act(x @ wt.T + bias) for x (m, k) of at most DENSE_T_MAX_ROWS rows (one)
    and a weight matrix given transposed, wt (n, k); bias (n,) or None, all
    C-contiguous float32 or all float64; act 0 (none), 1 (relu) or 2
    (relu6). Each output is a dot product of two contiguous rows
    (include/cyback_dense_t.h): for a kernel of few columns and many rows
    (a classifier after a Flatten) that is a vector loop over k, where the
    (k, n) layout gives rows too short for one. Returns None when the
    arrays are not of that kind (the caller takes another path)."""
    shape = _dense_shape(x, wt, bias, act, True)
    if shape is None or shape[1] > DENSE_T_MAX_ROWS:
        return None
    typenum, m, k, n = shape
    return _dense_run(x, wt, bias, act, typenum, m, k, n, DENSE_TRANSPOSED)


def _use_avx2(bint on):
    """Run dense_t's AVX2 + FMA set when the CPU has it (the default), or the
    baseline one (for tests). Returns whether AVX2 now runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let dense_t's AVX-512 set run when the CPU has it (the default), or
    cap it at AVX2 (for tests). Returns whether AVX-512 now runs."""
    return bool(cb_simd_use_avx512(on))


def dense(x, w, bias=None, int act=0):
    """act(x @ w + bias) for a Dense layer's product when the calling thread
    should do it all: x (m, k), w (k, n), bias (n,) or None, all C-contiguous
    float32 or all float64; act 0 (none), 1 (relu) or 2 (relu6). A few rows
    go to dense_rows; a product below the thread team's cutoff is one GEMM
    from the bias rows with the activation after it, in one call instead of
    a product, an add and an activation pass of NumPy's (a batch-32 MLP layer
    spends more on those calls than on its arithmetic). Returns None for
    larger products (``matmul`` splits them over the team), empty ones and
    arrays not of that kind."""
    shape = _dense_shape(x, w, bias, act)
    if shape is None:
        return None
    typenum, m, k, n = shape
    if m == 0 or k == 0 or n == 0:
        return None
    rows = m <= DENSE_MAX_ROWS and k * n <= DENSE_MAX_WEIGHTS
    # matmul's split: a product it would cut into parts goes to it, so that
    # both give the same result for the same shapes
    if not rows and (team_parts(_matmul_work(m, n, k)) > 1 or m * k > INT_MAX or
                     k * n > INT_MAX or m * n > INT_MAX):
        return None
    return _dense_run(x, w, bias, act, typenum, m, k, n, DENSE_ROWS if rows else DENSE_GEMM)


def _writable(x):
    # Typed memoryviews need a writable buffer; the kernel never writes it.
    return x if x.flags.writeable else x.copy()


cdef void _batch_gemm(floating[:, :, ::1] a, floating[:, :, ::1] b,
                      floating[:, :, ::1] out, bint trans_a, bint trans_b,
                      bint over_batch,
        cb_intr* intr) noexcept nogil:
    cdef Py_ssize_t i, nb = out.shape[0]
    cdef int m = out.shape[1], n = out.shape[2]
    cdef int k = a.shape[1] if trans_a else a.shape[2]
    cdef int nt = threads_for(2.0 * nb * m * n * k)
    cdef int parts_one = team_parts(2.0 * m * n * k), nt_one = threads_for(2.0 * m * n * k)
    cdef int lda = a.shape[2], ldb = b.shape[2], ldc = n
    if lda < 1: lda = 1
    if ldb < 1: ldb = 1
    if ldc < 1: ldc = 1
    if over_batch:
        for i in prange(nb, schedule='static', num_threads=nt):
            if cb_intr_poll(intr):
                continue
            gemm(trans_a, trans_b, m, n, k, <floating>1, &a[i, 0, 0], lda,
                 &b[i, 0, 0], ldb, <floating>0, &out[i, 0, 0], ldc)
    else:
        for i in range(nb):
            _chunked_gemm(trans_a, trans_b, m, n, k, &a[i, 0, 0], lda, &b[i, 0, 0], ldb,
                          <floating>0, &out[i, 0, 0], ldc, parts_one, nt_one, intr)
            if intr.stop:
                break


def batch_gemm(a, b, bint trans_a=False, bint trans_b=False, out=None):
    """out[i] = op(a[i]) @ op(b[i]) for 3-D C-contiguous float32/float64 arrays.

    ``op`` transposes the last two axes when the matching flag is set, so
    callers express ``x @ y.T`` without copying ``y``.
    """
    cdef cb_intr intr
    cb_intr_init(&intr)
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        raise TypeError("batch_gemm: expected two NumPy arrays, got %s and %s"
                        % (type(a).__name__, type(b).__name__))
    a = _writable(np.ascontiguousarray(a))
    b = _writable(np.ascontiguousarray(b))
    if a.ndim != 3 or b.ndim != 3:
        raise ValueError("batch_gemm: expected 3-D arrays, got shapes %s and %s"
                         % (a.shape, b.shape))
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        raise TypeError("batch_gemm: expected two float32 or two float64 arrays, got %s and %s"
                        % (a.dtype, b.dtype))
    nb = a.shape[0]
    m, ka = (a.shape[2], a.shape[1]) if trans_a else (a.shape[1], a.shape[2])
    kb, n = (b.shape[2], b.shape[1]) if trans_b else (b.shape[1], b.shape[2])
    if b.shape[0] != nb or ka != kb:
        raise ValueError("batch_gemm: incompatible shapes %s%s and %s%s"
                         % (a.shape, ".T" if trans_a else "", b.shape, ".T" if trans_b else ""))
    if out is None:
        out = np.empty((nb, m, n), dtype=a.dtype)
    if nb == 0 or m == 0 or n == 0:
        return out
    if ka == 0:
        out[...] = 0
        return out
    over_batch = nb > 1 and <long>m * n * ka <= SMALL_GEMM
    if a.dtype == np.float32:
        _batch_gemm[float](a, b, out, trans_a, trans_b, over_batch, &intr)
        check_interrupt(&intr)
    else:
        _batch_gemm[double](a, b, out, trans_a, trans_b, over_batch, &intr)
        check_interrupt(&intr)
    return out


include "linalg_packed.pxi"
