"""cyback int8 against the int8 paths of ONNX Runtime, OpenVINO and LiteRT on published models.

The models are bench_applications.py's (MobileNetV2, ResNet50 and the text CNN
by default), built by tf_keras, saved as HDF5 and exported to ONNX and TFLite
by that script's own export step, the classifiers with their logits as output
(see export_int8 for why). Every engine quantizes after training with
the same calibration inputs (``calibration.npy``, 16 random inputs, in each
model's work folder):

- cyback: ``cyback.quantize(cyback.load_model(h5), calibration)`` (min-max,
  per-channel weights, uint8 activations), run through ``K.function``;
- ONNX Runtime: ``quantize_static`` on the tf2onnx model (after
  ``quant_pre_process``), QDQ format, per-channel QInt8 weights, QUInt8
  activations, min-max calibration;
- OpenVINO: ``nncf.quantize`` on the converted ONNX model with an
  ``nncf.Dataset`` of the calibration inputs (NNCF's default preset), run with
  the latency hint (and f32 for what stays floating point); left out with a
  message when nncf is not installed;
- LiteRT: ``TFLiteConverter`` full-integer (``TFLITE_BUILTINS_INT8``, float
  ops allowed only when a model cannot be converted without them, which the
  table says) with the calibration inputs as ``representative_dataset``; input
  and output stay float32 (int32 token ids for the text model), so every engine
  takes the same input; XNNPACK.

Accuracy, on 16 other random inputs: each engine's int8 output against its
own float32 output (cyback float32, the float ONNX model in ORT and OpenVINO,
the float .tflite) and against TensorFlow's, as the largest absolute
difference and that difference over the largest |reference|; top-1 agreement
on the classifiers. These figures do not depend on the machine's load.

Speed: every engine in a process of its own that stays open, asked in turn for
one model and batch (the order rotating from round to round, so the times a
ratio compares are seconds apart), the median per-call time; cyback
float32 is timed too. The table gives the best int8 peer, cyback int8's speed
relative to it (the peer's time over cyback's: above 1, cyback is faster) and
cyback's int8 speed-up over its own float32.

The peers live in another Python environment, never cyback's:

    python -m venv /opt/peers && /opt/peers/bin/pip install tensorflow-cpu tf-keras \\
        onnxruntime onnx openvino nncf ai-edge-litert tf2onnx
    python benchmarks/bench_int8_models.py --tf-python /opt/peers/bin/python \\
        [--models mobilenetv2,resnet50,text_cnn] [--batches 1,8] [--rounds 2] [--threads 2]

Writes benchmarks/results/int8_models.json.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_applications as apps  # noqa: E402  (no cyback import: usable in the peers' Python)
from _interleave import Worker, rotated, serve  # noqa: E402

ENGINES = ("cyback", "ort", "openvino", "litert")
MODELS = ("mobilenetv2", "resnet50", "text_cnn")
CALIBRATION_SEED = 2
EVALUATION_SEED = 3


# ----------------------------------------------------------------- quantizing the peers (TF env)

def _ort_int8(tf, model, d, q, calib):
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    source = os.path.join(d, "model.onnx")
    if not os.path.exists(source):
        raise RuntimeError("no float ONNX model (tf2onnx could not convert it)")
    note = None
    prepared = os.path.join(q, "prepared.onnx")
    try:
        # shape inference and graph fusions first, as ORT's quantization guide asks
        from onnxruntime.quantization.shape_inference import quant_pre_process
        # (ONNX's shape inference: the symbolic one is for transformers, and needs sympy)
        quant_pre_process(source, prepared, skip_symbolic_shape=True)
    except Exception as e:
        note = "without quant_pre_process (%s)" % str(e).splitlines()[0][:120]
        prepared = source
    name = onnx.load(prepared).graph.input[0].name

    class Reader(CalibrationDataReader):
        """The calibration inputs one at a time, until None."""

        def __init__(self):
            self._feeds = iter([{name: calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self._feeds, None)

    quantize_static(prepared, os.path.join(q, "model.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt8, calibrate_method=CalibrationMethod.MinMax)
    return note


def _openvino_int8(tf, model, d, q, calib):
    try:
        import nncf
    except ImportError:
        raise RuntimeError("nncf is not installed in the peers' Python (pip install nncf)")
    import openvino as ov
    source = os.path.join(d, "model.onnx")
    if not os.path.exists(source):
        raise RuntimeError("no float ONNX model (tf2onnx could not convert it)")
    data = nncf.Dataset([calib[i:i + 1] for i in range(len(calib))])
    quantized = nncf.quantize(ov.convert_model(source), data, subset_size=len(calib))
    ov.save_model(quantized, os.path.join(q, "openvino.xml"), compress_to_fp16=False)


def _litert_int8(tf, model, d, q, calib):
    def representative():
        for i in range(len(calib)):
            yield [calib[i:i + 1]]

    note = None
    try:
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = representative
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        # inference_input_type / inference_output_type stay float32 (their
        # default): the model quantizes its input and dequantizes its output
        flat = conv.convert()
    except Exception as e:
        note = "int8 with float fallback (%s)" % str(e).splitlines()[0][:120]
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = representative
        flat = conv.convert()
    with open(os.path.join(q, "model.tflite"), "wb") as f:
        f.write(flat)
    return note


PEER_QUANTIZERS = (("ort", _ort_int8), ("openvino", _openvino_int8), ("litert", _litert_int8))


def export_int8(work, models, batches, threads, calibration, evaluation):
    """Per model, in ``<work>/<model>/``: bench_applications' float files
    (classifiers with their logits as output), calibration.npy,
    evaluation.npy and TF's float output on it (evaluation_tf.npy); in
    ``int8/`` each peer's quantized model and status.json (per peer: "ok", a
    note, or why not)."""
    # Logits, not probabilities: with random weights the softmax over 1000
    # classes is nearly uniform (about 1/1000 each), and ORT and LiteRT
    # quantize the softmax output over [0, 1] (a step of about 1/256), which
    # rounds every probability to 0 and says nothing of the int8 layers.
    apps.export(work, models, batches, threads, classifier_activation=None)
    tf, keras = apps._tf_env(threads)
    import numpy as np
    for name in models:
        d = os.path.join(work, name)
        q = os.path.join(d, "int8")
        status_path = os.path.join(q, "status.json")
        want = {"calibration": calibration, "evaluation": evaluation}
        if os.path.exists(status_path):
            with open(status_path) as f:
                if json.load(f).get("inputs") == want:
                    continue
        os.makedirs(q, exist_ok=True)
        model = keras.models.load_model(os.path.join(d, "model.h5"), compile=False)
        calib = apps.inputs_for(model, calibration, seed=CALIBRATION_SEED)
        xeval = apps.inputs_for(model, evaluation, seed=EVALUATION_SEED)
        np.save(os.path.join(d, "calibration.npy"), calib)
        np.save(os.path.join(d, "evaluation.npy"), xeval)
        np.save(os.path.join(d, "evaluation_tf.npy"), model(xeval, training=False).numpy())
        status = {}
        for engine, quantizer in PEER_QUANTIZERS:
            try:
                status[engine] = quantizer(tf, model, d, q, calib) or "ok"
            except Exception as e:     # a peer that cannot quantize this model: no cell
                status[engine] = "skipped: %s: %s" % (type(e).__name__,
                                                      str(e).splitlines()[0][:200])
            print("%s %s int8: %s" % (name, engine, status[engine]), flush=True)
        with open(status_path, "w") as f:
            json.dump({"inputs": want, "peers": status}, f, indent=1)


# ----------------------------------------------------------------- running (either env)

def _openvino_int8_runner(q, x, threads):
    import openvino as ov
    core = ov.Core()
    compiled = core.compile_model(core.read_model(os.path.join(q, "openvino.xml")), "CPU", {
        "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    return lambda: request.infer({0: x})[compiled.output(0)]


def _cyback_makers(d, threads):
    os.environ.setdefault("KERAS_BACKEND", "cyback")
    import numpy as np

    import cyback as K
    K.set_num_threads(threads)
    model = K.load_model(os.path.join(d, "model.h5"))
    quantized = K.quantize(model, np.load(os.path.join(d, "calibration.npy")))
    functions = [K.function(m.inputs, m.outputs) for m in (model, quantized)]
    return [lambda x, f=f: (lambda: f([x])[0]) for f in functions]


class Unavailable(Exception):
    """A peer that could not quantize a model (the message says why)."""


def makers(engine, d, threads):
    """(float, int8): each a function of the input giving a function that
    computes the model on it with ``engine``."""
    if engine == "cyback":
        return _cyback_makers(d, threads)
    q = os.path.join(d, "int8")
    with open(os.path.join(q, "status.json")) as f:
        status = json.load(f)["peers"][engine]
    if status.startswith("skipped"):
        raise Unavailable(status[len("skipped: "):])

    def make_float(x):
        return apps.peer_runner(engine, d, x, threads)

    def make_int8(x):
        if engine == "openvino":
            return _openvino_int8_runner(q, x, threads)
        return apps.peer_runner(engine, q, x, threads)   # q/model.onnx, q/model.tflite
    return make_float, make_int8


def _errors(y, ref):
    import numpy as np
    y = np.asarray(y, dtype=np.float64).reshape(ref.shape)
    diff = float(np.max(np.abs(y - ref)))
    row = {"max_abs": diff, "rel": diff / max(float(np.max(np.abs(ref))), 1e-30)}
    if ref.ndim == 2 and ref.shape[1] > 1:
        row["top1"] = float(np.mean(y.argmax(1) == ref.argmax(1)))
    return row


def accuracy_row(engine, d, make_float, make_int8):
    import numpy as np
    xeval = np.load(os.path.join(d, "evaluation.npy"))
    ytf = np.load(os.path.join(d, "evaluation_tf.npy"))
    yf = np.asarray(make_float(xeval)(), dtype=np.float64).reshape(ytf.shape)
    yq = make_int8(xeval)()
    row = {"float_vs_tf": _errors(yf, ytf)["rel"]}
    for key, ref in (("vs_float", yf), ("vs_tf", ytf)):
        row.update({"int8_%s_%s" % (key, k): v for k, v in _errors(yq, ref).items()})
    return row


class EngineServer:
    """An engine's worker: answers "accuracy of this model" and "time this model
    at this batch", keeping the model being measured loaded between rounds."""

    def __init__(self, engine, work, threads):
        self.engine, self.work, self.threads = engine, work, threads
        self.model, self.made, self.timed = None, None, {}

    def _load(self, model):
        if model != self.model:     # the driver goes model by model: the previous one can go
            self.model, self.made, self.timed = model, None, {}
            try:
                self.made = makers(self.engine, os.path.join(self.work, model), self.threads)
            except Exception as e:      # reported, not fatal: the other models still run
                self.made = str(e) if isinstance(e, Unavailable) else "%s: %s" % (
                    type(e).__name__, str(e).splitlines()[0][:200])
        return self.made

    def __call__(self, request):
        if request["what"] == "version":
            return {"version": versions(self.engine)}
        model = request["model"]
        base = {"engine": self.engine, "model": model}
        made = self._load(model)
        if isinstance(made, str):
            return dict(base, kind=request["what"], skipped=made)
        if request["what"] == "accuracy":
            return dict(base, kind="accuracy",
                        **accuracy_row(self.engine, os.path.join(self.work, model), *made))
        return self._time(base, request["batch"], made)

    def _time(self, base, b, made):
        import numpy as np
        row = dict(base, kind="time", batch=b)
        if b not in self.timed:
            x = np.load(os.path.join(self.work, base["model"], "x_b%d.npy" % b))
            names = ("float32", "int8") if self.engine == "cyback" else ("int8",)
            fns = {}
            for precision, make in zip(("float32", "int8"), made):
                if precision not in names:
                    continue
                fn = make(x)
                y = np.asarray(fn())
                if y.shape[0] != b or not np.all(np.isfinite(y)):
                    fns = "%s output of shape %s, or not finite" % (precision, y.shape)
                    break
                fns[precision] = fn
            self.timed[b] = fns
        fns = self.timed[b]
        if isinstance(fns, str):
            return dict(row, skipped=fns)
        for precision, fn in fns.items():
            row[precision + "_s"] = apps.time_calls(fn)["median_s"]
        return row


def versions(engine):
    from importlib import metadata
    v = apps.engine_version(engine)
    if engine == "openvino":
        try:
            v += " + nncf " + metadata.version("nncf")
        except metadata.PackageNotFoundError:
            v += " (no nncf)"
    return v


# ----------------------------------------------------------------- the driver (cyback's env)

def _spawn(python, args):
    out = subprocess.run([python, os.path.abspath(__file__)] + args, capture_output=True,
                         text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (" ".join(args), out.stderr[-3000:]))
    return out.stdout


def run_interleaved(workers, models, batches, rounds, wait_near=0.0, settle=0.0):
    """Per model, every engine's accuracy (deterministic: once), then per
    batch and round every engine's times, in an order rotating each round."""
    from _common import near_round  # cyback's env only
    times, accuracy = {}, {}
    engines = list(workers)
    for i, model in enumerate(models):
        for engine in engines:
            accuracy[(model, engine)] = workers[engine].ask({"what": "accuracy", "model": model})
        for j, b in enumerate(batches):
            for r in range(rounds):
                rows, handoff = near_round(
                    workers, rotated(engines, i + j + r),
                    {"what": "time", "model": model, "batch": b}, settle, wait_near,
                    lambda engine, row: "round %d %-12s b%-2d %-9s %s" % (
                        r + 1, model, b, engine,
                        row.get("skipped") or "int8 %.3f ms" % (1e3 * row["int8_s"])))
                for engine, row in rows:
                    times.setdefault((model, b, engine), []).append(dict(row, handoff_ns=handoff))
    return times, accuracy


def summarize(times, models, batches, engines):
    """Per model and batch: medians over rounds (ms), the best int8 peer,
    cyback int8's speed relative to it and to cyback float32; geomeans per batch."""
    def median_ms(key, field):
        values = sorted(r[field] for r in times.get(key, []) if field in r)
        return 1e3 * values[len(values) // 2] if values else None
    table = []
    for model in models:
        for b in batches:
            row = {"model": model, "batch": b,
                   "cyback_float32": median_ms((model, b, "cyback"), "float32_s")}
            for engine in engines:
                row[engine] = median_ms((model, b, engine), "int8_s")
            peers = {e: row[e] for e in engines if e != "cyback" and row[e] is not None}
            if peers and row.get("cyback"):
                best = min(peers, key=peers.get)
                row["best_peer"] = best
                row["ratio_to_best"] = peers[best] / row["cyback"]
            if row.get("cyback") and row["cyback_float32"]:
                row["int8_speedup"] = row["cyback_float32"] / row["cyback"]
            table.append(row)
    for b in batches:
        summary = {"model": "geomean", "batch": b}
        for key in ("ratio_to_best", "int8_speedup"):
            values = [r[key] for r in table if r["batch"] == b and key in r]
            if values:
                summary[key] = math.exp(sum(math.log(v) for v in values) / len(values))
        table.append(summary)
    return table


def _markdown(head, rows):
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for cells in rows:
        print(" | ".join(cells))


def _fmt(v, pattern="%.3f"):
    return "-" if v is None else pattern % v


def print_tables(table, accuracy, engines, models):
    print("\nint8 accuracy on the evaluation inputs (rel = max |diff| / max |reference|)\n")
    head = ["model", "engine", "float vs TF rel", "int8 vs own float: max abs", "rel", "top-1",
            "int8 vs TF: max abs", "rel", "top-1"]
    rows = []
    for model in models:
        for engine in engines:
            a = accuracy.get((model, engine))
            if a is None:
                continue
            if "skipped" in a:
                rows.append([model, engine, a["skipped"]] + [""] * 6)
                continue
            rows.append([model, engine, "%.2g" % a["float_vs_tf"]] + [
                _fmt(a.get("int8_%s_%s" % (ref, k)), p)
                for ref in ("vs_float", "vs_tf")
                for k, p in (("max_abs", "%.3g"), ("rel", "%.3g"), ("top1", "%.2f"))])
    _markdown(head, rows)
    print("\nms per call (median over rounds)\n")
    head = ["model", "batch", "cyback f32"] + [e + " int8" for e in engines] + [
        "best int8 peer", "cyback int8 vs best", "cyback int8 vs f32"]
    rows = []
    for r in table:
        rows.append([r["model"], str(r["batch"]), _fmt(r.get("cyback_float32"))] +
                    [_fmt(r.get(e)) for e in engines] +
                    [r.get("best_peer", ""), _fmt(r.get("ratio_to_best"), "%.2fx"),
                     _fmt(r.get("int8_speedup"), "%.2fx")])
    _markdown(head, rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tf-python", help="a Python with tensorflow, tf_keras and the peers")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,8")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--rounds", type=int, default=2)
    apps.add_round_arguments(p)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calibration", type=int, default=16, help="calibration inputs")
    p.add_argument("--evaluation", type=int, default=16, help="inputs the errors are taken on")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "cyback-int8"),
                   help="where the exported and quantized models are kept between runs")
    p.add_argument("--out", default="int8_models")
    p.add_argument("--role", choices=("driver", "export", "serve"), default="driver",
                   help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    models = args.models.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    if args.role == "export":
        export_int8(args.work, models, batches, args.threads, args.calibration, args.evaluation)
        return 0
    if args.role == "serve":
        serve(EngineServer(args.engine, args.work, args.threads))
        return 0
    if not args.tf_python:
        p.error("--tf-python is required: the peers and tf_keras live in another environment")
    engines = args.engines.split(",")
    os.makedirs(args.work, exist_ok=True)
    common = ["--work", args.work, "--threads", str(args.threads), "--models", args.models,
              "--batches", args.batches]
    print("exporting %s with %s and quantizing for the peers ..."
          % (", ".join(models), args.tf_python), file=sys.stderr)
    out = _spawn(args.tf_python, ["--role", "export", "--calibration", str(args.calibration),
                                  "--evaluation", str(args.evaluation)] + common)
    for line in out.splitlines():
        if " int8: " in line:
            print("  " + line, file=sys.stderr)
    workers = {e: Worker(e, [sys.executable if e == "cyback" else args.tf_python,
                             os.path.abspath(__file__), "--role", "serve", "--engine", e] +
                         ["--work", args.work, "--threads", str(args.threads)])
               for e in engines}
    try:
        engine_versions = {e: w.ask({"what": "version"})["version"] for e, w in workers.items()}
        times, accuracy = run_interleaved(workers, models, batches, args.rounds,
                                          args.wait_near, args.settle)
    finally:
        for w in workers.values():
            w.close()
    table = summarize(times, models, batches, engines)
    print_tables(table, accuracy, engines, models)
    handoff = apps.report_handoffs(times, engines)
    peer_status = {}
    for model in models:
        path = os.path.join(args.work, model, "int8", "status.json")
        if os.path.exists(path):
            with open(path) as f:
                peer_status[model] = json.load(f)["peers"]
    result = {"threads": args.threads, "rounds": args.rounds, "load_average": os.getloadavg(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": apps._machine(args.threads), "versions": engine_versions,
              "calibration_inputs": args.calibration, "evaluation_inputs": args.evaluation,
              "peer_quantization": peer_status, "handoff": handoff,
              "accuracy": list(accuracy.values()),
              "rows": [r for rs in times.values() for r in rs], "summary": table,
              "command": "python benchmarks/bench_int8_models.py " +
                         " ".join(argv or sys.argv[1:])}
    os.makedirs(apps.RESULTS_DIR, exist_ok=True)
    path = os.path.join(apps.RESULTS_DIR, args.out + ".json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
