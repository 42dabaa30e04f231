"""float32 softmax and exp / tanh / sigmoid / erf: cyback's vectorised rows
(include/cyback_vmath.h) against NumPy and SciPy; and element-wise programs
(kernels/ewise.pyx: a relu, a BatchNorm + ReLU) against NumPy's ufuncs.

Run: python benchmarks/bench_ewise.py [--blocks N] [--quick] [--out NAME]

Cases: softmax along the last axis of 4x64x64 (a self-attention block's
scores at batch 1), 64x1000 and 1x1000 (classifier heads), and each function
on 16K and 1M floats; a relu program on 4K, 16K and 1M floats (NumPy's
np.maximum with a scalar: where a lone relu in a plan should go to the
program, graph/fusion.py SINGLE_MAX_MIN_SIZE) and a BatchNorm + ReLU program
on a 56x56x256 map. Every output is checked against a float64 reference
(programs: NumPy's bits) before anything is timed (a case whose output is off
fails the run). cyback
and its reference are timed in alternation (cyback.bench.timing), each on the
threads it uses by default. Prints the median microseconds per call and the
speed-up, and writes benchmarks/results/<NAME>.json (ewise by default).
"""
import argparse
import os
import sys

import numpy as np
from scipy import special

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from cyback.bench.timing import time_alternated  # noqa: E402
from cyback.kernels import ewise, softmax  # noqa: E402
from cyback.kernels.runtime import get_max_threads  # noqa: E402

from _common import print_table, write_json  # noqa: E402


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


def ref_softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# name: (cyback, NumPy/SciPy float32 peer, its label, float64 reference,
#        input scale, tolerance: |got - want| <= tol * |want| + atol)
FUNCS = {
    "exp": (ewise.exp_f32, np.exp, "numpy", np.exp, 10.0, 3e-7, 0.0),
    "tanh": (ewise.tanh_f32, np.tanh, "numpy", np.tanh, 3.0, 3e-7, 0.0),
    "sigmoid": (ewise.sigmoid_f32, special.expit, "scipy", special.expit, 6.0, 4e-7, 0.0),
    "erf": (ewise.erf_f32, special.erf, "scipy", special.erf, 2.0, 0.0, 2e-7),
}


def check(name, got, want, rtol, atol):
    err = np.abs(got.astype(np.float64) - want)
    bad = err > rtol * np.abs(want) + atol
    if bad.any():
        raise AssertionError("%s: %d outputs off, the worst by %.3g" % (name, bad.sum(), err.max()))
    return float(err.max())


def cases(quick):
    rng = np.random.default_rng(0)
    shapes = [(4, 64, 64), (64, 1000), (1, 1000)]
    for shape in shapes:
        x = (rng.standard_normal(shape) * 4).astype(np.float32)
        yield ("softmax %s" % "x".join(map(str, shape)), x, softmax.softmax_last, np_softmax,
               "numpy", ref_softmax(x), 2e-6, 1e-30)
    sizes = [16 * 1024] if quick else [16 * 1024, 1024 * 1024]
    for name, (mine, peer, label, ref, scale, rtol, atol) in FUNCS.items():
        for n in sizes:
            x = (rng.standard_normal(n) * scale).astype(np.float32)
            with np.errstate(all="ignore"):
                want = ref(x.astype(np.float64))
            yield ("%s %dK" % (name, n // 1024), x, mine, peer, label, want, rtol, atol)


def _program(code, operands, kinds, shape):
    """A function running an element-wise program over operands into a new
    array of ``shape`` (channels on the last axis)."""
    code = np.array(code, dtype=np.int32).reshape(-1, 6)
    kinds = np.array(kinds, dtype=np.int32)
    n_regs = int(code[:, 1:].max()) + 1
    c = shape[-1]
    p = int(np.prod(shape)) // c

    def run():
        return ewise.run(np.empty(shape, np.float32), code, n_regs, operands, kinds, p, c, 1)
    return run


def program_cases():
    rng = np.random.default_rng(1)
    mx, mul, add = (ewise.OPCODES[k][0] for k in ("maximum", "multiply", "add"))
    zero = np.zeros(1, np.float32)
    for n in (4096, 16 * 1024, 1024 * 1024):
        x = rng.standard_normal((1, n)).astype(np.float32)
        run = _program([[mx, -1, 0, 1, 0, 0]], [x, zero],
                       [ewise.KIND_FULL, ewise.KIND_SCALAR], x.shape)
        yield ("relu program %dK" % (n // 1024), run,
               lambda x=x: np.maximum(x, np.float32(0)))
    x = rng.standard_normal((1, 56, 56, 256)).astype(np.float32)
    s, b = (rng.standard_normal(256).astype(np.float32) for _ in range(2))
    run = _program([[mul, 4, 0, 1, 0, 0], [add, 4, 4, 2, 0, 0], [mx, -1, 4, 3, 0, 0]],
                   [x, s, b, zero], [ewise.KIND_FULL, ewise.KIND_CHAN, ewise.KIND_CHAN,
                                     ewise.KIND_SCALAR], x.shape)
    yield ("bn+relu program 56x56x256", run,
           lambda: np.maximum(x * s + b, np.float32(0)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=7, help="timed blocks per engine")
    p.add_argument("--quick", action="store_true", help="16K floats only, 3 blocks")
    p.add_argument("--out", default="ewise", help="results/<OUT>.json")
    args = p.parse_args()
    blocks = 3 if args.quick else args.blocks
    sets = ("AVX-512" if ewise._use_avx512(True) else
            "AVX2 + FMA" if ewise._use_avx2(True) else "baseline")
    rows = []
    for case, x, mine, peer, label, want, rtol, atol in cases(args.quick):
        err = check(case, mine(x), want, rtol, atol)
        check(case + " (%s)" % label, peer(x), want, max(rtol, 2e-6) if "softmax" in case
              else rtol * 4 + 1e-7, atol)
        stats = time_alternated({"cyback": lambda: mine(x), label: lambda: peer(x)},
                                blocks=blocks)
        us, ref_us = stats["cyback"]["median_s"] * 1e6, stats[label]["median_s"] * 1e6
        rows.append(dict(case=case, peer=label, cyback_us=us, peer_us=ref_us,
                         speedup=ref_us / us, max_abs_err=err))
    for case, mine, peer in program_cases():
        if mine().tobytes() != peer().tobytes():
            raise AssertionError("%s: the program's output is not NumPy's" % case)
        stats = time_alternated({"cyback": mine, "numpy": peer}, blocks=blocks)
        us, ref_us = stats["cyback"]["median_s"] * 1e6, stats["numpy"]["median_s"] * 1e6
        rows.append(dict(case=case, peer="numpy", cyback_us=us, peer_us=ref_us,
                         speedup=ref_us / us, max_abs_err=0.0))
    print_table(rows, ["case", "peer", "cyback_us", "peer_us", "speedup", "max_abs_err"],
                title="float32 element-wise rows (%s, %d threads)" % (sets, get_max_threads()))
    path = write_json(args.out, rows, instruction_set=sets, threads=get_max_threads())
    print("wrote", path)


if __name__ == "__main__":
    main()
