/* A product of a few rows with a weight matrix given transposed
 * (cyback/kernels/linalg.pyx, dense_t): y (m, n) = act(x (m, k) @ wt^T + b),
 * wt (n, k) row-major. Each row of x streams wt once: made for one row.
 *
 * A Dense layer with few outputs and a long input (a classifier after a
 * Flatten: k = 9216, n = 10) has rows of n values in its (k, n) kernel: too
 * short for a vector, and each output's sum is one chain of dependent adds.
 * With the kernel transposed once (an inference plan's frozen weights), each
 * output is a dot product of two contiguous rows of k values, summed in U
 * vectors of VL lanes at a time (independent chains that keep the FMA units
 * busy), four outputs at a time against one pass over the row of x.
 *
 * The sum for one output runs in the same order for every row and call:
 * lane l of vector u takes the products at k = (i * U + u) * VL + l; then
 * the vectors add in order u = 0.., their lanes in order, the products past
 * the last whole vector one by one, and the bias last, as a separate add
 * would. The sets differ in VL and U, so results differ between machines in
 * the last bits, never between calls on one machine.
 */
#ifndef CYBACK_DENSE_T_H
#define CYBACK_DENSE_T_H

#include <stddef.h>
#include "cyback_simd.h"

#if CB_SIMD_VECTOR

/* The outputs j .. j + JB - 1 of row r, JB = 1 or 4: the JB rows of wt
 * streamed together against one pass over the row of x (which a long row
 * would otherwise read from L2 once per output), U vectors of each per step.
 */
#define CB_DT_GROUP(T, V, VL, U, JB)                                                      \
    do {                                                                                  \
        V acc[JB][U];                                                                     \
        const T *xr = x + r * k;                                                          \
        _Pragma("GCC unroll 4") for (q = 0; q < JB; q++)                                  \
            _Pragma("GCC unroll 4") for (u = 0; u < U; u++) acc[q][u] = (V){0};           \
        for (i = 0; i < whole; i += U * VL) {                                             \
            V xv[U];                                                                      \
            _Pragma("GCC unroll 4") for (u = 0; u < U; u++)                               \
                xv[u] = *(const V *)(xr + i + u * VL);                                    \
            _Pragma("GCC unroll 4") for (q = 0; q < JB; q++)                              \
                _Pragma("GCC unroll 4") for (u = 0; u < U; u++)                           \
                    acc[q][u] += xv[u] * *(const V *)(wt + (j + q) * k + i + u * VL);     \
        }                                                                                 \
        for (q = 0; q < JB; q++) {                                                        \
            const T *w = wt + (j + q) * k;                                                \
            T s = 0;                                                                      \
            for (u = 0; u < U; u++)                                                       \
                for (l = 0; l < VL; l++) s += acc[q][u][l];                               \
            for (i = whole; i < k; i++) s += xr[i] * w[i];                                \
            if (b) s += b[j + q];                                                         \
            y[r * n + j + q] = CB_ACT(T, s, act);                                         \
        }                                                                                 \
    } while (0)

/* The set for vectors V of VL lanes, U of them per step per output. */
#define CB_DT_ROWS(T, V, VL, U, SUF, ATTR)                                                \
ATTR static void cb_dt_rows_##SUF(const T *x, ptrdiff_t m, ptrdiff_t k, const T *wt,      \
                                  ptrdiff_t n, const T *b, int act, T *y) {               \
    const ptrdiff_t whole = k / (U * VL) * (U * VL);                                      \
    ptrdiff_t r, j, i, q, u, l;                                                           \
    for (r = 0; r < m; r++) {                                                             \
        for (j = 0; j + 4 <= n; j += 4) CB_DT_GROUP(T, V, VL, U, 4);                      \
        for (; j < n; j++) CB_DT_GROUP(T, V, VL, U, 1);                                   \
    }                                                                                     \
}

CB_DT_ROWS(float, cb_v4f, 4, 2, f_base, )
CB_DT_ROWS(double, cb_v2d, 2, 2, d_base, )
#if CB_SIMD_AVX2
CB_DT_ROWS(float, cb_v8f, 8, 2, f_avx2, CB_AVX2_ATTR)
CB_DT_ROWS(double, cb_v4d, 4, 2, d_avx2, CB_AVX2_ATTR)
CB_DT_ROWS(float, cb_v16f, 16, 2, f_avx512, CB_AVX512_ATTR)
CB_DT_ROWS(double, cb_v8d, 8, 2, d_avx512, CB_AVX512_ATTR)
#endif

#define CB_DT_DISPATCH(T, SUF)                                                            \
static void cb_dt_rows_##SUF(const T *x, ptrdiff_t m, ptrdiff_t k, const T *wt,           \
                             ptrdiff_t n, const T *b, int act, T *y) {                    \
    CB_DT_DISPATCH_SETS(SUF)                                                              \
    cb_dt_rows_##SUF##_base(x, m, k, wt, n, b, act, y);                                   \
}
#if CB_SIMD_AVX2
#define CB_DT_DISPATCH_SETS(SUF)                                                          \
    if (cb_simd_has_avx512()) {                                                           \
        cb_dt_rows_##SUF##_avx512(x, m, k, wt, n, b, act, y);                             \
        return;                                                                           \
    }                                                                                     \
    if (cb_simd_has_avx2()) {                                                             \
        cb_dt_rows_##SUF##_avx2(x, m, k, wt, n, b, act, y);                               \
        return;                                                                           \
    }
#else
#define CB_DT_DISPATCH_SETS(SUF)
#endif
CB_DT_DISPATCH(float, f)
CB_DT_DISPATCH(double, d)

#else  /* no vector extensions: plain loops */
#define CB_DT_SCALAR(T, SUF)                                                              \
static void cb_dt_rows_##SUF(const T *x, ptrdiff_t m, ptrdiff_t k, const T *wt,           \
                             ptrdiff_t n, const T *b, int act, T *y) {                    \
    ptrdiff_t r, j, i;                                                                    \
    for (j = 0; j < n; j++)                                                               \
        for (r = 0; r < m; r++) {                                                         \
            T s = 0;                                                                      \
            for (i = 0; i < k; i++) s += x[r * k + i] * wt[j * k + i];                   \
            if (b) s += b[j];                                                             \
            y[r * n + j] = CB_ACT(T, s, act);                                             \
        }                                                                                 \
}

CB_DT_SCALAR(float, f)
CB_DT_SCALAR(double, d)
#endif

#endif
