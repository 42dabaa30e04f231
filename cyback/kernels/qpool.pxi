# The max pool of uint8 codes (channels_last 2-D), for int8 plans that pool
# the codes of the next layers' input quantization (a max commutes with a
# monotone quantization). Padded cells are skipped: they never win a max.

cdef extern from "cyback_qpool.h" nogil:
    void cb_qp_max(uint8_t* d, const uint8_t* s, Py_ssize_t c)
    void cb_qp_max_rows(int level, uint8_t* d, const uint8_t* src, Py_ssize_t n,
                        Py_ssize_t inner)


cdef void _max_pool_lines(const uint8_t* x, uint8_t* y, Py_ssize_t h, Py_ssize_t w,
                          Py_ssize_t c, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh,
                          Py_ssize_t sw, Py_ssize_t pt, Py_ssize_t pl, Py_ssize_t oh,
                          Py_ssize_t ow, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    cdef Py_ssize_t r, b, oy, ox, iy, ix, y0, y1, x0, x1
    cdef const uint8_t* src
    cdef uint8_t* dst
    for r in range(r0, r1):
        b = r // oh
        oy = r % oh
        y0 = oy * sh - pt
        y1 = min(y0 + kh, h)
        y0 = max(y0, 0)
        for ox in range(ow):
            x0 = ox * sw - pl
            x1 = min(x0 + kw, w)
            x0 = max(x0, 0)
            dst = y + (r * ow + ox) * c
            memset(dst, 0, c)
            for iy in range(y0, y1):
                for ix in range(x0, x1):
                    src = x + ((b * h + iy) * w + ix) * c
                    cb_qp_max(dst, src, c)


def max_pool(x, pool_size, strides, pads=((0, 0), (0, 0))):
    """The max pool of uint8 codes x (N, H, W, C): (N, OH, OW, C), padded
    cells skipped (``pads``: ((top, bottom), (left, right)), each below the
    window)."""
    cdef Py_ssize_t kh, kw, sh, sw, pt, pb, pl, pr, oh, ow
    kh, kw, sh, sw, _, _, pt, pb, pl, pr, oh, ow = _window("max_pool", x, pool_size, strides,
                                                           1, pads)
    if max(pt, pb) >= kh or max(pl, pr) >= kw:
        raise ValueError("max_pool: pads must be below the window %s, got %r"
                         % ((kh, kw), pads))
    cdef Py_ssize_t b = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    out = np.empty((b, oh, ow, c), dtype=np.uint8)
    if out.size == 0:
        return out
    x = np.ascontiguousarray(x)
    cdef const uint8_t* src = <const uint8_t*>cnp.PyArray_DATA(x)
    cdef uint8_t* dst = <uint8_t*>cnp.PyArray_DATA(out)
    cdef Py_ssize_t lines = b * oh
    cdef double work = <double>out.size * kh * kw
    cdef int parts = team_parts(work), nt = threads_for(work), t
    if parts > lines:
        parts = <int>lines
    with nogil:
        if parts <= 1:
            _max_pool_lines(src, dst, h, w, c, kh, kw, sh, sw, pt, pl, oh, ow, 0, lines)
        else:
            for t in prange(parts, schedule='static', num_threads=nt):
                _max_pool_lines(src, dst, h, w, c, kh, kw, sh, sw, pt, pl, oh, ow,
                                (lines * t) // parts, (lines * (t + 1)) // parts)
    team_done(nt)
    return out


def max_middle(x):
    """The max over the middle axis of C-contiguous uint8 codes x (outer, n,
    inner), n >= 1: (outer, inner). An int8 plan's global max pool of codes
    (a Reduce over the spatial axes), with the few checks of a batch-1 step
    of a few µs (``max_pool``'s window checks took longer than the max)."""
    if not cnp.PyArray_Check(x) or cnp.PyArray_TYPE(<cnp.ndarray>x) != cnp.NPY_UINT8 or \
            cnp.PyArray_NDIM(<cnp.ndarray>x) != 3 or \
            not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x):
        raise TypeError("max_middle: expected a C-contiguous 3-D uint8 array, got %s"
                        % _describe(x))
    cdef Py_ssize_t outer = x.shape[0], n = x.shape[1], inner = x.shape[2], o
    if n < 1:
        raise ValueError("max_middle: the middle axis is empty (shape %s)" % (x.shape,))
    cdef cnp.npy_intp dims[2]
    dims[0], dims[1] = outer, inner
    out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_UINT8, 0)
    cdef const uint8_t* src = <const uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef uint8_t* dst = <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int level = cb_q_level()
    with nogil:
        for o in range(outer):
            cb_qp_max_rows(level, dst + o * inner, src + o * n * inner, n, inner)
    return out
