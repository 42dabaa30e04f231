/* What the depthwise kernels of both layouts share (cyback_depthwise.h
 * includes it before the layout templates): the geometry of a row, the test
 * switches, and the template machinery.
 *
 * Templates. The layout headers (cyback_depthwise_last.h,
 * cyback_depthwise_first.h, cyback_depthwise_transpose.h) are written once
 * and included once per instance, with these macros defined by the includer:
 *   T     the element type (float or double);
 *   SUF   the suffix of the instance's function names (f, d, f_base, f_avx2 ...);
 *   ATTR  the target attribute of its functions (empty, or CB_AVX2_ATTR);
 *   V, VL the vector type and its lanes, for a vector instance only.
 * C has no generic functions, and each kernel is needed for two types and, on
 * x86, two instruction sets: a template header keeps one copy of the code with
 * its own line numbers (compiler messages, debuggers), where a function-making
 * macro would put all of it on one line. CB_TYPED(name) is name followed by
 * the instance's suffix.
 */
#ifndef CYBACK_DEPTHWISE_COMMON_H
#define CYBACK_DEPTHWISE_COMMON_H

#include <stddef.h>

#include "cyback_simd.h"

#define CB_DEPTHWISE_PASTE(a, b) a##b
#define CB_DEPTHWISE_PASTE2(a, b) CB_DEPTHWISE_PASTE(a, b)
#define CB_TYPED(name) CB_DEPTHWISE_PASTE2(name, SUF)

static inline ptrdiff_t cb_depthwise_cdiv(ptrdiff_t a, ptrdiff_t b) {
    /* ceil(a / b) for b > 0 and any sign of a */
    return a <= 0 ? -((-a) / b) : (a + b - 1) / b;
}

/* Output columns [*lo, *hi) whose input column ow*sw + off lies in [0, W)
 * (an empty range may have hi < lo). Stride 1 needs no division. */
static inline void cb_depthwise_valid(ptrdiff_t off, ptrdiff_t sw, ptrdiff_t W, ptrdiff_t OW,
                                      ptrdiff_t *lo, ptrdiff_t *hi) {
    if (sw == 1) {
        *lo = off < 0 ? -off : 0;
        *hi = W - off < OW ? W - off : OW;
    } else {
        *lo = cb_depthwise_cdiv(-off, sw);
        if (*lo < 0) *lo = 0;
        *hi = cb_depthwise_cdiv(W - off, sw);
        if (*hi > OW) *hi = OW;
    }
}

/* Output columns [*lo, *hi) whose taps all fall inside [0, W). */
static inline void cb_depthwise_interior(ptrdiff_t W, ptrdiff_t KW, ptrdiff_t OW, ptrdiff_t sw,
                                         ptrdiff_t dil_w, ptrdiff_t pw, ptrdiff_t *lo,
                                         ptrdiff_t *hi) {
    ptrdiff_t a = cb_depthwise_cdiv(pw, sw), b;
    ptrdiff_t last = W - 1 + pw - (KW - 1) * dil_w;  /* ow*sw <= last */
    b = last < 0 ? 0 : last / sw + 1;
    if (a < 0) a = 0;
    if (a > OW) a = OW;
    if (b > OW) b = OW;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

/* The 3x3 row-reuse forward of channels_first planes and the three-tap
 * column reuse of channels_last rows (on unless a test turns them off to
 * check them against the general tiles). */
static int cb_depthwise_k3_state = 1;
static int cb_depthwise_use_k3(int on) {
    cb_depthwise_k3_state = on != 0;
    return cb_depthwise_k3_state;
}

/* Reading the edges of channels_first 3x3 "same" planes in the kernel (on
 * unless a test pads them, to check one path against the other). */
static int cb_depthwise_same3_state = 1;
static int cb_depthwise_read_edges(int on) {
    cb_depthwise_same3_state = on != 0;
    return cb_depthwise_same3_state;
}

/* Full unrolling of the short constant loops of the register tiles, so that
 * their indices (and the weights they pick) are known when compiled. */
#if defined(__GNUC__)
#define CB_DEPTHWISE_PRAGMA(x) _Pragma(#x)
#define CB_DEPTHWISE_UNROLL(n) CB_DEPTHWISE_PRAGMA(GCC unroll n)
#else
#define CB_DEPTHWISE_UNROLL(n)
#endif

/* Column offsets co[kx] of the kernel taps in a channels_first padded row
 * (cyback_depthwise_first.h): tap kx of output ow reads column co[kx] + ow. */
static inline void cb_depthwise_cols(ptrdiff_t *co, ptrdiff_t KW, ptrdiff_t dil_w, ptrdiff_t sw,
                                     ptrdiff_t rs) {
    ptrdiff_t kx;
    for (kx = 0; kx < KW; kx++) co[kx] = kx * dil_w % sw * (rs / sw) + kx * dil_w / sw;
}

#if CB_SIMD_VECTOR
/* GCC's two-vector shuffle splits even and odd lanes; other compilers
 * (clang has no __builtin_shuffle) keep the scalar phase copy. */
#if defined(__clang__)
#define CB_DEPTHWISE_SHUFFLE 0
#define CB_DEPTHWISE_SHUF(a, b, mask) (a)
#else
#define CB_DEPTHWISE_SHUFFLE 1
#define CB_DEPTHWISE_SHUF(a, b, mask) __builtin_shuffle(a, b, mask)
#endif

/* The AVX2 + FMA instance of a kernel where the CPU has them, else the
 * baseline one (SUF: the type's suffix, f or d). */
#if CB_SIMD_AVX2
#define CB_DEPTHWISE_PICK(name)                                                           \
    (cb_simd_has_avx2() ? CB_DEPTHWISE_PASTE2(CB_TYPED(name), _avx2)                      \
                        : CB_DEPTHWISE_PASTE2(CB_TYPED(name), _base))
#else
#define CB_DEPTHWISE_PICK(name) CB_DEPTHWISE_PASTE2(CB_TYPED(name), _base)
#endif
#endif

#endif
