/* Vectorisable activations for the fused recurrent cells (rnn_cell.pyx).
 *
 * libm's expf/tanhf are one call per element; a recurrent step spends most of
 * its element-wise time there. These loops are branch-free so that the
 * compiler turns them into SIMD code at -O3 without -ffast-math.
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

CB_FAST_EXPF(base, )
CB_ACT_ROW_F(base, )
#if CB_SIMD_AVX2
CB_FAST_EXPF(avx2, CB_AVX2_ATTR)
CB_ACT_ROW_F(avx2, CB_AVX2_ATTR)
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
