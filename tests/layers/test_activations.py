"""cyback.layers.activations against NumPy references, tf_keras / Keras 3 values,
finite-difference gradients, and their use by name in saved models."""
import math

import keras
import numpy as np
import pytest
from scipy.special import erf as np_erf

import cyback.layers
from cyback.layers import activations as A
from cyback.ops.elementwise import erf

from .helpers import fit_save_reload
from gradcheck import check_grads

K = keras.backend


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(0, x)


REFERENCES = {
    'gelu': lambda x: 0.5 * x * (1 + np_erf(x / math.sqrt(2))),
    'swish': lambda x: x * _sigmoid(x),
    'silu': lambda x: x * _sigmoid(x),
    'mish': lambda x: x * np.tanh(_softplus(x)),
    'relu6': lambda x: np.clip(x, 0, 6),
    'hard_swish': lambda x: x * np.clip(x + 3, 0, 6) / 6,
    'hard_silu': lambda x: x * np.clip(x + 3, 0, 6) / 6,
    'hard_sigmoid_keras3': lambda x: np.clip(x + 3, 0, 6) / 6,
    'leaky_relu': lambda x: np.where(x >= 0, x, 0.2 * x),
    'celu': lambda x: np.maximum(x, 0) + np.minimum(0, np.expm1(x)),
    'hard_tanh': lambda x: np.clip(x, -1, 1),
    'log_sigmoid': lambda x: -_softplus(-x),
    'log_softmax': lambda x: x - np.log(np.sum(np.exp(x), -1, keepdims=True)),
}

# Points away from every kink (0, +-1, +-3, 6), with both tails.
GRID = np.array([-7.3, -4.1, -2.6, -1.7, -0.55, -0.2, 0.15, 0.7, 1.3, 2.2, 4.4, 5.1, 7.9])


def _eval(fn, x, **kwargs):
    return K.eval(fn(K.constant(x, dtype='float64'), **kwargs))


@pytest.mark.parametrize('name', sorted(REFERENCES))
def test_matches_numpy_reference(name):
    x = GRID.reshape(1, -1)
    np.testing.assert_allclose(_eval(A.ACTIVATIONS[name], x), REFERENCES[name](x),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('name', sorted(REFERENCES))
def test_gradients(name, one_thread):
    check_grads(A.ACTIVATIONS[name], GRID.reshape(1, -1))


def test_gelu_approximate():
    x = GRID
    expected = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(_eval(A.gelu, x, approximate=True), expected, rtol=1e-12)
    check_grads(lambda t: A.gelu(t, approximate=True), x)
    # The tanh form is an approximation: close to the exact one, and not equal to it.
    exact = _eval(A.gelu, x)
    assert np.max(np.abs(exact - expected)) < 1e-3
    assert np.max(np.abs(exact - expected)) > 1e-6


def test_erf_op_and_gradient(one_thread):
    x = np.array([[-3.5, -1.2, -0.3, 0.0, 0.4, 1.1, 2.9]])
    np.testing.assert_allclose(K.eval(erf(K.constant(x, dtype='float64'))), np_erf(x),
                               rtol=1e-14)
    check_grads(erf, x)
    assert K.dtype(erf(K.constant(x, dtype='float32'))) == 'float32'


def test_leaky_relu_slopes():
    x = GRID
    np.testing.assert_allclose(_eval(A.leaky_relu, x, negative_slope=0.3),
                               np.where(x >= 0, x, 0.3 * x))
    np.testing.assert_allclose(_eval(A.leaky_relu, x, alpha=0.1), np.where(x >= 0, x, 0.1 * x))


def test_hard_sigmoid_meanings_differ():
    """Keras 2 / tf.keras 2.x clip(0.2x + 0.5) is Keras 2.3.1's own; the Keras 3 one
    (relu6(x + 3) / 6) comes under that name only with custom_objects(keras3=True)."""
    x = GRID
    keras2 = _eval(keras.activations.get('hard_sigmoid'), x)
    np.testing.assert_allclose(keras2, np.clip(0.2 * x + 0.5, 0, 1), rtol=1e-12)
    assert 'hard_sigmoid' not in cyback.layers.custom_objects()
    keras3_fn = cyback.layers.custom_objects(keras3=True)['hard_sigmoid']
    assert keras3_fn is A.hard_sigmoid_keras3
    np.testing.assert_allclose(_eval(keras3_fn, x), np.clip(x + 3, 0, 6) / 6, rtol=1e-12)


def test_against_tf_keras_and_keras3(reference):
    x = reference['activations/x'].astype('float64')
    ours = {
        'tf_keras': dict(A.ACTIVATIONS, hard_sigmoid=keras.activations.hard_sigmoid,
                         elu=keras.activations.elu, selu=keras.activations.selu,
                         softplus=keras.activations.softplus),
        'keras3': cyback.layers.custom_objects(keras3=True),
    }
    checked = 0
    for key, value in reference.items():
        parts = key.split('/')
        if parts[0] != 'activations' or len(parts) != 3:
            continue
        source, name = parts[1], parts[2]
        if name == 'gelu_approximate':
            got = _eval(A.gelu, x, approximate=True)
        else:
            got = _eval(ours[source][name], x)
        np.testing.assert_allclose(got, value, rtol=2e-6, atol=2e-6, err_msg=key)
        checked += 1
    assert checked >= 17


def test_activation_layer_and_dense_by_name_round_trip(tmp_path):
    # Names resolve through Keras's custom objects; the scope restores them after.
    with keras.utils.CustomObjectScope(cyback.layers.custom_objects()):
        inp = keras.layers.Input((5,))
        h = keras.layers.Dense(4, activation='swish')(inp)
        h = keras.layers.Activation('gelu')(h)
        h = keras.layers.Dense(3, activation='mish')(h)
        out = keras.layers.Activation('hard_swish')(h)
    assert 'gelu' not in keras.utils.get_custom_objects()
    model = keras.models.Model(inp, out)
    x = np.random.RandomState(0).randn(6, 5).astype('float32')
    loaded = fit_save_reload(model, x, np.zeros((6, 3), 'float32'), tmp_path)
    assert loaded.layers[2].get_config()['activation'] == 'gelu'
    assert loaded.layers[1].get_config()['activation'] == 'swish'


def test_custom_objects_is_a_fresh_dict_with_every_name():
    objects = cyback.layers.custom_objects()
    for name in ('gelu', 'swish', 'silu', 'mish', 'relu6', 'hard_swish', 'hard_silu',
                 'leaky_relu'):
        assert callable(objects[name])
    objects['gelu'] = None
    assert cyback.layers.custom_objects()['gelu'] is A.gelu


@pytest.mark.parametrize('call, error', [
    (lambda x: A.gelu(x, approximate='yes'), TypeError),
    (lambda x: A.leaky_relu(x, negative_slope=0.1, alpha=0.3), ValueError),
    (lambda x: A.leaky_relu(x, negative_slope='0.1'), TypeError),
    (lambda x: A.celu(x, alpha=0), ValueError),
])
def test_bad_arguments(call, error):
    with pytest.raises(error, match=r'gelu|leaky_relu|celu'):
        call(K.constant([1.0]))
