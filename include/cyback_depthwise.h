/* Row and plane kernels of the depthwise convolution
 * (cyback/kernels/depthwise.pyx).
 *
 * A depthwise convolution is memory-bound only if its inner loops run at
 * vector width: each output value is a KH*KW-long dot product over one
 * channel. These kernels keep the accumulators in vector registers:
 *   - channels_last, one output row: vectors run over channels, and four
 *     output pixels share each kernel-tap load;
 *   - channels_first, one (n, c) plane: vectors run along the row (stride 1)
 *     over a plane that the caller has zero-padded all around, so no pixel
 *     needs a bounds check; blocks of 4 rows by 2 vectors share each
 *     kernel-tap load and keep 8 multiply-add chains in flight. 3x3 "same"
 *     planes at stride 1 are read in place (cb_dw_fwd_cf_same3).
 *
 * The wheels are built for baseline x86-64 (SSE2, 16-byte vectors). On x86
 * with GCC or clang every kernel is compiled a second time for AVX2 + FMA
 * (32-byte vectors, fused multiply-adds) and picked at run time when the CPU
 * has them: that is where most of the speed comes from. Compilers without
 * GCC vector extensions get plain loops of the same arithmetic.
 *
 * Optional epilogue, applied to the finished output while it is in registers:
 * a per-channel bias (NULL for none) and an activation code (CB_ACT_*).
 * The summation order over taps is (ky, kx) in every path, so results do not
 * depend on which path or thread computed a pixel.
 */
#ifndef CYBACK_DEPTHWISE_H
#define CYBACK_DEPTHWISE_H

#include <stddef.h>

#include "cyback_simd.h"

static inline ptrdiff_t cb_dw_cdiv(ptrdiff_t a, ptrdiff_t b) {
    /* ceil(a / b) for b > 0 and any sign of a */
    return a <= 0 ? -((-a) / b) : (a + b - 1) / b;
}

/* Output columns [*lo, *hi) whose input column ow*sw + off lies in [0, W)
 * (an empty range may have hi < lo). Stride 1 needs no division. */
static inline void cb_dw_valid(ptrdiff_t off, ptrdiff_t sw, ptrdiff_t W, ptrdiff_t OW,
                               ptrdiff_t *lo, ptrdiff_t *hi) {
    if (sw == 1) {
        *lo = off < 0 ? -off : 0;
        *hi = W - off < OW ? W - off : OW;
    } else {
        *lo = cb_dw_cdiv(-off, sw);
        if (*lo < 0) *lo = 0;
        *hi = cb_dw_cdiv(W - off, sw);
        if (*hi > OW) *hi = OW;
    }
}

/* Output columns [*lo, *hi) whose taps all fall inside [0, W). */
static inline void cb_dw_interior(ptrdiff_t W, ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw,
                                  ptrdiff_t dw, ptrdiff_t pw, ptrdiff_t *lo, ptrdiff_t *hi) {
    ptrdiff_t a = cb_dw_cdiv(pw, sw), b;
    ptrdiff_t last = W - 1 + pw - (KW - 1) * dw;  /* ow*sw <= last */
    b = last < 0 ? 0 : last / sw + 1;
    if (a < 0) a = 0;
    if (a > OW) a = OW;
    if (b > OW) b = OW;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

/* One output pixel, channels [c0, c1), scalar, with bounds checks; input pixels
 * are xs values apart. */
#define CB_DW_SCALAR_CL(T, SUF, ATTR)                                                     \
ATTR static inline void cb_dw_pixel_##SUF(const T *const *xr, const T *k, T *yp, ptrdiff_t C, \
        ptrdiff_t xs, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t iw0, ptrdiff_t dw, \
        ptrdiff_t c0, ptrdiff_t c1, const T *bias, int act) {                             \
    ptrdiff_t c, ky, kx, iw;                                                              \
    for (c = c0; c < c1; c++) {                                                           \
        T s = bias ? bias[c] : (T)0;                                                      \
        for (ky = 0; ky < KH; ky++) {                                                     \
            if (!xr[ky]) continue;                                                        \
            for (kx = 0; kx < KW; kx++) {                                                 \
                iw = iw0 + kx * dw;                                                       \
                if (iw < 0 || iw >= W) continue;                                          \
                s += xr[ky][iw * xs + c] * k[(ky * KW + kx) * C + c];                     \
            }                                                                             \
        }                                                                                 \
        yp[c] = CB_ACT(T, s, act);                                                        \
    }                                                                                     \
}                                                                                         \
/* channels_last kernel-gradient row, channels [c0, c1), scalar: part[ky, kx, c] += */    \
/* sum over ow of dy[ow, c] * x[ky][ow*sw - pw + kx*dw, c] (the valid ow only); */        \
/* pixels of x are xs values apart, of dy ys. */                                          \
ATTR static inline void cb_dw_kgrad_cl_scalar_##SUF(const T *const *xr, const T *dy, T *part, \
        ptrdiff_t C, ptrdiff_t xs, ptrdiff_t ys, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, \
        ptrdiff_t OW, ptrdiff_t sw, ptrdiff_t dw, ptrdiff_t pw, ptrdiff_t c0,             \
        ptrdiff_t c1) {                                                                   \
    ptrdiff_t c, ow, ky, kx, lo, hi, off;                                                 \
    for (ky = 0; ky < KH; ky++) {                                                         \
        if (!xr[ky]) continue;                                                            \
        for (kx = 0; kx < KW; kx++) {                                                     \
            T *kp = part + (ky * KW + kx) * C;                                            \
            off = kx * dw - pw;                                                           \
            cb_dw_valid(off, sw, W, OW, &lo, &hi);                                        \
            for (c = c0; c < c1; c++) {                                                   \
                T s = 0;                                                                  \
                for (ow = lo; ow < hi; ow++)                                              \
                    s += dy[ow * ys + c] * xr[ky][(ow * sw + off) * xs + c];              \
                kp[c] += s;                                                               \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

CB_DW_SCALAR_CL(float, f, )
CB_DW_SCALAR_CL(double, d, )

/* dst[j * ld + i] = src[i * ls + j], scalar, for rows i in [0, R) and columns
 * j in [0, S), but only columns from j0 on in rows below i1 (the vector blocks
 * of cb_dw_transpose did the rest). */
#define CB_DW_TRANSPOSE_REST(T, SUF, ATTR)                                                \
ATTR static inline void cb_dw_transpose_rest_##SUF(const T *src, ptrdiff_t ls, T *dst,    \
        ptrdiff_t ld, ptrdiff_t R, ptrdiff_t S, ptrdiff_t i1, ptrdiff_t j0) {             \
    ptrdiff_t i, j;                                                                       \
    for (i = 0; i < R; i++)                                                               \
        for (j = i < i1 ? j0 : 0; j < S; j++) dst[j * ld + i] = src[i * ls + j];          \
}

CB_DW_TRANSPOSE_REST(float, f, )
CB_DW_TRANSPOSE_REST(double, d, )

/* d[i] = t[i*M] + t[i*M + 1] + ... (in that order) for i < n: the input
 * gradient's sum over the depth multiplier. A constant M lets the compiler
 * vectorise; the general loop (M and the pointers unknown) does not, and
 * would take most of a channels_last M = 2 input gradient. */
#define CB_DW_SUM_GROUPS(T, SUF)                                                          \
static void cb_dw_sum_groups_##SUF(const T *restrict t, T *restrict d, ptrdiff_t n,      \
                                   ptrdiff_t M) {                                         \
    ptrdiff_t i, m;                                                                       \
    if (M == 2) {                                                                         \
        for (i = 0; i < n; i++) d[i] = t[2 * i] + t[2 * i + 1];                           \
    } else if (M == 4) {                                                                  \
        for (i = 0; i < n; i++)                                                           \
            d[i] = ((t[4 * i] + t[4 * i + 1]) + t[4 * i + 2]) + t[4 * i + 3];             \
    } else {                                                                              \
        for (i = 0; i < n; i++) {                                                         \
            T s = t[i * M];                                                               \
            for (m = 1; m < M; m++) s += t[i * M + m];                                    \
            d[i] = s;                                                                     \
        }                                                                                 \
    }                                                                                     \
}

CB_DW_SUM_GROUPS(float, f)
CB_DW_SUM_GROUPS(double, d)

/* channels_first kernels (but cb_dw_fwd_cf_same3, below) work on whole
 * planes that the caller pads once (cb_dw_pad_plane): padded row i, column
 * j holds input (i - pt, j - pl), zero outside the input, for Hp rows and
 * Wp columns; with upsampling
 * factors uh, uw (for the input gradient of a strided convolution) it holds
 * input ((i - pt) / uh, (j - pl) / uw) where both divide, else zero. With a
 * stride sw > 1 along the row, each padded row is stored as sw phases of
 * Wq = ceil(Wp / sw) values (phase p holds columns p, p + sw, ...), so that
 * the columns ow*sw + kx*dw of consecutive outputs ow are consecutive:
 * column co[kx] + ow (cb_dw_cols). Rows are rs = sw * Wq apart (or the
 * input's own rows, when it needs no padding and sw == 1). Output (oh, ow)
 * reads rows oh*sh + ky*dh with no bounds check. Kernel tap (ky, kx) is
 * k[(ky*KW + kx) * ks].
 *
 * The caller zeroes a padding buffer of Hp * rs values once, and
 * cb_dw_pad_plane then writes only the input's values: the zeros stay where
 * they are for every plane of the same geometry. */

/* The 3x3 row-reuse forward of channels_first planes and the three-tap
 * column reuse of channels_last rows (on unless a test turns them off to
 * check them against the general tiles). */
static int cb_dw_k3_state = 1;
static int cb_dw_use_k3(int on) {
    cb_dw_k3_state = on != 0;
    return cb_dw_k3_state;
}

/* Reading the edges of channels_first 3x3 "same" planes in the kernel (on
 * unless a test pads them, to check one path against the other). */
static int cb_dw_same3_state = 1;
static int cb_dw_read_edges(int on) {
    cb_dw_same3_state = on != 0;
    return cb_dw_same3_state;
}

/* Full unrolling of the short constant loops of the register tiles, so that
 * their indices (and the weights they pick) are known when compiled. */
#if defined(__GNUC__)
#define CB_DW_PRAGMA(x) _Pragma(#x)
#define CB_DW_UNROLL(n) CB_DW_PRAGMA(GCC unroll n)
#else
#define CB_DW_UNROLL(n)
#endif

static inline void cb_dw_cols(ptrdiff_t *co, ptrdiff_t KW, ptrdiff_t dw, ptrdiff_t sw,
                              ptrdiff_t rs) {
    ptrdiff_t kx;
    for (kx = 0; kx < KW; kx++) co[kx] = kx * dw % sw * (rs / sw) + kx * dw / sw;
}

/* Scalar channels_first planes: the padding in phases for sw > 1, and the
 * kernels for rows narrower than a vector. y (OH, OW) += the sums when accumulate,
 * else y = act(bias + sums). The kernel gradient adds each tap's sum to lane
 * 0 of acc[(ky*KW + kx) * 8 ...] (see cb_dw_kgrad_cf_plane). */
#define CB_DW_CF_SCALAR(T, SUF, ATTR)                                                     \
ATTR static void cb_dw_pad_phases_##SUF(const T *src, ptrdiff_t H, ptrdiff_t W, T *buf,   \
        ptrdiff_t Hp, ptrdiff_t Wp, ptrdiff_t pt, ptrdiff_t pl, ptrdiff_t sw, ptrdiff_t uh, \
        ptrdiff_t uw) {                                                                   \
    ptrdiff_t r, j, p, q0, c0, cnt, Wq = (Wp + sw - 1) / sw;                              \
    ptrdiff_t n = W < Wp - pl ? W : Wp - pl;  /* source columns inside the row */         \
    for (r = 0; r < H && pt + r * uh < Hp; r++) {                                         \
        T *b = buf + (pt + r * uh) * sw * Wq;                                             \
        const T *s = src + r * W;                                                         \
        if (uw > 1) {  /* sw == 1 */                                                      \
            for (j = 0; j < n && pl + j * uw < Wp; j++) b[pl + j * uw] = s[j];            \
            continue;                                                                     \
        }                                                                                 \
        /* Phase p: padded columns q*sw + p, from q0 on, are source columns */            \
        /* c0, c0 + sw, ...; the constant stride 2 lets the compiler vectorise. */        \
        for (p = 0; p < sw; p++) {                                                        \
            q0 = pl > p ? (pl - p + sw - 1) / sw : 0;                                     \
            c0 = q0 * sw + p - pl;                                                        \
            cnt = c0 < n ? (n - c0 + sw - 1) / sw : 0;                                    \
            if (sw == 2)                                                                  \
                for (j = 0; j < cnt; j++) b[p * Wq + q0 + j] = s[c0 + 2 * j];             \
            else                                                                          \
                for (j = 0; j < cnt; j++) b[p * Wq + q0 + j] = s[c0 + j * sw];            \
        }                                                                                 \
    }                                                                                     \
}                                                                                         \
ATTR static void cb_dw_fwd_cf_scalar_##SUF(const T *x, ptrdiff_t rs, const T *k, ptrdiff_t ks, \
        T *y, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh,       \
        ptrdiff_t dw, ptrdiff_t KH, ptrdiff_t KW, int accumulate, T bias, int act) {      \
    ptrdiff_t oh, ow, ky, kx, co[KW];                                                     \
    cb_dw_cols(co, KW, dw, sw, rs);                                                       \
    for (oh = 0; oh < OH; oh++)                                                           \
        for (ow = 0; ow < OW; ow++) {                                                     \
            T s = accumulate ? y[oh * OW + ow] : bias;                                    \
            for (ky = 0; ky < KH; ky++)                                                   \
                for (kx = 0; kx < KW; kx++)                                               \
                    s += x[(oh * sh + ky * dh) * rs + co[kx] + ow] * k[(ky * KW + kx) * ks]; \
            y[oh * OW + ow] = CB_ACT(T, s, act);                                          \
        }                                                                                 \
}                                                                                         \
ATTR static void cb_dw_kgrad_cf_scalar_##SUF(const T *x, ptrdiff_t rs, const T *dy,       \
        ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh, ptrdiff_t dw, \
        ptrdiff_t KH, ptrdiff_t KW, T *acc) {                                             \
    ptrdiff_t oh, ow, ky, kx, co[KW];                                                     \
    cb_dw_cols(co, KW, dw, sw, rs);                                                       \
    for (ky = 0; ky < KH; ky++)                                                           \
        for (kx = 0; kx < KW; kx++) {                                                     \
            T t = 0;                                                                      \
            for (oh = 0; oh < OH; oh++)                                                   \
                for (ow = 0; ow < OW; ow++)                                               \
                    t += dy[oh * OW + ow] * x[(oh * sh + ky * dh) * rs + co[kx] + ow];    \
            acc[(ky * KW + kx) * 8] += t;                                                 \
        }                                                                                 \
}

#if CB_SIMD_VECTOR

/* Eight pixels from o of a channels_last row, stride 1, three taps a row:
 * they read ten input columns a kernel row (column j: o - pw + j), each
 * loaded once and used by the (up to) three pixels that need it, taps summed
 * in (ky, kx) order as in every path. Columns j outside [JL, JH) (constants:
 * 0 and 10 inside the row) are padding, read as zeros; ACT is the activation
 * code. Each vector of channels also asks for pfn lines of the memory the
 * next row will read (pfp up to pfe). Expanded inside cb_dw_fwd_cl_row,
 * whose variables it uses. */
#define CB_DW_X(V, j, JL, JH)                                                             \
    ((j) >= (JL) && (j) < (JH) ? *(const V *)(xb + (j) * xs) : (V){0})
/* One kernel row's three taps over the ten columns of an 8-pixel block. */
#define CB_DW_K3_TAPS(V, JL, JH)                                                          \
    xv = CB_DW_X(V, 0, JL, JH); a0 += xv * k0;                                            \
    xv = CB_DW_X(V, 1, JL, JH); a0 += xv * k1; a1 += xv * k0;                             \
    xv = CB_DW_X(V, 2, JL, JH); a0 += xv * k2; a1 += xv * k1; a2 += xv * k0;              \
    xv = CB_DW_X(V, 3, JL, JH); a1 += xv * k2; a2 += xv * k1; a3 += xv * k0;              \
    xv = CB_DW_X(V, 4, JL, JH); a2 += xv * k2; a3 += xv * k1; a4 += xv * k0;              \
    xv = CB_DW_X(V, 5, JL, JH); a3 += xv * k2; a4 += xv * k1; a5 += xv * k0;              \
    xv = CB_DW_X(V, 6, JL, JH); a4 += xv * k2; a5 += xv * k1; a6 += xv * k0;              \
    xv = CB_DW_X(V, 7, JL, JH); a5 += xv * k2; a6 += xv * k1; a7 += xv * k0;              \
    xv = CB_DW_X(V, 8, JL, JH); a6 += xv * k2; a7 += xv * k1;                             \
    xv = CB_DW_X(V, 9, JL, JH); a7 += xv * k2
/* a0..a7: the eight pixels from o, channels from c, bias and taps summed and
 * the activation applied. */
#define CB_DW_K3_SUMS(T, V, o, JL, JH, ACT)                                               \
    V a0 = (V){0}, a1, a2, a3, a4, a5, a6, a7;                                            \
    if (bias) a0 = *(const V *)(bias + c);                                                \
    a1 = a0; a2 = a0; a3 = a0; a4 = a0; a5 = a0; a6 = a0; a7 = a0;                        \
    for (ky = 0; ky < KH; ky++) {                                                         \
        const T *xb, *kb;                                                                 \
        V k0, k1, k2, xv;                                                                 \
        if (!xr[ky]) continue;                                                            \
        /* Before the row at its left edge: CB_DW_X reads only inside it. */              \
        xb = xr[ky] + ((o) - pw) * xs + c;                                                \
        kb = k + ky * 3 * C + c;                                                          \
        k0 = *(const V *)kb;                                                              \
        k1 = *(const V *)(kb + C);                                                        \
        k2 = *(const V *)(kb + 2 * C);                                                    \
        CB_DW_K3_TAPS(V, JL, JH);                                                         \
    }                                                                                     \
    CB_VACT(a0, ACT); CB_VACT(a1, ACT); CB_VACT(a2, ACT); CB_VACT(a3, ACT);               \
    CB_VACT(a4, ACT); CB_VACT(a5, ACT); CB_VACT(a6, ACT); CB_VACT(a7, ACT)
#define CB_DW_K3_BLOCK(T, V, VL, o, JL, JH, ACT)                                          \
    for (c = 0; c < CV; c += VL) {                                                        \
        for (q_ = 0; q_ < pfn && pfp < pfe; q_++, pfp += 64) __builtin_prefetch(pfp, 0, 3); \
        CB_DW_K3_SUMS(T, V, o, JL, JH, ACT);                                              \
        *(V *)(y + (o) * C + c) = a0;                                                     \
        *(V *)(y + ((o) + 1) * C + c) = a1;                                               \
        *(V *)(y + ((o) + 2) * C + c) = a2;                                               \
        *(V *)(y + ((o) + 3) * C + c) = a3;                                               \
        *(V *)(y + ((o) + 4) * C + c) = a4;                                               \
        *(V *)(y + ((o) + 5) * C + c) = a5;                                               \
        *(V *)(y + ((o) + 6) * C + c) = a6;                                               \
        *(V *)(y + ((o) + 7) * C + c) = a7;                                               \
    }

/* Output pixel px of a channels_last row, one vector of channels at a time,
 * skipping the taps that fall on padding. Expanded inside cb_dw_fwd_cl_row. */
#define CB_DW_ONE_PIXEL(T, V, VL, SUF, px)                                                \
    for (c = 0; c < CV; c += VL) {                                                        \
        V a0 = (V){0};                                                                    \
        ptrdiff_t iw0 = (px) * sw - pw;                                                   \
        if (bias) a0 = *(const V *)(bias + c);                                            \
        for (ky = 0; ky < KH; ky++) {                                                     \
            if (!xr[ky]) continue;                                                        \
            for (kx = 0; kx < KW; kx++) {                                                 \
                iw = iw0 + kx * dw;                                                       \
                if (iw < 0 || iw >= W) continue;                                          \
                a0 += *(const V *)(xr[ky] + iw * xs + c)                                  \
                      * *(const V *)(k + (ky * KW + kx) * C + c);                         \
            }                                                                             \
        }                                                                                 \
        CB_VACT(a0, act);                                                                 \
        *(V *)(y + (px) * C + c) = a0;                                                    \
    }                                                                                     \
    if (CV < C)                                                                           \
        cb_dw_pixel_##SUF(xr, k, y + (px) * C, C, xs, W, KH, KW, (px) * sw - pw, dw, CV,  \
                          C, bias, act)

/* A row of 3-tap stride-1 outputs narrower than a block (5 <= OW < 8: the
 * 7x7 maps at the end of a MobileNet) as one block of 8 from the row's
 * start whose first OW outputs are stored; the columns it reads lie in
 * [jl, jh) (known at run time here), the rest count as zeros. The general
 * path runs such a row as overlapping 4-pixel blocks and its edge pixels
 * one at a time, which is slower for 5 to 7 columns; 4 columns are faster
 * there and stay on it (benchmarks/bench_pool.py --only depthwise).
 * Expanded inside cb_dw_fwd_cl_row, whose variables it uses. */
#define CB_DW_K3_SHORT(T, V, VL, SUF, ACT)                                                \
    {                                                                                     \
        const ptrdiff_t jl = pw, jh = W + pw;                                             \
        V *out[8];                                                                        \
        V sink[8];                                                                        \
        for (c = 0; c < CV; c += VL) {                                                    \
            int p_;                                                                       \
            CB_DW_K3_SUMS(T, V, 0, jl, jh, ACT);                                          \
            /* Outputs past the row go to a scratch vector, not past y. */                \
            for (p_ = 0; p_ < 8; p_++)                                                    \
                out[p_] = p_ < OW ? (V *)(y + p_ * C + c) : &sink[p_];                    \
            *out[0] = a0; *out[1] = a1; *out[2] = a2; *out[3] = a3;                       \
            *out[4] = a4; *out[5] = a5; *out[6] = a6; *out[7] = a7;                       \
        }                                                                                 \
        if (CV < C)                                                                       \
            for (c = 0; c < OW; c++)                                                      \
                cb_dw_pixel_##SUF(xr, k, y + c * C, C, xs, W, KH, KW, c - pw, 1, CV, C,   \
                                  bias, act);                                             \
    }

/* A row of 3-tap stride-1 outputs, OW >= 8, in blocks of 8 pixels, the last
 * one ending at OW (it recomputes a few outputs, to the same bits: cheaper
 * than one multiply-add chain per pixel). Blocks at the row's ends read
 * padding columns as zeros. Expanded inside cb_dw_fwd_cl_row. */
#define CB_DW_K3_ROW(T, V, VL, SUF, ACT)                                                  \
    for (ow = 0; ow < OW; ow += 8) {                                                      \
        ptrdiff_t o = ow + 8 <= OW ? ow : OW - 8;                                         \
        /* Columns j of the block with o - pw + j in [0, W). */                           \
        ptrdiff_t jl = pw - o > 0 ? pw - o : 0, jh = W + pw - o;                          \
        if (jl == 0 && jh >= 10) {                                                        \
            CB_DW_K3_BLOCK(T, V, VL, o, 0, 10, ACT);                                      \
        } else if (jl == 1 && jh >= 10) {  /* left edge, one padding column */            \
            CB_DW_K3_BLOCK(T, V, VL, o, 1, 10, ACT);                                      \
        } else if (jl == 0 && jh == 9) {  /* right edge */                                \
            CB_DW_K3_BLOCK(T, V, VL, o, 0, 9, ACT);                                       \
        } else if (jl == 1 && jh == 9) {  /* both: a row of 8 */                          \
            CB_DW_K3_BLOCK(T, V, VL, o, 1, 9, ACT);                                       \
        } else {  /* wider padding: pixel by pixel */                                     \
            for (ow = o; ow < o + 8; ow++) {                                              \
                CB_DW_ONE_PIXEL(T, V, VL, SUF, ow);                                       \
            }                                                                             \
            ow = o;                                                                       \
            continue;                                                                     \
        }                                                                                 \
        if (CV < C)                                                                       \
            for (c = 0; c < 8; c++)                                                       \
                cb_dw_pixel_##SUF(xr, k, y + (o + c) * C, C, xs, W, KH, KW, o + c - pw,   \
                                  1, CV, C, bias, act);                                   \
    }

/* BLOCK with the activation code act as a constant, so that its tests leave
 * the loops. */
#define CB_DW_BY_ACT(BLOCK, T, V, VL, SUF)                                                \
    if (act == CB_ACT_NONE) {                                                             \
        BLOCK(T, V, VL, SUF, CB_ACT_NONE);                                                \
    } else if (act == CB_ACT_RELU) {                                                      \
        BLOCK(T, V, VL, SUF, CB_ACT_RELU);                                                \
    } else {                                                                              \
        BLOCK(T, V, VL, SUF, CB_ACT_RELU6);                                               \
    }

/* channels_last forward row: y[ow, c] for ow in [0, OW), c in [0, C).
 * xr[ky]: input row read by kernel row ky (W pixels of C values, xs >= C apart),
 * or NULL when it is padding. k: (KH, KW, C). Input column of tap kx of output
 * ow: ow*sw - pw + kx*dw. */
#define CB_DW_FWD_CL(T, V, VL, SUF, ATTR)                                                 \
ATTR static void cb_dw_fwd_cl_row_##SUF(const T *const *xr, const T *k, T *y,             \
        ptrdiff_t C, ptrdiff_t xs, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW, \
        ptrdiff_t sw, ptrdiff_t dw, ptrdiff_t pw, const T *bias, int act,                 \
        const void *pf, ptrdiff_t pfb) {                                                  \
    ptrdiff_t lo, hi, c, ow, ky, kx, iw, CV = C - C % VL;                                 \
    ptrdiff_t sC = sw * xs;                                                               \
    const char *pfp = (const char *)pf, *pfe = pf ? pfp + pfb : pfp;                      \
    ptrdiff_t pfn = 0, q_;                                                                \
    cb_dw_interior(W, KW, OW, sw, dw, pw, &lo, &hi);                                      \
    /* Pixels outer, channels inner: the kernel (KH*KW*C) stays in L1 while   */          \
    /* the input streams through once.                                        */          \
    if (KW == 3 && sw == 1 && dw == 1 && cb_dw_k3_state && OW >= 8) {                     \
        /* The next row's lines spread over this row's vectors of channels. */            \
        if (pf && CV > 0)                                                                 \
            pfn = cb_dw_cdiv(cb_dw_cdiv(pfb, 64), cb_dw_cdiv(OW, 8) * (CV / VL));         \
        CB_DW_BY_ACT(CB_DW_K3_ROW, T, V, VL, SUF);                                        \
        return;                                                                           \
    }                                                                                     \
    if (KW == 3 && sw == 1 && dw == 1 && cb_dw_k3_state && OW >= 5) {                     \
        CB_DW_BY_ACT(CB_DW_K3_SHORT, T, V, VL, SUF);                                      \
        return;                                                                           \
    }                                                                                     \
    for (ow = 0; ow < OW; ow++) {                                                         \
        /* The last interior pixels, fewer than a block, run as a block that  */          \
        /* ends at hi (as above).                                              */         \
        if (ow >= lo && ow < hi && ow + 4 > hi && hi - lo >= 4) ow = hi - 4;              \
        if (ow >= lo && ow + 4 <= hi) {                                                   \
            /* Four interior pixels: every tap valid, one kernel load each. */            \
            for (c = 0; c < CV; c += VL) {                                                \
                V a0 = (V){0}, a1, a2, a3;                                                \
                if (bias) a0 = *(const V *)(bias + c);                                    \
                a1 = a0; a2 = a0; a3 = a0;                                                \
                for (ky = 0; ky < KH; ky++) {                                             \
                    const T *xb, *kb;                                                     \
                    if (!xr[ky]) continue;                                                \
                    xb = xr[ky] + (ow * sw - pw) * xs + c;                                \
                    kb = k + ky * KW * C + c;                                             \
                    for (kx = 0; kx < KW; kx++) {                                         \
                        V kv = *(const V *)(kb + kx * C);                                 \
                        const T *xp = xb + kx * dw * xs;                                  \
                        a0 += *(const V *)(xp) * kv;                                      \
                        a1 += *(const V *)(xp + sC) * kv;                                 \
                        a2 += *(const V *)(xp + 2 * sC) * kv;                             \
                        a3 += *(const V *)(xp + 3 * sC) * kv;                             \
                    }                                                                     \
                }                                                                         \
                CB_VACT(a0, act);                                                         \
                CB_VACT(a1, act);                                                         \
                CB_VACT(a2, act);                                                         \
                CB_VACT(a3, act);                                                         \
                *(V *)(y + ow * C + c) = a0;                                              \
                *(V *)(y + (ow + 1) * C + c) = a1;                                        \
                *(V *)(y + (ow + 2) * C + c) = a2;                                        \
                *(V *)(y + (ow + 3) * C + c) = a3;                                        \
            }                                                                             \
            if (CV < C)                                                                   \
                for (c = 0; c < 4; c++)                                                   \
                    cb_dw_pixel_##SUF(xr, k, y + (ow + c) * C, C, xs, W, KH, KW,          \
                                      (ow + c) * sw - pw, dw, CV, C, bias, act);          \
            ow += 3;                                                                      \
            continue;                                                                     \
        }                                                                                 \
        CB_DW_ONE_PIXEL(T, V, VL, SUF, ow);                                               \
    }                                                                                     \
}


/* channels_last kernel-gradient row: part[ky, kx, c] += sum over ow of
 * dy[ow, c] * x[ky][ow*sw - pw + kx*dw, c] (the valid ow only); pixels of x
 * are xs values apart, of dy ys. */
#define CB_DW_KGRAD_CL(T, V, VL, SUF, ATTR)                                               \
ATTR static void cb_dw_kgrad_cl_row_##SUF(const T *const *xr, const T *dy,                \
        T *part, ptrdiff_t C, ptrdiff_t xs, ptrdiff_t ys, ptrdiff_t W, ptrdiff_t KH,      \
        ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw, ptrdiff_t dw, ptrdiff_t pw,             \
        const void *pf, ptrdiff_t pfb, const void *pf2, ptrdiff_t pf2b) {                 \
    ptrdiff_t c, c0, c1, ow, ky, kx, lo, hi, off, CV = C - C % VL;                        \
    const char *pfp = (const char *)pf, *pfe = pf ? pfp + pfb : pfp;                      \
    const char *pfq = (const char *)pf2, *pfqe = pf2 ? pfq + pf2b : pfq;                  \
    ptrdiff_t pfn = 0, q_;                                                                \
    /* The next row's input and output-gradient lines (pf, pf2), spread over */           \
    /* this row's vectors of channels and taps, as in the forward row.       */           \
    if ((pf || pf2) && CV > 0)                                                            \
        pfn = cb_dw_cdiv(cb_dw_cdiv(pfb + pf2b, 64), KH * KW * (CV / VL));                \
    /* Blocks of 64 channels: the strided walks along the row then stay in */             \
    /* L1 for all taps even when C is large.                                */            \
    for (c0 = 0; c0 < CV; c0 += 64) {                                                     \
        c1 = c0 + 64 < CV ? c0 + 64 : CV;                                                 \
        for (ky = 0; ky < KH; ky++) {                                                     \
            if (!xr[ky]) continue;                                                        \
            for (kx = 0; kx < KW; kx++) {                                                 \
                T *kp = part + (ky * KW + kx) * C;                                        \
                off = kx * dw - pw;                                                       \
                cb_dw_valid(off, sw, W, OW, &lo, &hi);                                    \
                for (c = c0; c < c1; c += VL) {                                           \
                    /* Two accumulators: the adds of one row are not one chain. */        \
                    V a0 = (V){0}, a1 = a0;                                               \
                    for (q_ = 0; q_ < pfn && (pfp < pfe || pfq < pfqe); q_++) {          \
                        if (pfp < pfe) { __builtin_prefetch(pfp, 0, 3); pfp += 64; }      \
                        else if (pfq < pfqe) { __builtin_prefetch(pfq, 0, 3); pfq += 64; } \
                    }                                                                     \
                    for (ow = lo; ow + 1 < hi; ow += 2) {                                 \
                        a0 += *(const V *)(dy + ow * ys + c)                              \
                              * *(const V *)(xr[ky] + (ow * sw + off) * xs + c);          \
                        a1 += *(const V *)(dy + (ow + 1) * ys + c)                        \
                              * *(const V *)(xr[ky] + ((ow + 1) * sw + off) * xs + c);    \
                    }                                                                     \
                    if (ow < hi)                                                          \
                        a0 += *(const V *)(dy + ow * ys + c)                              \
                              * *(const V *)(xr[ky] + (ow * sw + off) * xs + c);          \
                    *(V *)(kp + c) += a0 + a1;                                            \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    cb_dw_kgrad_cl_scalar_##SUF(xr, dy, part, C, xs, ys, W, KH, KW, OW, sw, dw, pw, CV, C); \
}


/* Calls of the always-inlined blocks below with the caller's arguments. */
#define CB_DW_TILE(SUF, ow, dv, NV)                                                       \
    cb_dw_cf_tile_##SUF(x, rs, k, ks, w, y, OW, oh, ow, dv, sh, dh, co, KH, KW, accumulate, \
                        b0, act, R, NV, K3)
#define CB_DW_ROWS(SUF, R, K3)                                                            \
    cb_dw_cf_rows_##SUF(x, rs, k, ks, w, y, OW, oh, sh, dh, co, KH, KW, accumulate, b0, act, \
                        R, K3)
#define CB_DW_TAPS(SUF, NK)                                                               \
    cb_dw_kg_cf_taps_##SUF(x, rs, dy, OH, OW, sh, dh, co + kx0, ky, ky * KW + kx0, keep, acc, \
                           NK)

/* GCC's two-vector shuffle splits even and odd lanes; other compilers
 * (clang has no __builtin_shuffle) keep the scalar phase copy. */
#if defined(__clang__)
#define CB_DW_SHUFFLE 0
#define CB_DW_SHUF(a, b, mask) (a)
#else
#define CB_DW_SHUFFLE 1
#define CB_DW_SHUF(a, b, mask) __builtin_shuffle(a, b, mask)
#endif

/* Stride 2 along the row: source columns c land in phase (c + pl) % 2 at
 * (c + pl) / 2; pairs of vectors split into their even and odd lanes
 * (overlapping at the end, the last column of an odd count alone). */
#define CB_DW_PAD_HALVES(T, V, VL, SUF, ATTR)                                             \
ATTR static void cb_dw_pad_halves_##SUF(const T *src, ptrdiff_t H, ptrdiff_t W, T *buf,   \
        ptrdiff_t Hp, ptrdiff_t Wp, ptrdiff_t pt, ptrdiff_t pl, ptrdiff_t n) {            \
    typedef __typeof__((V){0} > (V){0}) mask_t;                                           \
    mask_t ev, od;                                                                        \
    ptrdiff_t r, i, Wq = (Wp + 1) / 2, last = (n - 2 * VL) & ~(ptrdiff_t)1;               \
    int j;                                                                                \
    for (j = 0; j < VL; j++) {                                                            \
        ev[j] = 2 * j;                                                                    \
        od[j] = 2 * j + 1;                                                                \
    }                                                                                     \
    for (r = 0; r < H && pt + r < Hp; r++) {                                              \
        T *b = buf + (pt + r) * 2 * Wq, *be, *bo;                                         \
        const T *s = src + r * W;                                                         \
        /* Even source columns go to phase pl % 2, odd ones to the other. */              \
        be = b + (pl % 2) * Wq + pl / 2;                                                  \
        bo = b + (1 - pl % 2) * Wq + (pl + 1) / 2;                                        \
        for (i = 0; i <= last; i += 2 * VL) {                                             \
            V lo = *(const V *)(s + i), hi = *(const V *)(s + i + VL);                    \
            *(V *)(be + i / 2) = CB_DW_SHUF(lo, hi, ev);                                  \
            *(V *)(bo + i / 2) = CB_DW_SHUF(lo, hi, od);                                  \
        }                                                                                 \
        if (i != last + 2 * VL) {                                                         \
            V lo = *(const V *)(s + last), hi = *(const V *)(s + last + VL);              \
            *(V *)(be + last / 2) = CB_DW_SHUF(lo, hi, ev);                               \
            *(V *)(bo + last / 2) = CB_DW_SHUF(lo, hi, od);                               \
        }                                                                                 \
        if (n % 2) be[(n - 1) / 2] = s[n - 1];                                            \
    }                                                                                     \
}

/* The input's values into a zeroed padding buffer (see above), in whole
 * vectors when there are no phases and no upsampling. */
#define CB_DW_PAD_CF(T, V, VL, SUF, ATTR)                                                 \
ATTR static void cb_dw_pad_plane_##SUF(const T *src, ptrdiff_t H, ptrdiff_t W, T *buf,    \
        ptrdiff_t Hp, ptrdiff_t Wp, ptrdiff_t pt, ptrdiff_t pl, ptrdiff_t sw, ptrdiff_t uh, \
        ptrdiff_t uw) {                                                                   \
    ptrdiff_t r, j, n = W < Wp - pl ? W : Wp - pl;                                        \
    if (CB_DW_SHUFFLE && sw == 2 && uh == 1 && uw == 1 && n >= 2 * VL) {                  \
        cb_dw_pad_halves_##SUF(src, H, W, buf, Hp, Wp, pt, pl, n);                        \
        return;                                                                           \
    }                                                                                     \
    if (sw != 1 || uh != 1 || uw != 1 || n < VL) {                                        \
        cb_dw_pad_phases_##SUF(src, H, W, buf, Hp, Wp, pt, pl, sw, uh, uw);               \
        return;                                                                           \
    }                                                                                     \
    for (r = 0; r < H && pt + r < Hp; r++) {                                              \
        T *b = buf + (pt + r) * Wp + pl;                                                  \
        const T *s = src + r * W;                                                         \
        for (j = 0; j + VL <= n; j += VL) *(V *)(b + j) = *(const V *)(s + j);            \
        *(V *)(b + n - VL) = *(const V *)(s + n - VL);                                    \
    }                                                                                     \
}

/* channels_first forward: R output rows by NV
 * vectors (the second dv values after the first) at (oh, ow), the sums in
 * registers, each tap's weight loaded once for all of them. Overlapping
 * vectors store the same values twice. */
#define CB_DW_FWD_CF(T, V, VL, SUF, ATTR)                                                 \
ATTR static inline __attribute__((always_inline)) void cb_dw_cf_tile_##SUF(const T *x,    \
        ptrdiff_t rs, const T *k, ptrdiff_t ks, const V *w, T *y, ptrdiff_t OW,           \
        ptrdiff_t oh, ptrdiff_t ow, ptrdiff_t dv, ptrdiff_t sh, ptrdiff_t dh,             \
        const ptrdiff_t *co, ptrdiff_t KH, ptrdiff_t KW, int accumulate, V b0, int act,   \
        const int R, const int NV, const int K3) {                                        \
    V a[4][2];                                                                            \
    ptrdiff_t ky, kx;                                                                     \
    int r, v, i;                                                                          \
    for (r = 0; r < R; r++)                                                               \
        for (v = 0; v < NV; v++)                                                          \
            a[r][v] = accumulate ? *(const V *)(y + (oh + r) * OW + ow + v * dv) : b0;    \
    /* 3x3 taps at row stride K3 (1 or 2; 0: any other kernel) and unit row   */          \
    /* dilation: each vector of input row oh*K3 + i is loaded once for the     */         \
    /* output rows oh + r (ky = i - r*K3) that read it, with the 9 weights w  */          \
    /* in registers. Same order of taps. */                                               \
    if (K3) {                                                                             \
        CB_DW_UNROLL(8) for (i = 0; i < (R - 1) * K3 + 3; i++)                            \
            CB_DW_UNROLL(4) for (kx = 0; kx < 3; kx++)                                    \
                CB_DW_UNROLL(2) for (v = 0; v < NV; v++) {                                \
                    V xv = *(const V *)(x + (oh * K3 + i) * rs + ow + co[kx] + v * dv);   \
                    CB_DW_UNROLL(4) for (r = 0; r < R; r++)                               \
                        if (i - r * K3 >= 0 && i - r * K3 < 3)                            \
                            a[r][v] += xv * w[(i - r * K3) * 3 + kx];                     \
                }                                                                         \
        KH = 0;                                                                           \
    }                                                                                     \
    for (ky = 0; ky < KH; ky++) {                                                         \
        const T *xr = x + (oh * sh + ky * dh) * rs + ow;                                  \
        for (kx = 0; kx < KW; kx++) {                                                     \
            T kv = k[(ky * KW + kx) * ks];                                                \
            for (r = 0; r < R; r++)                                                       \
                for (v = 0; v < NV; v++)                                                  \
                    a[r][v] += *(const V *)(xr + r * sh * rs + co[kx] + v * dv) * kv;     \
        }                                                                                 \
    }                                                                                     \
    for (r = 0; r < R; r++)                                                               \
        for (v = 0; v < NV; v++) {                                                        \
            CB_VACT(a[r][v], act);                                                        \
            *(V *)(y + (oh + r) * OW + ow + v * dv) = a[r][v];                            \
        }                                                                                 \
}                                                                                         \
/* Output rows [oh, oh + R) of a plane: pairs of vectors, then the last                   \
 * columns as overlapping vectors (or, when accumulating, single vectors and              \
 * scalars: an overlapping vector would add twice). */                                    \
ATTR static inline __attribute__((always_inline)) void cb_dw_cf_rows_##SUF(const T *x,    \
        ptrdiff_t rs, const T *k, ptrdiff_t ks, const V *w, T *y, ptrdiff_t OW,           \
        ptrdiff_t oh, ptrdiff_t sh, ptrdiff_t dh, const ptrdiff_t *co, ptrdiff_t KH,      \
        ptrdiff_t KW, int accumulate, V b0, int act, const int R, const int K3) {         \
    ptrdiff_t ow, c, r, ky, kx;                                                           \
    for (ow = 0; ow + 2 * VL <= OW; ow += 2 * VL) CB_DW_TILE(SUF, ow, VL, 2);             \
    if (ow == OW) return;                                                                 \
    if (!accumulate) {                                                                    \
        if (ow + VL >= OW) CB_DW_TILE(SUF, OW - VL, 0, 1);                                \
        else if (OW >= 2 * VL) CB_DW_TILE(SUF, OW - 2 * VL, VL, 2);                       \
        else CB_DW_TILE(SUF, 0, OW - VL, 2);                                              \
        return;                                                                           \
    }                                                                                     \
    for (; ow + VL <= OW; ow += VL) CB_DW_TILE(SUF, ow, 0, 1);                            \
    for (r = 0; r < R; r++)                                                               \
        for (c = ow; c < OW; c++) {                                                       \
            T s = y[(oh + r) * OW + c];                                                   \
            for (ky = 0; ky < KH; ky++)                                                   \
                for (kx = 0; kx < KW; kx++)                                               \
                    s += x[((oh + r) * sh + ky * dh) * rs + co[kx] + c]                   \
                         * k[(ky * KW + kx) * ks];                                        \
            y[(oh + r) * OW + c] = CB_ACT(T, s, act);                                     \
        }                                                                                 \
}                                                                                         \
/* One plane, as cb_dw_fwd_cf_scalar: blocks of 4 output rows (8 sums in                  \
 * registers hide the latency of the multiply-adds). 3x3 kernels at row stride            \
 * 1 or 2 and unit row dilation run in blocks of 3 rows instead, reusing each             \
 * input vector for the rows that read it: at stride 1, two loads per output              \
 * vector rather than nine, most of them across cache lines, which bounded                \
 * the speed. */                                                                          \
ATTR static void cb_dw_fwd_cf_plane_##SUF(const T *x, ptrdiff_t rs, const T *k, ptrdiff_t ks, \
        T *y, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh,       \
        ptrdiff_t dw, ptrdiff_t KH, ptrdiff_t KW, int accumulate, T bias, int act) {      \
    V b0 = (V){0} + bias, w[9];                                                           \
    ptrdiff_t oh = 0, t, co[KW];                                                          \
    if (OW < VL) {                                                                        \
        cb_dw_fwd_cf_scalar_##SUF(x, rs, k, ks, y, OH, OW, sh, sw, dh, dw, KH, KW, accumulate, \
                                  bias, act);                                             \
        return;                                                                           \
    }                                                                                     \
    cb_dw_cols(co, KW, dw, sw, rs);                                                       \
    if (KH == 3 && KW == 3 && (sh == 1 || sh == 2) && dh == 1 && cb_dw_k3_state) {        \
        for (t = 0; t < 9; t++) w[t] = (V){0} + k[t * ks];                                \
        if (sh == 1) {                                                                    \
            for (; oh + 3 <= OH; oh += 3) CB_DW_ROWS(SUF, 3, 1);                          \
            if (oh + 2 <= OH) {                                                           \
                CB_DW_ROWS(SUF, 2, 1);                                                    \
                oh += 2;                                                                  \
            }                                                                             \
            if (oh < OH) CB_DW_ROWS(SUF, 1, 1);                                           \
        } else {                                                                          \
            for (; oh + 3 <= OH; oh += 3) CB_DW_ROWS(SUF, 3, 2);                          \
            if (oh + 2 <= OH) {                                                           \
                CB_DW_ROWS(SUF, 2, 2);                                                    \
                oh += 2;                                                                  \
            }                                                                             \
            if (oh < OH) CB_DW_ROWS(SUF, 1, 2);                                           \
        }                                                                                 \
        return;                                                                           \
    }                                                                                     \
    for (; oh + 4 <= OH; oh += 4) CB_DW_ROWS(SUF, 4, 0);                                  \
    if (oh + 2 <= OH) {                                                                   \
        CB_DW_ROWS(SUF, 2, 0);                                                            \
        oh += 2;                                                                          \
    }                                                                                     \
    if (oh < OH) CB_DW_ROWS(SUF, 1, 0);                                                   \
}

/* channels_first 3x3 forward at stride 1, dilation 1 and pads (1, 1) on
 * both axes ("same"), straight from the unpadded plane (H, W): padding each
 * plane into a buffer first costs a large share of a small-plane call.
 * Tiles of 3 output rows by 2 vectors as in cb_dw_cf_tile (same loads, taps
 * and order, so the same bits as the padded plane): rows above or below the
 * plane read the zero row, and the one column outside the plane at either
 * end comes into the tile's first vector (LEFT) or last one (RIGHT) by a
 * shuffle with a zero lane. The flags are constants: the compiler may leave
 * a multiply-add whose operand depends on a run-time branch unfused, which
 * changes the bits. Tiles overlap at the plane's ends instead of taking narrower
 * shapes, so the function takes planes of at least 3 rows and VL columns,
 * without accumulation; it returns 0 (nothing done) for any other plane, on
 * compilers without shuffles, and while a test turns the row-reuse tiles or
 * this kernel off (cb_dw_use_k3, cb_dw_read_edges). */
#define CB_DW_FWD_CF_SAME3(T, V, VL, SUF, ATTR)                                           \
ATTR static inline __attribute__((always_inline)) void cb_dw_s3_tile_##SUF(               \
        const T *const *p, const V *w, T *y, ptrdiff_t W, ptrdiff_t oh, ptrdiff_t ow,     \
        ptrdiff_t dv, V b0, int act, const int NV, const int LEFT, const int RIGHT) {     \
    typedef __typeof__(b0 > b0) mask_t;                                                   \
    const V z = {0};                                                                      \
    mask_t ml, mr;                                                                        \
    V a[3][2];                                                                            \
    int r, v, i, kx, j;                                                                   \
    for (j = 0; j < VL; j++) {                                                            \
        ml[j] = j == 0 ? VL : j - 1;                                                      \
        mr[j] = j == VL - 1 ? VL : j + 1;                                                 \
    }                                                                                     \
    for (r = 0; r < 3; r++) a[r][0] = a[r][1] = b0;                                       \
    CB_DW_UNROLL(5) for (i = 0; i < 5; i++)                                               \
        CB_DW_UNROLL(3) for (kx = 0; kx < 3; kx++)                                        \
            CB_DW_UNROLL(2) for (v = 0; v < NV; v++) {                                    \
                const T *xc = p[i] + ow + v * dv;                                         \
                V xv;                                                                     \
                if (LEFT && kx == 0 && v == 0)                                            \
                    xv = CB_DW_SHUF(*(const V *)xc, z, ml);                               \
                else if (RIGHT && kx == 2 && v == NV - 1)                                 \
                    xv = CB_DW_SHUF(*(const V *)xc, z, mr);                               \
                else                                                                      \
                    xv = *(const V *)(xc + kx - 1);                                       \
                CB_DW_UNROLL(3) for (r = 0; r < 3; r++)                                   \
                    if (i - r >= 0 && i - r < 3) a[r][v] += xv * w[(i - r) * 3 + kx];     \
            }                                                                             \
    for (r = 0; r < 3; r++)                                                               \
        for (v = 0; v < NV; v++) {                                                        \
            CB_VACT(a[r][v], act);                                                        \
            *(V *)(y + (oh + r) * W + ow + v * dv) = a[r][v];                             \
        }                                                                                 \
}                                                                                         \
/* The planes of each width class in a function of its own: inlined together,             \
 * GCC hoisted their first tiles' products above the branch on W and left                 \
 * those unfused. */                                                                      \
ATTR static inline __attribute__((always_inline)) void cb_dw_s3_rows_##SUF(const T *x,    \
        ptrdiff_t H, ptrdiff_t W, const V *w, T *y, const T *zero, V b0, int act,         \
        const int KIND) {                                                                 \
    const T *p[5];                                                                        \
    ptrdiff_t oh, o, ow, i;                                                               \
    for (oh = 0; oh < H; oh += 3) {                                                       \
        o = oh + 3 <= H ? oh : H - 3;                                                     \
        for (i = 0; i < 5; i++)                                                           \
            p[i] = o - 1 + i >= 0 && o - 1 + i < H ? x + (o - 1 + i) * W : zero;          \
        if (KIND == 0) {                                                                  \
            cb_dw_s3_tile_##SUF(p, w, y, W, o, 0, 0, b0, act, 1, 1, 1);                   \
        } else if (KIND == 1) {                                                           \
            cb_dw_s3_tile_##SUF(p, w, y, W, o, 0, W - VL, b0, act, 2, 1, 1);              \
        } else {                                                                          \
            cb_dw_s3_tile_##SUF(p, w, y, W, o, 0, VL, b0, act, 2, 1, 0);                  \
            for (ow = 2 * VL; ow + 2 * VL <= W - 2 * VL; ow += 2 * VL)                    \
                cb_dw_s3_tile_##SUF(p, w, y, W, o, ow, VL, b0, act, 2, 0, 0);             \
            if (ow < W - 2 * VL)                                                          \
                cb_dw_s3_tile_##SUF(p, w, y, W, o, W - 4 * VL, VL, b0, act, 2, 0, 0);     \
            cb_dw_s3_tile_##SUF(p, w, y, W, o, W - 2 * VL, VL, b0, act, 2, 0, 1);         \
        }                                                                                 \
    }                                                                                     \
}                                                                                         \
ATTR static __attribute__((noinline)) void cb_dw_s3_one_##SUF(const T *x, ptrdiff_t H,    \
        ptrdiff_t W, const V *w, T *y, const T *zero, V b0, int act) {                    \
    cb_dw_s3_rows_##SUF(x, H, W, w, y, zero, b0, act, 0);                                 \
}                                                                                         \
ATTR static __attribute__((noinline)) void cb_dw_s3_two_##SUF(const T *x, ptrdiff_t H,    \
        ptrdiff_t W, const V *w, T *y, const T *zero, V b0, int act) {                    \
    cb_dw_s3_rows_##SUF(x, H, W, w, y, zero, b0, act, 1);                                 \
}                                                                                         \
ATTR static __attribute__((noinline)) void cb_dw_s3_wide_##SUF(const T *x, ptrdiff_t H,   \
        ptrdiff_t W, const V *w, T *y, const T *zero, V b0, int act) {                    \
    cb_dw_s3_rows_##SUF(x, H, W, w, y, zero, b0, act, 2);                                 \
}                                                                                         \
ATTR static int cb_dw_fwd_cf_same3_##SUF(const T *x, ptrdiff_t H, ptrdiff_t W, const T *k, \
        ptrdiff_t ks, T *y, const T *zero, T bias, int act) {                             \
    V b0 = (V){0} + bias, w[9];                                                           \
    ptrdiff_t t;                                                                          \
    if (!CB_DW_SHUFFLE || !cb_dw_same3_state || !cb_dw_k3_state || H < 3 || W < VL)      \
        return 0;                                                                         \
    for (t = 0; t < 9; t++) w[t] = (V){0} + k[t * ks];                                    \
    if (W == VL) cb_dw_s3_one_##SUF(x, H, W, w, y, zero, b0, act);                        \
    else if (W <= 2 * VL) cb_dw_s3_two_##SUF(x, H, W, w, y, zero, b0, act);               \
    else cb_dw_s3_wide_##SUF(x, H, W, w, y, zero, b0, act);                               \
    return 1;                                                                             \
}

/* channels_first kernel gradient: taps [t0, t0 + NK) of kernel row ky
 * (columns co[j] + ow), each with two sums in registers, over the
 * whole plane. The last vector of a row overlaps the one before; keep masks
 * off its lanes that were already counted. */
#define CB_DW_KGRAD_CF(T, V, VL, SUF, ATTR)                                               \
ATTR static inline __attribute__((always_inline)) void cb_dw_kg_cf_taps_##SUF(const T *x, \
        ptrdiff_t rs, const T *dy, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t dh, \
        const ptrdiff_t *co, ptrdiff_t ky, ptrdiff_t t0, V keep, T *acc, const int NK) {  \
    typedef __typeof__(keep > keep) mask_t;                                               \
    V a0[4], a1[4];                                                                       \
    ptrdiff_t oh, ow;                                                                     \
    int j;                                                                                \
    for (j = 0; j < NK; j++) a0[j] = a1[j] = (V){0};                                      \
    for (oh = 0; oh < OH; oh++) {                                                         \
        const T *g = dy + oh * OW, *xr = x + (oh * sh + ky * dh) * rs;                    \
        for (ow = 0; ow + 2 * VL <= OW; ow += 2 * VL) {                                   \
            V g0 = *(const V *)(g + ow), g1 = *(const V *)(g + ow + VL);                  \
            for (j = 0; j < NK; j++) {                                                    \
                a0[j] += g0 * *(const V *)(xr + co[j] + ow);                              \
                a1[j] += g1 * *(const V *)(xr + co[j] + ow + VL);                         \
            }                                                                             \
        }                                                                                 \
        if (ow + VL <= OW) {                                                              \
            V g0 = *(const V *)(g + ow);                                                  \
            for (j = 0; j < NK; j++) a0[j] += g0 * *(const V *)(xr + co[j] + ow);         \
            ow += VL;                                                                     \
        }                                                                                 \
        if (ow < OW) {                                                                    \
            V g1 = *(const V *)(g + OW - VL);                                             \
            for (j = 0; j < NK; j++)                                                      \
                a1[j] += (V)((mask_t)(g1 * *(const V *)(xr + co[j] + OW - VL))            \
                             & (mask_t)keep);                                             \
        }                                                                                 \
    }                                                                                     \
    for (j = 0; j < NK; j++) *(V *)(acc + (t0 + j) * 8) += a0[j] + a1[j];                 \
}                                                                                         \
/* One plane, as cb_dw_kgrad_cf_scalar, with the sums spread over the lanes. */           \
ATTR static void cb_dw_kgrad_cf_plane_##SUF(const T *x, ptrdiff_t rs, const T *dy,        \
        ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh, ptrdiff_t dw, \
        ptrdiff_t KH, ptrdiff_t KW, T *acc) {                                             \
    T lane[VL];                                                                           \
    V keep;                                                                               \
    ptrdiff_t ky, kx0, j, co[KW];                                                         \
    if (OW < VL) {                                                                        \
        cb_dw_kgrad_cf_scalar_##SUF(x, rs, dy, OH, OW, sh, sw, dh, dw, KH, KW, acc);      \
        return;                                                                           \
    }                                                                                     \
    cb_dw_cols(co, KW, dw, sw, rs);                                                       \
    /* Lanes at or after VL - OW % VL of the overlapping last vector are new. */          \
    for (j = 0; j < VL; j++) lane[j] = (T)j;                                              \
    keep = (V)(*(const V *)lane >= (V){0} + (T)(VL - OW % VL));                           \
    for (ky = 0; ky < KH; ky++)                                                           \
        for (kx0 = 0; kx0 < KW; kx0 += 4)                                                 \
            switch (KW - kx0) {                                                           \
            case 1: CB_DW_TAPS(SUF, 1); break;                                            \
            case 2: CB_DW_TAPS(SUF, 2); break;                                            \
            case 3: CB_DW_TAPS(SUF, 3); break;                                            \
            default: CB_DW_TAPS(SUF, 4);                                                  \
            }                                                                             \
}

/* dst[j * ld + i] = src[i * ls + j] for i in [0, R), j in [0, S): blocks of
 * VL x VL transposed in registers by log2(VL) rounds of interleaving row i
 * with row i + VL/2 (two rounds of that perfect shuffle swap a block's row and
 * column bits once each), the rest scalar. */
#define CB_DW_TRANSPOSE(T, V, VL, SUF, ATTR)                                              \
ATTR static void cb_dw_transpose_##SUF(const T *src, ptrdiff_t ls, T *dst, ptrdiff_t ld,  \
        ptrdiff_t R, ptrdiff_t S) {                                                       \
    typedef __typeof__((V){0} > (V){0}) mask_t;                                           \
    mask_t ml, mh;                                                                        \
    ptrdiff_t i0, j0, RV = R - R % VL, SV = S - S % VL;                                   \
    int i, q;                                                                             \
    if (!CB_DW_SHUFFLE) RV = SV = 0;                                                      \
    for (i = 0; i < VL / 2; i++) {                                                        \
        ml[2 * i] = i;                                                                    \
        ml[2 * i + 1] = VL + i;                                                           \
        mh[2 * i] = VL / 2 + i;                                                           \
        mh[2 * i + 1] = VL + VL / 2 + i;                                                  \
    }                                                                                     \
    /* Blocks of columns outer: the VL rows of dst that a block writes are */            \
    /* complete after the sweep over i0, before other rows evict them.     */            \
    for (j0 = 0; j0 < SV; j0 += VL)                                                       \
        for (i0 = 0; i0 < RV; i0 += VL) {                                                 \
            V a[VL], b[VL];                                                               \
            CB_DW_UNROLL(16)                                                              \
            for (i = 0; i < VL; i++) a[i] = *(const V *)(src + (i0 + i) * ls + j0);       \
            for (q = VL; q > 1; q /= 2) {                                                 \
                CB_DW_UNROLL(8)                                                           \
                for (i = 0; i < VL / 2; i++) {                                            \
                    b[2 * i] = CB_DW_SHUF(a[i], a[i + VL / 2], ml);                       \
                    b[2 * i + 1] = CB_DW_SHUF(a[i], a[i + VL / 2], mh);                   \
                }                                                                         \
                CB_DW_UNROLL(16)                                                          \
                for (i = 0; i < VL; i++) a[i] = b[i];                                     \
            }                                                                             \
            CB_DW_UNROLL(16)                                                              \
            for (i = 0; i < VL; i++) *(V *)(dst + (j0 + i) * ld + i0) = a[i];             \
        }                                                                                 \
    cb_dw_transpose_rest_##SUF(src, ls, dst, ld, R, S, RV, SV);                           \
}

#define CB_DW_INSTANCE(T, V, VL, SUF, ATTR)                                               \
    CB_DW_SCALAR_CL(T, SUF, ATTR) CB_DW_CF_SCALAR(T, SUF, ATTR)                           \
    CB_DW_FWD_CL(T, V, VL, SUF, ATTR) CB_DW_KGRAD_CL(T, V, VL, SUF, ATTR)                 \
    CB_DW_PAD_HALVES(T, V, VL, SUF, ATTR) CB_DW_PAD_CF(T, V, VL, SUF, ATTR)               \
    CB_DW_FWD_CF(T, V, VL, SUF, ATTR) CB_DW_FWD_CF_SAME3(T, V, VL, SUF, ATTR)             \
    CB_DW_KGRAD_CF(T, V, VL, SUF, ATTR)                                                   \
    CB_DW_TRANSPOSE_REST(T, SUF, ATTR) CB_DW_TRANSPOSE(T, V, VL, SUF, ATTR)

CB_DW_INSTANCE(float, cb_v4f, 4, f_base, )
CB_DW_INSTANCE(double, cb_v2d, 2, d_base, )
#if CB_SIMD_AVX2
CB_DW_INSTANCE(float, cb_v8f, 8, f_avx2, CB_AVX2_ATTR)
CB_DW_INSTANCE(double, cb_v4d, 4, d_avx2, CB_AVX2_ATTR)
#define CB_DW_PICK(name, SUF) (cb_simd_has_avx2() ? name##SUF##_avx2 : name##SUF##_base)
#else
#define CB_DW_PICK(name, SUF) name##SUF##_base
#endif

#define CB_DW_DISPATCH(T, SUF)                                                            \
static void cb_dw_fwd_cl_row_##SUF(const T *const *xr, const T *k, T *y, ptrdiff_t C,     \
        ptrdiff_t xs, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw, \
        ptrdiff_t dw, ptrdiff_t pw, const T *bias, int act, const void *pf,               \
        ptrdiff_t pfb) {                                                                  \
    CB_DW_PICK(cb_dw_fwd_cl_row_, SUF)(xr, k, y, C, xs, W, KH, KW, OW, sw, dw, pw, bias,  \
                                       act, pf, pfb);                                     \
}                                                                                         \
static void cb_dw_kgrad_cl_row_##SUF(const T *const *xr, const T *dy, T *part,            \
        ptrdiff_t C, ptrdiff_t xs, ptrdiff_t ys, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, \
        ptrdiff_t OW, ptrdiff_t sw, ptrdiff_t dw, ptrdiff_t pw, const void *pf,           \
        ptrdiff_t pfb, const void *pf2, ptrdiff_t pf2b) {                                 \
    CB_DW_PICK(cb_dw_kgrad_cl_row_, SUF)(xr, dy, part, C, xs, ys, W, KH, KW, OW, sw, dw,  \
                                         pw, pf, pfb, pf2, pf2b);                         \
}                                                                                         \
static void cb_dw_pad_plane_##SUF(const T *src, ptrdiff_t H, ptrdiff_t W, T *buf,         \
        ptrdiff_t Hp, ptrdiff_t Wp, ptrdiff_t pt, ptrdiff_t pl, ptrdiff_t sw, ptrdiff_t uh, \
        ptrdiff_t uw) {                                                                   \
    CB_DW_PICK(cb_dw_pad_plane_, SUF)(src, H, W, buf, Hp, Wp, pt, pl, sw, uh, uw);        \
}                                                                                         \
static void cb_dw_fwd_cf_plane_##SUF(const T *x, ptrdiff_t rs, const T *k, ptrdiff_t ks,  \
        T *y, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh,       \
        ptrdiff_t dw, ptrdiff_t KH, ptrdiff_t KW, int accumulate, T bias, int act) {      \
    CB_DW_PICK(cb_dw_fwd_cf_plane_, SUF)(x, rs, k, ks, y, OH, OW, sh, sw, dh, dw, KH, KW, \
                                         accumulate, bias, act);                          \
}                                                                                         \
static int cb_dw_fwd_cf_same3_##SUF(const T *x, ptrdiff_t H, ptrdiff_t W, const T *k,     \
        ptrdiff_t ks, T *y, const T *zero, T bias, int act) {                             \
    return CB_DW_PICK(cb_dw_fwd_cf_same3_, SUF)(x, H, W, k, ks, y, zero, bias, act);      \
}                                                                                         \
static void cb_dw_kgrad_cf_plane_##SUF(const T *x, ptrdiff_t rs, const T *dy,             \
        ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t dh, ptrdiff_t dw, \
        ptrdiff_t KH, ptrdiff_t KW, T *acc) {                                             \
    CB_DW_PICK(cb_dw_kgrad_cf_plane_, SUF)(x, rs, dy, OH, OW, sh, sw, dh, dw, KH, KW, acc); \
}                                                                                         \
static void cb_dw_transpose_##SUF(const T *src, ptrdiff_t ls, T *dst, ptrdiff_t ld,       \
        ptrdiff_t R, ptrdiff_t S) {                                                       \
    CB_DW_PICK(cb_dw_transpose_, SUF)(src, ls, dst, ld, R, S);                            \
}

CB_DW_DISPATCH(float, f)
CB_DW_DISPATCH(double, d)

#else  /* no vector extensions: the same arithmetic, scalar */

#define CB_DW_PLAIN(T, SUF)                                                               \
static void cb_dw_fwd_cl_row_##SUF(const T *const *xr, const T *k, T *y, ptrdiff_t C,     \
        ptrdiff_t xs, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw, \
        ptrdiff_t dw, ptrdiff_t pw, const T *bias, int act, const void *pf,               \
        ptrdiff_t pfb) {                                                                  \
    ptrdiff_t ow;                                                                         \
    (void)pf; (void)pfb;                                                                  \
    for (ow = 0; ow < OW; ow++)                                                           \
        cb_dw_pixel_##SUF(xr, k, y + ow * C, C, xs, W, KH, KW, ow * sw - pw, dw, 0, C,    \
                          bias, act);                                                     \
}                                                                                         \
static void cb_dw_kgrad_cl_row_##SUF(const T *const *xr, const T *dy, T *part,            \
        ptrdiff_t C, ptrdiff_t xs, ptrdiff_t ys, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, \
        ptrdiff_t OW, ptrdiff_t sw, ptrdiff_t dw, ptrdiff_t pw, const void *pf,           \
        ptrdiff_t pfb, const void *pf2, ptrdiff_t pf2b) {                                 \
    (void)pf; (void)pfb; (void)pf2; (void)pf2b;                                           \
    cb_dw_kgrad_cl_scalar_##SUF(xr, dy, part, C, xs, ys, W, KH, KW, OW, sw, dw, pw, 0, C); \
}

CB_DW_CF_SCALAR(float, f, )
CB_DW_CF_SCALAR(double, d, )
CB_DW_PLAIN(float, f)
CB_DW_PLAIN(double, d)
#define cb_dw_pad_plane_f cb_dw_pad_phases_f
#define cb_dw_pad_plane_d cb_dw_pad_phases_d
#define cb_dw_fwd_cf_plane_f cb_dw_fwd_cf_scalar_f
#define cb_dw_fwd_cf_plane_d cb_dw_fwd_cf_scalar_d
#define cb_dw_fwd_cf_same3_f(x, H, W, k, ks, y, zero, bias, act) 0
#define cb_dw_fwd_cf_same3_d(x, H, W, k, ks, y, zero, bias, act) 0
#define cb_dw_kgrad_cf_plane_f cb_dw_kgrad_cf_scalar_f
#define cb_dw_kgrad_cf_plane_d cb_dw_kgrad_cf_scalar_d
#define cb_dw_transpose_f(src, ls, dst, ld, R, S) \
    cb_dw_transpose_rest_f(src, ls, dst, ld, R, S, 0, 0)
#define cb_dw_transpose_d(src, ls, dst, ld, R, S) \
    cb_dw_transpose_rest_d(src, ls, dst, ld, R, S, 0, 0)

#endif

#endif
