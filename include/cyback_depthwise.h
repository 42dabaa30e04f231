/* Row kernels of the depthwise convolution (cyback/kernels/depthwise.pyx).
 *
 * A depthwise convolution is memory-bound only if its inner loops run at
 * vector width: each output value is a KH*KW-long dot product over one
 * channel. These kernels compute one output row with the accumulators in
 * vector registers:
 *   - channels_last: vectors run over channels, and four output pixels share
 *     each kernel-tap load;
 *   - channels_first: vectors run along the row (stride 1) over input rows
 *     that the caller has zero-padded on the left and right, so no pixel
 *     needs a bounds check.
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

/* One output pixel, channels [c0, c1), scalar, with bounds checks. */
#define CB_DW_PIXEL_SCALAR(T, SUF, ATTR)                                                  \
ATTR static inline void cb_dw_pixel_##SUF(const T *const *xr, const T *k, T *yp, ptrdiff_t C,  \
        ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t iw0, ptrdiff_t dw,              \
        ptrdiff_t c0, ptrdiff_t c1, const T *bias, int act) {                             \
    ptrdiff_t c, ky, kx, iw;                                                              \
    for (c = c0; c < c1; c++) {                                                           \
        T s = bias ? bias[c] : (T)0;                                                      \
        for (ky = 0; ky < KH; ky++) {                                                     \
            if (!xr[ky]) continue;                                                        \
            for (kx = 0; kx < KW; kx++) {                                                 \
                iw = iw0 + kx * dw;                                                       \
                if (iw < 0 || iw >= W) continue;                                          \
                s += xr[ky][iw * C + c] * k[(ky * KW + kx) * C + c];                      \
            }                                                                             \
        }                                                                                 \
        yp[c] = CB_ACT(T, s, act);                                                     \
    }                                                                                     \
}

CB_DW_PIXEL_SCALAR(float, f, )
CB_DW_PIXEL_SCALAR(double, d, )

#if CB_SIMD_VECTOR

/* channels_last forward row: y[ow, c] for ow in [0, OW), c in [0, C).
 * xr[ky]: input row (W, C) read by kernel row ky, or NULL when it is padding.
 * k: (KH, KW, C). Input column of tap kx of output ow: ow*sw - pw + kx*dw. */
#define CB_DW_FWD_CL(T, V, VL, SUF, ATTR)                                                 \
ATTR static void cb_dw_fwd_cl_row_##SUF(const T *const *xr, const T *k, T *y,             \
        ptrdiff_t C, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw, \
        ptrdiff_t dw, ptrdiff_t pw, const T *bias, int act) {                             \
    ptrdiff_t lo, hi, c, ow, ky, kx, iw, CV = C - C % VL;                                 \
    ptrdiff_t sC = sw * C;                                                                \
    cb_dw_interior(W, KW, OW, sw, dw, pw, &lo, &hi);                                      \
    /* Pixels outer, channels inner: the kernel (KH*KW*C) stays in L1 while   */          \
    /* the input streams through once.                                        */          \
    for (ow = 0; ow < OW; ow++) {                                                         \
        if (ow >= lo && ow + 4 <= hi) {                                                   \
            /* Four interior pixels: every tap valid, one kernel load each. */            \
            for (c = 0; c < CV; c += VL) {                                                \
                V a0 = (V){0}, a1, a2, a3;                                                \
                if (bias) a0 = *(const V *)(bias + c);                                    \
                a1 = a0; a2 = a0; a3 = a0;                                                \
                for (ky = 0; ky < KH; ky++) {                                             \
                    const T *xb, *kb;                                                     \
                    if (!xr[ky]) continue;                                                \
                    xb = xr[ky] + (ow * sw - pw) * C + c;                                 \
                    kb = k + ky * KW * C + c;                                             \
                    for (kx = 0; kx < KW; kx++) {                                         \
                        V kv = *(const V *)(kb + kx * C);                                 \
                        const T *xp = xb + kx * dw * C;                                   \
                        a0 += *(const V *)(xp) * kv;                                      \
                        a1 += *(const V *)(xp + sC) * kv;                                 \
                        a2 += *(const V *)(xp + 2 * sC) * kv;                             \
                        a3 += *(const V *)(xp + 3 * sC) * kv;                             \
                    }                                                                     \
                }                                                                         \
                CB_VACT(a0, act);                                                \
                CB_VACT(a1, act);                                                \
                CB_VACT(a2, act);                                                \
                CB_VACT(a3, act);                                                \
                *(V *)(y + ow * C + c) = a0;                                              \
                *(V *)(y + (ow + 1) * C + c) = a1;                                        \
                *(V *)(y + (ow + 2) * C + c) = a2;                                        \
                *(V *)(y + (ow + 3) * C + c) = a3;                                        \
            }                                                                             \
            if (CV < C)                                                                   \
                for (c = 0; c < 4; c++)                                                   \
                    cb_dw_pixel_##SUF(xr, k, y + (ow + c) * C, C, W, KH, KW,              \
                                      (ow + c) * sw - pw, dw, CV, C, bias, act);          \
            ow += 3;                                                                      \
            continue;                                                                     \
        }                                                                                 \
        for (c = 0; c < CV; c += VL) {                                                    \
            V a0 = (V){0};                                                                \
            ptrdiff_t iw0 = ow * sw - pw;                                                 \
            if (bias) a0 = *(const V *)(bias + c);                                        \
            for (ky = 0; ky < KH; ky++) {                                                 \
                if (!xr[ky]) continue;                                                    \
                for (kx = 0; kx < KW; kx++) {                                             \
                    iw = iw0 + kx * dw;                                                   \
                    if (iw < 0 || iw >= W) continue;                                      \
                    a0 += *(const V *)(xr[ky] + iw * C + c)                               \
                          * *(const V *)(k + (ky * KW + kx) * C + c);                     \
                }                                                                         \
            }                                                                             \
            CB_VACT(a0, act);                                                    \
            *(V *)(y + ow * C + c) = a0;                                                  \
        }                                                                                 \
        if (CV < C)                                                                       \
            cb_dw_pixel_##SUF(xr, k, y + ow * C, C, W, KH, KW, ow * sw - pw, dw, CV, C,   \
                              bias, act);                                                 \
    }                                                                                     \
}

/* channels_first forward plane, stride 1 along rows: y (OH, OW) (+= when
 * accumulate). Output row oh reads rows oh*sh - ph + ky*dh of the input
 * plane, Hs rows rs apart, already zero-padded along the row so that tap kx
 * of output ow reads row[ow + kx*dw]; rows outside [0, Hs) are padding.
 * Kernel tap (ky, kx) is k[(ky*KW + kx) * ks]. */
#define CB_DW_FWD_CF(T, V, VL, SUF, ATTR)                                                 \
ATTR static void cb_dw_fwd_cf_plane_##SUF(const T *x, ptrdiff_t rs, ptrdiff_t Hs,         \
        const T *k, ptrdiff_t ks, T *y, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh,         \
        ptrdiff_t dh, ptrdiff_t ph, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t dw,             \
        int accumulate, T bias, int act) {                                                \
    ptrdiff_t oh, ow, ky, kx, OV2 = OW - OW % (2 * VL), OV = OW - OW % VL;            \
    V b0 = (V){0} + bias;                                                                 \
    for (oh = 0; oh < OH; oh++) {                                                         \
        T *yr = y + oh * OW;                                                              \
        ptrdiff_t ky0 = 0, ky1 = KH;                                                      \
        ptrdiff_t ih0 = oh * sh - ph;                                                     \
        /* The kernel rows whose input row lies inside the plane. */                      \
        while (ky0 < KH && ih0 + ky0 * dh < 0) ky0++;                                      \
        while (ky1 > ky0 && ih0 + (ky1 - 1) * dh >= Hs) ky1--;                            \
        for (ow = 0; ow < OV2; ow += 2 * VL) {                                            \
            V a0 = b0, a1 = b0;                                                           \
            if (accumulate) { a0 = *(V *)(yr + ow); a1 = *(V *)(yr + ow + VL); }          \
            for (ky = ky0; ky < ky1; ky++) {                                              \
                const T *xp = x + (ih0 + ky * dh) * rs + ow;                              \
                for (kx = 0; kx < KW; kx++) {                                             \
                    T kv = k[(ky * KW + kx) * ks];                                        \
                    a0 += *(const V *)(xp + kx * dw) * kv;                                \
                    a1 += *(const V *)(xp + kx * dw + VL) * kv;                           \
                }                                                                         \
            }                                                                             \
            CB_VACT(a0, act);                                                    \
            CB_VACT(a1, act);                                                    \
            *(V *)(yr + ow) = a0;                                                         \
            *(V *)(yr + ow + VL) = a1;                                                    \
        }                                                                                 \
        /* The last vector may overlap the previous one (same values), */                 \
        /* unless the sums accumulate onto y.                          */                 \
        for (; ow < OW && OW >= VL && (ow < OV || !accumulate); ow += VL) {               \
            V a0 = b0;                                                                    \
            if (ow > OW - VL) ow = OW - VL;                                               \
            if (accumulate) a0 = *(V *)(yr + ow);                                         \
            for (ky = ky0; ky < ky1; ky++)                                                \
                for (kx = 0; kx < KW; kx++)                                               \
                    a0 += *(const V *)(x + (ih0 + ky * dh) * rs + ow + kx * dw)               \
                          * k[(ky * KW + kx) * ks];                                       \
            CB_VACT(a0, act);                                                    \
            *(V *)(yr + ow) = a0;                                                         \
        }                                                                                 \
        for (; ow < OW; ow++) {                                                           \
            T s = accumulate ? yr[ow] : bias;                                             \
            for (ky = ky0; ky < ky1; ky++)                                                \
                for (kx = 0; kx < KW; kx++)                                               \
                    s += x[(ih0 + ky * dh) * rs + ow + kx * dw] * k[(ky * KW + kx) * ks];      \
            yr[ow] = CB_ACT(T, s, act);                                                \
        }                                                                                 \
    }                                                                                     \
}

/* channels_last kernel-gradient row: part[ky, kx, c] += sum over ow of
 * dy[ow, c] * x[ky][ow*sw - pw + kx*dw, c] (the valid ow only). */
#define CB_DW_KGRAD_CL(T, V, VL, SUF, ATTR)                                               \
ATTR static void cb_dw_kgrad_cl_row_##SUF(const T *const *xr, const T *dy,               \
        T *part, ptrdiff_t C, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW,      \
        ptrdiff_t sw, ptrdiff_t dw, ptrdiff_t pw) {                                       \
    ptrdiff_t c, c0, c1, ow, ky, kx, lo, hi, off, CV = C - C % VL;                        \
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
                    for (ow = lo; ow + 1 < hi; ow += 2) {                                 \
                        a0 += *(const V *)(dy + ow * C + c)                               \
                              * *(const V *)(xr[ky] + (ow * sw + off) * C + c);           \
                        a1 += *(const V *)(dy + (ow + 1) * C + c)                         \
                              * *(const V *)(xr[ky] + ((ow + 1) * sw + off) * C + c);     \
                    }                                                                     \
                    if (ow < hi)                                                          \
                        a0 += *(const V *)(dy + ow * C + c)                               \
                              * *(const V *)(xr[ky] + (ow * sw + off) * C + c);           \
                    *(V *)(kp + c) += a0 + a1;                                            \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    for (ky = 0; ky < KH; ky++) {                                                         \
        if (!xr[ky]) continue;                                                            \
        for (kx = 0; kx < KW; kx++) {                                                     \
            T *kp = part + (ky * KW + kx) * C;                                            \
            off = kx * dw - pw;                                                           \
            cb_dw_valid(off, sw, W, OW, &lo, &hi);                                        \
            for (c = CV; c < C; c++) {                                                    \
                T s = 0;                                                                  \
                for (ow = lo; ow < hi; ow++)                                              \
                    s += dy[ow * C + c] * xr[ky][(ow * sw + off) * C + c];                \
                kp[c] += s;                                                               \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

/* channels_first kernel gradient of one plane, stride 1 along rows:
 * acc[(ky*KW + kx) * 8 + lane] += partial sums of dy[oh, ow] *
 * x[oh*sh - ph + ky*dh][ow + kx*dw] (rows padded as for cb_dw_fwd_cf_plane).
 * The caller sums the 8 lanes of each tap (lanes a vector does not use stay
 * as they were). */
#define CB_DW_KGRAD_CF(T, V, VL, SUF, ATTR)                                               \
ATTR static void cb_dw_kgrad_cf_plane_##SUF(const T *x, ptrdiff_t rs, ptrdiff_t Hs,       \
        const T *dy, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t dh,              \
        ptrdiff_t ph, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t dw, T *acc) {                 \
    ptrdiff_t oh, ow, ky, kx, OV = OW - OW % VL;                                          \
    for (oh = 0; oh < OH; oh++) {                                                         \
        const T *g = dy + oh * OW;                                                        \
        ptrdiff_t ih0 = oh * sh - ph;                                                     \
        for (ky = 0; ky < KH; ky++) {                                                     \
            const T *xr;                                                                  \
            if (ih0 + ky * dh < 0 || ih0 + ky * dh >= Hs) continue;                       \
            xr = x + (ih0 + ky * dh) * rs;                                                \
            for (kx = 0; kx < KW; kx++) {                                                 \
                V a = *(V *)(acc + (ky * KW + kx) * 8);                                   \
                T t = 0;                                                                  \
                const T *xp = xr + kx * dw;                                               \
                for (ow = 0; ow < OV; ow += VL)                                           \
                    a += *(const V *)(g + ow) * *(const V *)(xp + ow);                    \
                for (; ow < OW; ow++)                                                     \
                    t += g[ow] * xp[ow];                                                  \
                a[0] += t;                                                                \
                *(V *)(acc + (ky * KW + kx) * 8) = a;                                     \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

#define CB_DW_INSTANCE(T, V, VL, SUF, ATTR) \
    CB_DW_PIXEL_SCALAR(T, SUF, ATTR) \
    CB_DW_FWD_CL(T, V, VL, SUF, ATTR) CB_DW_FWD_CF(T, V, VL, SUF, ATTR) \
    CB_DW_KGRAD_CL(T, V, VL, SUF, ATTR) CB_DW_KGRAD_CF(T, V, VL, SUF, ATTR)

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
        ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw, ptrdiff_t dw,\
        ptrdiff_t pw, const T *bias, int act) {                                           \
    CB_DW_PICK(cb_dw_fwd_cl_row_, SUF)(xr, k, y, C, W, KH, KW, OW, sw, dw, pw, bias, act);\
}                                                                                         \
static void cb_dw_fwd_cf_plane_##SUF(const T *x, ptrdiff_t rs, ptrdiff_t Hs, const T *k,   \
        ptrdiff_t ks, T *y, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t dh,       \
        ptrdiff_t ph, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t dw, int accumulate, T bias,   \
        int act) {                                                                        \
    CB_DW_PICK(cb_dw_fwd_cf_plane_, SUF)(x, rs, Hs, k, ks, y, OH, OW, sh, dh, ph, KH, KW, \
                                         dw, accumulate, bias, act);                      \
}                                                                                         \
static void cb_dw_kgrad_cl_row_##SUF(const T *const *xr, const T *dy, T *part,            \
        ptrdiff_t C, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw, \
        ptrdiff_t dw, ptrdiff_t pw) {                                                     \
    CB_DW_PICK(cb_dw_kgrad_cl_row_, SUF)(xr, dy, part, C, W, KH, KW, OW, sw, dw, pw);     \
}                                                                                         \
static void cb_dw_kgrad_cf_plane_##SUF(const T *x, ptrdiff_t rs, ptrdiff_t Hs, const T *dy,\
        ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t dh, ptrdiff_t ph, ptrdiff_t KH,\
        ptrdiff_t KW, ptrdiff_t dw, T *acc) {                                             \
    CB_DW_PICK(cb_dw_kgrad_cf_plane_, SUF)(x, rs, Hs, dy, OH, OW, sh, dh, ph, KH, KW, dw, \
                                           acc);                                          \
}

CB_DW_DISPATCH(float, f)
CB_DW_DISPATCH(double, d)

#else  /* no vector extensions: the same arithmetic, scalar */

#define CB_DW_PLAIN(T, SUF)                                                               \
static void cb_dw_fwd_cl_row_##SUF(const T *const *xr, const T *k, T *y, ptrdiff_t C,     \
        ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw, ptrdiff_t dw,\
        ptrdiff_t pw, const T *bias, int act) {                                           \
    ptrdiff_t ow;                                                                         \
    for (ow = 0; ow < OW; ow++)                                                           \
        cb_dw_pixel_##SUF(xr, k, y + ow * C, C, W, KH, KW, ow * sw - pw, dw, 0, C,        \
                          bias, act);                                                     \
}                                                                                         \
static void cb_dw_fwd_cf_plane_##SUF(const T *x, ptrdiff_t rs, ptrdiff_t Hs, const T *k,   \
        ptrdiff_t ks, T *y, ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t dh,       \
        ptrdiff_t ph, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t dw, int accumulate, T bias,   \
        int act) {                                                                        \
    ptrdiff_t oh, ow, ky, kx, ih;                                                         \
    for (oh = 0; oh < OH; oh++)                                                           \
        for (ow = 0; ow < OW; ow++) {                                                     \
            T s = accumulate ? y[oh * OW + ow] : bias;                                    \
            for (ky = 0; ky < KH; ky++) {                                                 \
                ih = oh * sh - ph + ky * dh;                                              \
                if (ih < 0 || ih >= Hs) continue;                                         \
                for (kx = 0; kx < KW; kx++)                                               \
                    s += x[ih * rs + ow + kx * dw] * k[(ky * KW + kx) * ks];              \
            }                                                                             \
            y[oh * OW + ow] = CB_ACT(T, s, act);                                       \
        }                                                                                 \
}                                                                                         \
static void cb_dw_kgrad_cl_row_##SUF(const T *const *xr, const T *dy, T *part,            \
        ptrdiff_t C, ptrdiff_t W, ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw, \
        ptrdiff_t dw, ptrdiff_t pw) {                                                     \
    ptrdiff_t c, ow, ky, kx, lo, hi, off;                                                 \
    for (ky = 0; ky < KH; ky++) {                                                         \
        if (!xr[ky]) continue;                                                            \
        for (kx = 0; kx < KW; kx++) {                                                     \
            off = kx * dw - pw;                                                           \
            cb_dw_valid(off, sw, W, OW, &lo, &hi);                                        \
            for (c = 0; c < C; c++) {                                                     \
                T s = 0;                                                                  \
                for (ow = lo; ow < hi; ow++)                                              \
                    s += dy[ow * C + c] * xr[ky][(ow * sw + off) * C + c];                \
                part[(ky * KW + kx) * C + c] += s;                                        \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

#define CB_DW_PLAIN_KGRAD_CF(T, SUF)                                                      \
static void cb_dw_kgrad_cf_plane_##SUF(const T *x, ptrdiff_t rs, ptrdiff_t Hs, const T *dy,\
        ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t sh, ptrdiff_t dh, ptrdiff_t ph, ptrdiff_t KH,\
        ptrdiff_t KW, ptrdiff_t dw, T *acc) {                                             \
    ptrdiff_t oh, ow, ky, kx, ih;                                                         \
    for (oh = 0; oh < OH; oh++)                                                           \
        for (ky = 0; ky < KH; ky++) {                                                     \
            ih = oh * sh - ph + ky * dh;                                                  \
            if (ih < 0 || ih >= Hs) continue;                                             \
            for (kx = 0; kx < KW; kx++) {                                                 \
                T t = 0;                                                                  \
                for (ow = 0; ow < OW; ow++)                                               \
                    t += dy[oh * OW + ow] * x[ih * rs + ow + kx * dw];                    \
                acc[(ky * KW + kx) * 8] += t;                                             \
            }                                                                             \
        }                                                                                 \
}

CB_DW_PLAIN_KGRAD_CF(float, f)
CB_DW_PLAIN_KGRAD_CF(double, d)
CB_DW_PLAIN(float, f)
CB_DW_PLAIN(double, d)

#endif

#endif
