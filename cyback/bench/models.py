"""Model-level benchmark: seven Keras architectures on cyback against the peers.

Each model is built with Keras 2.x on cyback and given random weights and
non-trivial BatchNormalization statistics (a folding bug would show). The
peers get the same weights: PyTorch rebuilds each net as a module (eager, and
traced + frozen TorchScript), ONNX Runtime runs that module exported to ONNX,
and TensorFlow runs the same architecture built with tf_keras under
``tf.function``. Every peer is optional; each one's output is checked against
cyback's before its time counts.

Keras must already be importable with the cyback backend (KERAS_BACKEND=cyback).
"""
import io
import os
import time
import warnings

import numpy as np

from .timing import check_close, time_alternated

MODELS = ("mlp", "cnn", "resnet", "mobilenet", "lstm", "gru", "audio")
TITLES = {
    "mlp": "MLP 32-64-64-10",
    "cnn": "CNN 28x28x1 (2 conv3x3 + pool, dense)",
    "resnet": "3 ResNet basic blocks + BN, 32x32x16",
    "mobilenet": "3 MobileNet blocks (dw+BN+ReLU6, 1x1+BN+ReLU6)",
    "lstm": "LSTM(128) on (50, 32)",
    "gru": "GRU(128, reset_after) on (50, 32)",
    "audio": "Conv1D(16,12,/4)x2 + LSTM(36) audio",
}
INPUT_SHAPES = {"mlp": (32,), "cnn": (28, 28, 1), "resnet": (32, 32, 16),
                "mobilenet": (32, 32, 16), "lstm": (50, 32), "gru": (50, 32), "audio": (400, 1)}


# ------------------------------------------------------------------ Keras side
def build_keras(name, keras):
    """The model ``name`` built with the Keras module ``keras`` (Keras 2.x or tf_keras).

    Layer names are fixed so the peers can find each layer's weights.
    """
    L = keras.layers
    inp = L.Input(INPUT_SHAPES[name])
    if name == "mlp":
        x = L.Dense(64, activation="relu", name="d1")(inp)
        x = L.Dense(64, activation="relu", name="d2")(x)
        out = L.Dense(10, name="head")(x)
    elif name == "cnn":
        x = L.Conv2D(32, 3, activation="relu", name="c1")(inp)
        x = L.Conv2D(64, 3, activation="relu", name="c2")(x)
        x = L.MaxPooling2D(2)(x)
        out = L.Dense(10, name="head")(L.Flatten()(x))
    elif name == "resnet":
        x = inp
        for i in range(3):
            y = L.Conv2D(16, 3, padding="same", use_bias=False, name="r%da" % i)(x)
            y = L.Activation("relu")(L.BatchNormalization(name="r%da_bn" % i)(y))
            y = L.Conv2D(16, 3, padding="same", use_bias=False, name="r%db" % i)(y)
            y = L.BatchNormalization(name="r%db_bn" % i)(y)
            x = L.Activation("relu")(L.Add()([x, y]))
        out = L.Dense(10, name="head")(L.GlobalAveragePooling2D()(x))
    elif name == "mobilenet":
        x = inp
        for i in range(3):
            x = L.DepthwiseConv2D(3, padding="same", use_bias=False, name="m%dd" % i)(x)
            x = L.ReLU(6.0)(L.BatchNormalization(name="m%dd_bn" % i)(x))
            x = L.Conv2D(32, 1, use_bias=False, name="m%dp" % i)(x)
            x = L.ReLU(6.0)(L.BatchNormalization(name="m%dp_bn" % i)(x))
        out = L.Dense(10, name="head")(L.GlobalAveragePooling2D()(x))
    elif name == "lstm":
        x = L.LSTM(128, name="rnn")(inp)
        out = L.Dense(10, name="head")(x)
    elif name == "gru":
        # reset_after: the layout PyTorch, ONNX (linear_before_reset) and
        # tf.keras 2 (its default) compute, so every peer runs the same cell
        x = L.GRU(128, reset_after=True, name="rnn")(inp)
        out = L.Dense(10, name="head")(x)
    elif name == "audio":
        x = L.Conv1D(16, 12, strides=4, activation="relu", name="a1")(inp)
        x = L.Conv1D(16, 12, strides=4, activation="relu", name="a2")(x)
        x = L.LSTM(36, name="rnn")(x)
        out = L.Dense(10, name="head")(x)
    else:
        raise ValueError("build_keras: unknown model %r (expected one of %s)" % (name, MODELS))
    return keras.models.Model(inp, out)


def randomize(model, seed=0):
    """Random weights of unit-ish scale; BatchNorm gets random gamma/beta and
    moving statistics far from (0, 1), so folding them wrongly changes outputs."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        ws = layer.get_weights()
        if not ws:
            continue
        if type(layer).__name__ == "BatchNormalization":
            c = ws[0].shape
            ws = [rng.uniform(0.5, 1.5, c), rng.normal(0, 0.2, c),
                  rng.normal(0, 0.5, c), rng.uniform(0.5, 2.0, c)]
        else:
            new = []
            for w in ws:
                fan_in = int(np.prod(w.shape[:-1])) if w.ndim > 1 else 1
                scale = 1.0 / np.sqrt(fan_in) if w.ndim > 1 else 0.1
                new.append(rng.normal(0, scale, w.shape))
            ws = new
        layer.set_weights([w.astype(np.float32) for w in ws])


def keras_weights(model):
    """{layer name: [weights as float32 arrays]} for layers that have weights."""
    return {layer.name: [np.asarray(w, np.float32) for w in layer.get_weights()]
            for layer in model.layers if layer.get_weights()}


# ---------------------------------------------------------------- PyTorch side
def _channels_first(name):
    return name in ("cnn", "resnet", "mobilenet", "audio")


def to_peer_layout(name, x):
    """The input in PyTorch's layout (channels first for the conv nets)."""
    if not _channels_first(name):
        return np.ascontiguousarray(x)
    return np.ascontiguousarray(np.moveaxis(x, -1, 1))


def build_torch(name, weights, torch):
    """A torch.nn.Module computing model ``name`` with Keras's ``weights``."""
    nn = torch.nn
    T = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731

    def dense(lname):
        k, b = weights[lname]
        m = nn.Linear(*k.shape)
        m.weight.data, m.bias.data = T(k.T), T(b)
        return m

    def conv2d(lname, groups=1, padding=0):
        ws = weights[lname]
        k = ws[0]
        if groups == 1:
            w = k.transpose(3, 2, 0, 1)          # (kh, kw, in, out) -> (out, in, kh, kw)
        else:
            w = k.transpose(2, 3, 0, 1)          # (kh, kw, C, 1) -> (C, 1, kh, kw)
        m = nn.Conv2d(w.shape[1] * groups, w.shape[0], w.shape[2:], padding=padding,
                      groups=groups, bias=len(ws) > 1)
        m.weight.data = T(w)
        if len(ws) > 1:
            m.bias.data = T(ws[1])
        return m

    def conv1d(lname, stride):
        k, b = weights[lname]
        m = nn.Conv1d(k.shape[1], k.shape[2], k.shape[0], stride=stride)
        m.weight.data, m.bias.data = T(k.transpose(2, 1, 0)), T(b)
        return m

    def bn(lname):
        g, beta, mean, var = weights[lname]
        m = nn.BatchNorm2d(g.shape[0], eps=1e-3)
        m.weight.data, m.bias.data = T(g), T(beta)
        m.running_mean.data, m.running_var.data = T(mean), T(var)
        return m

    def lstm(lname):
        k, rk, b = weights[lname]
        m = nn.LSTM(k.shape[0], rk.shape[0], batch_first=True)
        # Keras and PyTorch share the gate order (input, forget, cell, output).
        m.weight_ih_l0.data, m.weight_hh_l0.data = T(k.T), T(rk.T)
        m.bias_ih_l0.data, m.bias_hh_l0.data = T(b), T(np.zeros_like(b))
        return m

    def gru(lname):
        k, rk, b = weights[lname]
        u = rk.shape[0]
        m = nn.GRU(k.shape[0], u, batch_first=True)

        def order(a):
            # Keras's gates z, r, h; PyTorch's r, z, n
            return np.concatenate([a[..., u:2 * u], a[..., :u], a[..., 2 * u:]], axis=-1)
        m.weight_ih_l0.data, m.weight_hh_l0.data = T(order(k).T), T(order(rk).T)
        m.bias_ih_l0.data, m.bias_hh_l0.data = T(order(b[0])), T(order(b[1]))
        return m

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            if name == "mlp":
                self.d1, self.d2, self.head = dense("d1"), dense("d2"), dense("head")
            elif name == "cnn":
                self.c1, self.c2 = conv2d("c1"), conv2d("c2")
                k, b = weights["head"]
                # Keras flattens (H, W, C); reorder the head's rows for (C, H, W).
                hw = int(round(np.sqrt(k.shape[0] / 64)))
                k = k.reshape(hw, hw, 64, -1).transpose(2, 0, 1, 3).reshape(k.shape)
                self.head = nn.Linear(*k.shape)
                self.head.weight.data, self.head.bias.data = T(k.T), T(b)
            elif name == "resnet":
                self.convs = nn.ModuleList(conv2d("r%d%s" % (i, s), padding=1)
                                           for i in range(3) for s in "ab")
                self.bns = nn.ModuleList(bn("r%d%s_bn" % (i, s)) for i in range(3) for s in "ab")
                self.head = dense("head")
            elif name == "mobilenet":
                self.dws = nn.ModuleList(conv2d("m%dd" % i, groups=weights["m%dd" % i][0].shape[2],
                                                padding=1) for i in range(3))
                self.dbns = nn.ModuleList(bn("m%dd_bn" % i) for i in range(3))
                self.pws = nn.ModuleList(conv2d("m%dp" % i) for i in range(3))
                self.pbns = nn.ModuleList(bn("m%dp_bn" % i) for i in range(3))
                self.head = dense("head")
            elif name == "lstm":
                self.rnn, self.head = lstm("rnn"), dense("head")
            elif name == "gru":
                self.rnn, self.head = gru("rnn"), dense("head")
            elif name == "audio":
                self.a1, self.a2 = conv1d("a1", 4), conv1d("a2", 4)
                self.rnn, self.head = lstm("rnn"), dense("head")

        def forward(self, x):
            F = torch.nn.functional
            if name == "mlp":
                return self.head(F.relu(self.d2(F.relu(self.d1(x)))))
            if name == "cnn":
                x = F.max_pool2d(F.relu(self.c2(F.relu(self.c1(x)))), 2)
                return self.head(torch.flatten(x, 1))
            if name == "resnet":
                for i in range(3):
                    y = F.relu(self.bns[2 * i](self.convs[2 * i](x)))
                    y = self.bns[2 * i + 1](self.convs[2 * i + 1](y))
                    x = F.relu(x + y)
                return self.head(x.mean(dim=(2, 3)))
            if name == "mobilenet":
                for i in range(3):
                    x = F.relu6(self.dbns[i](self.dws[i](x)))
                    x = F.relu6(self.pbns[i](self.pws[i](x)))
                return self.head(x.mean(dim=(2, 3)))
            if name in ("lstm", "gru"):
                return self.head(self.rnn(x)[0][:, -1])
            x = F.relu(self.a2(F.relu(self.a1(x))))
            return self.head(self.rnn(x.transpose(1, 2))[0][:, -1])

    return Net().eval()


def export_onnx(module, example, torch):
    """The module exported to ONNX (bytes) with a dynamic batch axis."""
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.from_numpy(example),), f, dynamo=False,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    return f.getvalue()


# ------------------------------------------------------------------- the peers
def load_peers(threads, wanted=("ort", "torch", "torch.jit", "tf")):
    """{peer: module(s)} for the peers that import, each set to ``threads`` threads."""
    peers = {}
    if any(p in wanted for p in ("ort", "torch", "torch.jit")):
        try:
            import torch
            torch.set_num_threads(threads)
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:
                pass
            peers["torch"] = torch
        except Exception:
            pass
    if "ort" in wanted and "torch" in peers:
        try:
            import onnxruntime
            peers["ort"] = onnxruntime
        except Exception:
            pass
    if "tf" in wanted:
        try:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
            import tensorflow as tf
            import tf_keras
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
            peers["tf"] = (tf, tf_keras)
        except Exception:
            pass
    return peers


def peer_versions(peers):
    v = {}
    if "torch" in peers:
        v["torch"] = peers["torch"].__version__
    if "ort" in peers:
        v["onnxruntime"] = peers["ort"].__version__
    if "tf" in peers:
        v["tensorflow"] = peers["tf"][0].__version__
        v["tf_keras"] = peers["tf"][1].__version__
    return v


def model_engines(name, batch, peers, seed=0, wanted=("ort", "torch", "torch.jit", "tf"),
                  cyback_paths=("K.function", "predict_on_batch", "unoptimized")):
    """Build model ``name`` on cyback and on every peer; returns (engines, errors, skipped).

    engines maps an engine name to a zero-argument callable; every peer's output
    has been checked against cyback's (``errors`` holds each peer's error).
    """
    import keras
    K = keras.backend
    model = build_keras(name, keras)
    randomize(model, seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((batch,) + INPUT_SHAPES[name]).astype(np.float32)
    f = K.function([model.input], [model.output])
    ref = f([x])[0]
    engines, errors, skipped = {}, {}, {}
    if "K.function" in cyback_paths:
        engines["cyback K.function"] = lambda: f([x])
    if "predict_on_batch" in cyback_paths:
        check_close("cyback predict_on_batch", model.predict_on_batch(x), ref, tol=1e-5)
        engines["cyback predict_on_batch"] = lambda: model.predict_on_batch(x)
    import cyback
    switch = getattr(cyback, "set_graph_optimizer", None)
    if "unoptimized" in cyback_paths and switch is not None:
        # the same K.function with the plan optimizer off (an A/B in the same run)
        def unoptimized():
            switch(False)
            try:
                return f([x])
            finally:
                switch(True)
        check_close("cyback unoptimized", unoptimized()[0], ref, tol=1e-4)
        engines["cyback unoptimized"] = unoptimized
    weights = keras_weights(model)
    xp = to_peer_layout(name, x)

    def add(peer, make):
        try:
            fn, out = make()
        except Exception as e:  # a peer that cannot run this model is reported, not fatal
            skipped[peer] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
            return
        errors[peer] = check_close(peer, out, ref)  # a wrong peer output is fatal
        engines[peer] = fn

    if "torch" in peers:
        torch = peers["torch"]
        module = build_torch(name, weights, torch)
        xt = torch.from_numpy(xp)

        if "torch" in wanted:
            def eager():
                def run():
                    with torch.inference_mode():
                        return module(xt)
                return run, run().numpy()
            add("torch", eager)
        if "torch.jit" in wanted:
            def jit():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with torch.no_grad():
                        traced = torch.jit.freeze(torch.jit.trace(module, (xt,)).eval())

                def run():
                    with torch.no_grad():
                        return traced(xt)
                return run, run().numpy()
            add("torch.jit", jit)
        if "ort" in peers and "ort" in wanted:
            ort = peers["ort"]

            def onnx():
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = torch.get_num_threads()
                opts.inter_op_num_threads = 1
                opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                sess = ort.InferenceSession(export_onnx(module, xp, torch), opts,
                                            providers=["CPUExecutionProvider"])
                feed = {"x": xp}
                run = lambda: sess.run(None, feed)  # noqa: E731
                return run, run()[0]
            add("ort", onnx)
    if "tf" in peers and "tf" in wanted:
        tf, tf_keras = peers["tf"]

        def tf_function():
            tmodel = build_keras(name, tf_keras)
            for layer in tmodel.layers:
                if layer.name in weights:
                    layer.set_weights(weights[layer.name])
            fn = tf.function(lambda t: tmodel(t, training=False))
            xtf = tf.constant(x)
            run = lambda: fn(xtf)  # noqa: E731
            return run, run().numpy()
        add("tf", tf_function)
    return engines, errors, skipped


def run_models(models=MODELS, batches=(1, 32), threads=2, quick=False, peers=None,
               wanted=("ort", "torch", "torch.jit", "tf"), progress=None, blocks=None):
    """Time every model at every batch size on cyback and the peers.

    Returns rows: one per (model, batch, engine) with median/p90 per call in µs,
    and the speed-up of cyback's K.function over that engine.
    """
    import cyback
    cyback.set_num_threads(threads)
    if peers is None:
        peers = load_peers(threads, wanted)
    blocks = blocks or (3 if quick else 9)
    # long enough blocks that a block is many calls, not the first call after
    # another engine ran (its threads going idle, caches cold)
    block_s = 0.005 if quick else 0.2
    rows = []
    for name in models:
        for batch in batches:
            t0 = time.perf_counter()
            engines, errors, skipped = model_engines(name, batch, peers, wanted=wanted)
            stats = time_alternated(engines, blocks=blocks, block_seconds=block_s,
                                    warmup_seconds=0.01 if quick else 0.1,
                                    keep_latencies=batch == 1)
            base = stats["cyback K.function"]["median_s"]
            for engine, s in stats.items():
                row = {"model": name, "title": TITLES[name], "batch": batch, "engine": engine,
                       "median_us": s["median_s"] * 1e6, "p90_us": s["p90_s"] * 1e6,
                       "calls_per_block": s["calls"], "blocks": s["blocks"],
                       "cyback_speedup": s["median_s"] / base,
                       "max_err": errors.get(engine)}
                if "latencies_s" in s:
                    row["latencies_us"] = [round(v * 1e6, 2) for v in s["latencies_s"][:2000]]
                rows.append(row)
            for engine, why in skipped.items():
                rows.append({"model": name, "title": TITLES[name], "batch": batch,
                             "engine": engine, "skipped": why})
            if progress is not None:
                progress("%s b%d" % (name, batch), time.perf_counter() - t0)
    return rows


def geomean(values):
    values = [v for v in values if v and v > 0]
    return float(np.exp(np.mean(np.log(values)))) if values else None


def summary(rows):
    """Geomean speed-up of cyback (K.function) over each peer per batch, and the
    MLP batch-1 K.function time."""
    out = {}
    peers = sorted({r["engine"] for r in rows if not r["engine"].startswith("cyback")
                    and "median_us" in r})
    for batch in sorted({r["batch"] for r in rows}):
        for peer in peers:
            g = geomean([r["cyback_speedup"] for r in rows
                         if r["engine"] == peer and r["batch"] == batch and "median_us" in r])
            if g is not None:
                out["geomean_vs_%s_b%d" % (peer, batch)] = g
    for r in rows:
        if r["model"] == "mlp" and r["batch"] == 1 and r["engine"] == "cyback K.function":
            out["mlp_b1_kfunction_us"] = r["median_us"]
    return out
