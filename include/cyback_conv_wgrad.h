/* Kernel gradient of a channels_last convolution, direct (cyback/kernels/
 * conv.pyx, conv_backward_kernel).
 *
 * dk[t][c][f] = sum over output pixels p of x[input pixel of p at tap t][c]
 * * dy[p][f]. Through im2col or one GEMM per tap this is a product whose
 * output is only taps * C x F and whose inner dimension is every pixel of
 * the batch: BLAS runs such skinny products at a third of its speed. Here a
 * register tile holds 6 input channels x 2 vectors of output channels of one
 * tap; over a block of output rows each dy vector pair is loaded once per
 * pixel and each input value broadcast once, as in the forward kernel
 * (cyback_conv_direct.h), and the tile adds its sums to the block's partial
 * gradient in memory.
 *
 * An output pixel whose tap falls in the W padding is left out of that tap's
 * loop (its input is zero); rows of the D and H padding are NULL. For one
 * dk value the sum runs over the block's rows, then its pixels, in order, so
 * it never depends on the thread count.
 */
#ifndef CYBACK_CONV_WGRAD_H
#define CYBACK_CONV_WGRAD_H

#include <stddef.h>
#include <string.h>
#include "cyback_simd.h"
#include "cyback_conv_direct.h"

/* Output rows per work item (a block of rows of one sample). */
#define CB_CWG_ROWS 8
/* Most input channels per register tile. */
#define CB_CWG_TILE 6

#if CB_SIMD_VECTOR

/* Tile of NC (1 to 6) input channels x 2 vectors of output channels of one
 * tap: part (the tile's first value in the partial gradient, rows F apart)
 * += the sums over rows i < nr (xr[i]: input row at this tap, offset to the
 * tile's channel, or NULL; dyr[i]: dy row, offset to the tile's output
 * channel) and pixels [o0, o1), whose input is column ow * sw + xoff. */
#define CB_CWG_TILE_FN(T, V, VL, SUF, ATTR)                                               \
ATTR static inline __attribute__((always_inline)) void cb_cwg_tile_##SUF(const int NC,   \
        const T *const *xr, const T *const *dyr, ptrdiff_t nr, ptrdiff_t o0,              \
        ptrdiff_t o1, ptrdiff_t xoff, ptrdiff_t sC, ptrdiff_t C, ptrdiff_t F, T *part) {  \
    V a[CB_CWG_TILE], b[CB_CWG_TILE];                                                     \
    ptrdiff_t i, ow;                                                                      \
    int q;                                                                                \
    for (q = 0; q < NC; q++) {                                                            \
        a[q] = *(const V *)(part + q * F);                                                \
        b[q] = *(const V *)(part + q * F + VL);                                           \
    }                                                                                     \
    for (i = 0; i < nr; i++) {                                                            \
        const T *xb = xr[i], *d = dyr[i];                                                 \
        if (!xb) continue;                                                                \
        xb += xoff * C;                                                                   \
        for (ow = o0; ow < o1; ow++) {                                                    \
            const V d0 = *(const V *)(d + ow * F);                                        \
            const V d1 = *(const V *)(d + ow * F + VL);                                   \
            const T *xp = xb + ow * sC;                                                   \
            for (q = 0; q < NC; q++) {                                                    \
                const T x = xp[q];                                                        \
                a[q] += x * d0;                                                           \
                b[q] += x * d1;                                                           \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    for (q = 0; q < NC; q++) {                                                            \
        *(V *)(part + q * F) = a[q];                                                      \
        *(V *)(part + q * F + VL) = b[q];                                                 \
    }                                                                                     \
}                                                                                         \
                                                                                          \
/* Work item `it` over N * OD * ceil(OH / CB_CWG_ROWS): its rows' sums added  */         \
/* to part (taps * C x F). F is a multiple of 2 * VL.                         */         \
ATTR static void cb_cwg_item_##SUF(const T *x, const T *dy, T *part, const cb_cd_geom *g, \
                                   ptrdiff_t it) {                                        \
    const ptrdiff_t C = g->C, F = g->F, OW = g->OW, nrb = (g->OH + CB_CWG_ROWS - 1)       \
        / CB_CWG_ROWS;                                                                    \
    const ptrdiff_t oh0 = (it % nrb) * CB_CWG_ROWS, od = (it / nrb) % g->OD;              \
    const ptrdiff_t n = it / (nrb * g->OD);                                               \
    const ptrdiff_t nr = g->OH - oh0 < CB_CWG_ROWS ? g->OH - oh0 : CB_CWG_ROWS;           \
    const ptrdiff_t nct = (C + CB_CWG_TILE - 1) / CB_CWG_TILE;                            \
    const ptrdiff_t base = C / nct, extra = C % nct;                                      \
    const T *xr[CB_CWG_ROWS], *xc[CB_CWG_ROWS], *dyr[CB_CWG_ROWS], *dyf[CB_CWG_ROWS];     \
    ptrdiff_t i, kd, kh, kw, k, c, fb, t = 0;                                             \
    for (i = 0; i < nr; i++)                                                              \
        dyr[i] = dy + ((n * g->OD + od) * g->OH + oh0 + i) * OW * F;                      \
    for (kd = 0; kd < g->KD; kd++)                                                        \
        for (kh = 0; kh < g->KH; kh++) {                                                  \
            const ptrdiff_t id = od * g->sd - g->pd + kd * g->dil_d;                      \
            for (i = 0; i < nr; i++) {                                                    \
                const ptrdiff_t ih = (oh0 + i) * g->sh - g->ph + kh * g->dil_h;           \
                xr[i] = (id < 0 || id >= g->D || ih < 0 || ih >= g->H) ? NULL             \
                    : x + ((n * g->D + id) * g->H + ih) * g->W * C;                       \
            }                                                                             \
            for (kw = 0; kw < g->KW; kw++, t++) {                                         \
                /* pixels whose input column ow * sw + xoff lies in the row */           \
                const ptrdiff_t xoff = kw * g->dil_w - g->pw;                             \
                ptrdiff_t o0 = xoff >= 0 ? 0 : (-xoff + g->sw - 1) / g->sw;               \
                ptrdiff_t o1 = g->W - 1 - xoff < 0 ? 0 : (g->W - 1 - xoff) / g->sw + 1;   \
                if (o1 > OW) o1 = OW;                                                     \
                if (o0 >= o1) continue;                                                   \
                for (k = 0, c = 0; k < nct; k++) {                                        \
                    const int nc = (int)(base + (k < extra));                             \
                    for (i = 0; i < nr; i++) xc[i] = xr[i] ? xr[i] + c : NULL;            \
                    for (fb = 0; fb < F; fb += 2 * VL) {                                  \
                        T *pt = part + (t * C + c) * F + fb;                              \
                        for (i = 0; i < nr; i++) dyf[i] = dyr[i] + fb;                    \
                        switch (nc) {                                                     \
                        case 6: cb_cwg_tile_##SUF(6, xc, dyf, nr, o0, o1, xoff,           \
                                                  g->sw * C, C, F, pt); break;            \
                        case 5: cb_cwg_tile_##SUF(5, xc, dyf, nr, o0, o1, xoff,           \
                                                  g->sw * C, C, F, pt); break;            \
                        case 4: cb_cwg_tile_##SUF(4, xc, dyf, nr, o0, o1, xoff,           \
                                                  g->sw * C, C, F, pt); break;            \
                        case 3: cb_cwg_tile_##SUF(3, xc, dyf, nr, o0, o1, xoff,           \
                                                  g->sw * C, C, F, pt); break;            \
                        case 2: cb_cwg_tile_##SUF(2, xc, dyf, nr, o0, o1, xoff,           \
                                                  g->sw * C, C, F, pt); break;            \
                        default: cb_cwg_tile_##SUF(1, xc, dyf, nr, o0, o1, xoff,          \
                                                   g->sw * C, C, F, pt); break;           \
                        }                                                                 \
                    }                                                                     \
                    c += nc;                                                              \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
}

CB_CWG_TILE_FN(float, cb_v4f, 4, f_base, )
CB_CWG_TILE_FN(double, cb_v2d, 2, d_base, )
#if CB_SIMD_AVX2
CB_CWG_TILE_FN(float, cb_v8f, 8, f_avx2, CB_AVX2_ATTR)
CB_CWG_TILE_FN(double, cb_v4d, 4, d_avx2, CB_AVX2_ATTR)
#endif

static void cb_cwg_item_f(const float *x, const float *dy, float *part, const cb_cd_geom *g,
                          ptrdiff_t it) {
#if CB_SIMD_AVX2
    if (cb_simd_has_avx2()) { cb_cwg_item_f_avx2(x, dy, part, g, it); return; }
#endif
    cb_cwg_item_f_base(x, dy, part, g, it);
}

static void cb_cwg_item_d(const double *x, const double *dy, double *part,
                          const cb_cd_geom *g, ptrdiff_t it) {
#if CB_SIMD_AVX2
    if (cb_simd_has_avx2()) { cb_cwg_item_d_avx2(x, dy, part, g, it); return; }
#endif
    cb_cwg_item_d_base(x, dy, part, g, it);
}

#else

/* Compilers without vector extensions: the same sums, plain loops. */
#define CB_CWG_SCALAR(T, SUF)                                                             \
static void cb_cwg_item_##SUF(const T *x, const T *dy, T *part, const cb_cd_geom *g,      \
                              ptrdiff_t it) {                                             \
    const ptrdiff_t C = g->C, F = g->F, nrb = (g->OH + CB_CWG_ROWS - 1) / CB_CWG_ROWS;    \
    const ptrdiff_t oh0 = (it % nrb) * CB_CWG_ROWS, od = (it / nrb) % g->OD;              \
    const ptrdiff_t n = it / (nrb * g->OD);                                               \
    const ptrdiff_t nr = g->OH - oh0 < CB_CWG_ROWS ? g->OH - oh0 : CB_CWG_ROWS;           \
    ptrdiff_t kd, kh, kw, c, f, i, ow, t;                                                 \
    for (kd = 0; kd < g->KD; kd++)                                                        \
        for (kh = 0; kh < g->KH; kh++)                                                    \
            for (kw = 0; kw < g->KW; kw++) {                                              \
                t = (kd * g->KH + kh) * g->KW + kw;                                       \
                for (c = 0; c < C; c++)                                                   \
                    for (f = 0; f < F; f++) {                                             \
                        T s = part[(t * C + c) * F + f];                                  \
                        for (i = 0; i < nr; i++) {                                        \
                            const ptrdiff_t id = od * g->sd - g->pd + kd * g->dil_d;      \
                            const ptrdiff_t ih = (oh0 + i) * g->sh - g->ph + kh * g->dil_h; \
                            if (id < 0 || id >= g->D || ih < 0 || ih >= g->H) continue;   \
                            for (ow = 0; ow < g->OW; ow++) {                              \
                                const ptrdiff_t iw = ow * g->sw + kw * g->dil_w - g->pw;  \
                                if (iw < 0 || iw >= g->W) continue;                       \
                                s += x[(((n * g->D + id) * g->H + ih) * g->W + iw) * C + c] \
                                    * dy[(((n * g->OD + od) * g->OH + oh0 + i) * g->OW    \
                                          + ow) * F + f];                                 \
                            }                                                             \
                        }                                                                 \
                        part[(t * C + c) * F + f] = s;                                    \
                    }                                                                     \
            }                                                                             \
}
CB_CWG_SCALAR(float, f)
CB_CWG_SCALAR(double, d)

#endif  /* CB_SIMD_VECTOR */

#endif
