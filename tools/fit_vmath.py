"""Derive the polynomial coefficients of include/cyback_vmath.h.

Run: python tools/fit_vmath.py

Each approximation is a weighted minimax fit in float64: a least-squares fit on
a dense grid, then Lawson's iteration (the weights of the points where the error
is largest grow) until the error equioscillates, with the coefficients rounded
to float32 one at a time (see ``minimax``). They are printed as C literals with
the error of the fit; the header's values are these. The ranges and forms:

- exp(r) = 1 + r + r^2 q(r) on |r| <= ln2/2 (a little wider: the rounded
  n = round(x / ln2) may leave |r| a hair above ln2/2), relative error;
- tanh(x) = x + x^3 q(x^2) on |x| <= TANH_SMALL, relative error;
- erf(x) = x (2/sqrt(pi) + x^2 q(x^2)) on |x| <= ERF_SMALL, relative error;
- erf(x) = 1 - exp(-x^2) P(x - ERF_MID) on ERF_SMALL <= x <= ERF_ONE,
  absolute error (the weight exp(-x^2) is what the error of P costs in erf).
"""
import argparse

import numpy as np
from scipy import special

TANH_SMALL = 0.625
ERF_SMALL = 0.921875
ERF_ONE = 4.0
ERF_MID = (ERF_SMALL + ERF_ONE) / 2


def _lawson(A, b, iters):
    lam = np.full(len(b), 1.0 / len(b))
    for _ in range(iters):
        s = np.sqrt(lam)
        c = np.linalg.lstsq(A * s[:, None], b * s, rcond=None)[0]
        err = np.abs(A @ c - b)
        lam = lam * err
        lam /= lam.sum()
    return c


def minimax(basis, target, weight, iters=300):
    """Coefficients c minimising max |weight * (basis @ c - target)| (Lawson),
    float32 values: each coefficient in turn, lowest degree first, is rounded
    to float32 and the higher ones are fitted again to absorb its rounding."""
    A = basis * weight[:, None]
    b = target * weight
    fixed = []
    for k in range(basis.shape[1]):
        rest = b - A[:, :k] @ np.array(fixed, dtype=np.float64) if fixed else b
        c = _lawson(A[:, k:], rest, iters)
        fixed.append(float(np.float32(c[0])))
    return np.array(fixed)


def _report(name, c, err):
    print("/* %s: max error %.3g (float64 arithmetic, float32 coefficients) */" % (name, err))
    for i, v in enumerate(np.float32(c)):
        print("#define CB_VM_%s_C%d %.9ef" % (name.upper(), i, v))


def fit_exp(n=20001):
    h = np.log(2) / 2 * 1.002
    r = np.linspace(-h, h, n)
    r = r[r != 0]
    basis = np.stack([r ** k for k in range(5)], 1)             # q(r), degree 4
    target = (np.expm1(r) - r) / r ** 2
    weight = r ** 2 / np.exp(r)                                   # relative error of exp(r)
    c = minimax(basis, target, weight)

    def err(cc):
        return np.max(np.abs((1 + r + r ** 2 * (basis @ cc)) / np.exp(r) - 1))
    _report("exp", c, err(c))
    return c


def fit_tanh(n=20001):
    x = np.linspace(0, TANH_SMALL, n)[1:]
    s = x * x
    basis = np.stack([s ** k for k in range(6)], 1)             # q(x^2), degree 5 in x^2
    target = (np.tanh(x) - x) / x ** 3
    weight = x ** 3 / np.tanh(x)
    c = minimax(basis, target, weight)

    def err(cc):
        return np.max(np.abs((x + x ** 3 * (basis @ cc)) / np.tanh(x) - 1))
    _report("tanh", c, err(c))
    return c


def fit_erf_small(n=20001):
    # The constant term 2/sqrt(pi) is kept as a float32 pair hi + lo (the
    # header computes x*hi + x*(lo + x^2 q(x^2))): rounded to one float32 it
    # alone would cost half an ulp of relative error next to 0.
    x = np.linspace(0, ERF_SMALL, n)[1:]
    s = x * x
    c0 = 2 / np.sqrt(np.pi)
    hi = float(np.float32(c0))
    lo = float(np.float32(c0 - hi))
    basis = np.stack([s ** k for k in range(5)], 1)             # q(x^2), degree 4 in x^2
    target = (special.erf(x) / x - c0) / s
    weight = x * s / special.erf(x)
    c = minimax(basis, target, weight)

    def err(cc):
        return np.max(np.abs(x * (hi + (lo + s * (basis @ cc))) / special.erf(x) - 1))
    print("#define CB_VM_ERF_HI %.9ef" % hi)
    print("#define CB_VM_ERF_LO %.9ef" % lo)
    _report("erf_small", c, err(c))
    return c


def fit_erf_tail(n=20001, degree=9):
    x = np.linspace(ERF_SMALL, ERF_ONE, n)
    u = x - ERF_MID
    basis = np.stack([u ** k for k in range(degree + 1)], 1)
    target = special.erfcx(x)
    weight = np.exp(-x * x)
    c = minimax(basis, target, weight)

    def err(cc):
        return np.max(np.abs(1 - np.exp(-x * x) * (basis @ cc) - special.erf(x)))
    _report("erf_tail", c, err(c))
    return c


def main():
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    print("#define CB_VM_TANH_SMALL %.9ef" % TANH_SMALL)
    print("#define CB_VM_ERF_SMALL %.9ef" % ERF_SMALL)
    print("#define CB_VM_ERF_MID %.9ef" % ERF_MID)
    fit_exp()
    fit_tanh()
    fit_erf_small()
    fit_erf_tail()


if __name__ == "__main__":
    main()
