"""How cyback's benchmarks take a time: warm-up, repeated blocks, engines alternated.

Every case is a set of engines (cyback and its peers) computing the same thing.
After a warm-up, the engines run in turn, one block each, the order rotating
from block to block, so that load from other processes falls on all of them
alike. A block is as many back-to-back calls as fill ``block_seconds``
(calibrated per engine during warm-up); each call is timed on its own, so a
case yields both per-block means (their median and 90th percentile are the
reported figures) and single-call latencies (their distribution is charted).
"""
import statistics
import time

import numpy as np


def percentile(values, q):
    """The q-th percentile (0-100) of ``values`` by linear interpolation."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def summarize(block_means):
    """Median, p90 and lower quartile (q25: a block outside the host's slow
    spells, see paired_ratio) of per-call seconds over blocks."""
    return {"median_s": statistics.median(block_means), "p90_s": percentile(block_means, 90),
            "q25_s": percentile(block_means, 25), "blocks": len(block_means)}


def paired_ratio(stats, num, den):
    """The ratio of engine ``num``'s time to ``den``'s from stats of
    time_alternated: its median and quartiles over rounds, each round's
    ratio taken between the two blocks that round ran (a few hundred
    milliseconds apart). A virtualised host's speed drifts in spells longer
    than a block (every thread slows alike, with full CPU time and no
    run-queue wait), which makes a ratio of two medians unstable from run to
    run; a round's ratio compares like with like as long as the spell spans
    both blocks, and the median over rounds discards the rounds where it did
    not. When spells take a large share of the blocks and fall on one engine
    more than the other, that median moves with them too; the ratio of the
    engines' lower quartiles (summarize's q25_s) then compares their blocks
    outside spells."""
    a, b = stats[num]["block_means_s"], stats[den]["block_means_s"]
    if len(a) != len(b) or not a:
        raise ValueError("paired_ratio needs the same number of blocks for %r and %r, "
                         "got %d and %d" % (num, den, len(a), len(b)))
    r = [x / y for x, y in zip(a, b)]
    return {"median": statistics.median(r), "q25": percentile(r, 25), "q75": percentile(r, 75),
            "rounds": len(r)}


def calls_per_block(fn, block_seconds, warmup_seconds, min_warmup=2):
    """Warm ``fn`` up and return how many calls fill one block."""
    calls, t0 = 0, time.perf_counter()
    while calls < min_warmup or time.perf_counter() - t0 < warmup_seconds:
        fn()
        calls += 1
    per_call = (time.perf_counter() - t0) / calls
    return max(1, int(block_seconds / max(per_call, 1e-9)))


def settle(seconds, idle_cores=0.1, step=0.01, most=1.0):
    """Sleep ``seconds``, then on until this process is idle: until a
    ``step`` passes in which all its threads together used less than
    ``idle_cores`` of a core, or ``most`` seconds have gone by. The worker
    threads of the engine that ran last may spin on for tens of
    milliseconds after its last call (ONNX Runtime's do), longer than a
    fixed pause, and the next engine's block would share its cores with
    them."""
    time.sleep(seconds)
    end = time.perf_counter() + most
    while time.perf_counter() < end:
        c0, t0 = time.process_time(), time.perf_counter()
        time.sleep(step)
        if time.process_time() - c0 < idle_cores * (time.perf_counter() - t0):
            return True
    return False


def time_alternated(engines, blocks=7, block_seconds=0.02, warmup_seconds=0.05,
                    keep_latencies=False, max_calls=20000, settle_seconds=0.03):
    """Time ``engines`` ({name: fn}) in alternation; returns {name: stats}.

    stats holds ``median_s`` and ``p90_s`` (per call, over ``blocks`` block
    means), ``calls`` per block and, with ``keep_latencies``, every single call's
    time in ``latencies_s``.
    """
    names = list(engines)
    counts = {n: min(max_calls, calls_per_block(engines[n], block_seconds, warmup_seconds))
              for n in names}
    means = {n: [] for n in names}
    lat = {n: [] for n in names}
    clock = time.perf_counter
    for b in range(blocks):
        k = b % len(names)
        for name in names[k:] + names[:k]:
            # Idle time before each block: the previous engine's worker threads
            # (ONNX Runtime's and TF's spin after a call) go to sleep instead
            # of taking the cores this block runs on.
            settle(settle_seconds)
            fn, n = engines[name], counts[name]
            times = [0.0] * n
            for i in range(n):
                t0 = clock()
                fn()
                times[i] = clock() - t0
            means[name].append(sum(times) / n)
            if keep_latencies:
                lat[name].extend(times)
    out = {}
    for name in names:
        s = summarize(means[name])
        s["calls"] = counts[name]
        s["block_means_s"] = means[name]
        if keep_latencies:
            s["latencies_s"] = lat[name]
        out[name] = s
    return out


def median_time(fn, repeats=5, warmup=1):
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check_close(name, got, ref, tol=1e-4):
    """Raise unless ``got`` matches ``ref`` to ``tol`` (absolute, scaled by max(1, |ref|max))."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise AssertionError("%s: output shape %s, expected %s" % (name, got.shape, ref.shape))
    if ref.size == 0:
        return 0.0
    err = float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref)))))
    if not err <= tol:
        raise AssertionError("%s: output differs from cyback's by %.3g (> %g); its time does not "
                             "count" % (name, err, tol))
    return err
