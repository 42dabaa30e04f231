"""Shared helpers for the benchmark scripts: timing, tables, JSON, roofline."""
import contextlib
import json
import os
import platform
import sys
import time

import numpy as np

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def bench_package():
    """Import cyback.bench, which holds the timing method and the cases; when
    PYTHONPATH points at a cyback checkout that predates it (an A/B run of an
    older cyback), load it from beside this script instead."""
    import importlib.util
    import sys
    try:
        import cyback.bench
        return cyback.bench
    except ImportError:
        pass
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cyback",
                        "bench", "__init__.py")
    spec = importlib.util.spec_from_file_location("cyback.bench", here,
                                                  submodule_search_locations=[os.path.dirname(here)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["cyback.bench"] = module
    spec.loader.exec_module(module)
    return module


bench_package()
from cyback.bench.timing import median_time  # noqa: E402,F401  (one timing method for all)


def try_import_torch():
    """torch, single-process CPU, or None when it is not installed."""
    try:
        import torch
    except Exception:
        return None
    return torch


@contextlib.contextmanager
def reference_blas():
    """NumPy references run with BLAS on all threads, as NumPy users have it
    (importing cyback holds BLAS at one thread for cyback's own sake)."""
    from cyback.kernels.blas_threads import get_blas_threads, set_blas_threads
    from cyback.kernels.runtime import get_max_threads
    old = get_blas_threads()
    set_blas_threads(get_max_threads())
    try:
        yield
    finally:
        set_blas_threads(old)


def sgemm_gflops(n=2048, repeats=5):
    """The machine's float32 matmul rate through NumPy's BLAS on all cyback's
    threads: the roofline the kernels aim at. (Importing cyback holds BLAS at
    one thread; it is lifted for this measurement only.)"""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    with reference_blas():
        t = median_time(lambda: a @ b, repeats=repeats, warmup=2)
    return 2.0 * n ** 3 / t / 1e9


#: Variables that make OpenBLAS run a kernel set other than the one it
#: detects for the CPU (some machines set them for old OpenBLAS builds).
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def openblas_overrides(environ=os.environ):
    """The OPENBLAS_OVERRIDES set in ``environ``, as a dict (for the JSON)."""
    return {k: environ[k] for k in OPENBLAS_OVERRIDES if k in environ}


def warn_openblas_overrides(environ=os.environ):
    """Say on stderr when the environment forces OpenBLAS's kernel set: the
    figures then measure those kernels, not the ones OpenBLAS picks for this
    CPU (run with ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`` to get
    those)."""
    import sys
    found = openblas_overrides(environ)
    if found:
        print("note: %s set: OpenBLAS runs the kernels it names, not the ones it detects "
              "for this CPU" % ", ".join("%s=%s" % kv for kv in sorted(found.items())),
              file=sys.stderr)
    return found


def print_table(rows, columns, title=None):
    """Print dict rows as an aligned text table; floats get 2 decimals."""
    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return "%.2f" % v
        return str(v)
    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    if title:
        print(title)
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def write_json(name, rows, **meta):
    """Write rows (and machine metadata) to benchmarks/results/<name>.json; returns the path."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, "%s.json" % name)
    doc = dict(name=name, machine=platform.machine(), processor=platform.processor(),
               cpus=os.cpu_count(), numpy=np.__version__, time=time.strftime("%Y-%m-%d %H:%M:%S"),
               openblas_env=openblas_overrides(), rows=rows, **meta)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=float)
    return path


#: A handoff above this (ns) means the two CPUs sit on different dies: see
#: docs/performance.md, "Where the two CPUs are".
FAR_HANDOFF_NS = 250.0


def handoff_probe():
    """The round trip of a cache line between two threads of cyback's team
    right now (``runtime.handoff_ns``, ns), or None where it cannot be
    measured. Taken before each round of an interleaved benchmark and kept
    with its rows: a VM's two CPUs move between dies for minutes at a time,
    and figures taken while they are far apart are not comparable with the
    others (every engine slows, cyback more than most)."""
    try:
        from cyback.kernels import runtime
    except ImportError:
        return None
    # the least of three: another process's thread taking a CPU for a moment
    # (a peer's spinning workers just after its call) makes a probe slower,
    # never faster
    probes = [runtime.handoff_ns(2000) for _ in range(3)]
    probes = [ns for ns in probes if ns is not None]
    return round(min(probes), 1) if probes else None


def handoff_settled(wait_s):
    """``handoff_probe()``, first waiting up to ``wait_s`` seconds (probing
    every 2 s) while it says the CPUs are far apart: a round then starts in
    the machine's usual state, for every engine alike (they are timed in the
    same round). Returns the last probe."""
    ns = handoff_probe()
    deadline = time.time() + wait_s
    while ns is not None and ns > FAR_HANDOFF_NS and time.time() < deadline:
        time.sleep(2.0)
        ns = handoff_probe()
    return ns


def near_round(workers, order, request, settle, wait_near, describe, retries=2):
    """``([(engine, reply)], handoff_ns)``: one round of an interleaved
    benchmark, ``request`` asked of each engine of ``order`` in turn after a
    pause of ``settle`` seconds (``describe(engine, reply)`` the line printed
    for it), between two handoff probes; the handoff is the larger of the
    two. With ``wait_near`` (seconds, > 0), a round that began or ended with
    the CPUs far apart (the state can change while the engines are timed) is
    timed again, after waiting for the near state, up to ``retries`` times;
    the last try is kept whatever its state, and its handoff says which it
    was."""
    for attempt in range(retries + 1):
        before = handoff_settled(wait_near)
        rows = []
        for engine in order:
            time.sleep(settle)
            rows.append((engine, workers[engine].ask(request)))
            print("  " + describe(engine, rows[-1][1]), file=sys.stderr, flush=True)
        after = handoff_probe()
        probes = [v for v in (before, after) if v is not None]
        handoff = max(probes) if probes else None
        if not wait_near or handoff is None or handoff <= FAR_HANDOFF_NS:
            break
        print("  (the CPUs were far apart during the round: %s ns; timing it again)"
              % handoff, file=sys.stderr, flush=True)
    print("    (handoff %s ns)" % handoff, file=sys.stderr, flush=True)
    return rows, handoff


def handoff_summary(values):
    """{'median_ns', 'far_rounds', 'rounds'} of the probes a run took, and a
    line to print when some rounds ran with the CPUs far apart (or None)."""
    taken = [v for v in values if v is not None]
    far = sum(v > FAR_HANDOFF_NS for v in taken)
    summary = {"median_ns": sorted(taken)[len(taken) // 2] if taken else None,
               "far_rounds": far, "rounds": len(taken), "far_above_ns": FAR_HANDOFF_NS}
    warning = None
    if far:
        warning = ("note: %d of %d rounds ran with the two CPUs far apart (a cache line's "
                   "round trip above %.0f ns, median %.0f ns): their figures are slower than "
                   "the machine's usual ones, cyback's more than the peers'; rows carry "
                   "'handoff_ns'" % (far, len(taken), FAR_HANDOFF_NS, summary["median_ns"]))
    return summary, warning
