"""Bound plans against plain plans (graph/binding.py) on the application models.

Each model's function is timed in one process, blocks of back-to-back calls
alternating between the plain plan (``binding.set_enabled(False)``) and the
bound one, so both see the same machine. The outputs are checked equal to the
bit first: a bound step runs the kernel its op would. ``ratio`` is plain time
over bound time (> 1: binding is faster).

The models are the .h5 files bench_applications.py exports (tf_keras builds
them; run it once, or point --work at its directory); models not found there
are skipped.

    python benchmarks/bench_plan_binding.py [--models nasnetmobile,mobilenetv2]
        [--batches 1,8] [--rounds 7] [--threads 2]

Prints a table and writes benchmarks/results/plan_binding.json.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cyback as K  # noqa: E402
from cyback.graph import binding  # noqa: E402

from _common import handoff_probe, print_table, warn_openblas_overrides, write_json  # noqa: E402

MODELS = ("mobilenet", "mobilenetv2", "resnet50", "densenet121", "inceptionv3", "nasnetmobile",
          "text_bilstm", "text_cnn", "transformer_block")


def block_ms(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


def measure(f, x, rounds):
    """(median plain ms, median bound ms, calls per block) over ``rounds``
    alternated blocks of about 0.3 s each."""
    def call():
        f([x])

    binding.set_enabled(True)
    for _ in range(3):
        call()
    t0 = time.perf_counter()
    call()
    calls = max(3, min(2000, int(0.3 / max(time.perf_counter() - t0, 1e-6))))
    times = {False: [], True: []}
    for r in range(rounds):
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            binding.set_enabled(on)
            call()
            times[on].append(block_ms(call, calls))
    binding.set_enabled(True)
    return statistics.median(times[False]), statistics.median(times[True]), calls


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,8")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "cyback-apps"))
    args = p.parse_args(argv)
    warn_openblas_overrides()
    K.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        path = os.path.join(args.work, name, "model.h5")
        if not os.path.exists(path):
            print("skipping %s: %s not found (run bench_applications.py)" % (name, path))
            continue
        model = K.load_model(path)
        for b in (int(v) for v in args.batches.split(",")):
            xpath = os.path.join(args.work, name, "x_b%d.npy" % b)
            if not os.path.exists(xpath):
                continue
            x = np.load(xpath)
            f = K.function(model.inputs, model.outputs)
            binding.set_enabled(False)
            plain_out = f([x])
            binding.set_enabled(True)
            for _ in range(3):
                bound_out = f([x])
            same = all(np.array_equal(a, c) for a, c in zip(plain_out, bound_out))
            if not same:
                raise SystemExit("%s b%d: the bound plan's outputs differ from the plain "
                                 "plan's" % (name, b))
            plan = f._plan(0)
            src = (plan.binding.source() or "") if plan.binding is not None else ""
            handoff = handoff_probe()
            plain, bound, calls = measure(f, x, args.rounds)
            rows.append({"model": name, "batch": b, "steps": len(plan.steps),
                         "bound_steps": src.count(" = K"), "plain_ms": plain,
                         "bound_ms": bound, "ratio": plain / bound, "calls": calls,
                         "handoff_ns": handoff, "same_bits": same})
            print_table(rows[-1:], ["model", "batch", "steps", "bound_steps", "plain_ms",
                                    "bound_ms", "ratio"])
    print()
    print_table(rows, ["model", "batch", "steps", "bound_steps", "plain_ms", "bound_ms",
                       "ratio", "handoff_ns"], title="plain plan / bound plan, %d threads"
                % args.threads)
    path = write_json("plan_binding", rows, threads=args.threads, rounds=args.rounds,
                      load_average=os.getloadavg(),
                      command="python benchmarks/bench_plan_binding.py " +
                              " ".join(argv or sys.argv[1:]))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
