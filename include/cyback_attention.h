/* The two small float32 products of one attention block (cyback/kernels/
 * attention.pyx): scores = q k^T and out = p v, for a head's few dozen rows.
 *
 * BLAS packs both operands of every call, which at these sizes (64 x 64 x 32
 * for a head of 64 positions) costs about as much as the multiply-adds; here
 * k is transposed once into a scratch block and the tiles (4 rows x up to 64
 * columns in AVX-512 registers, 32 in AVX2) read the operands in place. Each
 * output sums its products in order over the inner axis, on one thread, so a
 * result does not depend on the thread count.
 *
 *   cb_att_scores_f(q, qt, k, ks, n, S, D, kt, scores): scores (n x S, rows S
 *     apart) = q (n x D, rows qt apart) k^T (k: S x D, rows ks apart); kt is
 *     scratch of D * round_up(S, 16) floats.
 *   cb_att_values_f(p, n, S, v, vs, Dv, out, ldo): out (n x Dv, rows ldo
 *     apart) = p (n x S, rows S apart) v (S x Dv, rows vs apart).
 * Both return 0 where no vector set runs (the caller then takes BLAS). */
#ifndef CYBACK_ATTENTION_H
#define CYBACK_ATTENTION_H

#include <stddef.h>

#include "cyback_simd.h"

#define CB_ATT_PAD(n) (((n) + 15) / 16 * 16)

/* Every row of one column strip through TILE: 4 rows at a time, then one;
 * nv (1-4) vectors of columns, a constant in each case of the switch. */
#define CB_ATT_TILE_NV(TILE, ROWS)                                                       \
    switch (nv) {                                                                        \
    case 1: TILE(ROWS, 1); break;                                                        \
    case 2: TILE(ROWS, 2); break;                                                        \
    case 3: TILE(ROWS, 3); break;                                                        \
    default: TILE(ROWS, 4); break;                                                       \
    }
#define CB_ATT_ROWS(TILE)                                                                \
    do {                                                                                 \
        for (i = 0; i + 4 <= rows; i += 4) CB_ATT_TILE_NV(TILE, 4)                       \
        for (; i < rows; i++) CB_ATT_TILE_NV(TILE, 1)                                    \
    } while (0)

#if CB_SIMD_AVX512
#include <immintrin.h>

/* 4 rows (or 1) of c's columns [j0, j0 + 16 NV): NV a constant at each call,
 * so that the accumulators stay in registers */
#define CB_ATT_TILE_512(ROWS, NV)                                                        \
    do {                                                                                 \
        __m512 acc[ROWS][NV];                                                            \
        int r_, v_;                                                                      \
        ptrdiff_t k_;                                                                    \
        for (r_ = 0; r_ < ROWS; r_++)                                                    \
            for (v_ = 0; v_ < NV; v_++) acc[r_][v_] = _mm512_setzero_ps();               \
        for (k_ = 0; k_ < K; k_++) {                                                     \
            const float *brow = b + k_ * ldb + j0;                                       \
            __m512 bv[NV];                                                               \
            for (v_ = 0; v_ < NV; v_++) bv[v_] = _mm512_maskz_loadu_ps(m[v_], brow + 16 * v_); \
            for (r_ = 0; r_ < ROWS; r_++) {                                              \
                __m512 av = _mm512_set1_ps(a[(i + r_) * lda + k_]);                      \
                for (v_ = 0; v_ < NV; v_++)                                              \
                    acc[r_][v_] = _mm512_fmadd_ps(av, bv[v_], acc[r_][v_]);              \
            }                                                                            \
        }                                                                                \
        for (r_ = 0; r_ < ROWS; r_++)                                                    \
            for (v_ = 0; v_ < NV; v_++)                                                  \
                _mm512_mask_storeu_ps(c + (i + r_) * ldc + j0 + 16 * v_, m[v_], acc[r_][v_]); \
    } while (0)

/* c (rows x cols, rows ldc apart) = a (rows x K, rows lda apart) b (K x
 * cols, rows ldb apart; masked loads past cols), 4 rows at a time */
CB_AVX512_ATTR static void cb_att_product_512(const float *a, ptrdiff_t lda, const float *b,
                                              ptrdiff_t ldb, ptrdiff_t rows, ptrdiff_t cols,
                                              ptrdiff_t K, float *c, ptrdiff_t ldc) {
    ptrdiff_t i, j0;
    int v;
    for (j0 = 0; j0 < cols; j0 += 64) {
        __mmask16 m[4];
        int nv = 0;
        for (v = 0; v < 4; v++) {
            m[v] = cb_simd_mask16(cols - j0 - 16 * v);
            if (m[v]) nv = v + 1;
        }
        CB_ATT_ROWS(CB_ATT_TILE_512);
    }
}
#endif

#if CB_SIMD_AVX2
#include <immintrin.h>

#define CB_ATT_TILE_256(ROWS, NV)                                                        \
    do {                                                                                 \
        __m256 acc[ROWS][NV];                                                            \
        int r_, v_;                                                                      \
        ptrdiff_t k_;                                                                    \
        for (r_ = 0; r_ < ROWS; r_++)                                                    \
            for (v_ = 0; v_ < NV; v_++) acc[r_][v_] = _mm256_setzero_ps();               \
        for (k_ = 0; k_ < K; k_++) {                                                     \
            const float *brow = b + k_ * ldb + j0;                                       \
            __m256 bv[NV];                                                               \
            for (v_ = 0; v_ < NV; v_++) bv[v_] = _mm256_maskload_ps(brow + 8 * v_, m[v_]); \
            for (r_ = 0; r_ < ROWS; r_++) {                                              \
                __m256 av = _mm256_set1_ps(a[(i + r_) * lda + k_]);                      \
                for (v_ = 0; v_ < NV; v_++)                                              \
                    acc[r_][v_] = _mm256_fmadd_ps(av, bv[v_], acc[r_][v_]);              \
            }                                                                            \
        }                                                                                \
        for (r_ = 0; r_ < ROWS; r_++)                                                    \
            for (v_ = 0; v_ < NV; v_++)                                                  \
                _mm256_maskstore_ps(c + (i + r_) * ldc + j0 + 8 * v_, m[v_], acc[r_][v_]); \
    } while (0)

CB_AVX2_ATTR static void cb_att_product_256(const float *a, ptrdiff_t lda, const float *b,
                                            ptrdiff_t ldb, ptrdiff_t rows, ptrdiff_t cols,
                                            ptrdiff_t K, float *c, ptrdiff_t ldc) {
    ptrdiff_t i, j0;
    int v;
    for (j0 = 0; j0 < cols; j0 += 32) {
        __m256i m[4];
        int nv = (int)((cols - j0 < 32 ? cols - j0 : 32) + 7) / 8;
        for (v = 0; v < 4; v++) m[v] = cb_simd_mask8(cols - j0 - 8 * v);
        CB_ATT_ROWS(CB_ATT_TILE_256);
    }
}
#endif

static int cb_att_product(const float *a, ptrdiff_t lda, const float *b, ptrdiff_t ldb,
                          ptrdiff_t rows, ptrdiff_t cols, ptrdiff_t K, float *c,
                          ptrdiff_t ldc) {
#if CB_SIMD_AVX512
    if (cb_simd_has_avx512()) {
        cb_att_product_512(a, lda, b, ldb, rows, cols, K, c, ldc);
        return 1;
    }
#endif
#if CB_SIMD_AVX2
    if (cb_simd_has_avx2()) {
        cb_att_product_256(a, lda, b, ldb, rows, cols, K, c, ldc);
        return 1;
    }
#endif
    (void)a; (void)lda; (void)b; (void)ldb; (void)rows; (void)cols; (void)K; (void)c;
    (void)ldc;
    return 0;
}

static int cb_att_scores_f(const float *q, ptrdiff_t qt, const float *k, ptrdiff_t ks,
                           ptrdiff_t n, ptrdiff_t S, ptrdiff_t D, float *kt, float *scores) {
    ptrdiff_t s, d, pad = CB_ATT_PAD(S);
    if (!cb_simd_has_avx2()) return 0;
    for (s = 0; s < S; s++)
        for (d = 0; d < D; d++) kt[d * pad + s] = k[s * ks + d];
    return cb_att_product(q, qt, kt, pad, n, S, D, scores, S);
}

static int cb_att_values_f(const float *p, ptrdiff_t n, ptrdiff_t S, const float *v,
                           ptrdiff_t vs, ptrdiff_t Dv, float *out, ptrdiff_t ldo) {
    return cb_att_product(p, S, v, vs, n, Dv, S, out, ldo);
}

#endif
