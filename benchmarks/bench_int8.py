"""cyback int8 against cyback float32: the product kernel, single layers and
the digits CNN of tests/quantization/test_digits_accuracy.py.

Run: python benchmarks/bench_int8.py [--blocks N] [--block-seconds S] [--quick]

Three tables, each engine pair alternated in blocks (cyback.bench.timing):

- kernel: qgemm.gemm (uint8 x packed int8, float32 out, activations already
  quantized) against kernels.linalg.matmul (float32) on the same (M, K, N),
  in G multiply-adds per second;
- layers: a Keras model of one Dense / Conv1D / Conv2D layer and its
  cyback.quantize'd copy, each through K.function (the int8 time includes
  quantizing the input, the patches and dequantizing), with the largest
  difference of the outputs relative to the largest float output;
- model: the digits CNN (trained here for a few epochs) at batch 1 and 128,
  float32 and int8, with each one's top-1 accuracy on the held-out digits.

Prints the tables with the instruction set the int8 kernels ran and writes
benchmarks/results/int8.json. Take figures on a quiet machine only.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("KERAS_BACKEND", "cyback")

import cyback  # noqa: E402
from cyback.bench.timing import time_alternated  # noqa: E402
from cyback.kernels import linalg, qgemm  # noqa: E402
from cyback.layers import import_keras  # noqa: E402

from _common import print_table, write_json  # noqa: E402

keras = import_keras()
K = keras.backend
L = keras.layers

# (M, K, N): a batch-1 classifier, batch-32 Dense layers, the products of a
# 3x3 and a 1x1 convolution at 28x28 and 14x14
KERNEL_CASES = [(1, 2048, 1000), (32, 1024, 1024), (32, 4096, 1000), (784, 1152, 128),
                (196, 2304, 256), (3136, 64, 256), (784, 256, 512)]

# name, input shape (with batch), layer factory
LAYER_CASES = [
    ("Dense 2048->1000, batch 1", (1, 2048), lambda: L.Dense(1000)),
    ("Dense 1024->1024 relu, batch 32", (32, 1024), lambda: L.Dense(1024, activation="relu")),
    ("Conv2D 3x3 64->64 56x56, batch 1", (1, 56, 56, 64),
     lambda: L.Conv2D(64, 3, padding="same", activation="relu")),
    ("Conv2D 3x3 128->128 28x28, batch 8", (8, 28, 28, 128),
     lambda: L.Conv2D(128, 3, padding="same", activation="relu")),
    ("Conv2D 1x1 256->512 28x28, batch 1", (1, 28, 28, 256), lambda: L.Conv2D(512, 1)),
    ("Conv2D 3x3/2 64->128 56x56, batch 1", (1, 56, 56, 64),
     lambda: L.Conv2D(128, 3, strides=2, padding="same")),
    ("Conv1D k5 128->128 100 steps, batch 8", (8, 100, 128),
     lambda: L.Conv1D(128, 5, padding="causal", activation="relu")),
]


def kernel_rows(timing):
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in KERNEL_CASES:
        a8 = rng.integers(0, 256, (m, k), dtype=np.uint8)
        w8 = rng.integers(-127, 128, (k, n), dtype=np.int8)
        packed = qgemm.pack_weights(w8)
        sb = np.full(n, 1e-3, np.float32)
        vectors = qgemm.epilogue_vectors(0.02, sb)
        af = rng.standard_normal((m, k), dtype=np.float32)
        wf = rng.standard_normal((k, n), dtype=np.float32)
        stats = time_alternated({
            "float32": lambda: linalg.matmul(af, wf),
            "int8": lambda: qgemm.gemm_prepared(a8, packed, vectors, 128),
        }, **timing)
        macs = float(m) * n * k
        f, q = stats["float32"]["median_s"], stats["int8"]["median_s"]
        rows.append({"case": "%dx%dx%d" % (m, k, n), "float32 ms": f * 1e3, "int8 ms": q * 1e3,
                     "float32 GMAC/s": macs / f / 1e9, "int8 GMAC/s": macs / q / 1e9,
                     "speedup": f / q})
    return rows


def one_layer_model(shape, factory):
    inp = L.Input(shape[1:])
    return keras.models.Model(inp, factory()(inp))


def inference_function(model):
    f = K.function(model.inputs, model.outputs)
    return lambda x: f([x])[0]


def layer_rows(timing):
    rng = np.random.default_rng(1)
    rows = []
    for name, shape, factory in LAYER_CASES:
        model = one_layer_model(shape, factory)
        calib = rng.standard_normal((16,) + shape[1:]).astype(np.float32)
        quantized = cyback.quantize(model, calib)
        x = rng.standard_normal(shape).astype(np.float32)
        run_f, run_q = inference_function(model), inference_function(quantized)
        yf, yq = run_f(x), run_q(x)
        stats = time_alternated({"float32": lambda: run_f(x), "int8": lambda: run_q(x)},
                                **timing)
        f, q = stats["float32"]["median_s"], stats["int8"]["median_s"]
        rows.append({"layer": name, "float32 ms": f * 1e3, "int8 ms": q * 1e3,
                     "speedup": f / q,
                     "max diff / max |y|": float(np.abs(yf - yq).max() /
                                                 max(np.abs(yf).max(), 1e-30))})
    return rows


def digits_rows(timing, epochs):
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target
    order = np.random.RandomState(7).permutation(len(y))
    x, y = x[order], y[order]
    x_train, y_train, x_test, y_test = x[:1100], y[:1100], x[1100:], y[1100:]
    inp = L.Input((8, 8, 1))
    h = L.Conv2D(16, 3, padding="same", activation="relu")(inp)
    h = L.Conv2D(32, 3, activation="relu")(h)
    h = L.MaxPooling2D()(h)
    h = L.Flatten()(h)
    h = L.Dense(64, activation="relu")(h)
    model = keras.models.Model(inp, L.Dense(10, activation="softmax")(h))
    model.compile(keras.optimizers.Adam(0.003), "sparse_categorical_crossentropy")
    model.fit(x_train, y_train, batch_size=32, epochs=epochs, verbose=0)
    quantized = cyback.quantize(model, x_train[:300])
    run_f, run_q = inference_function(model), inference_function(quantized)
    rows = []
    for batch in (1, 128):
        xb = x_test[:batch]
        stats = time_alternated({"float32": lambda: run_f(xb), "int8": lambda: run_q(xb)},
                                **timing)
        f, q = stats["float32"]["median_s"], stats["int8"]["median_s"]
        rows.append({"batch": batch, "float32 ms": f * 1e3, "int8 ms": q * 1e3,
                     "speedup": f / q,
                     "float32 top-1": float(np.mean(run_f(x_test).argmax(1) == y_test)),
                     "int8 top-1": float(np.mean(run_q(x_test).argmax(1) == y_test))})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=12, help="digits CNN training epochs")
    parser.add_argument("--quick", action="store_true",
                        help="one short block per engine, 2 epochs, no JSON: checks that the "
                             "script runs")
    args = parser.parse_args()
    timing = dict(blocks=args.blocks, block_seconds=args.block_seconds)
    epochs = args.epochs
    if args.quick:
        timing = dict(blocks=1, block_seconds=0.001, warmup_seconds=0.001, settle_seconds=0.0)
        epochs = 2
    meta = dict(instruction_set=qgemm.instruction_set(), threads=cyback.get_num_threads())
    print("int8 kernels: %s; %d threads" % (meta["instruction_set"], meta["threads"]))
    kernels = kernel_rows(timing)
    print_table(kernels, ["case", "float32 ms", "int8 ms", "float32 GMAC/s", "int8 GMAC/s",
                          "speedup"], title="\nproduct kernels (M x K x N)")
    layers = layer_rows(timing)
    print_table(layers, ["layer", "float32 ms", "int8 ms", "speedup", "max diff / max |y|"],
                title="\none-layer models through K.function")
    model = digits_rows(timing, epochs)
    print_table(model, ["batch", "float32 ms", "int8 ms", "speedup", "float32 top-1",
                        "int8 top-1"], title="\ndigits CNN")
    if not args.quick:
        path = write_json("int8", kernels, layers=layers, model=model, **meta)
        print("\nwrote %s" % path)


if __name__ == "__main__":
    main()
