/* The exact opcodes of an element-wise program (cyback/kernels/ewise.pyx:
 * add .. copy, the ones NumPy's ufuncs give the same bits for) over a block,
 * on 64-byte vectors (AVX-512F) or 32-byte ones (AVX2), picked at run time
 * with cyback_simd.h's switch. The wheels are built for baseline x86-64,
 * where the program's plain loops vectorise to 16-byte SSE2 vectors: a
 * quarter of an AVX-512 core's width on every instruction of every program
 * (a BatchNorm + ReLU, a GELU's arithmetic). Each opcode is one IEEE
 * operation per element, as in the plain loops, so every set gives the same
 * bits; maximum and minimum keep np.maximum's NaN rule (a NaN on either side
 * wins, the first one's if both are NaN) and its -0 / +0 choice (the first
 * operand when they compare equal).
 *
 * cb_ew_step_f / cb_ew_step_d return how many leading elements they did (a
 * multiple of the vector width; 0 for other opcodes or without AVX2): the
 * caller's plain loop does the rest. The opcode numbers are ewise.pyx's. */
#ifndef CYBACK_EWISE_STEP_H
#define CYBACK_EWISE_STEP_H

#include <stddef.h>
#include "cyback_simd.h"

enum {
    CB_EW_ADD, CB_EW_SUB, CB_EW_MUL, CB_EW_DIV, CB_EW_MAX, CB_EW_MIN, CB_EW_NEG, CB_EW_ABS,
    CB_EW_SQUARE, CB_EW_SQRT, CB_EW_EXP, CB_EW_EXPM1, CB_EW_LOG, CB_EW_LOG1P, CB_EW_TANH,
    CB_EW_SIGMOID, CB_EW_SOFTPLUS, CB_EW_SOFTSIGN, CB_EW_RECIP, CB_EW_SELECT_GT,
    CB_EW_SELECT_GE, CB_EW_COPY
};

#if CB_SIMD_AVX2
#include <immintrin.h>

/* One set's step: T the element type, W the lanes, the rest its intrinsics.
 * MAXOP(x, y) is x > y ? x : y (y when either is NaN); the blend puts the
 * second operand's NaN back where only it is NaN. */
#define CB_EW_STEP_SET(NAME, ATTR, T, VT, W, LD, ST, SET1, ADDI, SUBI, MULI, DIVI, SQRTI,   \
                       MAXI, MINI, ANDN, XOR, NANSECOND, GTSEL, GESEL)                       \
    ATTR static ptrdiff_t NAME(int op, T *d, const T *a, const T *b, const T *c,            \
                               const T *e, ptrdiff_t n) {                                   \
        const ptrdiff_t end = n - n % (W);                                                  \
        const VT sign = SET1((T)-0.0), one = SET1((T)1);                                    \
        ptrdiff_t i;                                                                        \
        switch (op) {                                                                       \
        case CB_EW_ADD:                                                                     \
            for (i = 0; i < end; i += W) ST(d + i, ADDI(LD(a + i), LD(b + i)));             \
            return end;                                                                     \
        case CB_EW_SUB:                                                                     \
            for (i = 0; i < end; i += W) ST(d + i, SUBI(LD(a + i), LD(b + i)));             \
            return end;                                                                     \
        case CB_EW_MUL:                                                                     \
            for (i = 0; i < end; i += W) ST(d + i, MULI(LD(a + i), LD(b + i)));             \
            return end;                                                                     \
        case CB_EW_DIV:                                                                     \
            for (i = 0; i < end; i += W) ST(d + i, DIVI(LD(a + i), LD(b + i)));             \
            return end;                                                                     \
        case CB_EW_MAX:                                                                     \
            for (i = 0; i < end; i += W) {                                                  \
                const VT u = LD(a + i), v = LD(b + i);                                      \
                ST(d + i, NANSECOND(MAXI(v, u), u, v));                                     \
            }                                                                               \
            return end;                                                                     \
        case CB_EW_MIN:                                                                     \
            for (i = 0; i < end; i += W) {                                                  \
                const VT u = LD(a + i), v = LD(b + i);                                      \
                ST(d + i, NANSECOND(MINI(v, u), u, v));                                     \
            }                                                                               \
            return end;                                                                     \
        case CB_EW_NEG:                                                                     \
            for (i = 0; i < end; i += W) ST(d + i, XOR(LD(a + i), sign));                   \
            return end;                                                                     \
        case CB_EW_ABS:                                                                     \
            for (i = 0; i < end; i += W) ST(d + i, ANDN(sign, LD(a + i)));                  \
            return end;                                                                     \
        case CB_EW_SQUARE:                                                                  \
            for (i = 0; i < end; i += W) {                                                  \
                const VT u = LD(a + i);                                                     \
                ST(d + i, MULI(u, u));                                                      \
            }                                                                               \
            return end;                                                                     \
        case CB_EW_SQRT:                                                                    \
            for (i = 0; i < end; i += W) ST(d + i, SQRTI(LD(a + i)));                       \
            return end;                                                                     \
        case CB_EW_RECIP:                                                                   \
            for (i = 0; i < end; i += W) ST(d + i, DIVI(one, LD(a + i)));                   \
            return end;                                                                     \
        case CB_EW_SELECT_GT:                                                               \
            for (i = 0; i < end; i += W)                                                    \
                ST(d + i, GTSEL(LD(a + i), LD(b + i), LD(c + i), LD(e + i)));               \
            return end;                                                                     \
        case CB_EW_SELECT_GE:                                                               \
            for (i = 0; i < end; i += W)                                                    \
                ST(d + i, GESEL(LD(a + i), LD(b + i), LD(c + i), LD(e + i)));               \
            return end;                                                                     \
        case CB_EW_COPY:                                                                    \
            for (i = 0; i < end; i += W) ST(d + i, LD(a + i));                              \
            return end;                                                                     \
        default:                                                                            \
            return 0;                                                                       \
        }                                                                                   \
    }

/* ---- AVX-512F ---- */
#define CB_EW_NAN2_PS512(m, u, v)                                                           \
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) &                          \
                             _mm512_cmp_ps_mask(u, u, _CMP_ORD_Q), m, v)
#define CB_EW_NAN2_PD512(m, u, v)                                                           \
    _mm512_mask_blend_pd(_mm512_cmp_pd_mask(v, v, _CMP_UNORD_Q) &                          \
                             _mm512_cmp_pd_mask(u, u, _CMP_ORD_Q), m, v)
#define CB_EW_GT_PS512(a, b, c, e) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), e, c)
#define CB_EW_GE_PS512(a, b, c, e) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GE_OQ), e, c)
#define CB_EW_GT_PD512(a, b, c, e) _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, b, _CMP_GT_OQ), e, c)
#define CB_EW_GE_PD512(a, b, c, e) _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, b, _CMP_GE_OQ), e, c)
#define CB_EW_ANDN_PS512(s, x) \
    _mm512_castsi512_ps(_mm512_andnot_si512(_mm512_castps_si512(s), _mm512_castps_si512(x)))
#define CB_EW_XOR_PS512(x, s) \
    _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_castps_si512(s)))
#define CB_EW_ANDN_PD512(s, x) \
    _mm512_castsi512_pd(_mm512_andnot_si512(_mm512_castpd_si512(s), _mm512_castpd_si512(x)))
#define CB_EW_XOR_PD512(x, s) \
    _mm512_castsi512_pd(_mm512_xor_si512(_mm512_castpd_si512(x), _mm512_castpd_si512(s)))

CB_EW_STEP_SET(cb_ew_step_f_512, CB_AVX512_ATTR, float, __m512, 16, _mm512_loadu_ps,
               _mm512_storeu_ps, _mm512_set1_ps, _mm512_add_ps, _mm512_sub_ps, _mm512_mul_ps,
               _mm512_div_ps, _mm512_sqrt_ps, _mm512_max_ps, _mm512_min_ps, CB_EW_ANDN_PS512,
               CB_EW_XOR_PS512, CB_EW_NAN2_PS512, CB_EW_GT_PS512, CB_EW_GE_PS512)
CB_EW_STEP_SET(cb_ew_step_d_512, CB_AVX512_ATTR, double, __m512d, 8, _mm512_loadu_pd,
               _mm512_storeu_pd, _mm512_set1_pd, _mm512_add_pd, _mm512_sub_pd, _mm512_mul_pd,
               _mm512_div_pd, _mm512_sqrt_pd, _mm512_max_pd, _mm512_min_pd, CB_EW_ANDN_PD512,
               CB_EW_XOR_PD512, CB_EW_NAN2_PD512, CB_EW_GT_PD512, CB_EW_GE_PD512)

/* ---- AVX2 ---- */
#define CB_EW_NAN2_PS256(m, u, v)                                                           \
    _mm256_blendv_ps(m, v, _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q),                \
                                         _mm256_cmp_ps(u, u, _CMP_ORD_Q)))
#define CB_EW_NAN2_PD256(m, u, v)                                                           \
    _mm256_blendv_pd(m, v, _mm256_and_pd(_mm256_cmp_pd(v, v, _CMP_UNORD_Q),                \
                                         _mm256_cmp_pd(u, u, _CMP_ORD_Q)))
#define CB_EW_GT_PS256(a, b, c, e) _mm256_blendv_ps(e, c, _mm256_cmp_ps(a, b, _CMP_GT_OQ))
#define CB_EW_GE_PS256(a, b, c, e) _mm256_blendv_ps(e, c, _mm256_cmp_ps(a, b, _CMP_GE_OQ))
#define CB_EW_GT_PD256(a, b, c, e) _mm256_blendv_pd(e, c, _mm256_cmp_pd(a, b, _CMP_GT_OQ))
#define CB_EW_GE_PD256(a, b, c, e) _mm256_blendv_pd(e, c, _mm256_cmp_pd(a, b, _CMP_GE_OQ))

CB_EW_STEP_SET(cb_ew_step_f_256, CB_AVX2_ATTR, float, __m256, 8, _mm256_loadu_ps,
               _mm256_storeu_ps, _mm256_set1_ps, _mm256_add_ps, _mm256_sub_ps, _mm256_mul_ps,
               _mm256_div_ps, _mm256_sqrt_ps, _mm256_max_ps, _mm256_min_ps, _mm256_andnot_ps,
               _mm256_xor_ps, CB_EW_NAN2_PS256, CB_EW_GT_PS256, CB_EW_GE_PS256)
CB_EW_STEP_SET(cb_ew_step_d_256, CB_AVX2_ATTR, double, __m256d, 4, _mm256_loadu_pd,
               _mm256_storeu_pd, _mm256_set1_pd, _mm256_add_pd, _mm256_sub_pd, _mm256_mul_pd,
               _mm256_div_pd, _mm256_sqrt_pd, _mm256_max_pd, _mm256_min_pd, _mm256_andnot_pd,
               _mm256_xor_pd, CB_EW_NAN2_PD256, CB_EW_GT_PD256, CB_EW_GE_PD256)
#endif

static ptrdiff_t cb_ew_step_f(int op, float *d, const float *a, const float *b,
                              const float *c, const float *e, ptrdiff_t n) {
#if CB_SIMD_AVX2
    if (cb_simd_has_avx512()) return cb_ew_step_f_512(op, d, a, b, c, e, n);
    if (cb_simd_has_avx2()) return cb_ew_step_f_256(op, d, a, b, c, e, n);
#endif
    (void)op; (void)d; (void)a; (void)b; (void)c; (void)e; (void)n;
    return 0;
}

static ptrdiff_t cb_ew_step_d(int op, double *d, const double *a, const double *b,
                              const double *c, const double *e, ptrdiff_t n) {
#if CB_SIMD_AVX2
    if (cb_simd_has_avx512()) return cb_ew_step_d_512(op, d, a, b, c, e, n);
    if (cb_simd_has_avx2()) return cb_ew_step_d_256(op, d, a, b, c, e, n);
#endif
    (void)op; (void)d; (void)a; (void)b; (void)c; (void)e; (void)n;
    return 0;
}

#endif
