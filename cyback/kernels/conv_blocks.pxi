# Depthwise blocks run row by row (included by conv.pyx): an optional 1x1 expansion, a depthwise
# convolution and an optional 1x1 projection (MobileNetV2's inverted residual,
# MobileNet's depthwise-separable pair), channels_last.
#
# Run as three layers, a block writes its expanded tensor (112 x 112 x 96
# values per image in MobileNetV2's second block, 4.8 MB) and reads it back,
# then does the same with the depthwise output: at batch 1 that is most of the
# time those layers take, and more than the caches hold. Here each thread
# takes a band of output rows of one image and, for each output row, expands
# the input rows the depthwise taps read that it has not expanded yet (a ring
# of KH rows), runs the depthwise row from the ring and projects that row
# straight into the output: the intermediate rows stay in L1/L2.
#
# The rows are computed by the same kernels as the separate layers: the 1x1
# products by the direct kernel (include/cyback_conv_direct.h, one image row
# as a row of pixels), the depthwise row by include/cyback_depthwise_last.h.
# Every output's sums run in the order of those kernels whatever the bands,
# so the result does not depend on the thread count; a band's first rows
# repeat the expansion of the rows its neighbour also reads (to the same
# bits).

cdef extern from "cyback_depthwise.h" nogil:
    void cb_depthwise_fwd_cl_row_f(
        const float** xr, const float* k, float* y, Py_ssize_t C, Py_ssize_t xs, Py_ssize_t W,
        Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dil_w,
        Py_ssize_t pw, const float* bias, int act, const void* pf, Py_ssize_t pfb)
    void cb_depthwise_fwd_cl_row_d(
        const double** xr, const double* k, double* y, Py_ssize_t C, Py_ssize_t xs,
        Py_ssize_t W, Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dil_w,
        Py_ssize_t pw, const double* bias, int act, const void* pf, Py_ssize_t pfb)

#: The most tap rows of the depthwise kernel (its ring of expanded rows).
BLOCK_MAX_TAP_ROWS = 16
#: The most channels of any stage (the direct kernel's bound).
BLOCK_MAX_CHANNELS = CB_CD_MAX_C

cdef struct _BlockShape:
    Py_ssize_t H, W, C, E, F, KH, KW, OH, OW, sh, sw, ph, pw
    bint expand, project


cdef inline void _block_pointwise_row(const floating* x, const floating* wp,
                                      const floating* bp, const floating* res, int act,
                                      floating* y, const cb_cd_geom* g) noexcept nogil:
    # y (W, F) = act(x (W, C) @ kernel + bias + res), one row of g's pixels,
    # every block of output channels
    cdef Py_ssize_t b
    for b in range(g.nfb):
        if floating is float:
            cb_cd_item_f(x, wp, bp, res, act, y, g, b)
        else:
            cb_cd_item_d(x, wp, bp, res, act, y, g, b)


cdef void _block_band(const floating* x, Py_ssize_t n, Py_ssize_t oh0, Py_ssize_t oh1,
                      const _BlockShape* s, const floating* wpe, const floating* bpe, int act_e,
                      const cb_cd_geom* ge, const floating* kd, const floating* bd, int act_d,
                      const floating* wpp, const floating* bpp, int act_p,
                      const cb_cd_geom* gp, const floating* res, floating* y, floating* ring,
                      floating* mid) noexcept nogil:
    # Output rows [oh0, oh1) of image n. ring: KH expanded rows (W x E each),
    # expanded row ih in slot ih % KH; mid: one depthwise output row (OW x E)
    # when the block projects.
    cdef const floating* xr[16]        # BLOCK_MAX_TAP_ROWS
    cdef Py_ssize_t oh, ky, ih, done = -1
    cdef Py_ssize_t row_in = s.W * s.C, row_e = s.W * s.E
    cdef floating* slot
    cdef floating* out
    cdef const floating* r
    cdef const void* pf
    cdef Py_ssize_t pfb
    for oh in range(oh0, oh1):
        for ky in range(s.KH):
            ih = oh * s.sh - s.ph + ky
            if ih < 0 or ih >= s.H:
                xr[ky] = NULL
            elif s.expand:
                slot = ring + (ih % s.KH) * row_e
                if ih > done:
                    _block_pointwise_row(x + (n * s.H + ih) * row_in, wpe, bpe,
                                         <const floating*> NULL, act_e, slot, ge)
                    done = ih
                xr[ky] = slot
            else:
                xr[ky] = x + (n * s.H + ih) * row_in
        out = mid if s.project else y + (n * s.OH + oh) * s.OW * s.E
        # read in place, the rows the next output row adds are fetched while
        # this one computes
        pf = NULL
        pfb = 0
        if not s.expand:
            ih = (oh + 1) * s.sh - s.ph + s.KH - s.sh
            if ih < 0:
                ih = 0
            if oh + 1 < oh1 and ih < s.H:
                pf = x + (n * s.H + ih) * row_in
                pfb = (s.sh if ih + s.sh <= s.H else s.H - ih) * row_in * sizeof(floating)
        if floating is float:
            cb_depthwise_fwd_cl_row_f(xr, kd, out, s.E, s.E, s.W, s.KH, s.KW, s.OW, s.sw, 1,
                                      s.pw, bd, act_d, pf, pfb)
        else:
            cb_depthwise_fwd_cl_row_d(xr, kd, out, s.E, s.E, s.W, s.KH, s.KW, s.OW, s.sw, 1,
                                      s.pw, bd, act_d, pf, pfb)
        if s.project:
            r = res
            if r != NULL:
                r = r + (n * s.OH + oh) * s.OW * s.F
            _block_pointwise_row(mid, wpp, bpp, r, act_p, y + (n * s.OH + oh) * s.OW * s.F, gp)


cdef cb_cd_geom _block_row_geom(Py_ssize_t W, Py_ssize_t C, Py_ssize_t F, bint dbl):
    # a 1x1 convolution over one row of W pixels, C -> F channels
    cdef cb_cd_geom g
    g.N = 1
    g.C = C
    g.F = F
    g.D = 1
    g.H = 1
    g.W = W
    g.Wp = W
    g.pw = 0
    g.OD = 1
    g.OH = 1
    g.OW = W
    g.KD = 1
    g.KH = 1
    g.KW = 1
    g.sd = 1
    g.sh = 1
    g.sw = 1
    g.dil_d = 1
    g.dil_h = 1
    g.dil_w = 1
    g.pd = 0
    g.ph = 0
    g.FB = cb_cd_block_for(dbl, F)
    g.nfb = (F + g.FB - 1) // g.FB
    cb_cd_prepare(&g, 0)
    return g


cdef void _block_pack(const floating* k, const floating* bias, floating* wp, floating* bp,
                const cb_cd_geom* g) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(g.nfb):
        if floating is float:
            cb_cd_pack_block_f(k, bias, wp, bp, g, b)
        else:
            cb_cd_pack_block_d(k, bias, wp, bp, g, b)


def _run_block(floating[:, :, :, ::1] x, floating[::1] ke, floating[::1] be, int act_e,
               floating[::1] kd, floating[::1] bd, int act_d, floating[::1] kp,
               floating[::1] bp, int act_p, floating[::1] res, floating[::1] y,
               floating[::1] scratch, _BlockShape s, bint has_be, bint has_bd, bint has_bp,
               bint has_res, Py_ssize_t bands, int nt):
    cdef bint dbl = floating is double
    cdef cb_cd_geom ge, gp
    cdef Py_ssize_t N = x.shape[0], items = N * bands, it, n, band, per, oh0, oh1
    cdef Py_ssize_t ring_size = s.KH * s.W * s.E, mid_size = s.OW * s.E
    cdef Py_ssize_t thread_size = 0, packed_e = 0, packed_p = 0, tid
    cdef floating* base = &scratch[0]
    cdef floating* wpe = NULL
    cdef floating* bpe = NULL
    cdef floating* wpp = NULL
    cdef floating* bpp = NULL
    cdef const floating* r = &res[0] if has_res else NULL
    cdef const floating* bdp = &bd[0] if has_bd else NULL
    cdef cb_intr intr
    if s.expand:
        ge = _block_row_geom(s.W, s.C, s.E, dbl)
        packed_e = ge.nfb * ge.FB * (s.C + 1)
    if s.project:
        gp = _block_row_geom(s.OW, s.E, s.F, dbl)
        packed_p = gp.nfb * gp.FB * (s.E + 1)
    thread_size = (ring_size if s.expand else 0) + (mid_size if s.project else 0)
    # the packed kernels first, then each thread's ring and row
    if s.expand:
        wpe = base
        bpe = base + ge.nfb * ge.FB * s.C if has_be else NULL
        _block_pack(&ke[0], &be[0] if has_be else NULL, wpe, bpe, &ge)
    if s.project:
        wpp = base + packed_e
        bpp = wpp + gp.nfb * gp.FB * s.E if has_bp else NULL
        _block_pack(&kp[0], &bp[0] if has_bp else NULL, wpp, bpp, &gp)
    base = base + packed_e + packed_p
    tid = 0
    per = (s.OH + bands - 1) // bands
    cb_intr_init(&intr)
    with nogil, parallel(num_threads=nt):
        tid = threadid()
        for it in prange(items, schedule="dynamic", chunksize=1):
            if cb_intr_poll(&intr):
                continue
            n = it // bands
            band = it % bands
            oh0 = band * per
            oh1 = oh0 + per
            if oh1 > s.OH:
                oh1 = s.OH
            if oh0 < oh1:
                _block_band(&x[0, 0, 0, 0], n, oh0, oh1, &s, wpe, bpe, act_e, &ge, &kd[0], bdp,
                            act_d, wpp, bpp, act_p, &gp, r, &y[0], base + tid * thread_size,
                            base + tid * thread_size + (ring_size if s.expand else 0))
    team_done(nt)
    check_interrupt(&intr)


def _block_stage(name, stage, Py_ssize_t cin, dtype, bint depthwise=False):
    """(kernel flattened, bias flattened or None, activation code, output
    channels) of a stage ``(kernel, bias, activation)``, checked."""
    if not isinstance(stage, tuple) or len(stage) != 3:
        raise TypeError("block_forward: %s must be (kernel, bias, activation), got %r"
                        % (name, type(stage).__name__))
    kernel, bias, act = stage
    if not isinstance(kernel, np.ndarray) or kernel.dtype != dtype:
        raise TypeError("block_forward: the %s kernel must be a %s array like x"
                        % (name, np.dtype(dtype).name))
    if depthwise:
        if kernel.ndim != 3 or kernel.shape[2] != cin:
            raise ValueError("block_forward: the depthwise kernel must be (KH, KW, %d), got "
                             "shape %s" % (cin, kernel.shape))
        cout = cin
    else:
        if kernel.ndim != 2 or kernel.shape[0] != cin:
            raise ValueError("block_forward: the %s kernel must be (%d, channels out), got "
                             "shape %s" % (name, cin, kernel.shape))
        cout = kernel.shape[1]
    if cout < 1 or cout > BLOCK_MAX_CHANNELS:
        raise ValueError("block_forward: the %s stage has %d channels; 1 to %d run here"
                         % (name, cout, BLOCK_MAX_CHANNELS))
    if bias is not None and (not isinstance(bias, np.ndarray) or bias.dtype != dtype or
                             bias.shape != (cout,)):
        raise ValueError("block_forward: the %s bias must be a (%d,) %s array"
                         % (name, cout, np.dtype(dtype).name))
    if act not in _ACTIVATIONS:
        raise ValueError("block_forward: the %s activation must be None, 'relu' or 'relu6', "
                         "got %r" % (name, act))
    return (np.ascontiguousarray(kernel).reshape(-1),
            None if bias is None else np.ascontiguousarray(bias), _ACTIVATIONS[act], cout)


def block_forward(x, expand, depthwise, project, residual=None, strides=(1, 1),
                  pads=((0, 0), (0, 0)), Py_ssize_t bands=0):
    """The block ``act_p(act_d(dw(act_e(x @ ke + be)) + bd) @ kp + bp +
    residual)`` of a channels_last ``x`` (N, H, W, C), float32 or float64.

    ``expand`` and ``project`` are ``(kernel (Cin, Cout), bias (Cout,) or
    None, activation)`` or None (no such stage); ``depthwise`` is
    ``(kernel (KH, KW, E), bias or None, activation)`` (depth multiplier 1,
    no dilation) with ``strides`` (sh, sw) and explicit ``pads`` ((top,
    bottom), (left, right)); activations are None, 'relu' or 'relu6'.
    ``residual`` (only with a projection) is added before the projection's
    activation and has the output's shape. ``bands``: output-row bands per
    image (0: enough for the thread team); any value gives the same result.
    Returns the (N, OH, OW, F) output."""
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64):
        raise TypeError("block_forward: x must be a float32 or float64 array")
    if x.ndim != 4:
        raise ValueError("block_forward: x must be (N, H, W, C), got shape %s" % (x.shape,))
    if depthwise is None:
        raise ValueError("block_forward: a block needs its depthwise stage")
    if residual is not None and project is None:
        raise ValueError("block_forward: a residual needs the projection")
    dtype = x.dtype
    N, H, W, C = x.shape
    ke = be = kp = bp = None
    act_e = act_p = 0
    E = C
    if expand is not None:
        ke, be, act_e, E = _block_stage("expand", expand, C, dtype)
    kd, bd, act_d, _ = _block_stage("depthwise", depthwise, E, dtype, depthwise=True)
    KH, KW = depthwise[0].shape[:2]
    F = E
    if project is not None:
        kp, bp, act_p, F = _block_stage("project", project, E, dtype)
    if C < 1 or C > BLOCK_MAX_CHANNELS:
        raise ValueError("block_forward: x has %d channels; 1 to %d run here"
                         % (C, BLOCK_MAX_CHANNELS))
    if KH < 1 or KW < 1 or KH > BLOCK_MAX_TAP_ROWS:
        raise ValueError("block_forward: the depthwise kernel must have 1 to %d rows of "
                         "taps, got %s" % (BLOCK_MAX_TAP_ROWS, depthwise[0].shape[:2]))
    try:
        (pt, pb), (pl, pr) = pads
        sh, sw = strides
        pt, pb, pl, pr, sh, sw = (int(v) for v in (pt, pb, pl, pr, sh, sw))
    except (TypeError, ValueError):
        raise ValueError("block_forward: pads must be ((top, bottom), (left, right)) and "
                         "strides (sh, sw), got %r and %r" % (pads, strides))
    if sh < 1 or sw < 1 or min(pt, pb, pl, pr) < 0:
        raise ValueError("block_forward: strides must be positive and pads non-negative, "
                         "got %r and %r" % (strides, pads))
    OH = (H + pt + pb - KH) // sh + 1
    OW = (W + pl + pr - KW) // sw + 1
    if OH < 1 or OW < 1:
        raise ValueError("block_forward: a %dx%d input with pads %r is smaller than the "
                         "%dx%d kernel" % (H, W, pads, KH, KW))
    y = np.empty((N, OH, OW, F), dtype)
    if residual is not None and (not isinstance(residual, np.ndarray) or
                                 residual.dtype != dtype or residual.shape != y.shape):
        raise ValueError("block_forward: the residual must be a %s array of shape %s"
                         % (np.dtype(dtype).name, y.shape))
    if N == 0:
        return y
    x = np.ascontiguousarray(x)
    if residual is not None:
        residual = np.ascontiguousarray(residual).reshape(-1)
    cdef _BlockShape s
    s.H, s.W, s.C, s.E, s.F, s.KH, s.KW = H, W, C, E, F, KH, KW
    s.OH, s.OW, s.sh, s.sw, s.ph, s.pw = OH, OW, sh, sw, pt, pl
    s.expand, s.project = expand is not None, project is not None
    cdef int parts = team_size()
    if bands < 1:
        # bands x images a multiple of the team, so that its threads end
        # together, in as few bands as that takes: a band expands again the
        # rows its neighbour also reads (at batch 1 on two threads, 2 bands
        # beat 4 and more by 3-20%, and 3 leave a thread idle a third of the
        # time: benchmarks/bench_conv.py --blocks); no band under 4 rows
        bands = max(1, min(parts // gcd(N, parts), OH // 4))
    bands = min(bands, OH)
    dbl = dtype == np.float64
    fe = cb_cd_block_for(dbl, E)
    ff = cb_cd_block_for(dbl, F)
    packed = ((E + fe - 1) // fe * fe * (C + 1) if s.expand else 0) + \
        ((F + ff - 1) // ff * ff * (E + 1) if s.project else 0)
    per_thread = (KH * W * E if s.expand else 0) + (OW * E if s.project else 0)
    cdef int nt = threads_for(2.0 * N * OH * OW * E * (KH * KW + (C if s.expand else 0) +
                                                       (F if s.project else 0)) / 8.0)
    nt = max(1, min(nt, N * bands))
    scratch = np.empty(max(1, packed + nt * per_thread), dtype)
    dummy = scratch[:1]
    _run_block(x, dummy if ke is None else ke, dummy if be is None else be, act_e, kd,
         dummy if bd is None else bd, act_d, dummy if kp is None else kp,
         dummy if bp is None else bp, act_p, dummy if residual is None else residual,
         y.reshape(-1), scratch, s, be is not None, bd is not None, bp is not None,
         residual is not None, bands, nt)
    return y
