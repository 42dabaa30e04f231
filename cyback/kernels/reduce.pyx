"""Sums over the middle axis of an (outer, n, inner) array: what a mean over
the spatial axes of NHWC (global average pooling) and a bias gradient (the
sum over every axis but the channels) come to.

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
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdlib cimport free, malloc

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


def sum_middle(x, Py_ssize_t outer, Py_ssize_t n, Py_ssize_t inner, bint mean=False):
    """The sums (or means, with ``mean``) over axis 1 of the C-contiguous
    float32/float64 array ``x`` viewed as (outer, n, inner): a new
    (outer, inner) array of x's dtype. n must be at least 1."""
    cdef cnp.ndarray a, out
    cdef int threads
    cdef Py_ssize_t splits = 1, strips
    cdef void* slots = NULL
    a = x
    if not a.flags.c_contiguous or (a.dtype != np.float32 and a.dtype != np.float64):
        raise TypeError("sum_middle: expected a C-contiguous float32 or float64 array, got %s"
                        % a.dtype)
    if outer < 0 or n < 1 or inner < 1 or a.size != outer * n * inner:
        raise ValueError("sum_middle: (outer, n, inner) = (%d, %d, %d) does not view an array "
                         "of %d values with n >= 1" % (outer, n, inner, a.size))
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
