"""Published architectures on cyback against TensorFlow, ONNX Runtime, OpenVINO and LiteRT.

The models are built by tf_keras (Keras applications with random weights and
BatchNormalization statistics made non-trivial, two text models and a
Transformer encoder block), saved as tf.keras HDF5 and loaded into cyback
with ``cyback.load_model``: the import path users take is the one measured.
The peers run the same weights: TF (``tf.function``), ONNX Runtime and
OpenVINO (through tf2onnx; OpenVINO at f32 precision), LiteRT (XNNPACK).

Every engine runs in a process of its own that stays open; the driver asks
them in turn for one model and batch (the order rotating from round to round),
so the times a ratio compares are taken seconds apart, not minutes: this
machine's speed drifts. Each engine checks a model's outputs against TF's to
1e-4 before it times. The table gives the median per-call time over the
rounds, the best peer per model and cyback's ratio to it (> 1: cyback is faster).

The peers live in another Python environment, never cyback's:

    python -m venv /opt/peers && /opt/peers/bin/pip install tensorflow-cpu tf-keras \\
        onnxruntime onnx openvino ai-edge-litert tf2onnx
    python benchmarks/bench_applications.py --tf-python /opt/peers/bin/python \\
        [--models mobilenetv2,resnet50] [--batches 1,8] [--rounds 2] [--threads 2]

Writes benchmarks/results/applications.json. ``--load-time`` also times
``cyback.load_model`` against ``tf_keras.models.load_model`` on ResNet50's file.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from _interleave import Worker, rotated, serve

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
PEERS = ("tf", "ort", "openvino", "litert")
MODELS = ("mobilenet", "mobilenetv2", "resnet50", "densenet121", "inceptionv3", "nasnetmobile",
          "text_bilstm", "text_cnn", "transformer_block")
TOLERANCE = 1e-4


# ----------------------------------------------------------------- timing (both environments)

def time_calls(fn, blocks=7, block_seconds=0.25, warmup=3):
    """Median and 10th/90th percentile of the per-call time (seconds) over
    ``blocks`` blocks of back-to-back calls filling ``block_seconds`` each."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    calls = max(1, min(2000, int(block_seconds / one)))
    means = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter() - t0) / calls)
    means.sort()
    return {"median_s": means[len(means) // 2], "p10_s": means[max(0, len(means) // 10)],
            "p90_s": means[min(len(means) - 1, (9 * len(means)) // 10)], "calls": calls}


# ----------------------------------------------------------------- the TensorFlow side

def _tf_env(threads):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tf_keras
    return tf, tf_keras


def _text_bilstm(keras):
    inp = keras.Input((100,), dtype="int32")
    x = keras.layers.Embedding(20000, 128)(inp)
    x = keras.layers.Bidirectional(keras.layers.LSTM(64))(x)
    return keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))


def _text_cnn(keras):
    inp = keras.Input((400,), dtype="int32")
    x = keras.layers.Embedding(5000, 50)(inp)
    x = keras.layers.Conv1D(250, 3, activation="relu")(x)
    x = keras.layers.GlobalMaxPooling1D()(x)
    x = keras.layers.Dense(250, activation="relu")(x)
    return keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))


def _transformer_block(keras):
    inp = keras.Input((64, 128))
    att = keras.layers.MultiHeadAttention(num_heads=4, key_dim=32)(inp, inp)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(inp + att)
    ff = keras.layers.Dense(256, activation="gelu")(x)
    ff = keras.layers.Dense(128)(ff)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + ff)
    return keras.Model(inp, x)


def build(name, keras, classifier_activation="softmax"):
    import numpy as np
    apps = keras.applications
    ctor = {"mobilenet": apps.MobileNet, "mobilenetv2": apps.MobileNetV2,
            "resnet50": apps.ResNet50, "densenet121": apps.DenseNet121,
            "inceptionv3": apps.InceptionV3, "nasnetmobile": apps.NASNetMobile}.get(name)
    keras.utils.set_random_seed(0)
    if ctor is not None:
        model = ctor(weights=None, classifier_activation=classifier_activation)
    else:
        model = {"text_bilstm": _text_bilstm, "text_cnn": _text_cnn,
                 "transformer_block": _transformer_block}[name](keras)
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            # by name: a layer without scale (InceptionV3's) has no gamma
            values = []
            for w in layer.weights:
                kind = w.name.split("/")[-1].split(":")[0]
                shape = tuple(w.shape)
                if kind in ("gamma", "moving_variance"):
                    values.append(rng.uniform(0.5, 1.5, shape).astype("float32"))
                else:
                    values.append(rng.normal(0, 0.1, shape).astype("float32"))
            layer.set_weights(values)
    return model


def inputs_for(model, batch, seed=1):
    import numpy as np
    rng = np.random.default_rng(seed)
    shape = (batch,) + tuple(model.input_shape[1:])
    if model.inputs[0].dtype.name.startswith("int"):
        return rng.integers(1, 1000, shape).astype("int32")
    return rng.standard_normal(shape).astype("float32")


def export(work, models, batches, threads, classifier_activation="softmax"):
    """Each model's .h5, .onnx and .tflite files, inputs and TF's outputs
    (``classifier_activation=None``: the applications output their logits)."""
    tf, keras = _tf_env(threads)
    import numpy as np
    import tf2onnx
    for name in models:
        d = os.path.join(work, name)
        if all(os.path.exists(os.path.join(d, "y_b%d.npy" % b)) for b in batches):
            continue
        os.makedirs(d, exist_ok=True)
        model = build(name, keras, classifier_activation)
        model.save(os.path.join(d, "model.h5"))
        dtype = tf.int32 if model.inputs[0].dtype.name.startswith("int") else tf.float32
        spec = (tf.TensorSpec((None,) + tuple(model.input_shape[1:]), dtype, name="input"),)
        # a converter that cannot take a model leaves that peer out of its row
        try:
            tf2onnx.convert.from_keras(model, input_signature=spec, opset=17,
                                       output_path=os.path.join(d, "model.onnx"))
        except Exception as e:
            print("tf2onnx cannot convert %s: %s" % (name, str(e).splitlines()[0][:200]),
                  file=sys.stderr)
        try:
            conv = tf.lite.TFLiteConverter.from_keras_model(model)
            flat = conv.convert()
            with open(os.path.join(d, "model.tflite"), "wb") as f:
                f.write(flat)
        except Exception as e:
            print("the TFLite converter cannot convert %s: %s"
                  % (name, str(e).splitlines()[0][:200]), file=sys.stderr)
        for b in batches:
            x = inputs_for(model, b)
            np.save(os.path.join(d, "x_b%d.npy" % b), x)
            np.save(os.path.join(d, "y_b%d.npy" % b), model(x, training=False).numpy())


def peer_runner(engine, d, x, threads):
    """A function computing the model in ``d`` on ``x`` with ``engine``."""
    if engine == "tf":
        tf, keras = _tf_env(threads)
        model = keras.models.load_model(os.path.join(d, "model.h5"), compile=False)
        fn = tf.function(lambda t: model(t, training=False))
        xt = tf.constant(x)
        return lambda: fn(xt).numpy()
    if engine == "ort":
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        s = ort.InferenceSession(os.path.join(d, "model.onnx"), opts,
                                 providers=["CPUExecutionProvider"])
        feed = {s.get_inputs()[0].name: x}
        return lambda: s.run(None, feed)[0]
    if engine == "openvino":
        import openvino as ov
        core = ov.Core()
        compiled = core.compile_model(ov.convert_model(os.path.join(d, "model.onnx")), "CPU", {
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        return lambda: request.infer({0: x})[compiled.output(0)]
    if engine == "litert":
        from ai_edge_litert.interpreter import Interpreter
        it = Interpreter(model_path=os.path.join(d, "model.tflite"), num_threads=threads)
        inp = it.get_input_details()[0]
        it.resize_tensor_input(inp["index"], list(x.shape))
        it.allocate_tensors()
        out = it.get_output_details()[0]["index"]

        def run():
            it.set_tensor(inp["index"], x)
            it.invoke()
            return it.get_tensor(out)
        return run
    raise ValueError("unknown engine %r" % (engine,))


def cyback_runner(d, x, threads):
    import cyback as K
    K.set_num_threads(threads)
    model = K.load_model(os.path.join(d, "model.h5"))
    f = K.function(model.inputs, model.outputs)
    return lambda: f([x])[0]


def engine_version(engine):
    module = {"cyback": "cyback", "tf": "tensorflow", "ort": "onnxruntime",
              "openvino": "openvino", "litert": "ai_edge_litert"}[engine]
    from importlib import metadata
    try:
        return metadata.version({"ai_edge_litert": "ai-edge-litert"}.get(module, module))
    except metadata.PackageNotFoundError:
        return "unknown"


def check(engine, work, model, batch, threads):
    """(the function to time, its result row): the engine's output is checked
    against TensorFlow's first; a model an engine cannot run gets a row that
    says why, and no function."""
    import numpy as np
    d = os.path.join(work, model)
    x = np.load(os.path.join(d, "x_b%d.npy" % batch))
    ref = np.load(os.path.join(d, "y_b%d.npy" % batch))
    row = {"engine": engine, "model": model, "batch": batch}
    try:
        fn = cyback_runner(d, x, threads) if engine == "cyback" else \
            peer_runner(engine, d, x, threads)
        err = float(np.max(np.abs(np.asarray(fn(), dtype=np.float64).reshape(ref.shape) - ref)))
    except Exception as e:       # a peer that cannot run this model: reported, not fatal
        row["skipped"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
        return None, row
    row["max_abs_err"] = err
    if not err <= TOLERANCE:
        row["skipped"] = "outputs differ from TF's by %.3g" % err
        return None, row
    return fn, row


class EngineServer:
    """An engine's worker: answers "time this model at this batch", keeping
    the model being measured loaded between the driver's rounds."""

    def __init__(self, engine, work, threads):
        self.engine, self.work, self.threads = engine, work, threads
        self.checked = {}

    def __call__(self, request):
        if request.get("what") == "version":
            head = {"version": engine_version(self.engine)}
            if self.engine == "cyback":
                from cyback.kernels.blas_threads import blas_info
                head["blas"] = blas_info()
            return head
        key = (request["model"], request["batch"])
        if key not in self.checked:
            # the driver goes model by model: the previous one can go
            self.checked = {k: v for k, v in self.checked.items() if k[0] == key[0]}
            self.checked[key] = check(self.engine, self.work, key[0], key[1], self.threads)
        fn, row = self.checked[key]
        return row if fn is None else dict(row, **time_calls(fn))


# ----------------------------------------------------------------- the driver (cyback's env)

def _spawn(python, args):
    out = subprocess.run([python, os.path.abspath(__file__)] + args, capture_output=True,
                         text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (" ".join(args), out.stderr[-3000:]))
    return out.stdout


def _load_time(tf_python, work, threads):
    d = os.path.join(work, "resnet50")
    code = ("import time, sys\n"
            "sys.path.insert(0, %r)\n"
            "import bench_applications as b\n" % HERE)
    tf_code = code + ("tf, keras = b._tf_env(%d)\n"
                      "t = time.perf_counter(); keras.models.load_model(%r, compile=False)\n"
                      "print(time.perf_counter() - t)\n" % (threads, os.path.join(d, "model.h5")))
    cy_code = ("import time, cyback as K\n"
               "import keras\n"
               "t = time.perf_counter(); K.load_model(%r)\n"
               "print(time.perf_counter() - t)\n" % os.path.join(d, "model.h5"))
    result = {"tf_keras_s": [], "cyback_s": []}
    for _ in range(3):
        for key, python, src in (("tf_keras_s", tf_python, tf_code),
                                 ("cyback_s", sys.executable, cy_code)):
            out = subprocess.run([python, "-c", src], capture_output=True, text=True,
                                 timeout=600, env=dict(os.environ, KERAS_BACKEND="cyback"))
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-2000:])
            result[key].append(float(out.stdout.strip().splitlines()[-1]))
    return result


def _machine(threads):
    """'<CPU model>, <n> CPUs' from /proc/cpuinfo where there is one."""
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s, %d CPUs" % (model or "unknown CPU", os.cpu_count() or 0)


def add_round_arguments(p):
    """The options of an interleaved run's rounds (this script's and
    bench_int8_models.py's): --wait-near and --settle."""
    p.add_argument("--wait-near", type=float, default=0.0, metavar="SECONDS",
                   help="before each round, wait up to this long for the two CPUs to be near "
                        "each other, and time a round again that began or ended with them far "
                        "apart (docs/performance.md, 'Where the two CPUs are')")
    p.add_argument("--settle", type=float, default=0.5, metavar="SECONDS",
                   help="pause before each engine's timing, so that the threads the engine "
                        "before left spinning (ONNX Runtime's, TensorFlow's) have gone idle")


def report_handoffs(runs, engines):
    """The run's handoff summary (_common.handoff_summary) from the rows of
    ``runs`` ({(model, batch, engine): [row per round]}), printing its note
    when some rounds ran with the CPUs far apart."""
    from _common import handoff_summary  # cyback's env only
    # one probe per round, carried by each engine's row of it
    handoff, warning = handoff_summary(
        [r.get("handoff_ns") for k, rs in runs.items() if k[2] == engines[0] for r in rs])
    if warning:
        print(warning)
    return handoff


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tf-python", help="a Python with tensorflow, tf_keras and the peers")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,8")
    p.add_argument("--engines", default="cyback," + ",".join(PEERS))
    p.add_argument("--rounds", type=int, default=2)
    add_round_arguments(p)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "cyback-apps"),
                   help="where the exported models are kept between runs")
    p.add_argument("--load-time", action="store_true")
    p.add_argument("--out", default="applications")
    p.add_argument("--role", choices=("driver", "export", "serve"), default="driver",
                   help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    models = args.models.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    if args.role == "export":
        export(args.work, models, batches, args.threads)
        return 0
    if args.role == "serve":
        serve(EngineServer(args.engine, args.work, args.threads))
        return 0
    if not args.tf_python:
        p.error("--tf-python is required: the peers and tf_keras live in another environment")
    engines = args.engines.split(",")
    os.makedirs(args.work, exist_ok=True)
    common = ["--work", args.work, "--threads", str(args.threads)]
    print("exporting %s with %s ..." % (", ".join(models), args.tf_python), file=sys.stderr)
    _spawn(args.tf_python, ["--role", "export", "--models", args.models,
                            "--batches", args.batches] + common)
    from _common import openblas_overrides, warn_openblas_overrides  # cyback's env only
    warn_openblas_overrides()
    workers = {e: Worker(e, [sys.executable if e == "cyback" else args.tf_python,
                             os.path.abspath(__file__), "--role", "serve", "--engine", e] + common)
               for e in engines}
    try:
        versions = {}
        for engine, w in workers.items():
            head = w.ask({"what": "version"})
            versions[engine] = head["version"]
            if "blas" in head:
                versions["cyback_blas"] = head["blas"]
        runs = time_interleaved(workers, models, batches, args.rounds, args.wait_near,
                                args.settle)
    finally:
        for w in workers.values():
            w.close()
    table = summarize(runs, models, batches, engines)
    print_table(table, engines)
    handoff = report_handoffs(runs, engines)
    result = {"threads": args.threads, "rounds": args.rounds, "load_average": os.getloadavg(),
              "handoff": handoff,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": _machine(args.threads), "versions": versions,
              "openblas_env": openblas_overrides(),
              "rows": [dict(r, key=list(k)) for k, rs in runs.items() for r in rs],
              "summary": table,
              "command": "python benchmarks/bench_applications.py " +
                         " ".join(argv or sys.argv[1:])}
    if args.load_time:
        result["load_time"] = _load_time(args.tf_python, args.work, args.threads)
        lt = result["load_time"]
        print("ResNet50 .h5 load: cyback %.2f s, tf_keras %.2f s (medians of 3)"
              % (sorted(lt["cyback_s"])[1], sorted(lt["tf_keras_s"])[1]))
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, args.out + ".json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", path)
    return 0


def time_interleaved(workers, models, batches, rounds, wait_near=0.0, settle=0.0):
    """{(model, batch, engine): [row per round]}: every engine timed on one
    model and batch before the next, in an order that rotates each round."""
    from _common import near_round  # cyback's env only
    runs = {}
    engines = list(workers)
    for i, (model, b) in enumerate((m, b) for m in models for b in batches):
        for r in range(rounds):
            rows, handoff = near_round(
                workers, rotated(engines, i + r), {"model": model, "batch": b}, settle,
                wait_near, lambda engine, row: "round %d %-18s b%-2d %-9s %s" % (
                    r + 1, model, b, engine,
                    row.get("skipped") or "%.3f ms" % (1e3 * row["median_s"])))
            for engine, row in rows:
                runs.setdefault((model, b, engine), []).append(dict(row, handoff_ns=handoff))
    return runs


def summarize(runs, models, batches, engines):
    """Per model and batch: each engine's median over rounds (ms), the best
    peer and cyback's ratio to it (peer time / cyback time)."""
    table = []
    for model in models:
        for b in batches:
            row = {"model": model, "batch": b}
            for engine in engines:
                times = [r["median_s"] for r in runs.get((model, b, engine), [])
                         if "median_s" in r]
                row[engine] = 1e3 * sorted(times)[len(times) // 2] if times else None
            peers = {e: row[e] for e in engines if e != "cyback" and row[e] is not None}
            if peers and row.get("cyback"):
                best = min(peers, key=peers.get)
                row["best_peer"] = best
                row["ratio_to_best"] = peers[best] / row["cyback"]
            table.append(row)
    for b in batches:
        ratios = [r["ratio_to_best"] for r in table if r["batch"] == b and "ratio_to_best" in r]
        if ratios:
            table.append({"model": "geomean", "batch": b, "ratio_to_best": math.exp(
                sum(math.log(v) for v in ratios) / len(ratios))})
    return table


def print_table(table, engines):
    head = ["model", "batch"] + [e + " ms" for e in engines] + ["best peer", "cyback/best"]
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in table:
        cells = [r["model"], str(r["batch"])]
        for e in engines:
            v = r.get(e)
            cells.append("-" if v is None else "%.3f" % v)
        cells.append(r.get("best_peer", ""))
        cells.append("%.2fx" % r["ratio_to_best"] if "ratio_to_best" in r else "-")
        print(" | ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
