"""Keras models on cyback pickle (pickle, cloudpickle) as an in-memory HDF5
save (Network.__reduce__ from cyback/_keras_compat.py): weights, optimizer
state and custom layers travel; the copy predicts identically."""
import pickle
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
from keras import layers

cloudpickle = pytest.importorskip("cloudpickle")


def _cnn():
    return keras.Sequential([
        layers.Conv2D(4, 3, activation="relu", input_shape=(8, 8, 2)),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(3, activation="softmax"),
    ])


def test_trained_model_round_trip(round_trip):
    model = _cnn()
    model.compile("adam", "categorical_crossentropy")
    rng = np.random.RandomState(0)
    x = rng.rand(6, 8, 8, 2).astype("float32")
    y = np.eye(3)[rng.randint(0, 3, 6)]
    model.fit(x, y, epochs=2, verbose=0)
    copy = round_trip(model)
    assert type(copy) is type(model) and copy is not model
    np.testing.assert_array_equal(copy.predict(x), model.predict(x))
    for a, b in zip(copy.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The optimizer state (step count, Adam's moments) travels.
    ours, theirs = model.optimizer.get_weights(), copy.optimizer.get_weights()
    assert len(ours) == len(theirs) > 1
    for a, b in zip(theirs, ours):
        np.testing.assert_array_equal(a, b)


def test_functional_multi_output_uncompiled(round_trip):
    inp = keras.Input((5,))
    h = layers.Dense(4, activation="tanh")(inp)
    model = keras.Model(inp, [layers.Dense(2)(h), layers.Dense(1, activation="sigmoid")(h)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # no "not compiled" warning for a model never compiled
        copy = round_trip(model)
    assert copy.optimizer is None
    x = np.random.RandomState(1).rand(3, 5).astype("float32")
    for a, b in zip(copy.predict(x), model.predict(x)):
        np.testing.assert_array_equal(a, b)


class Scale(layers.Layer):
    """A custom layer: its class travels with the pickle."""

    def build(self, input_shape):
        self.k = self.add_weight("k", (input_shape[-1],), initializer="ones")
        super().build(input_shape)

    def call(self, x):
        return x * self.k


def test_custom_layer(round_trip):
    model = keras.Sequential([layers.Dense(3, input_shape=(2,)), Scale()])
    model.layers[1].set_weights([np.array([1.0, 2.0, 3.0], "float32")])
    copy = round_trip(model)
    assert isinstance(copy.layers[1], Scale)
    x = np.ones((2, 2), "float32")
    np.testing.assert_array_equal(copy.predict(x), model.predict(x))


def _predict_in_a_fresh_process(tmp_path, data, x):
    """``pickle.loads(data).predict(x)`` in a process that has not imported
    Keras or cyback."""
    (tmp_path / "m.pkl").write_bytes(data)
    np.save(tmp_path / "x.npy", x)
    code = ("import os, pickle, sys, numpy as np\n"
            "os.environ.pop('KERAS_BACKEND', None)\n"
            "m = pickle.load(open(sys.argv[1], 'rb'))\n"
            "import keras\n"
            "assert keras.backend.backend() == 'cyback'\n"
            "np.save(sys.argv[3], m.predict(np.load(sys.argv[2])))\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.pkl"),
                    str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], check=True)
    return np.load(tmp_path / "y.npy")


def test_unpickles_in_a_fresh_process_without_keras_imported(tmp_path):
    model = _cnn()
    x = np.random.RandomState(2).rand(2, 8, 8, 2).astype("float32")
    np.testing.assert_array_equal(_predict_in_a_fresh_process(tmp_path, pickle.dumps(model), x),
                                  model.predict(x))


def test_pickles_naming_the_graph_layer_still_load(tmp_path, monkeypatch):
    # The model loader lived in cyback.graph.pickling before the graph layer
    # lost its Keras knowledge: pickles written then name it there.
    from cyback import _keras_compat
    model = _cnn()
    x = np.random.RandomState(3).rand(2, 8, 8, 2).astype("float32")
    monkeypatch.setattr(_keras_compat._load_pickled_keras_model, "__module__",
                        "cyback.graph.pickling")
    data = pickle.dumps(model)
    monkeypatch.undo()
    assert b"cyback.graph.pickling" in data and b"_keras_compat" not in data
    np.testing.assert_array_equal(_predict_in_a_fresh_process(tmp_path, data, x),
                                  model.predict(x))
