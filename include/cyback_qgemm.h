/* int8 matrix product for quantized inference (cyback/kernels/qgemm.pyx):
 * C (M, N) int32 = A (M, K) uint8 x B (K, N) int8, with a requantizing
 * epilogue applied to each register tile before it is stored.
 *
 * Packed weights. B is packed once into panels of 16 columns: panel p holds
 * columns 16p .. 16p + 15 as ceil(K / 4) groups of 64 bytes, group g holding
 * B[4g + t, 16p + j] at byte 4j + t (the four k values of one column are one
 * 32-bit lane, the operand layout of vpdpbusd and of vpmaddubsw + vpmaddwd).
 * Rows past K and columns past N are zero, so a partial group or panel adds
 * nothing. After the groups, 64 bytes hold the panel's 16 column sums as
 * int32 (for the activation zero point). A 64-byte header in front says
 * what was packed: magic, version, K, N and whether every weight lies in
 * [-64, 63] (see the AVX2 path). The layout is the same for every
 * instruction set, so one packed array serves whichever the CPU runs.
 *
 * Instruction sets (picked at run time, never by -march):
 *   3  AVX-512 VNNI  vpdpbusd on zmm: 64 multiply-adds into 16 int32 lanes;
 *   2  AVX-VNNI      the same on ymm (VEX encoding: CPUs with VNNI and no
 *                    AVX-512, or with AVX-512 capped by CYBACK_AVX512=0);
 *   1  AVX2          vpmaddubsw (u8 x s8 pairs summed into int16, saturating)
 *                    then vpmaddwd by ones into int32;
 *   0  scalar        plain C, and the only path off x86.
 * Every set computes the exact integer sum. vpmaddubsw saturates when a
 * pair a0*b0 + a1*b1 leaves int16 (255 * -128 * 2 = -65280), so where the
 * packed weights are not all in [-64, 63] the AVX2 path splits each
 * activation byte into its low 7 bits and its top bit, a = lo + 128 * hi:
 * lo * b pairs stay within +-32512 and hi * b pairs within +-256, and the two
 * products are widened separately (vpmaddwd by 1 and by 128). That costs a
 * second vpmaddubsw + vpmaddwd per vector; weights packed within 7 bits
 * take one. Narrowing the weights themselves (oneDNN's and ONNX Runtime's
 * reduce_range) would make results depend on the machine; this way every
 * machine gives the same bits.
 *
 * Exactness bound: with K <= CB_Q_MAX_K every sum, column sum times zero
 * point and their difference fits in int32 (65536 * 255 * 128 < 2^31).
 *
 * Epilogue, per output (m, n), the same operations in the same order on
 * every set, so results are bit-identical across sets and thread counts:
 *   d = acc - za * colsum[n]                        (int32, exact)
 *   y = (float)d * s[n] (+ bias[n])                 (float32, two roundings)
 *   y = y (+ res[m, n])                             (a residual, float32)
 *   y = y (+ (float)(rq[m, n] - zr) * sr)           (or a residual of uint8 codes)
 *   y = act(y)                                      (none, relu, relu6)
 *   float output:  y
 *   uint8 output:  clamp(rint(y / so), -zo, 255 - zo) + zo   (NaN -> 0)
 * s[n] = scale_a * scale_b[n] is formed by the caller in float32. The
 * multiply and the add must not fuse into an FMA (one rounding instead of
 * two would make the SIMD sets disagree with the scalar one): contraction is
 * turned off for this header.
 */
#ifndef CYBACK_QGEMM_H
#define CYBACK_QGEMM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

#include "cyback_simd.h"

#define CB_Q_NR 16                 /* columns per panel */
#define CB_Q_GROUP 64              /* bytes of one group: 16 columns x 4 k */
#define CB_Q_HEADER 64
#define CB_Q_MAGIC 0x31514243      /* "CBQ1" */
#define CB_Q_VERSION 1
#define CB_Q_MAX_K 65536

#define CB_Q_SCALAR 0
#define CB_Q_AVX2 1
#define CB_Q_AVXVNNI 2
#define CB_Q_AVX512VNNI 3

typedef struct {
    int32_t magic, version;
    int64_t k, n;
    int32_t narrow;    /* every weight in [-64, 63] */
    int32_t unused[9];
} cb_q_header;

/* What the epilogue needs; padded arrays hold one value per packed column. */
typedef struct {
    const float *scale;    /* s[n], padded to the panels */
    const float *bias;     /* padded, or NULL */
    const float *res;      /* a float32 (M, N) residual added after the bias, or NULL */
    ptrdiff_t ldr;
    const uint8_t *res_q;  /* or a residual of uint8 codes, (code - res_zero) * res_scale */
    ptrdiff_t ldrq;
    float res_scale;
    int32_t res_zero;
    int32_t za;            /* the activations' zero point */
    int act;               /* CB_ACT_NONE / RELU / RELU6 */
    float *out_f;          /* float32 output, or NULL */
    ptrdiff_t ldf;
    uint8_t *out_q;        /* uint8 output, or NULL */
    ptrdiff_t ldq;
    float q_scale, q_lo, q_hi;   /* so, -zo, 255 - zo */
    int32_t q_zero;
    /* or, instead of any output, the running max (ext_hi) and min (ext_lo)
     * over rows of each column's sums (padded to the panels): a reduction
     * over the rows after the epilogue then needs the epilogue of one row
     * only (cb_q_extremes_finish) */
    int32_t *ext_hi, *ext_lo;
} cb_q_epilogue;

static ptrdiff_t cb_q_groups(ptrdiff_t k) { return (k + 3) / 4; }
static ptrdiff_t cb_q_panels(ptrdiff_t n) { return (n + CB_Q_NR - 1) / CB_Q_NR; }
static ptrdiff_t cb_q_panel_bytes(ptrdiff_t k) { return (cb_q_groups(k) + 1) * CB_Q_GROUP; }
static ptrdiff_t cb_q_packed_bytes(ptrdiff_t k, ptrdiff_t n) {
    return CB_Q_HEADER + cb_q_panels(n) * cb_q_panel_bytes(k);
}

/* Pack B (K, N), element (i, j) at b[i * rs + j * cs], into out (of
 * cb_q_packed_bytes(k, n) bytes). */
static void cb_q_pack(const int8_t *b, ptrdiff_t rs, ptrdiff_t cs, ptrdiff_t k, ptrdiff_t n,
                      uint8_t *out) {
    const ptrdiff_t kq = cb_q_groups(k), np = cb_q_panels(n), pb = cb_q_panel_bytes(k);
    ptrdiff_t p, g, j, t;
    int narrow = 1;
    cb_q_header h;
    memset(out, 0, (size_t)cb_q_packed_bytes(k, n));
    for (p = 0; p < np; p++) {
        int8_t *panel = (int8_t *)(out + CB_Q_HEADER + p * pb);
        int32_t sums[CB_Q_NR] = {0};
        for (g = 0; g < kq; g++)
            for (j = 0; j < CB_Q_NR && p * CB_Q_NR + j < n; j++)
                for (t = 0; t < 4 && 4 * g + t < k; t++) {
                    int8_t v = b[(4 * g + t) * rs + (p * CB_Q_NR + j) * cs];
                    panel[g * CB_Q_GROUP + 4 * j + t] = v;
                    sums[j] += v;
                    if (v < -64 || v > 63) narrow = 0;
                }
        memcpy(panel + kq * CB_Q_GROUP, sums, sizeof sums);
    }
    memset(&h, 0, sizeof h);
    h.magic = CB_Q_MAGIC;
    h.version = CB_Q_VERSION;
    h.k = k;
    h.n = n;
    h.narrow = narrow;
    memcpy(out, &h, sizeof h);
}

static cb_q_header cb_q_read_header(const uint8_t *packed) {
    cb_q_header h;
    memcpy(&h, packed, sizeof h);
    return h;
}

/* -------------------------------------------------------------- scalar */

/* Requantize one row of up to 16 sums and store the valid ones. */
static void cb_q_epilogue_scalar(const int32_t *acc, const int32_t *colsum, ptrdiff_t row,
                                 ptrdiff_t col, int valid, const cb_q_epilogue *e) {
    int j;
    for (j = 0; j < valid; j++) {
        int32_t d = acc[j] - e->za * colsum[j];
        float y = (float)d * e->scale[col + j];
        if (e->bias) y = y + e->bias[col + j];
        if (e->res) y = y + e->res[row * e->ldr + col + j];
        if (e->res_q)
            y = y + (float)((int32_t)e->res_q[row * e->ldrq + col + j] - e->res_zero) *
                        e->res_scale;
        if (e->act != CB_ACT_NONE) {
            y = 0.0f > y ? 0.0f : y;          /* NaN stays NaN, as vmaxps(0, y) */
            if (e->act == CB_ACT_RELU6) y = 6.0f < y ? 6.0f : y;
        }
        if (e->out_f) e->out_f[row * e->ldf + col + j] = y;
        if (e->out_q) {
            float v = y / e->q_scale;
            v = v > e->q_lo ? v : e->q_lo;    /* NaN -> lo, as vmaxps(v, lo) */
            v = v < e->q_hi ? v : e->q_hi;
            e->out_q[row * e->ldq + col + j] = (uint8_t)((int32_t)rintf(v) + e->q_zero);
        }
    }
}

/* A row's 16 sums into the running column extremes (cb_q_epilogue). */
static void cb_q_extremes_scalar(const int32_t *acc, ptrdiff_t col, const cb_q_epilogue *e) {
    int j;
    for (j = 0; j < CB_Q_NR; j++) {
        if (acc[j] > e->ext_hi[col + j]) e->ext_hi[col + j] = acc[j];
        if (acc[j] < e->ext_lo[col + j]) e->ext_lo[col + j] = acc[j];
    }
}

static void cb_q_part_scalar(const uint8_t *a, ptrdiff_t lda, ptrdiff_t m0, ptrdiff_t m1,
                             ptrdiff_t k, const uint8_t *packed, ptrdiff_t p0, ptrdiff_t p1,
                             ptrdiff_t n, const cb_q_epilogue *e) {
    const ptrdiff_t kq = cb_q_groups(k), pb = cb_q_panel_bytes(k);
    ptrdiff_t i, p, g, t;
    int j;
    for (i = m0; i < m1; i++) {
        const uint8_t *ar = a + i * lda;
        for (p = p0; p < p1; p++) {
            const int8_t *panel = (const int8_t *)(packed + CB_Q_HEADER + p * pb);
            int32_t acc[CB_Q_NR] = {0}, colsum[CB_Q_NR];
            for (g = 0; g < kq; g++)
                for (t = 0; t < 4 && 4 * g + t < k; t++) {
                    const int32_t av = ar[4 * g + t];
                    const int8_t *bg = panel + g * CB_Q_GROUP + t;
                    for (j = 0; j < CB_Q_NR; j++) acc[j] += av * bg[4 * j];
                }
            memcpy(colsum, panel + kq * CB_Q_GROUP, sizeof colsum);
            if (e->ext_hi) {
                cb_q_extremes_scalar(acc, p * CB_Q_NR, e);
                continue;
            }
            cb_q_epilogue_scalar(acc, colsum, i, p * CB_Q_NR,
                                 (int)(n - p * CB_Q_NR < CB_Q_NR ? n - p * CB_Q_NR : CB_Q_NR), e);
        }
    }
}

/* x (count floats) -> uint8 codes clamp(rint(x / scale), -zero, 255 - zero) + zero. */
static void cb_q_quantize_scalar(const float *x, ptrdiff_t count, float scale, int32_t zero,
                                 uint8_t *out) {
    const float lo = (float)-zero, hi = (float)(255 - zero);
    ptrdiff_t i;
    for (i = 0; i < count; i++) {
        float v = x[i] / scale;
        v = v > lo ? v : lo;
        v = v < hi ? v : hi;
        out[i] = (uint8_t)((int32_t)rintf(v) + zero);
    }
}

/* Where the patch rows of a channels_last 2-D convolution come from (a 1-D
 * one has h = kh = 1): x (N, h, w, c) uint8, the window, strides, dilation,
 * the top and left pads, the output's oh x ow, the padding's code. */
typedef struct {
    const uint8_t *x;
    ptrdiff_t h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
    uint8_t pad;
} cb_q_patches;

/* n bytes from src to dst: the runs of a patch row are a few bytes to a few
 * dozen (a 3-channel stem's 9), where a call to memcpy costs more than the
 * copy; two overlapping fixed-size moves cover any n from 4 to 32 exactly. */
static inline void cb_q_copy_run(uint8_t *dst, const uint8_t *src, size_t n) {
    if (n >= 16 && n <= 32) {
        memcpy(dst, src, 16);
        memcpy(dst + n - 16, src + n - 16, 16);
    } else if (n >= 8 && n < 16) {
        memcpy(dst, src, 8);
        memcpy(dst + n - 8, src + n - 8, 8);
    } else if (n >= 4 && n < 8) {
        memcpy(dst, src, 4);
        memcpy(dst + n - 4, src + n - 4, 4);
    } else {
        memcpy(dst, src, n);
    }
}

/* Patch row (b, oy, ox) at dst: the window's taps in (ky, kx, c) order, c
 * fastest; taps in the padding take the activations' zero point (the code of
 * 0.0). */
static void cb_q_patch_row(const cb_q_patches *g, ptrdiff_t b, ptrdiff_t oy, ptrdiff_t ox,
                           uint8_t *dst) {
    const ptrdiff_t c = g->c, kw = g->kw, w = g->w, h = g->h;
    const uint8_t *img = g->x + b * h * w * c;
    ptrdiff_t ky, kx;
    for (ky = 0; ky < g->kh; ky++) {
        const ptrdiff_t iy = oy * g->sh - g->pt + ky * g->dh;
        const ptrdiff_t ix0 = ox * g->sw - g->pl;
        if (g->dw == 1) {
            /* the window's taps along a row are one run of kw * c bytes:
             * a copy per run, not per tap (a 3-channel stem has 3-byte taps) */
            ptrdiff_t lo = ix0 < 0 ? -ix0 : 0, hi = w - ix0 < kw ? w - ix0 : kw;
            if (iy < 0 || iy >= h || hi <= lo) lo = hi = 0;
            if (lo > 0) memset(dst, g->pad, (size_t)(lo * c));
            if (hi > lo)
                cb_q_copy_run(dst + lo * c, img + (iy * w + ix0 + lo) * c,
                              (size_t)((hi - lo) * c));
            if (hi < kw) memset(dst + hi * c, g->pad, (size_t)((kw - hi) * c));
            dst += kw * c;
            continue;
        }
        for (kx = 0; kx < kw; kx++, dst += c) {
            const ptrdiff_t ix = ix0 + kx * g->dw;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w)
                memset(dst, g->pad, (size_t)c);
            else
                cb_q_copy_run(dst, img + (iy * w + ix) * c, (size_t)c);
        }
    }
}

/* Rows p0 .. p1 - 1 of the patch matrix into out (row p0 first): output
 * pixel (b, oy, ox) is row (b * oh + oy) * ow + ox (cb_q_patch_row). A line's
 * windows that lie inside the image without horizontal dilation (most of
 * them) are kh runs of kw * c bytes at fixed places: copied without the
 * bounds work of the edge rows, which was most of a small-channel stem's
 * time. */
static void cb_q_patch_rows(const cb_q_patches *g, ptrdiff_t p0, ptrdiff_t p1, uint8_t *out) {
    const ptrdiff_t c = g->c, w = g->w, run = g->kw * c, k = g->kh * run;
    const ptrdiff_t span = w - 1 + g->pl - (g->kw - 1) * g->dw;
    /* the outputs lo .. hi - 1 of a line have their windows inside horizontally */
    ptrdiff_t lo = (g->pl + g->sw - 1) / g->sw, hi = span >= 0 ? span / g->sw + 1 : 0;
    ptrdiff_t p = p0;
    uint8_t *dst = out;
    if (hi > g->ow) hi = g->ow;
    if (lo > hi) lo = hi;
    while (p < p1) {
        const ptrdiff_t line = p / g->ow, b = line / g->oh, oy = line % g->oh;
        const ptrdiff_t end = (line + 1) * g->ow < p1 ? (line + 1) * g->ow : p1;
        const ptrdiff_t iy0 = oy * g->sh - g->pt;
        const int rows_in = iy0 >= 0 && iy0 + (g->kh - 1) * g->dh < g->h && g->dw == 1;
        ptrdiff_t ox = p - line * g->ow;
        const ptrdiff_t ox_end = end - line * g->ow;
        for (; ox < ox_end; ox++, dst += k) {
            if (rows_in && ox >= lo && ox < hi) {
                const uint8_t *src = g->x + ((b * g->h + iy0) * w + ox * g->sw - g->pl) * c;
                uint8_t *d = dst;
                ptrdiff_t ky;
                for (ky = 0; ky < g->kh; ky++, d += run)
                    cb_q_copy_run(d, src + ky * g->dh * w * c, (size_t)run);
            } else {
                cb_q_patch_row(g, b, oy, ox, dst);
            }
        }
        p = end;
    }
}

/* The patch rows of output lines r0 .. r1 - 1 (a line is (b, oy)) at their
 * place in the whole patch matrix out. */
static void cb_q_im2col(const uint8_t *x, ptrdiff_t h, ptrdiff_t w, ptrdiff_t c,
                        ptrdiff_t kh, ptrdiff_t kw, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh,
                        ptrdiff_t dw, ptrdiff_t pt, ptrdiff_t pl, ptrdiff_t oh, ptrdiff_t ow,
                        uint8_t pad, uint8_t *out, ptrdiff_t r0, ptrdiff_t r1) {
    cb_q_patches g;
    g.x = x; g.h = h; g.w = w; g.c = c; g.kh = kh; g.kw = kw; g.sh = sh; g.sw = sw;
    g.dh = dh; g.dw = dw; g.pt = pt; g.pl = pl; g.oh = oh; g.ow = ow; g.pad = pad;
    cb_q_patch_rows(&g, r0 * ow, r1 * ow, out + r0 * ow * kh * kw * c);
}

/* ------------------------------------------------------------------ x86 */

#if CB_SIMD_AVX2
#include <immintrin.h>

#if (defined(__clang__) && __clang_major__ >= 6) ||                                       \
    (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 8)
#define CB_Q_HAVE_AVX512VNNI 1
#else
#define CB_Q_HAVE_AVX512VNNI 0
#endif
#if (defined(__clang__) && __clang_major__ >= 12) ||                                      \
    (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define CB_Q_HAVE_AVXVNNI 1
#else
#define CB_Q_HAVE_AVXVNNI 0
#endif

#define CB_Q_ALWAYS static inline __attribute__((always_inline))
#define CB_Q_AVX2_ATTR __attribute__((target("avx2")))
#define CB_Q_AVXVNNI_ATTR __attribute__((target("avx2,avxvnni")))
#define CB_Q_AVX512_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2")))

/* The four activation bytes of a row's group g as one int32; TAIL: the last,
 * partial group (zero past k). */
static inline int32_t cb_q_a4(const uint8_t *ar, ptrdiff_t g, ptrdiff_t k, int tail) {
    int32_t w;
    if (tail) {
        /* byte by byte: a memcpy of variable length may become a call, and a
         * call clobbers every vector register the tile's sums live in */
        uint32_t v = 0;
        ptrdiff_t t;
        for (t = 4 * g; t < k; t++) v |= (uint32_t)ar[t] << (8 * (t - 4 * g));
        w = (int32_t)v;
    } else {
        memcpy(&w, ar + 4 * g, 4);
    }
    return w;
}

/* Keeps a tile's sum in a register of its own: without it GCC 12 copies
 * every sum to another register and back around each multiply-add of a
 * tile with several groups in flight (two moves per vpdpbusd). */
#define CB_Q_PIN(x) __asm__("" : "+v"(x))
#define CB_Q_PIN256(x) __asm__("" : "+x"(x))
/* acc += s (int32 lanes) in acc's own register: written as an intrinsic, the
 * sum lands in s's register and is copied back. */
#define CB_Q_ADD256(acc, s) __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(s))

/* ---- 256-bit epilogue: 16 sums of one row in two vectors ---- */

/* The row's sums into the running column extremes instead (cb_q_epilogue). */
CB_Q_ALWAYS CB_Q_AVX2_ATTR void cb_q_extremes_256(__m256i acc0, __m256i acc1, ptrdiff_t col,
                                                  const cb_q_epilogue *e) {
    __m256i *hi = (__m256i *)(e->ext_hi + col), *lo = (__m256i *)(e->ext_lo + col);
    _mm256_storeu_si256(hi, _mm256_max_epi32(_mm256_loadu_si256(hi), acc0));
    _mm256_storeu_si256(hi + 1, _mm256_max_epi32(_mm256_loadu_si256(hi + 1), acc1));
    _mm256_storeu_si256(lo, _mm256_min_epi32(_mm256_loadu_si256(lo), acc0));
    _mm256_storeu_si256(lo + 1, _mm256_min_epi32(_mm256_loadu_si256(lo + 1), acc1));
}

CB_Q_ALWAYS CB_Q_AVX2_ATTR void cb_q_epilogue_256(__m256i acc0, __m256i acc1,
                                                  const int8_t *panel_sums, ptrdiff_t row,
                                                  ptrdiff_t col, ptrdiff_t n,
                                                  const cb_q_epilogue *e) {
    const __m256i za = _mm256_set1_epi32(e->za);
    __m256 y[2];
    __m256i acc[2] = {acc0, acc1};
    int v, valid = (int)(n - col < CB_Q_NR ? n - col : CB_Q_NR);
    float res[CB_Q_NR];
    const float *r = NULL;
    if (e->res_q) {     /* the codes as floats, then as a float32 residual */
        const uint8_t *c = e->res_q + row * e->ldrq + col;
        uint8_t tmp[CB_Q_NR];
        const __m256i zr = _mm256_set1_epi32(e->res_zero);
        const __m256 sr = _mm256_set1_ps(e->res_scale);
        _mm_prefetch((const char *)(c + 64 * e->ldrq), _MM_HINT_T0);
        if (valid < CB_Q_NR) {
            memset(tmp, 0, sizeof tmp);
            memcpy(tmp, c, (size_t)valid);
            c = tmp;
        }
        for (v = 0; v < 2; v++) {
            __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + 8 * v)));
            _mm256_storeu_ps(res + 8 * v,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(w, zr)), sr));
        }
        r = res;
    }
    if (e->res) {
        r = e->res + row * e->ldr + col;
        _mm_prefetch((const char *)(r + 64 * e->ldr), _MM_HINT_T0);  /* see the 512-bit one */
        if (valid < CB_Q_NR) {
            memset(res, 0, sizeof res);
            memcpy(res, r, sizeof(float) * (size_t)valid);
            r = res;
        }
    }
    for (v = 0; v < 2; v++) {
        __m256i cs = _mm256_loadu_si256((const __m256i *)(panel_sums + 32 * v));
        __m256i d = _mm256_sub_epi32(acc[v], _mm256_mullo_epi32(za, cs));
        y[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(d), _mm256_loadu_ps(e->scale + col + 8 * v));
        if (e->bias) y[v] = _mm256_add_ps(y[v], _mm256_loadu_ps(e->bias + col + 8 * v));
        if (r) y[v] = _mm256_add_ps(y[v], _mm256_loadu_ps(r + 8 * v));
        if (e->act != CB_ACT_NONE) {
            y[v] = _mm256_max_ps(_mm256_setzero_ps(), y[v]);
            if (e->act == CB_ACT_RELU6) y[v] = _mm256_min_ps(_mm256_set1_ps(6.0f), y[v]);
        }
    }
    if (e->out_f) {
        float *o = e->out_f + row * e->ldf + col;
        if (valid == CB_Q_NR) {
            _mm256_storeu_ps(o, y[0]);
            _mm256_storeu_ps(o + 8, y[1]);
        } else {
            float tmp[CB_Q_NR];
            _mm256_storeu_ps(tmp, y[0]);
            _mm256_storeu_ps(tmp + 8, y[1]);
            memcpy(o, tmp, sizeof(float) * (size_t)valid);
        }
    }
    if (e->out_q) {
        const __m256 qs = _mm256_set1_ps(e->q_scale), lo = _mm256_set1_ps(e->q_lo),
                     hi = _mm256_set1_ps(e->q_hi);
        const __m256i zq = _mm256_set1_epi32(e->q_zero);
        __m256i q[2];
        __m128i bytes;
        uint8_t *o = e->out_q + row * e->ldq + col;
        for (v = 0; v < 2; v++) {
            __m256 t = _mm256_div_ps(y[v], qs);
            t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);
            q[v] = _mm256_add_epi32(_mm256_cvtps_epi32(t), zq);
        }
        /* 16 int32 in 0..255 -> 16 bytes in order (the packs work per 128-bit lane) */
        q[0] = _mm256_permute4x64_epi64(_mm256_packus_epi32(q[0], q[1]), 0xD8);
        bytes = _mm_packus_epi16(_mm256_castsi256_si128(q[0]), _mm256_extracti128_si256(q[0], 1));
        if (valid == CB_Q_NR) {
            _mm_storeu_si128((__m128i *)o, bytes);
        } else {
            uint8_t tmp[CB_Q_NR];
            _mm_storeu_si128((__m128i *)tmp, bytes);
            memcpy(o, tmp, (size_t)valid);
        }
    }
}

/* ---- AVX2: vpmaddubsw + vpmaddwd ---- */

/* An MR x 16 tile (one panel, two vectors per row), U groups in flight with
 * their own accumulators. NARROW: weights in [-64, 63], one vpmaddubsw per
 * vector; else the activation bytes are split (see the top of the file). */
CB_Q_ALWAYS CB_Q_AVX2_ATTR void cb_q_tile_avx2(const uint8_t *a, ptrdiff_t lda, ptrdiff_t k,
                                               const int8_t *panel, const int MR, const int U,
                                               const int NARROW, ptrdiff_t row, ptrdiff_t col,
                                               ptrdiff_t n, const cb_q_epilogue *e) {
    const ptrdiff_t kfull = k / 4, kq = cb_q_groups(k);
    const __m256i ones = _mm256_set1_epi16(1), c128 = _mm256_set1_epi16(128);
    __m256i acc[4][2][2];
    ptrdiff_t g = 0;
    int r, v, u;
#define CB_Q_AVX2_STEP(G, UU, TAIL)                                                       \
    do {                                                                                  \
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)(panel + (G) * CB_Q_GROUP)); \
        const __m256i b1 =                                                                \
            _mm256_loadu_si256((const __m256i *)(panel + (G) * CB_Q_GROUP + 32));         \
        _Pragma("GCC unroll 4") for (r = 0; r < MR; r++) {                                \
            const int32_t w = cb_q_a4(a + r * lda, (G), k, (TAIL));                       \
            __m256i s0, s1;                                                               \
            if (NARROW) {                                                                 \
                const __m256i av = _mm256_set1_epi32(w);                                  \
                s0 = _mm256_madd_epi16(_mm256_maddubs_epi16(av, b0), ones);               \
                s1 = _mm256_madd_epi16(_mm256_maddubs_epi16(av, b1), ones);               \
            } else {                                                                      \
                const __m256i lo = _mm256_set1_epi32(w & 0x7f7f7f7f);                     \
                const __m256i hi =                                                        \
                    _mm256_set1_epi32((int32_t)(((uint32_t)w >> 7) & 0x01010101u));       \
                s0 = _mm256_add_epi32(                                                    \
                    _mm256_madd_epi16(_mm256_maddubs_epi16(lo, b0), ones),                \
                    _mm256_madd_epi16(_mm256_maddubs_epi16(hi, b0), c128));               \
                s1 = _mm256_add_epi32(                                                    \
                    _mm256_madd_epi16(_mm256_maddubs_epi16(lo, b1), ones),                \
                    _mm256_madd_epi16(_mm256_maddubs_epi16(hi, b1), c128));               \
            }                                                                             \
            CB_Q_ADD256(acc[r][0][UU], s0);                                               \
            CB_Q_ADD256(acc[r][1][UU], s1);                                               \
        }                                                                                 \
    } while (0)
    _Pragma("GCC unroll 4") for (r = 0; r < MR; r++)
        _Pragma("GCC unroll 4") for (u = 0; u < U; u++)
            acc[r][0][u] = acc[r][1][u] = _mm256_setzero_si256();
    for (; g + U <= kfull; g += U)
        _Pragma("GCC unroll 4") for (u = 0; u < U; u++) CB_Q_AVX2_STEP(g + u, u, 0);
    for (; g < kfull; g++) CB_Q_AVX2_STEP(g, 0, 0);
    if (kq > kfull) CB_Q_AVX2_STEP(kfull, 0, 1);
#undef CB_Q_AVX2_STEP
    _Pragma("GCC unroll 4") for (r = 0; r < MR; r++) {
        _Pragma("GCC unroll 4") for (u = 1; u < U; u++)
            _Pragma("GCC unroll 2") for (v = 0; v < 2; v++)
                acc[r][v][0] = _mm256_add_epi32(acc[r][v][0], acc[r][v][u]);
        if (e->ext_hi)
            cb_q_extremes_256(acc[r][0][0], acc[r][1][0], col, e);
        else
            cb_q_epilogue_256(acc[r][0][0], acc[r][1][0], panel + kq * CB_Q_GROUP, row + r,
                              col, n, e);
    }
}

/* ---- AVX-VNNI: vpdpbusd on ymm ---- */

#if CB_Q_HAVE_AVXVNNI
CB_Q_ALWAYS CB_Q_AVXVNNI_ATTR void cb_q_tile_avxvnni(const uint8_t *a, ptrdiff_t lda,
                                                     ptrdiff_t k, const int8_t *panel,
                                                     const int MR, const int U, ptrdiff_t row,
                                                     ptrdiff_t col, ptrdiff_t n,
                                                     const cb_q_epilogue *e) {
    const ptrdiff_t kfull = k / 4, kq = cb_q_groups(k);
    __m256i acc[6][2][4];
    ptrdiff_t g = 0;
    int r, v, u;
#define CB_Q_VNNI_STEP(G, UU, TAIL)                                                       \
    do {                                                                                  \
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)(panel + (G) * CB_Q_GROUP)); \
        const __m256i b1 =                                                                \
            _mm256_loadu_si256((const __m256i *)(panel + (G) * CB_Q_GROUP + 32));         \
        _Pragma("GCC unroll 6") for (r = 0; r < MR; r++) {                                \
            const __m256i av = _mm256_set1_epi32(cb_q_a4(a + r * lda, (G), k, (TAIL)));   \
            acc[r][0][UU] = _mm256_dpbusd_avx_epi32(acc[r][0][UU], av, b0);               \
            CB_Q_PIN256(acc[r][0][UU]);                                                   \
            acc[r][1][UU] = _mm256_dpbusd_avx_epi32(acc[r][1][UU], av, b1);               \
            CB_Q_PIN256(acc[r][1][UU]);                                                   \
        }                                                                                 \
    } while (0)
    _Pragma("GCC unroll 6") for (r = 0; r < MR; r++)
        _Pragma("GCC unroll 4") for (u = 0; u < U; u++)
            acc[r][0][u] = acc[r][1][u] = _mm256_setzero_si256();
    for (; g + U <= kfull; g += U)
        _Pragma("GCC unroll 4") for (u = 0; u < U; u++) CB_Q_VNNI_STEP(g + u, u, 0);
    for (; g < kfull; g++) CB_Q_VNNI_STEP(g, 0, 0);
    if (kq > kfull) CB_Q_VNNI_STEP(kfull, 0, 1);
#undef CB_Q_VNNI_STEP
    _Pragma("GCC unroll 6") for (r = 0; r < MR; r++) {
        _Pragma("GCC unroll 4") for (u = 1; u < U; u++)
            _Pragma("GCC unroll 2") for (v = 0; v < 2; v++)
                acc[r][v][0] = _mm256_add_epi32(acc[r][v][0], acc[r][v][u]);
        if (e->ext_hi)
            cb_q_extremes_256(acc[r][0][0], acc[r][1][0], col, e);
        else
            cb_q_epilogue_256(acc[r][0][0], acc[r][1][0], panel + kq * CB_Q_GROUP, row + r,
                              col, n, e);
    }
}
#endif

/* ---- AVX-512 VNNI: vpdpbusd on zmm ---- */

#if CB_Q_HAVE_AVX512VNNI
/* What the epilogue reads per panel, loaded once per tile: the stores of
 * uint8 codes may alias anything, so values read through pointers inside the
 * row loop would be read again after every row. */
typedef struct {
    __m512i zsum;          /* za * colsum */
    __m512 scale, bias;
    __mmask16 mask;        /* the panel's valid columns */
} cb_q_panel512;

CB_Q_ALWAYS CB_Q_AVX512_ATTR cb_q_panel512 cb_q_panel_512(const int8_t *panel_sums,
                                                         ptrdiff_t col, ptrdiff_t n,
                                                         const cb_q_epilogue *e) {
    const ptrdiff_t left = n - col;
    cb_q_panel512 v;
    v.mask = left >= CB_Q_NR ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    v.zsum = _mm512_mullo_epi32(_mm512_set1_epi32(e->za), _mm512_loadu_si512(panel_sums));
    v.scale = _mm512_loadu_ps(e->scale + col);
    v.bias = e->bias ? _mm512_loadu_ps(e->bias + col) : _mm512_setzero_ps();
    return v;
}

/* The uint8 codes of 16 values y: clamp(rint(y / so), -zo, 255 - zo) + zo,
 * NaN -> 0, as the scalar epilogue. The lower clamp is done on the integers,
 * where it is the same (the bound is an integer, rint is monotonic) and
 * costs no float operation, which bound the epilogue: max(rint(t) + zo, 0).
 * A NaN or a t below INT32_MIN converts to INT32_MIN, which the max takes
 * to 0, as the float clamp's vmaxps(NaN, lo) = lo did; min(hi, t) keeps a
 * NaN (vminps returns its second operand) for it. */
CB_Q_ALWAYS CB_Q_AVX512_ATTR __m128i cb_q_codes_512(__m512 y, float so, float hi, int32_t zo) {
    const __m512 t = _mm512_min_ps(_mm512_set1_ps(hi), _mm512_div_ps(y, _mm512_set1_ps(so)));
    const __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(t), _mm512_set1_epi32(zo));
    return _mm512_cvtepi32_epi8(_mm512_max_epi32(q, _mm512_setzero_si512()));
}

/* e: the caller's local copy of the epilogue (its fields stay in registers). */
CB_Q_ALWAYS CB_Q_AVX512_ATTR void cb_q_epilogue_512(__m512i acc, const cb_q_panel512 *v,
                                                    ptrdiff_t row, ptrdiff_t col,
                                                    const cb_q_epilogue *e) {
    __m512i d = _mm512_sub_epi32(acc, v->zsum);
    __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(d), v->scale);
    if (e->bias) y = _mm512_add_ps(y, v->bias);
    if (e->res) {
        /* the row tiles walk down a panel's columns, rows ldr floats apart, which
         * the hardware prefetcher does not follow: the line a few tiles down is
         * asked for (without it a residual from memory costs 3x the product) */
        _mm_prefetch((const char *)(e->res + (row + 48) * e->ldr + col), _MM_HINT_T0);
        y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(v->mask, e->res + row * e->ldr + col));
    }
    if (e->res_q) {
        const uint8_t *c = e->res_q + row * e->ldrq + col;
        __m512i w;
        _mm_prefetch((const char *)(c + 48 * e->ldrq), _MM_HINT_T0);
        w = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(v->mask, c));
        w = _mm512_sub_epi32(w, _mm512_set1_epi32(e->res_zero));
        y = _mm512_add_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(w), _mm512_set1_ps(e->res_scale)));
    }
    if (e->act != CB_ACT_NONE) {
        y = _mm512_max_ps(_mm512_setzero_ps(), y);
        if (e->act == CB_ACT_RELU6) y = _mm512_min_ps(_mm512_set1_ps(6.0f), y);
    }
    if (e->out_f) _mm512_mask_storeu_ps(e->out_f + row * e->ldf + col, v->mask, y);
    if (e->out_q) {
        _mm_mask_storeu_epi8(e->out_q + row * e->ldq + col, v->mask,
                             cb_q_codes_512(y, e->q_scale, e->q_hi, e->q_zero));
    }
}

/* An MR x (16 NP) tile: NP panels side by side (NP = 1 or 2, pstride bytes
 * apart), U groups in flight with their own accumulators. */
CB_Q_ALWAYS CB_Q_AVX512_ATTR void cb_q_tile_avx512(const uint8_t *a, ptrdiff_t lda,
                                                   ptrdiff_t k, const int8_t *panel,
                                                   ptrdiff_t pstride, const int MR,
                                                   const int NP, const int U, ptrdiff_t row,
                                                   ptrdiff_t col, ptrdiff_t n,
                                                   const cb_q_epilogue *e) {
    const ptrdiff_t kfull = k / 4, kq = cb_q_groups(k);
    __m512i acc[8][2][4];
    ptrdiff_t g = 0;
    int r, p, u;
#define CB_Q_512_STEP(G, UU, TAIL)                                                        \
    do {                                                                                  \
        __m512i bv[2];                                                                    \
        _Pragma("GCC unroll 2") for (p = 0; p < NP; p++)                                  \
            bv[p] = _mm512_loadu_si512(panel + p * pstride + (G) * CB_Q_GROUP);           \
        _Pragma("GCC unroll 8") for (r = 0; r < MR; r++) {                                \
            const __m512i av = _mm512_set1_epi32(cb_q_a4(a + r * lda, (G), k, (TAIL)));   \
            _Pragma("GCC unroll 2") for (p = 0; p < NP; p++)                              \
                {                                                                         \
                acc[r][p][UU] = _mm512_dpbusd_epi32(acc[r][p][UU], av, bv[p]);            \
                CB_Q_PIN(acc[r][p][UU]);                                                  \
            }                                                                             \
        }                                                                                 \
    } while (0)
    _Pragma("GCC unroll 8") for (r = 0; r < MR; r++)
        _Pragma("GCC unroll 2") for (p = 0; p < NP; p++)
            _Pragma("GCC unroll 4") for (u = 0; u < U; u++)
                acc[r][p][u] = _mm512_setzero_si512();
    for (; g + U <= kfull; g += U)
        _Pragma("GCC unroll 4") for (u = 0; u < U; u++) CB_Q_512_STEP(g + u, u, 0);
    for (; g < kfull; g++) CB_Q_512_STEP(g, 0, 0);
    if (kq > kfull) CB_Q_512_STEP(kfull, 0, 1);
#undef CB_Q_512_STEP
    if (e->ext_hi) {
        /* the tile's extremes in registers, then one update per panel */
        _Pragma("GCC unroll 2") for (p = 0; p < NP; p++) {
            __m512i hi, lo;
            _Pragma("GCC unroll 8") for (r = 0; r < MR; r++)
                _Pragma("GCC unroll 4") for (u = 1; u < U; u++)
                    acc[r][p][0] = _mm512_add_epi32(acc[r][p][0], acc[r][p][u]);
            hi = lo = acc[0][p][0];
            _Pragma("GCC unroll 8") for (r = 1; r < MR; r++) {
                hi = _mm512_max_epi32(hi, acc[r][p][0]);
                lo = _mm512_min_epi32(lo, acc[r][p][0]);
            }
            {
                int32_t *h = e->ext_hi + col + p * CB_Q_NR, *l = e->ext_lo + col + p * CB_Q_NR;
                _mm512_storeu_si512(h, _mm512_max_epi32(_mm512_loadu_si512(h), hi));
                _mm512_storeu_si512(l, _mm512_min_epi32(_mm512_loadu_si512(l), lo));
            }
        }
        return;
    }
    {
        const cb_q_epilogue ee = *e;
        cb_q_panel512 pv[2];
        _Pragma("GCC unroll 2") for (p = 0; p < NP; p++)
            pv[p] = cb_q_panel_512(panel + p * pstride + kq * CB_Q_GROUP, col + p * CB_Q_NR, n,
                                   &ee);
        _Pragma("GCC unroll 8") for (r = 0; r < MR; r++)
            _Pragma("GCC unroll 2") for (p = 0; p < NP; p++) {
                _Pragma("GCC unroll 4") for (u = 1; u < U; u++)
                    acc[r][p][0] = _mm512_add_epi32(acc[r][p][0], acc[r][p][u]);
                cb_q_epilogue_512(acc[r][p][0], &pv[p], row + r, col + p * CB_Q_NR, &ee);
            }
    }
}
#endif

/* Rows of A taken per block: about 96 kB of them, reused from L2 across all
 * the block's panels while each panel (16 x K bytes) is reused across the
 * block's rows. */
static ptrdiff_t cb_q_block_rows(ptrdiff_t k, ptrdiff_t mr) {
    ptrdiff_t rows = (ptrdiff_t)98304 / (k > 0 ? k : 1);
    rows = rows / mr * mr;
    return rows < mr ? mr : rows;
}

/* Weights (the panels a part multiplies) up to this size stay in L2 while
 * each row tile runs over all of them: the output and a residual are then
 * written and read a row at a time, which the hardware prefetcher follows. */
#define CB_Q_ROW_MAJOR_BYTES 262144

/* The loops over blocks of rows, panels (NP at a time) and row tiles, for
 * one set; TILE(mr, np) computes the tile at row i, panel p. */
#define CB_Q_BLOCKS(MRMAX, NPMAX, TILE)                                                   \
    do {                                                                                  \
        const ptrdiff_t pb = cb_q_panel_bytes(k);                                         \
        const ptrdiff_t mc = (p1 - p0) * pb <= CB_Q_ROW_MAJOR_BYTES ? (ptrdiff_t)(MRMAX)   \
                                                               : cb_q_block_rows(k, MRMAX); \
        ptrdiff_t mb, p, i;                                                               \
        for (mb = m0; mb < m1; mb += mc) {                                                \
            const ptrdiff_t me = mb + mc < m1 ? mb + mc : m1;                             \
            for (p = p0; p < p1; p += NPMAX) {                                            \
                const int np_ = p1 - p < NPMAX ? (int)(p1 - p) : NPMAX;                   \
                const int8_t *panel = (const int8_t *)(packed + CB_Q_HEADER + p * pb);    \
                (void)np_;                                                                \
                for (i = mb; i < me; i += MRMAX) {                                        \
                    const int mr_ = me - i < MRMAX ? (int)(me - i) : MRMAX;               \
                    const uint8_t *ai = a + i * lda;                                      \
                    TILE;                                                                 \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    } while (0)

CB_Q_AVX2_ATTR static void cb_q_part_avx2(const uint8_t *a, ptrdiff_t lda, ptrdiff_t m0,
                                          ptrdiff_t m1, ptrdiff_t k, const uint8_t *packed,
                                          ptrdiff_t p0, ptrdiff_t p1, ptrdiff_t n,
                                          const cb_q_epilogue *e) {
    const int narrow = cb_q_read_header(packed).narrow;
#define CB_Q_T2(MR, U, NARROW)                                                            \
    cb_q_tile_avx2(ai, lda, k, panel, MR, U, NARROW, i, p * CB_Q_NR, n, e)
    /* 16 ymm registers: 4 rows of sums with one vpmaddubsw per vector, 3 with
     * the split activations (their two halves and the constant 128 besides) */
    if (narrow)
        CB_Q_BLOCKS(4, 1, switch (mr_) {
            case 4: CB_Q_T2(4, 1, 1); break;
            case 3: CB_Q_T2(3, 1, 1); break;
            case 2: CB_Q_T2(2, 2, 1); break;
            default: CB_Q_T2(1, 2, 1); break;
        });
    else
        CB_Q_BLOCKS(3, 1, switch (mr_) {
            case 3: CB_Q_T2(3, 1, 0); break;
            case 2: CB_Q_T2(2, 1, 0); break;
            default: CB_Q_T2(1, 2, 0); break;
        });
#undef CB_Q_T2
}

#if CB_Q_HAVE_AVXVNNI
CB_Q_AVXVNNI_ATTR static void cb_q_part_avxvnni(const uint8_t *a, ptrdiff_t lda, ptrdiff_t m0,
                                                ptrdiff_t m1, ptrdiff_t k,
                                                const uint8_t *packed, ptrdiff_t p0,
                                                ptrdiff_t p1, ptrdiff_t n,
                                                const cb_q_epilogue *e) {
#define CB_Q_TV(MR, U) cb_q_tile_avxvnni(ai, lda, k, panel, MR, U, i, p * CB_Q_NR, n, e)
    CB_Q_BLOCKS(6, 1, switch (mr_) {
        case 6: CB_Q_TV(6, 1); break;
        case 5: CB_Q_TV(5, 1); break;
        case 4: CB_Q_TV(4, 1); break;
        case 3: CB_Q_TV(3, 2); break;
        case 2: CB_Q_TV(2, 2); break;
        default: CB_Q_TV(1, 4); break;
    });
#undef CB_Q_TV
}
#endif

#if CB_Q_HAVE_AVX512VNNI
CB_Q_AVX512_ATTR static void cb_q_part_avx512(const uint8_t *a, ptrdiff_t lda, ptrdiff_t m0,
                                              ptrdiff_t m1, ptrdiff_t k, const uint8_t *packed,
                                              ptrdiff_t p0, ptrdiff_t p1, ptrdiff_t n,
                                              const cb_q_epilogue *e) {
    const ptrdiff_t pstride = cb_q_panel_bytes(k);
#define CB_Q_T5(MR, NP, U)                                                                \
    cb_q_tile_avx512(ai, lda, k, panel, pstride, MR, NP, U, i, p * CB_Q_NR, n, e)
    CB_Q_BLOCKS(8, 2, if (np_ == 2) {
        switch (mr_) {
            case 8: CB_Q_T5(8, 2, 1); break;
            case 7: CB_Q_T5(7, 2, 1); break;
            case 6: CB_Q_T5(6, 2, 1); break;
            case 5: CB_Q_T5(5, 2, 1); break;
            case 4: CB_Q_T5(4, 2, 2); break;
            case 3: CB_Q_T5(3, 2, 2); break;
            case 2: CB_Q_T5(2, 2, 4); break;
            default: CB_Q_T5(1, 2, 4); break;
        }
    } else {
        switch (mr_) {
            case 8: CB_Q_T5(8, 1, 2); break;
            case 7: CB_Q_T5(7, 1, 2); break;
            case 6: CB_Q_T5(6, 1, 2); break;
            case 5: CB_Q_T5(5, 1, 2); break;
            case 4: CB_Q_T5(4, 1, 4); break;
            case 3: CB_Q_T5(3, 1, 4); break;
            case 2: CB_Q_T5(2, 1, 4); break;
            default: CB_Q_T5(1, 1, 4); break;
        }
    });
#undef CB_Q_T5
}
#endif

/* ---- activation quantization ---- */

CB_Q_AVX2_ATTR static void cb_q_quantize_avx2(const float *x, ptrdiff_t count, float scale,
                                              int32_t zero, uint8_t *out) {
    const __m256 s = _mm256_set1_ps(scale), lo = _mm256_set1_ps((float)-zero),
                 hi = _mm256_set1_ps((float)(255 - zero));
    const __m256i z = _mm256_set1_epi32(zero);
    ptrdiff_t i = 0;
    for (; i + 16 <= count; i += 16) {
        __m256 t0 = _mm256_div_ps(_mm256_loadu_ps(x + i), s);
        __m256 t1 = _mm256_div_ps(_mm256_loadu_ps(x + i + 8), s);
        __m256i q0, q1;
        t0 = _mm256_min_ps(_mm256_max_ps(t0, lo), hi);
        t1 = _mm256_min_ps(_mm256_max_ps(t1, lo), hi);
        q0 = _mm256_add_epi32(_mm256_cvtps_epi32(t0), z);
        q1 = _mm256_add_epi32(_mm256_cvtps_epi32(t1), z);
        q0 = _mm256_permute4x64_epi64(_mm256_packus_epi32(q0, q1), 0xD8);
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm_packus_epi16(_mm256_castsi256_si128(q0),
                                          _mm256_extracti128_si256(q0, 1)));
    }
    cb_q_quantize_scalar(x + i, count - i, scale, zero, out + i);
}

#if CB_Q_HAVE_AVX512VNNI
CB_Q_AVX512_ATTR static void cb_q_quantize_avx512(const float *x, ptrdiff_t count, float scale,
                                                  int32_t zero, uint8_t *out) {
    const float hi = (float)(255 - zero);
    ptrdiff_t i = 0;
    for (; i < count; i += 16) {
        const ptrdiff_t left = count - i;
        const __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        _mm_mask_storeu_epi8(out + i, mask,
                             cb_q_codes_512(_mm512_maskz_loadu_ps(mask, x + i), scale, hi, zero));
    }
}
#endif

/* ---- which sets the CPU has ---- */

static void cb_q_cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}

static unsigned long long cb_q_xcr0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* The sets this CPU runs, one bit per level. They do not nest: AVX-512
 * VNNI (Ice Lake, Cascade Lake) comes without AVX-VNNI, its VEX form. */
static int cb_q_detect(void) {
    unsigned r[4] = {0, 0, 0, 0}, r1[4] = {0, 0, 0, 0}, max_leaf, max_sub;
    unsigned long long xcr0;
    int sets = 1 << CB_Q_SCALAR;
    cb_q_cpuid(0, 0, r);
    max_leaf = r[0];
    cb_q_cpuid(1, 0, r);
    if (!(r[2] & (1u << 27)) || max_leaf < 7) return sets;      /* no OSXSAVE */
    xcr0 = cb_q_xcr0();
    if ((xcr0 & 0x6) != 0x6) return sets;                       /* no ymm state */
    cb_q_cpuid(7, 0, r);
    if (!(r[1] & (1u << 5))) return sets;                       /* no AVX2 */
    sets |= 1 << CB_Q_AVX2;
    max_sub = r[0];
    if (max_sub >= 1) cb_q_cpuid(7, 1, r1);
#if CB_Q_HAVE_AVXVNNI
    if (r1[0] & (1u << 4)) sets |= 1 << CB_Q_AVXVNNI;
#endif
#if CB_Q_HAVE_AVX512VNNI
    /* AVX-512 F, BW, VL and VNNI, and the OS saving opmask and zmm state */
    if ((xcr0 & 0xE6) == 0xE6 && (r[1] & (1u << 16)) && (r[1] & (1u << 30)) &&
        (r[1] & (1u << 31)) && (r[2] & (1u << 11)))
        sets |= 1 << CB_Q_AVX512VNNI;
#endif
    (void)r1;
    return sets;
}
#else  /* not x86 with GCC vector extensions: the scalar set only */
static int cb_q_detect(void) { return 1 << CB_Q_SCALAR; }
#endif

/* The CPU's sets (read once; -1: not yet, a benign race), the cap tests put
 * on them (-1: none) and the default cap: CYBACK_AVX512=0 caps at AVX-VNNI, as
 * it caps the float kernels below AVX-512 (qgemm.pyx passes the settings
 * registry's value on at its import, cb_q_set_default_cap). */
static int cb_q_cpu_sets = -1;
static int cb_q_env_cap = CB_Q_AVX512VNNI;
static int cb_q_cap = -1;

static void cb_q_set_default_cap(int avx512) {
    cb_q_env_cap = avx512 ? CB_Q_AVX512VNNI : CB_Q_AVXVNNI;
}

static int cb_q_sets(void) {
    if (cb_q_cpu_sets < 0) cb_q_cpu_sets = cb_q_detect();
    return cb_q_cpu_sets;
}

/* The highest set the CPU runs at or below `cap`. */
static int cb_q_best(int cap) {
    int sets = cb_q_sets(), level = cap;
    while (level > CB_Q_SCALAR && !(sets & (1 << level))) level--;
    return level;
}

static int cb_q_cpu(void) { return cb_q_best(CB_Q_AVX512VNNI); }

static int cb_q_level(void) {
    return cb_q_best(cb_q_cap < 0 ? cb_q_env_cap : cb_q_cap);
}

/* Tests: run at most set `cap` (-1: the default). Returns the set now run. */
static int cb_q_set_cap(int cap) {
    cb_q_cap = cap;
    return cb_q_level();
}

/* Rows m0 .. m1 - 1 and panels p0 .. p1 - 1 of C, with set `level` (at most
 * cb_q_level(): the caller reads it once per call so that every part of one
 * product runs the same set). */
static void cb_q_gemm_part(int level, const uint8_t *a, ptrdiff_t lda, ptrdiff_t m0,
                           ptrdiff_t m1, ptrdiff_t k, const uint8_t *packed, ptrdiff_t p0,
                           ptrdiff_t p1, ptrdiff_t n, const cb_q_epilogue *e) {
    if (m1 <= m0 || p1 <= p0) return;
#if CB_SIMD_AVX2
#if CB_Q_HAVE_AVX512VNNI
    if (level >= CB_Q_AVX512VNNI) {
        cb_q_part_avx512(a, lda, m0, m1, k, packed, p0, p1, n, e);
        return;
    }
#endif
#if CB_Q_HAVE_AVXVNNI
    if (level >= CB_Q_AVXVNNI) {
        cb_q_part_avxvnni(a, lda, m0, m1, k, packed, p0, p1, n, e);
        return;
    }
#endif
    if (level >= CB_Q_AVX2) {
        cb_q_part_avx2(a, lda, m0, m1, k, packed, p0, p1, n, e);
        return;
    }
#endif
    (void)level;
    cb_q_part_scalar(a, lda, m0, m1, k, packed, p0, p1, n, e);
}

/* Patch rows a convolution forms at a time: about 96 kB of them (the
 * product's own row block), a multiple of every set's row tile. */
static ptrdiff_t cb_q_conv_block_rows(ptrdiff_t k) {
    ptrdiff_t rows = (ptrdiff_t)98304 / (k > 0 ? k : 1) / 24 * 24;
    return rows < 24 ? 24 : rows;
}

/* Output rows m0 .. m1 - 1 of the convolution whose patches g describes, with
 * all n columns: a block of patch rows at a time is formed in buf (of
 * cb_q_conv_block_rows(k) * k bytes) and multiplied while it is in cache, so
 * the whole patch matrix is never written out. */
static void cb_q_conv_part(int level, const cb_q_patches *g, ptrdiff_t m0, ptrdiff_t m1,
                           ptrdiff_t k, const uint8_t *packed, ptrdiff_t n,
                           const cb_q_epilogue *e, uint8_t *buf) {
    const ptrdiff_t mc = cb_q_conv_block_rows(k), np = cb_q_panels(n);
    ptrdiff_t mb;
    for (mb = m0; mb < m1; mb += mc) {
        const ptrdiff_t me = mb + mc < m1 ? mb + mc : m1;
        cb_q_epilogue at = *e;
        if (at.out_f) at.out_f += mb * at.ldf;
        if (at.out_q) at.out_q += mb * at.ldq;
        if (at.res) at.res += mb * at.ldr;
        if (at.res_q) at.res_q += mb * at.ldrq;
        cb_q_patch_rows(g, mb, me, buf);
        cb_q_gemm_part(level, buf, k, 0, me - mb, k, packed, 0, np, n, &at);
    }
}

/* Rows r0 .. r1 - 1 of segments s0 .. s1 - 1 of A (segment s's rows start
 * seg bytes after segment s - 1's, lda apart) into the column extremes of
 * their sums, ext + s * 2 * np16 (the maxima, then the minima; np16 = the
 * panels' columns), which this sets first. */
static void cb_q_extremes_part(int level, const uint8_t *a, ptrdiff_t lda, ptrdiff_t seg,
                               ptrdiff_t s0, ptrdiff_t s1, ptrdiff_t r0, ptrdiff_t r1,
                               ptrdiff_t k, const uint8_t *packed, ptrdiff_t n,
                               const cb_q_epilogue *e, int32_t *ext) {
    const ptrdiff_t np16 = cb_q_panels(n) * CB_Q_NR;
    ptrdiff_t s, j;
    for (s = s0; s < s1; s++) {
        cb_q_epilogue at = *e;
        at.ext_hi = ext + s * 2 * np16;
        at.ext_lo = at.ext_hi + np16;
        for (j = 0; j < np16; j++) {
            at.ext_hi[j] = INT32_MIN;
            at.ext_lo[j] = INT32_MAX;
        }
        cb_q_gemm_part(level, a + s * seg, lda, r0, r1, k, packed, 0, cb_q_panels(n), n, &at);
    }
}

/* Output row `row` of e's outputs: the epilogue of the greatest (take_max)
 * or least result over the rows whose extremes the parts' ext arrays hold
 * (parts of them, part_stride int32 apart, laid out as cb_q_extremes_part's
 * segment). The epilogue is non-decreasing in the sum where the column's
 * scale is >= 0 and non-increasing where it is negative (each float32
 * operation rounds monotonically), so the result is the max (min) of the
 * rows' results, to the bit. */
static void cb_q_extremes_finish(const int32_t *ext, ptrdiff_t parts, ptrdiff_t part_stride,
                                 int take_max, const uint8_t *packed, ptrdiff_t k, ptrdiff_t n,
                                 ptrdiff_t row, const cb_q_epilogue *e) {
    const ptrdiff_t np16 = cb_q_panels(n) * CB_Q_NR, pb = cb_q_panel_bytes(k);
    ptrdiff_t p, t;
    int j;
    for (p = 0; p * CB_Q_NR < n; p++) {
        int32_t pick[CB_Q_NR], colsum[CB_Q_NR];
        const ptrdiff_t c0 = p * CB_Q_NR;
        for (j = 0; j < CB_Q_NR; j++) {
            int32_t hi = INT32_MIN, lo = INT32_MAX;
            for (t = 0; t < parts; t++) {
                const int32_t *x = ext + t * part_stride;
                if (x[c0 + j] > hi) hi = x[c0 + j];
                if (x[np16 + c0 + j] < lo) lo = x[np16 + c0 + j];
            }
            pick[j] = (e->scale[c0 + j] < 0.0f) == (take_max != 0) ? lo : hi;
        }
        memcpy(colsum, packed + CB_Q_HEADER + p * pb + cb_q_groups(k) * CB_Q_GROUP,
               sizeof colsum);
        cb_q_epilogue_scalar(pick, colsum, row, c0,
                             (int)(n - c0 < CB_Q_NR ? n - c0 : CB_Q_NR), e);
    }
}

static void cb_q_quantize(int level, const float *x, ptrdiff_t count, float scale,
                          int32_t zero, uint8_t *out) {
#if CB_SIMD_AVX2
#if CB_Q_HAVE_AVX512VNNI
    if (level >= CB_Q_AVX512VNNI) {
        cb_q_quantize_avx512(x, count, scale, zero, out);
        return;
    }
#endif
    if (level >= CB_Q_AVX2) {
        cb_q_quantize_avx2(x, count, scale, zero, out);
        return;
    }
#endif
    (void)level;
    cb_q_quantize_scalar(x, count, scale, zero, out);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#endif
