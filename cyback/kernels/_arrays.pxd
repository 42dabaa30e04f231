# Checks of the prepared kernel calls (conv, depthwise, pool ForwardCall,
# linalg.dense_rows): whether an array can be read through raw pointers as
# it is, or must take the full entry, which converts or raises.
cimport numpy as cnp


cdef inline bint fits_layout(object a, int typenum):
    """a is an aligned, C-contiguous ndarray of this type number in the
    machine's byte order (a swapped float32 has the same type number)."""
    cdef cnp.ndarray arr
    if not isinstance(a, cnp.ndarray):
        return False
    arr = <cnp.ndarray> a
    return cnp.PyArray_TYPE(arr) == typenum and cnp.PyArray_ISCARRAY_RO(arr) and \
        cnp.PyArray_ISNOTSWAPPED(arr)


cdef inline bint fits(object a, int typenum, tuple shape):
    """fits_layout, and of this shape."""
    cdef int i
    if not fits_layout(a, typenum) or cnp.PyArray_NDIM(<cnp.ndarray> a) != len(shape):
        return False
    for i in range(len(shape)):
        if cnp.PyArray_DIM(<cnp.ndarray> a, i) != <Py_ssize_t> shape[i]:
            return False
    return True
