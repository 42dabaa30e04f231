/* int8 depthwise 2-D convolution, channels_last (cyback/kernels/qconv_depthwise.pxi):
 * uint8 activations x int8 weights, one filter per channel, exact int32 sums,
 * and the requantizing epilogue of cyback_qgemm.h (which must be included
 * first) applied to each vector of channels before it is stored.
 *
 * Packed weights: an int32 array (taps + 1 + kh, cp), cp = C rounded up to
 * 16: row t holds tap t = ky * kw + kx of every channel, widened to int32,
 * row taps each channel's sum over the taps (for the zero point), and row
 * taps + 1 + ky the first four taps of window row ky as four bytes (the
 * byte-tap path below); channels past C are zero. Taps in the padding read the activations' zero
 * point (the code of 0.0), so that
 *     acc[c] = sum_t x_t[c] * w_t[c],    d[c] = acc[c] - za * wsum[c]
 * is the exact integer sum of (x - za) * w over the taps inside the image.
 * The products (|u8 x s8| < 2^15) and sums of up to CB_Q_MAX_K taps are
 * exact in int32.
 *
 * Sets: AVX-512 (the avx512_vnni level: F, BW, VL, VNNI) 16 channels per
 * zmm, AVX2 (the avx2 and avx_vnni levels) 8 per ymm, two at a time, scalar
 * otherwise. In memory a pixel's four neighbouring bytes are four channels,
 * not the four taps the byte dot-product instructions would sum, so the
 * widening path widens the bytes to int32 lanes and multiplies them by the
 * packed int32 weights with the 16-bit multiply-add (vpmaddwd, or vpdpwssd,
 * which also adds), whose high halves give 0 * (w >> 16): one tap per
 * instruction. With AVX-512 VBMI, windows up to four taps wide at stride 1
 * along the row take the byte-tap path (below), a window row per vpdpbusd.
 * Every path gives the same bits: exact sums, the same epilogue.
 */
#ifndef CYBACK_QDEPTHWISE_H
#define CYBACK_QDEPTHWISE_H

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

/* The geometry of one depthwise convolution. */
typedef struct {
    ptrdiff_t h, w, c;         /* input height, width, channels */
    ptrdiff_t kh, kw, sh, sw, dh, dw, pt, pl;
    ptrdiff_t oh, ow;
    ptrdiff_t cp;              /* packed row length (C rounded up to 16) */
    uint8_t pad;               /* the zero point */
} cb_qdw_geometry;

/* Pack w (kh * kw taps, c channels; element (t, ch) at w[t * c + ch]) into
 * out ((taps + 1 + kh) * cp int32): the widened taps, the sums, then per
 * window row ky each channel's first four taps of that row as the bytes of
 * one int32 (tap kx in byte kx, zero past kw), the operand of vpdpbusd for
 * the byte-tap path (cb_qdw_bytes_lines). */
static void cb_qdw_pack(const int8_t *w, ptrdiff_t kh, ptrdiff_t kw, ptrdiff_t c, ptrdiff_t cp,
                        int32_t *out) {
    const ptrdiff_t taps = kh * kw;
    ptrdiff_t t, ch, ky, kx;
    memset(out, 0, sizeof(int32_t) * (size_t)((taps + 1 + kh) * cp));
    for (t = 0; t < taps; t++)
        for (ch = 0; ch < c; ch++) {
            out[t * cp + ch] = w[t * c + ch];
            out[taps * cp + ch] += w[t * c + ch];
        }
    for (ky = 0; ky < kh; ky++)
        for (ch = 0; ch < c; ch++) {
            uint32_t word = 0;
            for (kx = 0; kx < kw && kx < 4; kx++)
                word |= (uint32_t)(uint8_t)w[(ky * kw + kx) * c + ch] << (8 * kx);
            memcpy(out + (taps + 1 + ky) * cp + ch, &word, sizeof word);
        }
}

/* The input pixel of tap (ky, kx) for output (oy, ox) of image img, or NULL
 * in the padding. */
static inline const uint8_t *cb_qdw_pixel(const cb_qdw_geometry *g, const uint8_t *img,
                                          ptrdiff_t oy, ptrdiff_t ox, ptrdiff_t ky,
                                          ptrdiff_t kx) {
    const ptrdiff_t iy = oy * g->sh - g->pt + ky * g->dh, ix = ox * g->sw - g->pl + kx * g->dw;
    if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) return NULL;
    return img + (iy * g->w + ix) * g->c;
}

static void cb_qdw_lines_scalar(const cb_qdw_geometry *g, const uint8_t *x, const int32_t *wp,
                                const cb_q_epilogue *e, ptrdiff_t r0, ptrdiff_t r1) {
    const ptrdiff_t taps = g->kh * g->kw;
    ptrdiff_t r, ox, c0, ky, kx;
    int j;
    for (r = r0; r < r1; r++) {
        const ptrdiff_t b = r / g->oh, oy = r % g->oh;
        const uint8_t *img = x + b * g->h * g->w * g->c;
        for (ox = 0; ox < g->ow; ox++)
            for (c0 = 0; c0 < g->c; c0 += CB_Q_NR) {
                const int valid = (int)(g->c - c0 < CB_Q_NR ? g->c - c0 : CB_Q_NR);
                int32_t acc[CB_Q_NR] = {0};
                for (ky = 0; ky < g->kh; ky++)
                    for (kx = 0; kx < g->kw; kx++) {
                        const uint8_t *px = cb_qdw_pixel(g, img, oy, ox, ky, kx);
                        const int32_t *wt = wp + (ky * g->kw + kx) * g->cp + c0;
                        for (j = 0; j < valid; j++)
                            acc[j] += (int32_t)(px ? px[c0 + j] : g->pad) * wt[j];
                    }
                cb_q_epilogue_scalar(acc, wp + taps * g->cp + c0, r * g->ow + ox, c0, valid, e);
            }
    }
}

#if CB_SIMD_AVX2

/* The vector paths walk an output line. The outputs whose window lies inside
 * the image (most of them) form one run per line whose taps sit at fixed
 * offsets from the window's corner; the run goes channel block by channel
 * block, pixel by pixel inside a block, so that a block's weights stay close
 * (in registers for 3x3 windows on AVX-512). An output at an edge first
 * gathers the address of every tap's input pixel, taps in the padding
 * pointing at a row of zero-point bytes, so that no loop over channels and
 * taps tests bounds. Each tap multiplies the activation bytes widened to
 * int32 by the packed int32 weights with a 16-bit multiply-add (vpmaddwd):
 * an activation lane is x (< 256) in its low half and 0 in its high one, a
 * weight lane w sign-extended, so the lane's sum x * w + 0 * (w >> 16) is
 * the exact product. */
typedef struct {
    const uint8_t **tap;       /* the taps' addresses, one per tap */
    const uint8_t *padrow;     /* cp bytes of the zero point */
    const ptrdiff_t *off;      /* each tap's offset from the window's corner */
    int32_t *start;            /* cp sums to start from: -za * wsum[c] */
    const uint8_t **edge;      /* 3x3 windows: 9 addresses per output of a line */
    void *mem;
} cb_qdw_taps;

static int cb_qdw_taps_init(cb_qdw_taps *t, const cb_qdw_geometry *g, const int32_t *wp) {
    const ptrdiff_t taps = g->kh * g->kw, nedge = taps == 9 ? 9 * g->ow : 0;
    const int32_t *wsum = wp + taps * g->cp;
    ptrdiff_t ky, kx, ch;
    /* the starting sums first (4-byte aligned), then the addresses, the
     * offsets and the row of zero-point bytes */
    char *m = (char *)malloc(sizeof(int32_t) * (size_t)g->cp +
                             sizeof(const uint8_t *) * (size_t)(taps + nedge) +
                             sizeof(ptrdiff_t) * (size_t)taps + (size_t)g->cp + 64);
    ptrdiff_t *off;
    if (!m) return 0;
    t->mem = m;
    t->start = (int32_t *)m;
    /* acc - za * wsum in int32 (wrapping, as the epilogue's vpmulld and
     * vpsubd) is the sum of the products started from -za * wsum */
    for (ch = 0; ch < g->cp; ch++)
        t->start[ch] = (int32_t)(0u - (uint32_t)g->pad * (uint32_t)wsum[ch]);
    t->tap = (const uint8_t **)(m + sizeof(int32_t) * (size_t)g->cp);
    t->edge = t->tap + taps;
    off = (ptrdiff_t *)(t->edge + nedge);
    for (ky = 0; ky < g->kh; ky++)
        for (kx = 0; kx < g->kw; kx++)
            off[ky * g->kw + kx] = (ky * g->dh * g->w + kx * g->dw) * g->c;
    t->off = off;
    t->padrow = (const uint8_t *)(off + taps);
    memset((void *)t->padrow, g->pad, (size_t)g->cp + 64);
    return 1;
}

/* Fills dst (kh * kw addresses) for output (oy, ox) of image img, a window
 * at an edge. */
static inline void cb_qdw_gather_to(const cb_qdw_geometry *g, const cb_qdw_taps *t,
                                    const uint8_t **dst, const uint8_t *img, ptrdiff_t oy,
                                    ptrdiff_t ox) {
    const ptrdiff_t iy0 = oy * g->sh - g->pt, ix0 = ox * g->sw - g->pl;
    ptrdiff_t ky, kx, i;
    for (ky = 0, i = 0; ky < g->kh; ky++) {
        const ptrdiff_t iy = iy0 + ky * g->dh;
        const int row_in = iy >= 0 && iy < g->h;
        for (kx = 0; kx < g->kw; kx++, i++) {
            const ptrdiff_t ix = ix0 + kx * g->dw;
            dst[i] = row_in && ix >= 0 && ix < g->w ? img + (iy * g->w + ix) * g->c : t->padrow;
        }
    }
}

static inline void cb_qdw_gather(const cb_qdw_geometry *g, cb_qdw_taps *t, const uint8_t *img,
                                 ptrdiff_t oy, ptrdiff_t ox) {
    cb_qdw_gather_to(g, t, t->tap, img, oy, ox);
}

/* 16 channel bytes from p (zero past `valid`), as 16 bytes in a register. */
CB_Q_ALWAYS CB_Q_AVX2_ATTR __m128i cb_qdw_load16(const uint8_t *p, int valid) {
    if (valid == CB_Q_NR) return _mm_loadu_si128((const __m128i *)p);
    {
        uint8_t tmp[CB_Q_NR] = {0};
        int j;
        for (j = 0; j < valid; j++) tmp[j] = p[j];
        return _mm_loadu_si128((const __m128i *)tmp);
    }
}

/* The outputs *lo .. *hi - 1 of a line have their windows inside the image
 * horizontally. */
static inline void cb_qdw_inner_span(const cb_qdw_geometry *g, ptrdiff_t *lo, ptrdiff_t *hi) {
    const ptrdiff_t span = g->w - 1 + g->pl - (g->kw - 1) * g->dw;
    *lo = (g->pl + g->sw - 1) / g->sw;
    *hi = span >= 0 ? span / g->sw + 1 : 0;
    if (*hi > g->ow) *hi = g->ow;
    if (*lo > *hi) *lo = *hi;
}

/* The 16 AVX2 channels from c0 on of one pixel (FULL), or c0 .. C - 1, over
 * TAPS taps (a constant where the caller knows it, so that the loop
 * unrolls). INSIDE: the window lies in the image, tap t at base + off[t];
 * else at tap[t]. */
CB_Q_ALWAYS CB_Q_AVX2_ATTR void cb_qdw_block16_avx2(const cb_qdw_geometry *g,
                                                    const cb_qdw_taps *tp, int inside,
                                                    const uint8_t *base, const int32_t *wp,
                                                    const cb_q_epilogue *e, ptrdiff_t row,
                                                    ptrdiff_t taps, ptrdiff_t c0, int full) {
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    ptrdiff_t t;
    _Pragma("GCC unroll 16") for (t = 0; t < taps; t++) {
        const uint8_t *px = (inside ? base + tp->off[t] : tp->tap[t]) + c0;
        const int32_t *wt = wp + t * g->cp + c0;
        __m256i x0, x1;
        if (full) {
            x0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)px));
            x1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(px + 8)));
        } else {
            const __m128i xb = cb_qdw_load16(px, (int)(g->c - c0));
            x0 = _mm256_cvtepu8_epi32(xb);
            x1 = _mm256_cvtepu8_epi32(_mm_srli_si128(xb, 8));
        }
        acc0 = _mm256_add_epi32(acc0,
                                _mm256_madd_epi16(x0, _mm256_loadu_si256((const __m256i *)wt)));
        acc1 = _mm256_add_epi32(
            acc1, _mm256_madd_epi16(x1, _mm256_loadu_si256((const __m256i *)(wt + 8))));
    }
    cb_q_epilogue_256(acc0, acc1, (const int8_t *)(wp + taps * g->cp + c0), row, c0, g->c, e);
}

/* Every channel of one pixel whose taps are in tp->tap. */
CB_Q_ALWAYS CB_Q_AVX2_ATTR void cb_qdw_pixel_avx2(const cb_qdw_geometry *g,
                                                  const cb_qdw_taps *tp, const int32_t *wp,
                                                  const cb_q_epilogue *e, ptrdiff_t row,
                                                  ptrdiff_t taps) {
    ptrdiff_t c0 = 0;
    for (; c0 + CB_Q_NR <= g->c; c0 += CB_Q_NR)
        cb_qdw_block16_avx2(g, tp, 0, NULL, wp, e, row, taps, c0, 1);
    if (c0 < g->c) cb_qdw_block16_avx2(g, tp, 0, NULL, wp, e, row, taps, c0, 0);
}

/* n pixels whose windows lie inside the image, the first at base, each
 * `step` bytes after the last: channel blocks outside, pixels inside. */
CB_Q_ALWAYS CB_Q_AVX2_ATTR void cb_qdw_run_avx2(const cb_qdw_geometry *g, const cb_qdw_taps *tp,
                                                const uint8_t *base, ptrdiff_t n, ptrdiff_t step,
                                                const int32_t *wp, const cb_q_epilogue *e,
                                                ptrdiff_t row, ptrdiff_t taps) {
    ptrdiff_t c0 = 0, i;
    for (; c0 + CB_Q_NR <= g->c; c0 += CB_Q_NR)
        for (i = 0; i < n; i++)
            cb_qdw_block16_avx2(g, tp, 1, base + i * step, wp, e, row + i, taps, c0, 1);
    if (c0 < g->c)
        for (i = 0; i < n; i++)
            cb_qdw_block16_avx2(g, tp, 1, base + i * step, wp, e, row + i, taps, c0, 0);
}

CB_Q_AVX2_ATTR static void cb_qdw_lines_avx2(const cb_qdw_geometry *g, const uint8_t *x,
                                             const int32_t *wp, const cb_q_epilogue *e,
                                             cb_qdw_taps *tp, ptrdiff_t r0, ptrdiff_t r1) {
    /* a copy of the epilogue's fields the compiler knows no store reaches
     * (a byte store may alias anything: it would reload them after each) */
    const cb_q_epilogue el = *e;
    const ptrdiff_t taps = g->kh * g->kw;
    ptrdiff_t r, ox, lo, hi;
    cb_qdw_inner_span(g, &lo, &hi);
    for (r = r0; r < r1; r++) {
        const ptrdiff_t b = r / g->oh, oy = r % g->oh, iy0 = oy * g->sh - g->pt;
        const uint8_t *img = x + b * g->h * g->w * g->c;
        const int rows_in = iy0 >= 0 && iy0 + (g->kh - 1) * g->dh < g->h;
        for (ox = 0; ox < g->ow; ox++) {
            if (rows_in && ox == lo && hi > lo) {
                const uint8_t *base = img + (iy0 * g->w + lo * g->sw - g->pl) * g->c;
                if (taps == 9)
                    cb_qdw_run_avx2(g, tp, base, hi - lo, g->sw * g->c, wp, &el, r * g->ow + lo,
                                    9);
                else
                    cb_qdw_run_avx2(g, tp, base, hi - lo, g->sw * g->c, wp, &el, r * g->ow + lo,
                                    taps);
                ox = hi - 1;
                continue;
            }
            cb_qdw_gather(g, tp, img, oy, ox);
            cb_qdw_pixel_avx2(g, tp, wp, &el, r * g->ow + ox, taps);
        }
    }
}

#if CB_Q_HAVE_AVX512VNNI
/* cb_q_epilogue_512 for sums d that already hold -za * wsum: the same float
 * operations in the same order; FULL: all 16 lanes are channels, stored
 * without a mask. */
CB_Q_ALWAYS CB_Q_AVX512_ATTR void cb_qdw_epilogue_512(__m512i d, ptrdiff_t row, ptrdiff_t c0,
                                                      __mmask16 mask, int full,
                                                      const cb_q_epilogue *e) {
    __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_loadu_ps(e->scale + c0));
    if (e->bias) y = _mm512_add_ps(y, _mm512_loadu_ps(e->bias + c0));
    if (e->act != CB_ACT_NONE) {
        y = _mm512_max_ps(_mm512_setzero_ps(), y);
        if (e->act == CB_ACT_RELU6) y = _mm512_min_ps(_mm512_set1_ps(6.0f), y);
    }
    if (e->out_f) {
        float *o = e->out_f + row * e->ldf + c0;
        if (full)
            _mm512_storeu_ps(o, y);
        else
            _mm512_mask_storeu_ps(o, mask, y);
    }
    if (e->out_q) {
        uint8_t *o = e->out_q + row * e->ldq + c0;
        const __m128i bytes = cb_q_codes_512(y, e->q_scale, e->q_hi, e->q_zero);
        if (full)
            _mm_storeu_si128((__m128i *)o, bytes);
        else
            _mm_mask_storeu_epi8(o, mask, bytes);
    }
}

/* The int32 sums of 16 AVX-512 channels start from -za * wsum, and one
 * vpdpwssd multiplies and adds (see the top of the AVX2 set). INSIDE: the
 * window lies in the image, tap t at base + off[t]; else at tap[t]. */
#define CB_QDW_TAP(t) (inside ? base + tp->off[t] : tp->tap[t])
#define CB_QDW_X(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))

/* Channels c0 .. c0 + 31 of one pixel: even and odd taps in sums of their
 * own, four chains of dependent vpdpwssd in flight instead of one. */
CB_Q_ALWAYS CB_Q_AVX512_ATTR void cb_qdw_block32_avx512(const cb_qdw_geometry *g,
                                                        const cb_qdw_taps *tp, int inside,
                                                        const uint8_t *base, const int32_t *wp,
                                                        const cb_q_epilogue *e, ptrdiff_t row,
                                                        ptrdiff_t taps, ptrdiff_t c0) {
    __m512i a0 = _mm512_loadu_si512(tp->start + c0);
    __m512i a1 = _mm512_loadu_si512(tp->start + c0 + CB_Q_NR);
    __m512i b0 = _mm512_setzero_si512(), b1 = _mm512_setzero_si512();
    ptrdiff_t t;
    _Pragma("GCC unroll 8") for (t = 0; t + 1 < taps; t += 2) {
        const uint8_t *p = CB_QDW_TAP(t) + c0, *q = CB_QDW_TAP(t + 1) + c0;
        const int32_t *w = wp + t * g->cp + c0;
        a0 = _mm512_dpwssd_epi32(a0, CB_QDW_X(p), _mm512_loadu_si512(w));
        a1 = _mm512_dpwssd_epi32(a1, CB_QDW_X(p + CB_Q_NR), _mm512_loadu_si512(w + CB_Q_NR));
        b0 = _mm512_dpwssd_epi32(b0, CB_QDW_X(q), _mm512_loadu_si512(w + g->cp));
        b1 = _mm512_dpwssd_epi32(b1, CB_QDW_X(q + CB_Q_NR),
                                 _mm512_loadu_si512(w + g->cp + CB_Q_NR));
    }
    if (t < taps) {
        const uint8_t *p = CB_QDW_TAP(t) + c0;
        const int32_t *w = wp + t * g->cp + c0;
        a0 = _mm512_dpwssd_epi32(a0, CB_QDW_X(p), _mm512_loadu_si512(w));
        a1 = _mm512_dpwssd_epi32(a1, CB_QDW_X(p + CB_Q_NR), _mm512_loadu_si512(w + CB_Q_NR));
    }
    cb_qdw_epilogue_512(_mm512_add_epi32(a0, b0), row, c0, 0xFFFF, 1, e);
    cb_qdw_epilogue_512(_mm512_add_epi32(a1, b1), row, c0 + CB_Q_NR, 0xFFFF, 1, e);
}

/* Channels c0 .. c0 + 15 of one pixel (FULL), or c0 .. C - 1 (mask). */
CB_Q_ALWAYS CB_Q_AVX512_ATTR void cb_qdw_block16_avx512(const cb_qdw_geometry *g,
                                                        const cb_qdw_taps *tp, int inside,
                                                        const uint8_t *base, const int32_t *wp,
                                                        const cb_q_epilogue *e, ptrdiff_t row,
                                                        ptrdiff_t taps, ptrdiff_t c0, int full) {
    const __mmask16 mask =
        full ? (__mmask16)0xFFFF : (__mmask16)((1u << (g->c - c0)) - 1);
    __m512i acc = _mm512_loadu_si512(tp->start + c0);
    ptrdiff_t t;
    _Pragma("GCC unroll 16") for (t = 0; t < taps; t++) {
        const uint8_t *p = CB_QDW_TAP(t) + c0;
        const __m512i xv = full ? CB_QDW_X(p) : _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, p));
        acc = _mm512_dpwssd_epi32(acc, xv, _mm512_loadu_si512(wp + t * g->cp + c0));
    }
    cb_qdw_epilogue_512(acc, row, c0, mask, full, e);
}
#undef CB_QDW_TAP

/* Every channel of one pixel. */
CB_Q_ALWAYS CB_Q_AVX512_ATTR void cb_qdw_pixel_avx512(const cb_qdw_geometry *g,
                                                      const cb_qdw_taps *tp, int inside,
                                                      const uint8_t *base, const int32_t *wp,
                                                      const cb_q_epilogue *e, ptrdiff_t row,
                                                      ptrdiff_t taps) {
    ptrdiff_t c0 = 0;
    for (; c0 + 2 * CB_Q_NR <= g->c; c0 += 2 * CB_Q_NR)
        cb_qdw_block32_avx512(g, tp, inside, base, wp, e, row, taps, c0);
    for (; c0 + CB_Q_NR <= g->c; c0 += CB_Q_NR)
        cb_qdw_block16_avx512(g, tp, inside, base, wp, e, row, taps, c0, 1);
    if (c0 < g->c) cb_qdw_block16_avx512(g, tp, inside, base, wp, e, row, taps, c0, 0);
}

/* n pixels whose windows lie inside the image, the first at base, each
 * `step` bytes after the last; channel blocks outside, pixels inside, so
 * that a block's weights stay in registers along the run. */
CB_Q_ALWAYS CB_Q_AVX512_ATTR void cb_qdw_run_avx512(const cb_qdw_geometry *g,
                                                    const cb_qdw_taps *tp, const uint8_t *base,
                                                    ptrdiff_t n, ptrdiff_t step,
                                                    const int32_t *wp, const cb_q_epilogue *e,
                                                    ptrdiff_t row, ptrdiff_t taps) {
    ptrdiff_t c0 = 0, i;
    for (; c0 + 2 * CB_Q_NR <= g->c; c0 += 2 * CB_Q_NR)
        for (i = 0; i < n; i++)
            cb_qdw_block32_avx512(g, tp, 1, base + i * step, wp, e, row + i, taps, c0);
    for (; c0 + CB_Q_NR <= g->c; c0 += CB_Q_NR)
        for (i = 0; i < n; i++)
            cb_qdw_block16_avx512(g, tp, 1, base + i * step, wp, e, row + i, taps, c0, 1);
    if (c0 < g->c)
        for (i = 0; i < n; i++)
            cb_qdw_block16_avx512(g, tp, 1, base + i * step, wp, e, row + i, taps, c0, 0);
}

/* A whole line of 3x3 outputs, channel blocks outside: a block's weight
 * vectors stay in registers along the line, so each tap loads only its
 * activations (the loads bounded the loop). Outputs lo .. hi - 1 have their
 * windows inside the image (from base on, step bytes apart); the others'
 * taps are in tp->edge, 9 per output. Even and odd taps in sums of their
 * own. */
CB_Q_ALWAYS CB_Q_AVX512_ATTR void cb_qdw_line9_avx512(const cb_qdw_geometry *g,
                                                      const cb_qdw_taps *tp,
                                                      const uint8_t *base, ptrdiff_t lo,
                                                      ptrdiff_t hi, ptrdiff_t step,
                                                      const int32_t *wp, const cb_q_epilogue *e,
                                                      ptrdiff_t row) {
    const ptrdiff_t *off = tp->off;
    ptrdiff_t c0 = 0, ox, t;
/* the 32 channels from c0 on of output ox, tap t at ADDR */
#define CB_QDW_PIX32(ADDR)                                                                  \
    do {                                                                                    \
        __m512i a0 = s0, a1 = s1, b0 = _mm512_setzero_si512(), b1 = _mm512_setzero_si512(); \
        _Pragma("GCC unroll 9") for (t = 0; t < 9; t++) {                                   \
            const uint8_t *p = (ADDR) + c0;                                                 \
            if (t % 2 == 0) {                                                               \
                a0 = _mm512_dpwssd_epi32(a0, CB_QDW_X(p), w[t][0]);                         \
                a1 = _mm512_dpwssd_epi32(a1, CB_QDW_X(p + CB_Q_NR), w[t][1]);               \
            } else {                                                                        \
                b0 = _mm512_dpwssd_epi32(b0, CB_QDW_X(p), w[t][0]);                         \
                b1 = _mm512_dpwssd_epi32(b1, CB_QDW_X(p + CB_Q_NR), w[t][1]);               \
            }                                                                               \
        }                                                                                   \
        cb_qdw_epilogue_512(_mm512_add_epi32(a0, b0), row + ox, c0, 0xFFFF, 1, e);          \
        cb_qdw_epilogue_512(_mm512_add_epi32(a1, b1), row + ox, c0 + CB_Q_NR, 0xFFFF, 1, e); \
    } while (0)
/* the 16 channels from c0 on */
#define CB_QDW_PIX16(ADDR)                                                                  \
    do {                                                                                    \
        __m512i a0 = s0, b0 = _mm512_setzero_si512();                                       \
        _Pragma("GCC unroll 9") for (t = 0; t < 9; t++) {                                   \
            const uint8_t *p = (ADDR) + c0;                                                 \
            if (t % 2 == 0)                                                                 \
                a0 = _mm512_dpwssd_epi32(a0, CB_QDW_X(p), w[t]);                            \
            else                                                                            \
                b0 = _mm512_dpwssd_epi32(b0, CB_QDW_X(p), w[t]);                            \
        }                                                                                   \
        cb_qdw_epilogue_512(_mm512_add_epi32(a0, b0), row + ox, c0, 0xFFFF, 1, e);          \
    } while (0)
    for (; c0 + 2 * CB_Q_NR <= g->c; c0 += 2 * CB_Q_NR) {
        __m512i w[9][2];
        const __m512i s0 = _mm512_loadu_si512(tp->start + c0);
        const __m512i s1 = _mm512_loadu_si512(tp->start + c0 + CB_Q_NR);
        for (t = 0; t < 9; t++) {
            w[t][0] = _mm512_loadu_si512(wp + t * g->cp + c0);
            w[t][1] = _mm512_loadu_si512(wp + t * g->cp + c0 + CB_Q_NR);
        }
        for (ox = 0; ox < lo; ox++) CB_QDW_PIX32(tp->edge[9 * ox + t]);
        for (; ox < hi; ox++) CB_QDW_PIX32(base + (ox - lo) * step + off[t]);
        for (; ox < g->ow; ox++) CB_QDW_PIX32(tp->edge[9 * ox + t]);
    }
    for (; c0 + CB_Q_NR <= g->c; c0 += CB_Q_NR) {
        __m512i w[9];
        const __m512i s0 = _mm512_loadu_si512(tp->start + c0);
        for (t = 0; t < 9; t++) w[t] = _mm512_loadu_si512(wp + t * g->cp + c0);
        for (ox = 0; ox < lo; ox++) CB_QDW_PIX16(tp->edge[9 * ox + t]);
        for (; ox < hi; ox++) CB_QDW_PIX16(base + (ox - lo) * step + off[t]);
        for (; ox < g->ow; ox++) CB_QDW_PIX16(tp->edge[9 * ox + t]);
    }
#undef CB_QDW_PIX16
#undef CB_QDW_PIX32
    if (c0 < g->c) {
        /* the last channels, fewer than 16 */
        cb_qdw_taps one = *tp;
        for (ox = 0; ox < g->ow; ox++) {
            if (ox >= lo && ox < hi) {
                cb_qdw_block16_avx512(g, tp, 1, base + (ox - lo) * step, wp, e, row + ox, 9, c0,
                                      0);
            } else {
                one.tap = tp->edge + 9 * ox;
                cb_qdw_block16_avx512(g, &one, 0, NULL, wp, e, row + ox, 9, c0, 0);
            }
        }
    }
}
#undef CB_QDW_X

CB_Q_AVX512_ATTR static void cb_qdw_lines_avx512(const cb_qdw_geometry *g, const uint8_t *x,
                                                 const int32_t *wp, const cb_q_epilogue *e,
                                                 cb_qdw_taps *tp, ptrdiff_t r0, ptrdiff_t r1) {
    /* a copy of the epilogue's fields the compiler knows no store reaches
     * (a byte store may alias anything: it would reload them after each) */
    const cb_q_epilogue el = *e;
    const ptrdiff_t taps = g->kh * g->kw;
    ptrdiff_t r, ox, lo, hi;
    cb_qdw_inner_span(g, &lo, &hi);
    for (r = r0; r < r1; r++) {
        const ptrdiff_t b = r / g->oh, oy = r % g->oh, iy0 = oy * g->sh - g->pt;
        const uint8_t *img = x + b * g->h * g->w * g->c;
        const int rows_in = iy0 >= 0 && iy0 + (g->kh - 1) * g->dh < g->h;
        if (taps == 9) {
            const ptrdiff_t l = rows_in ? lo : 0, h = rows_in ? hi : 0;
            const uint8_t *base = img + (iy0 * g->w + l * g->sw - g->pl) * g->c;
            for (ox = 0; ox < g->ow; ox++)
                if (ox < l || ox >= h) cb_qdw_gather_to(g, tp, tp->edge + 9 * ox, img, oy, ox);
            cb_qdw_line9_avx512(g, tp, base, l, h, g->sw * g->c, wp, &el, r * g->ow);
            continue;
        }
        for (ox = 0; ox < g->ow; ox++) {
            if (rows_in && ox == lo && hi > lo) {
                const uint8_t *base = img + (iy0 * g->w + lo * g->sw - g->pl) * g->c;
                cb_qdw_run_avx512(g, tp, base, hi - lo, g->sw * g->c, wp, &el, r * g->ow + lo,
                                  taps);
                ox = hi - 1;
                continue;
            }
            cb_qdw_gather(g, tp, img, oy, ox);
            cb_qdw_pixel_avx512(g, tp, 0, NULL, wp, &el, r * g->ow + ox, taps);
        }
    }
}

/* The byte-tap path (AVX-512 VBMI on top of the avx512_vnni level), for
 * windows at most four taps wide without horizontal dilation. vpdpbusd adds
 * four byte products per 32-bit lane; here the four bytes of lane j are one
 * channel's input at the four pixels a window row covers, so one instruction
 * does a whole window row of 16 channels where the widening path does one
 * tap. Each input row a line reads is first copied into a "block row":
 * channel block by channel block (16 channels), the block's pixels side by
 * side, 16 bytes each, with the padding's pixels (and three more at the
 * right end) holding the zero point. Then the four pixels from output ox's
 * window corner are one 64-byte load, and one vpermb puts each channel's
 * four bytes into its lane. The packed byte row of window row ky (zero past
 * kw) multiplies them. The sums are exact, as on the widening path, and the
 * epilogue is the same: the same bits. A thread keeps the (kh - 1) * dh + 1
 * block rows its lines last read, so that with stride 1 each input row is
 * copied once per thread. */
#define CB_QDW_VBMI_ATTR                                                                   \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2")))

static int cb_qdw_vbmi_cpu = -1;      /* the CPU has AVX-512 VBMI (-1: not yet read) */
static int cb_qdw_byte_taps = 1;      /* the path is allowed (tests turn it off) */

static int cb_qdw_has_vbmi(void) {
    if (cb_qdw_vbmi_cpu < 0) {
        unsigned r[4] = {0, 0, 0, 0};
        cb_q_cpuid(0, 0, r);
        if (r[0] >= 7) cb_q_cpuid(7, 0, r); else r[2] = 0;
        cb_qdw_vbmi_cpu = (int)((r[2] >> 1) & 1u);
    }
    return cb_qdw_vbmi_cpu;
}

/* Whether geometry g takes the byte-tap path at set `level`. With a
 * horizontal stride each block row holds sw input pixels per output, copied
 * for every line: there the widening path, which reads the input in place,
 * is the faster. */
static int cb_qdw_bytes_fit(int level, const cb_qdw_geometry *g) {
    return level >= CB_Q_AVX512VNNI && cb_qdw_byte_taps && g->kw <= 4 && g->dw == 1 &&
           g->sw == 1 && cb_qdw_has_vbmi();
}

typedef struct {
    ptrdiff_t pw;          /* pixels per block row: (ow - 1) * sw + 4 */
    ptrdiff_t nb;          /* channel blocks */
    ptrdiff_t slots;       /* cached block rows: (kh - 1) * dh + 1 */
    uint8_t *rows;         /* slots + 1 block rows (the last all zero point), 64-aligned */
    ptrdiff_t *tag;        /* the image row (b * h + iy) in each slot, or -1 */
    void *mem;
} cb_qdw_block_rows;

static int cb_qdw_block_rows_init(cb_qdw_block_rows *br, const cb_qdw_geometry *g) {
    size_t row_bytes;
    ptrdiff_t i;
    char *m;
    br->pw = (g->ow - 1) * g->sw + 4;
    br->nb = (g->c + CB_Q_NR - 1) / CB_Q_NR;
    br->slots = (g->kh - 1) * g->dh + 1;
    row_bytes = (size_t)(br->nb * br->pw * CB_Q_NR);
    m = (char *)malloc(row_bytes * (size_t)(br->slots + 1) +
                       sizeof(ptrdiff_t) * (size_t)br->slots + 128);
    if (!m) return 0;
    br->mem = m;
    br->rows = (uint8_t *)(((uintptr_t)m + 63) & ~(uintptr_t)63);
    br->tag = (ptrdiff_t *)(br->rows + row_bytes * (size_t)(br->slots + 1));
    for (i = 0; i < br->slots; i++) br->tag[i] = -1;
    memset(br->rows + row_bytes * (size_t)br->slots, g->pad, row_bytes);
    return 1;
}

/* The block row of input row iy of image b (the zero-point row outside the
 * image), copied into its slot if the slot holds another row. */
CB_Q_ALWAYS CB_QDW_VBMI_ATTR const uint8_t *cb_qdw_block_row(cb_qdw_block_rows *br,
                                                            const cb_qdw_geometry *g,
                                                            const uint8_t *x, ptrdiff_t b,
                                                            ptrdiff_t iy) {
    const ptrdiff_t row_bytes = br->nb * br->pw * CB_Q_NR, slot = iy % br->slots;
    const ptrdiff_t lo = g->pl < br->pw ? g->pl : br->pw;
    const ptrdiff_t hi = g->pl + g->w < br->pw ? g->pl + g->w : br->pw;
    const __m128i pad = _mm_set1_epi8((char)g->pad);
    const uint8_t *src;
    uint8_t *dst;
    ptrdiff_t cb, px;
    if (iy < 0 || iy >= g->h) return br->rows + row_bytes * br->slots;
    dst = br->rows + row_bytes * slot;
    if (br->tag[slot] == b * g->h + iy) return dst;
    br->tag[slot] = b * g->h + iy;
    src = x + (b * g->h + iy) * g->w * g->c;
    for (cb = 0; cb < br->nb; cb++) {
        const ptrdiff_t c0 = cb * CB_Q_NR;
        const __mmask16 mask = g->c - c0 >= CB_Q_NR ? (__mmask16)0xFFFF
                                                    : (__mmask16)((1u << (g->c - c0)) - 1);
        uint8_t *d = dst + cb * br->pw * CB_Q_NR;
        for (px = 0; px < lo; px++) _mm_store_si128((__m128i *)(d + px * CB_Q_NR), pad);
        if (mask == 0xFFFF)
            for (; px < hi; px++)
                _mm_store_si128((__m128i *)(d + px * CB_Q_NR),
                                _mm_loadu_si128((const __m128i *)(src + (px - g->pl) * g->c +
                                                                  c0)));
        else
            for (; px < hi; px++)
                _mm_store_si128((__m128i *)(d + px * CB_Q_NR),
                                _mm_maskz_loadu_epi8(mask, src + (px - g->pl) * g->c + c0));
        for (; px < br->pw; px++) _mm_store_si128((__m128i *)(d + px * CB_Q_NR), pad);
    }
    return dst;
}

/* One line of outputs of channel block c0 from block rows r[0 .. kh - 1]
 * (already offset to the block), KH window rows (a constant where the caller
 * knows it, so that the loop unrolls). */
CB_Q_ALWAYS CB_QDW_VBMI_ATTR void cb_qdw_bytes_block(const cb_qdw_geometry *g,
                                                    const uint8_t *const *r,
                                                    const int32_t *wp, const int32_t *start,
                                                    const cb_q_epilogue *e, ptrdiff_t row,
                                                    ptrdiff_t c0, ptrdiff_t kh) {
    /* lane j's byte p: channel j of the load's pixel p (byte 16 p + j) */
    const __m512i idx = _mm512_set_epi32(
        0x3F2F1F0F, 0x3E2E1E0E, 0x3D2D1D0D, 0x3C2C1C0C, 0x3B2B1B0B, 0x3A2A1A0A, 0x39291909,
        0x38281808, 0x37271707, 0x36261606, 0x35251505, 0x34241404, 0x33231303, 0x32221202,
        0x31211101, 0x30201000);
    const ptrdiff_t taps = g->kh * g->kw, step = g->sw * CB_Q_NR;
    const int full = g->c - c0 >= CB_Q_NR;
    const __mmask16 mask = full ? (__mmask16)0xFFFF : (__mmask16)((1u << (g->c - c0)) - 1);
    const __m512i s0 = _mm512_loadu_si512(start + c0);
    __m512i w[8];
    ptrdiff_t ky, ox;
    _Pragma("GCC unroll 8") for (ky = 0; ky < kh && ky < 8; ky++)
        w[ky] = _mm512_loadu_si512(wp + (taps + 1 + ky) * g->cp + c0);
    for (ox = 0; ox < g->ow; ox++) {
        __m512i acc = s0;
        _Pragma("GCC unroll 8") for (ky = 0; ky < kh; ky++) {
            const __m512i px = _mm512_permutexvar_epi8(
                idx, _mm512_loadu_si512(r[ky] + ox * step));
            acc = _mm512_dpbusd_epi32(
                acc, px, ky < 8 ? w[ky] : _mm512_loadu_si512(wp + (taps + 1 + ky) * g->cp + c0));
        }
        if (full)
            cb_qdw_epilogue_512(acc, row + ox, c0, 0xFFFF, 1, e);
        else
            cb_qdw_epilogue_512(acc, row + ox, c0, mask, 0, e);
    }
}

CB_QDW_VBMI_ATTR static void cb_qdw_bytes_lines(const cb_qdw_geometry *g, const uint8_t *x,
                                                const int32_t *wp, const cb_q_epilogue *e,
                                                const cb_qdw_taps *tp, cb_qdw_block_rows *br,
                                                ptrdiff_t r0, ptrdiff_t r1) {
    /* a copy of the epilogue's fields the compiler knows no store reaches */
    const cb_q_epilogue el = *e;
    const uint8_t *rows[64];
    ptrdiff_t r, ky, cb;
    for (r = r0; r < r1; r++) {
        const ptrdiff_t b = r / g->oh, oy = r % g->oh, iy0 = oy * g->sh - g->pt;
        for (ky = 0; ky < g->kh; ky++)
            rows[ky] = cb_qdw_block_row(br, g, x, b, iy0 + ky * g->dh);
        for (cb = 0; cb < br->nb; cb++) {
            const uint8_t *rb[64];
            for (ky = 0; ky < g->kh; ky++) rb[ky] = rows[ky] + cb * br->pw * CB_Q_NR;
            if (g->kh == 3)
                cb_qdw_bytes_block(g, rb, wp, tp->start, &el, r * g->ow, cb * CB_Q_NR, 3);
            else
                cb_qdw_bytes_block(g, rb, wp, tp->start, &el, r * g->ow, cb * CB_Q_NR, g->kh);
        }
    }
}
#endif
#endif

/* Output lines r0 .. r1 - 1 (a line is (b, oy)) with set `level`. */
static void cb_qdw_lines(int level, const cb_qdw_geometry *g, const uint8_t *x,
                         const int32_t *wp, const cb_q_epilogue *e, ptrdiff_t r0, ptrdiff_t r1) {
    if (r1 <= r0) return;
#if CB_SIMD_AVX2
    if (level >= CB_Q_AVX2) {
        cb_qdw_taps tp;
        /* without memory for the taps' addresses, the scalar loop below */
        if (cb_qdw_taps_init(&tp, g, wp)) {
#if CB_Q_HAVE_AVX512VNNI
            cb_qdw_block_rows br;
            if (g->kh <= 64 && cb_qdw_bytes_fit(level, g) && cb_qdw_block_rows_init(&br, g)) {
                cb_qdw_bytes_lines(g, x, wp, e, &tp, &br, r0, r1);
                free(br.mem);
            } else if (level >= CB_Q_AVX512VNNI)
                cb_qdw_lines_avx512(g, x, wp, e, &tp, r0, r1);
            else
#endif
                cb_qdw_lines_avx2(g, x, wp, e, &tp, r0, r1);
            free(tp.mem);
            return;
        }
    }
#endif
    (void)level;
    cb_qdw_lines_scalar(g, x, wp, e, r0, r1);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#endif
