"""``python -m cyback``: the build report, then a small network trained with
cyback's own API (placeholders, variables, gradients, function with updates)."""
import os
import platform
import sys
import time

import numpy as np


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
        ("threads", "%d (CYBACK_NUM_THREADS=%s)" % (K.get_num_threads(),
                                                   os.environ.get("CYBACK_NUM_THREADS", "unset"))),
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
    environ = os.environ if environ is None else environ
    if environ.get("KERAS_HOME"):
        return os.path.join(environ["KERAS_HOME"], "keras.json")
    base = os.path.expanduser("~")
    if not os.access(base, os.W_OK):
        base = "/tmp"
    return os.path.join(base, ".keras", "keras.json")


def keras_backend_hint(environ=None):
    """Which backend ``import keras`` would load, and how to make it cyback.

    Keras writes keras.json with "backend": "tensorflow" the first time it is
    imported; afterwards a plain ``import keras`` wants TensorFlow."""
    import json
    environ = os.environ if environ is None else environ
    if environ.get("KERAS_BACKEND"):
        name, source = environ["KERAS_BACKEND"], "KERAS_BACKEND"
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
            '"cyback" in %s' % (name, source, keras_json_path(environ)))


def main(argv=None):
    build_report()
    print()
    print("training a 2-64-64-1 tanh network on two spirals with K.gradients + K.function(updates)")
    history, acc, _, _ = train_demo()
    ok = history[-1] < history[0] * 0.5 and acc > 0.9
    print("loss %.4f -> %.4f, test accuracy %.3f: %s"
          % (history[0], history[-1], acc, "OK" if ok else "NOT CONVERGED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
