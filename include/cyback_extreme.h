/* out[0:width] = the max (or min) over n rows (inner apart) of x[0:width],
 * float32, in AVX-512 or AVX2 registers (cyback/kernels/reduce.pyx,
 * _extreme_strip): up to 64 columns held down all the rows. The select is the
 * baseline loop's (a value replaces the best so far when it is greater, or
 * less, or NaN), so a NaN wins and the results are its bits. Returns 0 where
 * no vector set runs (the caller then takes its loop). */
#ifndef CYBACK_EXTREME_H
#define CYBACK_EXTREME_H

#include <stddef.h>

#include "cyback_simd.h"

#if CB_SIMD_AVX512
#include <immintrin.h>

CB_AVX512_ATTR static void cb_extreme_strip_512(const float *x, float *out, ptrdiff_t n,
                                                ptrdiff_t inner, ptrdiff_t width,
                                                int want_max) {
    ptrdiff_t j0, r;
    int v;
    for (j0 = 0; j0 < width; j0 += 64) {
        __mmask16 m[4];
        __m512 best[4];
        for (v = 0; v < 4; v++) {
            m[v] = cb_simd_mask16(width - j0 - 16 * v);
            best[v] = _mm512_maskz_loadu_ps(m[v], x + j0 + 16 * v);
        }
        for (r = 1; r < n; r++) {
            const float *row = x + r * inner + j0;
            for (v = 0; v < 4; v++) {
                __m512 a;
                __mmask16 take;
                if (!m[v]) break;
                a = _mm512_maskz_loadu_ps(m[v], row + 16 * v);
                take = want_max ? _mm512_cmp_ps_mask(a, best[v], _CMP_GT_OQ)
                                : _mm512_cmp_ps_mask(a, best[v], _CMP_LT_OQ);
                take |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
                best[v] = _mm512_mask_mov_ps(best[v], take, a);
            }
        }
        for (v = 0; v < 4 && m[v]; v++) _mm512_mask_storeu_ps(out + j0 + 16 * v, m[v], best[v]);
    }
}

CB_AVX2_ATTR static void cb_extreme_strip_256(const float *x, float *out, ptrdiff_t n,
                                              ptrdiff_t inner, ptrdiff_t width, int want_max) {
    ptrdiff_t j0, r;
    int v;
    for (j0 = 0; j0 < width; j0 += 32) {
        __m256i m[4];
        __m256 best[4];
        int nv = (int)((width - j0 < 32 ? width - j0 : 32) + 7) / 8;
        for (v = 0; v < nv; v++) {
            m[v] = cb_simd_mask8(width - j0 - 8 * v);
            best[v] = _mm256_maskload_ps(x + j0 + 8 * v, m[v]);
        }
        for (r = 1; r < n; r++) {
            const float *row = x + r * inner + j0;
            for (v = 0; v < nv; v++) {
                __m256 a = _mm256_maskload_ps(row + 8 * v, m[v]);
                __m256 take = want_max ? _mm256_cmp_ps(a, best[v], _CMP_GT_OQ)
                                       : _mm256_cmp_ps(a, best[v], _CMP_LT_OQ);
                take = _mm256_or_ps(take, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
                best[v] = _mm256_blendv_ps(best[v], a, take);
            }
        }
        for (v = 0; v < nv; v++) _mm256_maskstore_ps(out + j0 + 8 * v, m[v], best[v]);
    }
}
#endif

static int cb_extreme_strip_f(const float *x, float *out, ptrdiff_t n, ptrdiff_t inner,
                              ptrdiff_t width, int want_max) {
#if CB_SIMD_AVX512
    if (cb_simd_has_avx512()) {
        cb_extreme_strip_512(x, out, n, inner, width, want_max);
        return 1;
    }
    if (cb_simd_has_avx2()) {
        cb_extreme_strip_256(x, out, n, inner, width, want_max);
        return 1;
    }
#endif
    (void)x; (void)out; (void)n; (void)inner; (void)width; (void)want_max;
    return 0;
}

#endif
