"""Batch scoring of a small CNN over a dask array read from .npy files, on a
LocalCluster, against single-process ``model.predict`` in the same run.

What is measured: a scoring job as it runs for real, inputs read from
storage by whoever computes. The images (32x32x3 float32) are written once
to .npy files of --file-rows rows in a temporary directory (so they sit in
the page cache, for every engine alike), then each pass, timed whole:

- ``local``: this process reads the files (memory-mapped) and runs
  ``model.predict`` on each, batches of --batch rows;
- ``dask sync``: the same ``cyback.dask.predict`` job as below, computed in
  this process on Dask's synchronous scheduler: cyback.dask's own way of
  running the model (its predict function on views of the input, where
  Keras' ``predict`` copies each batch) without a cluster, so that
  ``dask 1w`` / ``dask sync`` is what the cluster itself costs;
- ``dask 1w`` / ``dask 2w``: ``cyback.dask.predict(model,
  cyback.dask.from_npy_files(paths))`` on a LocalCluster of 1 or 2 worker
  processes x 1 thread, computed; the workers read the rows of their tasks,
  the predictions (samples x 10 floats) come back here. The pass includes
  building the graph (``predict`` saves the model to bytes) and the job's
  round trips through the scheduler. Tasks are sized by predict's default
  rule (``chunk_rows="auto"``); the table gives the rows per task it chose.

With ``--source persisted`` the data is instead generated on the workers in
chunks of --chunk rows and persisted there before timing (the figures of
earlier sessions), and ``local`` predicts the same array held in memory:
scoring data already in the cluster's memory, without reading it.

The clusters are started with ``cyback.dask.SCORING_CONFIG`` (Dask's
profiler off, its event-loop ticks and memory polls slowed), as docs/dask.md
advises for scoring: on this 2-core machine the LocalCluster's scheduler and
nannies live in this process, the two clusters' processes all share the
cores the workers compute on, and Dask's default monitoring takes several
percent of them, which the lone worker of ``dask 1w`` absorbs on the idle
core but ``dask 2w`` pays in wall time. ``--dask-config default`` measures
Dask's defaults instead.

The workers have loaded the model before timing starts (one untimed pass
per engine, reported as ``cold_s``). Engines are alternated round by round
and each figure is the median over --rounds. Every engine's predictions are
checked against the local ones before any time counts. Each --samples size
is its own case. Dask costs a job a few tens of milliseconds however long it
is (submitting the graph, the first task reaching a worker, gathering the
result), and the lone worker of ``dask 1w`` has the idle core for Dask's own
processes while ``dask 2w`` shares both cores with them: the 2-worker
speed-up is capped by what that costs against the job. 4096 samples (0.2 s
on one core) show the latency of a small job; 32768 (1.6 s) a job of a
second; 131072 (6.4 s, the case closest to scoring millions of rows, where
the latency is about 1% of the 2-worker job) the throughput of batch
scoring. A run takes about 5 minutes on a quiet machine
(``--samples 4096,32768``: 1.5).

``cpu_s`` is the CPU time a pass took in all the processes involved (this
one, which also runs the LocalCluster's scheduler and nannies, and the
workers): ``samples_per_cpu_s`` shows what the engines cost when a busy
machine makes wall times meaningless. ``here_cpu_s`` is this process's
share: for the cluster rows, what the client, the scheduler and the nannies
took from the cores the workers compute on.

Rows at ``threads=1`` give each process one core: the like-for-like
comparison of the targets (1 worker >= 90% of local; 2 workers >= 1.8x 1
worker). Rows at ``threads=auto`` show the default, where each worker runs
cyback on its share of the host's cores (a lone worker gets both) and the
local run on all cores.

    python benchmarks/bench_dask.py [--samples 4096,32768,131072] [--file-rows 1024] [--batch 64]
                                    [--rounds 5] [--source files|persisted] [--chunk 256]
                                    [--dask-config scoring|default]

Prints a table per size and writes benchmarks/results/dask.json. Report
``uptime`` with the figures: on a busy machine they are indicative only.
"""
import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
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


def write_files(directory, samples, file_rows):
    """The images as .npy files of ``file_rows`` rows; their paths, in order."""
    rng = np.random.RandomState(0)
    paths = []
    for i, start in enumerate(range(0, samples, file_rows)):
        n = min(file_rows, samples - start)
        paths.append(os.path.join(directory, "images-%05d.npy" % i))
        np.save(paths[-1], rng.random_sample((n, 32, 32, 3)).astype("float32"))
    return paths


def persisted_data(samples, chunk, clusters):
    """The images generated on each cluster's workers in chunks of ``chunk``
    rows and persisted there, and the same array here."""
    import dask.array as da
    import distributed
    data = da.random.RandomState(0).random_sample(
        (samples, 32, 32, 3), chunks=(chunk, 32, 32, 3)).astype("float32")
    held = {}
    for n, (_, client) in clusters.items():
        held[n] = client.persist(data)
        with client.as_current():
            distributed.wait(held[n])
    return held, data.compute(scheduler="synchronous")


def measure(samples, paths, model, clusters, args, cores):
    """Rows of the table for one data size, and the two target ratios."""
    import cyback
    import cyback.dask as cd

    if args.source == "persisted":
        held, x_local = persisted_data(samples, args.chunk, clusters)

    def local(threads):
        def run():
            cyback.set_num_threads(threads)
            if args.source == "persisted":
                return model.predict(x_local, batch_size=args.batch)
            return np.concatenate([model.predict(np.load(p, mmap_mode="r"),
                                                 batch_size=args.batch) for p in paths])
        return run

    tasks = {}

    def on_cluster(n, threads):
        cluster, client = clusters[n]

        def run():
            with client.as_current():
                data = held[n] if args.source == "persisted" else cd.from_npy_files(paths)
                pred = cd.predict(model, data, batch_size=args.batch, threads=threads)
                tasks[(n, threads)] = pred.chunks[0]
                return client.compute(pred, sync=True)
        return run

    def in_process():
        def run():
            cyback.set_num_threads(1)
            data = x_local if args.source == "persisted" else cd.from_npy_files(paths)
            pred = cd.predict(model, data, batch_size=args.batch, threads=1)
            tasks[(0, 1)] = pred.chunks[0]
            return pred.compute(scheduler="synchronous")
        return run

    engines = [("local", 1, 1, local(1)), ("dask sync", 0, 1, in_process()),
               ("dask 1w", 1, 1, on_cluster(1, 1)), ("dask 2w", 2, 1, on_cluster(2, 1)),
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
        """CPU time of this process (client, and the LocalCluster's scheduler
        and nannies, which run here) and that of the engine's workers."""
        here = time.process_time()
        if workers:
            return here, sum(clusters[workers][1].run(time.process_time).values())
        return here, 0.0

    times = {(name, threads): [] for name, _, threads, _ in engines}
    cpu = {(name, threads): [] for name, _, threads, _ in engines}
    here_cpu = {(name, threads): [] for name, _, threads, _ in engines}
    for _ in range(args.rounds):
        for name, workers, threads, run in engines:
            n = workers if name.startswith("dask ") else 0
            h0, w0 = cpu_seconds(n)
            t0 = time.perf_counter()
            run()
            times[(name, threads)].append(time.perf_counter() - t0)
            h1, w1 = cpu_seconds(n)
            cpu[(name, threads)].append(h1 - h0 + w1 - w0)
            here_cpu[(name, threads)].append(h1 - h0)
    cyback.set_num_threads(saved_threads)

    rows, rate = [], {}
    for name, workers, threads, _ in engines:
        t = statistics.median(times[(name, threads)])
        rate[(name, threads)] = samples / t
        c = statistics.median(cpu[(name, threads)])
        chunks = tasks.get((workers, threads)) if name != "local" else None
        rows.append(dict(samples=samples, engine=name, workers=workers, threads=threads,
                         tasks=len(chunks) if chunks else None,
                         rows_per_task=max(chunks) if chunks else None, median_s=t,
                         cold_s=cold[(name, threads)], samples_per_s=samples / t, cpu_s=c,
                         samples_per_cpu_s=samples / c,
                         here_cpu_s=statistics.median(here_cpu[(name, threads)])))
    for row in rows:
        base = rate[("local", 1 if row["threads"] == 1 else cores)]
        row["vs_local"] = row["samples_per_s"] / base
        if row["engine"] == "dask 2w":
            row["vs_1w"] = row["samples_per_s"] / rate[("dask 1w", row["threads"])]
    one = rate[("dask 1w", 1)] / rate[("local", 1)]
    two = rate[("dask 2w", 1)] / rate[("dask 1w", 1)]
    cluster = rate[("dask 1w", 1)] / rate[("dask sync", 1)]
    return rows, one, two, cluster


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", default="4096,32768,131072",
                    help="comma-separated data sizes, each measured as its own case")
    ap.add_argument("--file-rows", type=int, default=1024, help="rows per .npy file")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--source", choices=("files", "persisted"), default="files",
                    help="read .npy files in the job, or score an array persisted on the workers")
    ap.add_argument("--chunk", type=int, default=256,
                    help="rows per chunk of the persisted array (--source persisted)")
    ap.add_argument("--dask-config", choices=("scoring", "default"), default="scoring",
                    help="start the clusters with cyback.dask.SCORING_CONFIG, or Dask's defaults")
    args = ap.parse_args()
    sizes = [int(s) for s in args.samples.split(",")]

    import dask
    import distributed
    import keras
    logging.getLogger("distributed").setLevel(logging.ERROR)

    import cyback.dask as cd
    assert keras.backend.backend() == "cyback"

    model = build_cnn()
    cores = cd._cores()
    directory = tempfile.mkdtemp(prefix="bench_dask-")
    clusters = {}
    try:
        config = cd.SCORING_CONFIG if args.dask_config == "scoring" else {}
        for n in (1, 2):
            # The scheduler and nannies read the settings as they start, the
            # workers get them from their nannies.
            with dask.config.set(config):
                cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1,
                                                   processes=True, dashboard_address=None,
                                                   silence_logs=40)
                clusters[n] = cluster, distributed.Client(cluster, set_as_default=False)
        all_rows, cases = [], []
        for samples in sizes:
            paths = write_files(directory, samples, args.file_rows) \
                if args.source == "files" else []
            load_before = load_average()
            rows, one, two, cluster = measure(samples, paths, model, clusters, args, cores)
            load_after = load_average()
            for p in paths:
                os.remove(p)
            print_table(rows, ["engine", "workers", "threads", "tasks", "rows_per_task",
                               "median_s", "cold_s", "samples_per_s", "vs_local", "vs_1w",
                               "cpu_s", "samples_per_cpu_s", "here_cpu_s"],
                        title="CNN 32x32x3 -> 10, %d samples %s, batch %d, %d cores, dask "
                              "config %s (load %.2f before, %.2f after)"
                              % (samples, "in .npy files of %d rows" % args.file_rows
                                 if args.source == "files" else
                                 "persisted on the workers in chunks of %d rows" % args.chunk,
                                 args.batch, cores, args.dask_config, load_before or -1,
                                 load_after or -1))
            print("targets at 1 thread per process: 1 worker / local = %.2f (>= 0.90), "
                  "2 workers / 1 worker = %.2f (>= 1.80); 1 worker / dask sync = %.2f\n"
                  % (one, two, cluster))
            all_rows += rows
            cases.append(dict(samples=samples, one_worker_vs_local=one, two_workers_vs_one=two,
                              one_worker_vs_sync=cluster, load_before=load_before,
                              load_after=load_after))
        loads = [list(c[1].run(cd.cache_info).values()) for c in clusters.values()]
    finally:
        for cluster, client in clusters.values():
            client.close()
            cluster.close()
        shutil.rmtree(directory, ignore_errors=True)
    print("model loads per worker:", [[i["loads"] for i in c] for c in loads])
    name = "dask" if args.source == "files" else "dask_persisted"
    path = write_json(name if args.dask_config == "scoring" else name + "_default_config", all_rows,
                      samples=sizes, source=args.source, file_rows=args.file_rows,
                      chunk=args.chunk, batch=args.batch, rounds=args.rounds, cores=cores,
                      dask_config=args.dask_config,
                      cases=cases)
    print("wrote", path)


if __name__ == "__main__":
    main()
