/* int8 depthwise 2-D convolution, channels_last (cyback/kernels/qconv_depthwise.pxi):
 * uint8 activations x int8 weights, one filter per channel, exact int32 sums,
 * and the requantizing epilogue of cyback_qgemm.h (which must be included
 * first) applied to each vector of channels before it is stored.
 *
 * Packed weights: an int32 array (taps + 1, cp), cp = C rounded up to 16:
 * row t holds tap t = ky * kw + kx of every channel, widened to int32, and
 * the last row each channel's sum over the taps (for the zero point);
 * channels past C are zero. Taps in the padding read the activations' zero
 * point (the code of 0.0), so that
 *     acc[c] = sum_t x_t[c] * w_t[c],    d[c] = acc[c] - za * wsum[c]
 * is the exact integer sum of (x - za) * w over the taps inside the image.
 * The products (|u8 x s8| < 2^15) and sums of up to CB_Q_MAX_K taps are
 * exact in int32.
 *
 * Sets: AVX-512 (the avx512_vnni level: F, BW, VL) 16 channels per zmm,
 * AVX2 (the avx2 and avx_vnni levels) 8 per ymm, two at a time, scalar
 * otherwise. A product of one byte per lane does not use the dot-product
 * instructions (they sum four neighbouring bytes, which here are four
 * channels); the bytes are widened to int32 and multiplied lane by lane.
 * Every set gives the same bits: exact sums, the same epilogue.
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
 * out ((taps + 1) * cp int32). */
static void cb_qdw_pack(const int8_t *w, ptrdiff_t taps, ptrdiff_t c, ptrdiff_t cp,
                        int32_t *out) {
    ptrdiff_t t, ch;
    memset(out, 0, sizeof(int32_t) * (size_t)((taps + 1) * cp));
    for (t = 0; t < taps; t++)
        for (ch = 0; ch < c; ch++) {
            out[t * cp + ch] = w[t * c + ch];
            out[taps * cp + ch] += w[t * c + ch];
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

/* 16 channel bytes from c0 on (zero past `valid`), as 16 bytes in a register. */
CB_Q_ALWAYS CB_Q_AVX2_ATTR __m128i cb_qdw_load16(const uint8_t *p, int valid) {
    if (valid == CB_Q_NR) return _mm_loadu_si128((const __m128i *)p);
    {
        uint8_t tmp[CB_Q_NR] = {0};
        int j;
        for (j = 0; j < valid; j++) tmp[j] = p[j];
        return _mm_loadu_si128((const __m128i *)tmp);
    }
}

CB_Q_AVX2_ATTR static void cb_qdw_lines_avx2(const cb_qdw_geometry *g, const uint8_t *x,
                                             const int32_t *wp, const cb_q_epilogue *e,
                                             ptrdiff_t r0, ptrdiff_t r1) {
    const ptrdiff_t taps = g->kh * g->kw;
    const __m128i padv = _mm_set1_epi8((char)g->pad);
    ptrdiff_t r, ox, c0, ky, kx;
    for (r = r0; r < r1; r++) {
        const ptrdiff_t b = r / g->oh, oy = r % g->oh;
        const uint8_t *img = x + b * g->h * g->w * g->c;
        for (ox = 0; ox < g->ow; ox++)
            for (c0 = 0; c0 < g->c; c0 += CB_Q_NR) {
                const int valid = (int)(g->c - c0 < CB_Q_NR ? g->c - c0 : CB_Q_NR);
                __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
                for (ky = 0; ky < g->kh; ky++)
                    for (kx = 0; kx < g->kw; kx++) {
                        const uint8_t *px = cb_qdw_pixel(g, img, oy, ox, ky, kx);
                        const int32_t *wt = wp + (ky * g->kw + kx) * g->cp + c0;
                        const __m128i xb = px ? cb_qdw_load16(px + c0, valid) : padv;
                        const __m256i x0 = _mm256_cvtepu8_epi32(xb);
                        const __m256i x1 = _mm256_cvtepu8_epi32(_mm_srli_si128(xb, 8));
                        acc0 = _mm256_add_epi32(
                            acc0, _mm256_mullo_epi32(x0, _mm256_loadu_si256((const __m256i *)wt)));
                        acc1 = _mm256_add_epi32(
                            acc1,
                            _mm256_mullo_epi32(x1, _mm256_loadu_si256((const __m256i *)(wt + 8))));
                    }
                cb_q_epilogue_256(acc0, acc1, (const int8_t *)(wp + taps * g->cp + c0),
                                  r * g->ow + ox, c0, g->c, e);
            }
    }
}

#if CB_Q_HAVE_AVX512VNNI
CB_Q_AVX512_ATTR static void cb_qdw_lines_avx512(const cb_qdw_geometry *g, const uint8_t *x,
                                                 const int32_t *wp, const cb_q_epilogue *e,
                                                 ptrdiff_t r0, ptrdiff_t r1) {
    const ptrdiff_t taps = g->kh * g->kw;
    const __m128i padv = _mm_set1_epi8((char)g->pad);
    ptrdiff_t r, ox, c0, ky, kx;
    for (r = r0; r < r1; r++) {
        const ptrdiff_t b = r / g->oh, oy = r % g->oh;
        const uint8_t *img = x + b * g->h * g->w * g->c;
        for (ox = 0; ox < g->ow; ox++)
            for (c0 = 0; c0 < g->c; c0 += CB_Q_NR) {
                const ptrdiff_t left = g->c - c0;
                const __mmask16 mask =
                    left >= CB_Q_NR ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
                __m512i acc = _mm512_setzero_si512();
                for (ky = 0; ky < g->kh; ky++)
                    for (kx = 0; kx < g->kw; kx++) {
                        const uint8_t *px = cb_qdw_pixel(g, img, oy, ox, ky, kx);
                        const __m128i xb = px ? _mm_maskz_loadu_epi8(mask, px + c0) : padv;
                        const __m512i wv =
                            _mm512_loadu_si512(wp + (ky * g->kw + kx) * g->cp + c0);
                        acc = _mm512_add_epi32(acc,
                                               _mm512_mullo_epi32(_mm512_cvtepu8_epi32(xb), wv));
                    }
                cb_q_epilogue_512(acc, (const int8_t *)(wp + taps * g->cp + c0), r * g->ow + ox,
                                  c0, g->c, e);
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
#if CB_Q_HAVE_AVX512VNNI
    if (level >= CB_Q_AVX512VNNI) {
        cb_qdw_lines_avx512(g, x, wp, e, r0, r1);
        return;
    }
#endif
    if (level >= CB_Q_AVX2) {
        cb_qdw_lines_avx2(g, x, wp, e, r0, r1);
        return;
    }
#endif
    (void)level;
    cb_qdw_lines_scalar(g, x, wp, e, r0, r1);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#endif
