/* channels_first depthwise kernels: one (n, c) plane at a time, vectors
 * along the row, blocks of 4 rows by 2 vectors sharing each kernel-tap load
 * (8 multiply-add chains in flight). 3x3 "same" planes at stride 1 are read
 * in place (cb_depthwise_fwd_cf_same3).
 *
 * A template (see cyback_depthwise_common.h), included by cyback_depthwise.h
 * once per instance: a vector instance (V, VL defined; SUF f_base, d_avx2 ...)
 * holds the scalar kernels (rows narrower than a vector, the padding in
 * phases) and the vector ones; a type's instance (SUF f or d) the entries
 * depthwise.pyx calls: the pick between the vector instances, or, for
 * compilers without GCC vector extensions, the scalar kernels themselves
 * (cyback_depthwise.h names them).
 *
 * The kernels but cb_depthwise_fwd_cf_same3 work on whole planes that the
 * caller pads once (cb_depthwise_pad_plane): padded row i, column j holds
 * input (i - pt, j - pl), zero outside the input, for Hp rows and Wp
 * columns; with upsampling factors uh, uw (for the input gradient of a
 * strided convolution) it holds input ((i - pt) / uh, (j - pl) / uw) where
 * both divide, else zero. With a stride sw > 1 along the row, each padded row
 * is stored as sw phases of Wq = ceil(Wp / sw) values (phase p holds columns
 * p, p + sw, ...), so that the columns ow*sw + kx*dil_w of consecutive outputs
 * ow are consecutive: column co[kx] + ow (cb_depthwise_cols). Rows are
 * rs = sw * Wq apart (or the input's own rows, when it needs no padding and
 * sw == 1). Output (oh, ow) reads rows oh*sh + ky*dil_h with no bounds check.
 * Kernel tap (ky, kx) is k[(ky*KW + kx) * ks].
 *
 * The caller zeroes a padding buffer of Hp * rs values once, and
 * cb_depthwise_pad_plane then writes only the input's values: the zeros stay
 * where they are for every plane of the same geometry.
 */

#if defined(VL) || !CB_SIMD_VECTOR

/* Scalar channels_first planes: the padding in phases for sw > 1, and the
 * kernels for rows narrower than a vector. y (OH, OW) += the sums when accumulate,
 * else y = act(bias + sums). The kernel gradient adds each tap's sum to lane
 * 0 of acc[(ky*KW + kx) * 8 ...] (see cb_depthwise_kgrad_cf_plane). */
ATTR static void CB_TYPED(cb_depthwise_pad_phases_)(const T *src, ptrdiff_t H, ptrdiff_t W,
        T *buf, ptrdiff_t Hp, ptrdiff_t Wp, ptrdiff_t pt, ptrdiff_t pl, ptrdiff_t sw,
        ptrdiff_t uh, ptrdiff_t uw) {
    ptrdiff_t r, j, p, q0, c0, cnt, Wq = (Wp + sw - 1) / sw;
    ptrdiff_t n = W < Wp - pl ? W : Wp - pl;  /* source columns inside the row */
    for (r = 0; r < H && pt + r * uh < Hp; r++) {
        T *b = buf + (pt + r * uh) * sw * Wq;
        const T *s = src + r * W;
        if (uw > 1) {  /* sw == 1 */
            for (j = 0; j < n && pl + j * uw < Wp; j++) b[pl + j * uw] = s[j];
            continue;
        }
        /* Phase p: padded columns q*sw + p, from q0 on, are source columns */
        /* c0, c0 + sw, ...; the constant stride 2 lets the compiler vectorise. */
        for (p = 0; p < sw; p++) {
            q0 = pl > p ? (pl - p + sw - 1) / sw : 0;
            c0 = q0 * sw + p - pl;
            cnt = c0 < n ? (n - c0 + sw - 1) / sw : 0;
            if (sw == 2)
                for (j = 0; j < cnt; j++) b[p * Wq + q0 + j] = s[c0 + 2 * j];
            else
                for (j = 0; j < cnt; j++) b[p * Wq + q0 + j] = s[c0 + j * sw];
        }
    }
}
ATTR static void CB_TYPED(cb_depthwise_fwd_cf_scalar_)(const T *x, ptrdiff_t rs, const T *k,
        ptrdiff_t ks, T *y, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw,
        ptrdiff_t dil_h, ptrdiff_t dil_w, ptrdiff_t KH, ptrdiff_t KW, int accumulate, T bias,
        int act) {
    ptrdiff_t oh, ow, ky, kx, co[KW];
    cb_depthwise_cols(co, KW, dil_w, sw, rs);
    for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++) {
            T s = accumulate ? y[oh * OW + ow] : bias;
            for (ky = 0; ky < KH; ky++)
                for (kx = 0; kx < KW; kx++)
                    s += x[(oh * sh + ky * dil_h) * rs + co[kx] + ow] * k[(ky * KW + kx) * ks];
            y[oh * OW + ow] = CB_ACT(T, s, act);
        }
}
ATTR static void CB_TYPED(cb_depthwise_kgrad_cf_scalar_)(const T *x, ptrdiff_t rs,
        const T *dy, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dil_h,
        ptrdiff_t dil_w, ptrdiff_t KH, ptrdiff_t KW, T *acc) {
    ptrdiff_t oh, ow, ky, kx, co[KW];
    cb_depthwise_cols(co, KW, dil_w, sw, rs);
    for (ky = 0; ky < KH; ky++)
        for (kx = 0; kx < KW; kx++) {
            T t = 0;
            for (oh = 0; oh < OH; oh++)
                for (ow = 0; ow < OW; ow++)
                    t += dy[oh * OW + ow] * x[(oh * sh + ky * dil_h) * rs + co[kx] + ow];
            acc[(ky * KW + kx) * 8] += t;
        }
}

#endif

#ifdef VL

#ifndef CB_DEPTHWISE_FIRST_CALLS
#define CB_DEPTHWISE_FIRST_CALLS
/* Calls of the always-inlined blocks below with the caller's arguments. */
#define CB_DEPTHWISE_TILE(ow, dv, NV)                                                     \
    CB_TYPED(cb_depthwise_cf_tile_)(x, rs, k, ks, w, y, OW, oh, ow, dv, sh, dil_h, co, KH, KW, \
                                    accumulate, b0, act, R, NV, K3)
#define CB_DEPTHWISE_ROWS(R, K3)                                                          \
    CB_TYPED(cb_depthwise_cf_rows_)(x, rs, k, ks, w, y, OW, oh, sh, dil_h, co, KH, KW,    \
                                    accumulate, b0, act, R, K3)
#define CB_DEPTHWISE_TAPS(NK)                                                             \
    CB_TYPED(cb_depthwise_kg_cf_taps_)(x, rs, dy, OH, OW, sh, dil_h, co + kx0, ky,        \
                                       ky * KW + kx0, keep, acc, NK)
#endif

/* Stride 2 along the row: source columns c land in phase (c + pl) % 2 at
 * (c + pl) / 2; pairs of vectors split into their even and odd lanes
 * (overlapping at the end, the last column of an odd count alone). */
ATTR static void CB_TYPED(cb_depthwise_pad_halves_)(const T *src, ptrdiff_t H, ptrdiff_t W,
        T *buf, ptrdiff_t Hp, ptrdiff_t Wp, ptrdiff_t pt, ptrdiff_t pl, ptrdiff_t n) {
    typedef __typeof__((V){0} > (V){0}) mask_t;
    mask_t ev, od;
    ptrdiff_t r, i, Wq = (Wp + 1) / 2, last = (n - 2 * VL) & ~(ptrdiff_t)1;
    int j;
    for (j = 0; j < VL; j++) {
        ev[j] = 2 * j;
        od[j] = 2 * j + 1;
    }
    for (r = 0; r < H && pt + r < Hp; r++) {
        T *b = buf + (pt + r) * 2 * Wq, *be, *bo;
        const T *s = src + r * W;
        /* Even source columns go to phase pl % 2, odd ones to the other. */
        be = b + (pl % 2) * Wq + pl / 2;
        bo = b + (1 - pl % 2) * Wq + (pl + 1) / 2;
        for (i = 0; i <= last; i += 2 * VL) {
            V lo = *(const V *)(s + i), hi = *(const V *)(s + i + VL);
            *(V *)(be + i / 2) = CB_DEPTHWISE_SHUF(lo, hi, ev);
            *(V *)(bo + i / 2) = CB_DEPTHWISE_SHUF(lo, hi, od);
        }
        if (i != last + 2 * VL) {
            V lo = *(const V *)(s + last), hi = *(const V *)(s + last + VL);
            *(V *)(be + last / 2) = CB_DEPTHWISE_SHUF(lo, hi, ev);
            *(V *)(bo + last / 2) = CB_DEPTHWISE_SHUF(lo, hi, od);
        }
        if (n % 2) be[(n - 1) / 2] = s[n - 1];
    }
}

/* The input's values into a zeroed padding buffer (see above), in whole
 * vectors when there are no phases and no upsampling. */
ATTR static void CB_TYPED(cb_depthwise_pad_plane_)(const T *src, ptrdiff_t H, ptrdiff_t W,
        T *buf, ptrdiff_t Hp, ptrdiff_t Wp, ptrdiff_t pt, ptrdiff_t pl, ptrdiff_t sw,
        ptrdiff_t uh, ptrdiff_t uw) {
    ptrdiff_t r, j, n = W < Wp - pl ? W : Wp - pl;
    if (CB_DEPTHWISE_SHUFFLE && sw == 2 && uh == 1 && uw == 1 && n >= 2 * VL) {
        CB_TYPED(cb_depthwise_pad_halves_)(src, H, W, buf, Hp, Wp, pt, pl, n);
        return;
    }
    if (sw != 1 || uh != 1 || uw != 1 || n < VL) {
        CB_TYPED(cb_depthwise_pad_phases_)(src, H, W, buf, Hp, Wp, pt, pl, sw, uh, uw);
        return;
    }
    for (r = 0; r < H && pt + r < Hp; r++) {
        T *b = buf + (pt + r) * Wp + pl;
        const T *s = src + r * W;
        for (j = 0; j + VL <= n; j += VL) *(V *)(b + j) = *(const V *)(s + j);
        *(V *)(b + n - VL) = *(const V *)(s + n - VL);
    }
}

/* channels_first forward: R output rows by NV
 * vectors (the second dv values after the first) at (oh, ow), the sums in
 * registers, each tap's weight loaded once for all of them. Overlapping
 * vectors store the same values twice. */
ATTR static inline __attribute__((always_inline)) void
CB_TYPED(cb_depthwise_cf_tile_)(const T *x,
        ptrdiff_t rs, const T *k, ptrdiff_t ks, const V *w, T *y, ptrdiff_t OW,
        ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t dv, ptrdiff_t sh, ptrdiff_t dil_h,
        const ptrdiff_t *co, ptrdiff_t KH, ptrdiff_t KW, int accumulate, V b0, int act,
        const int R, const int NV, const int K3) {
    V a[4][2];
    ptrdiff_t ky, kx;
    int r, v, i;
    for (r = 0; r < R; r++)
        for (v = 0; v < NV; v++)
            a[r][v] = accumulate ? *(const V *)(y + (oh + r) * OW + ow + v * dv) : b0;
    /* 3x3 taps at row stride K3 (1 or 2; 0: any other kernel) and unit row   */
    /* dilation: each vector of input row oh*K3 + i is loaded once for the     */
    /* output rows oh + r (ky = i - r*K3) that read it, with the 9 weights w  */
    /* in registers. Same order of taps. */
    if (K3) {
        CB_DEPTHWISE_UNROLL(8) for (i = 0; i < (R - 1) * K3 + 3; i++)
            CB_DEPTHWISE_UNROLL(4) for (kx = 0; kx < 3; kx++)
                CB_DEPTHWISE_UNROLL(2) for (v = 0; v < NV; v++) {
                    V xv = *(const V *)(x + (oh * K3 + i) * rs + ow + co[kx] + v * dv);
                    CB_DEPTHWISE_UNROLL(4) for (r = 0; r < R; r++)
                        if (i - r * K3 >= 0 && i - r * K3 < 3)
                            a[r][v] += xv * w[(i - r * K3) * 3 + kx];
                }
        KH = 0;
    }
    for (ky = 0; ky < KH; ky++) {
        const T *xr = x + (oh * sh + ky * dil_h) * rs + ow;
        for (kx = 0; kx < KW; kx++) {
            T kv = k[(ky * KW + kx) * ks];
            for (r = 0; r < R; r++)
                for (v = 0; v < NV; v++)
                    a[r][v] += *(const V *)(xr + r * sh * rs + co[kx] + v * dv) * kv;
        }
    }
    for (r = 0; r < R; r++)
        for (v = 0; v < NV; v++) {
            CB_VACT(a[r][v], act);
            *(V *)(y + (oh + r) * OW + ow + v * dv) = a[r][v];
        }
}
/* Output rows [oh, oh + R) of a plane: pairs of vectors, then the last
 * columns as overlapping vectors (or, when accumulating, single vectors and
 * scalars: an overlapping vector would add twice). */
ATTR static inline __attribute__((always_inline)) void
CB_TYPED(cb_depthwise_cf_rows_)(const T *x,
        ptrdiff_t rs, const T *k, ptrdiff_t ks, const V *w, T *y, ptrdiff_t OW,
        ptrdiff_t oh, ptrdiff_t sh, ptrdiff_t dil_h, const ptrdiff_t *co, ptrdiff_t KH,
        ptrdiff_t KW, int accumulate, V b0, int act, const int R, const int K3) {
    ptrdiff_t ow, c, r, ky, kx;
    for (ow = 0; ow + 2 * VL <= OW; ow += 2 * VL) CB_DEPTHWISE_TILE(ow, VL, 2);
    if (ow == OW) return;
    if (!accumulate) {
        if (ow + VL >= OW) CB_DEPTHWISE_TILE(OW - VL, 0, 1);
        else if (OW >= 2 * VL) CB_DEPTHWISE_TILE(OW - 2 * VL, VL, 2);
        else CB_DEPTHWISE_TILE(0, OW - VL, 2);
        return;
    }
    for (; ow + VL <= OW; ow += VL) CB_DEPTHWISE_TILE(ow, 0, 1);
    for (r = 0; r < R; r++)
        for (c = ow; c < OW; c++) {
            T s = y[(oh + r) * OW + c];
            for (ky = 0; ky < KH; ky++)
                for (kx = 0; kx < KW; kx++)
                    s += x[((oh + r) * sh + ky * dil_h) * rs + co[kx] + c]
                         * k[(ky * KW + kx) * ks];
            y[(oh + r) * OW + c] = CB_ACT(T, s, act);
        }
}
/* One plane, as cb_depthwise_fwd_cf_scalar: blocks of 4 output rows (8 sums in
 * registers hide the latency of the multiply-adds). 3x3 kernels at row stride
 * 1 or 2 and unit row dilation run in blocks of 3 rows instead, reusing each
 * input vector for the rows that read it: at stride 1, two loads per output
 * vector rather than nine, most of them across cache lines, which bounded
 * the speed. */
ATTR static void CB_TYPED(cb_depthwise_fwd_cf_plane_)(const T *x, ptrdiff_t rs, const T *k,
        ptrdiff_t ks, T *y, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw,
        ptrdiff_t dil_h, ptrdiff_t dil_w, ptrdiff_t KH, ptrdiff_t KW, int accumulate, T bias,
        int act) {
    V b0 = (V){0} + bias, w[9];
    ptrdiff_t oh = 0, t, co[KW];
    if (OW < VL) {
        CB_TYPED(cb_depthwise_fwd_cf_scalar_)(x, rs, k, ks, y, OH, OW, sh, sw, dil_h, dil_w, KH,
                                              KW, accumulate, bias, act);
        return;
    }
    cb_depthwise_cols(co, KW, dil_w, sw, rs);
    if (KH == 3 && KW == 3 && (sh == 1 || sh == 2) && dil_h == 1 && cb_depthwise_k3_state) {
        for (t = 0; t < 9; t++) w[t] = (V){0} + k[t * ks];
        if (sh == 1) {
            for (; oh + 3 <= OH; oh += 3) CB_DEPTHWISE_ROWS(3, 1);
            if (oh + 2 <= OH) {
                CB_DEPTHWISE_ROWS(2, 1);
                oh += 2;
            }
            if (oh < OH) CB_DEPTHWISE_ROWS(1, 1);
        } else {
            for (; oh + 3 <= OH; oh += 3) CB_DEPTHWISE_ROWS(3, 2);
            if (oh + 2 <= OH) {
                CB_DEPTHWISE_ROWS(2, 2);
                oh += 2;
            }
            if (oh < OH) CB_DEPTHWISE_ROWS(1, 2);
        }
        return;
    }
    for (; oh + 4 <= OH; oh += 4) CB_DEPTHWISE_ROWS(4, 0);
    if (oh + 2 <= OH) {
        CB_DEPTHWISE_ROWS(2, 0);
        oh += 2;
    }
    if (oh < OH) CB_DEPTHWISE_ROWS(1, 0);
}

/* channels_first 3x3 forward at stride 1, dilation 1 and pads (1, 1) on
 * both axes ("same"), straight from the unpadded plane (H, W): padding each
 * plane into a buffer first costs a large share of a small-plane call.
 * Tiles of 3 output rows by 2 vectors as in cb_depthwise_cf_tile (same loads,
 * taps and order, so the same bits as the padded plane): rows above or below
 * the plane read the zero row, and the one column outside the plane at either
 * end comes into the tile's first vector (LEFT) or last one (RIGHT) by a
 * shuffle with a zero lane. The flags are constants: the compiler may leave
 * a multiply-add whose operand depends on a run-time branch unfused, which
 * changes the bits. Tiles overlap at the plane's ends instead of taking
 * narrower shapes, so the function takes planes of at least 3 rows and VL columns,
 * without accumulation; it returns 0 (nothing done) for any other plane, on
 * compilers without shuffles, and while a test turns the row-reuse tiles or
 * this kernel off (cb_depthwise_use_k3, cb_depthwise_read_edges). */
ATTR static inline __attribute__((always_inline)) void
CB_TYPED(cb_depthwise_s3_tile_)(const T *const *p, const V *w, T *y, ptrdiff_t W,
        ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t dv, V b0, int act, const int NV, const int LEFT,
        const int RIGHT) {
    typedef __typeof__(b0 > b0) mask_t;
    const V z = {0};
    mask_t ml, mr;
    V a[3][2];
    int r, v, i, kx, j;
    for (j = 0; j < VL; j++) {
        ml[j] = j == 0 ? VL : j - 1;
        mr[j] = j == VL - 1 ? VL : j + 1;
    }
    for (r = 0; r < 3; r++) a[r][0] = a[r][1] = b0;
    CB_DEPTHWISE_UNROLL(5) for (i = 0; i < 5; i++)
        CB_DEPTHWISE_UNROLL(3) for (kx = 0; kx < 3; kx++)
            CB_DEPTHWISE_UNROLL(2) for (v = 0; v < NV; v++) {
                const T *xc = p[i] + ow + v * dv;
                V xv;
                if (LEFT && kx == 0 && v == 0)
                    xv = CB_DEPTHWISE_SHUF(*(const V *)xc, z, ml);
                else if (RIGHT && kx == 2 && v == NV - 1)
                    xv = CB_DEPTHWISE_SHUF(*(const V *)xc, z, mr);
                else
                    xv = *(const V *)(xc + kx - 1);
                CB_DEPTHWISE_UNROLL(3) for (r = 0; r < 3; r++)
                    if (i - r >= 0 && i - r < 3) a[r][v] += xv * w[(i - r) * 3 + kx];
            }
    for (r = 0; r < 3; r++)
        for (v = 0; v < NV; v++) {
            CB_VACT(a[r][v], act);
            *(V *)(y + (oh + r) * W + ow + v * dv) = a[r][v];
        }
}
/* The planes of each width class in a function of its own: inlined together,
 * GCC hoisted their first tiles' products above the branch on W and left
 * those unfused. */
ATTR static inline __attribute__((always_inline)) void
CB_TYPED(cb_depthwise_s3_rows_)(const T *x, ptrdiff_t H, ptrdiff_t W, const V *w, T *y,
        const T *zero, V b0, int act, const int KIND) {
    const T *p[5];
    ptrdiff_t oh, o, ow, i;
    for (oh = 0; oh < H; oh += 3) {
        o = oh + 3 <= H ? oh : H - 3;
        for (i = 0; i < 5; i++)
            p[i] = o - 1 + i >= 0 && o - 1 + i < H ? x + (o - 1 + i) * W : zero;
        if (KIND == 0) {
            CB_TYPED(cb_depthwise_s3_tile_)(p, w, y, W, o, 0, 0, b0, act, 1, 1, 1);
        } else if (KIND == 1) {
            CB_TYPED(cb_depthwise_s3_tile_)(p, w, y, W, o, 0, W - VL, b0, act, 2, 1, 1);
        } else {
            CB_TYPED(cb_depthwise_s3_tile_)(p, w, y, W, o, 0, VL, b0, act, 2, 1, 0);
            for (ow = 2 * VL; ow + 2 * VL <= W - 2 * VL; ow += 2 * VL)
                CB_TYPED(cb_depthwise_s3_tile_)(p, w, y, W, o, ow, VL, b0, act, 2, 0, 0);
            if (ow < W - 2 * VL)
                CB_TYPED(cb_depthwise_s3_tile_)(p, w, y, W, o, W - 4 * VL, VL, b0, act, 2, 0,
                                                0);
            CB_TYPED(cb_depthwise_s3_tile_)(p, w, y, W, o, W - 2 * VL, VL, b0, act, 2, 0, 1);
        }
    }
}
ATTR static __attribute__((noinline)) void CB_TYPED(cb_depthwise_s3_one_)(const T *x,
        ptrdiff_t H, ptrdiff_t W, const V *w, T *y, const T *zero, V b0, int act) {
    CB_TYPED(cb_depthwise_s3_rows_)(x, H, W, w, y, zero, b0, act, 0);
}
ATTR static __attribute__((noinline)) void CB_TYPED(cb_depthwise_s3_two_)(const T *x,
        ptrdiff_t H, ptrdiff_t W, const V *w, T *y, const T *zero, V b0, int act) {
    CB_TYPED(cb_depthwise_s3_rows_)(x, H, W, w, y, zero, b0, act, 1);
}
ATTR static __attribute__((noinline)) void CB_TYPED(cb_depthwise_s3_wide_)(const T *x,
        ptrdiff_t H, ptrdiff_t W, const V *w, T *y, const T *zero, V b0, int act) {
    CB_TYPED(cb_depthwise_s3_rows_)(x, H, W, w, y, zero, b0, act, 2);
}
ATTR static int CB_TYPED(cb_depthwise_fwd_cf_same3_)(const T *x, ptrdiff_t H, ptrdiff_t W,
        const T *k, ptrdiff_t ks, T *y, const T *zero, T bias, int act) {
    V b0 = (V){0} + bias, w[9];
    ptrdiff_t t;
    if (!CB_DEPTHWISE_SHUFFLE || !cb_depthwise_same3_state || !cb_depthwise_k3_state || H < 3
            || W < VL)
        return 0;
    for (t = 0; t < 9; t++) w[t] = (V){0} + k[t * ks];
    if (W == VL) CB_TYPED(cb_depthwise_s3_one_)(x, H, W, w, y, zero, b0, act);
    else if (W <= 2 * VL) CB_TYPED(cb_depthwise_s3_two_)(x, H, W, w, y, zero, b0, act);
    else CB_TYPED(cb_depthwise_s3_wide_)(x, H, W, w, y, zero, b0, act);
    return 1;
}

/* channels_first kernel gradient: taps [t0, t0 + NK) of kernel row ky
 * (columns co[j] + ow), each with two sums in registers, over the
 * whole plane. The last vector of a row overlaps the one before; keep masks
 * off its lanes that were already counted. */
ATTR static inline __attribute__((always_inline)) void
CB_TYPED(cb_depthwise_kg_cf_taps_)(const T *x, ptrdiff_t rs, const T *dy, ptrdiff_t OH,
        ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t dil_h, const ptrdiff_t *co, ptrdiff_t ky,
        ptrdiff_t t0, V keep, T *acc, const int NK) {
    typedef __typeof__(keep > keep) mask_t;
    V a0[4], a1[4];
    ptrdiff_t oh, ow;
    int j;
    for (j = 0; j < NK; j++) a0[j] = a1[j] = (V){0};
    for (oh = 0; oh < OH; oh++) {
        const T *g = dy + oh * OW, *xr = x + (oh * sh + ky * dil_h) * rs;
        for (ow = 0; ow + 2 * VL <= OW; ow += 2 * VL) {
            V g0 = *(const V *)(g + ow), g1 = *(const V *)(g + ow + VL);
            for (j = 0; j < NK; j++) {
                a0[j] += g0 * *(const V *)(xr + co[j] + ow);
                a1[j] += g1 * *(const V *)(xr + co[j] + ow + VL);
            }
        }
        if (ow + VL <= OW) {
            V g0 = *(const V *)(g + ow);
            for (j = 0; j < NK; j++) a0[j] += g0 * *(const V *)(xr + co[j] + ow);
            ow += VL;
        }
        if (ow < OW) {
            V g1 = *(const V *)(g + OW - VL);
            for (j = 0; j < NK; j++)
                a1[j] += (V)((mask_t)(g1 * *(const V *)(xr + co[j] + OW - VL))
                             & (mask_t)keep);
        }
    }
    for (j = 0; j < NK; j++) *(V *)(acc + (t0 + j) * 8) += a0[j] + a1[j];
}
/* One plane, as cb_depthwise_kgrad_cf_scalar, with the sums spread over the
 * lanes. */
ATTR static void CB_TYPED(cb_depthwise_kgrad_cf_plane_)(const T *x, ptrdiff_t rs, const T *dy,
        ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dil_h, ptrdiff_t dil_w,
        ptrdiff_t KH, ptrdiff_t KW, T *acc) {
    T lane[VL];
    V keep;
    ptrdiff_t ky, kx0, j, co[KW];
    if (OW < VL) {
        CB_TYPED(cb_depthwise_kgrad_cf_scalar_)(x, rs, dy, OH, OW, sh, sw, dil_h, dil_w, KH, KW,
                                                acc);
        return;
    }
    cb_depthwise_cols(co, KW, dil_w, sw, rs);
    /* Lanes at or after VL - OW % VL of the overlapping last vector are new. */
    for (j = 0; j < VL; j++) lane[j] = (T)j;
    keep = (V)(*(const V *)lane >= (V){0} + (T)(VL - OW % VL));
    for (ky = 0; ky < KH; ky++)
        for (kx0 = 0; kx0 < KW; kx0 += 4)
            switch (KW - kx0) {
            case 1: CB_DEPTHWISE_TAPS(1); break;
            case 2: CB_DEPTHWISE_TAPS(2); break;
            case 3: CB_DEPTHWISE_TAPS(3); break;
            default: CB_DEPTHWISE_TAPS(4);
            }
}

#elif CB_SIMD_VECTOR

/* The type's entries: the AVX2 + FMA instance where the CPU has them. */
static void CB_TYPED(cb_depthwise_pad_plane_)(const T *src, ptrdiff_t H, ptrdiff_t W, T *buf,
        ptrdiff_t Hp, ptrdiff_t Wp, ptrdiff_t pt, ptrdiff_t pl, ptrdiff_t sw, ptrdiff_t uh,
        ptrdiff_t uw) {
    CB_DEPTHWISE_PICK(cb_depthwise_pad_plane_)(src, H, W, buf, Hp, Wp, pt, pl, sw, uh, uw);
}
static void CB_TYPED(cb_depthwise_fwd_cf_plane_)(const T *x, ptrdiff_t rs, const T *k,
        ptrdiff_t ks, T *y, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw,
        ptrdiff_t dil_h, ptrdiff_t dil_w, ptrdiff_t KH, ptrdiff_t KW, int accumulate, T bias,
        int act) {
    CB_DEPTHWISE_PICK(cb_depthwise_fwd_cf_plane_)(x, rs, k, ks, y, OH, OW, sh, sw, dil_h, dil_w,
                                                  KH, KW, accumulate, bias, act);
}
static int CB_TYPED(cb_depthwise_fwd_cf_same3_)(const T *x, ptrdiff_t H, ptrdiff_t W,
        const T *k, ptrdiff_t ks, T *y, const T *zero, T bias, int act) {
    return CB_DEPTHWISE_PICK(cb_depthwise_fwd_cf_same3_)(x, H, W, k, ks, y, zero, bias, act);
}
static void CB_TYPED(cb_depthwise_kgrad_cf_plane_)(const T *x, ptrdiff_t rs, const T *dy,
        ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dil_h, ptrdiff_t dil_w,
        ptrdiff_t KH, ptrdiff_t KW, T *acc) {
    CB_DEPTHWISE_PICK(cb_depthwise_kgrad_cf_plane_)(x, rs, dy, OH, OW, sh, sw, dil_h, dil_w, KH,
                                                    KW, acc);
}

#endif
