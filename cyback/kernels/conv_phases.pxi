# Phases of a strided input gradient (included by conv.pyx).
#
# conv_backward_input takes this path for a strided input gradient (a
# transposed convolution's forward pass) with few enough channels
# (_use_phases): one stride-1 convolution per phase of the strides, which
# the direct kernel writes straight into its interleaved places in dx; no
# patch matrix, no scatter-add. channels_first runs between two
# channels_last copies.


cdef struct Phases:
    Py_ssize_t nph, most, wp_size
    Py_ssize_t KH, KW, C, F    # the whole kernel's (*k, C, F) (dx, dy channels)
    cb_cd_geom* geoms
    cb_cd_out* outs
    Py_ssize_t* items
    Py_ssize_t* wp_off
    Py_ssize_t* taps           # per phase: its kernel taps along D, then H, then W, reversed
    Py_ssize_t* taps_off


cdef class _PhasePlan:
    """A strided input gradient (a transposed convolution's forward pass) cut
    into phases, one per residue of the dx position modulo the strides.

    A dx position i (per axis) takes dy[o] * w[k] for every o * s + k * d - p
    = i, so the positions of one residue r = i mod s see only the taps k with
    k * d = r + p (mod s), and each of them the same shift of dy: a phase is
    a stride-1 convolution of dy with a sub-kernel of those taps (reversed,
    channels swapped). The direct kernel runs every phase in one parallel
    region and writes its outputs straight into their interleaved places in
    dx (cb_cd_out), so there is no patch matrix, no scatter-add and no pass
    to interleave. Positions whose residue gets no tap (a kernel shorter
    than the stride) are zero.
    """
    cdef Phases p
    cdef bint zero          # some residues get no tap

    def __cinit__(self, Py_ssize_t nph, Py_ssize_t ntaps):
        self.p.nph = nph
        self.p.geoms = <cb_cd_geom*> malloc(max(1, nph) * sizeof(cb_cd_geom))
        self.p.outs = <cb_cd_out*> malloc(max(1, nph) * sizeof(cb_cd_out))
        self.p.items = <Py_ssize_t*> malloc(max(1, nph) * sizeof(Py_ssize_t))
        self.p.wp_off = <Py_ssize_t*> malloc(max(1, nph) * sizeof(Py_ssize_t))
        self.p.taps = <Py_ssize_t*> malloc(max(1, ntaps) * sizeof(Py_ssize_t))
        self.p.taps_off = <Py_ssize_t*> malloc(max(1, nph) * sizeof(Py_ssize_t))
        if not (self.p.geoms and self.p.outs and self.p.items and self.p.wp_off
                and self.p.taps and self.p.taps_off):
            raise MemoryError("conv_backward_input: no memory for a phase plan")

    def __dealloc__(self):
        free(self.p.geoms)
        free(self.p.outs)
        free(self.p.items)
        free(self.p.wp_off)
        free(self.p.taps)
        free(self.p.taps_off)


@cython.wraparound(True)
@cython.boundscheck(True)
def _axis_phases(Py_ssize_t X, Py_ssize_t K, Py_ssize_t s, Py_ssize_t d, Py_ssize_t p):
    """The phases of one axis of dx (X long; kernel K taps, stride s, dilation
    d, padding p before): (r, positions, taps reversed, sub-kernel dilation,
    sub-convolution padding before) per residue r that has positions.

    Output j of residue r (dx position r + s * j) reads dy[j + c - e * t] * w
    [k0 + step * t] for the taps k0 + step * t (step = s / gcd(s, d), e = d /
    gcd(s, d), c = (r + p - k0 * d) / s): a stride-1 correlation of dy with
    dilation e and the taps reversed, padded by e * (T - 1) - c before."""
    phases = []
    for r in range(min(s, X)):
        J = (X - r + s - 1) // s
        taps = [k for k in range(K) if (k * d - r - p) % s == 0]
        if not taps:
            phases.append((r, J, (), 1, 0))
            continue
        T = len(taps)
        e = (taps[1] - taps[0]) * d // s if T > 1 else 1
        c = (r + p - taps[0] * d) // s
        phases.append((r, J, tuple(reversed(taps)), e, e * (T - 1) - c))
    return phases


@cython.wraparound(True)
@cython.boundscheck(True)
def _phase_plan(g, Py_ssize_t FB):
    """The _PhasePlan of an input gradient of geometry g (run channels_last) with
    direct-kernel blocks of FB channels, or None where the direct kernel
    cannot run a phase: without the vector kernels (the scalar one needs a
    W-padded copy) or with more tap rows than it holds. A phase whose
    padding before is negative (its first output reads past the start of
    dy, as 'same' padding of a strided convolution can give) reads its rows
    from that column on (cb_cd_out's xw0)."""
    if not cb_cd_pads_itself():
        return None
    axes = [_axis_phases(g[X], g[K], g[s], g[d], g[p]) for X, K, s, d, p in
            (("D", "KD", "sd", "dil_d", "pd"), ("H", "KH", "sh", "dil_h", "ph"),
             ("W", "KW", "sw", "dil_w", "pw"))]
    live = [(a, b, c) for a in axes[0] for b in axes[1] for c in axes[2]
            if a[2] and b[2] and c[2]]
    zero = len(live) < len(axes[0]) * len(axes[1]) * len(axes[2])
    if g["F"] > CB_CD_MAX_C or any(len(a[2]) * len(b[2]) > CB_CD_MAX_ROWS for a, b, c in live):
        return None
    cdef _PhasePlan plan = _PhasePlan(len(live), sum(len(a[2]) + len(b[2]) + len(c[2])
                                                     for a, b, c in live))
    cdef Py_ssize_t i, j, off = 0, toff = 0, nfb = (g["C"] + FB - 1) // FB
    plan.zero = zero
    plan.p.most = 0
    plan.p.KH, plan.p.KW, plan.p.C, plan.p.F = g["KH"], g["KW"], g["C"], g["F"]
    for i, (a, b, c) in enumerate(live):
        x0 = max(0, -c[4])
        W = max(0, g["OW"] - x0)
        plan.p.geoms[i] = dict(N=g["N"], C=g["F"], F=g["C"], D=g["OD"], H=g["OH"], W=W,
                             Wp=W, pw=max(0, c[4]), OD=a[1], OH=b[1], OW=c[1], KD=len(a[2]),
                             KH=len(b[2]), KW=len(c[2]), sd=1, sh=1, sw=1, dil_d=a[3], dil_h=b[3],
                             dil_w=c[3], pd=a[4], ph=b[4], FB=FB, nfb=nfb)
        plan.p.outs[i] = dict(D=g["D"], H=g["H"], W=g["W"], d0=a[0], h0=b[0], w0=c[0],
                            sd=g["sd"], sh=g["sh"], sw=g["sw"], xw0=g["OW"] - W)
        cb_cd_prepare(&plan.p.geoms[i], g["OW"] - W)
        plan.p.items[i] = g["N"] * a[1] * b[1] * nfb
        plan.p.most = max(plan.p.most, plan.p.items[i])
        plan.p.wp_off[i] = off
        off += nfb * FB * len(a[2]) * len(b[2]) * len(c[2]) * g["F"]
        plan.p.taps_off[i] = toff
        for j in a[2] + b[2] + c[2]:
            plan.p.taps[toff] = j
            toff += 1
    plan.p.wp_size = max(1, off)
    return plan


_PHASE_PLANS = {}


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_phases(g, bint last, bint dbl):
    """The _PhasePlan a strided input gradient runs, or None for col2im.

    _TUNE["phase_split"] True or False forces the choice where both can run;
    by default the phases run where they beat col2im (benchmarks/
    bench_conv.py --phases):

    - at least half a block of dx channels (with fewer, most of the direct
      kernel's lanes are idle);
    - as few dy channels and as short patches as the direct kernel takes in
      a forward pass, or up to phase_max_c dy channels on dy rows at least
      phase_min_w wide (on narrower rows the 6-pixel tiles waste too much).
      channels_first runs the phases between two transposing copies, which
      eat the margin of the wider layers, so it keeps the first bound.

    A kernel no longer than the stride (one tap per phase) makes col2im one
    plain GEMM with no overlapping adds; the phases still hold their own
    there, so the rule does not single it out."""
    mode = _TUNE["phase_split"]
    if mode is False or g["sd"] * g["sh"] * g["sw"] == 1:
        return None
    if mode is None and not (2 * g["C"] > cb_cd_block(dbl) and (
            g["F"] <= _TUNE["direct_max_c"] and g["K"] // g["C"] * g["F"] <= _TUNE["direct_max_k"]
            or last and g["F"] <= _TUNE["phase_max_c"] and g["OW"] >= _TUNE["phase_min_w"])):
        return None
    # keyed by the geometry's values, not by g's identity: _GEOMETRIES may be
    # cleared and g rebuilt
    FB = cb_cd_block_for(dbl, g["C"])     # the phases' outputs are dx's C channels
    return remembered(_PHASE_PLANS, (tuple(g.values()), FB), _phase_plan, g, FB)


cdef void _pack_phase(const floating* k, floating* wp, const Phases* plan,
                      Py_ssize_t ph) noexcept nogil:
    """Phase ph's sub-kernel, packed for the direct kernel (as cb_cd_pack_block):
    wp[b][t][c][j] = k[tap t][b * FB + j][c], the taps reversed and the
    channels swapped (dy's are the phase's inputs), 0 past the dx channels."""
    cdef const cb_cd_geom* pg = &plan.geoms[ph]
    cdef const Py_ssize_t* td = &plan.taps[plan.taps_off[ph]]
    cdef const Py_ssize_t* th = td + pg.KD
    cdef const Py_ssize_t* tw = th + pg.KH
    cdef Py_ssize_t FB = pg.FB, C = plan.C, F = plan.F, T = pg.KD * pg.KH * pg.KW
    cdef Py_ssize_t b, a, h, w, c, j, f
    cdef const floating* src
    cdef floating* dst
    wp += plan.wp_off[ph]
    for b in range(pg.nfb):
        for a in range(pg.KD):
            for h in range(pg.KH):
                for w in range(pg.KW):
                    src = k + ((td[a] * plan.KH + th[h]) * plan.KW + tw[w]) * C * F
                    dst = wp + (b * T + (a * pg.KH + h) * pg.KW + w) * F * FB
                    for c in range(F):
                        for j in range(FB):
                            f = b * FB + j
                            dst[c * FB + j] = src[f * F + c] if f < C else 0


cdef void _run_phases(const floating* dy, const floating* k, floating* wp, floating* dx,
                      const Phases* plan, int nt, cb_intr* intr) noexcept nogil:
    """Every phase's sub-kernel packed, then all their rows in one parallel
    region, the phases interleaved so that each thread's share holds all of
    them (their costs differ)."""
    cdef Py_ssize_t it, ph, i, nph = plan.nph
    cdef const cb_cd_geom* geoms = plan.geoms
    cdef const cb_cd_out* outs = plan.outs
    cdef const Py_ssize_t* items = plan.items
    cdef const Py_ssize_t* off = plan.wp_off
    for ph in range(nph):
        _pack_phase(k, wp, plan, ph)
    with parallel(num_threads=nt):
        for it in prange(nph * plan.most, schedule='static'):
            if cb_intr_poll(intr):
                continue
            ph = it % nph
            i = it // nph
            if i >= items[ph]:
                continue
            if floating is float:
                cb_cd_item_out_f(dy, wp + off[ph], NULL, NULL, 0, dx, &geoms[ph], i, &outs[ph])
            else:
                cb_cd_item_out_d(dy, wp + off[ph], NULL, NULL, 0, dx, &geoms[ph], i, &outs[ph])


def _backward_input_phases(_PhasePlan plan, cnp.ndarray dy, cnp.ndarray kernel, x_shape,
                           int nt):
    """dx for C-contiguous dy and kernel of the compute dtype, float32 or
    float64 (see _PhasePlan)."""
    cdef cnp.ndarray dx = (np.zeros if plan.zero else np.empty)(x_shape, dtype=dy.dtype)
    cdef cb_intr intr
    cdef bint dbl = cnp.PyArray_TYPE(dy) == cnp.NPY_DOUBLE
    cdef void* wp
    if plan.p.nph == 0:
        return dx
    wp = malloc(plan.p.wp_size * (8 if dbl else 4))
    if wp == NULL:
        raise MemoryError("conv_backward_input: no memory for the packed kernel")
    cb_intr_init(&intr)
    with nogil:
        if dbl:
            _run_phases[double](<const double*> cnp.PyArray_DATA(dy),
                                <const double*> cnp.PyArray_DATA(kernel), <double*> wp,
                                <double*> cnp.PyArray_DATA(dx), &plan.p, nt, &intr)
        else:
            _run_phases[float](<const float*> cnp.PyArray_DATA(dy),
                               <const float*> cnp.PyArray_DATA(kernel), <float*> wp,
                               <float*> cnp.PyArray_DATA(dx), &plan.p, nt, &intr)
    free(wp)
    check_interrupt(&intr)
    return dx
