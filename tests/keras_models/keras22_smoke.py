"""Smoke test of multi-backend Keras 2.2.x on cyback, run by .ci/run in a
separate interpreter (one process can hold only one Keras): a convnet and a
recurrent model train, Keras 2.2's default recurrent cells (implementation 1,
hard_sigmoid) run on the fused cell with the general loop's values and
gradients, a Lambda layer infers its output shape, and a saved model reloads
with equal predictions.

    PYTHONPATH=<folder with keras 2.2.x> python tests/keras_models/keras22_smoke.py 2.2.4
"""
import os
import sys
import tempfile

os.environ["KERAS_BACKEND"] = "cyback"
os.environ.setdefault("KERAS_HOME", tempfile.mkdtemp())

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers as L  # noqa: E402


def check_fused_cells(rng):
    import cyback as K
    from cyback.graph.function import topo_nodes
    from cyback.ops import scan_cells
    from cyback.ops.rnn_cell import FusedRecurrent

    x = rng.randn(3, 5, 3).astype("float32")
    x[0, 3:] = 0.0
    for kind, kw in (("LSTM", {}), ("GRU", {}), ("GRU", dict(reset_after=True)),
                     ("SimpleRNN", {})):
        fns, weights = [], None
        for fused in (True, False):
            scan_cells.ENABLED = fused
            try:
                inp = L.Input((5, 3))
                out = getattr(L, kind)(4, return_sequences=True, **kw)(L.Masking(0.0)(inp))
                model = keras.models.Model(inp, out)
            finally:
                scan_cells.ENABLED = True
            ops = [type(n.op) for n in topo_nodes([model.output])]
            assert (FusedRecurrent in ops) == fused, (kind, kw, fused)
            if weights is None:
                weights = model.get_weights()
            model.set_weights(weights)
            grads = K.gradients(K.sum(model.output ** 2), model.trainable_weights + [inp])
            fns.append(K.function([inp], [model.output] + grads))
        for a, b in zip(fns[0]([x]), fns[1]([x])):
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def main(expected_version):
    assert keras.__version__ == expected_version, keras.__version__
    # Seeded (Keras's initializers draw from np.random) and learnable: the
    # class is which third of the image is brightest.
    np.random.seed(0)
    rng = np.random.RandomState(0)
    x = rng.rand(64, 8, 8, 1).astype("float32")
    labels = rng.randint(0, 3, 64)
    for i, c in enumerate(labels):
        x[i, :, 3 * c:3 * c + 2] += 1.0
    y = keras.utils.to_categorical(labels, 3)
    conv = keras.Sequential([
        L.Conv2D(4, 3, activation="relu", input_shape=(8, 8, 1)), L.MaxPooling2D(),
        L.Flatten(), L.Dropout(0.2), L.Dense(3, activation="softmax")])
    conv.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    hist = conv.fit(x, y, epochs=8, verbose=0, validation_split=0.2).history["loss"]
    assert hist[-1] < hist[0], hist

    seq = keras.Sequential([L.LSTM(5, input_shape=(6, 3), return_sequences=True), L.GRU(4),
                            L.Dense(1)])
    seq.compile("rmsprop", "mse")
    xs = rng.rand(32, 6, 3)
    ys = xs.sum(axis=(1, 2), keepdims=False)[:, None] / 9.0
    hist = seq.fit(xs, ys, epochs=8, verbose=0).history["loss"]
    assert hist[-1] < hist[0], hist

    check_fused_cells(rng)

    lam = keras.Sequential([L.Lambda(lambda t: keras.backend.mean(t, axis=1), input_shape=(5, 3)),
                            L.Dense(2)])
    assert lam.layers[0].output_shape == (None, 3), lam.layers[0].output_shape

    path = os.path.join(tempfile.mkdtemp(), "model.h5")
    conv.save(path)
    again = keras.models.load_model(path)
    np.testing.assert_allclose(again.predict(x), conv.predict(x), rtol=1e-6, atol=1e-7)
    keras.backend.clear_session()
    print("keras %s on cyback: conv and recurrent models train, default cells fused, Lambda "
          "shapes inferred, save/load_model round trip OK"
          % keras.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
