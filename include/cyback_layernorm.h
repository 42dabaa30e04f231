/* One float32 row of layer normalization (cyback/kernels/reduce.pyx,
 * _normalize_row) in AVX2: the same arithmetic in the same order as the
 * baseline loop, so the same bits. Its two sums keep 8 interleaved partial
 * sums (element i in lane i % 8, one ymm register), added lane by lane in
 * order, then the tail; every product and sum is rounded on its own: this
 * code is built for AVX2 without FMA, so that no multiply-add is contracted.
 * (A CYBACK_NATIVE=1 build lets the compiler contract the baseline loop's
 * multiply-add on an FMA CPU, and then the two differ in the last bits.)
 * Returns 0 where AVX2 does not run (the caller then takes its loop). */
#ifndef CYBACK_LAYERNORM_H
#define CYBACK_LAYERNORM_H

#include <math.h>
#include <stddef.h>

#include "cyback_simd.h"

#if CB_SIMD_AVX2
#include <immintrin.h>

__attribute__((target("avx2"))) static float cb_ln_lane_sum(const float *x, float shift,
                                                            int square, ptrdiff_t n) {
    __m256 part = _mm256_setzero_ps(), s = _mm256_set1_ps(shift);
    float lanes[8], total = 0.0f, v;
    ptrdiff_t i, whole = n - n % 8;
    int j;
    for (i = 0; i < whole; i += 8) {
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), s);
        part = _mm256_add_ps(part, square ? _mm256_mul_ps(d, d) : d);
    }
    _mm256_storeu_ps(lanes, part);
    for (j = 0; j < 8; j++) total = total + lanes[j];
    for (i = whole; i < n; i++) {
        v = x[i] - shift;
        total = total + (square ? v * v : v);
    }
    return total;
}

__attribute__((target("avx2"))) static void cb_ln_row_avx2(const float *x, float *y,
                                                           const float *gamma,
                                                           const float *beta, float eps,
                                                           ptrdiff_t n) {
    float mean = cb_ln_lane_sum(x, 0.0f, 0, n) / (float)n;
    float var = cb_ln_lane_sum(x, mean, 1, n) / (float)n;
    float inv = (float)(1.0 / sqrt((double)(var + eps)));
    __m256 m = _mm256_set1_ps(mean), iv = _mm256_set1_ps(inv);
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), m);
        __m256 scale = gamma ? _mm256_mul_ps(iv, _mm256_loadu_ps(gamma + i)) : iv;
        __m256 out = _mm256_mul_ps(d, scale);
        if (beta) out = _mm256_add_ps(out, _mm256_loadu_ps(beta + i));
        _mm256_storeu_ps(y + i, out);
    }
    for (; i < n; i++) {
        float out = (x[i] - mean) * (gamma ? inv * gamma[i] : inv);
        y[i] = beta ? out + beta[i] : out;
    }
}
#endif

static int cb_ln_row_f(const float *x, float *y, const float *gamma, const float *beta,
                       float eps, ptrdiff_t n) {
#if CB_SIMD_AVX2
    if (cb_simd_has_avx2()) {
        cb_ln_row_avx2(x, y, gamma, beta, eps, n);
        return 1;
    }
#endif
    (void)x; (void)y; (void)gamma; (void)beta; (void)eps; (void)n;
    return 0;
}

#endif
