# The int8 depthwise convolution of qgemm (include/cyback_qdepthwise.h):
# uint8 activations, one int8 filter per channel, exact int32 sums and
# gemm's requantizing epilogue per channel.

cdef extern from "cyback_qdepthwise.h" nogil:
    ctypedef struct cb_qdw_geometry:
        Py_ssize_t h, w, c
        Py_ssize_t kh, kw, sh, sw, dh, dw, pt, pl
        Py_ssize_t oh, ow
        Py_ssize_t cp
        uint8_t pad
    void cb_qdw_pack(const int8_t* w, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t c,
                     Py_ssize_t cp, int32_t* out)
    int cb_qdw_byte_taps
    int cb_qdw_has_vbmi()
    void cb_qdw_lines(int level, const cb_qdw_geometry* g, const uint8_t* x, const int32_t* wp,
                      const cb_q_epilogue* e, Py_ssize_t r0, Py_ssize_t r1)


def pack_depthwise(w):
    """The packed form of an int8 depthwise kernel (kh, kw, C) for
    ``depthwise_conv``: int32 (kh * kw + 1 + kh, C rounded up to 16), each
    tap's weights widened, each channel's sum over the taps, then per window
    row the first four taps' bytes in one int32 (the byte-tap path's
    operand)."""
    if not isinstance(w, np.ndarray) or w.dtype != np.int8 or w.ndim != 3:
        raise TypeError("pack_depthwise: expected a 3-D int8 array (kh, kw, C), got %s"
                        % _describe(w))
    cdef Py_ssize_t kh = w.shape[0], kw = w.shape[1], taps = kh * kw, c = w.shape[2]
    if taps > CB_Q_MAX_K:
        raise ValueError("pack_depthwise: %d taps are above %d, where int32 sums may overflow"
                         % (taps, CB_Q_MAX_K))
    cdef Py_ssize_t cp = cb_q_panels(c) * CB_Q_NR
    w = np.ascontiguousarray(w)
    out = np.empty((taps + 1 + kh, cp), dtype=np.int32)
    cdef const int8_t* src = <const int8_t*>cnp.PyArray_DATA(w)
    cdef int32_t* dst = <int32_t*>cnp.PyArray_DATA(out)
    with nogil:
        cb_qdw_pack(src, kh, kw, c, cp, dst)
    return out


def _depthwise_byte_taps(on=None):
    """Tests: allow (True) or forbid (False) the byte-tap path of the
    AVX-512 depthwise kernel (None: leave it). Returns whether the path runs
    now: allowed, and the CPU has AVX-512 VBMI."""
    global cb_qdw_byte_taps
    if on is not None:
        cb_qdw_byte_taps = 1 if on else 0
    return bool(cb_qdw_byte_taps and cb_qdw_has_vbmi() and cb_q_level() >= 3)


def depthwise_conv(x, packed, vectors, zero_a, kernel_size, strides=(1, 1), dilation=(1, 1),
                   pads=((0, 0), (0, 0)), activation=None, out_scale=None, out_zero_point=None):
    """The depthwise convolution of uint8 codes x (N, H, W, C) with packed
    weights (``pack_depthwise``) and ``epilogue_vectors`` for C channels:
    per output (n, oy, ox, c), with acc the int32 sum over the window of
    x * w (taps in the padding read ``zero_a``, the code of 0.0),

        y = act(float32(acc - zero_a * wsum[c]) * s[c] + bias[c])

    as float32 (N, OH, OW, C), or uint8 codes with ``out_scale`` and
    ``out_zero_point``, as ``gemm``. ``pads``: ((top, bottom), (left, right))."""
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4:
        raise TypeError("depthwise_conv: expected a 4-D uint8 array (N, H, W, C), got %s"
                        % _describe(x))
    return DepthwiseCall(packed, vectors, x.shape[3], zero_a, kernel_size, strides, dilation,
                         pads, activation, out_scale, out_zero_point)(x)


@cython.final
cdef class DepthwiseCall:
    """``depthwise_conv`` for one packed kernel, its epilogue vectors, C
    channels, a window (size, strides, dilation, pads) and an epilogue,
    checked once: ``call(x)`` returns ``depthwise_conv(x, packed, vectors,
    zero_a, kernel_size, strides, dilation, pads, activation, out_scale,
    out_zero_point)``, with only x's checks per call. Like ``ProductCall``
    it holds no reference to packed or vectors (``matches``)."""
    cdef cb_q_epilogue e
    cdef cb_qdw_geometry g
    cdef Py_ssize_t pb, pr
    cdef const int32_t* wp
    cdef bint quantized
    cdef object packed_ref, vectors_ref

    def __init__(self, packed, vectors, channels, zero_a, kernel_size, strides=(1, 1),
                 dilation=(1, 1), pads=((0, 0), (0, 0)), activation=None, out_scale=None,
                 out_zero_point=None):
        cdef Py_ssize_t kh, kw, sh, sw, dh, dw, pt, pb, pl, pr
        cdef Py_ssize_t c = _index(channels)
        kh, kw = _pair("depthwise_conv", "kernel_size", kernel_size, 1)
        sh, sw = _pair("depthwise_conv", "strides", strides, 1)
        dh, dw = _pair("depthwise_conv", "dilation", dilation, 1)
        try:
            (pt, pb), (pl, pr) = [[_index(v) for v in p] for p in pads]
        except (TypeError, ValueError):
            raise ValueError("depthwise_conv: pads must be ((top, bottom), (left, right)), "
                             "got %r" % (pads,)) from None
        if min(pt, pb, pl, pr) < 0:
            raise ValueError("depthwise_conv: pads must be >= 0, got %r" % (pads,))
        cdef Py_ssize_t cp = cb_q_panels(c) * CB_Q_NR
        if not isinstance(packed, np.ndarray) or packed.dtype != np.int32 or \
                packed.shape != (kh * kw + 1 + kh, cp) or not packed.flags.c_contiguous:
            raise ValueError("depthwise_conv: expected pack_depthwise's int32 (%d, %d) array "
                             "for a %dx%d window on %d channels, got %s"
                             % (kh * kw + 1 + kh, cp, kh, kw, c, _describe(packed)))
        _epilogue("depthwise_conv", &self.e, vectors, c, zero_a, activation, out_scale,
                  out_zero_point, (0, c))
        self.quantized = self.e.out_q != NULL
        self.e.out_f = NULL
        self.e.out_q = NULL
        self.g.c = c
        self.g.kh, self.g.kw, self.g.sh, self.g.sw = kh, kw, sh, sw
        self.g.dh, self.g.dw, self.g.pt, self.g.pl = dh, dw, pt, pl
        self.g.cp = cp
        self.g.pad = <uint8_t>self.e.za
        self.pb, self.pr = pb, pr
        self.wp = <const int32_t*>cnp.PyArray_DATA(packed)
        self.packed_ref = weakref.ref(packed)
        self.vectors_ref = weakref.ref(vectors)

    def matches(self, packed, vectors):
        """Whether this call was made for these arrays (the same objects)."""
        return self.packed_ref() is packed and self.vectors_ref() is vectors

    def __call__(self, x):
        if not cnp.PyArray_Check(x) or cnp.PyArray_TYPE(<cnp.ndarray>x) != cnp.NPY_UINT8 or \
                cnp.PyArray_NDIM(<cnp.ndarray>x) != 4:
            raise TypeError("depthwise_conv: expected a 4-D uint8 array (N, H, W, C), got %s"
                            % _describe(x))
        cdef cb_qdw_geometry g = self.g
        cdef Py_ssize_t b = x.shape[0]
        g.h, g.w = x.shape[1], x.shape[2]
        if x.shape[3] != g.c:
            raise ValueError("depthwise_conv: expected %d channels, got an input of shape %s"
                             % (g.c, x.shape))
        cdef Py_ssize_t eh = g.h + g.pt + self.pb - (g.kh - 1) * g.dh
        cdef Py_ssize_t ew = g.w + g.pl + self.pr - (g.kw - 1) * g.dw
        if eh < 1 or ew < 1:
            raise ValueError("depthwise_conv: the %dx%d window (dilation %s) does not fit the "
                             "padded input %s" % (g.kh, g.kw, (g.dh, g.dw),
                                                  (g.h + g.pt + self.pb, g.w + g.pl + self.pr)))
        g.oh, g.ow = (eh - 1) // g.sh + 1, (ew - 1) // g.sw + 1
        cdef cb_q_epilogue e = self.e
        cdef cnp.npy_intp dims[4]
        dims[0], dims[1], dims[2], dims[3] = b, g.oh, g.ow, g.c
        if self.quantized:
            out = cnp.PyArray_EMPTY(4, dims, cnp.NPY_UINT8, 0)
            e.out_q = <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>out)
        else:
            out = cnp.PyArray_EMPTY(4, dims, cnp.NPY_FLOAT32, 0)
            e.out_f = <float*>cnp.PyArray_DATA(<cnp.ndarray>out)
        e.ldf = e.ldq = g.c
        cdef Py_ssize_t size = b * g.oh * g.ow * g.c
        if size == 0:
            return out
        if not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x):
            x = np.ascontiguousarray(x)
        cdef const uint8_t* src = <const uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>x)
        cdef Py_ssize_t lines = b * g.oh
        cdef int level = cb_q_level()
        # a multiply-add per tap costs about what a byte moved does: about the
        # float kernel's cost per output (its work counts two flops per tap)
        cdef double work = <double>size * g.kh * g.kw
        cdef int parts = team_parts(work), nt = threads_for(work), t
        if parts > lines:
            parts = <int>lines
        with nogil:
            if parts <= 1:
                cb_qdw_lines(level, &g, src, self.wp, &e, 0, lines)
            else:
                for t in prange(parts, schedule='static', num_threads=nt):
                    cb_qdw_lines(level, &g, src, self.wp, &e, (lines * t) // parts,
                                 (lines * (t + 1)) // parts)
        team_done(nt)
        return out
