"""K.rnn: an LSTM (Keras LSTMCell equations, fused gates) forward and
forward+backward through K.function, the loop's per-step overhead, and the
same work in NumPy and PyTorch.

Run: python benchmarks/bench_rnn.py [--repeats N] [--threads N] [--batch 32 --steps 100 ...]
Prints median milliseconds and writes benchmarks/results/rnn.json. ``--threads``
fixes the BLAS (and torch) thread count for every implementation: on a busy
machine multi-threaded GEMMs wait for descheduled threads and the medians say
more about the load than about the code.
"""
import argparse
import os
import sys


def _early_threads():
    # BLAS reads its thread count when NumPy is first imported.
    if "--threads" in sys.argv:
        n = sys.argv[sys.argv.index("--threads") + 1]
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = n


_early_threads()

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cyback as K  # noqa: E402
from cyback.bench.timing import time_alternated  # noqa: E402
from cyback.ops import elementwise as ew  # noqa: E402
from cyback.ops import scan_cells  # noqa: E402

from _common import median_time, print_table, reference_blas, try_import_torch, write_json

sigmoid = getattr(K, "sigmoid", ew.sigmoid)
tanh = getattr(K, "tanh", ew.tanh)


def lstm_weights(n_in, units, seed=0):
    rs = np.random.RandomState(seed)
    return ((rs.randn(n_in, 4 * units) * 0.1).astype(np.float32),
            (rs.randn(units, 4 * units) * 0.1).astype(np.float32),
            np.zeros(4 * units, np.float32))


def cyback_lstm(w, r, b, batch, steps, n_in, units, unroll=False, with_grad=True, fused=True):
    """Forward and forward+backward functions of a Keras-style LSTM layer
    (implementation=2: one product of x with the (n_in, 4u) kernel, one of
    h with the (u, 4u) recurrent kernel per step). Once a gradient of the loop
    exists, its forward also records what the backward loop reads; a graph
    never differentiated (``with_grad=False``) records nothing. ``fused=False``
    keeps the general Scan instead of the fused LSTM cell."""
    W, R, B = K.variable(w), K.variable(r), K.variable(b)
    u = units

    def step(x, states):
        h, c = states
        z = K.dot(x, W) + K.dot(h, R) + B
        i = sigmoid(z[:, :u])
        f = sigmoid(z[:, u:2 * u])
        c = f * c + i * tanh(z[:, 2 * u:3 * u])
        o = sigmoid(z[:, 3 * u:])
        h = o * tanh(c)
        return h, [h, c]
    x = K.placeholder((None, steps, n_in))
    h0 = K.placeholder((None, units))
    scan_cells.ENABLED = fused
    try:
        last, outs, _ = K.rnn(step, x, [h0, h0], unroll=unroll)
    finally:
        scan_cells.ENABLED = True
    fwd = K.function([x, h0], [outs])
    if not with_grad:
        return fwd, None
    loss = K.sum(outs)
    grads = K.gradients(loss, [W, R, B, x])
    train = K.function([x, h0], [loss] + grads)
    return fwd, train


def numpy_lstm(x, w, r, b):
    """Forward in NumPy: the input projection as one product, then the loop."""
    bs, steps, _ = x.shape
    u = r.shape[0]
    xw = (x.reshape(-1, x.shape[2]) @ w).reshape(bs, steps, 4 * u) + b
    h = np.zeros((bs, u), np.float32)
    c = np.zeros((bs, u), np.float32)
    out = np.empty((bs, steps, u), np.float32)

    def sig(v):
        return 1 / (1 + np.exp(-v))
    for t in range(steps):
        z = xw[:, t] + h @ r
        i, f, o = sig(z[:, :u]), sig(z[:, u:2 * u]), sig(z[:, 3 * u:])
        c = f * c + i * np.tanh(z[:, 2 * u:3 * u])
        h = o * np.tanh(c)
        out[:, t] = h
    return out


def torch_lstm(torch, w, r, b, x):
    n_in, units = w.shape[0], r.shape[0]
    m = torch.nn.LSTM(n_in, units, batch_first=True)
    # Keras gate order i, f, c, o; torch i, f, g, o: the same.
    with torch.no_grad():
        m.weight_ih_l0.copy_(torch.from_numpy(w.T.copy()))
        m.weight_hh_l0.copy_(torch.from_numpy(r.T.copy()))
        m.bias_ih_l0.copy_(torch.from_numpy(b))
        m.bias_hh_l0.zero_()
    xt = torch.from_numpy(x)

    def fwd():
        with torch.no_grad():
            return m(xt)[0]

    def train():
        xg = xt.clone().requires_grad_(True)
        m.zero_grad()
        out = m(xg)[0]
        out.sum().backward()
    return fwd, train, m


def tiny_step_overhead(steps, repeats):
    """Microseconds per step of ``h = h + x_t`` on (1, 1): the loop's own cost."""
    x = K.placeholder((1, None, 1))
    h0 = K.placeholder((1, 1))

    def step(x_t, states):
        h = states[0] + x_t * states[0]
        return h, [h]
    _, outs, _ = K.rnn(step, x, [h0])
    f = K.function([x, h0], [outs])
    g = K.function([x, h0], K.gradients(K.sum(outs), [x, h0]))
    xv = np.full((1, steps, 1), 1e-4, np.float32)
    hv = np.ones((1, 1), np.float32)
    fwd = median_time(lambda: f([xv, hv]), repeats=repeats) / steps * 1e6
    bwd = median_time(lambda: g([xv, hv]), repeats=repeats) / steps * 1e6
    return fwd, bwd


def _keras():
    try:
        os.environ.setdefault("KERAS_BACKEND", "cyback")
        import keras
    except Exception:
        return None
    return keras if keras.backend.backend() == "cyback" else None


def keras_predict(repeats, torch):
    """Keras LSTM(128) on (50 steps, 32 features): predict at batch 1 and 32,
    fused cell against the general Scan, with torch's nn.LSTM for scale."""
    keras = _keras()
    if keras is None:
        return []
    rows = []
    models = {}
    for fused in (True, False):
        scan_cells.ENABLED = fused
        try:
            models[fused] = keras.models.Sequential([keras.layers.LSTM(128, input_shape=(50, 32))])
        finally:
            scan_cells.ENABLED = True
    models[False].set_weights(models[True].get_weights())
    for batch in (1, 32):
        xb = np.random.RandomState(2).randn(batch, 50, 32).astype(np.float32)
        outs = [models[f].predict_on_batch(xb) for f in (True, False)]
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5)
        for fused in (True, False):
            m = models[fused]
            rows.append(dict(impl="cyback keras LSTM " + ("fused" if fused else "general Scan"),
                             batch=batch, predict_ms=median_time(
                                 lambda: m.predict_on_batch(xb), repeats=repeats) * 1e3))
        if torch is not None:
            lstm = torch.nn.LSTM(32, 128, batch_first=True)
            xt = torch.from_numpy(xb)

            def run():
                with torch.no_grad():
                    return lstm(xt)[0][:, -1]
            rows.append(dict(impl="torch nn.LSTM", batch=batch,
                             predict_ms=median_time(run, repeats=repeats) * 1e3))
    return rows


def torch_gru_from_keras(torch, layer):
    """torch nn.GRU with a Keras GRU(reset_after=True)'s weights: the same
    cell (torch's gate order r, z, n against Keras's z, r, h)."""
    w, r, b = layer.get_weights()
    u = r.shape[0]
    m = torch.nn.GRU(w.shape[0], u, batch_first=True)

    def order(a):
        return np.concatenate([a[..., u:2 * u], a[..., :u], a[..., 2 * u:]], axis=-1)
    with torch.no_grad():
        m.weight_ih_l0.copy_(torch.from_numpy(order(w).T.copy()))
        m.weight_hh_l0.copy_(torch.from_numpy(order(r).T.copy()))
        m.bias_ih_l0.copy_(torch.from_numpy(order(b[0]).copy()))
        m.bias_hh_l0.copy_(torch.from_numpy(order(b[1]).copy()))
    return m


def keras_gru_rows(args, x, torch):
    """Keras GRU(units, return_sequences) on the same input as the LSTM rows:
    forward and training step (gradients of the summed outputs), fused cell
    against the general Scan, reset_after=True against torch's nn.GRU."""
    keras = _keras()
    if keras is None:
        return []
    rows, ref = [], None
    for reset_after in (True, False):
        fns = {}
        weights = None
        for fused in (True, False):
            scan_cells.ENABLED = fused
            try:
                inp = keras.layers.Input(x.shape[1:])
                layer = keras.layers.GRU(args.units, return_sequences=True,
                                         reset_after=reset_after)
                out = layer(inp)
            finally:
                scan_cells.ENABLED = True
            if weights is None:
                weights = layer.get_weights()
            layer.set_weights(weights)
            grads = K.gradients(K.sum(out), layer.trainable_weights + [inp])
            fns[fused] = (K.function([inp], [out]), K.function([inp], grads), layer)
        got = [fns[f][0]([x])[0] for f in (True, False)]
        np.testing.assert_allclose(got[0], got[1], rtol=1e-4, atol=1e-5)
        for fused in (True, False):
            f, g, _ = fns[fused]
            rows.append(dict(impl="cyback keras GRU%s %s" % (
                "(reset_after)" if reset_after else "", "fused" if fused else "general Scan"),
                forward_ms=median_time(lambda: f([x]), repeats=args.repeats) * 1e3,
                train_ms=median_time(lambda: g([x]), repeats=args.repeats) * 1e3))
        if reset_after and torch is not None:
            m = torch_gru_from_keras(torch, fns[True][2])
            xt = torch.from_numpy(x)
            with torch.no_grad():
                np.testing.assert_allclose(m(xt)[0].numpy(), got[0], rtol=1e-4, atol=1e-5)

            def t_fwd():
                with torch.no_grad():
                    return m(xt)[0]

            def t_train():
                xg = xt.clone().requires_grad_(True)
                m.zero_grad()
                m(xg)[0].sum().backward()
            ref = dict(impl="torch %s nn.GRU (%d threads)" % (torch.__version__,
                                                               torch.get_num_threads()),
                       forward_ms=median_time(t_fwd, repeats=args.repeats) * 1e3,
                       train_ms=median_time(t_train, repeats=args.repeats) * 1e3)
            rows.append(ref)
    if ref is not None:
        for row in rows:
            for col in ("forward", "train"):
                row[col + "_vs_torch"] = row[col + "_ms"] / ref[col + "_ms"]
    return rows


def small_batch_rows(repeats, torch):
    """Keras LSTM and GRU at batch 1 and 4, K.function: the default (units
    split over the threads where the team is worth waking,
    cyback/kernels/rnn_split.pxi) against row blocks only, with torch's
    nn.LSTM / nn.GRU on the same weights (a GRU with reset_after: torch has
    no other); outputs checked first, engines alternated."""
    keras = _keras()
    if keras is None:
        return []
    from cyback.kernels import rnn_cell as rc
    rows = []
    for cell, steps, units, batch in (("lstm", 50, 128, 1), ("lstm", 200, 128, 1),
                                      ("lstm", 50, 256, 1), ("lstm", 50, 256, 4),
                                      ("gru", 50, 256, 1), ("gru", 200, 128, 1),
                                      ("gru_reset_before", 50, 256, 1)):
        inp = keras.layers.Input((steps, 32))
        layer = (keras.layers.LSTM(units) if cell == "lstm"
                 else keras.layers.GRU(units, reset_after=cell == "gru"))
        f = K.function([inp], [layer(inp)])
        x = np.random.RandomState(3).randn(batch, steps, 32).astype(np.float32)

        def rows_only(f=f, x=x):
            saved = rc._TUNE["split_max_rows"]
            rc._TUNE["split_max_rows"] = 0
            try:
                return f([x])
            finally:
                rc._TUNE["split_max_rows"] = saved
        engines = {"default": lambda f=f, x=x: f([x]), "rows": rows_only}
        want = engines["default"]()[0]
        np.testing.assert_allclose(rows_only()[0], want, rtol=1e-4, atol=1e-5)
        if torch is not None and cell != "gru_reset_before":
            if cell == "lstm":
                w, r, b = layer.get_weights()
                t_fwd = torch_lstm(torch, w, r, b, x)[0]
                got = t_fwd()[:, -1].numpy()
            else:
                m, xt = torch_gru_from_keras(torch, layer), torch.from_numpy(x)

                def t_fwd(m=m, xt=xt):
                    with torch.no_grad():
                        return m(xt)[0]
                got = t_fwd()[:, -1].numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            engines["torch"] = t_fwd
        st = time_alternated(engines, blocks=repeats, block_seconds=0.1)
        us = {k: v["median_s"] * 1e6 for k, v in st.items()}
        name = {"lstm": "LSTM", "gru": "GRU", "gru_reset_before": "GRU(reset_after=False)"}[cell]
        row = dict(layer="%s %d units %d steps" % (name, units, steps), batch=batch,
                   default_us=us["default"], rows_us=us["rows"],
                   rows_over_default=us["rows"] / us["default"],
                   split=rc._split_threads(steps, batch, units, 4 if cell == "lstm" else 3, 4))
        if "torch" in us:
            row["torch_us"] = us["torch"]
            row["torch_over_default"] = us["torch"] / us["default"]
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--units", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-unroll", action="store_true", help="skip the unroll=True rows")
    args = ap.parse_args()
    bs, steps, n_in, u = args.batch, args.steps, args.inputs, args.units
    w, r, b = lstm_weights(n_in, u)
    x = np.random.RandomState(1).randn(bs, steps, n_in).astype(np.float32)
    h0 = np.zeros((bs, u), np.float32)
    rows = []
    infer, _ = cyback_lstm(w, r, b, bs, steps, n_in, u, with_grad=False)
    fwd, train = cyback_lstm(w, r, b, bs, steps, n_in, u)
    ref = numpy_lstm(x, w, r, b)
    np.testing.assert_allclose(infer([x, h0])[0], ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fwd([x, h0])[0], ref, rtol=1e-4, atol=1e-5)
    # cyback's graphs and torch's nn.LSTM are timed alternated in one run
    # (time_alternated): timed one after the other, a change in the machine's
    # load between them moved the cyback/torch ratio from 0.9x to 1.6x.
    engines = {"inference forward": lambda: infer([x, h0]),
               "training forward": lambda: fwd([x, h0]), "training train": lambda: train([x, h0])}
    fwd_g, train_g = cyback_lstm(w, r, b, bs, steps, n_in, u, fused=False)
    np.testing.assert_allclose(fwd_g([x, h0])[0], ref, rtol=1e-4, atol=1e-5)
    engines.update({"general forward": lambda: fwd_g([x, h0]),
                    "general train": lambda: train_g([x, h0])})
    if steps <= 200 and not args.no_unroll:
        fwd_u, train_u = cyback_lstm(w, r, b, bs, steps, n_in, u, unroll=True)
        engines.update({"unroll forward": lambda: fwd_u([x, h0]),
                        "unroll train": lambda: train_u([x, h0])})
    torch = try_import_torch()
    if torch is not None:
        if args.threads:
            torch.set_num_threads(args.threads)
        tf_, tt_, m = torch_lstm(torch, w, r, b, x)
        np.testing.assert_allclose(tf_().numpy(), ref, rtol=1e-4, atol=1e-5)
        engines.update({"torch forward": tf_, "torch train": tt_})
    ms = {k: v["median_s"] * 1e3 for k, v in time_alternated(
        engines, blocks=args.repeats, block_seconds=0.1).items()}
    rows.append(dict(impl="cyback K.rnn (inference graph)", forward_ms=ms["inference forward"]))
    rows.append(dict(impl="cyback K.rnn (training graph)", forward_ms=ms["training forward"],
                     train_ms=ms["training train"]))
    rows.append(dict(impl="cyback general Scan (not fused)", forward_ms=ms["general forward"],
                     train_ms=ms["general train"]))
    with reference_blas():
        rows.append(dict(impl="numpy loop", forward_ms=median_time(
            lambda: numpy_lstm(x, w, r, b), repeats=args.repeats) * 1e3))
    if "unroll forward" in ms:
        rows.append(dict(impl="cyback unroll=True", forward_ms=ms["unroll forward"],
                         train_ms=ms["unroll train"]))
    if torch is not None:
        rows.append(dict(impl="torch %s nn.LSTM (%d threads)" % (torch.__version__,
                                                                 torch.get_num_threads()),
                         forward_ms=ms["torch forward"], train_ms=ms["torch train"]))
    torch_row = rows[-1] if torch is not None else None
    if torch_row is not None:
        for row in rows:
            for col in ("forward", "train"):
                if row.get(col + "_ms") is not None:
                    row[col + "_vs_torch"] = row[col + "_ms"] / torch_row[col + "_ms"]
    title = "LSTM batch=%d steps=%d inputs=%d units=%d, float32 (median ms); load %s" % (
        bs, steps, n_in, u, " ".join(open("/proc/loadavg").read().split()[:3]))
    print_table(rows, ["impl", "forward_ms", "train_ms", "forward_vs_torch", "train_vs_torch"],
                title=title)
    gru_rows = keras_gru_rows(args, x, torch)
    if gru_rows:
        print()
        print_table(gru_rows, ["impl", "forward_ms", "train_ms", "forward_vs_torch",
                               "train_vs_torch"],
                    title="GRU batch=%d steps=%d inputs=%d units=%d, float32 (median ms)"
                    % (bs, steps, n_in, u))
    keras_rows = keras_predict(args.repeats, torch)
    if keras_rows:
        print()
        print_table(keras_rows, ["impl", "batch", "predict_ms"],
                    title="Keras LSTM(128) on (50, 32) inputs: model.predict_on_batch (median ms)")
    small_rows = small_batch_rows(args.repeats, torch)
    if small_rows:
        print()
        print_table(small_rows, ["layer", "batch", "default_us", "rows_us", "rows_over_default",
                                 "split", "torch_us", "torch_over_default"],
                    title="Small batches, K.function (median us): default against row blocks "
                          "only (rows_over_default > 1: the units split helps; split: threads "
                          "it would take now), torch for scale")
    fwd_us, bwd_us = tiny_step_overhead(1000, args.repeats)
    print("\nper-step overhead (h = h + x_t * h on (1, 1), 1000 steps): forward %.2f us, "
          "backward (fwd+bwd) %.2f us" % (fwd_us, bwd_us))
    path = write_json("rnn", rows, batch=bs, steps=steps, inputs=n_in, units=u,
                      threads=args.threads, keras_predict=keras_rows, gru=gru_rows,
                      small_batch=small_rows,
                      step_overhead_us=dict(forward=fwd_us, forward_backward=bwd_us))
    print("wrote", path)


if __name__ == "__main__":
    main()
