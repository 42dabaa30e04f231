"""Serve a saved model from a thread pool with a fixed thread budget.

    python examples/serve_thread_pool.py [--workers 2] [--requests 64]

A web server or a job queue runs several requests at once, each on its own
Python thread. cyback's thread count is the process's: every request thread
that calls a kernel gets an OpenMP team of that size, so ``workers`` requests
at once ask for up to ``workers x set_num_threads`` threads. To give the pool
the machine's cores without oversubscribing them, set the count to the cores
divided by the pool's size (docs/threads.md). At one thread setting the same
input gives bit-identical outputs on every call, whichever thread serves it
and whatever runs beside it; this script checks that.

Needs multi-backend Keras 2.3.1 and h5py (pip install ".[keras]"). Runs in a
few seconds; its files go to a temporary folder removed at the end.
"""
import argparse
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("KERAS_BACKEND", "cyback")

import numpy as np  # noqa: E402


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def build_and_save(keras, path):
    """A small image classifier with fixed random weights, saved to ``path``."""
    model = keras.models.Sequential([
        keras.layers.Conv2D(8, 3, activation="relu", input_shape=(16, 16, 3)),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, activation="softmax"),
    ])
    rng = np.random.default_rng(1)
    # random kernels, zero biases (a stand-in for trained weights)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype("float32") if w.ndim > 1
                       else np.zeros(w.shape, "float32") for w in model.get_weights()])
    model.save(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="request threads (default 2)")
    p.add_argument("--requests", type=int, default=64, help="requests to serve (default 64)")
    args = p.parse_args(argv)
    if args.workers < 1 or args.requests < 1:
        p.error("--workers and --requests must be positive")

    import keras

    import cyback
    threads = max(1, usable_cores() // args.workers)
    cyback.set_num_threads(threads)
    print("%d request threads x %d cyback threads each on %d cores"
          % (args.workers, threads, usable_cores()))

    folder = tempfile.mkdtemp(prefix="cyback-example-")
    try:
        path = os.path.join(folder, "classifier.h5")
        build_and_save(keras, path)
        model = cyback.load_model(path)
        rng = np.random.default_rng(2)
        # a few distinct inputs of several batch sizes, each asked for many times
        inputs = [rng.random((n, 16, 16, 3), dtype=np.float32) for n in (1, 1, 4, 8)]
        model.predict_on_batch(inputs[0])        # builds Keras's predict function once
        expected = [model.predict_on_batch(x) for x in inputs]

        def serve(i):
            k = i % len(inputs)
            return k, model.predict_on_batch(inputs[k])

        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            answers = list(pool.map(serve, range(args.requests)))
    finally:
        shutil.rmtree(folder)
    differing = sum(not np.array_equal(out, expected[k]) for k, out in answers)
    print("served %d requests; %d answers differ from the answers computed one at a time"
          % (len(answers), differing))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
