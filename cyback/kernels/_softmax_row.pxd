# One float64 softmax row, shared by the softmax and attention kernels (their
# float32 rows are include/cyback_vmath.h's cb_vm_softmax_row_f): the maximum,
# the shifted exponentials and their sum, then the scaling. A row whose maximum
# is -inf is shifted by 0; NaN anywhere makes the row NaN. y may be x.
from libc.math cimport exp, INFINITY


cdef inline void softmax_row_d(const double* x, double* y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef double m = -INFINITY, v, s = 0
    for i in range(n):
        v = x[i]
        if v > m or v != v:
            m = v
            if v != v:
                break
    if m == -INFINITY:
        m = 0
    for i in range(n):
        v = exp(x[i] - m)
        y[i] = v
        s = s + v
    s = 1 / s
    for i in range(n):
        y[i] = y[i] * s
