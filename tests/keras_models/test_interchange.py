"""Weights saved by TensorFlow (tf.keras, HDF5) load into Keras 2.3.1 on
cyback and give TensorFlow's predictions.

The fixtures were made by fixtures/make_fixtures.py; the same builders
(fixtures/architectures.py) build the models here.
"""

import os

import h5py
import keras
import numpy as np
import pytest

NAMES = ['dense', 'conv2d', 'conv1d', 'lstm', 'gru', 'simple_rnn',
         'batchnorm', 'embedding_lstm', 'separable', 'conv2d_transpose']

RTOL = 1e-5
ATOL = 1e-6


def _fixture(fixtures_dir, name):
    data = np.load(os.path.join(fixtures_dir, name + '.npz'))
    return (os.path.join(fixtures_dir, name + '.h5'), data['x'], data['y'])


def test_every_fixture_is_listed(fixtures_dir, architectures):
    assert sorted(NAMES) == sorted(architectures.BUILDERS)
    for name in NAMES:
        assert os.path.exists(os.path.join(fixtures_dir, name + '.h5'))
        assert os.path.exists(os.path.join(fixtures_dir, name + '.npz'))


@pytest.mark.parametrize('name', NAMES)
def test_load_tf_weights_and_predict(name, fixtures_dir, architectures):
    path, x, y_tf = _fixture(fixtures_dir, name)
    model = architectures.BUILDERS[name](keras)
    model.load_weights(path)
    y = model.predict(x, batch_size=len(x))
    assert y.shape == y_tf.shape
    np.testing.assert_allclose(y, y_tf, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize('name', NAMES)
def test_weights_match_the_file(name, fixtures_dir, architectures):
    """Every array in the file lands, unchanged, in the matching layer."""
    path, _, _ = _fixture(fixtures_dir, name)
    model = architectures.BUILDERS[name](keras)
    model.load_weights(path)
    with_weights = [layer for layer in model.layers if layer.weights]
    with h5py.File(path, 'r') as f:
        names = [n.decode('utf8') if isinstance(n, bytes) else n
                 for n in f.attrs['layer_names']]
        groups = [f[n] for n in names if len(f[n].attrs['weight_names'])]
        assert len(groups) == len(with_weights)
        for layer, group in zip(with_weights, groups):
            stored = [np.asarray(group[w]) for w in group.attrs['weight_names']]
            actual = layer.get_weights()
            assert len(stored) == len(actual), layer.name
            for s, a in zip(stored, actual):
                np.testing.assert_array_equal(a, s, err_msg=layer.name)


@pytest.mark.parametrize('name', ['dense', 'lstm'])
def test_load_by_name(name, fixtures_dir, architectures):
    """Layer names in the file are tf's ('dense', 'lstm_1', ...)."""
    path, x, y_tf = _fixture(fixtures_dir, name)
    model = architectures.BUILDERS[name](keras)
    with h5py.File(path, 'r') as f:
        names = [n.decode('utf8') if isinstance(n, bytes) else n
                 for n in f.attrs['layer_names']]
    assert len(names) == len(model.layers)
    for layer, stored_name in zip(model.layers, names):
        layer.name = stored_name
    model.load_weights(path, by_name=True)
    np.testing.assert_allclose(model.predict(x), y_tf, rtol=RTOL, atol=ATOL)


def test_keras_round_trip_of_tf_weights(tmp_path, fixtures_dir, architectures):
    """Loaded tf weights saved again by Keras 2.3.1 (h5py 3) load back."""
    path, x, y_tf = _fixture(fixtures_dir, 'conv2d')
    model = architectures.BUILDERS['conv2d'](keras)
    model.load_weights(path)
    out = str(tmp_path / 'again.h5')
    model.save_weights(out)
    other = architectures.BUILDERS['conv2d'](keras)
    other.load_weights(out)
    np.testing.assert_allclose(other.predict(x), y_tf, rtol=RTOL, atol=ATOL)
