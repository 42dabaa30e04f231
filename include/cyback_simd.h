/* Vector types and the run-time AVX2 / AVX-512 switch shared by the
 * hand-vectorised kernels (cyback_depthwise.h, cyback_conv_direct.h, ...).
 *
 * The wheels are built for baseline x86-64 (SSE2, 16-byte vectors). On x86
 * with GCC or clang a kernel is compiled a second time with CB_AVX2_ATTR
 * (32-byte vectors, fused multiply-adds) and picked at run time when the CPU
 * has AVX2 and FMA. The direct and Winograd convolutions and the recurrent
 * product have a third set with CB_AVX512_ATTR (64-byte vectors) for CPUs
 * with AVX-512F. Compilers without GCC vector extensions get plain loops.
 *
 * The vector types are declared with element alignment so that loads and
 * stores through them may be unaligned (rows of an array start anywhere).
 */
#ifndef CYBACK_SIMD_H
#define CYBACK_SIMD_H

#include <stddef.h>
#include <stdlib.h>

/* Activation codes of the in-register epilogues (applied after a bias).
 * NaN passes through both, as through np.maximum / np.minimum. */
#define CB_ACT_NONE 0
#define CB_ACT_RELU 1
#define CB_ACT_RELU6 2

#define CB_ACT(T, v, act)                                                                 \
    ((act) == CB_ACT_NONE ? (v) : (v) <= (T)0 ? (T)0                                      \
     : ((act) == CB_ACT_RELU6 && (v) > (T)6) ? (T)6 : (v))

#if defined(__GNUC__)
#define CB_SIMD_VECTOR 1
typedef float cb_v8f __attribute__((vector_size(32), aligned(4)));
typedef double cb_v4d __attribute__((vector_size(32), aligned(8)));
typedef float cb_v4f __attribute__((vector_size(16), aligned(4)));
typedef double cb_v2d __attribute__((vector_size(16), aligned(8)));

/* v = act(v) for a vector v, branch-free: integer masks of the comparisons
 * (whose type is the matching signed integer vector). */
#define CB_VACT(v, act)                                                                   \
    do {                                                                                  \
        if ((act) != CB_ACT_NONE) {                                                       \
            typedef __typeof__((v) > (v)) cb_mask_;                                       \
            const __typeof__(v) z_ = {0}, six_ = z_ + 6;                                  \
            v = (__typeof__(v))((cb_mask_)(v) & ~((v) <= z_));                            \
            if ((act) == CB_ACT_RELU6) {                                                  \
                cb_mask_ m_ = (v) > six_;                                                 \
                v = (__typeof__(v))(((cb_mask_)(v) & ~m_) | ((cb_mask_)six_ & m_));       \
            }                                                                             \
        }                                                                                 \
    } while (0)
#else
#define CB_SIMD_VECTOR 0
#endif

#if CB_SIMD_VECTOR && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#include <immintrin.h>
#define CB_SIMD_AVX2 1
#define CB_SIMD_AVX512 1
#define CB_AVX2_ATTR __attribute__((target("avx2,fma")))
#define CB_AVX512_ATTR __attribute__((target("avx512f,avx2,fma")))
typedef float cb_v16f __attribute__((vector_size(64), aligned(4)));
typedef double cb_v8d __attribute__((vector_size(64), aligned(8)));
/* One of each per extension module (each includes this header). The CPU's
 * sets, read once (-1: not yet; a benign race): 0 baseline, 1 AVX2 + FMA,
 * 2 AVX-512F as well (the OS saving zmm state: libgcc checks XCR0). */
static int cb_simd_cpu_level = -1;
/* The highest set the kernels may run (tests lower it; CYBACK_AVX512=0 caps
 * it at AVX2 for hosts where 512-bit code lowers the clock of other work). */
static int cb_simd_cap = -1;
/* The cap when no test lowered it: 2, or 1 where CYBACK_AVX512=0 (each
 * module passes cyback.kernels.settings' value on when it is imported). */
static int cb_simd_default_cap = 2;

static void cb_simd_set_default_cap(int cap) {
    cb_simd_default_cap = cap;
    cb_simd_cap = -1;
}

static int cb_simd_level(void) {
    if (cb_simd_cpu_level < 0) {
        int level = 0;
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
            level = 1;
            if (__builtin_cpu_supports("avx512f")) level = 2;
        }
        cb_simd_cpu_level = level;
    }
    if (cb_simd_cap < 0) cb_simd_cap = cb_simd_default_cap;
    return cb_simd_cpu_level < cb_simd_cap ? cb_simd_cpu_level : cb_simd_cap;
}

/* 1 when the AVX2 + FMA kernels (or wider ones) may run. */
static int cb_simd_has_avx2(void) { return cb_simd_level() >= 1; }

/* 1 when the AVX-512 kernels run. */
static int cb_simd_has_avx512(void) { return cb_simd_level() >= 2; }

/* 1 on CPUs that run a 512-bit FMA as two 256-bit halves: AMD family 19h
 * (Zen 4; Zen 3, the same family, has no AVX-512). There a zmm FMA costs
 * two ymm ones, and kernels choose their register tiles accordingly. Read
 * once (-1: not yet; a benign race). */
static int cb_simd_half_rate = -1;

static int cb_simd_half_rate_512(void) {
    if (cb_simd_half_rate < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0, family = 0;
        int amd = __get_cpuid(0, &a, &b, &c, &d)
            && b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  /* AuthenticAMD */
        if (amd && __get_cpuid(1, &a, &b, &c, &d)) {
            family = (a >> 8) & 0xf;
            if (family == 0xf) family += (a >> 20) & 0xff;
        }
        cb_simd_half_rate = amd && family == 0x19;
    }
    return cb_simd_half_rate;
}

/* The tails of the hand-written AVX-512 / AVX2 loops (attention, pooling,
 * extremes, vector math): the lanes below `left`, none for left <= 0 and
 * all from a vector's width on. */
static inline __mmask16 cb_simd_mask16(ptrdiff_t left) {
    return left >= 16 ? (__mmask16)0xffff
                      : left > 0 ? (__mmask16)((1u << left) - 1) : (__mmask16)0;
}

/* As cb_simd_mask16, for 8-lane maskload / maskstore. */
CB_AVX2_ATTR static inline __m256i cb_simd_mask8(ptrdiff_t left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left < 0 ? 0 : left < 8 ? left : 8)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The block width of a kernel with an AVX-512 set for n output columns: twice
 * the AVX2 or baseline width `narrow` where AVX-512 runs and n is wider than
 * narrow (n <= narrow would leave half of a wide block empty). */
static ptrdiff_t cb_simd_block(ptrdiff_t narrow, ptrdiff_t n) {
    return n > narrow && cb_simd_has_avx512() ? 2 * narrow : narrow;
}

/* Tests run every kernel set: on = 0 forces the baseline one, on = 1 goes
 * back to the default (the widest set the CPU has, unless CYBACK_AVX512=0).
 * Returns whether AVX2 now runs. */
static int cb_simd_use_avx2(int on) {
    cb_simd_cap = on ? -1 : 0;
    return cb_simd_has_avx2();
}

/* on = 0 caps the kernels at AVX2; on = 1 goes back to the default (as
 * above). Returns whether AVX-512 now runs. */
static int cb_simd_use_avx512(int on) {
    cb_simd_cap = on ? -1 : 1;
    return cb_simd_has_avx512();
}
#else
#define CB_SIMD_AVX2 0
#define CB_SIMD_AVX512 0
static int cb_simd_has_avx2(void) { return 0; }
static int cb_simd_has_avx512(void) { return 0; }
static int cb_simd_use_avx2(int on) { (void)on; return 0; }
static int cb_simd_use_avx512(int on) { (void)on; return 0; }
static void cb_simd_set_default_cap(int cap) { (void)cap; }
static int cb_simd_half_rate_512(void) { return 0; }
static ptrdiff_t cb_simd_block(ptrdiff_t narrow, ptrdiff_t n) { (void)n; return narrow; }
#endif

#endif
