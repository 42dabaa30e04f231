/* Vectorisable activations for the fused recurrent cells (rnn_cell.pyx).
 *
 * libm's expf/tanhf are one call per element; a recurrent step spends most of
 * its element-wise time there. These loops are branch-free so that the
 * compiler turns them into SIMD code at -O3 without -ffast-math; the AVX2
 * float rows are written with intrinsics (the same steps, bit for bit).
 *
 * exp(x): x = n ln2 + r with |r| <= ln2/2, exp(r) by its degree-6 Taylor
 * polynomial (relative error ~2e-7), 2^n written into the exponent bits;
 * saturates below exp(-87) and above exp(88).
 * sigmoid(x) = 1 / (1 + exp(-x)); tanh(x) = 2 sigmoid(2x) - 1 (absolute error
 * ~1e-7, i.e. relative error grows only where tanh itself is tiny).
 * Codes: 0 tanh, 1 sigmoid, 2 hard_sigmoid (clip(0.2x + 0.5, 0, 1)), 3 linear.
 */
#ifndef CYBACK_ACT_H
#define CYBACK_ACT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "cyback_simd.h"
#if CB_SIMD_AVX2
#include <immintrin.h>
#endif

/* The clamps are selects, not branches, only if the compiler may evaluate
 * both sides: allow that here (no floating-point traps are enabled anyway). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

/* One copy per instruction set: GCC inlines a function only into callers
 * compiled for the same target, and the loops vectorise only if it is. */
#define CB_FAST_EXPF(SUF, ATTR)                                                           \
ATTR static inline float cb_fast_expf_##SUF(float x) {                                    \
    x = x > 88.0f ? 88.0f : (x < -87.0f ? -87.0f : x);                                    \
    /* Round to nearest by adding 1.5 * 2^23: no call to rintf. */                        \
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;                     \
    float r = x - n * 0.693145751953125f - n * 1.42860682030941723e-6f;                   \
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666667f + r * (0.0416666667f +     \
              r * (0.00833333333f + r * 0.00138888889f)))));                              \
    int32_t bits = ((int32_t)n + 127) << 23;                                              \
    float scale;                                                                          \
    memcpy(&scale, &bits, sizeof scale);                                                  \
    return p * scale;                                                                     \
}

/* The float rows are compiled twice, for baseline x86-64 and for AVX2 + FMA
 * (8 lanes instead of 4), and picked at run time (cyback_simd.h): the gate
 * non-linearities are most of a recurrent step's element-wise time. */
#define CB_ACT_ROW_F(SUF, ATTR)                                                           \
ATTR static void cb_act_row_f_##SUF(float *p, ptrdiff_t n, int kind) {                    \
    ptrdiff_t j;                                                                          \
    if (kind == 0) {                                                                      \
        for (j = 0; j < n; j++) p[j] = 2.0f / (1.0f + cb_fast_expf_##SUF(-2.0f * p[j])) - 1.0f;  \
    } else if (kind == 1) {                                                               \
        for (j = 0; j < n; j++) p[j] = 1.0f / (1.0f + cb_fast_expf_##SUF(-p[j]));               \
    } else if (kind == 2) {                                                               \
        for (j = 0; j < n; j++) {                                                         \
            float v = 0.2f * p[j] + 0.5f;                                                 \
            p[j] = v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v);                               \
        }                                                                                 \
    }                                                                                     \
}

/* The gate non-linearities of a whole step: `rows` rows of `w` values, ld
 * apart, where lane j of every row is tanh or sigmoid as `lanes` says: three
 * runs of w values, the exponent's factor (-2 for tanh, -1 for sigmoid), the
 * numerator (2, 1) and the offset (1, 0), for num / (1 + exp(f * x)) - off.
 * Each lane gets exactly the operations of cb_act_row_f's tanh or sigmoid
 * (-1 * x is 0 - x, and subtracting 0 changes nothing), so the results are
 * those of one call per gate; but a step is one loop over its rows (a few
 * dozen units leave each gate's call a handful of vectors and a masked tail,
 * whose overhead then dominates a small layer's step). */
#define CB_ACT_LANES_F(SUF, ATTR)                                                         \
ATTR static void cb_act_lanes_f_##SUF(float *p, ptrdiff_t rows, ptrdiff_t w, ptrdiff_t ld, \
                                      const float *lanes) {                               \
    const float *f = lanes, *num = lanes + w, *off = lanes + 2 * w;                       \
    ptrdiff_t r, j;                                                                       \
    for (r = 0; r < rows; r++) {                                                          \
        float *q = p + r * ld;                                                            \
        for (j = 0; j < w; j++)                                                           \
            q[j] = num[j] / (1.0f + cb_fast_expf_##SUF(f[j] * q[j])) - off[j];            \
    }                                                                                     \
}

CB_FAST_EXPF(base, )
CB_ACT_ROW_F(base, )
CB_ACT_LANES_F(base, )
#if CB_SIMD_AVX2
CB_FAST_EXPF(avx2_tail, CB_AVX2_ATTR)
CB_ACT_ROW_F(avx2_tail, CB_AVX2_ATTR)

/* cb_fast_expf of 8 lanes, the same steps written with intrinsics: GCC's
 * vectorisation of the scalar loop clamps with compare-and-blend sequences and
 * spends a fifth more time per row. */
CB_AVX2_ATTR static inline __m256 cb_fast_exp8(__m256 x) {
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    __m256 n, r, p;
    __m256i bits;
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic), magic);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);
    p = _mm256_fmadd_ps(_mm256_set1_ps(0.00138888889f), r, _mm256_set1_ps(0.00833333333f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.0416666667f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.166666667f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)),
                             23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

CB_AVX2_ATTR static inline __m256 cb_act8(__m256 x, int kind) {
    const __m256 one = _mm256_set1_ps(1.0f);
    if (kind == 0) {
        __m256 e = cb_fast_exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), x));
        return _mm256_sub_ps(_mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(one, e)), one);
    }
    return _mm256_div_ps(one, _mm256_add_ps(one, cb_fast_exp8(_mm256_sub_ps(_mm256_setzero_ps(),
                                                                             x))));
}

/* tanh and sigmoid 8 lanes at a time, the last n % 8 values as one masked
 * vector rather than one at a time (rows of a few dozen units have a tail
 * in every gate); hard_sigmoid in the scalar loop. */
CB_AVX2_ATTR static void cb_act_row_f_avx2(float *p, ptrdiff_t n, int kind) {
    ptrdiff_t j = 0;
    if (kind == 0 || kind == 1) {
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(p + j, cb_act8(_mm256_loadu_ps(p + j), kind));
        if (j < n) {
            /* lanes below n - j: masked loads and stores touch no memory past p + n */
            const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), lanes);
            _mm256_maskstore_ps(p + j, m, cb_act8(_mm256_maskload_ps(p + j, m), kind));
        }
        return;
    }
    cb_act_row_f_avx2_tail(p, n, kind);
}

/* cb_act_lanes_f (above), 8 lanes at a time */
CB_AVX2_ATTR static void cb_act_lanes_f_avx2(float *p, ptrdiff_t rows, ptrdiff_t w,
                                             ptrdiff_t ld, const float *lanes) {
    const float *f = lanes, *num = lanes + w, *off = lanes + 2 * w;
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(w % 8)), idx);
    const ptrdiff_t wv = w - w % 8;
    ptrdiff_t r, j;
    for (r = 0; r < rows; r++) {
        float *q = p + r * ld;
        for (j = 0; j < wv; j += 8) {
            __m256 e = cb_fast_exp8(_mm256_mul_ps(_mm256_loadu_ps(f + j), _mm256_loadu_ps(q + j)));
            _mm256_storeu_ps(q + j, _mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(num + j),
                                                                _mm256_add_ps(one, e)),
                                                  _mm256_loadu_ps(off + j)));
        }
        if (wv < w) {
            __m256 e = cb_fast_exp8(_mm256_mul_ps(_mm256_maskload_ps(f + wv, tail),
                                                  _mm256_maskload_ps(q + wv, tail)));
            _mm256_maskstore_ps(q + wv, tail,
                                _mm256_sub_ps(_mm256_div_ps(_mm256_maskload_ps(num + wv, tail),
                                                            _mm256_add_ps(one, e)),
                                              _mm256_maskload_ps(off + wv, tail)));
        }
    }
}
#endif

static inline void cb_act_row_f(float *p, ptrdiff_t n, int kind) {
#if CB_SIMD_AVX2
    if (cb_simd_has_avx2()) {
        cb_act_row_f_avx2(p, n, kind);
        return;
    }
#endif
    cb_act_row_f_base(p, n, kind);
}

static inline void cb_act_lanes_f(float *p, ptrdiff_t rows, ptrdiff_t w, ptrdiff_t ld,
                                  const float *lanes) {
#if CB_SIMD_AVX2
    if (cb_simd_has_avx2()) {
        cb_act_lanes_f_avx2(p, rows, w, ld, lanes);
        return;
    }
#endif
    cb_act_lanes_f_base(p, rows, w, ld, lanes);
}

static inline void cb_act_row_d(double *p, ptrdiff_t n, int kind) {
    ptrdiff_t j;
    if (kind == 0) {
        for (j = 0; j < n; j++) p[j] = tanh(p[j]);
    } else if (kind == 1) {
        /* through tanh: no overflow of exp(-x) for large negative x */
        for (j = 0; j < n; j++) p[j] = 0.5 + 0.5 * tanh(0.5 * p[j]);
    } else if (kind == 2) {
        for (j = 0; j < n; j++) {
            double v = 0.2 * p[j] + 0.5;
            p[j] = v < 0.0 ? 0.0 : (v > 1.0 ? 1.0 : v);
        }
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#endif
