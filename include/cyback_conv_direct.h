/* Direct channels_last convolution (cyback/kernels/conv.pyx, forward).
 *
 * A convolution with few channels is a GEMM with a short inner dimension
 * (K = taps * C): im2col spends as long building the patch matrix as the
 * GEMM spends on it, and BLAS's packing does not pay off. Here each output
 * row is computed straight from the input rows it reads:
 *
 *   - the kernel is packed once per call into blocks of FB output channels,
 *     (blocks, R, KW, C, FB), R = KD * KH rows of taps, zero-filled past F;
 *   - a tile of up to 6 output pixels x FB channels lives in up to 12 vector
 *     registers (FB is two vectors: of 4, 8 or 16 floats by the kernel set,
 *     cyback_simd.h). AVX-512 has 32 registers: its float32 tiles take up to 12
 *     pixels (24 sums, where 512-bit FMAs run at full rate: cb_cd_wide_tiles),
 *     and a block of 16 floats is one vector;
 *     each input value is broadcast once per tile and multiplied into the
 *     block's vectors, each kernel vector is loaded once per tile;
 *   - strides and dilations are only address arithmetic, so strided
 *     convolutions need no im2col either;
 *   - padding along W: the vector kernels read the input rows as they are,
 *     and the tiles at a row's ends read the taps that fall in the padding
 *     from a row of zeros (no copy of the input); the scalar fallback reads a
 *     zero-padded copy made by the caller. Input rows above or below the
 *     image (D, H padding) are NULL and skipped.
 *
 * Epilogue in registers: + a per-channel bias (packed like a kernel block),
 * + a residual array shaped like the output, then CB_ACT_RELU / CB_ACT_RELU6.
 * Each is added after the whole sum, in that order, as separate adds would.
 *
 * The sum for one output runs over (r, kw, c) in that order in every path and
 * for every thread count, so results never depend on either.
 */
#ifndef CYBACK_CONV_DIRECT_H
#define CYBACK_CONV_DIRECT_H

#include <stddef.h>
#include <string.h>
#include "cyback_simd.h"

/* The pointer in a register of its own, with no relation to the others that
 * the compiler can see: pointers a known distance apart it steps as one,
 * rebuilding the others with 2-3 integer ops per tap. */
#define CB_CD_OPAQUE(ptr) __asm__("" : "+r"(ptr))

/* Most tap rows (KD * KH) a row of outputs may read. */
#define CB_CD_MAX_ROWS 64
/* Most output pixels per register tile (6 for the 16-register sets, 12 for
 * AVX-512's float32 sets). */
#define CB_CD_TILE_MAX 12
/* Longest patch (taps x channels) run through a table of tap offsets. */
#define CB_CD_SHORT_K 256
/* Most values in the copy of a row-end tile's input window (16 KB in float),
 * and most channels: with more, the per-tap checks run loops long enough
 * that the copy costs more than it saves. */
#define CB_CD_EDGE_MAX 4096
#define CB_CD_EDGE_MAX_C 16
/* Most input channels (of the vector kernels, which read taps in the W
 * padding from a row of zeros this long). */
#define CB_CD_MAX_C 1024

typedef struct {
    ptrdiff_t N, C, F;
    ptrdiff_t D, H, W, Wp;   /* input extent; Wp: length of an input row as read:
                                W, or more when the caller padded the rows */
    ptrdiff_t pw;            /* zero columns before the input: in the row when
                                Wp > W, else skipped by the kernel */
    ptrdiff_t OD, OH, OW;
    ptrdiff_t KD, KH, KW;
    ptrdiff_t sd, sh, sw;
    ptrdiff_t dil_d, dil_h, dil_w;
    ptrdiff_t pd, ph;
    ptrdiff_t FB, nfb;       /* output channels per block, number of blocks */
    /* Filled by cb_cd_prepare: with ntab > 0 (taps of all tap rows, at most
     * CB_CD_SHORT_K), offs[t] is tap t's input from tap 0's and eoffs[t] its
     * place in the copy of a row-end tile's window (rows of `span` pixels);
     * for the taps of the rows that exist, both are the same tables' first
     * entries (see cb_cd_row_*). Built once per geometry: a row of a short
     * patch would spend as long building them as on its tiles. */
    ptrdiff_t ntab, span;
    ptrdiff_t offs[CB_CD_SHORT_K], eoffs[CB_CD_SHORT_K];
} cb_cd_geom;

/* The tap tables of g (above), for input rows that start xw0 columns into
 * rows of Wp + xw0 pixels (cb_cd_out). */
static void cb_cd_prepare(cb_cd_geom *g, ptrdiff_t xw0) {
    const ptrdiff_t C = g->C, rowlen = (g->Wp + xw0) * C;
    ptrdiff_t kd, kh, kw, c, t = 0;
    g->span = (CB_CD_TILE_MAX - 1) * g->sw + (g->KW - 1) * g->dil_w + 1;
    g->ntab = 0;
    if (g->KD * g->KH * g->KW * C > CB_CD_SHORT_K) return;
    for (kd = 0; kd < g->KD; kd++)
        for (kh = 0; kh < g->KH; kh++)
            for (kw = 0; kw < g->KW; kw++)
                for (c = 0; c < C; c++, t++) {
                    g->offs[t] = (kd * g->dil_d * g->H + kh * g->dil_h) * rowlen
                        + kw * g->dil_w * C + c;
                    g->eoffs[t] = ((kd * g->KH + kh) * g->span + kw * g->dil_w) * C + c;
                }
    g->ntab = t;
}

/* Whether the kernels skip the W padding themselves (the vector kernels), so
 * the caller passes the input rows unpadded (Wp = W). */
static int cb_cd_pads_itself(void) { return CB_SIMD_VECTOR; }

/* Output channels per block of the AVX2 or the baseline set, whichever runs
 * now (the kernel gradient's width, cyback_conv_wgrad.h). */
static ptrdiff_t cb_cd_block(int dbl) {
#if CB_SIMD_AVX2
    if (cb_simd_has_avx2()) return dbl ? 8 : 16;
#endif
    return dbl ? 4 : 8;
}

/* Output channels per block of the forward kernel for F output channels: the
 * AVX-512 set's 2 x 16 floats once F is wider than the AVX2 block (F = 48
 * fills 3/4 of two blocks and still runs 1.5x the AVX2 set's work per
 * instruction; F <= 16 would leave half of one block empty). */
static ptrdiff_t cb_cd_block_for(int dbl, ptrdiff_t F);

#define CB_CD_COMMON(T, SUF)                                                              \
/* Block b of the packed kernel: wp[b][r][kw][c][j] = k[r][kw][c][b*FB + j] (0 past   \
 * F); bp likewise for bias. Blocks are independent, so a region's threads pack        \
 * them in parallel before the tiles read them. */                                     \
static void cb_cd_pack_block_##SUF(const T *k, const T *bias, T *wp, T *bp,              \
                                   const cb_cd_geom *g, ptrdiff_t b) {                    \
    ptrdiff_t taps = g->KD * g->KH * g->KW * g->C, t, j;                                  \
    ptrdiff_t nf = g->F - b * g->FB < g->FB ? g->F - b * g->FB : g->FB;                   \
    for (t = 0; t < taps; t++) {                                                          \
        T *dst = wp + (b * taps + t) * g->FB;                                             \
        memcpy(dst, k + t * g->F + b * g->FB, nf * sizeof(T));                            \
        if (nf < g->FB) memset(dst + nf, 0, (g->FB - nf) * sizeof(T));                    \
    }                                                                                     \
    if (bp)                                                                               \
        for (j = 0; j < g->FB; j++)                                                       \
            bp[b * g->FB + j] = j < nf ? bias[b * g->FB + j] : (T)0;                      \
}                                                                                         \
                                                                                          \
/* Row `row` (over N * D * H) of the input, zero-padded along W into xp. */               \
static void cb_cd_pad_row_##SUF(const T *x, T *xp, const cb_cd_geom *g, ptrdiff_t row) {  \
    ptrdiff_t C = g->C, right = g->Wp - g->pw - g->W;                                     \
    T *dst = xp + row * g->Wp * C;                                                        \
    if (g->pw > 0) memset(dst, 0, g->pw * C * sizeof(T));                                 \
    memcpy(dst + g->pw * C, x + row * g->W * C, g->W * C * sizeof(T));                    \
    if (right > 0) memset(dst + (g->pw + g->W) * C, 0, right * C * sizeof(T));            \
}                                                                                         \
                                                                                          \
/* Scalar tile of np pixels, for compilers without vector extensions. */                  \
static void cb_cd_tile_scalar_##SUF(const T *const *xr, ptrdiff_t R, const T *wp,         \
        const T *bp, const T *res, int act, T *y, ptrdiff_t ys, ptrdiff_t nf,             \
        ptrdiff_t np, const cb_cd_geom *g) {                                              \
    ptrdiff_t p, j, r, kw, c, FB = g->FB, C = g->C;                                       \
    for (p = 0; p < np; p++)                                                              \
        for (j = 0; j < nf; j++) {                                                        \
            T s = 0;                                                                      \
            for (r = 0; r < R; r++) {                                                     \
                const T *xb = xr[r];                                                      \
                if (!xb) continue;                                                        \
                for (kw = 0; kw < g->KW; kw++)                                            \
                    for (c = 0; c < C; c++)                                               \
                        s += xb[(p * g->sw + kw * g->dil_w) * C + c]                      \
                             * wp[((r * g->KW + kw) * C + c) * FB + j];                   \
            }                                                                             \
            if (bp) s += bp[j];                                                           \
            if (res) s += res[p * ys + j];                                                \
            y[p * ys + j] = CB_ACT(T, s, act);                                            \
        }                                                                                 \
}

CB_CD_COMMON(float, f)
CB_CD_COMMON(double, d)

#if CB_SIMD_VECTOR

/* The tile for np pixels from ow on, the size a constant in each case; so is
 * `inside` (IN), so interior tiles compile without the per-tap checks.
 * Sizes above the row's most pixels per tile (TM) never come: those cases
 * compile to nothing. */
#define CB_CD_TILE_CASE(SUF, N, IN, O, TM, WP)                                            \
    case N:                                                                               \
        if (N <= TM) cb_cd_tile_##SUF(N, xr, R, WP, bp, res, act, y, ys, nf, g, ow, IN, O, \
                                      x0o, Ko);                                           \
        break;
#define CB_CD_TILE_SWITCH(SUF, IN, O, TM, WP)                                             \
    switch (np) {                                                                         \
    CB_CD_TILE_CASE(SUF, 12, IN, O, TM, WP) CB_CD_TILE_CASE(SUF, 11, IN, O, TM, WP)       \
    CB_CD_TILE_CASE(SUF, 10, IN, O, TM, WP) CB_CD_TILE_CASE(SUF, 9, IN, O, TM, WP)        \
    CB_CD_TILE_CASE(SUF, 8, IN, O, TM, WP) CB_CD_TILE_CASE(SUF, 7, IN, O, TM, WP)         \
    CB_CD_TILE_CASE(SUF, 6, IN, O, TM, WP) CB_CD_TILE_CASE(SUF, 5, IN, O, TM, WP)         \
    CB_CD_TILE_CASE(SUF, 4, IN, O, TM, WP) CB_CD_TILE_CASE(SUF, 3, IN, O, TM, WP)         \
    CB_CD_TILE_CASE(SUF, 2, IN, O, TM, WP)                                                \
    default: cb_cd_tile_##SUF(1, xr, R, WP, bp, res, act, y, ys, nf, g, ow, IN, O, x0o, Ko); \
        break;                                                                            \
    }

#if CB_SIMD_VECTOR
/* The W padding as the vector kernels read it (never written). */
static float cb_cd_zeros_float[CB_CD_MAX_C];
static double cb_cd_zeros_double[CB_CD_MAX_C];
#endif

/* The lines of `bytes` from ptr, asked for while the tile's products run. */
#define CB_CD_PREFETCH(ptr, bytes)                                                        \
    {                                                                                     \
        const char *pf_ = (const char *)(ptr);                                            \
        int q_;                                                                           \
        for (q_ = 0; q_ < (int)(bytes); q_ += 64) __builtin_prefetch(pf_ + q_, 0, 3);    \
        __builtin_prefetch(pf_ + (bytes) - 1, 0, 3);                                      \
    }

/* for each pixel p of a tile, unrolled (see below) */
#define CB_CD_PIXELS _Pragma("GCC unroll 12") for (p = 0; p < NP; p++)

/* A tile of NP (1 to TM) output pixels from ow on, their NV * NP vectors of
 * sums in registers (NV = 1, 2 or 4 vectors of VL per pixel, a block of NV * VL
 * channels; the sums of vectors past NV are dead code); then the epilogue, and
 * the pixels go to y. NP is a constant at every call, so the pixel loops
 * unroll and the sums stay in registers (unrolled by pragma: left to the
 * compiler's passes, the sums go through the stack at each tile's end, a
 * real cost on narrow 1x1 convolutions). With `inside`, every tap of the tile
 * reads inside its input row; otherwise each tap's row is checked per pixel,
 * and taps in the W padding read zeros (as from a padded copy, adding 0 * w in
 * the same place of the sum). */
#define CB_CD_TILE_FN(T, V, VL, NV, SUF, ATTR)                                            \
ATTR static inline __attribute__((always_inline)) void cb_cd_tile_##SUF(const int NP,    \
        const T *const *xr, ptrdiff_t R, const T *wp, const T *bp, const T *res, int act, \
        T *y, ptrdiff_t ys, ptrdiff_t nf, const cb_cd_geom *g, ptrdiff_t ow, int inside,  \
        const ptrdiff_t *offs, const T *x0, ptrdiff_t K) {                                \
    const ptrdiff_t C = g->C, tap = C * NV * VL;                                          \
    const ptrdiff_t lead = g->Wp == g->W ? g->pw : 0;                                     \
    /* Undilated taps of a row are one run of KW * C inputs and of kernel    */          \
    /* vectors: one loop instead of two (few channels: the first layer).     */          \
    const int run = inside && g->dil_w == 1;                                              \
    const ptrdiff_t KW = run ? 1 : g->KW, CK = run ? g->KW * C : C;                       \
    const V zero = (V){0};                                                                \
    V a[CB_CD_TILE_MAX], b[CB_CD_TILE_MAX], e[CB_CD_TILE_MAX], d[CB_CD_TILE_MAX];         \
    const T *xk[CB_CD_TILE_MAX];                                                          \
    ptrdiff_t r, kw, c;                                                                   \
    int p;                                                                                \
    CB_CD_PIXELS a[p] = b[p] = e[p] = d[p] = zero;                                        \
    /* The residual's lines, asked for now: read only at the epilogue, from */            \
    /* memory on a large layer, they would stall each tile there (ResNet50's */           \
    /* 1x1 projections at batch 8 run 1.1-1.3x faster).                       */          \
    if (res) CB_CD_PIXELS CB_CD_PREFETCH(res + (ow + p) * ys, NV * VL * sizeof(T));       \
    if (offs) {                                                                           \
        /* all K taps in one loop: x0 is the first pixel's first input, offs[t] */        \
        /* tap t's input from there, wp the kernel from that tap on. Each       */        \
        /* pixel's first input in a register of its own: a tap is one load of   */        \
        /* its offset, and each pixel's value one address mode, fewer           */        \
        /* instructions per FMA than one pointer stepped per pixel (the stem    */        \
        /* and narrow 3x3 layers gain; benchmarks/bench_conv.py "direct" rows). */        \
        const ptrdiff_t sC = g->sw * C;                                                   \
        CB_CD_PIXELS { xk[p] = x0 + p * sC; CB_CD_OPAQUE(xk[p]); }                        \
        for (c = 0; c < K; c++) {                                                         \
            const V w0 = *(const V *)(wp + c * NV * VL);                                  \
            const V w1 = NV >= 2 ? *(const V *)(wp + c * NV * VL + VL) : zero;            \
            const V w2 = NV == 4 ? *(const V *)(wp + c * NV * VL + 2 * VL) : zero;        \
            const V w3 = NV == 4 ? *(const V *)(wp + c * NV * VL + 3 * VL) : zero;        \
            const ptrdiff_t o = offs[c];                                                  \
            CB_CD_PIXELS {                                                                \
                const T x = xk[p][o];                                                     \
                a[p] += x * w0;                                                           \
                if (NV >= 2) b[p] += x * w1;                                              \
                if (NV == 4) { e[p] += x * w2; d[p] += x * w3; }                          \
            }                                                                             \
        }                                                                                 \
    } else                                                                                \
    for (r = 0; r < R; r++) {                                                             \
        const T *xb = xr[r];                                                              \
        const T *wr = wp + r * g->KW * tap;                                               \
        if (!xb) continue;                                                                \
        for (kw = 0; kw < KW; kw++) {                                                     \
            const T *wk = wr + kw * tap;                                                  \
            CB_CD_PIXELS {                                                                \
                const ptrdiff_t iw = (ow + p) * g->sw - lead + kw * g->dil_w;             \
                xk[p] = inside || (iw >= 0 && iw < g->Wp) ? xb + iw * C                   \
                                                          : cb_cd_zeros_##T;              \
            }                                                                             \
            for (c = 0; c < CK; c++) {                                                    \
                const V w0 = *(const V *)(wk + c * NV * VL);                              \
                const V w1 = NV >= 2 ? *(const V *)(wk + c * NV * VL + VL) : zero;        \
                const V w2 = NV == 4 ? *(const V *)(wk + c * NV * VL + 2 * VL) : zero;    \
                const V w3 = NV == 4 ? *(const V *)(wk + c * NV * VL + 3 * VL) : zero;    \
                CB_CD_PIXELS {                                                            \
                    const T x = xk[p][c];                                                 \
                    a[p] += x * w0;                                                       \
                    if (NV >= 2) b[p] += x * w1;                                          \
                    if (NV == 4) { e[p] += x * w2; d[p] += x * w3; }                      \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    /* The epilogue as one short loop per step, each with no branch inside: */            \
    /* they unroll, and the sums stay in registers (one loop with all the   */            \
    /* steps' branches would store and reload them).                        */            \
    if (bp) {                                                                             \
        const V bv0 = *(const V *)bp, bv1 = NV >= 2 ? *(const V *)(bp + VL) : zero;       \
        const V bv2 = NV == 4 ? *(const V *)(bp + 2 * VL) : zero;                         \
        const V bv3 = NV == 4 ? *(const V *)(bp + 3 * VL) : zero;                         \
        CB_CD_PIXELS {                                                                    \
            a[p] += bv0;                                                                  \
            if (NV >= 2) b[p] += bv1;                                                     \
            if (NV == 4) { e[p] += bv2; d[p] += bv3; }                                    \
        }                                                                                 \
    }                                                                                     \
    if (res) {                                                                            \
        const T *rs = res + ow * ys;                                                      \
        if (nf == NV * VL)                                                                \
            CB_CD_PIXELS {                                                                \
                a[p] += *(const V *)(rs + p * ys);                                        \
                if (NV >= 2) b[p] += *(const V *)(rs + p * ys + VL);                      \
                if (NV == 4) {                                                            \
                    e[p] += *(const V *)(rs + p * ys + 2 * VL);                           \
                    d[p] += *(const V *)(rs + p * ys + 3 * VL);                           \
                }                                                                         \
            }                                                                             \
        else                                                                              \
            CB_CD_PIXELS {                                                                \
                T tr[NV * VL] = {0};                                                      \
                memcpy(tr, rs + p * ys, nf * sizeof(T));                                  \
                a[p] += *(const V *)tr;                                                   \
                if (NV >= 2) b[p] += *(const V *)(tr + VL);                               \
                if (NV == 4) {                                                            \
                    e[p] += *(const V *)(tr + 2 * VL);                                    \
                    d[p] += *(const V *)(tr + 3 * VL);                                    \
                }                                                                         \
            }                                                                             \
    }                                                                                     \
    if (act != CB_ACT_NONE)                                                               \
        CB_CD_PIXELS {                                                                    \
            CB_VACT(a[p], act);                                                           \
            if (NV >= 2) CB_VACT(b[p], act);                                              \
            if (NV == 4) { CB_VACT(e[p], act); CB_VACT(d[p], act); }                      \
        }                                                                                 \
    if (nf == NV * VL)                                                                    \
        CB_CD_PIXELS {                                                                    \
            *(V *)(y + (ow + p) * ys) = a[p];                                             \
            if (NV >= 2) *(V *)(y + (ow + p) * ys + VL) = b[p];                           \
            if (NV == 4) {                                                                \
                *(V *)(y + (ow + p) * ys + 2 * VL) = e[p];                                \
                *(V *)(y + (ow + p) * ys + 3 * VL) = d[p];                                \
            }                                                                             \
        }                                                                                 \
    else                                                                                  \
        CB_CD_PIXELS {                                                                    \
            T tmp[NV * VL];                                                               \
            *(V *)tmp = a[p];                                                             \
            if (NV >= 2) *(V *)(tmp + VL) = b[p];                                         \
            if (NV == 4) { *(V *)(tmp + 2 * VL) = e[p]; *(V *)(tmp + 3 * VL) = d[p]; }    \
            memcpy(y + (ow + p) * ys, tmp, nf * sizeof(T));                               \
        }                                                                                 \
}

/* One output row (all OW pixels) of one channel block. xr[r]: input row of tap
 * row r (Wp wide; when Wp == W its pw leading zero columns are implied,
 * otherwise they are in the row), or NULL; wp: the block's packed kernel; bp:
 * its packed bias or NULL; res: a residual laid out like y, or NULL (it may be
 * y itself); y: output pixel 0 of the block; ys: the output pixel stride (F,
 * or a multiple of F when the row's pixels are interleaved with others, as the
 * phases of a transposed convolution are); nf: channels of the block that
 * exist. The row runs in tiles of sizes as nearly equal as tiles of at most TM
 * (6; 12 on AVX-512 in float32) allow (56 pixels: 6 x 6 + 4 x 5, where 9 x
 * 6 + 2 would spend a whole tile's time on 2 pixels; a tile of 5 still keeps
 * as many FMAs in flight as the units take).
 *
 * A short patch (few channels) would spend a tile's time on its loops over
 * taps, so when the tap rows that exist are one run and their taps number
 * at most CB_CD_SHORT_K, a tile runs them all in one loop through their
 * offsets. Interior tiles read the input in place; with at most
 * CB_CD_EDGE_MAX_C channels, the tiles at the row's ends, whose taps leave
 * it, read a copy of their window with zeros in the W padding (the same
 * products in the same order as the per-tap checks, which the others still
 * take). Tap rows outside the image (D, H padding) are skipped either way. */
#define CB_CD_ROW(T, V, VL, NV, TM, SUF, ATTR)                                            \
CB_CD_TILE_FN(T, V, VL, NV, SUF, ATTR)                                                    \
ATTR static void cb_cd_row_##SUF(const T *const *xr, ptrdiff_t R, const T *wp,            \
        const T *bp, const T *res, int act, T *y, ptrdiff_t ys, ptrdiff_t nf,             \
        const cb_cd_geom *g) {                                                            \
    const ptrdiff_t OW = g->OW, lead = g->Wp == g->W ? g->pw : 0;                         \
    const ptrdiff_t last = g->Wp - 1 + lead - (g->KW - 1) * g->dil_w;                     \
    const ptrdiff_t lo = (lead + g->sw - 1) / g->sw, hi = last < 0 ? 0 : last / g->sw + 1; \
    const ptrdiff_t nt = (OW + TM - 1) / TM;                                              \
    const ptrdiff_t base = nt ? OW / nt : 0, extra = nt ? OW % nt : 0;                    \
    const ptrdiff_t C = g->C, KW = g->KW, rk = KW * C, span = g->span;                   \
    ptrdiff_t i, ow, np, r, r0, r1, Ko;                                                   \
    const ptrdiff_t *po = NULL, *pe = NULL;                                               \
    const T *x0o = NULL, *wo = wp;                                                        \
    T ebuf[CB_CD_EDGE_MAX];                                                               \
    for (r0 = 0; r0 < R && !xr[r0]; r0++) {}                                              \
    for (r1 = r0; r1 < R && xr[r1]; r1++) {}                                              \
    for (r = r1; r < R && !xr[r]; r++) {}                                                 \
    Ko = (r1 - r0) * rk;                                                                  \
    /* the rows that exist are one run, and lie as in the tables */                      \
    if (g->ntab && r == R && (r1 - r0) * KW > 1                                           \
            && xr[r1 - 1] - xr[r0] == g->offs[(r1 - 1 - r0) * rk]) {                      \
        wo = wp + r0 * rk * g->FB;                                                        \
        po = g->offs;                                                                     \
        if (C <= CB_CD_EDGE_MAX_C && (r1 - r0) * span * C <= CB_CD_EDGE_MAX)              \
            pe = g->eoffs;                                                                \
    }                                                                                     \
    /* the first `extra` tiles take base + 1 pixels, the others base */                  \
    for (i = 0, ow = 0; i < nt; i++, ow += np) {                                          \
        const int in = ow >= lo && ow + base + (i < extra) <= hi;                         \
        np = base + (i < extra);                                                          \
        if (po && in) {                                                                   \
            x0o = xr[r0] + (ow * g->sw - lead) * C;                                       \
            CB_CD_TILE_SWITCH(SUF, 1, po, TM, wo)                                         \
        } else if (pe) {                                                                  \
            /* the window's pixels [w0, w0 + wn) of each row: those in  */                \
            /* [0, Wp) are one run, zeros before and after it            */                \
            const ptrdiff_t w0 = ow * g->sw - lead;                                       \
            const ptrdiff_t wn = (np - 1) * g->sw + (KW - 1) * g->dil_w + 1;              \
            const ptrdiff_t a = w0 < 0 ? -w0 : 0;                                         \
            const ptrdiff_t e = w0 + wn > g->Wp ? g->Wp - w0 : wn;                        \
            for (r = r0; r < r1; r++) {                                                   \
                T *dst = ebuf + (r - r0) * span * C;                                      \
                if (a > 0) memset(dst, 0, (a < wn ? a : wn) * C * sizeof(T));             \
                if (e > a)                                                                \
                    memcpy(dst + a * C, xr[r] + (w0 + a) * C, (e - a) * C * sizeof(T));   \
                if (e < wn) {                                                             \
                    const ptrdiff_t z = e > a ? e : a;                                    \
                    if (z < wn) memset(dst + z * C, 0, (wn - z) * C * sizeof(T));         \
                }                                                                         \
            }                                                                             \
            x0o = ebuf;                                                                   \
            CB_CD_TILE_SWITCH(SUF, 1, pe, TM, wo)                                         \
        } else if (in) {                                                                  \
            CB_CD_TILE_SWITCH(SUF, 1, NULL, TM, wp)                                       \
        } else {                                                                          \
            CB_CD_TILE_SWITCH(SUF, 0, NULL, TM, wp)                                       \
        }                                                                                 \
    }                                                                                     \
}

CB_CD_ROW(float, cb_v4f, 4, 2, 6, f_base, )
CB_CD_ROW(double, cb_v2d, 2, 2, 6, d_base, )
#if CB_SIMD_AVX2
CB_CD_ROW(float, cb_v8f, 8, 2, 6, f_avx2, CB_AVX2_ATTR)
CB_CD_ROW(double, cb_v4d, 4, 2, 6, d_avx2, CB_AVX2_ATTR)
#endif
#if CB_SIMD_AVX512
/* float32 rows in tiles of up to 12 pixels (Intel) and of 6 (the _s rows:
 * where 512-bit FMAs run as two 256-bit halves, cb_cd_wide_tiles). The
 * second set of rows (_n) runs the AVX2 block width as one AVX-512 vector,
 * with the same packing. float64 keeps 6-pixel tiles: Keras layers are
 * float32, and each tile size is code in the wheel. */
CB_CD_ROW(float, cb_v16f, 16, 2, 12, f_avx512, CB_AVX512_ATTR)
CB_CD_ROW(float, cb_v16f, 16, 2, 6, f_avx512s, CB_AVX512_ATTR)
CB_CD_ROW(double, cb_v8d, 8, 2, 6, d_avx512, CB_AVX512_ATTR)
CB_CD_ROW(float, cb_v16f, 16, 1, 12, f_avx512n, CB_AVX512_ATTR)
CB_CD_ROW(float, cb_v16f, 16, 1, 6, f_avx512ns, CB_AVX512_ATTR)
CB_CD_ROW(double, cb_v8d, 8, 1, 6, d_avx512n, CB_AVX512_ATTR)
/* Where 512-bit FMAs run as two halves, tiles of 6 pixels x 4 vectors (64
 * channels, 24 sums) for float32 layers of a multiple of 64 channels: each
 * input value broadcast and each pixel's address formed once per 4 FMAs
 * instead of 2 (cb_cd_block_for). */
CB_CD_ROW(float, cb_v16f, 16, 4, 6, f_avx512q, CB_AVX512_ATTR)
#define cb_cd_row_d_avx512s cb_cd_row_d_avx512
#define cb_cd_row_d_avx512ns cb_cd_row_d_avx512n
#define cb_cd_row_d_avx512q cb_cd_row_d_avx512

/* Whether the float32 AVX-512 rows take tiles of 12 pixels (else 6); -1:
 * by the CPU, as cb_simd_half_rate_512 tells. Where 512-bit FMAs run at full
 * rate the 12-pixel tiles are faster; where a zmm FMA takes both 256-bit
 * pipes (AMD Zen 4), 12 pixels add no FMA throughput, only the pixels'
 * pointers that no longer fit in registers, and 6 are faster
 * (benchmarks/bench_conv.py --tiles). Tests and benchmarks set it (conv.pyx,
 * _use_wide_tiles). */
static int cb_cd_wide = -1;

static int cb_cd_wide_tiles(void) {
    return cb_cd_wide >= 0 ? cb_cd_wide : !cb_simd_half_rate_512();
}

/* w = 1: 12-pixel tiles, 0: 6-pixel ones, -1: by the CPU. Returns whether
 * the 12-pixel tiles now run. */
static int cb_cd_use_wide_tiles(int w) {
    cb_cd_wide = w;
    return cb_cd_wide_tiles();
}
#endif
#endif  /* CB_SIMD_VECTOR */

#if !(CB_SIMD_VECTOR && CB_SIMD_AVX512)
static int cb_cd_wide_tiles(void) { return 0; }
static int cb_cd_use_wide_tiles(int w) { (void)w; return 0; }
#endif

/* 1: float32 layers of a multiple of 64 channels take 64-channel blocks
 * where the 6-pixel AVX-512 tiles run (cb_cd_row_f_avx512q); 0: 32-channel
 * ones. Tests and benchmarks set it (conv.pyx, _use_quad_blocks). */
static int cb_cd_quad = 1;

static int cb_cd_use_quad_blocks(int on) {
    cb_cd_quad = on;
    return on;
}

static ptrdiff_t cb_cd_block_for(int dbl, ptrdiff_t F) {
#if CB_SIMD_VECTOR && CB_SIMD_AVX512
    if (!dbl && cb_cd_quad && F >= 64 && F % 64 == 0 && cb_simd_has_avx512() &&
            !cb_cd_wide_tiles())
        return 64;
#endif
    return cb_simd_block(cb_cd_block(dbl), F);
}

/* Where the output rows of a convolution go in a larger output array: output
 * position (od, oh, ow) of sample n is element ((n * D + d0 + od * sd) * H + h0
 * + oh * sh) * W + w0 + ow * sw of an (N, D, H, W, F) array. One phase of a
 * transposed convolution with strides (sd, sh, sw) is a stride-1 convolution
 * whose outputs are every sd-th, sh-th, sw-th position of its result from
 * (d0, h0, w0) on (see conv.pyx, _phase_plan). Its input rows may also start
 * xw0 columns into rows of g->W + xw0 (a negative padding before). */
typedef struct {
    ptrdiff_t D, H, W, d0, h0, w0, sd, sh, sw, xw0;
} cb_cd_out;

/* Work item `it` over N * OD * OH * nfb: one output row of one channel block.
 * x: the input, or its W-padded copy (rows of Wp * C); wp, bp: packed kernel
 * and bias (bp may be NULL); res: NULL or a residual shaped like y (it may
 * be y); y: the (N, OD, OH, OW, F) output, or with `out` (else NULL) the
 * larger array it describes. */
#define CB_CD_ITEM(T, SUF, VL_AVX2, VL_BASE)                                              \
static void cb_cd_item_out_##SUF(const T *x, const T *wp, const T *bp, const T *res,      \
        int act, T *y, const cb_cd_geom *g, ptrdiff_t it, const cb_cd_out *out) {         \
    const T *xr[CB_CD_MAX_ROWS];                                                          \
    ptrdiff_t b = it % g->nfb, row = it / g->nfb, oh, od, n, kd, kh, id, ih, R = 0, nf;   \
    ptrdiff_t taps = g->KD * g->KH * g->KW * g->C, ys = g->F;                             \
    const ptrdiff_t x0 = out ? out->xw0 : 0, rowlen = (g->Wp + x0) * g->C;                \
    T *yb;                                                                                \
    oh = row % g->OH;                                                                     \
    od = (row / g->OH) % g->OD;                                                           \
    n = row / (g->OH * g->OD);                                                            \
    for (kd = 0; kd < g->KD; kd++)                                                        \
        for (kh = 0; kh < g->KH; kh++) {                                                  \
            id = od * g->sd - g->pd + kd * g->dil_d;                                      \
            ih = oh * g->sh - g->ph + kh * g->dil_h;                                      \
            xr[R++] = (id < 0 || id >= g->D || ih < 0 || ih >= g->H) ? NULL               \
                : x + ((n * g->D + id) * g->H + ih) * rowlen + x0 * g->C;                 \
        }                                                                                 \
    nf = g->F - b * g->FB;                                                                \
    if (nf > g->FB) nf = g->FB;                                                           \
    if (out) {                                                                            \
        yb = y + (((n * out->D + out->d0 + od * out->sd) * out->H + out->h0               \
                   + oh * out->sh) * out->W + out->w0) * g->F + b * g->FB;                \
        ys = out->sw * g->F;                                                              \
    } else                                                                                \
        yb = y + ((n * g->OD + od) * g->OH + oh) * g->OW * g->F + b * g->FB;              \
    if (res) res += yb - y;                                                               \
    wp += b * taps * g->FB;                                                               \
    if (bp) bp += b * g->FB;                                                              \
    CB_CD_DISPATCH(SUF, VL_AVX2, VL_BASE)                                                 \
}                                                                                         \
                                                                                          \
static void cb_cd_item_##SUF(const T *x, const T *wp, const T *bp, const T *res, int act,  \
                             T *y, const cb_cd_geom *g, ptrdiff_t it) {                    \
    cb_cd_item_out_##SUF(x, wp, bp, res, act, y, g, it, NULL);                            \
}

/* The block width picks the kernel set (the caller packed for it); the AVX2
 * width runs as one AVX-512 vector where the CPU has it (same packing). */
#if CB_SIMD_VECTOR && CB_SIMD_AVX2
#define CB_CD_DISPATCH(SUF, VL_AVX2, VL_BASE)                                             \
    if (g->FB == 8 * VL_AVX2) {                                                           \
        cb_cd_row_##SUF##_avx512q(xr, R, wp, bp, res, act, yb, ys, nf, g);                \
    } else if (g->FB == 4 * VL_AVX2) {                                                    \
        if (cb_cd_wide_tiles()) cb_cd_row_##SUF##_avx512(xr, R, wp, bp, res, act, yb, ys, nf, g); \
        else cb_cd_row_##SUF##_avx512s(xr, R, wp, bp, res, act, yb, ys, nf, g);           \
    } else if (g->FB == 2 * VL_AVX2 && cb_simd_has_avx512()) {                            \
        if (cb_cd_wide_tiles())                                                           \
            cb_cd_row_##SUF##_avx512n(xr, R, wp, bp, res, act, yb, ys, nf, g);            \
        else cb_cd_row_##SUF##_avx512ns(xr, R, wp, bp, res, act, yb, ys, nf, g);          \
    } else if (g->FB == 2 * VL_AVX2) cb_cd_row_##SUF##_avx2(xr, R, wp, bp, res, act, yb, ys, nf, g); \
    else cb_cd_row_##SUF##_base(xr, R, wp, bp, res, act, yb, ys, nf, g);
#elif CB_SIMD_VECTOR
#define CB_CD_DISPATCH(SUF, VL_AVX2, VL_BASE)                                             \
    cb_cd_row_##SUF##_base(xr, R, wp, bp, res, act, yb, ys, nf, g);
#else
#define CB_CD_DISPATCH(SUF, VL_AVX2, VL_BASE)                                             \
    cb_cd_tile_scalar_##SUF(xr, R, wp, bp, res, act, yb, ys, nf, g->OW, g);
#endif

CB_CD_ITEM(float, f, 8, 4)
CB_CD_ITEM(double, d, 4, 2)

#endif
