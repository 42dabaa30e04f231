"""Repeatability of a served model: the same inputs, run again and again, must
give bit-identical outputs at one thread setting, with other work on the
machine or without.

A Keras CNN (convolutions, batch normalization, depthwise and separable
convolutions, pooling, dense layers) saved to HDF5 and loaded back, one
compiled K.function, 20 batch-16 and 20 batch-1 inputs; each pass runs them
all, every third pass after the team has slept, every fifth after a Keras
``predict`` of another batch size. Prints the number of outputs that differ
from the first pass and writes the figures to benchmarks/results/.

    python benchmarks/check_repeatability.py --passes 200
    python benchmarks/check_repeatability.py --passes 200 --busy   # a busy loop on one core
"""
import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "cyback")
os.environ.setdefault("KERAS_HOME", tempfile.mkdtemp(prefix="cyback-keras-home-"))

from _common import RESULTS_DIR  # noqa: E402


def _spin(stop):
    while not stop.is_set():
        pass


def _busy_loop(cpu):
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
    proc.start()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(proc.pid, {cpu})
    return stop, proc


def _model(path):
    import keras
    from keras import layers
    np.random.seed(0)
    inp = layers.Input((28, 28, 3))
    x = layers.Conv2D(16, 3, activation="relu")(inp)
    x = layers.BatchNormalization()(x)
    x = layers.MaxPooling2D()(x)
    x = layers.SeparableConv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.DepthwiseConv2D(3, padding="same")(x)
    x = layers.Conv2D(32, 1, activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(64, activation="relu")(x)
    x = layers.Dense(10, activation="softmax")(x)
    model = keras.Model(inp, x)
    model.compile("adam", "categorical_crossentropy")
    model.save(path)
    return keras.models.load_model(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--busy", action="store_true",
                        help="run a busy loop pinned to the last CPU of the mask meanwhile")
    args = parser.parse_args(argv)
    import cyback as K
    from cyback.kernels import runtime

    busy = None
    if args.busy:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
        busy = _busy_loop(cpus[-1])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = _model(os.path.join(tmp, "cnn.h5"))
        f = K.function(model.inputs, model.outputs)
        rng = np.random.default_rng(1)
        inputs = ([rng.standard_normal((16, 28, 28, 3)).astype("float32") for _ in range(20)] +
                  [rng.standard_normal((1, 28, 28, 3)).astype("float32") for _ in range(20)])
        first = [f([x])[0].copy() for x in inputs]
        differing = 0
        start = time.perf_counter()
        for p in range(args.passes):
            if p % 3 == 1:
                runtime.team_rest()
            if p % 5 == 2:
                model.predict(np.concatenate(inputs[:4]), batch_size=32)
            for x, ref in zip(inputs, first):
                differing += not np.array_equal(f([x])[0], ref)
        seconds = time.perf_counter() - start
    finally:
        if busy is not None:
            busy[0].set()
            busy[1].join(5)
    result = {"passes": args.passes, "outputs_per_pass": len(inputs),
              "differing_outputs": int(differing), "busy_loop": bool(args.busy),
              "threads": K.get_num_threads(), "seconds": round(seconds, 2),
              "load_average": list(os.getloadavg()),
              "command": "python benchmarks/check_repeatability.py --passes %d%s"
                         % (args.passes, " --busy" if args.busy else "")}
    print("%d passes of %d outputs at %d threads%s: %d outputs differ from the first pass "
          "(%.1f s)" % (args.passes, len(inputs), result["threads"],
                        " with a busy loop on one core" if args.busy else "", differing, seconds))
    os.makedirs(RESULTS_DIR, exist_ok=True)
    name = "repeatability%s.json" % ("_busy" if args.busy else "")
    with open(os.path.join(RESULTS_DIR, name), "w") as fh:
        json.dump(result, fh, indent=1)
    return 0 if differing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
