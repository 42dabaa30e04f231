"""Bugs that Keras 2.3.1's own test suite (tests/keras_suite/run_keras_suite.py)
and real Keras programs found in cyback, each checked here through Keras's
public API so the project's quick test run keeps them fixed.
"""

import importlib.util

import pytest


def _missing(name):
    spec = importlib.util.find_spec(name)
    return spec is None or spec.origin is None  # tests/keras is no keras


if _missing('keras') or _missing('h5py'):
    pytest.skip('multi-backend keras and h5py are not installed',
                allow_module_level=True)

import numpy as np

import keras
from keras import backend as K
from keras import layers as L
from keras.models import Model, Sequential


# -- dropout inside recurrent layers --------------------------------------------

RNN_LAYERS = [L.SimpleRNN, L.GRU, L.LSTM]


def _train_and_test_outputs(model, x):
    f = K.function(model.inputs + [K.learning_phase()], model.outputs)
    return f([x, 1])[0], f([x, 0])[0]


@pytest.mark.parametrize('layer', RNN_LAYERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize('kwargs', [dict(dropout=0.5), dict(recurrent_dropout=0.5)],
                         ids=['dropout', 'recurrent_dropout'])
@pytest.mark.parametrize('unroll', [False, True])
def test_rnn_dropout_uses_the_learning_phase(layer, kwargs, unroll):
    inputs = L.Input((5, 3))
    model = Model(inputs, layer(4, unroll=unroll, **kwargs)(inputs))
    assert model.uses_learning_phase
    x = np.random.rand(6, 5, 3).astype('float32')
    train, test = _train_and_test_outputs(model, x)
    assert np.abs(train - test).max() > 1e-3
    np.testing.assert_allclose(test, model.predict(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('merge_mode', ['concat', 'sum', None])
def test_bidirectional_dropout_uses_the_learning_phase(merge_mode):
    inputs = L.Input((5, 3))
    outputs = L.Bidirectional(L.LSTM(4, dropout=0.5, recurrent_dropout=0.5),
                              merge_mode=merge_mode)(inputs)
    model = Model(inputs, outputs)
    assert model.uses_learning_phase
    f = K.function([inputs, K.learning_phase()],
                   outputs if isinstance(outputs, list) else [outputs])
    x = np.random.rand(6, 5, 3).astype('float32')
    for train, test in zip(f([x, 1]), f([x, 0])):
        assert np.abs(train - test).max() > 1e-3


@pytest.mark.parametrize('layer', RNN_LAYERS, ids=lambda c: c.__name__)
def test_fit_applies_rnn_dropout(layer):
    """With a learning rate of 0, train_on_batch reports the loss of the batch
    before its (null) update, in the training phase: with dropout that loss must
    differ from evaluate's; before the fix both ran in the test phase."""
    model = Sequential([layer(8, dropout=0.9, recurrent_dropout=0.9, input_shape=(6, 4)),
                        L.Dense(1)])
    model.compile(keras.optimizers.SGD(lr=0.0), 'mse')
    x = np.random.rand(16, 6, 4).astype('float32')
    y = np.random.rand(16, 1).astype('float32')
    train_loss = model.train_on_batch(x, y)
    test_loss = model.evaluate(x, y, batch_size=16, verbose=0)
    assert abs(train_loss - test_loss) > 1e-4 * max(1.0, abs(test_loss))
