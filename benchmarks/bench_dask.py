"""Batch scoring of a small CNN over a dask array on a LocalCluster, against
single-process ``model.predict`` in the same run.

Engines (one CNN, one data set, batches of --batch rows):

- ``local``: ``model.predict`` in this process on the whole array;
- ``dask 1w``: ``cyback.dask.predict`` on a LocalCluster of 1 worker process
  x 1 thread;
- ``dask 2w``: the same on 2 worker processes x 1 thread.

The data is generated on the workers and persisted before timing (scoring,
not shipping the input from this process, is measured); the predictions
(--samples x 10 floats) come back. The workers have loaded the model before
timing starts (one untimed pass: the first pass's time is reported apart as
``cold_s``). Engines are alternated round by round and each figure is the
median over --rounds. Every engine's predictions are checked against the
local ones before any time counts.

``cpu_s`` is the CPU time a pass took in all the processes involved (this
one, which also runs the LocalCluster's scheduler, and the workers):
``samples_per_cpu_s`` shows what the engines cost when a busy machine makes
wall times meaningless.

Rows at ``threads=1`` give each process one core: the like-for-like
comparison of the targets (1 worker >= 90% of local; 2 workers >= 1.8x 1
worker). Rows at ``threads=auto`` show the default, where each worker runs
cyback on its share of the host's cores (a lone worker gets both) and the
local run on all cores.

    python benchmarks/bench_dask.py [--samples 4096] [--batch 64] [--chunk 256] [--rounds 5]

Prints a table and writes benchmarks/results/dask.json. Report ``uptime``
with the figures: on a busy machine they are indicative only.
"""
import argparse
import logging
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_json  # noqa: E402

os.environ.setdefault("KERAS_BACKEND", "cyback")


def build_cnn():
    from keras import layers, models
    np.random.seed(0)
    return models.Sequential([
        layers.Conv2D(16, 3, activation="relu", input_shape=(32, 32, 3)),
        layers.MaxPooling2D(),
        layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(10, activation="softmax"),
    ])


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import dask.array as da
    import distributed
    import keras
    logging.getLogger("distributed").setLevel(logging.ERROR)

    import cyback
    import cyback.dask as cd
    assert keras.backend.backend() == "cyback"

    model = build_cnn()
    data = da.random.RandomState(0).random_sample(
        (args.samples, 32, 32, 3), chunks=(args.chunk, 32, 32, 3)).astype("float32")
    x_local = data.compute(scheduler="synchronous")
    cores = cd._cores()
    load_before = load_average()

    clusters = {}
    for n in (1, 2):
        cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                           dashboard_address=None, silence_logs=40)
        client = distributed.Client(cluster, set_as_default=False)
        persisted = client.persist(data)
        with client.as_current():
            distributed.wait(persisted)
        clusters[n] = (cluster, client, persisted)

    def local(threads):
        def run():
            cyback.set_num_threads(threads)
            return model.predict(x_local, batch_size=args.batch)
        return run

    def on_cluster(n, threads):
        cluster, client, persisted = clusters[n]

        def run():
            with client.as_current():
                pred = cd.predict(model, persisted, batch_size=args.batch, threads=threads)
                return client.compute(pred, sync=True)
        return run

    engines = [("local", 1, 1, local(1)), ("dask 1w", 1, 1, on_cluster(1, 1)),
               ("dask 2w", 2, 1, on_cluster(2, 1)),
               ("local", 1, cores, local(cores)), ("dask 1w", 1, "auto", on_cluster(1, "auto")),
               ("dask 2w", 2, "auto", on_cluster(2, "auto"))]
    saved_threads = cyback.get_num_threads()
    reference = local(1)()
    cold = {}
    for name, workers, threads, run in engines:
        t0 = time.perf_counter()
        out = run()
        cold[(name, threads)] = time.perf_counter() - t0
        np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-6,
                                   err_msg="%s threads=%s" % (name, threads))
    def cpu_seconds(workers):
        """CPU time of this process (client, and the LocalCluster's scheduler,
        which runs here) plus that of the engine's worker processes."""
        total = time.process_time()
        if workers:
            total += sum(clusters[workers][1].run(time.process_time).values())
        return total

    times = {(name, threads): [] for name, _, threads, _ in engines}
    cpu = {(name, threads): [] for name, _, threads, _ in engines}
    for _ in range(args.rounds):
        for name, workers, threads, run in engines:
            n = workers if name != "local" else 0
            c0 = cpu_seconds(n)
            t0 = time.perf_counter()
            run()
            times[(name, threads)].append(time.perf_counter() - t0)
            cpu[(name, threads)].append(cpu_seconds(n) - c0)
    cyback.set_num_threads(saved_threads)
    load_after = load_average()
    loads = [list(c[1].run(cd.cache_info).values()) for c in clusters.values()]
    for cluster, client, _ in clusters.values():
        client.close()
        cluster.close()

    rows = []
    rate = {}
    for name, workers, threads, _ in engines:
        t = statistics.median(times[(name, threads)])
        rate[(name, threads)] = args.samples / t
        c = statistics.median(cpu[(name, threads)])
        rows.append(dict(engine=name, workers=workers, threads=threads, median_s=t,
                         cold_s=cold[(name, threads)], samples_per_s=args.samples / t,
                         cpu_s=c, samples_per_cpu_s=args.samples / c))
    for row in rows:
        base = rate[("local", 1 if row["threads"] == 1 else cores)]
        row["vs_local"] = row["samples_per_s"] / base
        if row["engine"] == "dask 2w":
            row["vs_1w"] = row["samples_per_s"] / rate[("dask 1w", row["threads"])]
    print_table(rows, ["engine", "workers", "threads", "median_s", "cold_s", "samples_per_s",
                       "vs_local", "vs_1w", "cpu_s", "samples_per_cpu_s"],
                title="CNN 32x32x3 -> 10, %d samples, batch %d, chunks of %d, %d cores "
                      "(load %.2f before, %.2f after)" % (args.samples, args.batch, args.chunk,
                                                          cores, load_before or -1,
                                                          load_after or -1))
    one = rate[("dask 1w", 1)] / rate[("local", 1)]
    two = rate[("dask 2w", 1)] / rate[("dask 1w", 1)]
    print("targets at 1 thread per process: 1 worker / local = %.2f (>= 0.90), "
          "2 workers / 1 worker = %.2f (>= 1.80)" % (one, two))
    print("model loads per worker:", [[i["loads"] for i in c] for c in loads])
    path = write_json("dask", rows, samples=args.samples, batch=args.batch, chunk=args.chunk,
                      rounds=args.rounds, cores=cores, load_before=load_before,
                      load_after=load_after, one_worker_vs_local=one,
                      two_workers_vs_one=two)
    print("wrote", path)


if __name__ == "__main__":
    main()
