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
    cdef Py_ssize_t kh, kw, sh, sw, dh, dw, pt, pb, pl, pr
    kh, kw = _pair("depthwise_conv", "kernel_size", kernel_size, 1)
    sh, sw = _pair("depthwise_conv", "strides", strides, 1)
    dh, dw = _pair("depthwise_conv", "dilation", dilation, 1)
    try:
        (pt, pb), (pl, pr) = [[_index(v) for v in p] for p in pads]
    except (TypeError, ValueError):
        raise ValueError("depthwise_conv: pads must be ((top, bottom), (left, right)), got %r"
                         % (pads,)) from None
    if min(pt, pb, pl, pr) < 0:
        raise ValueError("depthwise_conv: pads must be >= 0, got %r" % (pads,))
    cdef Py_ssize_t b = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef Py_ssize_t cp = cb_q_panels(c) * CB_Q_NR
    if not isinstance(packed, np.ndarray) or packed.dtype != np.int32 or \
            packed.shape != (kh * kw + 1 + kh, cp) or not packed.flags.c_contiguous:
        raise ValueError("depthwise_conv: expected pack_depthwise's int32 (%d, %d) array for a "
                         "%dx%d window on %d channels, got %s"
                         % (kh * kw + 1 + kh, cp, kh, kw, c, _describe(packed)))
    cdef Py_ssize_t eh = h + pt + pb - (kh - 1) * dh, ew = w + pl + pr - (kw - 1) * dw
    if eh < 1 or ew < 1:
        raise ValueError("depthwise_conv: the %dx%d window (dilation %s) does not fit the "
                         "padded input %s" % (kh, kw, (dh, dw), (h + pt + pb, w + pl + pr)))
    cdef Py_ssize_t oh = (eh - 1) // sh + 1, ow = (ew - 1) // sw + 1
    cdef cb_q_epilogue e
    out = _epilogue("depthwise_conv", &e, vectors, c, zero_a, activation, out_scale,
                    out_zero_point, (b, oh, ow, c))
    if out.size == 0:
        return out
    x = np.ascontiguousarray(x)
    cdef cb_qdw_geometry g
    g.h, g.w, g.c = h, w, c
    g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl = kh, kw, sh, sw, dh, dw, pt, pl
    g.oh, g.ow, g.cp = oh, ow, cp
    g.pad = <uint8_t>e.za
    cdef const uint8_t* src = <const uint8_t*>cnp.PyArray_DATA(x)
    cdef const int32_t* wp = <const int32_t*>cnp.PyArray_DATA(packed)
    cdef Py_ssize_t lines = b * oh
    cdef int level = cb_q_level()
    # a multiply-add per tap costs about what a byte moved does: about the
    # float kernel's cost per output (its work counts two flops per tap)
    cdef double work = <double>out.size * kh * kw
    cdef int parts = team_parts(work), nt = threads_for(work), t
    if parts > lines:
        parts = <int>lines
    with nogil:
        if parts <= 1:
            cb_qdw_lines(level, &g, src, wp, &e, 0, lines)
        else:
            for t in prange(parts, schedule='static', num_threads=nt):
                cb_qdw_lines(level, &g, src, wp, &e, (lines * t) // parts,
                             (lines * (t + 1)) // parts)
    team_done(nt)
    return out
