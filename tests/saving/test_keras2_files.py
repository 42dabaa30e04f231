"""Files Keras 2.3.1 itself writes (on cyback) still load, with their
training config, and Keras 2 Lambda layers fall under safe_mode too."""
import json
import os

import h5py
import keras
import numpy as np
import pytest

import cyback
import cyback.layers
from cyback.saving import UnsafeModelError, UnsupportedLayersError

L = keras.layers
FLAG = 'CYBACK_TEST_LAMBDA_RAN'


@pytest.fixture
def no_flag():
    saved = os.environ.pop(FLAG, None)
    yield
    os.environ.pop(FLAG, None)
    if saved is not None:
        os.environ[FLAG] = saved


def _functional():
    ids = L.Input((6,), dtype='int32')
    x = L.Embedding(12, 4, mask_zero=True)(ids)
    x = L.LSTM(5, return_sequences=True)(x)
    x = cyback.layers.custom_objects()['LayerNormalization']()(x)
    x = L.GlobalAveragePooling1D()(x)
    gelu = cyback.layers.custom_objects()['gelu']
    return keras.models.Model(ids, L.Dense(3, activation=gelu)(x))


def _sequential():
    return keras.models.Sequential([
        L.Conv2D(4, 3, input_shape=(8, 8, 2)), L.BatchNormalization(), L.Activation('relu'),
        L.Flatten(), L.Dense(2)])


def _data(model, rng):
    shape = (4,) + tuple(model.input_shape[1:])
    if model.input.dtype.startswith('int'):
        x = rng.integers(1, 12, size=shape).astype('int32')
        x[0, 3:] = 0
        return x
    return rng.standard_normal(shape).astype('float32')


@pytest.mark.parametrize('build', [_functional, _sequential])
def test_keras2_file_round_trip(tmp_path, build, rng):
    model = build()
    for w in model.weights:
        value = cyback.eval(w)
        cyback.set_value(w, value + 0.1 * rng.standard_normal(value.shape).astype(value.dtype))
    x = _data(model, rng)
    path = str(tmp_path / 'model.h5')
    model.save(path)
    loaded = cyback.load_model(path)
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-6, atol=1e-6)


def test_keras2_training_config_is_compiled(tmp_path, rng):
    model = _sequential()
    model.compile(keras.optimizers.Adam(learning_rate=0.003), 'mse', metrics=['mae'])
    x = _data(model, rng)
    y = rng.standard_normal((4, 2)).astype('float32')
    model.fit(x, y, epochs=1, verbose=0)
    path = str(tmp_path / 'compiled.h5')
    model.save(path)
    loaded = cyback.load_model(path, compile=True)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert loaded.optimizer.get_config()['learning_rate'] == pytest.approx(0.003)
    # Keras 2.3.1 also restores the optimizer's state.
    np.testing.assert_allclose(loaded.evaluate(x, y, verbose=0), model.evaluate(x, y, verbose=0),
                               rtol=1e-5)
    assert cyback.load_model(path).optimizer is None


def _lambda_model():
    inp = L.Input((3,))
    hidden = L.Dense(2)(inp)
    # The function's globals at load time are Keras's, so it names the flag
    # literally.
    out = L.Lambda(lambda t: (__import__('os').environ.__setitem__(
        'CYBACK_TEST_LAMBDA_RAN', '1'), t * 2.0)[1])(hidden)
    return keras.models.Model(inp, out)


def test_keras2_lambda_refused_and_not_run(tmp_path, no_flag):
    model = _lambda_model()
    os.environ.pop(FLAG, None)
    path = str(tmp_path / 'lambda.h5')
    model.save(path)
    with pytest.raises(UnsafeModelError, match='safe_mode=False'):
        cyback.load_model(path)
    assert FLAG not in os.environ


def test_keras2_lambda_runs_when_allowed(tmp_path, no_flag, rng):
    model = _lambda_model()
    os.environ.pop(FLAG, None)
    path = str(tmp_path / 'lambda.h5')
    model.save(path)
    loaded = cyback.load_model(path, safe_mode=False)
    assert os.environ.get(FLAG) == '1'
    x = rng.standard_normal((2, 3)).astype('float32')
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-6)


def test_keras2_weights_into_a_model_built_in_code(tmp_path, rng):
    model = _sequential()
    path = str(tmp_path / 'w.h5')
    model.save_weights(path)
    other = _sequential()
    cyback.saving.load_weights(other, path)
    x = _data(model, rng)
    np.testing.assert_array_equal(other.predict(x), model.predict(x))


def test_keras2_unknown_layers_listed_together(tmp_path):
    model = keras.models.Sequential([L.Dense(3, input_shape=(4,)), L.Dense(2), L.Dense(1)])
    path = str(tmp_path / 'k2.h5')
    model.save(path)
    with h5py.File(path, 'r+') as f:
        config = json.loads(f.attrs['model_config'])
        config['config']['layers'][0]['class_name'] = 'Fancy'
        config['config']['layers'][2]['class_name'] = 'Sparkle'
        f.attrs['model_config'] = json.dumps(config).encode('utf-8')
    with pytest.raises(UnsupportedLayersError) as info:
        cyback.load_model(path)
    assert [entry[0] for entry in info.value.layers] == ['Fancy', 'Sparkle']
