# The direct kernels (included by conv.pyx): include/cyback_conv_direct.h for
# the forward pass and include/cyback_conv_wgrad.h for the kernel gradient.
#
# The dispatcher picks the forward kernel (_use_direct) for channels_last
# layers with few input channels and short patches, or wider ones with
# enough pixels, when neither Winograd nor the 1x1 GEMM tiles took the call;
# it reads the input in place and applies the bias / residual / activation
# epilogue in registers. conv_backward_kernel picks the kernel-gradient one
# (_use_direct_wgrad) for channels_last layers with few input channels and a
# gradient that stays in L2. The switches at the end choose among the
# kernels' instruction sets and tile shapes (tests and benchmarks).


cdef extern from "cyback_conv_direct.h" nogil:
    ctypedef struct cb_cd_geom:
        Py_ssize_t N, C, F, D, H, W, Wp, pw, OD, OH, OW, KD, KH, KW
        Py_ssize_t sd, sh, sw, dil_d, dil_h, dil_w, pd, ph, FB, nfb
    enum: CB_CD_MAX_ROWS
    enum: CB_CD_MAX_C
    int cb_simd_use_avx2(int on)
    void cb_simd_set_default_cap(int cap)
    int cb_simd_use_avx512(int on)
    int cb_simd_has_avx512()
    Py_ssize_t cb_cd_block(int dbl)
    Py_ssize_t cb_cd_block_for(int dbl, Py_ssize_t F)
    int cb_cd_pads_itself()
    int cb_cd_use_wide_tiles(int w)
    int cb_cd_use_quad_blocks(int on)
    int cb_cd_wide_tiles()
    void cb_cd_prepare(cb_cd_geom* g, Py_ssize_t xw0)
    void cb_cd_pack_block_f(const float* k, const float* bias, float* wp, float* bp,
                            const cb_cd_geom* g, Py_ssize_t b)
    void cb_cd_pack_block_d(const double* k, const double* bias, double* wp, double* bp,
                            const cb_cd_geom* g, Py_ssize_t b)
    void cb_cd_pad_row_f(const float* x, float* xp, const cb_cd_geom* g, Py_ssize_t row)
    void cb_cd_pad_row_d(const double* x, double* xp, const cb_cd_geom* g, Py_ssize_t row)
    void cb_cd_item_f(const float* x, const float* wp, const float* bp, const float* res,
                      int act, float* y, const cb_cd_geom* g, Py_ssize_t it)
    void cb_cd_item_d(const double* x, const double* wp, const double* bp, const double* res,
                      int act, double* y, const cb_cd_geom* g, Py_ssize_t it)
    ctypedef struct cb_cd_out:
        Py_ssize_t D, H, W, d0, h0, w0, sd, sh, sw, xw0
    void cb_cd_item_out_f(const float* x, const float* wp, const float* bp, const float* res,
                          int act, float* y, const cb_cd_geom* g, Py_ssize_t it,
                          const cb_cd_out* out)
    void cb_cd_item_out_d(const double* x, const double* wp, const double* bp,
                          const double* res, int act, double* y, const cb_cd_geom* g,
                          Py_ssize_t it, const cb_cd_out* out)

# CYBACK_AVX512=0 caps this module's vector kernels at AVX2 (the registry reads it).
cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)

cdef extern from "cyback_conv_wgrad.h" nogil:
    enum: CB_CWG_ROWS
    void cb_cwg_item_f(const float* x, const float* dy, float* part, const cb_cd_geom* g,
                       Py_ssize_t it)
    void cb_cwg_item_d(const double* x, const double* dy, double* part, const cb_cd_geom* g,
                       Py_ssize_t it)


cdef void _forward_direct(const floating* x, floating* xp, bint copy, const floating* k,
                          const floating* bias, floating* wp, floating* bp, const floating* res,
                          int act, floating* y, cb_cd_geom g, int nt, cb_intr* intr,
                          double join) noexcept:
    """include/cyback_conv_direct.h over work items of one output row and
    one block of output channels, after packing the kernel (and bias) into
    wp (and bp) and, when copy, padding the input along W into xp; bias,
    bp and res are NULL without a bias or residual."""
    cdef Py_ssize_t nprep = g.nfb + (g.N * g.D * g.H if copy else 0)
    # (set here: the parallel block copies them in, firstprivate)
    cdef Py_ssize_t total = g.N * g.OD * g.OH * g.nfb, it = 0, c = 0, last = 0
    # Runs of consecutive items (rows that share input rows, blocks that
    # share a row), about 4 per thread, taken as threads come free.
    cdef Py_ssize_t run = max(1, (total + 4 * nt - 1) // (4 * nt))
    cdef const floating* src = xp if copy else x
    cdef cb_tiles prepared, items
    cb_tiles_init(&prepared)
    cb_tiles_init(&items)
    # One parallel region: waking a sleeping team costs more than a small
    # convolution, so the packing, the padding and the rows share one
    # wake-up. Packed in the region, the kernel also leaves no serial gap
    # before it, which at batch 1 (packing, then the call's Python) can
    # outlast the idle threads' spin and put them to sleep at every call
    # (docs/performance.md, "How idle threads wait"). Both phases hand out their work as threads
    # come free, with no barrier at their start (a prange has one, for the
    # index GCC makes firstprivate and lastprivate): a thread that joins late
    # finds its share taken instead of holding the others at a barrier or
    # in the join. The rows wait for the packed kernel and padded input by
    # count, and the region ends with a bounded spin (include/cyback_tiles.h).
    with nogil, parallel(num_threads=nt):
        it = cb_tiles_take(&prepared)
        while it < nprep:
            if it < g.nfb:
                if floating is float:
                    cb_cd_pack_block_f(k, bias, wp, bp, &g, it)
                else:
                    cb_cd_pack_block_d(k, bias, wp, bp, &g, it)
            elif floating is float:
                cb_cd_pad_row_f(x, xp, &g, it - g.nfb)
            else:
                cb_cd_pad_row_d(x, xp, &g, it - g.nfb)
            cb_tiles_finish(&prepared)
            it = cb_tiles_take(&prepared)
        cb_tiles_wait_done(&prepared, nprep)
        c = cb_tiles_take(&items) * run
        while c < total:
            last = min(c + run, total)
            while c < last and not cb_intr_poll(intr):
                if floating is float:
                    cb_cd_item_f(src, wp, bp, res, act, y, &g, c)
                else:
                    cb_cd_item_d(src, wp, bp, res, act, y, &g, c)
                c = c + 1
            c = cb_tiles_take(&items) * run
        cb_tiles_join(&items, cb_get_num_threads(), join)


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_direct(g, last, bint dbl=False):
    """Whether a forward convolution runs the direct kernel.

    It reads the input in place (no patch matrix) and keeps a 6 x FB output
    tile in registers, which wins while the patch length K = taps * C is
    short, and on wider layers with enough pixels (below); past that,
    im2col + BLAS's packed GEMM is faster (see benchmarks/bench_conv.py,
    "direct" rows). With half a block of output channels or fewer, most of
    the tile's lanes would be idle, so such layers take im2col."""
    if not last or not _TUNE["direct"] or g["KD"] * g["KH"] > CB_CD_MAX_ROWS \
            or g["C"] > CB_CD_MAX_C:
        return False
    if 2 * g["F"] <= cb_cd_block(dbl):
        return False
    if g["C"] <= _TUNE["direct_max_c"] and g["K"] <= _TUNE["direct_max_k"]:
        return True
    # Wider layers: the direct kernel streams a block's packed kernel (K *
    # FB values) once per tile, from L2 while it fits there (K <= 4608:
    # 3x3 x 512 is 288 KB of floats); BLAS packs it once per GEMM, which
    # pays when a call has few pixels: hence the floor on pixels
    # (benchmarks/bench_conv.py, "direct" rows).
    return g["C"] <= min(_TUNE["direct_wide_max_c"], CB_CD_MAX_C) and \
        g["K"] <= _TUNE["direct_wide_max_k"] and \
        g["N"] * g["OD"] * g["OH"] * g["OW"] >= _TUNE["direct_wide_min_pixels"]


cdef class _DirectGeom:
    """The direct kernel's geometry for one convolution geometry and block
    width, with its buffer sizes: built once, not on every call."""
    cdef cb_cd_geom g
    cdef Py_ssize_t wp_size, bp_size, xp_size
    cdef bint copy


# (id of a cached geometry dict, block width) -> (that dict, _DirectGeom);
# the dict is held so that its id is not reused while the entry lives.
_DIRECT_GEOMS = {}


@cython.wraparound(True)
@cython.boundscheck(True)
cdef _DirectGeom _direct_geom(g, Py_ssize_t FB):
    cdef _DirectGeom d
    entry = _DIRECT_GEOMS.get((id(g), FB))
    if entry is not None and entry[0] is g:
        return entry[1]
    d = _DirectGeom()
    nfb = (g["F"] + FB - 1) // FB
    reach = (g["OW"] - 1) * g["sw"] + (g["KW"] - 1) * g["dil_w"] + 1
    row = g["W"] if _skip_pad() else max(reach, g["pw"] + g["W"])
    geom = dict(N=g["N"], C=g["C"], F=g["F"], D=g["D"], H=g["H"], W=g["W"], Wp=row,
                pw=g["pw"], OD=g["OD"], OH=g["OH"], OW=g["OW"], KD=g["KD"], KH=g["KH"],
                KW=g["KW"], sd=g["sd"], sh=g["sh"], sw=g["sw"], dil_d=g["dil_d"], dil_h=g["dil_h"],
                dil_w=g["dil_w"], pd=g["pd"], ph=g["ph"], FB=FB, nfb=nfb)
    if g["K"] == g["C"] and (g["OD"], g["OH"], g["OW"]) == (g["D"], g["H"], g["W"]) and \
            g["sd"] == g["sh"] == g["sw"] == 1 and g["pd"] == g["ph"] == g["pw"] == 0:
        # A 1x1 convolution reads its input as one run of pixels: rows of up
        # to 128 of them spread a work item's set-up over more tiles than
        # the image's own rows (32 pixels at batch 1 in MobileNet blocks).
        pixels = g["N"] * g["D"] * g["H"] * g["W"]
        cols = _pointwise_row(pixels, g["W"])
        geom.update(N=1, D=1, OD=1, H=pixels // cols, OH=pixels // cols, W=cols, OW=cols,
                    Wp=cols)
    d.g = geom
    cb_cd_prepare(&d.g, 0)
    d.wp_size = nfb * FB * g["K"]
    d.bp_size = nfb * FB
    d.copy = row != g["W"]
    d.xp_size = g["N"] * g["D"] * g["H"] * row * g["C"] if d.copy else 1
    if len(_DIRECT_GEOMS) >= 512:
        _DIRECT_GEOMS.clear()
    _DIRECT_GEOMS[(id(g), FB)] = (g, d)
    return d


def _pointwise_row(Py_ssize_t pixels, Py_ssize_t width):
    """The longest row of at most 128 pixels that divides ``pixels`` into
    whole rows (``width`` itself, a divisor, when it is longer)."""
    cdef Py_ssize_t cols, best = width
    for cols in range(width + 1, 129):
        if pixels % cols == 0:
            best = cols
    return best


def _skip_pad():
    """Whether the direct kernel reads the input rows as they are, its tiles
    at each row's ends checking their taps against the W padding (the vector
    kernels can), rather than a zero-padded copy (the scalar kernel needs
    one; _TUNE["direct_skip_pad"] forces either for tests). The copy is a
    pass over the input and a barrier, a noticeable share of a narrow 3x3
    convolution's time."""
    return bool(cb_cd_pads_itself()) and _TUNE["direct_skip_pad"] is not False


def _run_direct(x, kernel, y, g, bias, residual, int act, int nt):
    cdef bint dbl = x.dtype == np.float64
    cdef _DirectGeom d = _direct_geom(g, cb_cd_block_for(dbl, g["F"]))
    wp = np.empty(d.wp_size, dtype=x.dtype)
    has_bias = bias is not None
    bp = np.empty(d.bp_size if has_bias else 1, dtype=x.dtype)
    has_res = residual is not None
    _direct(d, _flat(x), np.empty(d.xp_size, dtype=x.dtype) if d.copy else bp, _flat(kernel),
            bias if has_bias else bp, has_bias, wp, bp, _flat(residual) if has_res else bp,
            has_res, act, _flat(y), nt)


def _direct(_DirectGeom d, floating[::1] x, floating[::1] xp, floating[::1] k,
            floating[::1] bias, bint has_bias, floating[::1] wp, floating[::1] bp,
            floating[::1] res, bint has_res, int act, floating[::1] y, int nt):
    """The kernel and bias packed into wp and bp, then the direct forward
    convolution (typed with the fused float type: Cython picks the float or
    double specialisation from the arrays)."""
    cdef cb_intr intr
    cdef floating* b = &bp[0] if has_bias else NULL
    cb_intr_init(&intr)
    _forward_direct[floating](&x[0], &xp[0], d.copy, &k[0], &bias[0] if has_bias else NULL,
                              &wp[0], b, &res[0] if has_res else NULL, act, &y[0], d.g, nt,
                              &intr, join_seconds())
    check_interrupt(&intr)


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_direct_wgrad(g, bint last, bint dbl):
    """Whether a kernel gradient runs the direct kernel (cyback_conv_wgrad.h):
    channels_last, output channels in whole vector pairs, few input channels
    and a gradient (each group's partial sums, read and written by every
    tile) that stays in L2. Those are the products (taps * C x F outputs over
    every pixel) that BLAS runs slowly. Past those bounds (direct_wgrad_max_c,
    direct_wgrad_max_bytes) the tap GEMMs are faster, even with the output
    channels split into ranges whose gradient fits L2."""
    return last and _TUNE["direct_wgrad"] and cb_cd_pads_itself() and \
        g["F"] % cb_cd_block(dbl) == 0 and g["C"] <= _TUNE["direct_wgrad_max_c"] and \
        g["K"] * g["F"] * (8 if dbl else 4) <= _TUNE["direct_wgrad_max_bytes"]


def _backward_kernel_direct(floating[::1] x, floating[::1] dy, floating[::1] parts,
                            floating[::1] dk, cb_cd_geom g, Py_ssize_t nitems,
                            Py_ssize_t ngroups, int nt):
    """Each group of work items (blocks of output rows) sums into its own
    partial gradient; the partials are then added in group order, so the
    result does not depend on the thread count."""
    cdef Py_ssize_t KF = g.KD * g.KH * g.KW * g.C * g.F
    cdef Py_ssize_t per = (nitems + ngroups - 1) // ngroups, gi, it, i
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        for gi in prange(ngroups, schedule='static', num_threads=nt):
            memset(&parts[gi * KF], 0, KF * sizeof(floating))
            for it in range(gi * per, min(gi * per + per, nitems)):
                if cb_intr_poll(&intr):
                    break
                if floating is float:
                    cb_cwg_item_f(&x[0], &dy[0], &parts[gi * KF], &g, it)
                else:
                    cb_cwg_item_d(&x[0], &dy[0], &parts[gi * KF], &g, it)
        _sum_parts(&parts[0], &dk[0], KF, ngroups)
    check_interrupt(&intr)


def _run_backward_kernel_direct(x, dy, dk, g, int nt):
    """dk = the kernel gradient by the direct kernel, each group of work
    items (blocks of CB_CWG_ROWS output rows) into a partial of its own."""
    cdef cb_cd_geom dg
    nitems = g["N"] * g["OD"] * ((g["OH"] + CB_CWG_ROWS - 1) // CB_CWG_ROWS)
    kf = g["K"] * g["F"]
    ngroups = _groups(nitems, kf, x.itemsize)
    dg = dict(N=g["N"], C=g["C"], F=g["F"], D=g["D"], H=g["H"], W=g["W"], Wp=g["W"],
              pw=g["pw"], OD=g["OD"], OH=g["OH"], OW=g["OW"], KD=g["KD"], KH=g["KH"],
              KW=g["KW"], sd=g["sd"], sh=g["sh"], sw=g["sw"], dil_d=g["dil_d"], dil_h=g["dil_h"],
              dil_w=g["dil_w"], pd=g["pd"], ph=g["ph"], FB=g["F"], nfb=1)
    cb_cd_prepare(&dg, 0)
    _backward_kernel_direct(_flat(x), _flat(dy), np.empty(ngroups * kf, dtype=x.dtype),
                            _flat(dk), dg, nitems, ngroups, nt)


def _direct_block_width(bint dbl, Py_ssize_t F=0):
    """Output channels per block of the direct kernel set that runs now, for
    F output channels (0: the AVX2 or baseline width)."""
    return cb_cd_block_for(dbl, F)


def _use_avx2(bint on):
    """Run the direct kernel's AVX2 + FMA set when the CPU has it (the
    default), or the baseline one (for tests). Returns whether AVX2 now runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let the direct kernel's AVX-512 set run when the CPU has it (the
    default), or cap it at AVX2 (for tests). Returns whether AVX-512 now runs."""
    return bool(cb_simd_use_avx512(on))


def _use_wide_tiles(wide=None):
    """Run the direct kernel's float32 AVX-512 rows in tiles of 12 pixels
    (True), of 6 (False) or as the CPU suits (None, the default: 6 where
    512-bit FMAs run at half rate, include/cyback_conv_direct.h). The same
    sums either way; for tests and benchmarks. Returns whether the
    12-pixel tiles now run."""
    return bool(cb_cd_use_wide_tiles(-1 if wide is None else int(bool(wide))))


def _use_quad_blocks(bint on=True):
    """Let float32 layers of a multiple of 64 channels take the direct
    kernel's 64-channel blocks where its 6-pixel AVX-512 tiles run (True,
    the default), or keep 32-channel blocks (False): the same sums either
    way; for tests and benchmarks. Prepared calls re-plan."""
    cb_cd_use_quad_blocks(on)
    _TUNE.version += 1
    return on
