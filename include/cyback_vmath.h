/* Vectorised float32 exp, tanh, sigmoid and erf over rows, and the pieces of
 * a softmax row, for softmax.pyx and ewise.pyx.
 *
 * libm's expf / tanhf / erff are one call per element and stop the compiler
 * from vectorising the loops around them. Here each function is one set of
 * branch-free vector operations (cyback_vmath_body.h: the approximations and
 * their error bounds), compiled three times: AVX-512F (16 lanes), AVX2 + FMA
 * (8 lanes) and baseline scalar code, picked per call with cyback_simd.h's
 * run-time switch (never -march=native). Tails are masked loads and stores
 * of the same vector code, so an element's result does not depend on where it
 * falls in a row, on the row's length or on the thread count; the AVX-512 and
 * AVX2 sets do the same fused operations and give the same bits. The scalar
 * set does the same operations in the same order, fused only where the
 * compiler targets FMA (elsewhere a product and a sum, each rounded: the same
 * error bounds, possibly another last bit).
 *
 * Row functions (x and y may be the same array):
 *   cb_vm_exp_f(x, y, n), cb_vm_tanh_f, cb_vm_sigmoid_f, cb_vm_erf_f
 *   cb_vm_softmax_row_f(x, y, n): y = exp(x - max) / sum, NaN anywhere gives
 *     a NaN row, a row of -inf is shifted by 0 (then 0 / 0 = NaN, as NumPy).
 * float64 callers keep libm.
 */
#ifndef CYBACK_VMATH_H
#define CYBACK_VMATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "cyback_simd.h"
#if CB_SIMD_AVX2
#include <immintrin.h>
#endif

/* Coefficients: the output of tools/fit_vmath.py. */
#define CB_VM_TANH_SMALL 6.250000000e-01f
#define CB_VM_ERF_SMALL 9.218750000e-01f
#define CB_VM_ERF_MID 2.460937500e+00f
/* exp: max error 3.18e-09 (float64 arithmetic, float32 coefficients) */
#define CB_VM_EXP_C0 4.999999404e-01f
#define CB_VM_EXP_C1 1.666652113e-01f
#define CB_VM_EXP_C2 4.166829214e-02f
#define CB_VM_EXP_C3 8.368703537e-03f
#define CB_VM_EXP_C4 1.381854294e-03f
/* tanh: max error 1.78e-10 (float64 arithmetic, float32 coefficients) */
#define CB_VM_TANH_C0 -3.333333135e-01f
#define CB_VM_TANH_C1 1.333322078e-01f
#define CB_VM_TANH_C2 -5.394817889e-02f
#define CB_VM_TANH_C3 2.170689404e-02f
#define CB_VM_TANH_C4 -8.190012537e-03f
#define CB_VM_TANH_C5 2.152681118e-03f
#define CB_VM_ERF_HI 1.128379226e+00f
#define CB_VM_ERF_LO -5.863538277e-08f
/* erf_small: max error 1.74e-08 (float64 arithmetic, float32 coefficients) */
#define CB_VM_ERF_SMALL_C0 -3.761253655e-01f
#define CB_VM_ERF_SMALL_C1 1.128210053e-01f
#define CB_VM_ERF_SMALL_C2 -2.677425928e-02f
#define CB_VM_ERF_SMALL_C3 5.002147518e-03f
#define CB_VM_ERF_SMALL_C4 -6.029085489e-04f
/* erf_tail: max error 8.21e-10 (float64 arithmetic, float32 coefficients) */
#define CB_VM_ERF_TAIL_C0 2.137490213e-01f
#define CB_VM_ERF_TAIL_C1 -7.633592933e-02f
#define CB_VM_ERF_TAIL_C2 2.588727139e-02f
#define CB_VM_ERF_TAIL_C3 -8.393099532e-03f
#define CB_VM_ERF_TAIL_C4 2.693204209e-03f
#define CB_VM_ERF_TAIL_C5 -6.739626406e-04f
#define CB_VM_ERF_TAIL_C6 2.345161774e-04f
#define CB_VM_ERF_TAIL_C7 -1.722143206e-04f
#define CB_VM_ERF_TAIL_C8 -7.799328887e-05f
#define CB_VM_ERF_TAIL_C9 -3.389929407e-05f

/* ------------------------------------------------------------ baseline set */

static inline float cb_vm_s_fma(float a, float b, float c) {
#if defined(__FMA__)
    return fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

/* min and max as x86 computes them: a NaN first operand gives the second. */
static inline float cb_vm_s_min(float a, float b) { return a < b ? a : b; }
static inline float cb_vm_s_max(float a, float b) { return a > b ? a : b; }

static inline float cb_vm_s_withsign(float y, float x) {
    uint32_t uy, ux;
    memcpy(&uy, &y, sizeof uy);
    memcpy(&ux, &x, sizeof ux);
    uy |= ux & 0x80000000u;
    memcpy(&y, &uy, sizeof y);
    return y;
}

static inline float cb_vm_s_scale2(float p, float t) {
    uint32_t ut;
    int32_t n, n1, n2;
    float s1, s2;
    memcpy(&ut, &t, sizeof ut);
    n = (int32_t)(ut - 0x4B400000u);
    n1 = n / 2;
    n2 = n - n1;
    ut = (uint32_t)(n1 + 127) << 23;
    memcpy(&s1, &ut, sizeof s1);
    ut = (uint32_t)(n2 + 127) << 23;
    memcpy(&s2, &ut, sizeof s2);
    return p * s1 * s2;
}

#define CB_VM_FN(name) cb_vm_##name##_s
#define CB_VM_ATTR
#define V float
#define VF(c) (c)
#define ADD(a, b) ((a) + (b))
#define SUB(a, b) ((a) - (b))
#define MUL(a, b) ((a) * (b))
#define DIV(a, b) ((a) / (b))
#define FMA(a, b, c) cb_vm_s_fma(a, b, c)
#define FNMA(a, b, c) cb_vm_s_fma(-(a), b, c)
#define MIN(a, b) cb_vm_s_min(a, b)
#define MAX(a, b) cb_vm_s_max(a, b)
#define ABS(x) fabsf(x)
#define WITHSIGN(y, x) cb_vm_s_withsign(y, x)
#define LT(a, b) ((a) < (b))
#define ISNAN(x) ((x) != (x))
#define SEL(m, a, b) ((m) ? (a) : (b))
#define SCALE2(p, t) cb_vm_s_scale2(p, t)
#include "cyback_vmath_body.h"
#include "cyback_vmath_end.h"

#if CB_SIMD_AVX2
/* ---------------------------------------------------------------- AVX2 set */

CB_AVX2_ATTR static inline __m256 cb_vm_avx2_scale2(__m256 p, __m256 t) {
    __m256i n = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000));
    __m256i n1 = _mm256_srai_epi32(_mm256_add_epi32(n, _mm256_srli_epi32(n, 31)), 1);
    __m256i n2 = _mm256_sub_epi32(n, n1);
    __m256i b = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, b), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, b), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

#define CB_VM_FN(name) cb_vm_##name##_avx2
#define CB_VM_ATTR CB_AVX2_ATTR
#define V __m256
#define VF(c) _mm256_set1_ps(c)
#define ADD _mm256_add_ps
#define SUB _mm256_sub_ps
#define MUL _mm256_mul_ps
#define DIV _mm256_div_ps
#define FMA _mm256_fmadd_ps
#define FNMA _mm256_fnmadd_ps
#define MIN _mm256_min_ps
#define MAX _mm256_max_ps
#define ABS(x) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x)
#define WITHSIGN(y, x) _mm256_or_ps(y, _mm256_and_ps(x, _mm256_set1_ps(-0.0f)))
#define LT(a, b) _mm256_cmp_ps(a, b, _CMP_LT_OQ)
#define ISNAN(x) _mm256_cmp_ps(x, x, _CMP_UNORD_Q)
#define SEL(m, a, b) _mm256_blendv_ps(b, a, m)
#define SCALE2 cb_vm_avx2_scale2
#include "cyback_vmath_body.h"
#include "cyback_vmath_end.h"

/* ------------------------------------------------------------- AVX-512 set */

CB_AVX512_ATTR static inline __m512 cb_vm_avx512_scale2(__m512 p, __m512 t) {
    __m512i n = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000));
    __m512i n1 = _mm512_srai_epi32(_mm512_add_epi32(n, _mm512_srli_epi32(n, 31)), 1);
    __m512i n2 = _mm512_sub_epi32(n, n1);
    __m512i b = _mm512_set1_epi32(127);
    __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, b), 23));
    __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, b), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

CB_AVX512_ATTR static inline __m512 cb_vm_avx512_withsign(__m512 y, __m512 x) {
    __m512i s = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y), s));
}

#define CB_VM_FN(name) cb_vm_##name##_avx512
#define CB_VM_ATTR CB_AVX512_ATTR
#define V __m512
#define VF(c) _mm512_set1_ps(c)
#define ADD _mm512_add_ps
#define SUB _mm512_sub_ps
#define MUL _mm512_mul_ps
#define DIV _mm512_div_ps
#define FMA _mm512_fmadd_ps
#define FNMA _mm512_fnmadd_ps
#define MIN _mm512_min_ps
#define MAX _mm512_max_ps
#define ABS _mm512_abs_ps
#define WITHSIGN cb_vm_avx512_withsign
#define LT(a, b) _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)
#define ISNAN(x) _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q)
#define SEL(m, a, b) _mm512_mask_blend_ps(m, b, a)
#define SCALE2 cb_vm_avx512_scale2
#include "cyback_vmath_body.h"
#include "cyback_vmath_end.h"
#endif  /* CB_SIMD_AVX2 */

/* ------------------------------------------------------ element-wise rows */

/* y[i] = f(x[i]) for i < n, per set, and the entry point picking the set. */
#if CB_SIMD_AVX2
#define CB_VM_ROW(name)                                                                   \
CB_AVX512_ATTR static void cb_vm_##name##_row_avx512(const float* x, float* y,            \
                                                      ptrdiff_t n) {                      \
    ptrdiff_t i = 0;                                                                      \
    for (; i + 16 <= n; i += 16)                                                          \
        _mm512_storeu_ps(y + i, cb_vm_##name##_avx512(_mm512_loadu_ps(x + i)));           \
    if (i < n) {                                                                          \
        __mmask16 m = cb_simd_mask16(n - i);                                           \
        _mm512_mask_storeu_ps(y + i, m,                                                   \
                              cb_vm_##name##_avx512(_mm512_maskz_loadu_ps(m, x + i)));    \
    }                                                                                     \
}                                                                                         \
CB_AVX2_ATTR static void cb_vm_##name##_row_avx2(const float* x, float* y, ptrdiff_t n) { \
    ptrdiff_t i = 0;                                                                      \
    for (; i + 8 <= n; i += 8)                                                            \
        _mm256_storeu_ps(y + i, cb_vm_##name##_avx2(_mm256_loadu_ps(x + i)));             \
    if (i < n) {                                                                          \
        __m256i m = cb_simd_mask8(n - i);                                               \
        _mm256_maskstore_ps(y + i, m, cb_vm_##name##_avx2(_mm256_maskload_ps(x + i, m))); \
    }                                                                                     \
}                                                                                         \
static void cb_vm_##name##_f(const float* x, float* y, ptrdiff_t n) {                     \
    ptrdiff_t i;                                                                          \
    if (cb_simd_has_avx512()) {                                                           \
        cb_vm_##name##_row_avx512(x, y, n);                                               \
        return;                                                                           \
    }                                                                                     \
    if (cb_simd_has_avx2()) {                                                             \
        cb_vm_##name##_row_avx2(x, y, n);                                                 \
        return;                                                                           \
    }                                                                                     \
    for (i = 0; i < n; i++) y[i] = cb_vm_##name##_s(x[i]);                                \
}
#else
#define CB_VM_ROW(name)                                                                   \
static void cb_vm_##name##_f(const float* x, float* y, ptrdiff_t n) {                     \
    ptrdiff_t i;                                                                          \
    for (i = 0; i < n; i++) y[i] = cb_vm_##name##_s(x[i]);                                \
}
#endif

CB_VM_ROW(exp)
CB_VM_ROW(tanh)
CB_VM_ROW(sigmoid)
CB_VM_ROW(erf)
#undef CB_VM_ROW

/* ------------------------------------------------------------ softmax rows */

/* The three passes of a softmax row, per set: the row maximum (and whether
 * the row holds a NaN: a flag, not a break, so the pass vectorises),
 * y = exp(x - m) and its sum, y *= c. The sum has 16 partial sums whatever
 * the set (element i goes to sum i % 16; AVX2 keeps two 8-lane ones), added
 * in one fixed tree: the sets give the same bits. */

static float cb_vm_rowmax_s(const float* x, ptrdiff_t n, int* nan) {
    float m = -INFINITY, v;
    int seen = 0;
    ptrdiff_t i;
    for (i = 0; i < n; i++) {
        v = x[i];
        seen |= v != v;
        m = v > m ? v : m;
    }
    *nan = seen;
    return m;
}

static float cb_vm_expsum_s(const float* x, float* y, ptrdiff_t n, float m) {
    float acc[16] = {0};
    float e;
    ptrdiff_t i;
    int j;
    for (i = 0; i < n; i++) {
        e = cb_vm_exp_s(x[i] - m);
        y[i] = e;
        acc[i & 15] += e;
    }
    for (j = 0; j < 8; j++) acc[j] += acc[j + 8];
    for (j = 0; j < 4; j++) acc[j] += acc[j + 4];
    for (j = 0; j < 2; j++) acc[j] += acc[j + 2];
    return acc[0] + acc[1];
}

static void cb_vm_scale_s(float* y, ptrdiff_t n, float c) {
    ptrdiff_t i;
    for (i = 0; i < n; i++) y[i] *= c;
}

#if CB_SIMD_AVX2
/* The fixed tree of the sum's last 8 lanes: lanes j + j+4, then j + j+2, then 0 + 1. */
CB_AVX2_ATTR static inline float cb_vm_avx2_sum8(__m256 s8) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

CB_AVX2_ATTR static float cb_vm_rowmax_avx2(const float* x, ptrdiff_t n, int* nan) {
    __m256 m = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps(), v;
    __m128 h;
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v = _mm256_loadu_ps(x + i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
    }
    if (i < n) {
        __m256i t = cb_simd_mask8(n - i);
        v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(x + i, t),
                             _mm256_castsi256_ps(t));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
    }
    *nan = _mm256_movemask_ps(bad) != 0;
    h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

CB_AVX2_ATTR static float cb_vm_expsum_avx2(const float* x, float* y, ptrdiff_t n, float m) {
    __m256 mv = _mm256_set1_ps(m), acc0 = _mm256_setzero_ps(), acc1 = acc0, e;
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
        e = cb_vm_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(y + i, e);
        acc0 = _mm256_add_ps(acc0, e);
        e = cb_vm_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv));
        _mm256_storeu_ps(y + i + 8, e);
        acc1 = _mm256_add_ps(acc1, e);
    }
    if (i + 8 <= n) {
        e = cb_vm_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(y + i, e);
        acc0 = _mm256_add_ps(acc0, e);
        i += 8;
        if (i < n) {
            __m256i t = cb_simd_mask8(n - i);
            e = cb_vm_exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(x + i, t), mv));
            _mm256_maskstore_ps(y + i, t, e);
            acc1 = _mm256_add_ps(acc1, _mm256_and_ps(e, _mm256_castsi256_ps(t)));
        }
    } else if (i < n) {
        __m256i t = cb_simd_mask8(n - i);
        e = cb_vm_exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(x + i, t), mv));
        _mm256_maskstore_ps(y + i, t, e);
        acc0 = _mm256_add_ps(acc0, _mm256_and_ps(e, _mm256_castsi256_ps(t)));
    }
    return cb_vm_avx2_sum8(_mm256_add_ps(acc0, acc1));
}

CB_AVX2_ATTR static void cb_vm_scale_avx2(float* y, ptrdiff_t n, float c) {
    __m256 cv = _mm256_set1_ps(c);
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), cv));
    if (i < n) {
        __m256i t = cb_simd_mask8(n - i);
        _mm256_maskstore_ps(y + i, t, _mm256_mul_ps(_mm256_maskload_ps(y + i, t), cv));
    }
}

CB_AVX512_ATTR static float cb_vm_rowmax_avx512(const float* x, ptrdiff_t n, int* nan) {
    __m512 m = _mm512_set1_ps(-INFINITY), v;
    __mmask16 bad = 0;
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v = _mm512_loadu_ps(x + i);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, v);
    }
    if (i < n) {
        __mmask16 t = cb_simd_mask16(n - i);
        v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), t, x + i);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, v);
    }
    *nan = bad != 0;
    return _mm512_reduce_max_ps(m);
}

CB_AVX512_ATTR static float cb_vm_expsum_avx512(const float* x, float* y, ptrdiff_t n,
                                                 float m) {
    __m512 mv = _mm512_set1_ps(m), acc = _mm512_setzero_ps(), e;
    __m256 lo, hi;
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
        e = cb_vm_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        _mm512_storeu_ps(y + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        __mmask16 t = cb_simd_mask16(n - i);
        e = cb_vm_exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + i), mv));
        _mm512_mask_storeu_ps(y + i, t, e);
        acc = _mm512_mask_add_ps(acc, t, acc, e);
    }
    lo = _mm512_castps512_ps256(acc);
    hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    return cb_vm_avx2_sum8(_mm256_add_ps(lo, hi));
}

CB_AVX512_ATTR static void cb_vm_scale_avx512(float* y, ptrdiff_t n, float c) {
    __m512 cv = _mm512_set1_ps(c);
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), cv));
    if (i < n) {
        __mmask16 t = cb_simd_mask16(n - i);
        _mm512_mask_storeu_ps(y + i, t, _mm512_mul_ps(_mm512_maskz_loadu_ps(t, y + i), cv));
    }
}
#endif  /* CB_SIMD_AVX2 */

/* One softmax row (n >= 1): the row's maximum m (0 when it is -inf, so that
 * a row of -inf gives 0 / 0 rather than inf - inf), y = exp(x - m), then y
 * divided by its sum (times its reciprocal). A NaN anywhere: a row of NaN. */
static void cb_vm_softmax_row_f(const float* x, float* y, ptrdiff_t n) {
    int nan = 0, level = 0;
    ptrdiff_t i;
    float m, s;
#if CB_SIMD_AVX2
    level = cb_simd_has_avx512() ? 2 : cb_simd_has_avx2();
    if (level == 2)
        m = cb_vm_rowmax_avx512(x, n, &nan);
    else if (level == 1)
        m = cb_vm_rowmax_avx2(x, n, &nan);
    else
#endif
        m = cb_vm_rowmax_s(x, n, &nan);
    if (nan) {
        for (i = 0; i < n; i++) y[i] = NAN;
        return;
    }
    if (m == -INFINITY) m = 0.0f;
#if CB_SIMD_AVX2
    if (level == 2) {
        s = cb_vm_expsum_avx512(x, y, n, m);
        cb_vm_scale_avx512(y, n, 1.0f / s);
        return;
    }
    if (level == 1) {
        s = cb_vm_expsum_avx2(x, y, n, m);
        cb_vm_scale_avx2(y, n, 1.0f / s);
        return;
    }
#endif
    s = cb_vm_expsum_s(x, y, n, m);
    cb_vm_scale_s(y, n, 1.0f / s);
}

#endif
