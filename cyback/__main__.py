"""``python -m cyback``: cyback's command line.

Without a subcommand it prints the build report and trains a small network
with cyback's own API (placeholders, variables, gradients, a function with
updates), as ``python -m cyback demo`` does. ``python -m cyback --help`` lists
the subcommands: ``info``, ``demo``, ``bench``, ``settings``,
``set-default-backend``, ``inspect``, ``profile`` and ``predict``.
"""
import argparse
import os
import platform
import sys
import time

import numpy as np

from cyback.kernels import settings


def build_report():
    import cyback as K
    from cyback import config
    from cyback.kernels import memory, runtime
    from cyback.kernels.blas_threads import blas_info, get_blas_threads
    try:
        from cyback._build_info import BUILD_INFO
    except ImportError:
        BUILD_INFO = {}
    src = config.settings_sources()
    rows = [
        ("cyback", K.__version__),
        ("python / numpy", "%s / %s" % (platform.python_version(), np.__version__)),
        ("compiler", BUILD_INFO.get("compiler", "unknown")),
        ("compile flags", " ".join(BUILD_INFO.get("compile_args", []))),
        ("openmp", "enabled" if runtime.openmp_enabled() else "disabled (single-threaded)"),
        ("threads", "%d (CYBACK_NUM_THREADS=%s)" % (
            K.get_num_threads(), settings.raw("CYBACK_NUM_THREADS") or "unset")),
        ("blas", "%s (%d thread; cyback's parallelism is OpenMP)"
         % (blas_info(), get_blas_threads())),
        ("memory", "freed blocks kept for the next call (glibc mmap threshold %d MiB, trim "
         "threshold %d MiB; CYBACK_MALLOC=system for the defaults)"
         % (memory.MMAP_THRESHOLD >> 20, memory.TRIM_THRESHOLD >> 20)
         if memory.settings() == "kept" else "the C library's defaults"),
        ("floatx", "%s (%s)" % (K.floatx(), src["floatx"])),
        ("epsilon", "%g (%s)" % (K.epsilon(), src["epsilon"])),
        ("image_data_format", "%s (%s)" % (K.image_data_format(), src["image_data_format"])),
    ]
    rows.append(("keras backend", keras_backend_hint()))
    chosen = sorted(n for n, s in settings.SETTINGS.items()
                    if s.owner == settings.CYBACK and s.read != settings.BUILD
                    and s.read != settings.TESTS and settings.is_set(n))
    rows.append(("settings", ", ".join("%s=%s" % (n, settings.raw(n)) for n in chosen)
                 or "no CYBACK_* variable set (python -m cyback settings lists them)"))
    width = max(len(k) for k, _ in rows)
    print("cyback build report")
    for k, v in rows:
        print("  %-*s  %s" % (width, k, v))


def make_data(rng, n):
    """Two interleaved spirals: a problem a linear model cannot solve."""
    t = rng.uniform(0.25, 3.0, size=n) * np.pi
    label = rng.integers(0, 2, size=n)
    sign = np.where(label == 1, 1.0, -1.0)
    x = np.stack([sign * t * np.cos(t), sign * t * np.sin(t)], axis=1) / 6.0
    x += rng.normal(0, 0.03, size=x.shape)
    return x.astype("float32"), label.astype("float32")[:, None]


def train_demo(epochs=60, batch=64, hidden=64, lr=0.05, verbose=True):
    import cyback as K
    rng = np.random.default_rng(0)
    x_train, y_train = make_data(rng, 2048)
    x_test, y_test = make_data(rng, 512)

    x = K.placeholder(shape=(None, 2), name="x")
    y = K.placeholder(shape=(None, 1), name="y")

    def glorot(fan_in, fan_out):
        lim = np.sqrt(6.0 / (fan_in + fan_out))
        return K.variable(rng.uniform(-lim, lim, size=(fan_in, fan_out)))

    params = [glorot(2, hidden), K.zeros((hidden,)), glorot(hidden, hidden), K.zeros((hidden,)),
              glorot(hidden, 1), K.zeros((1,))]
    w1, b1, w2, b2, w3, b3 = params
    h = K.tanh(K.dot(x, w1) + b1)
    h = K.tanh(K.dot(h, w2) + b2)
    logits = K.dot(h, w3) + b3
    prob = K.sigmoid(logits)
    # Binary cross-entropy on logits, written out with the element-wise API.
    loss = K.mean(K.maximum(logits, 0.0) - logits * y + K.log(1.0 + K.exp(-K.abs(logits))))
    accuracy = K.mean(K.cast(K.equal(K.cast(K.greater(prob, 0.5), "float32"), y), "float32"))

    # Adam, as variables and updates.
    grads = K.gradients(loss, params)
    t = K.variable(0.0)
    updates = [K.update_add(t, 1.0)]
    t1 = t + 1.0
    step = lr * K.sqrt(1.0 - K.pow(0.999, t1)) / (1.0 - K.pow(0.9, t1))
    for p, g in zip(params, grads):
        m = K.zeros(K.int_shape(p))
        v = K.zeros(K.int_shape(p))
        m_t = 0.9 * m + 0.1 * g
        v_t = 0.999 * v + 0.001 * K.square(g)
        updates += [K.update(m, m_t), K.update(v, v_t),
                    K.update(p, p - step * m_t / (K.sqrt(v_t) + 1e-7))]
    train = K.function([x, y], [loss], updates=updates)
    evaluate = K.function([x, y], [loss, accuracy])
    predict = K.function([x], [prob])

    history = []
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        losses = [train([x_train[i], y_train[i]])[0]
                  for i in np.array_split(order, len(order) // batch)]
        history.append(float(np.mean(losses)))
        if verbose and (epoch % 10 == 0 or epoch == epochs - 1):
            test_loss, test_acc = evaluate([x_test, y_test])
            print("  epoch %3d  train loss %.4f  test loss %.4f  test accuracy %.3f"
                  % (epoch + 1, history[-1], test_loss, test_acc))
    test_loss, test_acc = evaluate([x_test, y_test])

    def median_time(fn, repeats):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    one = x_test[:1]
    big = np.repeat(x_test, 8, axis=0)
    lat = median_time(lambda: predict([one]), 2000)
    thr = len(big) / median_time(lambda: predict([big]), 50)
    if verbose:
        print("  inference: batch 1 median %.1f us/call; batch %d %.0f samples/s"
              % (lat * 1e6, len(big), thr))
    return history, float(test_acc), lat, thr


def keras_json_path(environ=None):
    """Where multi-backend Keras reads keras.json: $KERAS_HOME, else ~/.keras
    (/tmp/.keras when the home directory is not writable)."""
    from cyback.cli import keras_home
    return os.path.join(keras_home(environ), "keras.json")


def keras_backend_hint(environ=None):
    """Which backend ``import keras`` would load, and how to make it cyback.

    Keras writes keras.json with "backend": "tensorflow" the first time it is
    imported; afterwards a plain ``import keras`` wants TensorFlow."""
    import json
    if settings.is_set("KERAS_BACKEND", environ):
        name, source = settings.raw("KERAS_BACKEND", environ), "KERAS_BACKEND"
    else:
        path = keras_json_path(environ)
        try:
            with open(path) as f:
                name = json.load(f).get("backend", "tensorflow")
            source = path
        except (OSError, ValueError):
            name, source = "tensorflow", "Keras's default: no readable %s" % path
    if name == "cyback":
        return "cyback (%s)" % source
    return ('%s (%s); to use cyback: export KERAS_BACKEND=cyback, or set "backend": '
            '"cyback" in %s (python -m cyback set-default-backend does)'
            % (name, source, keras_json_path(environ)))


def demo(epochs=60):
    """The build report, then the spirals network trained; 0 when it learned."""
    build_report()
    print()
    print("training a 2-64-64-1 tanh network on two spirals with K.gradients + K.function(updates)")
    history, acc, _, _ = train_demo(epochs=epochs)
    ok = history[-1] < history[0] * 0.5 and acc > 0.9
    print("loss %.4f -> %.4f, test accuracy %.3f: %s"
          % (history[0], history[-1], acc, "OK" if ok else "NOT CONVERGED"))
    return 0 if ok else 1


def _positive(text):
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a positive integer, got %r" % text) from None
    if n < 1:
        raise argparse.ArgumentTypeError("expected a positive integer, got %r" % text)
    return n


def parser():
    import cyback
    p = argparse.ArgumentParser(
        prog="python -m cyback",
        description="cyback, a CPU backend for Keras. Without a command: the build report "
                    "and a short training run (the demo).",
        epilog="python -m cyback COMMAND --help describes a command.")
    p.add_argument("--version", action="version", version="cyback " + cyback.__version__)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("info", help="the build report: version, compiler, OpenMP, threads, BLAS, "
                                "memory, Keras settings",
                   description="Print the build report.")
    d = sub.add_parser("demo", help="the build report, then a small network trained with "
                                    "cyback's own API (the default command)",
                       description="Print the build report, then train a 2-64-64-1 network on "
                                   "two spirals; exit status 0 when it learned.")
    d.add_argument("--epochs", type=_positive, default=60, help="epochs (default 60)")
    sub.add_parser("bench", add_help=False,
                   help="benchmark cyback against the installed peers (the arguments go to "
                        "python -m cyback.bench; bench --help lists them)")
    st = sub.add_parser("settings", help="the environment variables cyback reads, as set now",
                        description="List cyback's settings with their values and defaults, "
                                    "or write the documentation's configuration page.")
    st.add_argument("--write-docs", metavar="PATH", nargs="?", const="docs/configuration.md",
                    help="write the configuration page (default docs/configuration.md)")
    st.add_argument("--check-docs", metavar="PATH", nargs="?", const="docs/configuration.md",
                    help="exit 1 if the configuration page is out of date")
    b = sub.add_parser("set-default-backend",
                       help="make cyback the backend a plain `import keras` loads (keras.json)",
                       description='Set "backend": "cyback" in keras.json, keeping its other '
                                   "keys; creates the file if it is missing.")
    b.add_argument("--keras-home", metavar="DIR",
                   help="the folder of keras.json (default $KERAS_HOME, else ~/.keras)")
    i = sub.add_parser("inspect", help="a model file's layers and parameters, and whether it "
                                       "runs on cyback",
                       description="Load a Keras model file (tf.keras 2.x, Keras 3, Keras "
                                   "2.2/2.3) with cyback.load_model and list its layers; exit "
                                   "status 1 naming every unsupported layer if it does not load.")
    i.add_argument("model", metavar="MODEL", help="a .h5 or .keras model file")
    i.add_argument("--unsafe", action="store_true",
                   help="load a file holding Python code (Lambda layers); only for files "
                        "you trust")
    pr = sub.add_parser("profile", help="where a model's prediction spends its time, step "
                                        "by step",
                        description="Load MODEL with cyback.load_model, compile its prediction "
                                    "and time each step of the plan a call runs (the median "
                                    "of --calls runs): the time per kind of step and the "
                                    "slowest steps.")
    pr.add_argument("model", metavar="MODEL", help="a .h5 or .keras model file")
    pr.add_argument("--input", metavar="INPUT.npy",
                    help="the input batch (.npy; .npz with one array per input); without it, "
                         "--batch rows of random values (zeros for integer inputs)")
    pr.add_argument("--batch", type=_positive, default=1, help="rows of random input "
                                                               "(default 1)")
    pr.add_argument("--calls", type=_positive, default=10, help="runs to take the median of "
                                                                "(default 10)")
    pr.add_argument("--top", type=_positive, default=15, help="slowest steps listed "
                                                              "(default 15)")
    pr.add_argument("--unsafe", action="store_true",
                    help="load a file holding Python code (Lambda layers); only for files "
                         "you trust")
    r = sub.add_parser("predict", help="run a model file on a .npy input",
                       description="Load MODEL with cyback.load_model and predict on the "
                                   "arrays in INPUT (.npy; .npz with one array per input for "
                                   "several inputs).")
    r.add_argument("model", metavar="MODEL", help="a .h5 or .keras model file")
    r.add_argument("input", metavar="INPUT.npy", help="the input batch")
    r.add_argument("-o", "--output", metavar="OUT.npy",
                   help="where to save the predictions (.npz for several outputs); without "
                        "it they are printed")
    r.add_argument("--batch-size", type=_positive, default=32, help="default 32")
    r.add_argument("--unsafe", action="store_true",
                   help="load a file holding Python code (Lambda layers); only for files "
                        "you trust")
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        # everything after "bench" is cyback.bench's, --help included
        from cyback.bench.__main__ import main as bench_main
        return bench_main(argv[1:])
    args = parser().parse_args(argv)
    from cyback import cli
    try:
        if args.command is None:
            return demo()
        if args.command == "demo":
            return demo(args.epochs)
        if args.command == "info":
            build_report()
            return 0
        if args.command == "settings":
            from cyback.kernels import settings as registry
            if args.write_docs:
                return registry.main(["-o", args.write_docs])
            if args.check_docs:
                return registry.main(["--check", "-o", args.check_docs])
            cli.print_settings()
            return 0
        if args.command == "set-default-backend":
            cli.set_default_backend(args.keras_home)
            return 0
        if args.command == "inspect":
            cli.inspect_model(args.model, unsafe=args.unsafe)
            return 0
        if args.command == "profile":
            cli.profile_model(args.model, args.input, args.batch, args.calls, args.top,
                              args.unsafe)
            return 0
        if args.command == "predict":
            cli.predict(args.model, args.input, args.output, args.batch_size, args.unsafe)
            return 0
    except cli.CommandError as e:
        print("python -m cyback %s: %s" % (args.command, e), file=sys.stderr)
        return 1
    raise AssertionError("unhandled command %r" % args.command)


if __name__ == "__main__":
    sys.exit(main())
