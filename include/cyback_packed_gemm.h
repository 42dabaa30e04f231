/* y (m, n) = act(x (m, k) @ w (k, n) + b + res) in float32 with w packed once
 * into panels of 16 columns: the Dense products (cyback/kernels/
 * linalg_packed.pxi) and the convolutions of few output positions
 * (conv_packed.pxi) of an inference plan, whose weights are frozen.
 *
 * BLAS packs w into its own panels on every call and splits a product of
 * few rows poorly over threads; a Dense layer at batch 1 to 64 or an
 * attention block's projections (64 rows of 128) spend as long on that as
 * on their multiply-adds. Here w is packed by the plan's frozen prelude:
 * packed[(p * k + kk) * 16 + c] = w[kk, 16 p + c], zero past column n, so a
 * tile reads each panel as one contiguous stream of 64-byte rows.
 *
 * A tile is MR rows x NP panels held in registers (MR x NP x 16 sums): each
 * step over k loads NP panel rows, broadcasts the MR values of x and does
 * MR x NP vector FMAs. NP grows as MR shrinks (cb_pg_np), so that even one
 * row (a GEMV) keeps enough independent sums to hide the FMA latency. The
 * epilogue adds the bias and the residual and applies relu / relu6 to the
 * tile in registers before its one store.
 *
 * Work items are (panel group, row block) in chunks of rows, panel group
 * major within a chunk: a thread's run of items reads its share of w once
 * per chunk, and the chunk's rows of x from cache.
 * Every output's sum runs over k in order on one thread, whatever the
 * thread count: results do not depend on it, and repeat calls agree to the
 * bit. They differ from BLAS's in the last bits (another order of sums).
 *
 * Sets: AVX-512 (one vector per panel row, 24 sums at most) and AVX2 + FMA
 * (two, 12 sums at most), picked at run time; without AVX2 the caller takes
 * its BLAS path (cb_pg_available).
 */
#ifndef CYBACK_PACKED_GEMM_H
#define CYBACK_PACKED_GEMM_H

#include <stddef.h>
#include <string.h>
#include "cyback_simd.h"

#define CB_PG_NR 16

/* The most rows a product or a convolution sends here (only a 1x1 layer
 * that narrows many channels sends more: conv_packed.pxi, _use_packed):
 * from about this many, BLAS and the conv strategies are as fast
 * (benchmarks/bench_linalg.py, "packed" rows; bench_conv.py --packed). */
#define CB_PG_MAX_ROWS 512

/* packed (P, k, 16), P = ceil(n / 16), from w (k, n) row-major. */
static void cb_pg_pack(const float *w, ptrdiff_t k, ptrdiff_t n, float *packed) {
    ptrdiff_t P = (n + CB_PG_NR - 1) / CB_PG_NR, p, kk, c;
    for (p = 0; p < P; p++) {
        ptrdiff_t c0 = p * CB_PG_NR, cn = n - c0 < CB_PG_NR ? n - c0 : CB_PG_NR;
        for (kk = 0; kk < k; kk++) {
            float *dst = packed + (p * k + kk) * CB_PG_NR;
            for (c = 0; c < cn; c++) dst[c] = w[kk * n + c0 + c];
            for (; c < CB_PG_NR; c++) dst[c] = 0.0f;
        }
    }
}

/* The arguments every tile shares. */
typedef struct {
    const float *x;        /* rows of x, row stride ldx */
    ptrdiff_t ldx, k, n;
    const float *packed;   /* (P, k, 16) */
    ptrdiff_t P;
    const float *b;        /* (n,) or NULL */
    const float *res;      /* rows of n, row stride ldr, or NULL */
    ptrdiff_t ldr;
    float *y;              /* rows of n, row stride ldy */
    ptrdiff_t ldy;
    int act;
} cb_pg_args;

#if CB_SIMD_VECTOR && CB_SIMD_AVX2

/* The tile of MR rows from row r0 and NP panels from panel p0 (the last
 * ones past P read panel P - 1 again, and their sums are dropped), for
 * vectors V of VL lanes, VPP = 16 / VL of them per panel row. */
#define CB_PG_TILE(SUF, ATTR, V, VL, MR, NP)                                              \
ATTR static void cb_pg_tile_##SUF##_##MR(const cb_pg_args *g, ptrdiff_t r0, ptrdiff_t p0) { \
    enum { VPP = CB_PG_NR / VL };                                                         \
    V acc[MR][NP][VPP];                                                                   \
    const float *pp[NP];                                                                  \
    const float *xr[MR];                                                                  \
    ptrdiff_t kk, j, r, u, np = g->P - p0 < NP ? g->P - p0 : NP;                          \
    _Pragma("GCC unroll 12") for (r = 0; r < MR; r++) {                                   \
        xr[r] = g->x + (r0 + r) * g->ldx;                                                 \
        _Pragma("GCC unroll 8") for (j = 0; j < NP; j++)                                  \
            _Pragma("GCC unroll 4") for (u = 0; u < VPP; u++) acc[r][j][u] = (V){0};      \
    }                                                                                     \
    _Pragma("GCC unroll 8") for (j = 0; j < NP; j++)                                      \
        pp[j] = g->packed + (p0 + (j < np ? j : np - 1)) * g->k * CB_PG_NR;               \
    for (kk = 0; kk < g->k; kk++) {                                                       \
        V bv[NP][VPP];                                                                    \
        _Pragma("GCC unroll 8") for (j = 0; j < NP; j++)                                  \
            _Pragma("GCC unroll 4") for (u = 0; u < VPP; u++)                             \
                bv[j][u] = *(const V *)(pp[j] + kk * CB_PG_NR + u * VL);                  \
        _Pragma("GCC unroll 12") for (r = 0; r < MR; r++) {                               \
            /* x - 0, not 0 + x: GCC may fold only the first (0 + -0 is +0), and  */       \
            /* the second compiles to a scalar add and a register broadcast, on   */       \
            /* an FMA port on Intel: half speed there. This is one broadcast load. */      \
            const V a = xr[r][kk] - (V){0};                                               \
            _Pragma("GCC unroll 8") for (j = 0; j < NP; j++)                              \
                _Pragma("GCC unroll 4") for (u = 0; u < VPP; u++)                         \
                    acc[r][j][u] += a * bv[j][u];                                         \
        }                                                                                 \
    }                                                                                     \
    for (r = 0; r < MR; r++) {                                                            \
        float *yr = g->y + (r0 + r) * g->ldy;                                             \
        const float *rr = g->res ? g->res + (r0 + r) * g->ldr : NULL;                     \
        for (j = 0; j < np; j++) {                                                        \
            ptrdiff_t c0 = (p0 + j) * CB_PG_NR, c;                                        \
            if (c0 + CB_PG_NR <= g->n) {                                                  \
                for (u = 0; u < VPP; u++) {                                               \
                    V v = acc[r][j][u];                                                   \
                    if (g->b) v += *(const V *)(g->b + c0 + u * VL);                      \
                    if (rr) v += *(const V *)(rr + c0 + u * VL);                          \
                    CB_VACT(v, g->act);                                                   \
                    *(V *)(yr + c0 + u * VL) = v;                                         \
                }                                                                         \
            } else {                                                                      \
                float t[CB_PG_NR];                                                        \
                memcpy(t, acc[r][j], sizeof t);                                           \
                for (c = 0; c < g->n - c0; c++) {                                         \
                    float s = t[c];                                                       \
                    if (g->b) s += g->b[c0 + c];                                          \
                    if (rr) s += rr[c0 + c];                                              \
                    yr[c0 + c] = CB_ACT(float, s, g->act);                                \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

/* AVX-512: one vector per panel row; MR x NP <= 24 sums, NP at most 8. */
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 1, 8)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 2, 8)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 3, 8)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 4, 6)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 5, 4)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 6, 4)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 7, 3)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 8, 3)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 9, 2)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 10, 2)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 11, 2)
CB_PG_TILE(avx512, CB_AVX512_ATTR, cb_v16f, 16, 12, 2)
/* AVX2: two vectors per panel row; MR x NP x 2 <= 12 sums. */
CB_PG_TILE(avx2, CB_AVX2_ATTR, cb_v8f, 8, 1, 4)
CB_PG_TILE(avx2, CB_AVX2_ATTR, cb_v8f, 8, 2, 3)
CB_PG_TILE(avx2, CB_AVX2_ATTR, cb_v8f, 8, 3, 2)
CB_PG_TILE(avx2, CB_AVX2_ATTR, cb_v8f, 8, 4, 1)
CB_PG_TILE(avx2, CB_AVX2_ATTR, cb_v8f, 8, 5, 1)
CB_PG_TILE(avx2, CB_AVX2_ATTR, cb_v8f, 8, 6, 1)

static const int cb_pg_np_avx512[13] = {0, 8, 8, 8, 6, 4, 4, 3, 3, 2, 2, 2, 2};
static const int cb_pg_np_avx2[7] = {0, 4, 3, 2, 1, 1, 1};

/* 1 when the packed product runs (AVX2 + FMA at least), else 0: the caller
 * then multiplies by its BLAS path. */
static int cb_pg_available(void) { return cb_simd_has_avx2(); }

/* The most rows of a tile in the running set. */
static int cb_pg_mr(void) { return cb_simd_has_avx512() ? 12 : 6; }

/* The panels of a tile of mr rows in the running set. */
static int cb_pg_np(int mr) { return cb_simd_has_avx512() ? cb_pg_np_avx512[mr] : cb_pg_np_avx2[mr]; }

static void cb_pg_tile(const cb_pg_args *g, ptrdiff_t r0, int mr, ptrdiff_t p0) {
    if (cb_simd_has_avx512()) {
        switch (mr) {
        case 1: cb_pg_tile_avx512_1(g, r0, p0); break;
        case 2: cb_pg_tile_avx512_2(g, r0, p0); break;
        case 3: cb_pg_tile_avx512_3(g, r0, p0); break;
        case 4: cb_pg_tile_avx512_4(g, r0, p0); break;
        case 5: cb_pg_tile_avx512_5(g, r0, p0); break;
        case 6: cb_pg_tile_avx512_6(g, r0, p0); break;
        case 7: cb_pg_tile_avx512_7(g, r0, p0); break;
        case 8: cb_pg_tile_avx512_8(g, r0, p0); break;
        case 9: cb_pg_tile_avx512_9(g, r0, p0); break;
        case 10: cb_pg_tile_avx512_10(g, r0, p0); break;
        case 11: cb_pg_tile_avx512_11(g, r0, p0); break;
        default: cb_pg_tile_avx512_12(g, r0, p0); break;
        }
        return;
    }
    switch (mr) {
    case 1: cb_pg_tile_avx2_1(g, r0, p0); break;
    case 2: cb_pg_tile_avx2_2(g, r0, p0); break;
    case 3: cb_pg_tile_avx2_3(g, r0, p0); break;
    case 4: cb_pg_tile_avx2_4(g, r0, p0); break;
    case 5: cb_pg_tile_avx2_5(g, r0, p0); break;
    default: cb_pg_tile_avx2_6(g, r0, p0); break;
    }
}

#else  /* no AVX2 kernels in this build: the caller takes its BLAS path */
static int cb_pg_available(void) { return 0; }
static int cb_pg_mr(void) { return 1; }
static int cb_pg_np(int mr) { (void)mr; return 1; }
static void cb_pg_tile(const cb_pg_args *g, ptrdiff_t r0, int mr, ptrdiff_t p0) {
    (void)g; (void)r0; (void)mr; (void)p0;
}
#endif

/* The work items of an m-row product over P panels: the row blocks
 * (``blocks`` of them, ``groups`` panel groups each), taken in chunks of
 * CB_PG_CHUNK blocks, and then a remainder block of ``rest`` rows
 * (``rgroups`` groups of its own). Blocks hold ``mr`` rows, the first
 * ``extra`` of them one more. */
typedef struct {
    ptrdiff_t blocks, groups, rest, rgroups, extra;
    int mr, np, rnp;
} cb_pg_plan;

/* Row blocks per chunk: a chunk's rows of x (up to 192 rows of K values)
 * stay in L2 while its items sweep every panel group over them. */
#define CB_PG_CHUNK 16

/* 1: rows in blocks of nearly equal sizes where that saves a remainder
 * block (49 rows: 10, 10, 10, 10, 9, see below); 0: full blocks of the most
 * rows and a remainder (12 x 4 + 1). Tests set it (linalg.pyx,
 * _use_balanced_blocks). */
static int cb_pg_balanced = 1;

static int cb_pg_use_balanced_blocks(int on) {
    cb_pg_balanced = on;
    return on;
}

static cb_pg_plan cb_pg_plan_for(ptrdiff_t m, ptrdiff_t P) {
    cb_pg_plan q;
    const int most = cb_pg_mr();
    const ptrdiff_t k = (m + most - 1) / most;
    q.extra = 0;
    /* A remainder of one to three rows would read every panel again on its
     * own (one row: the whole kernel, in about the time 12 rows take), so in
     * a product of one chunk the rows go in k blocks of base or base + 1 rows
     * where both tile sizes sweep the same panel groups (49 rows, a 7x7 map:
     * 1.05-1.1x). Larger remainders cost little more than their share. */
    if (cb_pg_balanced && k > 1 && k <= CB_PG_CHUNK && m % most && m % most <= 3 &&
            cb_pg_np((int)(m / k)) == cb_pg_np((int)(m / k + (m % k != 0)))) {
        q.mr = (int)(m / k);
        q.extra = m % k;
        q.np = cb_pg_np(q.mr + (q.extra != 0));
        q.blocks = k;
        q.rest = 0;
    } else {
        q.mr = most;
        q.np = cb_pg_np(q.mr);
        q.blocks = m / q.mr;
        q.rest = m % q.mr;
    }
    q.groups = (P + q.np - 1) / q.np;
    q.rnp = q.rest ? cb_pg_np((int)q.rest) : 1;
    q.rgroups = q.rest ? (P + q.rnp - 1) / q.rnp : 0;
    return q;
}

static ptrdiff_t cb_pg_items(const cb_pg_plan *q) {
    return q->blocks * q->groups + q->rgroups;
}

/* Item i: chunk-major over the blocks, panel group major within a chunk (a
 * thread's run of items reads a group's panels once for the chunk's
 * blocks), then the remainder's groups. A tile's sums run over k in order
 * whatever its rows, so the blocks change no bits. */
static void cb_pg_item(const cb_pg_args *g, const cb_pg_plan *q, ptrdiff_t i) {
    ptrdiff_t full = q->blocks * q->groups;
    if (i < full) {
        ptrdiff_t per = CB_PG_CHUNK * q->groups, c = i / per, j = i % per;
        ptrdiff_t first = c * CB_PG_CHUNK, nb = q->blocks - first, b;
        if (nb > CB_PG_CHUNK) nb = CB_PG_CHUNK;
        b = first + j % nb;
        cb_pg_tile(g, b * q->mr + (b < q->extra ? b : q->extra), q->mr + (b < q->extra),
                   (j / nb) * q->np);
    } else {
        cb_pg_tile(g, q->blocks * q->mr, (int)q->rest, (i - full) * q->rnp);
    }
}

#endif
