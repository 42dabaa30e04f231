/* channels_last depthwise kernels: one output row at a time, vectors over the
 * channels, four or eight output pixels sharing each kernel-tap load.
 *
 * A template (see cyback_depthwise_common.h), included by cyback_depthwise.h
 * once per instance:
 *   - a vector instance (V, VL defined; SUF f_base, d_avx2 ...) holds the
 *     scalar edge pixel and the vector row kernels;
 *   - a type's instance (SUF f or d) holds the entries depthwise.pyx calls:
 *     the pick between the vector instances, or, for compilers without GCC
 *     vector extensions, the same arithmetic in plain loops (the kernel
 *     gradient row is one function for both, its vector loop under VL); and
 *     the sum over the depth multiplier.
 *
 * Row kernels: xr[ky] is the input row read by kernel row ky (W pixels of C
 * values, xs >= C apart), or NULL when it is padding; k is (KH, KW, C); the
 * input column of tap kx of output ow is ow*sw - pw + kx*dil_w.
 */

#if defined(VL) || !CB_SIMD_VECTOR

/* One output pixel, channels [c0, c1), scalar, with bounds checks; input pixels
 * are xs values apart. */
ATTR static inline void CB_TYPED(cb_depthwise_pixel_)(const T *const *xr, const T *k, T *yp,
        ptrdiff_t C, ptrdiff_t xs, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t iw0,
        ptrdiff_t dil_w, ptrdiff_t c0, ptrdiff_t c1, const T *bias, int act) {
    ptrdiff_t c, ky, kx, iw;
    for (c = c0; c < c1; c++) {
        T s = bias ? bias[c] : (T)0;
        for (ky = 0; ky < KH; ky++) {
            if (!xr[ky]) continue;
            for (kx = 0; kx < KW; kx++) {
                iw = iw0 + kx * dil_w;
                if (iw < 0 || iw >= W) continue;
                s += xr[ky][iw * xs + c] * k[(ky * KW + kx) * C + c];
            }
        }
        yp[c] = CB_ACT(T, s, act);
    }
}

/* Kernel-gradient row: part[ky, kx, c] += sum over ow of dy[ow, c] *
 * x[ky][ow*sw - pw + kx*dil_w, c] (the valid ow only); pixels of x are xs values
 * apart, of dy ys. Vectors of channels where there are vectors, the channels
 * after the last whole vector one at a time. pf, pf2: pfb and pf2b bytes the
 * next row will read, prefetched meanwhile. */
ATTR static void CB_TYPED(cb_depthwise_kgrad_cl_row_)(const T *const *xr, const T *dy,
        T *part, ptrdiff_t C, ptrdiff_t xs, ptrdiff_t ys, ptrdiff_t W, ptrdiff_t KH,
        ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw, ptrdiff_t dil_w, ptrdiff_t pw,
        const void *pf, ptrdiff_t pfb, const void *pf2, ptrdiff_t pf2b) {
    ptrdiff_t c, c0, c1, ow, ky, kx, lo, hi, off;
#ifdef VL
    ptrdiff_t CV = C - C % VL;
    const char *pfp = (const char *)pf, *pfe = pf ? pfp + pfb : pfp;
    const char *pfq = (const char *)pf2, *pfqe = pf2 ? pfq + pf2b : pfq;
    ptrdiff_t pfn = 0, q_;
    /* The next row's input and output-gradient lines (pf, pf2), spread over */
    /* this row's vectors of channels and taps, as in the forward row.       */
    if ((pf || pf2) && CV > 0)
        pfn = cb_depthwise_cdiv(cb_depthwise_cdiv(pfb + pf2b, 64), KH * KW * (CV / VL));
#else
    ptrdiff_t CV = 0;
    (void)pf; (void)pfb; (void)pf2; (void)pf2b;
#endif
    /* Blocks of 64 channels: the strided walks along the row then stay in */
    /* L1 for all taps even when C is large.                                */
    for (c0 = 0; c0 < C; c0 += 64) {
        c1 = c0 + 64 < C ? c0 + 64 : C;
        for (ky = 0; ky < KH; ky++) {
            if (!xr[ky]) continue;
            for (kx = 0; kx < KW; kx++) {
                T *kp = part + (ky * KW + kx) * C;
                off = kx * dil_w - pw;
                cb_depthwise_valid(off, sw, W, OW, &lo, &hi);
#ifdef VL
                for (c = c0; c < c1 && c < CV; c += VL) {
                    /* Two accumulators: the adds of one row are not one chain. */
                    V a0 = (V){0}, a1 = a0;
                    for (q_ = 0; q_ < pfn && (pfp < pfe || pfq < pfqe); q_++) {
                        if (pfp < pfe) { __builtin_prefetch(pfp, 0, 3); pfp += 64; }
                        else if (pfq < pfqe) { __builtin_prefetch(pfq, 0, 3); pfq += 64; }
                    }
                    for (ow = lo; ow + 1 < hi; ow += 2) {
                        a0 += *(const V *)(dy + ow * ys + c)
                              * *(const V *)(xr[ky] + (ow * sw + off) * xs + c);
                        a1 += *(const V *)(dy + (ow + 1) * ys + c)
                              * *(const V *)(xr[ky] + ((ow + 1) * sw + off) * xs + c);
                    }
                    if (ow < hi)
                        a0 += *(const V *)(dy + ow * ys + c)
                              * *(const V *)(xr[ky] + (ow * sw + off) * xs + c);
                    *(V *)(kp + c) += a0 + a1;
                }
#endif
                for (c = c0 > CV ? c0 : CV; c < c1; c++) {
                    T s = 0;
                    for (ow = lo; ow < hi; ow++)
                        s += dy[ow * ys + c] * xr[ky][(ow * sw + off) * xs + c];
                    kp[c] += s;
                }
            }
        }
    }
}

#endif

#ifdef VL

#ifndef CB_DEPTHWISE_LAST_BLOCKS
#define CB_DEPTHWISE_LAST_BLOCKS
/* The blocks of the forward row below are statement macros expanded inside
 * it, over its variables, with the instance's T, V and VL. Written as
 * always-inline functions they are compiled differently: for the smallest,
 * CB_DEPTHWISE_ONE_PIXEL, GCC 12 allocates the row's vector registers and
 * orders its loads otherwise in every instance of the forward row, so the
 * macros stay until such a change is measured. */

/* Eight pixels from o of a row, stride 1, three taps a row: they read ten
 * input columns a kernel row (column j: o - pw + j), each loaded once and
 * used by the (up to) three pixels that need it, taps summed in (ky, kx)
 * order as in every path. Columns j outside [JL, JH) (constants: 0 and 10
 * inside the row) are padding, read as zeros; ACT is the activation code.
 * Each vector of channels also asks for pfn lines of the memory the next row
 * will read (pfp up to pfe). */
#define CB_DEPTHWISE_X(j, JL, JH)                                                         \
    ((j) >= (JL) && (j) < (JH) ? *(const V *)(xb + (j) * xs) : (V){0})
/* One kernel row's three taps over the ten columns of an 8-pixel block. */
#define CB_DEPTHWISE_K3_TAPS(JL, JH)                                                      \
    xv = CB_DEPTHWISE_X(0, JL, JH); a0 += xv * k0;                                        \
    xv = CB_DEPTHWISE_X(1, JL, JH); a0 += xv * k1; a1 += xv * k0;                         \
    xv = CB_DEPTHWISE_X(2, JL, JH); a0 += xv * k2; a1 += xv * k1; a2 += xv * k0;          \
    xv = CB_DEPTHWISE_X(3, JL, JH); a1 += xv * k2; a2 += xv * k1; a3 += xv * k0;          \
    xv = CB_DEPTHWISE_X(4, JL, JH); a2 += xv * k2; a3 += xv * k1; a4 += xv * k0;          \
    xv = CB_DEPTHWISE_X(5, JL, JH); a3 += xv * k2; a4 += xv * k1; a5 += xv * k0;          \
    xv = CB_DEPTHWISE_X(6, JL, JH); a4 += xv * k2; a5 += xv * k1; a6 += xv * k0;          \
    xv = CB_DEPTHWISE_X(7, JL, JH); a5 += xv * k2; a6 += xv * k1; a7 += xv * k0;          \
    xv = CB_DEPTHWISE_X(8, JL, JH); a6 += xv * k2; a7 += xv * k1;                         \
    xv = CB_DEPTHWISE_X(9, JL, JH); a7 += xv * k2
/* a0..a7: the eight pixels from o, channels from c, bias and taps summed and
 * the activation applied. */
#define CB_DEPTHWISE_K3_SUMS(o, JL, JH, ACT)                                              \
    V a0 = (V){0}, a1, a2, a3, a4, a5, a6, a7;                                            \
    if (bias) a0 = *(const V *)(bias + c);                                                \
    a1 = a0; a2 = a0; a3 = a0; a4 = a0; a5 = a0; a6 = a0; a7 = a0;                        \
    for (ky = 0; ky < KH; ky++) {                                                         \
        const T *xb, *kb;                                                                 \
        V k0, k1, k2, xv;                                                                 \
        if (!xr[ky]) continue;                                                            \
        /* Before the row at its left edge: CB_DEPTHWISE_X reads only inside it. */       \
        xb = xr[ky] + ((o) - pw) * xs + c;                                                \
        kb = k + ky * 3 * C + c;                                                          \
        k0 = *(const V *)kb;                                                              \
        k1 = *(const V *)(kb + C);                                                        \
        k2 = *(const V *)(kb + 2 * C);                                                    \
        CB_DEPTHWISE_K3_TAPS(JL, JH);                                                     \
    }                                                                                     \
    CB_VACT(a0, ACT); CB_VACT(a1, ACT); CB_VACT(a2, ACT); CB_VACT(a3, ACT);               \
    CB_VACT(a4, ACT); CB_VACT(a5, ACT); CB_VACT(a6, ACT); CB_VACT(a7, ACT)
/* The forward row's vectors of channels: VL apart, the last one ending at C
 * (it recomputes a few channels of the one before, to the same bits: each
 * lane's arithmetic is the same whatever the vector), so that only rows of
 * fewer than VL channels go one channel at a time. CV is then C, or 0. */
#define CB_DW_NEXT_C(c) ((c) + 2 * VL <= C ? (c) + VL : ((c) + VL < C ? C - VL : C))
#define CB_DEPTHWISE_K3_BLOCK(o, JL, JH, ACT)                                             \
    for (c = 0; c < CV; c = CB_DW_NEXT_C(c)) {                                            \
        for (q_ = 0; q_ < pfn && pfp < pfe; q_++, pfp += 64) __builtin_prefetch(pfp, 0, 3); \
        CB_DEPTHWISE_K3_SUMS(o, JL, JH, ACT);                                             \
        *(V *)(y + (o) * C + c) = a0;                                                     \
        *(V *)(y + ((o) + 1) * C + c) = a1;                                               \
        *(V *)(y + ((o) + 2) * C + c) = a2;                                               \
        *(V *)(y + ((o) + 3) * C + c) = a3;                                               \
        *(V *)(y + ((o) + 4) * C + c) = a4;                                               \
        *(V *)(y + ((o) + 5) * C + c) = a5;                                               \
        *(V *)(y + ((o) + 6) * C + c) = a6;                                               \
        *(V *)(y + ((o) + 7) * C + c) = a7;                                               \
    }

/* Output pixel px of a row, one vector of channels at a time, skipping the
 * taps that fall on padding. */
#define CB_DEPTHWISE_ONE_PIXEL(px)                                                        \
    for (c = 0; c < CV; c = CB_DW_NEXT_C(c)) {                                            \
        V a0 = (V){0};                                                                    \
        ptrdiff_t iw0 = (px) * sw - pw;                                                   \
        if (bias) a0 = *(const V *)(bias + c);                                            \
        for (ky = 0; ky < KH; ky++) {                                                     \
            if (!xr[ky]) continue;                                                        \
            for (kx = 0; kx < KW; kx++) {                                                 \
                iw = iw0 + kx * dil_w;                                                    \
                if (iw < 0 || iw >= W) continue;                                          \
                a0 += *(const V *)(xr[ky] + iw * xs + c)                                  \
                      * *(const V *)(k + (ky * KW + kx) * C + c);                         \
            }                                                                             \
        }                                                                                 \
        CB_VACT(a0, act);                                                                 \
        *(V *)(y + (px) * C + c) = a0;                                                    \
    }                                                                                     \
    if (CV < C)                                                                           \
        CB_TYPED(cb_depthwise_pixel_)(xr, k, y + (px) * C, C, xs, W, KH, KW, (px) * sw - pw, \
                                      dil_w, CV, C, bias, act)

/* A row of 3-tap stride-1 outputs narrower than a block (5 <= OW < 8: the
 * 7x7 maps at the end of a MobileNet) as one block of 8 from the row's
 * start whose first OW outputs are stored; the columns it reads lie in
 * [jl, jh) (known at run time here), the rest count as zeros. The general
 * path runs such a row as overlapping 4-pixel blocks and its edge pixels
 * one at a time, which is slower for 5 to 7 columns; 4 columns are faster
 * there and stay on it (benchmarks/bench_pool.py --only depthwise). */
#define CB_DEPTHWISE_K3_SHORT(ACT)                                                        \
    {                                                                                     \
        const ptrdiff_t jl = pw, jh = W + pw;                                             \
        V *out[8];                                                                        \
        V sink[8];                                                                        \
        for (c = 0; c < CV; c = CB_DW_NEXT_C(c)) {                                        \
            int p_;                                                                       \
            CB_DEPTHWISE_K3_SUMS(0, jl, jh, ACT);                                         \
            /* Outputs past the row go to a scratch vector, not past y. */                \
            for (p_ = 0; p_ < 8; p_++)                                                    \
                out[p_] = p_ < OW ? (V *)(y + p_ * C + c) : &sink[p_];                    \
            *out[0] = a0; *out[1] = a1; *out[2] = a2; *out[3] = a3;                       \
            *out[4] = a4; *out[5] = a5; *out[6] = a6; *out[7] = a7;                       \
        }                                                                                 \
        if (CV < C)                                                                       \
            for (c = 0; c < OW; c++)                                                      \
                CB_TYPED(cb_depthwise_pixel_)(xr, k, y + c * C, C, xs, W, KH, KW, c - pw, 1, \
                                              CV, C, bias, act);                          \
    }

/* A row of 3-tap stride-1 outputs, OW >= 8, in blocks of 8 pixels, the last
 * one ending at OW (it recomputes a few outputs, to the same bits: cheaper
 * than one multiply-add chain per pixel). Blocks at the row's ends read
 * padding columns as zeros. */
#define CB_DEPTHWISE_K3_ROW(ACT)                                                          \
    for (ow = 0; ow < OW; ow += 8) {                                                      \
        ptrdiff_t o = ow + 8 <= OW ? ow : OW - 8;                                         \
        /* Columns j of the block with o - pw + j in [0, W). */                           \
        ptrdiff_t jl = pw - o > 0 ? pw - o : 0, jh = W + pw - o;                          \
        if (jl == 0 && jh >= 10) {                                                        \
            CB_DEPTHWISE_K3_BLOCK(o, 0, 10, ACT);                                         \
        } else if (jl == 1 && jh >= 10) {  /* left edge, one padding column */            \
            CB_DEPTHWISE_K3_BLOCK(o, 1, 10, ACT);                                         \
        } else if (jl == 0 && jh == 9) {  /* right edge */                                \
            CB_DEPTHWISE_K3_BLOCK(o, 0, 9, ACT);                                          \
        } else if (jl == 1 && jh == 9) {  /* both: a row of 8 */                          \
            CB_DEPTHWISE_K3_BLOCK(o, 1, 9, ACT);                                          \
        } else {  /* wider padding: pixel by pixel */                                     \
            for (ow = o; ow < o + 8; ow++) {                                              \
                CB_DEPTHWISE_ONE_PIXEL(ow);                                               \
            }                                                                             \
            ow = o;                                                                       \
            continue;                                                                     \
        }                                                                                 \
        if (CV < C)                                                                       \
            for (c = 0; c < 8; c++)                                                       \
                CB_TYPED(cb_depthwise_pixel_)(xr, k, y + (o + c) * C, C, xs, W, KH, KW,   \
                                              o + c - pw, 1, CV, C, bias, act);           \
    }

/* NP (4 or 8) interior pixels from ow: every tap valid, each kernel vector
 * loaded once for all of them; the sums of pixels past NP are dead code. */
#define CB_DEPTHWISE_INTERIOR(NP)                                                         \
    for (c = 0; c < CV; c = CB_DW_NEXT_C(c)) {                                            \
        V a0 = (V){0}, a1, a2, a3, a4, a5, a6, a7;                                        \
        if (bias) a0 = *(const V *)(bias + c);                                            \
        a1 = a0; a2 = a0; a3 = a0; a4 = a0; a5 = a0; a6 = a0; a7 = a0;                    \
        for (ky = 0; ky < KH; ky++) {                                                     \
            const T *xb, *kb;                                                             \
            if (!xr[ky]) continue;                                                        \
            xb = xr[ky] + (ow * sw - pw) * xs + c;                                        \
            kb = k + ky * KW * C + c;                                                     \
            for (kx = 0; kx < KW; kx++) {                                                 \
                V kv = *(const V *)(kb + kx * C);                                         \
                const T *xp = xb + kx * dil_w * xs;                                       \
                a0 += *(const V *)(xp) * kv;                                              \
                a1 += *(const V *)(xp + sC) * kv;                                         \
                a2 += *(const V *)(xp + 2 * sC) * kv;                                     \
                a3 += *(const V *)(xp + 3 * sC) * kv;                                     \
                if ((NP) == 8) {                                                          \
                    a4 += *(const V *)(xp + 4 * sC) * kv;                                 \
                    a5 += *(const V *)(xp + 5 * sC) * kv;                                 \
                    a6 += *(const V *)(xp + 6 * sC) * kv;                                 \
                    a7 += *(const V *)(xp + 7 * sC) * kv;                                 \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
        CB_VACT(a0, act); CB_VACT(a1, act); CB_VACT(a2, act); CB_VACT(a3, act);           \
        *(V *)(y + ow * C + c) = a0;                                                      \
        *(V *)(y + (ow + 1) * C + c) = a1;                                                \
        *(V *)(y + (ow + 2) * C + c) = a2;                                                \
        *(V *)(y + (ow + 3) * C + c) = a3;                                                \
        if ((NP) == 8) {                                                                  \
            CB_VACT(a4, act); CB_VACT(a5, act); CB_VACT(a6, act); CB_VACT(a7, act);       \
            *(V *)(y + (ow + 4) * C + c) = a4;                                            \
            *(V *)(y + (ow + 5) * C + c) = a5;                                            \
            *(V *)(y + (ow + 6) * C + c) = a6;                                            \
            *(V *)(y + (ow + 7) * C + c) = a7;                                            \
        }                                                                                 \
    }                                                                                     \
    if (CV < C)                                                                           \
        for (c = 0; c < (NP); c++)                                                        \
            CB_TYPED(cb_depthwise_pixel_)(xr, k, y + (ow + c) * C, C, xs, W, KH, KW,      \
                                          (ow + c) * sw - pw, dil_w, CV, C, bias, act)

/* N (1 to 4) pixels from o at a row's ends, where some taps fall on padding:
 * each pixel's valid taps in (ky, kx) order, as CB_DEPTHWISE_ONE_PIXEL sums
 * them, but four chains at a time instead of one (the edge pixels of a 5x5
 * or 7x7 row otherwise take as long as its interior). */
#define CB_DEPTHWISE_VALID(iw) ((iw) >= 0 && (iw) < W)
#define CB_DEPTHWISE_EDGE(o, N)                                                           \
    for (c = 0; c < CV; c = CB_DW_NEXT_C(c)) {                                            \
        V a0 = (V){0}, a1, a2, a3;                                                        \
        if (bias) a0 = *(const V *)(bias + c);                                            \
        a1 = a0; a2 = a0; a3 = a0;                                                        \
        for (ky = 0; ky < KH; ky++) {                                                     \
            const T *xb, *kb;                                                             \
            if (!xr[ky]) continue;                                                        \
            xb = xr[ky] + c;                                                              \
            kb = k + ky * KW * C + c;                                                     \
            for (kx = 0; kx < KW; kx++) {                                                 \
                const V kv = *(const V *)(kb + kx * C);                                   \
                iw = (o) * sw - pw + kx * dil_w;                                          \
                if (CB_DEPTHWISE_VALID(iw)) a0 += *(const V *)(xb + iw * xs) * kv;        \
                if ((N) > 1 && CB_DEPTHWISE_VALID(iw + sw))                               \
                    a1 += *(const V *)(xb + (iw + sw) * xs) * kv;                         \
                if ((N) > 2 && CB_DEPTHWISE_VALID(iw + 2 * sw))                           \
                    a2 += *(const V *)(xb + (iw + 2 * sw) * xs) * kv;                     \
                if ((N) > 3 && CB_DEPTHWISE_VALID(iw + 3 * sw))                           \
                    a3 += *(const V *)(xb + (iw + 3 * sw) * xs) * kv;                     \
            }                                                                             \
        }                                                                                 \
        CB_VACT(a0, act);                                                                 \
        *(V *)(y + (o) * C + c) = a0;                                                     \
        if ((N) > 1) { CB_VACT(a1, act); *(V *)(y + ((o) + 1) * C + c) = a1; }           \
        if ((N) > 2) { CB_VACT(a2, act); *(V *)(y + ((o) + 2) * C + c) = a2; }           \
        if ((N) > 3) { CB_VACT(a3, act); *(V *)(y + ((o) + 3) * C + c) = a3; }           \
    }                                                                                     \
    if (CV < C)                                                                           \
        for (c = 0; c < (N); c++)                                                         \
            CB_TYPED(cb_depthwise_pixel_)(xr, k, y + ((o) + c) * C, C, xs, W, KH, KW,     \
                                          ((o) + c) * sw - pw, dil_w, CV, C, bias, act)

/* BLOCK with the activation code act as a constant, so that its tests leave
 * the loops. */
#define CB_DEPTHWISE_BY_ACT(BLOCK)                                                        \
    if (act == CB_ACT_NONE) {                                                             \
        BLOCK(CB_ACT_NONE);                                                               \
    } else if (act == CB_ACT_RELU) {                                                      \
        BLOCK(CB_ACT_RELU);                                                               \
    } else {                                                                              \
        BLOCK(CB_ACT_RELU6);                                                              \
    }
#endif

/* Forward row: y[ow, c] = act(bias[c] + the taps' sum) for ow in [0, OW), c
 * in [0, C) (bias NULL for none). pf: pfb bytes the next row will read,
 * prefetched while this one computes. */
ATTR static void CB_TYPED(cb_depthwise_fwd_cl_row_)(const T *const *xr, const T *k, T *y,
        ptrdiff_t C, ptrdiff_t xs, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW,
        ptrdiff_t sw, ptrdiff_t dil_w, ptrdiff_t pw, const T *bias, int act,
        const void *pf, ptrdiff_t pfb) {
    ptrdiff_t lo, hi, c, ow, ky, kx, iw, CV = C >= VL ? C : 0;
    ptrdiff_t sC = sw * xs;
    const char *pfp = (const char *)pf, *pfe = pf ? pfp + pfb : pfp;
    ptrdiff_t pfn = 0, q_;
    cb_depthwise_interior(W, KW, OW, sw, dil_w, pw, &lo, &hi);
    /* Pixels outer, channels inner: the kernel (KH*KW*C) stays in L1 while   */
    /* the input streams through once.                                        */
    if (KW == 3 && sw == 1 && dil_w == 1 && cb_depthwise_k3_state && OW >= 8) {
        /* The next row's lines spread over this row's vectors of channels. */
        if (pf && CV > 0)
            pfn = cb_depthwise_cdiv(cb_depthwise_cdiv(pfb, 64),
                                    cb_depthwise_cdiv(OW, 8) * (CV / VL));
        CB_DEPTHWISE_BY_ACT(CB_DEPTHWISE_K3_ROW);
        return;
    }
    if (KW == 3 && sw == 1 && dil_w == 1 && cb_depthwise_k3_state && OW >= 5) {
        CB_DEPTHWISE_BY_ACT(CB_DEPTHWISE_K3_SHORT);
        return;
    }
    for (ow = 0; ow < OW; ow++) {
        /* Eight interior pixels where they fit: eight multiply-add chains   */
        /* in flight (four leave the FMA units waiting on their latency at   */
        /* 5x5 and 7x7 taps and at stride 2), one kernel load each.          */
        if (ow >= lo && ow + 8 <= hi) {
            CB_DEPTHWISE_INTERIOR(8);
            ow += 7;
            continue;
        }
        /* The last interior pixels, fewer than a block, run as a block that  */
        /* ends at hi (as above).                                              */
        if (ow >= lo && ow < hi && ow + 4 > hi && hi - lo >= 4) ow = hi - 4;
        if (ow >= lo && ow + 4 <= hi) {
            CB_DEPTHWISE_INTERIOR(4);
            ow += 3;
            continue;
        }
        {
            /* Edge pixels, up to four of them together. */
            const ptrdiff_t end = ow < lo ? (lo < OW ? lo : OW) : OW;
            const ptrdiff_t n = end - ow < 4 ? end - ow : 4;
            if (n == 4) {
                CB_DEPTHWISE_EDGE(ow, 4);
            } else if (n == 3) {
                CB_DEPTHWISE_EDGE(ow, 3);
            } else if (n == 2) {
                CB_DEPTHWISE_EDGE(ow, 2);
            } else {
                CB_DEPTHWISE_EDGE(ow, 1);
            }
            ow += n - 1;
        }
    }
}

#elif CB_SIMD_VECTOR

/* The type's entries: the AVX2 + FMA instance where the CPU has them. */
static void CB_TYPED(cb_depthwise_fwd_cl_row_)(const T *const *xr, const T *k, T *y,
        ptrdiff_t C, ptrdiff_t xs, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW,
        ptrdiff_t sw, ptrdiff_t dil_w, ptrdiff_t pw, const T *bias, int act, const void *pf,
        ptrdiff_t pfb) {
    CB_DEPTHWISE_PICK(cb_depthwise_fwd_cl_row_)(xr, k, y, C, xs, W, KH, KW, OW, sw, dil_w, pw,
                                                bias, act, pf, pfb);
}
static void CB_TYPED(cb_depthwise_kgrad_cl_row_)(const T *const *xr, const T *dy, T *part,
        ptrdiff_t C, ptrdiff_t xs, ptrdiff_t ys, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW,
        ptrdiff_t OW, ptrdiff_t sw, ptrdiff_t dil_w, ptrdiff_t pw, const void *pf,
        ptrdiff_t pfb, const void *pf2, ptrdiff_t pf2b) {
    CB_DEPTHWISE_PICK(cb_depthwise_kgrad_cl_row_)(xr, dy, part, C, xs, ys, W, KH, KW, OW, sw,
                                                  dil_w, pw, pf, pfb, pf2, pf2b);
}

#else  /* no vector extensions: the same arithmetic, scalar */

static void CB_TYPED(cb_depthwise_fwd_cl_row_)(const T *const *xr, const T *k, T *y,
        ptrdiff_t C, ptrdiff_t xs, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW,
        ptrdiff_t sw, ptrdiff_t dil_w, ptrdiff_t pw, const T *bias, int act, const void *pf,
        ptrdiff_t pfb) {
    ptrdiff_t ow;
    (void)pf; (void)pfb;
    for (ow = 0; ow < OW; ow++)
        CB_TYPED(cb_depthwise_pixel_)(xr, k, y + ow * C, C, xs, W, KH, KW, ow * sw - pw, dil_w,
                                      0, C, bias, act);
}

#endif

#ifndef VL
/* d[i] = t[i*M] + t[i*M + 1] + ... (in that order) for i < n: the input
 * gradient's sum over the depth multiplier. A constant M lets the compiler
 * vectorise; the general loop (M and the pointers unknown) does not, and
 * would take most of an M = 2 input gradient. */
static void CB_TYPED(cb_depthwise_sum_groups_)(const T *restrict t, T *restrict d,
                                               ptrdiff_t n, ptrdiff_t M) {
    ptrdiff_t i, m;
    if (M == 2) {
        for (i = 0; i < n; i++) d[i] = t[2 * i] + t[2 * i + 1];
    } else if (M == 4) {
        for (i = 0; i < n; i++)
            d[i] = ((t[4 * i] + t[4 * i + 1]) + t[4 * i + 2]) + t[4 * i + 3];
    } else {
        for (i = 0; i < n; i++) {
            T s = t[i * M];
            for (m = 1; m < M; m++) s += t[i * M + m];
            d[i] = s;
        }
    }
}
#endif
