"""Train a small Keras model on cyback, save it to HDF5, load it back, and
check that the reloaded model predicts exactly what the trained one does.

    python examples/train_save_reload.py

Needs multi-backend Keras 2.3.1 and h5py (pip install ".[keras]"). Keras picks
its backend at its first import: this script sets KERAS_BACKEND=cyback before
importing it (``python -m cyback set-default-backend`` makes cyback the
default for every program). Runs in a few seconds; its files go to a
temporary folder that is removed at the end.
"""
import os
import shutil
import sys
import tempfile

os.environ.setdefault("KERAS_BACKEND", "cyback")

import numpy as np  # noqa: E402


def make_data(rng, n):
    """Three Gaussian blobs in 4 dimensions, labelled by blob."""
    centres = rng.normal(0.0, 2.0, size=(3, 4))
    labels = rng.integers(0, 3, size=n)
    x = centres[labels] + rng.normal(0.0, 0.7, size=(n, 4))
    return x.astype("float32"), labels


def main():
    import keras

    import cyback
    if keras.backend.backend() != "cyback":
        sys.exit("Keras was imported with the %s backend; run with KERAS_BACKEND=cyback"
                 % keras.backend.backend())
    rng = np.random.default_rng(0)
    x, y = make_data(rng, 600)
    model = keras.models.Sequential([
        keras.layers.Dense(32, activation="relu", input_shape=(4,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    history = model.fit(x[:500], y[:500], epochs=15, batch_size=32, verbose=0)
    loss, accuracy = model.evaluate(x[500:], y[500:], verbose=0)
    print("trained: loss %.3f -> %.3f, held-out accuracy %.3f"
          % (history.history["loss"][0], history.history["loss"][-1], accuracy))

    folder = tempfile.mkdtemp(prefix="cyback-example-")
    try:
        path = os.path.join(folder, "blobs.h5")
        model.save(path)
        print("saved %s (%d bytes)" % (path, os.path.getsize(path)))
        expected = model.predict(x[500:])

        # Keras's own loader, and cyback's (which also reads tf.keras and Keras 3 files)
        for name, load in (("keras.models.load_model", keras.models.load_model),
                           ("cyback.load_model", cyback.load_model)):
            again = load(path)
            got = again.predict(x[500:])
            if not np.array_equal(got, expected):
                sys.exit("%s: the reloaded model predicts differently (max difference %g)"
                         % (name, np.abs(got - expected).max()))
            print("%s: the reloaded model's %d predictions are identical" % (name, len(got)))
    finally:
        shutil.rmtree(folder)
    if accuracy < 0.8:
        sys.exit("the model did not learn (accuracy %.3f)" % accuracy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
