"""Keras paths that assign weights (load_weights, set_weights, fit) go
through batch_set_value or updates, so every assignment bumps the weights'
versions (the contract caches of values computed from weights rely on)."""

import keras
import numpy as np
from keras import layers as L


def _model():
    model = keras.models.Sequential([L.Dense(4, input_shape=(3,)), L.Dense(1)])
    model.compile('sgd', 'mse')
    return model


def _versions(model):
    return [w._version for w in model.weights]


def _all_bumped(before, after):
    return all(b > a for a, b in zip(before, after))


def test_load_weights_set_weights_and_fit_bump_every_version(tmp_path):
    model = _model()
    path = str(tmp_path / 'w.h5')
    model.save_weights(path)
    v0 = _versions(model)
    model.load_weights(path)
    v1 = _versions(model)
    assert _all_bumped(v0, v1)
    model.set_weights(model.get_weights())
    v2 = _versions(model)
    assert _all_bumped(v1, v2)
    model.train_on_batch(np.ones((2, 3), 'float32'), np.ones((2, 1), 'float32'))
    assert _all_bumped(v2, _versions(model))
    v3 = _versions(model)
    model.predict(np.ones((2, 3), 'float32'))
    assert _versions(model) == v3
