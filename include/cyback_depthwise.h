/* Row and plane kernels of the depthwise convolution
 * (cyback/kernels/depthwise.pyx): the entries it calls, for float (suffix f)
 * and double (d).
 *
 * A depthwise convolution is memory-bound only if its inner loops run at
 * vector width: each output value is a KH*KW-long dot product over one
 * channel. These kernels keep the accumulators in vector registers:
 *   - channels_last, one output row (cyback_depthwise_last.h): vectors run
 *     over channels, and four output pixels share each kernel-tap load;
 *   - channels_first, one (n, c) plane (cyback_depthwise_first.h): vectors
 *     run along the row (stride 1) over a plane that the caller has
 *     zero-padded all around, so no pixel needs a bounds check; blocks of 4
 *     rows by 2 vectors share each kernel-tap load and keep 8 multiply-add
 *     chains in flight. 3x3 "same" planes at stride 1 are read in place
 *     (cb_depthwise_fwd_cf_same3);
 *   - the transpose between the layouts (cyback_depthwise_transpose.h).
 * What they share is in cyback_depthwise_common.h.
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
 *
 * Each kernel is written once, in a template header included below once per
 * instance (cyback_depthwise_instance.h; cyback_depthwise_common.h says why):
 * the vector instances first, then each type's entries, which pick among them.
 */
#ifndef CYBACK_DEPTHWISE_H
#define CYBACK_DEPTHWISE_H

#include "cyback_depthwise_common.h"

#if CB_SIMD_VECTOR
#define T float
#define V cb_v4f
#define VL 4
#define SUF f_base
#define ATTR
#include "cyback_depthwise_instance.h"

#define T double
#define V cb_v2d
#define VL 2
#define SUF d_base
#define ATTR
#include "cyback_depthwise_instance.h"

#if CB_SIMD_AVX2
#define T float
#define V cb_v8f
#define VL 8
#define SUF f_avx2
#define ATTR CB_AVX2_ATTR
#include "cyback_depthwise_instance.h"

#define T double
#define V cb_v4d
#define VL 4
#define SUF d_avx2
#define ATTR CB_AVX2_ATTR
#include "cyback_depthwise_instance.h"
#endif
#endif

#define T float
#define SUF f
#define ATTR
#include "cyback_depthwise_instance.h"

#define T double
#define SUF d
#define ATTR
#include "cyback_depthwise_instance.h"

#if !CB_SIMD_VECTOR
/* The channels_first entries are the scalar kernels themselves. */
#define cb_depthwise_pad_plane_f cb_depthwise_pad_phases_f
#define cb_depthwise_pad_plane_d cb_depthwise_pad_phases_d
#define cb_depthwise_fwd_cf_plane_f cb_depthwise_fwd_cf_scalar_f
#define cb_depthwise_fwd_cf_plane_d cb_depthwise_fwd_cf_scalar_d
#define cb_depthwise_fwd_cf_same3_f(x, H, W, k, ks, y, zero, bias, act) 0
#define cb_depthwise_fwd_cf_same3_d(x, H, W, k, ks, y, zero, bias, act) 0
#define cb_depthwise_kgrad_cf_plane_f cb_depthwise_kgrad_cf_scalar_f
#define cb_depthwise_kgrad_cf_plane_d cb_depthwise_kgrad_cf_scalar_d
#define cb_depthwise_transpose_f(src, ls, dst, ld, R, S) \
    cb_depthwise_transpose_rest_f(src, ls, dst, ld, R, S, 0, 0)
#define cb_depthwise_transpose_d(src, ls, dst, ld, R, S) \
    cb_depthwise_transpose_rest_d(src, ls, dst, ld, R, S, 0, 0)
#endif

#endif
