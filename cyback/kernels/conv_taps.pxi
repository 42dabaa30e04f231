# Stride-1 taps (included by conv.pyx).
#
# With stride 1, each kernel tap reads a zero-padded copy of the input at a
# constant offset from the output position, so one K = C GEMM per tap runs
# straight on its rows and no patch matrix is built. The dispatcher and
# conv_backward_kernel take this path for stride-1 layers with C >= 32 when
# the tap GEMMs' tiles are large enough (_tap_rows), after Winograd, the 1x1
# tiles and the direct kernels declined.


cdef void _pad_row(const floating* x, floating* xp, const Geom* g, Py_ssize_t Dp,
                   Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t row) noexcept nogil:
    """Row `row` (over N * Dp * Hp) of the zero-padded channels_last copy of
    channels_last x (channels_first x is padded by _pad_row_first)."""
    cdef Py_ssize_t n, r, i_d, ih, C = g.C
    cdef floating* dst = xp + row * Wp * C
    n = row // (Dp * Hp)
    r = row - n * Dp * Hp
    i_d = r // Hp - g.pd
    ih = r - (r // Hp) * Hp - g.ph
    if i_d < 0 or i_d >= g.D or ih < 0 or ih >= g.H:
        memset(dst, 0, Wp * C * sizeof(floating))
        return
    if g.pw > 0:
        memset(dst, 0, g.pw * C * sizeof(floating))
    if Wp - g.pw - g.W > 0:
        memset(dst + (g.pw + g.W) * C, 0, (Wp - g.pw - g.W) * C * sizeof(floating))
    memcpy(dst + g.pw * C, x + ((n * g.D + i_d) * g.H + ih) * g.W * C,
           g.W * C * sizeof(floating))


cdef inline Py_ssize_t _grid_run(const Geom* g, Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t q,
                                 Py_ssize_t q1, Py_ssize_t* p) noexcept nogil:
    """The run of grid rows from q (before q1) of the padded (Dp, Hp, Wp)
    grid that the stride-1 tap GEMMs compute: its length, and in p the output
    position of its first row, or -1 when the run lies on the grid's margin
    (rows that are no output)."""
    cdef Py_ssize_t HpWp = Hp * Wp, od, r, oh, ow, seg
    od = q // HpWp
    r = q - od * HpWp
    oh = r // Wp
    ow = r - oh * Wp
    p[0] = -1
    if oh >= g.OH:
        seg = (od + 1) * HpWp - q           # the rest of this depth slice
    elif ow >= g.OW:
        seg = Wp - ow                       # the rest of this row
    else:
        seg = g.OW - ow
        p[0] = (od * g.OH + oh) * g.OW + ow
    return seg if seg < q1 - q else q1 - q


cdef void _fwd_tap_item(const floating* xp, const floating* w, floating* y, floating* tmp,
                        const Geom* g, Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t DpHpWp,
                        Py_ssize_t n, Py_ssize_t q0, Py_ssize_t m) noexcept nogil:
    """Output rows q0..q0+m of sample n on the padded grid (Dp, Hp, Wp),
    channels_last (channels_first: _fwd_tap_item_first).

    With stride 1, kernel tap t reads the padded input at a constant offset
    from the output position, so the rows of that tap's GEMM operand are
    consecutive rows of the padded copy (leading dimension C) and no patch
    matrix is built: one K = C GEMM per tap accumulates into tmp, then the rows
    that are real outputs (not on the padding margin of the grid) go to y.
    """
    cdef Py_ssize_t C = g.C, F = g.F, HpWp = Hp * Wp
    cdef Py_ssize_t kd, kh, kw, t = 0, q, q1 = q0 + m, seg, p
    cdef const floating* base = xp + (n * DpHpWp + q0) * C
    cdef const floating* a
    for kd in range(g.KD):
        for kh in range(g.KH):
            for kw in range(g.KW):
                a = base + (kd * g.dil_d * HpWp + kh * g.dil_h * Wp + kw * g.dil_w) * C
                gemm(False, False, <int>m, <int>F, <int>C, <floating>1, a, <int>C,
                     w + t * C * F, <int>F, <floating>(0 if t == 0 else 1), tmp, <int>F)
                t += 1
    q = q0
    while q < q1:
        seg = _grid_run(g, Hp, Wp, q, q1, &p)
        if p >= 0:
            memcpy(y + (n * g.P + p) * F, tmp + (q - q0) * F, seg * F * sizeof(floating))
        q += seg


cdef void _pad_row_first(const floating* x, floating* xp, const Geom* g, Py_ssize_t Dp,
                         Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t row) noexcept nogil:
    """Row `row` (over N * C * Dp * Hp) of the zero-padded channels_first copy of x."""
    cdef Py_ssize_t nc, r, i_d, ih
    cdef floating* dst = xp + row * Wp
    nc = row // (Dp * Hp)
    r = row - nc * Dp * Hp
    i_d = r // Hp - g.pd
    ih = r - (r // Hp) * Hp - g.ph
    if i_d < 0 or i_d >= g.D or ih < 0 or ih >= g.H:
        memset(dst, 0, Wp * sizeof(floating))
        return
    if g.pw > 0:
        memset(dst, 0, g.pw * sizeof(floating))
    if Wp - g.pw - g.W > 0:
        memset(dst + g.pw + g.W, 0, (Wp - g.pw - g.W) * sizeof(floating))
    memcpy(dst + g.pw, x + (nc * g.D + i_d) * g.H * g.W + ih * g.W, g.W * sizeof(floating))


cdef void _fwd_tap_item_first(const floating* xp, const floating* w, floating* y,
                              floating* tmp, const Geom* g, Py_ssize_t Hp, Py_ssize_t Wp,
                              Py_ssize_t DpHpWp, Py_ssize_t n, Py_ssize_t q0,
                              Py_ssize_t m) noexcept nogil:
    """_fwd_tap_item for channels_first, on a padded channels_first copy (a
    plain row copy, no transpose): tap t's operand is the transpose of the
    (C, m) block of channel planes at a constant offset (leading dimension
    DpHpWp); tmp is the (m, F) product, transposed into y. Not the (F, m)
    product copied into y by rows: OpenBLAS's small NT kernel is slower with
    that operand order."""
    cdef Py_ssize_t C = g.C, F = g.F, HpWp = Hp * Wp
    cdef Py_ssize_t kd, kh, kw, t = 0, q, q1 = q0 + m, seg, p, f, j
    cdef const floating* base = xp + n * C * DpHpWp + q0
    for kd in range(g.KD):
        for kh in range(g.KH):
            for kw in range(g.KW):
                gemm(True, False, <int>m, <int>F, <int>C, <floating>1,
                     base + kd * g.dil_d * HpWp + kh * g.dil_h * Wp + kw * g.dil_w, <int>DpHpWp,
                     w + t * C * F, <int>F, <floating>(0 if t == 0 else 1), tmp, <int>F)
                t += 1
    q = q0
    while q < q1:
        seg = _grid_run(g, Hp, Wp, q, q1, &p)
        if p >= 0:
            for f in range(F):
                for j in range(seg):
                    y[(n * F + f) * g.P + p + j] = tmp[(q - q0 + j) * F + f]
        q += seg


cdef struct TapGrid:
    # The grid the stride-1 tap GEMMs run on: the input padded to (Dp, Hp, Wp)
    # so that every tap reads it at a constant offset from the output position;
    # Qn grid rows per sample (up to its last output) in blocks of B, nblk
    # blocks.
    Py_ssize_t Dp, Hp, Wp, DpHpWp, Qn, nblk


cdef inline TapGrid _tap_grid(const Geom* g, Py_ssize_t B) noexcept nogil:
    cdef TapGrid t
    t.Dp = g.OD + (g.KD - 1) * g.dil_d
    t.Hp = g.OH + (g.KH - 1) * g.dil_h
    t.Wp = g.OW + (g.KW - 1) * g.dil_w
    t.DpHpWp = t.Dp * t.Hp * t.Wp
    t.Qn = ((g.OD - 1) * t.Hp + g.OH - 1) * t.Wp + g.OW
    t.nblk = (t.Qn + B - 1) // B
    return t


cdef const floating* _padded_input(const floating* x, floating* xp, const Geom* g,
                                   const TapGrid* t, bint last, bint copy,
                                   int nt) noexcept nogil:
    """x on the tap grid: the padded copy xp, filled on nt threads (always for
    channels_first, for channels_last when there is padding), else x."""
    cdef Py_ssize_t row
    if not last:
        for row in prange(g.N * g.C * t.Dp * t.Hp, schedule='static', num_threads=nt):
            _pad_row_first(x, xp, g, t.Dp, t.Hp, t.Wp, row)
        return xp
    if copy:
        for row in prange(g.N * t.Dp * t.Hp, schedule='static', num_threads=nt):
            _pad_row(x, xp, g, t.Dp, t.Hp, t.Wp, row)
        return xp
    return x


def _forward_taps(floating[::1] x, floating[::1] w, floating[::1] y, floating[::1] xp,
                   floating[::1] bufs, Py_ssize_t bufstride, Geom g, bint last,
                   bint copy, Py_ssize_t B, int nt):
    cdef Py_ssize_t it, n, q0, m
    cdef floating* buf = NULL
    cdef const floating* src
    cdef cb_intr intr
    cb_intr_init(&intr)
    cdef TapGrid t = _tap_grid(&g, B)
    with nogil:
        src = _padded_input(&x[0], &xp[0], &g, &t, last, copy, nt)
        with parallel(num_threads=nt):
            buf = &bufs[0] + threadid() * bufstride
            for it in prange(g.N * t.nblk, schedule='static'):
                if cb_intr_poll(&intr):
                    continue
                n = it // t.nblk
                q0 = (it - n * t.nblk) * B
                m = t.Qn - q0
                if m > B:
                    m = B
                if last:
                    _fwd_tap_item(src, &w[0], &y[0], buf, &g, t.Hp, t.Wp, t.DpHpWp, n, q0, m)
                else:
                    _fwd_tap_item_first(src, &w[0], &y[0], buf, &g, t.Hp, t.Wp, t.DpHpWp, n,
                                        q0, m)
    check_interrupt(&intr)


cdef void _bwdk_tap_item(const floating* xp, const floating* dy, floating* part,
                        floating* dyt, const Geom* g, bint last, Py_ssize_t Hp, Py_ssize_t Wp,
                        Py_ssize_t DpHpWp, Py_ssize_t n, Py_ssize_t q0, Py_ssize_t m,
                        bint first) noexcept nogil:
    """part[t] (C, F) (+)= padded-input rows of tap t ^T @ dy rows, for output
    rows q0..q0+m of sample n on the padded grid; dy is laid out on that grid
    in dyt first, with zero rows on its margin."""
    cdef Py_ssize_t C = g.C, F = g.F, HpWp = Hp * Wp
    cdef Py_ssize_t kd, kh, kw, t = 0, q, q1 = q0 + m, seg, p, f, j
    cdef const floating* base = xp + (n * DpHpWp + q0) * C
    cdef const floating* src
    cdef floating* dst
    if not last:
        base = xp + n * C * DpHpWp + q0
    q = q0
    while q < q1:
        seg = _grid_run(g, Hp, Wp, q, q1, &p)
        dst = dyt + (q - q0) * F
        if p < 0:
            memset(dst, 0, seg * F * sizeof(floating))
        elif last:
            memcpy(dst, dy + (n * g.P + p) * F, seg * F * sizeof(floating))
        else:
            src = dy + n * F * g.P + p
            for f in range(F):
                for j in range(seg):
                    dst[j * F + f] = src[f * g.P + j]
        q += seg
    for kd in range(g.KD):
        for kh in range(g.KH):
            for kw in range(g.KW):
                if last:
                    gemm(True, False, <int>C, <int>F, <int>m, <floating>1,
                         base + (kd * g.dil_d * HpWp + kh * g.dil_h * Wp + kw * g.dil_w) * C,
                         <int>C, dyt, <int>F, <floating>(0 if first else 1), part + t * C * F,
                         <int>F)
                else:
                    # The (C, m) block of channel planes of the channels_first copy.
                    gemm(False, False, <int>C, <int>F, <int>m, <floating>1,
                         base + kd * g.dil_d * HpWp + kh * g.dil_h * Wp + kw * g.dil_w,
                         <int>DpHpWp, dyt, <int>F, <floating>(0 if first else 1),
                         part + t * C * F, <int>F)
                t += 1


def _backward_kernel_taps(floating[::1] x, floating[::1] dy, floating[::1] parts,
                           floating[::1] dk, floating[::1] xp, floating[::1] bufs,
                           Py_ssize_t bufstride, Geom g, bint last, bint copy,
                           Py_ssize_t B, Py_ssize_t ngroups, int nt):
    cdef Py_ssize_t nitems, per, gi, c, n, q0, m, i
    cdef Py_ssize_t KF = g.K * g.F
    cdef floating* buf = NULL
    cdef const floating* src
    cdef cb_intr intr
    cb_intr_init(&intr)
    cdef TapGrid t = _tap_grid(&g, B)
    nitems = g.N * t.nblk
    per = (nitems + ngroups - 1) // ngroups
    with nogil:
        src = _padded_input(&x[0], &xp[0], &g, &t, last, copy, nt)
        with parallel(num_threads=nt):
            buf = &bufs[0] + threadid() * bufstride
            for gi in prange(ngroups, schedule='static'):
                for c in range(gi * per, min(gi * per + per, nitems)):
                    if cb_intr_poll(&intr):
                        break
                    n = c // t.nblk
                    q0 = (c - n * t.nblk) * B
                    m = t.Qn - q0
                    if m > B:
                        m = B
                    _bwdk_tap_item(src, &dy[0], &parts[gi * KF], buf, &g, last, t.Hp, t.Wp,
                                   t.DpHpWp, n, q0, m, c == gi * per)
        _sum_parts(&parts[0], &dk[0], KF, ngroups)
    check_interrupt(&intr)


@cython.wraparound(True)
@cython.boundscheck(True)
def _tap_rows(g, pointwise, last):
    """Output rows per tile of the stride-1 tap GEMMs (see _fwd_tap_item), or
    0 for im2col.

    OpenBLAS (SkylakeX and later) multiplies products of up to m * n * k = 1e6
    straight from the operands, with no packing. The tap GEMMs are (rows, C) x
    (C, F): tiles under that bound beat im2col while the bound leaves enough
    rows (_TUNE["tap_min_rows"]; C = F = 64 leaves 240, C = F = 128 only 56).
    Below that channels_last keeps im2col, while channels_first (whose
    im2col is slower) takes larger packed tiles.
    """
    if (pointwise or g["sd"] != 1 or g["sh"] != 1 or g["sw"] != 1
            or g["C"] < _TUNE["tap_min_c"] or g["KD"] * g["KH"] * g["KW"] == 1):
        return 0
    rows = _TUNE["tap_mnk"] // max(1, g["C"] * g["F"]) // 8 * 8
    if rows >= _TUNE["tap_min_rows"]:
        return rows
    return 0 if last and not _TUNE["tap_last_packed"] else _TUNE["tap_rows"]


@cython.wraparound(True)
@cython.boundscheck(True)
def _padded_buffer(g, last, dtype, dummy):
    """(buffer for the padded channels_last copy of x, whether it is needed):
    no copy when x is channels_last with nothing to pad."""
    dp = g["OD"] + (g["KD"] - 1) * g["dil_d"]
    hp = g["OH"] + (g["KH"] - 1) * g["dil_h"]
    wp = g["OW"] + (g["KW"] - 1) * g["dil_w"]
    if last and (dp, hp, wp) == (g["D"], g["H"], g["W"]) and \
            g["pd"] == 0 and g["ph"] == 0 and g["pw"] == 0:
        return dummy[:1], False
    return np.empty(g["N"] * dp * hp * wp * g["C"], dtype=dtype), True


def _run_forward_taps(x, kernel, y, g, bint last, Py_ssize_t B, int nt):
    """y = conv(x, kernel) by the stride-1 tap GEMMs, in tiles of B grid
    rows (_tap_rows); x, kernel and y C-contiguous of the compute dtype."""
    stride = (B * g["F"] + 15) // 16 * 16
    bufs = np.empty(max(1, nt) * stride, dtype=x.dtype)
    xp, copy = _padded_buffer(g, last, x.dtype, bufs)
    _forward_taps(_flat(x), _flat(kernel), _flat(y), xp, bufs, stride, g, last, copy, B, nt)


def _run_backward_kernel_taps(x, dy, dk, g, bint last, Py_ssize_t B, int nt):
    """dk = the kernel gradient by one GEMM per kernel tap straight from the
    padded input, as in the forward pass, in tiles of B grid rows."""
    q = ((g["OD"] - 1) * (g["OH"] + (g["KH"] - 1) * g["dil_h"]) + g["OH"] - 1) \
        * (g["OW"] + (g["KW"] - 1) * g["dil_w"]) + g["OW"]
    nitems = g["N"] * ((q + B - 1) // B)
    kf = g["K"] * g["F"]
    ngroups = _groups(nitems, kf, x.itemsize)
    parts = np.empty(ngroups * kf, dtype=x.dtype)
    stride = (B * g["F"] + 15) // 16 * 16
    bufs = np.empty(max(1, nt) * stride, dtype=x.dtype)
    xp, copy = _padded_buffer(g, last, x.dtype, bufs)
    _backward_kernel_taps(_flat(x), _flat(dy), parts, _flat(dk), xp, bufs, stride, g, last, copy,
                          B, ngroups, nt)
