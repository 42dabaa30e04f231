# The max (or min) over positions of an int8 1-D convolution's output, for a
# text CNN's Conv1D + GlobalMaxPooling1D: include/cyback_qgemm.h keeps each
# column's extreme sums instead of requantizing every position, and the
# epilogue runs once per sequence (cb_q_extremes_finish says why the result
# is the same, to the bit).

KINDS = ("max", "min")


@cython.final
cdef class WindowExtremeCall:
    """For uint8 codes x (B, W, C), already padded, ``call(x)`` returns the
    (B, N) max (``kind="max"``) or min over the output positions of the int8
    1-D convolution with a window of ``kernel_size`` positions at ``stride``
    (no dilation): what ``conv(x[:, None], packed, vectors, (1,
    kernel_size), (1, stride), zero_a=zero_a, activation=activation,
    out_scale=out_scale, out_zero_point=out_zero_point)`` reshaped to (B, OW,
    N) gives along axis 1, the same bits, without forming that output. Each
    window is read in place (kernel_size * C bytes every stride * C). Like
    ``ProductCall`` it holds no reference to packed or vectors
    (``matches``)."""
    cdef cb_q_epilogue e
    cdef Py_ssize_t k, n, kw, stride, c
    cdef const uint8_t* bp
    cdef bint quantized, take_max
    cdef object packed_ref, vectors_ref

    def __init__(self, packed, vectors, channels, kernel_size, stride, zero_a,
                 activation=None, out_scale=None, out_zero_point=None, kind="max"):
        _check_packed("window_extreme", packed)
        cdef cb_q_header h = cb_q_read_header(<const uint8_t*>cnp.PyArray_DATA(packed))
        if kind not in KINDS:
            raise ValueError("window_extreme: kind must be 'max' or 'min', got %r" % (kind,))
        self.c = _dim("window_extreme", "channels", channels)
        self.kw = _dim("window_extreme", "kernel_size", kernel_size)
        self.stride = _dim("window_extreme", "stride", stride)
        if self.kw < 1 or self.stride < 1 or self.c < 1:
            raise ValueError("window_extreme: channels, kernel_size and stride must be >= 1, "
                             "got %r, %r, %r" % (channels, kernel_size, stride))
        if self.kw * self.c != h.k:
            raise ValueError("window_extreme: a window of %d positions over %d channels makes "
                             "K = %d, the packed weights have %d rows"
                             % (self.kw, self.c, self.kw * self.c, h.k))
        self.k, self.n = h.k, h.n
        _epilogue("window_extreme", &self.e, vectors, self.n, zero_a, activation, out_scale,
                  out_zero_point, (0, self.n))
        self.quantized = self.e.out_q != NULL
        self.e.out_f = NULL
        self.e.out_q = NULL
        self.take_max = kind == "max"
        self.bp = <const uint8_t*>cnp.PyArray_DATA(packed)
        self.packed_ref = weakref.ref(packed)
        self.vectors_ref = weakref.ref(vectors)

    def matches(self, packed, vectors):
        """Whether this call was made for these arrays (the same objects)."""
        return self.packed_ref() is packed and self.vectors_ref() is vectors

    def __call__(self, x):
        if not cnp.PyArray_Check(x) or cnp.PyArray_TYPE(<cnp.ndarray>x) != cnp.NPY_UINT8 or \
                cnp.PyArray_NDIM(<cnp.ndarray>x) != 3 or x.shape[2] != self.c:
            raise TypeError("window_extreme: expected uint8 codes (batch, steps, %d), got %s"
                            % (self.c, _describe(x)))
        cdef Py_ssize_t b = x.shape[0], w = x.shape[1]
        if w < self.kw:
            raise ValueError("window_extreme: %d steps hold no window of %d"
                             % (w, self.kw))
        if not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x):
            x = np.ascontiguousarray(x)
        cdef Py_ssize_t ow = (w - self.kw) // self.stride + 1
        cdef cnp.npy_intp dims[2]
        dims[0], dims[1] = b, self.n
        cdef cb_q_epilogue e = self.e
        if self.quantized:
            out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_UINT8, 0)
            e.out_q = <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>out)
        else:
            out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_FLOAT32, 0)
            e.out_f = <float*>cnp.PyArray_DATA(<cnp.ndarray>out)
        if b == 0 or self.n == 0:
            return out
        cdef double work = _gemm_work(b * ow, self.n, self.k)
        cdef int parts = team_parts(work), nt = threads_for(work), t
        # whole sequences to each part where there are enough, else each
        # part takes a share of every sequence's windows (merged after)
        cdef bint by_sequence = b >= parts
        cdef Py_ssize_t np16 = cb_q_panels(self.n) * CB_Q_NR, per_part = b * 2 * np16
        ext = np.empty(parts * per_part, dtype=np.int32)
        cdef int32_t* ep = <int32_t*>cnp.PyArray_DATA(<cnp.ndarray>ext)
        cdef const uint8_t* xp = <const uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>x)
        cdef Py_ssize_t lda = self.stride * self.c, seg = w * self.c, s
        cdef int level = cb_q_level()
        with nogil:
            if parts <= 1:
                cb_q_extremes_part(level, xp, lda, seg, 0, b, 0, ow, self.k, self.bp, self.n,
                                   &e, ep)
            else:
                for t in prange(parts, schedule='static', num_threads=nt):
                    if by_sequence:
                        cb_q_extremes_part(level, xp, lda, seg, (b * t) // parts,
                                           (b * (t + 1)) // parts, 0, ow, self.k, self.bp,
                                           self.n, &e, ep + t * per_part)
                    else:
                        cb_q_extremes_part(level, xp, lda, seg, 0, b, (ow * t) // parts,
                                           (ow * (t + 1)) // parts, self.k, self.bp, self.n,
                                           &e, ep + t * per_part)
            team_done(nt)
            for s in range(b):
                if parts <= 1 or by_sequence:
                    t = 0
                    while t + 1 < parts and s >= (b * (t + 1)) // parts:
                        t += 1
                    cb_q_extremes_finish(ep + t * per_part + s * 2 * np16, 1, 0, self.take_max,
                                         self.bp, self.k, self.n, s, &e)
                else:
                    cb_q_extremes_finish(ep + s * 2 * np16, parts, per_part, self.take_max,
                                         self.bp, self.k, self.n, s, &e)
        return out
