"""Per-call overhead of a compiled Function on tiny graphs (batch 1).

The graphs are so small that the time is almost all Python-level work: feed
checking, argument marshalling, the generated plan's calls and output
conversion. Each row also times the same NumPy calls written by hand, so
``overhead_us`` is what cyback adds on top of the arithmetic.

The training step is also timed A/B against the same function with its
update lock disabled (blocks alternated in one run): ``lock_us`` is what
serialising updating calls (graph/tensor.py, lock groups) costs a
single-threaded step, for a 2-variable and a 60-variable model, and
``acquire_release_us`` the lock's own cost measured alone.

    python benchmarks/bench_overhead.py [--calls N]

Prints a table and writes benchmarks/results/overhead.json.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cyback as K  # noqa: E402
from cyback.graph.tensor import acquire_group  # noqa: E402
from cyback.ops import elementwise as ew  # noqa: E402

from _common import print_table, write_json  # noqa: E402


def per_call_us(fn, calls, blocks=9):
    """Median over ``blocks`` of the mean time of ``calls`` back-to-back calls, in µs."""
    for _ in range(max(calls // 10, 10)):
        fn()
    means = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(means)


def case_add():
    x = K.placeholder((None, 8))
    f = K.function([x], [x + 1.0])
    xv = np.ones((1, 8), np.float32)
    one = np.float32(1.0)
    return "x + 1", (lambda: f([xv])), (lambda: [np.add(xv, one)])


def case_mlp():
    rs = np.random.RandomState(0)
    w1v = rs.randn(32, 64).astype(np.float32)
    b1v = np.zeros(64, np.float32)
    w2v = rs.randn(64, 10).astype(np.float32)
    b2v = np.zeros(10, np.float32)
    x = K.placeholder((None, 32))
    w1, b1, w2, b2 = (K.variable(v) for v in (w1v, b1v, w2v, b2v))
    h = K.maximum(K.dot(x, w1) + b1, 0.0)
    y = ew.sigmoid(K.dot(h, w2) + b2)
    f = K.function([x], [y])
    xv = rs.randn(1, 32).astype(np.float32)
    zero = np.float32(0)

    def ref():
        hh = np.maximum(np.add(np.dot(xv, w1v), b1v), zero)
        return [1 / (1 + np.exp(-(np.dot(hh, w2v) + b2v)))]
    return "MLP 32-64-10 predict", (lambda: f([xv])), ref


def case_train():
    rs = np.random.RandomState(0)
    x = K.placeholder((None, 32))
    t = K.placeholder((None, 10))
    w1 = K.variable(rs.randn(32, 64) * 0.1)
    w2 = K.variable(rs.randn(64, 10) * 0.1)
    h = K.maximum(K.dot(x, w1), 0.0)
    loss = K.mean(K.square(K.dot(h, w2) - t))
    g1, g2 = K.gradients(loss, [w1, w2])
    f = K.function([x, t], [loss], updates=[K.update_sub(w1, 0.01 * g1),
                                            K.update_sub(w2, 0.01 * g2)])
    xv = rs.randn(1, 32).astype(np.float32)
    tv = rs.randn(1, 10).astype(np.float32)
    return "MLP 32-64-10 train step", (lambda: f([xv, tv])), None


def ab_per_call_us(fa, fb, calls, blocks=15):
    """Medians of alternated blocks of ``calls`` calls of ``fa`` and ``fb``, in µs."""
    for _ in range(max(calls // 10, 10)):
        fa()
        fb()
    ta, tb = [], []
    for _ in range(blocks):
        for fn, out in ((fa, ta), (fb, tb)):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(ta), statistics.median(tb)


def lock_ab(n_layers):
    """One SGD training step over ``2 * n_layers`` variables, with and without the lock."""
    rs = np.random.RandomState(0)
    x = K.placeholder((None, 16))
    t = K.placeholder((None, 16))
    ws = [K.variable(rs.randn(16, 16) * 0.1) for _ in range(n_layers)]
    bs = [K.variable(np.zeros(16)) for _ in range(n_layers)]
    h = x
    for w, b in zip(ws, bs):
        h = K.tanh(K.dot(h, w) + b)
    loss = K.mean(K.square(h - t))
    params = ws + bs
    grads = K.gradients(loss, params)
    updates = [K.update_sub(p, 0.01 * g) for p, g in zip(params, grads)]
    locked = K.function([x, t], [loss], updates=updates)
    unlocked = K.function([x, t], [loss], updates=updates)
    assert locked._group is not None
    unlocked._group = None       # the same plan, applied without the lock
    xv = rs.randn(1, 16).astype(np.float32)
    tv = rs.randn(1, 16).astype(np.float32)
    return locked, unlocked, (xv, tv), len(params)



def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    rows = []
    for case in (case_add, case_mlp, case_train):
        name, run, ref = case()
        us = per_call_us(run, args.calls)
        ref_us = per_call_us(ref, args.calls) if ref is not None else None
        rows.append({"graph": name, "cyback_us": us, "numpy_us": ref_us,
                     "overhead_us": None if ref_us is None else us - ref_us})
    print_table(rows, ["graph", "cyback_us", "numpy_us", "overhead_us"],
                title="Function.__call__ per-call time (batch 1, median of 9 blocks of %d calls)"
                % args.calls)
    lock_rows = []
    for n_layers in (1, 30):
        locked, unlocked, (xv, tv), n_vars = lock_ab(n_layers)
        # Same updates from the same start: outputs agree before times count.
        params = [u.node.inputs[0] for u in locked._assigns]
        start = K.batch_get_value(params)
        out_a, after_a = locked([xv, tv])[0], K.batch_get_value(params)
        K.batch_set_value(list(zip(params, start)))
        out_b, after_b = unlocked([xv, tv])[0], K.batch_get_value(params)
        assert out_a == out_b and all(np.array_equal(p, q) for p, q in zip(after_a, after_b))
        a, b = ab_per_call_us(lambda: locked([xv, tv]), lambda: unlocked([xv, tv]), args.calls)
        # The lock's own cost (what the A/B difference should show, below
        # the noise of a loaded machine): take and release the group.
        group = locked._group

        def take():
            acquire_group(group).lock.release()
        own = per_call_us(take, args.calls * 10)
        lock_rows.append({"train step": "%d-layer tanh MLP, %d variables" % (n_layers, n_vars),
                          "locked_us": a, "unlocked_us": b, "lock_us": a - b,
                          "ratio": a / b, "acquire_release_us": own})
    print()
    print_table(lock_rows, ["train step", "locked_us", "unlocked_us", "lock_us", "ratio",
                            "acquire_release_us"],
                title="Update lock A/B (single thread, alternated blocks, median of 15)")
    load = os.getloadavg()[0]
    print("load average (1 min): %.2f" % load)
    path = write_json("overhead", rows, lock_ab=lock_rows, calls=args.calls, load=load,
                      python=sys.version.split()[0])
    print("wrote", path)


if __name__ == "__main__":
    main()
