"""Softmax along the last axis, one pass per row: the row maximum, the
shifted exponentials and their sum, then the scaling, with the row in cache.

A row whose maximum is -inf is shifted by 0 (not by -inf, which would give
inf - inf); NaN anywhere in a row makes the row NaN, as in NumPy."""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange
from libc.math cimport exp, expf, INFINITY

from cyback.kernels._blas cimport floating
from cyback.kernels.runtime cimport threads_for

cnp.import_array()


cdef void _row(const floating* x, floating* y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef floating m = -INFINITY, v, s = 0
    for i in range(n):
        v = x[i]
        if v > m or v != v:
            m = v
            if v != v:
                break
    if m == -INFINITY:
        m = 0
    for i in range(n):
        if floating is float:
            v = expf(x[i] - m)
        else:
            v = exp(x[i] - m)
        y[i] = v
        s = s + v
    s = 1 / s
    for i in range(n):
        y[i] = y[i] * s


cdef void _rows(const floating* x, floating* y, Py_ssize_t rows, Py_ssize_t n,
                int threads) noexcept nogil:
    cdef Py_ssize_t r
    if threads > 1:
        for r in prange(rows, num_threads=threads, schedule="static"):
            _row(x + r * n, y + r * n, n)
    else:
        for r in range(rows):
            _row(x + r * n, y + r * n, n)


def softmax_last(x):
    """Softmax of a float32/float64 array along its last axis (a new array)."""
    cdef cnp.ndarray a, out
    cdef Py_ssize_t n, rows
    cdef int threads
    if np.ndim(x) == 0:
        raise ValueError("softmax: expected an array of rank >= 1, got a scalar")
    a = np.ascontiguousarray(x)
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise TypeError("softmax: float32 or float64 only, got %s" % a.dtype)
    out = np.empty_like(a)
    n = a.shape[a.ndim - 1]
    if n == 0 or a.size == 0:
        return out
    rows = a.size // n
    threads = threads_for(10.0 * a.size)
    if a.dtype == np.float32:
        with nogil:
            _rows(<const float*> cnp.PyArray_DATA(a), <float*> cnp.PyArray_DATA(out), rows, n,
                  threads)
    else:
        with nogil:
            _rows(<const double*> cnp.PyArray_DATA(a), <double*> cnp.PyArray_DATA(out), rows, n,
                  threads)
    return out
