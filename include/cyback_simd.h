/* Vector types and the run-time AVX2 switch shared by the hand-vectorised
 * kernels (cyback_depthwise.h, cyback_conv_direct.h).
 *
 * The wheels are built for baseline x86-64 (SSE2, 16-byte vectors). On x86
 * with GCC or clang a kernel is compiled a second time with CB_AVX2_ATTR
 * (32-byte vectors, fused multiply-adds) and picked at run time when the CPU
 * has AVX2 and FMA. Compilers without GCC vector extensions get plain loops.
 *
 * The vector types are declared with element alignment so that loads and
 * stores through them may be unaligned (rows of an array start anywhere).
 */
#ifndef CYBACK_SIMD_H
#define CYBACK_SIMD_H

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
#define CB_SIMD_AVX2 1
#define CB_AVX2_ATTR __attribute__((target("avx2,fma")))
/* One per extension module (each includes this header): -1 unknown. */
static int cb_simd_avx2_state = -1;

/* 1 when the AVX2 + FMA kernels run: the CPU has them (checked once; a
 * benign race) and cb_simd_use_avx2(0) has not turned them off. */
static int cb_simd_has_avx2(void) {
    if (cb_simd_avx2_state < 0) {
        __builtin_cpu_init();
        cb_simd_avx2_state = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cb_simd_avx2_state;
}

/* Tests run both kernel sets: on = 0 forces the baseline one. Returns
 * whether the AVX2 set now runs. */
static int cb_simd_use_avx2(int on) {
    cb_simd_avx2_state = -1;
    if (on) return cb_simd_has_avx2();
    cb_simd_avx2_state = 0;
    return 0;
}
#else
#define CB_SIMD_AVX2 0
static int cb_simd_has_avx2(void) { return 0; }
static int cb_simd_use_avx2(int on) { (void)on; return 0; }
#endif

#endif
