"""Softmax along the last axis, one pass per row: the row maximum, the
shifted exponentials and their sum, then the scaling, with the row in cache.

A row whose maximum is -inf is shifted by 0 (not by -inf, which would give
inf - inf); NaN anywhere in a row makes the row NaN, as in NumPy.

float32 rows run through include/cyback_vmath.h (vectorised exp, AVX-512 /
AVX2 / baseline picked at run time, the same bits on AVX-512 and AVX2);
float64 rows through libm's exp. Rows are independent, so the result does not
depend on the thread count."""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange

from cyback.kernels import settings as _settings
from cyback.kernels.runtime cimport threads_for
from cyback.kernels._softmax_row cimport softmax_row_d

cnp.import_array()


cdef extern from "cyback_vmath.h" nogil:
    void cb_vm_softmax_row_f(const float* x, float* y, Py_ssize_t n)
    int cb_simd_use_avx2(int on)
    int cb_simd_use_avx512(int on)
    void cb_simd_set_default_cap(int cap)


cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)


def _use_avx2(bint on):
    """Run the float32 rows' AVX2 + FMA set when the CPU has it (the default),
    or the baseline one (for tests). Returns whether AVX2 now runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let the float32 rows' AVX-512 set run when the CPU has it (the
    default), or cap them at AVX2 (for tests). Returns whether AVX-512 now
    runs."""
    return bool(cb_simd_use_avx512(on))


cdef void _rows_f(const float* x, float* y, Py_ssize_t rows, Py_ssize_t n,
                  int threads) noexcept nogil:
    cdef Py_ssize_t r
    if threads > 1:
        for r in prange(rows, num_threads=threads, schedule="static"):
            cb_vm_softmax_row_f(x + r * n, y + r * n, n)
    else:
        for r in range(rows):
            cb_vm_softmax_row_f(x + r * n, y + r * n, n)


cdef void _rows_d(const double* x, double* y, Py_ssize_t rows, Py_ssize_t n,
                  int threads) noexcept nogil:
    cdef Py_ssize_t r
    if threads > 1:
        for r in prange(rows, num_threads=threads, schedule="static"):
            softmax_row_d(x + r * n, y + r * n, n)
    else:
        for r in range(rows):
            softmax_row_d(x + r * n, y + r * n, n)


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
            _rows_f(<const float*> cnp.PyArray_DATA(a), <float*> cnp.PyArray_DATA(out), rows, n,
                    threads)
    else:
        with nogil:
            _rows_d(<const double*> cnp.PyArray_DATA(a), <double*> cnp.PyArray_DATA(out), rows,
                    n, threads)
    return out
