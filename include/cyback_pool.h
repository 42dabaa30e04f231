/* One output pixel of a float32 channels_last pooling window (cyback/kernels/
 * pool.pyx): y[0:C] = the max, or the sum times inv, over the window's cells
 * (i in [d0, d1), j in [h0, h1), k in [w0, w1)) of x, a (D, H, W, C) sample.
 *
 * The per-pixel path of pool.pyx adds each cell's C values into y, one call
 * per cell, in the baseline set the wheels are built for; here up to 64
 * channels at a time stay in AVX-512 (or AVX2) registers down all the cells.
 * The cells are taken in the same (i, j, k) order, the sum starts from +0.0
 * and is scaled by the same inv, and the max keeps its value unless a cell
 * is greater (a NaN cell never wins, a NaN first cell stays, a zero does not
 * replace a zero of the other sign), so the values are the per-pixel path's
 * bits: the max instruction with the running value second is that select
 * (it returns its second operand for a NaN or for two zeros). Returns 0 when no vector set runs here (the
 * caller then takes that path). */
#ifndef CYBACK_POOL_H
#define CYBACK_POOL_H

#include <stddef.h>

#include "cyback_simd.h"

#if CB_SIMD_AVX512
#include <immintrin.h>

CB_AVX512_ATTR static void cb_pool_window_512(const float *x, float *y, ptrdiff_t H,
                                              ptrdiff_t W, ptrdiff_t C, ptrdiff_t d0,
                                              ptrdiff_t d1, ptrdiff_t h0, ptrdiff_t h1,
                                              ptrdiff_t w0, ptrdiff_t w1, int is_max,
                                              float inv) {
    ptrdiff_t c0, i, j, k;
    int v;
    for (c0 = 0; c0 < C; c0 += 64) {
        ptrdiff_t n = C - c0 < 64 ? C - c0 : 64;
        __mmask16 m[4];
        __m512 acc[4];
        for (v = 0; v < 4; v++) {
            m[v] = cb_simd_mask16(n - 16 * v);
            acc[v] = is_max ? _mm512_maskz_loadu_ps(
                                  m[v], x + ((d0 * H + h0) * W + w0) * C + c0 + 16 * v)
                            : _mm512_setzero_ps();
        }
        for (i = d0; i < d1; i++)
            for (j = h0; j < h1; j++)
                for (k = w0; k < w1; k++) {
                    const float *p = x + ((i * H + j) * W + k) * C + c0;
                    for (v = 0; v < 4; v++) {
                        __m512 a;
                        if (!m[v]) break;
                        a = _mm512_maskz_loadu_ps(m[v], p + 16 * v);
                        acc[v] = is_max ? _mm512_max_ps(a, acc[v]) : _mm512_add_ps(acc[v], a);
                    }
                }
        for (v = 0; v < 4 && m[v]; v++) {
            __m512 out = is_max ? acc[v] : _mm512_mul_ps(acc[v], _mm512_set1_ps(inv));
            _mm512_mask_storeu_ps(y + c0 + 16 * v, m[v], out);
        }
    }
}

CB_AVX2_ATTR static void cb_pool_window_256(const float *x, float *y, ptrdiff_t H,
                                            ptrdiff_t W, ptrdiff_t C, ptrdiff_t d0,
                                            ptrdiff_t d1, ptrdiff_t h0, ptrdiff_t h1,
                                            ptrdiff_t w0, ptrdiff_t w1, int is_max,
                                            float inv) {
    ptrdiff_t c0, i, j, k;
    int v;
    for (c0 = 0; c0 < C; c0 += 32) {
        ptrdiff_t n = C - c0 < 32 ? C - c0 : 32;
        __m256i m[4];
        __m256 acc[4];
        int nv = (int)((n + 7) / 8);
        for (v = 0; v < nv; v++) {
            m[v] = cb_simd_mask8(n - 8 * v);
            acc[v] = is_max ? _mm256_maskload_ps(
                                  x + ((d0 * H + h0) * W + w0) * C + c0 + 8 * v, m[v])
                            : _mm256_setzero_ps();
        }
        for (i = d0; i < d1; i++)
            for (j = h0; j < h1; j++)
                for (k = w0; k < w1; k++) {
                    const float *p = x + ((i * H + j) * W + k) * C + c0;
                    for (v = 0; v < nv; v++) {
                        __m256 a = _mm256_maskload_ps(p + 8 * v, m[v]);
                        acc[v] = is_max ? _mm256_max_ps(a, acc[v]) : _mm256_add_ps(acc[v], a);
                    }
                }
        for (v = 0; v < nv; v++) {
            __m256 out = is_max ? acc[v] : _mm256_mul_ps(acc[v], _mm256_set1_ps(inv));
            _mm256_maskstore_ps(y + c0 + 8 * v, m[v], out);
        }
    }
}
#endif

static int cb_pool_window_f(const float *x, float *y, ptrdiff_t H, ptrdiff_t W, ptrdiff_t C,
                            ptrdiff_t d0, ptrdiff_t d1, ptrdiff_t h0, ptrdiff_t h1,
                            ptrdiff_t w0, ptrdiff_t w1, int is_max, float inv) {
#if CB_SIMD_AVX512
    if (cb_simd_has_avx512()) {
        cb_pool_window_512(x, y, H, W, C, d0, d1, h0, h1, w0, w1, is_max, inv);
        return 1;
    }
    if (cb_simd_has_avx2()) {
        cb_pool_window_256(x, y, H, W, C, d0, d1, h0, h1, w0, w1, is_max, inv);
        return 1;
    }
#endif
    (void)x; (void)y; (void)H; (void)W; (void)C; (void)d0; (void)d1; (void)h0; (void)h1;
    (void)w0; (void)w1; (void)is_max; (void)inv;
    return 0;
}

#endif
