/* The transpose that moves channels between the layouts: narrow
 * channels_first planes run through the channels_last row kernels a block of
 * channels at a time (depthwise.pyx), and whole arrays change layout.
 *
 * A template (see cyback_depthwise_common.h), included by cyback_depthwise.h
 * once per instance: a vector instance (V, VL defined) holds the register
 * transpose and its scalar rest; a type's instance (SUF f or d) the entry,
 * the pick between the vector instances (without GCC vector extensions,
 * cyback_depthwise.h names the scalar rest instead).
 */

#if defined(VL) || !CB_SIMD_VECTOR

/* dst[j * ld + i] = src[i * ls + j], scalar, for rows i in [0, R) and columns
 * j in [0, S), but only columns from j0 on in rows below i1 (the vector blocks
 * of cb_depthwise_transpose did the rest). */
ATTR static inline void CB_TYPED(cb_depthwise_transpose_rest_)(const T *src, ptrdiff_t ls,
        T *dst, ptrdiff_t ld, ptrdiff_t R, ptrdiff_t S, ptrdiff_t i1, ptrdiff_t j0) {
    ptrdiff_t i, j;
    for (i = 0; i < R; i++)
        for (j = i < i1 ? j0 : 0; j < S; j++) dst[j * ld + i] = src[i * ls + j];
}

#endif

#ifdef VL

/* dst[j * ld + i] = src[i * ls + j] for i in [0, R), j in [0, S): blocks of
 * VL x VL transposed in registers by log2(VL) rounds of interleaving row i
 * with row i + VL/2 (two rounds of that perfect shuffle swap a block's row and
 * column bits once each), the rest scalar. */
ATTR static void CB_TYPED(cb_depthwise_transpose_)(const T *src, ptrdiff_t ls, T *dst,
        ptrdiff_t ld, ptrdiff_t R, ptrdiff_t S) {
    typedef __typeof__((V){0} > (V){0}) mask_t;
    mask_t ml, mh;
    ptrdiff_t i0, j0, RV = R - R % VL, SV = S - S % VL;
    int i, q;
    if (!CB_DEPTHWISE_SHUFFLE) RV = SV = 0;
    for (i = 0; i < VL / 2; i++) {
        ml[2 * i] = i;
        ml[2 * i + 1] = VL + i;
        mh[2 * i] = VL / 2 + i;
        mh[2 * i + 1] = VL + VL / 2 + i;
    }
    /* Blocks of columns outer: the VL rows of dst that a block writes are */
    /* complete after the sweep over i0, before other rows evict them.     */
    for (j0 = 0; j0 < SV; j0 += VL)
        for (i0 = 0; i0 < RV; i0 += VL) {
            V a[VL], b[VL];
            CB_DEPTHWISE_UNROLL(16)
            for (i = 0; i < VL; i++) a[i] = *(const V *)(src + (i0 + i) * ls + j0);
            for (q = VL; q > 1; q /= 2) {
                CB_DEPTHWISE_UNROLL(8)
                for (i = 0; i < VL / 2; i++) {
                    b[2 * i] = CB_DEPTHWISE_SHUF(a[i], a[i + VL / 2], ml);
                    b[2 * i + 1] = CB_DEPTHWISE_SHUF(a[i], a[i + VL / 2], mh);
                }
                CB_DEPTHWISE_UNROLL(16)
                for (i = 0; i < VL; i++) a[i] = b[i];
            }
            CB_DEPTHWISE_UNROLL(16)
            for (i = 0; i < VL; i++) *(V *)(dst + (j0 + i) * ld + i0) = a[i];
        }
    CB_TYPED(cb_depthwise_transpose_rest_)(src, ls, dst, ld, R, S, RV, SV);
}

#elif CB_SIMD_VECTOR

/* The type's entry: the AVX2 + FMA instance where the CPU has them. */
static void CB_TYPED(cb_depthwise_transpose_)(const T *src, ptrdiff_t ls, T *dst, ptrdiff_t ld,
                                              ptrdiff_t R, ptrdiff_t S) {
    CB_DEPTHWISE_PICK(cb_depthwise_transpose_)(src, ls, dst, ld, R, S);
}

#endif
