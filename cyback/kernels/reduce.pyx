"""Sums over the middle axis of an (outer, n, inner) array: what a mean over
the spatial axes of NHWC (global average pooling) and a bias gradient (the
sum over every axis but the channels) come to; the max and min over it
(global max pooling); and layer normalization of
the rows of a (rows, n) array, its statistics and the scaling in one kernel.

NumPy reduces a non-last axis one output row at a time, with a fixed cost
per row of ``inner`` values that for short rows is many times a pass over the
data (benchmarks/bench_pool.py).
Here each task keeps a strip of up to ``STRIP`` output values in a local
array (L1) and adds the ``n`` rows into it, in blocks of ``BLOCK`` rows whose
partial sums are added to the total: rounding grows with BLOCK + n / BLOCK,
not n. When there are few strips (batch-1 pooling), the rows are split into
up to ``SPLITS`` parts as well, each summed into its own slot, and the slots
are added in a fixed order. The split depends on the shape alone, so the
result is the same for any thread count.
"""
import numpy as np
cimport cython
cimport numpy as cnp
from cython.parallel cimport prange
from libc.math cimport sqrt
from libc.stdlib cimport free, malloc

from cyback.kernels import settings as _settings
from cyback.kernels._arrays cimport fits
from cyback.kernels._blas cimport floating
from cyback.kernels.runtime cimport team_done, threads_for

cnp.import_array()

cdef enum:
    STRIP = 64
    BLOCK = 128
    SPLITS = 8


cdef void _strip(const floating* x, floating* out, Py_ssize_t n, Py_ssize_t inner,
                 Py_ssize_t width) noexcept nogil:
    """out[0:width] = sums over the n rows (stride inner) of x[0:width]."""
    cdef floating total[STRIP]
    cdef floating part[STRIP]
    cdef Py_ssize_t r, r0, r1, j
    for j in range(width):
        total[j] = 0
    r0 = 0
    while r0 < n:
        r1 = r0 + BLOCK if r0 + BLOCK < n else n
        for j in range(width):
            part[j] = 0
        for r in range(r0, r1):
            for j in range(width):
                part[j] = part[j] + x[r * inner + j]
        for j in range(width):
            total[j] = total[j] + part[j]
        r0 = r1
    for j in range(width):
        out[j] = total[j]


cdef void _task(const floating* x, floating* slots, Py_ssize_t t, Py_ssize_t n,
                Py_ssize_t inner, Py_ssize_t strips, Py_ssize_t splits,
                Py_ssize_t size) noexcept nogil:
    """Task t: rows [lo, hi) of split t % splits, for strip t // splits % strips
    of outer item t // (splits * strips), into that split's slot."""
    cdef Py_ssize_t s = t % splits, rest = t // splits
    cdef Py_ssize_t strip = rest % strips, o = rest // strips
    cdef Py_ssize_t lo = n * s // splits, hi = n * (s + 1) // splits
    cdef Py_ssize_t j0 = strip * STRIP
    cdef Py_ssize_t width = inner - j0 if inner - j0 < STRIP else STRIP
    _strip(x + (o * n + lo) * inner + j0, slots + s * size + o * inner + j0, hi - lo,
           inner, width)


cdef void _sum_middle(const floating* x, floating* out, floating* slots, Py_ssize_t outer,
                      Py_ssize_t n, Py_ssize_t inner, Py_ssize_t splits, bint mean,
                      int threads) noexcept nogil:
    cdef Py_ssize_t strips = (inner + STRIP - 1) // STRIP
    cdef Py_ssize_t size = outer * inner, tasks = outer * strips * splits, t, i, s
    cdef floating* dst = out if splits == 1 else slots
    if threads > 1:
        for t in prange(tasks, num_threads=threads, schedule="static"):
            _task(x, dst, t, n, inner, strips, splits, size)
    else:
        for t in range(tasks):
            _task(x, dst, t, n, inner, strips, splits, size)
    if splits > 1:
        for i in range(size):
            out[i] = slots[i]
        for s in range(1, splits):
            for i in range(size):
                out[i] = out[i] + slots[s * size + i]
    if mean:
        for i in range(size):
            out[i] = out[i] / n


cdef cnp.ndarray _middle_view(str name, x, Py_ssize_t outer, Py_ssize_t n, Py_ssize_t inner):
    """x, checked to be a C-contiguous float32/float64 array that (outer, n,
    inner) views with n >= 1 (TypeError / ValueError naming ``name``)."""
    cdef cnp.ndarray a = x
    if not a.flags.c_contiguous or (a.dtype != np.float32 and a.dtype != np.float64):
        raise TypeError("%s: expected a C-contiguous float32 or float64 array, got %s"
                        % (name, a.dtype))
    if outer < 0 or n < 1 or inner < 1 or a.size != outer * n * inner:
        raise ValueError("%s: (outer, n, inner) = (%d, %d, %d) does not view an array "
                         "of %d values with n >= 1" % (name, outer, n, inner, a.size))
    return a


def sum_middle(x, Py_ssize_t outer, Py_ssize_t n, Py_ssize_t inner, bint mean=False):
    """The sums (or means, with ``mean``) over axis 1 of the C-contiguous
    float32/float64 array ``x`` viewed as (outer, n, inner): a new
    (outer, inner) array of x's dtype. n must be at least 1."""
    cdef cnp.ndarray a, out
    cdef int threads
    cdef Py_ssize_t splits = 1, strips
    cdef void* slots = NULL
    a = _middle_view("sum_middle", x, outer, n, inner)
    out = np.empty((outer, inner), dtype=a.dtype)
    if outer == 0:
        return out
    threads = threads_for(1.0 * a.size * a.itemsize)
    strips = (inner + STRIP - 1) // STRIP
    if outer * strips < SPLITS and n >= 2 * BLOCK:
        splits = min(SPLITS, n // BLOCK)
        slots = malloc(splits * outer * inner * a.itemsize)
        if slots == NULL:
            raise MemoryError("sum_middle: no memory for %d partial sums" % splits)
    try:
        if a.dtype == np.float32:
            with nogil:
                _sum_middle(<const float*> cnp.PyArray_DATA(a), <float*> cnp.PyArray_DATA(out),
                            <float*> slots, outer, n, inner, splits, mean, threads)
        else:
            with nogil:
                _sum_middle(<const double*> cnp.PyArray_DATA(a),
                            <double*> cnp.PyArray_DATA(out), <double*> slots, outer, n, inner,
                            splits, mean, threads)
    finally:
        free(slots)
    team_done(threads)
    return out


# float32 rows in vector registers (include/cyback_layernorm.h,
# include/cyback_extreme.h): the baseline loops' bits
cdef extern from "cyback_layernorm.h" nogil:
    int cb_ln_row_f(const float* x, float* y, const float* gamma, const float* beta,
                    float eps, Py_ssize_t n)
    int cb_simd_use_avx2(int on)
    int cb_simd_use_avx512(int on)
    void cb_simd_set_default_cap(int cap)

cdef extern from "cyback_extreme.h" nogil:
    int cb_extreme_strip_f(const float* x, float* out, Py_ssize_t n, Py_ssize_t inner,
                           Py_ssize_t width, int want_max)


cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)


def _use_avx2(bint on):
    """Run the float32 layer-normalization rows and max / min strips in AVX2
    (or wider) when the CPU has it (the default), or the baseline loops (for
    tests; the same bits). Returns whether AVX2 now runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let the max / min strips' AVX-512 set run when the CPU has it (the
    default), or cap them at AVX2 (for tests). Returns whether AVX-512 now
    runs."""
    return bool(cb_simd_use_avx512(on))


# ---------------------------------------------------------------- max / min

cdef void _extreme_strip(const floating* x, floating* out, Py_ssize_t n, Py_ssize_t inner,
                         Py_ssize_t width, bint want_max) noexcept nogil:
    """out[0:width] = the max (or min) over the n rows (stride inner) of
    x[0:width]; a NaN wins, as in np.max (a select per value: vectorised)."""
    cdef floating best[STRIP]
    cdef floating v, b
    cdef Py_ssize_t r, j
    cdef const floating* row
    if floating is float:
        if cb_extreme_strip_f(x, out, n, inner, width, want_max):
            return
    for j in range(width):
        best[j] = x[j]
    for r in range(1, n):
        row = x + r * inner
        if want_max:
            for j in range(width):
                v, b = row[j], best[j]
                best[j] = v if (v > b or v != v) else b
        else:
            for j in range(width):
                v, b = row[j], best[j]
                best[j] = v if (v < b or v != v) else b
    for j in range(width):
        out[j] = best[j]


cdef void _extreme_middle(const floating* x, floating* out, Py_ssize_t outer, Py_ssize_t n,
                          Py_ssize_t inner, bint want_max, int threads) noexcept nogil:
    cdef Py_ssize_t strips = (inner + STRIP - 1) // STRIP, t, o, j0
    if threads > 1:
        for t in prange(outer * strips, num_threads=threads, schedule="static"):
            o, j0 = t // strips, t % strips * STRIP
            _extreme_strip(x + o * n * inner + j0, out + o * inner + j0, n, inner,
                           inner - j0 if inner - j0 < STRIP else STRIP, want_max)
    else:
        for t in range(outer * strips):
            o, j0 = t // strips, t % strips * STRIP
            _extreme_strip(x + o * n * inner + j0, out + o * inner + j0, n, inner,
                           inner - j0 if inner - j0 < STRIP else STRIP, want_max)


def extreme_middle(x, Py_ssize_t outer, Py_ssize_t n, Py_ssize_t inner, bint want_max=True):
    """The max (or, without ``want_max``, the min) over axis 1 of the
    C-contiguous float32/float64 array ``x`` viewed as (outer, n, inner): a
    new (outer, inner) array of x's dtype, NaN where a NaN is among the
    values (as np.max / np.min). n must be at least 1. A global max pooling
    of NHWC at batch 1 is such a reduction, which NumPy runs one output
    value at a time."""
    cdef cnp.ndarray a, out
    cdef int threads
    a = _middle_view("extreme_middle", x, outer, n, inner)
    out = np.empty((outer, inner), dtype=a.dtype)
    if outer == 0:
        return out
    threads = threads_for(1.0 * a.size * a.itemsize)
    if a.dtype == np.float32:
        with nogil:
            _extreme_middle(<const float*> cnp.PyArray_DATA(a), <float*> cnp.PyArray_DATA(out),
                            outer, n, inner, want_max, threads)
    else:
        with nogil:
            _extreme_middle(<const double*> cnp.PyArray_DATA(a),
                            <double*> cnp.PyArray_DATA(out), outer, n, inner, want_max,
                            threads)
    team_done(threads)
    return out


# ---------------------------------------------------------------- layer normalization



cdef enum:
    LANES = 8


cdef floating _lane_sum(const floating* x, floating shift, bint square,
                        Py_ssize_t n) noexcept nogil:
    """sum(x - shift) or sum((x - shift)^2), in LANES interleaved partial sums
    added in a fixed order (the compiler vectorises the lanes; one running sum
    could not be reordered)."""
    cdef floating part[LANES]
    cdef floating v, total = 0
    cdef Py_ssize_t i, j, whole = n - n % LANES
    for j in range(LANES):
        part[j] = 0
    i = 0
    while i < whole:
        for j in range(LANES):
            v = x[i + j] - shift
            part[j] = part[j] + (v * v if square else v)
        i = i + LANES
    for j in range(LANES):
        total = total + part[j]
    for i in range(whole, n):
        v = x[i] - shift
        total = total + (v * v if square else v)
    return total


cdef void _normalize_row(const floating* x, floating* y, const floating* gamma,
                         const floating* beta, floating eps, Py_ssize_t n) noexcept nogil:
    if floating is float:
        if cb_ln_row_f(x, y, gamma, beta, eps, n):
            return
    cdef floating mean = _lane_sum(x, 0, False, n) / n
    # the variance of the centred values: no cancellation for rows far from 0
    cdef floating var = _lane_sum(x, mean, True, n) / n
    cdef floating inv = 1 / sqrt(var + eps)
    cdef Py_ssize_t i
    if gamma != NULL and beta != NULL:
        for i in range(n):
            y[i] = (x[i] - mean) * (inv * gamma[i]) + beta[i]
    elif gamma != NULL:
        for i in range(n):
            y[i] = (x[i] - mean) * (inv * gamma[i])
    elif beta != NULL:
        for i in range(n):
            y[i] = (x[i] - mean) * inv + beta[i]
    else:
        for i in range(n):
            y[i] = (x[i] - mean) * inv


cdef void _normalize_rows(const floating* x, floating* y, const floating* gamma,
                          const floating* beta, floating eps, Py_ssize_t rows, Py_ssize_t n,
                          int threads) noexcept nogil:
    cdef Py_ssize_t r
    if threads > 1:
        for r in prange(rows, num_threads=threads, schedule="static"):
            _normalize_row(x + r * n, y + r * n, gamma, beta, eps, n)
    else:
        for r in range(rows):
            _normalize_row(x + r * n, y + r * n, gamma, beta, eps, n)


def layer_norm_last(x, gamma, beta, double epsilon):
    """(x - mean) / sqrt(var + epsilon) * gamma + beta over the last axis of a
    float32/float64 array (mean and biased variance of each row), ``gamma`` and
    ``beta`` vectors of the last axis's length or None: a new C-contiguous
    array of x's dtype. Each row is computed alone and in a fixed order, so
    the result does not depend on the thread count."""
    cdef cnp.ndarray a, out, g = None, b = None
    cdef Py_ssize_t n, rows
    cdef int threads
    cdef char* gp
    cdef char* bp
    if np.ndim(x) == 0:
        raise ValueError("layer_norm_last: expected an array of rank >= 1, got a scalar")
    a = np.ascontiguousarray(x)
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise TypeError("layer_norm_last: float32 or float64 only, got %s" % a.dtype)
    if not epsilon >= 0:
        raise ValueError("layer_norm_last: epsilon must be >= 0, got %r" % (epsilon,))
    n = a.shape[a.ndim - 1]
    for name, v in (("gamma", gamma), ("beta", beta)):
        if v is not None and (np.ndim(v) != 1 or np.shape(v)[0] != n):
            raise ValueError("layer_norm_last: %s must be a vector of %d values (the last axis), "
                             "got shape %s" % (name, n, np.shape(v)))
    if gamma is not None:
        g = np.ascontiguousarray(gamma, dtype=a.dtype)
    if beta is not None:
        b = np.ascontiguousarray(beta, dtype=a.dtype)
    out = np.empty_like(a)
    if a.size == 0:
        return out
    rows = a.size // n
    threads = threads_for(8.0 * a.size)
    gp = NULL if g is None else <char*> cnp.PyArray_DATA(g)
    bp = NULL if b is None else <char*> cnp.PyArray_DATA(b)
    if a.dtype == np.float32:
        with nogil:
            _normalize_rows(<const float*> cnp.PyArray_DATA(a), <float*> cnp.PyArray_DATA(out),
                            <const float*> gp, <const float*> bp, <float> epsilon, rows, n,
                            threads)
    else:
        with nogil:
            _normalize_rows(<const double*> cnp.PyArray_DATA(a), <double*> cnp.PyArray_DATA(out),
                            <const double*> gp, <const double*> bp, epsilon, rows, n, threads)
    team_done(threads)
    return out


@cython.final
cdef class LayerNormCall:
    """``call(x, gamma=None, beta=None)``: layer_norm_last for one shape and
    dtype of C-contiguous arrays (gamma and beta as given to
    ``layer_norm_call``), without its conversions and checks; None when the
    arrays do not fit (a bound plan's step then runs its op)."""
    cdef tuple x_shape, v_shape
    cdef Py_ssize_t n, rows
    cdef int typenum, ndim
    cdef cnp.npy_intp dims[32]
    cdef bint has_gamma, has_beta
    cdef double eps

    def __call__(self, x, gamma=None, beta=None):
        if not fits(x, self.typenum, self.x_shape) or (gamma is None) == self.has_gamma or \
                (beta is None) == self.has_beta or \
                (gamma is not None and not fits(gamma, self.typenum, self.v_shape)) or \
                (beta is not None and not fits(beta, self.typenum, self.v_shape)):
            return None
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(self.ndim, self.dims, self.typenum, 0)
        cdef char* gp = NULL if gamma is None else <char*> cnp.PyArray_DATA(<cnp.ndarray> gamma)
        cdef char* bp = NULL if beta is None else <char*> cnp.PyArray_DATA(<cnp.ndarray> beta)
        cdef char* xp = <char*> cnp.PyArray_DATA(<cnp.ndarray> x)
        cdef int threads = threads_for(8.0 * self.rows * self.n)
        if self.typenum == cnp.NPY_FLOAT:
            with nogil:
                _normalize_rows(<const float*> xp, <float*> cnp.PyArray_DATA(out),
                                <const float*> gp, <const float*> bp, <float> self.eps,
                                self.rows, self.n, threads)
        else:
            with nogil:
                _normalize_rows(<const double*> xp, <double*> cnp.PyArray_DATA(out),
                                <const double*> gp, <const double*> bp, self.eps, self.rows,
                                self.n, threads)
        team_done(threads)
        return out


def layer_norm_call(x_shape, dtype, bint has_gamma, bint has_beta, double epsilon):
    """A LayerNormCall: layer_norm_last(x, gamma, beta, epsilon) for x of
    ``x_shape`` and ``dtype`` (float32 or float64, at least one element),
    with or without gamma and beta."""
    cdef LayerNormCall call = LayerNormCall()
    cdef int i
    x_shape = tuple([int(d) for d in x_shape])
    dtype = np.dtype(dtype)
    if not 1 <= len(x_shape) <= 32 or dtype not in (np.float32, np.float64) or \
            not epsilon >= 0 or 0 in x_shape:
        raise ValueError("layer_norm_call: expected a non-empty float shape of rank 1 to 32 "
                         "and epsilon >= 0, got %s %s and %r" % (dtype, x_shape, epsilon))
    call.x_shape = x_shape
    call.ndim = len(x_shape)
    for i in range(call.ndim):
        call.dims[i] = x_shape[i]
    call.n = x_shape[call.ndim - 1]
    call.rows = 1
    for i in range(call.ndim - 1):
        call.rows *= x_shape[i]
    call.v_shape = (call.n,)
    call.typenum = cnp.NPY_FLOAT if dtype == np.float32 else cnp.NPY_DOUBLE
    call.has_gamma, call.has_beta, call.eps = has_gamma, has_beta, epsilon
    return call
