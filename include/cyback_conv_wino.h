/* Winograd F(2x2, 3x3) convolution, channels_last float32, stride 1, no
 * dilation (cyback/kernels/conv.pyx, forward); 2-D, or 3-D with any number
 * KD of depth taps.
 *
 * A 2x2 block of outputs of a 3x3 convolution is A^T [ (G g G^T) * (B^T d B) ] A
 * for its 4x4 input tile d, summed over input channels, where * is an
 * element-wise product of 4x4 matrices. The 16 element positions (xi) are
 * 16 independent products (tiles x C) @ (C x F): 16 multiplies per channel
 * pair for 4 outputs instead of 36, 2.25x fewer. The transforms are only
 * adds and halvings:
 *
 *   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]    (input tiles)
 *   G   = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]  (kernel, once per call)
 *   A^T = [1 1 1 0; 0 1 -1 -1]                       (outputs)
 *
 * A 3-D convolution with a (KD, 3, 3) kernel is the sum over its KD depth
 * taps of 2-D ones: each tile's inputs from the KD input planes it reads
 * are transformed side by side, so the 16 products run over K = KD x C
 * (depth tap, channel) pairs, as the kernel's (kd, c) rows. Planes above or
 * below the input (D padding) read zeros.
 *
 * Rounding: the products are summed in transform space, so each output
 * differs from a direct sum by a few units in the last place of the sum's
 * largest terms (the interpolation points 0, 1, -1 keep F(2,3) the most
 * accurate of the Winograd forms); it is the same for every thread count.
 *
 * Layout: the kernel is transformed into U[b][xi][kd C + c][FB] for blocks b
 * of FB output channels (zero past F). A work item is TG consecutive tiles of
 * the N * OD * TH * TW tiles (rows, planes and samples run on, so that an
 * item's tiles share the kernel blocks however narrow the image): their
 * inputs V[xi][t][K] go to the thread's scratch (in L2), then for each
 * channel block and each group of up to 6 tiles (12 where 512-bit FMAs run
 * at full rate) the 16 products run with a tiles x FB register tile (as in
 * cyback_conv_direct.h) into M[xi][t][FB] (in L1), and the output transform
 * adds the epilogue (bias, residual, relu / relu6) and stores the pixels that
 * exist (odd output sizes compute a tile's missing row or column and drop it).
 * Input taps outside the image read a row of zeros.
 */
#ifndef CYBACK_CONV_WINO_H
#define CYBACK_CONV_WINO_H

#include <stddef.h>
#include <string.h>
#include "cyback_simd.h"

/* Most input channels (the row of zeros the padding taps read). */
#define CB_WG_MAX_C 1024
/* Widest block of output channels (the AVX-512 set's). */
#define CB_WG_MAX_FB 32
/* Most tiles per register tile: 12 (24 sums) in the AVX-512 set where
 * 512-bit FMAs run at full rate, else 6 (cb_wg_tile_rows). Each product
 * step loads two vectors of U for the tile's rows: 12 rows halve those loads
 * per multiply-add, which full-rate FMAs otherwise wait on; where a 512-bit
 * FMA takes both 256-bit halves the wider tile adds no throughput. */
#define CB_WG_TILE 12

typedef struct {
    ptrdiff_t N, H, W, C, F;  /* input (N, D, H, W, C) (D = 1 in 2-D), output channels */
    ptrdiff_t OH, OW, ph, pw; /* output extent, padding before */
    ptrdiff_t D, OD, KD, pd;  /* input planes, output planes, depth taps, padding before */
    ptrdiff_t K;              /* products' inner length: KD * C */
    ptrdiff_t TH, TW;         /* tiles per column and row: ceil(OH / 2), ceil(OW / 2) */
    ptrdiff_t TG, items;      /* tiles per work item, work items */
    ptrdiff_t FB, nfb;        /* output channels per block, number of blocks */
} cb_wg_geom;

/* Whether this build has the Winograd kernels (they need vector extensions). */
static int cb_wg_available(void) { return CB_SIMD_VECTOR; }

/* Output channels per block for F output channels and the kernel set that
 * runs now (as cb_cd_block_for: the AVX-512 set once F is wider than 16). */
static ptrdiff_t cb_wg_block(ptrdiff_t F) {
    return cb_simd_block(cb_simd_has_avx2() ? 16 : 8, F);
}

/* Floats of a thread's scratch: V (16 x TG x K) and M (16 x CB_WG_TILE x FB). */
static ptrdiff_t cb_wg_scratch(const cb_wg_geom *g) {
    return 16 * g->TG * g->K + 16 * CB_WG_TILE * g->FB;
}

/* Floats of the transformed kernel U (from k (KD, 3, 3, C, F) by cb_wg_kernel_part). */
static ptrdiff_t cb_wg_kernel_size(const cb_wg_geom *g) { return g->nfb * 16 * g->K * g->FB; }

/* Part `it` of the kernel transform (nfb * K parts, independent): row it % K
 * (depth tap, input channel) of output block it / K. Its output channels are
 * contiguous in k and go through a stack row, then 16 row copies: writing the 16
 * positions straight to U, 4 KB apart at 64 channels, is several times
 * slower (scattered stores). */
static void cb_wg_kernel_part(const float *k, float *u, const cb_wg_geom *g, ptrdiff_t it) {
    const ptrdiff_t C = g->C, F = g->F, FB = g->FB, CF = C * F, K = g->K;
    const ptrdiff_t row = it % K, f0 = (it / K) * FB, nf = F - f0 < FB ? F - f0 : FB;
    const float *kc = k + (row / C) * 9 * CF + (row % C) * F + f0;
    float *uc = u + ((it / K) * 16 * K + row) * FB;
    float v[16][CB_WG_MAX_FB];
    ptrdiff_t f, i;
    for (f = 0; f < nf; f++) {
        /* kernel rows a, b, c (kh = 0, 1, 2), columns kw = 0, 1, 2 */
        const float a0 = kc[f], a1 = kc[CF + f], a2 = kc[2 * CF + f];
        const float b0 = kc[3 * CF + f], b1 = kc[4 * CF + f], b2 = kc[5 * CF + f];
        const float c0 = kc[6 * CF + f], c1 = kc[7 * CF + f], c2 = kc[8 * CF + f];
        /* G g has rows a, (a + b + c) / 2, (a - b + c) / 2, c; each row
         * times G^T gives a row of 4 of U. */
        const float r10 = 0.5f * (a0 + b0 + c0), r11 = 0.5f * (a1 + b1 + c1);
        const float r12 = 0.5f * (a2 + b2 + c2), r20 = 0.5f * (a0 - b0 + c0);
        const float r21 = 0.5f * (a1 - b1 + c1), r22 = 0.5f * (a2 - b2 + c2);
#define CB_WG_GT(i, x0, x1, x2)                                                           \
        v[4 * i][f] = x0; v[4 * i + 1][f] = 0.5f * (x0 + x1 + x2);                         \
        v[4 * i + 2][f] = 0.5f * (x0 - x1 + x2); v[4 * i + 3][f] = x2;
        CB_WG_GT(0, a0, a1, a2) CB_WG_GT(1, r10, r11, r12)
        CB_WG_GT(2, r20, r21, r22) CB_WG_GT(3, c0, c1, c2)
#undef CB_WG_GT
    }
    for (i = 0; i < 16; i++) {
        memcpy(uc + i * K * FB, v[i], nf * sizeof(float));
        if (nf < FB) memset(uc + i * K * FB + nf, 0, (FB - nf) * sizeof(float));
    }
}

/* Pixels per work item of the layout copies below. */
#define CB_WG_COPY_PIXELS 256

/* The channels_first path copies through channels_last: item `it` over
 * N * ceil(P / CB_WG_COPY_PIXELS) moves its pixels of one sample between
 * first (N, C, P) and last (N, P, C), to_last or back. Blocks of 16
 * channels: 16 rows of the channels_first side are read (or written)
 * together while the other side's rows are whole cache lines. */
static void cb_wg_relayout(const float *src, float *dst, ptrdiff_t C, ptrdiff_t P,
                           ptrdiff_t it, int to_last) {
    const ptrdiff_t nblk = (P + CB_WG_COPY_PIXELS - 1) / CB_WG_COPY_PIXELS;
    const ptrdiff_t n = it / nblk, p0 = (it % nblk) * CB_WG_COPY_PIXELS;
    const ptrdiff_t p1 = p0 + CB_WG_COPY_PIXELS < P ? p0 + CB_WG_COPY_PIXELS : P;
    const float *s = src + n * C * P;
    float *d = dst + n * C * P;
    ptrdiff_t c0, c, p;
    for (c0 = 0; c0 < C; c0 += 16) {
        const ptrdiff_t c1 = c0 + 16 < C ? c0 + 16 : C;
        if (to_last)
            for (p = p0; p < p1; p++)
                for (c = c0; c < c1; c++) d[p * C + c] = s[c * P + p];
        else
            for (c = c0; c < c1; c++)
                for (p = p0; p < p1; p++) d[c * P + p] = s[p * C + c];
    }
}

#if CB_SIMD_VECTOR

static float cb_wg_zeros[CB_WG_MAX_C];

/* 1: the AVX-512 products take 12-tile groups where 512-bit FMAs run at
 * full rate, 0: 6-tile ones everywhere, -1: by the CPU (as the direct
 * kernel's tiles, cb_cd_wide_tiles). Tests and benchmarks set it
 * (winograd.pyx, _use_wide_tiles). */
static int cb_wg_wide = -1;

static int cb_wg_use_wide_tiles(int w) {
    cb_wg_wide = w;
    return w;
}

/* Tiles per register tile for vectors of VL floats (see CB_WG_TILE). */
static ptrdiff_t cb_wg_tile_rows(int VL) {
    const int wide = cb_wg_wide >= 0 ? cb_wg_wide : !cb_simd_half_rate_512();
    return VL == 16 && wide ? 12 : 6;
}

/* B^T d B on 16 vectors d[4 * row + col], in place. */
#define CB_WG_BTDB(d)                                                                     \
    do {                                                                                  \
        int j_;                                                                           \
        for (j_ = 0; j_ < 4; j_++) {                                                      \
            const __typeof__(d[0]) r0 = d[j_], r1 = d[4 + j_], r2 = d[8 + j_], r3 = d[12 + j_]; \
            d[j_] = r0 - r2; d[4 + j_] = r1 + r2; d[8 + j_] = r2 - r1; d[12 + j_] = r1 - r3; \
        }                                                                                 \
        for (j_ = 0; j_ < 16; j_ += 4) {                                                  \
            const __typeof__(d[0]) c0 = d[j_], c1 = d[j_ + 1], c2 = d[j_ + 2], c3 = d[j_ + 3]; \
            d[j_] = c0 - c2; d[j_ + 1] = c1 + c2; d[j_ + 2] = c2 - c1; d[j_ + 3] = c1 - c3; \
        }                                                                                 \
    } while (0)

/* The products of an N-tile group: sizes above the set's most rows (TM)
 * never come, and compile to nothing. */
#define CB_WG_CASE(SUF, TM, N)                                                            \
    case N:                                                                               \
        if (N <= TM) cb_wg_products_##SUF(N, vt + t0 * K, vs, ub, m, K);                  \
        break;

#define CB_WG_FNS(V, VL, SUF, ATTR, TM)                                                     \
/* V[xi][t][kd C + c] for the nt tiles from t0 (over N * OD * TH * TW) on. */             \
ATTR static void cb_wg_input_##SUF(const float *x, float *vt, const cb_wg_geom *g,         \
                                   ptrdiff_t t0, ptrdiff_t nt) {                          \
    const ptrdiff_t C = g->C, K = g->K, xs = nt * K;                                      \
    const float *src[16];                                                                 \
    ptrdiff_t t, i, j, c, kd;                                                             \
    for (t = 0; t < nt; t++) {                                                            \
        const ptrdiff_t tw = (t0 + t) % g->TW, th = (t0 + t) / g->TW % g->TH;            \
        const ptrdiff_t od = (t0 + t) / (g->TW * g->TH) % g->OD;                          \
        const ptrdiff_t n = (t0 + t) / (g->TW * g->TH * g->OD);                           \
        for (kd = 0; kd < g->KD; kd++) {                                                  \
            const ptrdiff_t id = od - g->pd + kd;                                         \
            float *dst = vt + t * K + kd * C;                                             \
            for (i = 0; i < 4; i++) {                                                     \
                const ptrdiff_t ih = 2 * th - g->ph + i;                                  \
                for (j = 0; j < 4; j++) {                                                 \
                    const ptrdiff_t iw = 2 * tw - g->pw + j;                              \
                    src[4 * i + j] = id < 0 || id >= g->D || ih < 0 || ih >= g->H         \
                            || iw < 0 || iw >= g->W ? cb_wg_zeros                         \
                        : x + (((n * g->D + id) * g->H + ih) * g->W + iw) * C;            \
                }                                                                         \
            }                                                                             \
            for (c = 0; c + VL <= C; c += VL) {                                           \
                V d[16];                                                                  \
                for (i = 0; i < 16; i++) d[i] = *(const V *)(src[i] + c);                 \
                CB_WG_BTDB(d);                                                            \
                for (i = 0; i < 16; i++) *(V *)(dst + i * xs + c) = d[i];                 \
            }                                                                             \
            for (; c < C; c++) {                                                          \
                float d[16];                                                              \
                for (i = 0; i < 16; i++) d[i] = src[i][c];                                \
                CB_WG_BTDB(d);                                                            \
                for (i = 0; i < 16; i++) dst[i * xs + c] = d[i];                          \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* M[xi][p][FB] = sum_c V[xi][t0 + p][c] U[xi][c][FB] for NP tiles. */                    \
ATTR static inline __attribute__((always_inline)) void cb_wg_products_##SUF(const int NP, \
        const float *vt, ptrdiff_t vs, const float *u, float *m, ptrdiff_t C) {           \
    int xi, p;                                                                            \
    ptrdiff_t c;                                                                          \
    for (xi = 0; xi < 16; xi++) {                                                         \
        const float *vx = vt + xi * vs, *ux = u + xi * C * 2 * VL;                        \
        V a[CB_WG_TILE], b[CB_WG_TILE];                                                   \
        _Pragma("GCC unroll 12") for (p = 0; p < NP; p++) a[p] = b[p] = (V){0};           \
        for (c = 0; c < C; c++) {                                                         \
            const V w0 = *(const V *)(ux + c * 2 * VL), w1 = *(const V *)(ux + c * 2 * VL + VL); \
            _Pragma("GCC unroll 12") for (p = 0; p < NP; p++) {                           \
                const float xv = vx[p * C + c];                                           \
                a[p] += xv * w0;                                                          \
                b[p] += xv * w1;                                                          \
            }                                                                             \
        }                                                                                 \
        _Pragma("GCC unroll 12") for (p = 0; p < NP; p++) {                               \
            *(V *)(m + (xi * CB_WG_TILE + p) * 2 * VL) = a[p];                            \
            *(V *)(m + (xi * CB_WG_TILE + p) * 2 * VL + VL) = b[p];                       \
        }                                                                                 \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* A^T M A for np tiles from tile t0 on and channel block b, + epilogue, to y. */       \
ATTR static void cb_wg_output_##SUF(const float *m, const float *bp, const float *res,     \
        int act, float *y, const cb_wg_geom *g, ptrdiff_t t0, ptrdiff_t np, ptrdiff_t b) { \
    const ptrdiff_t F = g->F, f0 = b * g->FB;                                             \
    const ptrdiff_t nf = F - f0 < g->FB ? F - f0 : g->FB;                                 \
    ptrdiff_t p, h, i, r, s;                                                              \
    for (p = 0; p < np; p++)                                                              \
        for (h = 0; h < 2; h++) {                                                         \
            const ptrdiff_t tw = (t0 + p) % g->TW, th = (t0 + p) / g->TW % g->TH;        \
            const ptrdiff_t nd = (t0 + p) / (g->TW * g->TH);  /* n * OD + od */           \
            V q[16], o[4];                                                                \
            for (i = 0; i < 16; i++)                                                      \
                q[i] = *(const V *)(m + (i * CB_WG_TILE + p) * 2 * VL + h * VL);          \
            for (i = 0; i < 4; i++) {   /* A^T q: rows 0 and 1 into q[i], q[4 + i] */     \
                const V r0 = q[i], r1 = q[4 + i], r2 = q[8 + i], r3 = q[12 + i];          \
                q[i] = r0 + r1 + r2;                                                      \
                q[4 + i] = r1 - r2 - r3;                                                  \
            }                                                                             \
            for (r = 0; r < 2; r++) {   /* (A^T q) A */                                   \
                o[2 * r] = q[4 * r] + q[4 * r + 1] + q[4 * r + 2];                        \
                o[2 * r + 1] = q[4 * r + 1] - q[4 * r + 2] - q[4 * r + 3];                \
            }                                                                             \
            if (bp) {                                                                     \
                const V bv = *(const V *)(bp + f0 + h * VL);                              \
                for (i = 0; i < 4; i++) o[i] += bv;                                       \
            }                                                                             \
            for (r = 0; r < 2; r++)                                                       \
                for (s = 0; s < 2; s++) {                                                 \
                    const ptrdiff_t oh = 2 * th + r, ow = 2 * tw + s;                     \
                    const ptrdiff_t off = ((nd * g->OH + oh) * g->OW + ow) * F + f0 + h * VL; \
                    const ptrdiff_t k = nf - h * VL < VL ? nf - h * VL : VL;              \
                    V v = o[2 * r + s];                                                   \
                    if (oh >= g->OH || ow >= g->OW || k <= 0) continue;                   \
                    if (k == VL) {                                                        \
                        if (res) v += *(const V *)(res + off);                            \
                        CB_VACT(v, act);                                                  \
                        *(V *)(y + off) = v;                                              \
                    } else {                                                              \
                        float tmp[VL] = {0};                                              \
                        if (res) { memcpy(tmp, res + off, k * sizeof(float)); v += *(const V *)tmp; } \
                        CB_VACT(v, act);                                                  \
                        *(V *)tmp = v;                                                    \
                        memcpy(y + off, tmp, k * sizeof(float));                          \
                    }                                                                     \
                }                                                                         \
        }                                                                                 \
}                                                                                         \
                                                                                          \
/* Work item `it` (of g->items): the TG tiles (over N * OD * TH * TW)                     \
   from it * TG on. scratch: cb_wg_scratch(g) floats; u: the transformed                  \
   kernel; bp: NULL or the bias padded to nfb * FB; res: NULL or a                        \
   residual shaped like y (it may be y). */                                               \
ATTR static void cb_wg_item_##SUF(const float *x, const float *u, const float *bp,        \
        const float *res, int act, float *y, const cb_wg_geom *g, ptrdiff_t it,           \
        float *scratch) {                                                                 \
    const ptrdiff_t tiles = g->N * g->OD * g->TH * g->TW, first = it * g->TG;             \
    const ptrdiff_t nt = tiles - first < g->TG ? tiles - first : g->TG;                   \
    const ptrdiff_t K = g->K, vs = nt * K;                                                \
    const ptrdiff_t rows = cb_wg_tile_rows(VL);                                           \
    float *vt = scratch, *m = scratch + 16 * g->TG * K;                                   \
    ptrdiff_t b, t0, np;                                                                  \
    cb_wg_input_##SUF(x, vt, g, first, nt);                                            \
    for (b = 0; b < g->nfb; b++) {                                                        \
        const float *ub = u + b * 16 * K * 2 * VL;                                        \
        for (t0 = 0; t0 < nt; t0 += np) {                                                 \
            np = nt - t0 < rows ? nt - t0 : rows;                                         \
            switch (np) {                                                                 \
            CB_WG_CASE(SUF, TM, 12) CB_WG_CASE(SUF, TM, 11) CB_WG_CASE(SUF, TM, 10)       \
            CB_WG_CASE(SUF, TM, 9) CB_WG_CASE(SUF, TM, 8) CB_WG_CASE(SUF, TM, 7)          \
            CB_WG_CASE(SUF, TM, 6) CB_WG_CASE(SUF, TM, 5) CB_WG_CASE(SUF, TM, 4)          \
            CB_WG_CASE(SUF, TM, 3) CB_WG_CASE(SUF, TM, 2)                                 \
            default: cb_wg_products_##SUF(1, vt + t0 * K, vs, ub, m, K); break;           \
            }                                                                             \
            cb_wg_output_##SUF(m, bp, res, act, y, g, first + t0, np, b);               \
        }                                                                                 \
    }                                                                                     \
}

CB_WG_FNS(cb_v4f, 4, base, , 6)
#if CB_SIMD_AVX2
CB_WG_FNS(cb_v8f, 8, avx2, CB_AVX2_ATTR, 6)
CB_WG_FNS(cb_v16f, 16, avx512, CB_AVX512_ATTR, 12)
#endif

static void cb_wg_item(const float *x, const float *u, const float *bp, const float *res,
                       int act, float *y, const cb_wg_geom *g, ptrdiff_t it, float *scratch) {
#if CB_SIMD_AVX2
    if (g->FB == 32) { cb_wg_item_avx512(x, u, bp, res, act, y, g, it, scratch); return; }
    if (g->FB == 16) { cb_wg_item_avx2(x, u, bp, res, act, y, g, it, scratch); return; }
#endif
    cb_wg_item_base(x, u, bp, res, act, y, g, it, scratch);
}

#else  /* no vector extensions: never chosen (cb_wg_available() is 0) */

static void cb_wg_item(const float *x, const float *u, const float *bp, const float *res,
                       int act, float *y, const cb_wg_geom *g, ptrdiff_t it, float *scratch) {
    (void)x; (void)u; (void)bp; (void)res; (void)act; (void)y; (void)g; (void)it;
    (void)scratch;
}

#endif  /* CB_SIMD_VECTOR */

#endif
