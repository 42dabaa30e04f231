/* The float32 approximations of cyback_vmath.h, written once over a small set
 * of vector operations and included once per instruction set (baseline
 * scalar, AVX2 + FMA, AVX-512F) by cyback_vmath.h, which defines before each
 * inclusion:
 *
 *   CB_VM_FN(name)   the function name for this set (a suffix per set)
 *   CB_VM_ATTR       its target attribute (empty for the baseline)
 *   V                the vector type (comparisons give the set's mask type)
 *   VF(c)            a vector of c
 *   ADD SUB MUL DIV  (a, b) -> a op b, each rounded once
 *   FMA(a, b, c)     a * b + c; FNMA(a, b, c): c - a * b (fused where the set has FMA)
 *   MIN MAX          (a, b): a NaN a gives b (the x86 rule), used for clamps only
 *   ABS(x)           |x|; WITHSIGN(y, x): y (>= +0) with x's sign bit
 *   LT(a, b)         a < b; ISNAN(x): x != x (masks)
 *   SEL(m, a, b)     m ? a : b per lane
 *   SCALE2(p, t)     p * 2^n where t = n + 1.5 * 2^23 (see exp below)
 *
 * Every lane is computed on its own from its own input with the same
 * operations, so a result does not depend on the lane, the tail or the
 * thread that computes it; the AVX2 and AVX-512 sets do the same fused
 * operations and give the same bits. The coefficients come from
 * tools/fit_vmath.py (weighted minimax fits, float32 coefficients).
 */
#ifndef CB_VM_FN
#error "cyback_vmath_body.h is included by cyback_vmath.h only"
#endif

/* exp(x) for any x: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2/2
 * (ln2 as a float32 pair hi + lo, hi of 16 significant bits: n * hi and
 * x - n * hi are exact for |n| <= 150, fused or not), exp(r) = 1 + r +
 * r^2 q(r) (q of degree 4: relative error 3e-9),
 * then times 2^n in two exact steps of 2^(n/2), so that the results below
 * 2^-126 come out as correctly rounded denormals and those below half the
 * smallest denormal as 0. The clamp to [-104, 89] keeps n in [-150, 129]:
 * exp(-104) rounds to 0 and exp(89) to +inf, as the exact values do. NaN
 * gives NaN (the clamp would not). */
CB_VM_ATTR static inline V CB_VM_FN(exp)(V x) {
    V xc = MIN(MAX(x, VF(-104.0f)), VF(89.0f));
    /* n + 1.5 * 2^23: the fused add rounds x / ln2 to the nearest integer */
    V t = FMA(xc, VF(1.44269504088896341f), VF(12582912.0f));
    V n = SUB(t, VF(12582912.0f));
    V r = FNMA(n, VF(6.93145751953125000e-01f), xc);
    r = FNMA(n, VF(1.42860676533018704e-06f), r);
    V q = VF(CB_VM_EXP_C4);
    q = FMA(q, r, VF(CB_VM_EXP_C3));
    q = FMA(q, r, VF(CB_VM_EXP_C2));
    q = FMA(q, r, VF(CB_VM_EXP_C1));
    q = FMA(q, r, VF(CB_VM_EXP_C0));
    V p = ADD(FMA(MUL(r, r), q, r), VF(1.0f));
    return SEL(ISNAN(x), x, SCALE2(p, t));
}

/* tanh(x) = sign(x) tanh(|x|): for |x| < 0.625 the odd polynomial
 * |x| + |x|^3 q(x^2) (relative error 2e-10: exact near 0, denormals
 * included), beyond 1 - 2 / (exp(2|x|) + 1), which is 1 from |x| ~ 9 on.
 * Odd symmetry is exact; -0 gives -0; NaN gives NaN. */
CB_VM_ATTR static inline V CB_VM_FN(tanh)(V x) {
    V a = ABS(x);
    V s = MUL(a, a);
    V q = VF(CB_VM_TANH_C5);
    q = FMA(q, s, VF(CB_VM_TANH_C4));
    q = FMA(q, s, VF(CB_VM_TANH_C3));
    q = FMA(q, s, VF(CB_VM_TANH_C2));
    q = FMA(q, s, VF(CB_VM_TANH_C1));
    q = FMA(q, s, VF(CB_VM_TANH_C0));
    V small = FMA(MUL(a, s), q, a);
    V e = CB_VM_FN(exp)(ADD(a, a));
    V big = SUB(VF(1.0f), DIV(VF(2.0f), ADD(e, VF(1.0f))));
    return WITHSIGN(SEL(LT(a, VF(CB_VM_TANH_SMALL)), small, big), x);
}

/* sigmoid(x) = 1 / (1 + exp(-x)), as e = exp(-|x|) in (0, 1]: 1 / (1 + e)
 * for x >= 0 and e / (1 + e) for x < 0, so that large negative x give the
 * small (denormal, then 0) values they should instead of 1 / inf; 0 and 1 at
 * the extremes (+-inf included), NaN gives NaN. */
CB_VM_ATTR static inline V CB_VM_FN(sigmoid)(V x) {
    V e = CB_VM_FN(exp)(SUB(VF(0.0f), ABS(x)));
    V d = ADD(VF(1.0f), e);
    return SEL(LT(x, VF(0.0f)), DIV(e, d), DIV(VF(1.0f), d));
}

/* erf(x) = sign(x) erf(|x|): for |x| < 0.921875 the odd series
 * |x| (2/sqrt(pi) + x^2 q(x^2)) with 2/sqrt(pi) as a float32 pair (relative
 * error 2e-8 from the fit: good next to 0), beyond 1 - exp(-x^2) P(|x| - mid)
 * (P of degree 9: absolute error 1e-9), |x| clamped at 4 where that rounds to
 * 1. Odd symmetry is exact; -0 gives -0; NaN gives NaN. */
CB_VM_ATTR static inline V CB_VM_FN(erf)(V x) {
    V a = ABS(x);
    V s = MUL(a, a);
    V q = VF(CB_VM_ERF_SMALL_C4);
    q = FMA(q, s, VF(CB_VM_ERF_SMALL_C3));
    q = FMA(q, s, VF(CB_VM_ERF_SMALL_C2));
    q = FMA(q, s, VF(CB_VM_ERF_SMALL_C1));
    q = FMA(q, s, VF(CB_VM_ERF_SMALL_C0));
    V small = FMA(a, VF(CB_VM_ERF_HI), MUL(a, FMA(s, q, VF(CB_VM_ERF_LO))));
    V ac = MIN(a, VF(4.0f));
    V u = SUB(ac, VF(CB_VM_ERF_MID));
    V p = VF(CB_VM_ERF_TAIL_C9);
    p = FMA(p, u, VF(CB_VM_ERF_TAIL_C8));
    p = FMA(p, u, VF(CB_VM_ERF_TAIL_C7));
    p = FMA(p, u, VF(CB_VM_ERF_TAIL_C6));
    p = FMA(p, u, VF(CB_VM_ERF_TAIL_C5));
    p = FMA(p, u, VF(CB_VM_ERF_TAIL_C4));
    p = FMA(p, u, VF(CB_VM_ERF_TAIL_C3));
    p = FMA(p, u, VF(CB_VM_ERF_TAIL_C2));
    p = FMA(p, u, VF(CB_VM_ERF_TAIL_C1));
    p = FMA(p, u, VF(CB_VM_ERF_TAIL_C0));
    V e = CB_VM_FN(exp)(SUB(VF(0.0f), MUL(ac, ac)));
    V big = FNMA(e, p, VF(1.0f));
    V y = WITHSIGN(SEL(LT(a, VF(CB_VM_ERF_SMALL)), small, big), x);
    return SEL(ISNAN(x), x, y);
}
