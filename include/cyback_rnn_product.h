/* The per-step recurrent product of the fused cells (cyback/kernels/rnn_cell.pyx):
 * out (B, N) = h (B, K) @ W (K, N) (+ base, shaped like out), for the few
 * dozen rows of a batch (one thread's block of them) and a W packed once per
 * sequence.
 *
 *   - W is packed in blocks of FB = two vectors of columns, (nb, K, FB),
 *     zero-filled past N: a block's K rows of vectors are read in order;
 *   - a tile of up to 6 rows x FB columns lives in 12 vector registers; each
 *     h value is broadcast once per tile and multiplied into both vectors;
 *   - the rows are cut into tiles of even heights (16 rows: 5, 5, 6), each
 *     run by a kernel compiled for its height: no tile computes rows it does
 *     not store (a 6-row kernel over 4 rows wastes a third of its products).
 *
 * A sum runs over k in order from 0 and base is added after the whole sum,
 * in every path, so results depend neither on the tiling nor on the thread
 * count (nor differ from the baseline kernels beyond the fused multiply-adds).
 */
#ifndef CYBACK_RNN_PRODUCT_H
#define CYBACK_RNN_PRODUCT_H

#include <stddef.h>
#include <string.h>
#include "cyback_simd.h"

/* Most rows of a register tile. */
#define CB_RP_TILE 6

/* Columns per packed block of N columns for the kernel set that runs now:
 * two vectors (of AVX-512 once N is wider than the AVX2 block). */
static ptrdiff_t cb_rp_block(int dbl, ptrdiff_t N) {
    const ptrdiff_t narrow = cb_simd_has_avx2() ? (dbl ? 8 : 16) : (dbl ? 4 : 8);
    return cb_simd_block(narrow, N);
}

#define CB_RP_COMMON(T, SUF)                                                              \
/* wp[b][k][j] = w[k * ldw + b * FB + j], 0 past N: the N columns of w from  \
 * its first, w's rows ldw apart. */                                                     \
static void cb_rp_pack_ld_##SUF(const T *w, ptrdiff_t K, ptrdiff_t N, ptrdiff_t ldw,      \
        ptrdiff_t FB, T *wp) {                                                            \
    ptrdiff_t nb = (N + FB - 1) / FB, b, k, nf;                                           \
    for (b = 0; b < nb; b++) {                                                            \
        nf = N - b * FB < FB ? N - b * FB : FB;                                           \
        for (k = 0; k < K; k++) {                                                         \
            T *dst = wp + (b * K + k) * FB;                                               \
            memcpy(dst, w + k * ldw + b * FB, nf * sizeof(T));                            \
            if (nf < FB) memset(dst + nf, 0, (FB - nf) * sizeof(T));                      \
        }                                                                                 \
    }                                                                                     \
}                                                                                         \
                                                                                          \
static void cb_rp_pack_##SUF(const T *w, ptrdiff_t K, ptrdiff_t N, ptrdiff_t FB, T *wp) {  \
    cb_rp_pack_ld_##SUF(w, K, N, N, FB, wp);                                              \
}                                                                                         \
                                                                                          \
/* Plain loops, for compilers without vector extensions. */                               \
static void cb_rp_rows_scalar_##SUF(ptrdiff_t B, ptrdiff_t K, ptrdiff_t N, const T *h,    \
        const T *wp, ptrdiff_t FB, const T *base, T *out, ptrdiff_t ld) {                 \
    ptrdiff_t r, n, k;                                                                    \
    for (r = 0; r < B; r++)                                                               \
        for (n = 0; n < N; n++) {                                                         \
            const T *wc = wp + (n / FB) * K * FB + n % FB;                                \
            T s = 0;                                                                      \
            for (k = 0; k < K; k++) s += h[r * K + k] * wc[k * FB];                       \
            if (base) s += base[r * ld + n];                                              \
            out[r * ld + n] = s;                                                          \
        }                                                                                 \
}

CB_RP_COMMON(float, f)
CB_RP_COMMON(double, d)

#if CB_SIMD_VECTOR

/* Rows [0, ROWS) of a tile against one packed block wb: h rows K apart, out
 * and base rows ld apart, nf of the block's 2 * VL columns stored. The loops
 * over the tile's rows have a constant count: unrolled, the accumulators
 * stay in registers. */
#define CB_RP_TILE_FN(T, V, VL, SUF, ATTR, ROWS)                                          \
ATTR static inline void cb_rp_tile##ROWS##_##SUF(const T *h, ptrdiff_t K, const T *wb,    \
        const T *base, T *out, ptrdiff_t ld, ptrdiff_t nf) {                              \
    V a[ROWS], b[ROWS];                                                                   \
    ptrdiff_t p, k;                                                                       \
    _Pragma("GCC unroll 6")                                                               \
    for (p = 0; p < ROWS; p++) { a[p] = (V){0}; b[p] = (V){0}; }                          \
    for (k = 0; k < K; k++) {                                                             \
        const V w0 = *(const V *)(wb + k * 2 * VL);                                       \
        const V w1 = *(const V *)(wb + k * 2 * VL + VL);                                  \
        _Pragma("GCC unroll 6")                                                           \
        for (p = 0; p < ROWS; p++) {                                                      \
            const T x = h[p * K + k];                                                     \
            a[p] += x * w0;                                                               \
            b[p] += x * w1;                                                               \
        }                                                                                 \
    }                                                                                     \
    _Pragma("GCC unroll 6")                                                               \
    for (p = 0; p < ROWS; p++) {                                                          \
        T *dst = out + p * ld;                                                            \
        if (base) {                                                                       \
            const T *src = base + p * ld;                                                 \
            if (nf == 2 * VL) {                                                           \
                a[p] += *(const V *)src;                                                  \
                b[p] += *(const V *)(src + VL);                                           \
            } else {                                                                      \
                T t_[2 * VL] = {0};                                                       \
                memcpy(t_, src, nf * sizeof(T));                                          \
                a[p] += *(const V *)t_;                                                   \
                b[p] += *(const V *)(t_ + VL);                                            \
            }                                                                             \
        }                                                                                 \
        if (nf == 2 * VL) {                                                               \
            *(V *)dst = a[p];                                                             \
            *(V *)(dst + VL) = b[p];                                                      \
        } else {                                                                          \
            T t_[2 * VL];                                                                 \
            *(V *)t_ = a[p];                                                              \
            *(V *)(t_ + VL) = b[p];                                                       \
            memcpy(dst, t_, nf * sizeof(T));                                              \
        }                                                                                 \
    }                                                                                     \
}

/* A tile of one or two rows has only 2 or 4 sums in flight, too few to cover
 * the latency of a fused multiply-add (each k waits for the one before): it
 * runs NB full blocks at once instead, 2 * ROWS * NB sums (up to 8: two FMA
 * pipes with 4 cycles of latency), each still over k in order. wb: the first block, the others K * 2 * VL values apart. */
#define CB_RP_WIDE_FN(T, V, VL, SUF, ATTR, ROWS, NB)                                      \
ATTR static inline void cb_rp_tile##ROWS##x##NB##_##SUF(const T *h, ptrdiff_t K,          \
        const T *wb, const T *base, T *out, ptrdiff_t ld) {                               \
    V a[ROWS * NB][2];                                                                    \
    const ptrdiff_t bs = K * 2 * VL;                                                      \
    ptrdiff_t p, q, k;                                                                    \
    _Pragma("GCC unroll 8")                                                               \
    for (p = 0; p < ROWS * NB; p++) { a[p][0] = (V){0}; a[p][1] = (V){0}; }               \
    for (k = 0; k < K; k++) {                                                             \
        _Pragma("GCC unroll 8")                                                           \
        for (q = 0; q < NB; q++) {                                                        \
            const V w0 = *(const V *)(wb + q * bs + k * 2 * VL);                          \
            const V w1 = *(const V *)(wb + q * bs + k * 2 * VL + VL);                     \
            _Pragma("GCC unroll 2")                                                       \
            for (p = 0; p < ROWS; p++) {                                                  \
                const T x = h[p * K + k];                                                 \
                a[p * NB + q][0] += x * w0;                                               \
                a[p * NB + q][1] += x * w1;                                               \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    _Pragma("GCC unroll 2")                                                               \
    for (p = 0; p < ROWS; p++) {                                                          \
        _Pragma("GCC unroll 8")                                                           \
        for (q = 0; q < NB; q++) {                                                        \
            T *dst = out + p * ld + q * 2 * VL;                                           \
            if (base) {                                                                   \
                const T *src = base + p * ld + q * 2 * VL;                                \
                a[p * NB + q][0] += *(const V *)src;                                      \
                a[p * NB + q][1] += *(const V *)(src + VL);                               \
            }                                                                             \
            *(V *)dst = a[p * NB + q][0];                                                 \
            *(V *)(dst + VL) = a[p * NB + q][1];                                          \
        }                                                                                 \
    }                                                                                     \
}

/* All B rows: for each column block, tiles of even heights (at most 6); one
 * and two rows take several full blocks at a time. */
#define CB_RP_ROWS(T, V, VL, SUF, ATTR)                                                   \
CB_RP_TILE_FN(T, V, VL, SUF, ATTR, 1)                                                     \
CB_RP_TILE_FN(T, V, VL, SUF, ATTR, 2)                                                     \
CB_RP_TILE_FN(T, V, VL, SUF, ATTR, 3)                                                     \
CB_RP_TILE_FN(T, V, VL, SUF, ATTR, 4)                                                     \
CB_RP_TILE_FN(T, V, VL, SUF, ATTR, 5)                                                     \
CB_RP_TILE_FN(T, V, VL, SUF, ATTR, 6)                                                     \
CB_RP_WIDE_FN(T, V, VL, SUF, ATTR, 1, 4)                                                  \
CB_RP_WIDE_FN(T, V, VL, SUF, ATTR, 1, 2)                                                  \
CB_RP_WIDE_FN(T, V, VL, SUF, ATTR, 2, 2)                                                  \
ATTR static void cb_rp_rows_##SUF(ptrdiff_t B, ptrdiff_t K, ptrdiff_t N, const T *h,      \
        const T *wp, const T *base, T *out, ptrdiff_t ld) {                               \
    const ptrdiff_t FB = 2 * VL, nb = (N + FB - 1) / FB;                                  \
    const ptrdiff_t nt = (B + CB_RP_TILE - 1) / CB_RP_TILE;                               \
    ptrdiff_t blk = 0, t;                                                                 \
    /* one row: groups of 4 full blocks, then of 2; two rows: of 2 */             \
    if (B == 1)                                                                           \
        for (; (blk + 4) * FB <= N; blk += 4)                                             \
            cb_rp_tile1x4_##SUF(h, K, wp + blk * K * FB, base ? base + blk * FB : NULL,   \
                                out + blk * FB, ld);                                      \
    if (B == 1)                                                                           \
        for (; (blk + 2) * FB <= N; blk += 2)                                             \
            cb_rp_tile1x2_##SUF(h, K, wp + blk * K * FB, base ? base + blk * FB : NULL,   \
                                out + blk * FB, ld);                                      \
    if (B == 2)                                                                           \
        for (; (blk + 2) * FB <= N; blk += 2)                                             \
            cb_rp_tile2x2_##SUF(h, K, wp + blk * K * FB, base ? base + blk * FB : NULL,   \
                                out + blk * FB, ld);                                      \
    for (; blk < nb; blk++) {                                                             \
        const T *wb = wp + blk * K * FB;                                                  \
        const ptrdiff_t c0 = blk * FB, nf = N - c0 < FB ? N - c0 : FB;                    \
        for (t = 0; t < nt; t++) {                                                        \
            const ptrdiff_t r0 = t * B / nt, r1 = (t + 1) * B / nt;                       \
            const T *ht = h + r0 * K;                                                     \
            const T *bt = base ? base + r0 * ld + c0 : NULL;                              \
            T *ot = out + r0 * ld + c0;                                                   \
            switch (r1 - r0) {                                                            \
            case 1: cb_rp_tile1_##SUF(ht, K, wb, bt, ot, ld, nf); break;                  \
            case 2: cb_rp_tile2_##SUF(ht, K, wb, bt, ot, ld, nf); break;                  \
            case 3: cb_rp_tile3_##SUF(ht, K, wb, bt, ot, ld, nf); break;                  \
            case 4: cb_rp_tile4_##SUF(ht, K, wb, bt, ot, ld, nf); break;                  \
            case 5: cb_rp_tile5_##SUF(ht, K, wb, bt, ot, ld, nf); break;                  \
            default: cb_rp_tile6_##SUF(ht, K, wb, bt, ot, ld, nf); break;                 \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

CB_RP_ROWS(float, cb_v4f, 4, f_base, )
CB_RP_ROWS(double, cb_v2d, 2, d_base, )
#if CB_SIMD_AVX2
CB_RP_ROWS(float, cb_v8f, 8, f_avx2, CB_AVX2_ATTR)
CB_RP_ROWS(double, cb_v4d, 4, d_avx2, CB_AVX2_ATTR)
CB_RP_ROWS(float, cb_v16f, 16, f_avx512, CB_AVX512_ATTR)
CB_RP_ROWS(double, cb_v8d, 8, d_avx512, CB_AVX512_ATTR)
#endif
#endif  /* CB_SIMD_VECTOR */

/* out = h @ W (+ base unless NULL; base may be out): h (B, K) row-major, out
 * and base (B, N) with rows ld apart; wp: W packed by cb_rp_pack with FB =
 * cb_rp_block(). The block width picks the kernel set. */
#if CB_SIMD_VECTOR && CB_SIMD_AVX2
#define CB_RP_PRODUCT(T, SUF, VL_AVX2)                                                    \
static void cb_rp_product_ld_##SUF(ptrdiff_t B, ptrdiff_t K, ptrdiff_t N, const T *h,     \
        const T *wp, ptrdiff_t FB, const T *base, T *out, ptrdiff_t ld) {                 \
    if (FB == 4 * VL_AVX2) cb_rp_rows_##SUF##_avx512(B, K, N, h, wp, base, out, ld);      \
    else if (FB == 2 * VL_AVX2) cb_rp_rows_##SUF##_avx2(B, K, N, h, wp, base, out, ld);   \
    else cb_rp_rows_##SUF##_base(B, K, N, h, wp, base, out, ld);                          \
}
#elif CB_SIMD_VECTOR
#define CB_RP_PRODUCT(T, SUF, VL_AVX2)                                                    \
static void cb_rp_product_ld_##SUF(ptrdiff_t B, ptrdiff_t K, ptrdiff_t N, const T *h,     \
        const T *wp, ptrdiff_t FB, const T *base, T *out, ptrdiff_t ld) {                 \
    (void)FB;                                                                             \
    cb_rp_rows_##SUF##_base(B, K, N, h, wp, base, out, ld);                               \
}
#else
#define CB_RP_PRODUCT(T, SUF, VL_AVX2)                                                    \
static void cb_rp_product_ld_##SUF(ptrdiff_t B, ptrdiff_t K, ptrdiff_t N, const T *h,     \
        const T *wp, ptrdiff_t FB, const T *base, T *out, ptrdiff_t ld) {                 \
    cb_rp_rows_scalar_##SUF(B, K, N, h, wp, FB, base, out, ld);                           \
}
#endif

CB_RP_PRODUCT(float, f, 8)
CB_RP_PRODUCT(double, d, 4)

/* out = h @ W (+ base) with out's and base's rows N apart. */
static void cb_rp_product_f(ptrdiff_t B, ptrdiff_t K, ptrdiff_t N, const float *h,
        const float *wp, ptrdiff_t FB, const float *base, float *out) {
    cb_rp_product_ld_f(B, K, N, h, wp, FB, base, out, N);
}

static void cb_rp_product_d(ptrdiff_t B, ptrdiff_t K, ptrdiff_t N, const double *h,
        const double *wp, ptrdiff_t FB, const double *base, double *out) {
    cb_rp_product_ld_d(B, K, N, h, wp, FB, base, out, N);
}

#endif
