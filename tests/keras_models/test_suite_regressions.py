"""Bugs that Keras 2.3.1's own test suite (tests/keras_suite/run_keras_suite.py)
and real Keras programs found in cyback, each checked here through Keras's
public API so the project's quick test run keeps them fixed.
"""

import keras
import numpy as np
import pytest
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


# -- TimeDistributed with a fixed batch size ------------------------------------

def test_time_distributed_with_fixed_batch_size():
    """Keras runs the wrapped layer in a K.rnn step that reads a module global
    it never defines (NameError on cyback before the shim)."""
    inputs = L.Input(batch_shape=(3, 4, 5))
    outputs = L.TimeDistributed(L.Dense(2))(inputs)
    model = Model(inputs, outputs)
    x = np.random.rand(3, 4, 5).astype('float32')
    kernel, bias = model.layers[1].get_weights()
    np.testing.assert_allclose(model.predict(x, batch_size=3), x @ kernel + bias,
                               rtol=1e-5, atol=1e-6)


def test_time_distributed_dropout_uses_the_learning_phase():
    inputs = L.Input(batch_shape=(3, 4, 5))
    model = Model(inputs, L.TimeDistributed(L.Dropout(0.5))(inputs))
    assert model.uses_learning_phase
    x = np.ones((3, 4, 5), 'float32')
    train, test = _train_and_test_outputs(model, x)
    np.testing.assert_array_equal(test, x)
    assert set(np.unique(train)) <= {0.0, 2.0} and (train == 0).any()


# -- saving to open HDF5 files and binary streams (h5py 3) ----------------------

def _small_model():
    model = Sequential([L.Dense(3, input_shape=(4,), activation='relu'), L.Dense(2)])
    model.compile('adam', 'mse')
    model.train_on_batch(np.random.rand(8, 4), np.random.rand(8, 2))
    return model


def test_save_and_load_through_a_binary_stream():
    import io
    model = _small_model()
    stream = io.BytesIO()
    model.save(stream)
    stream.seek(0)
    loaded = keras.models.load_model(stream)
    x = np.random.rand(5, 4).astype('float32')
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-6)
    assert len(loaded.optimizer.get_weights()) == len(model.optimizer.get_weights())


@pytest.mark.parametrize('how', ['file', 'in_memory'])
def test_save_and_load_an_open_h5py_file(tmp_path, how):
    import h5py
    model = _small_model()
    x = np.random.rand(5, 4).astype('float32')
    if how == 'file':
        opened = h5py.File(str(tmp_path / 'm.h5'), 'w')
    else:
        opened = h5py.File('unused.h5', 'w', driver='core', backing_store=False)
    with opened as h5file:
        model.save(h5file)
        loaded = keras.models.load_model(h5file)
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-6)


def test_h5dict_strings_come_back_as_written(tmp_path):
    """h5py 3 stores bytes as ASCII and str as UTF-8 strings and reads both as
    str; Keras's H5Dict gives bytes back for bytes and str for str (which
    still has the .decode Keras calls on what h5py 2 gave as bytes)."""
    from keras.utils.io_utils import H5Dict
    path = str(tmp_path / 'd.h5')
    d = H5Dict(path, mode='w')
    d['text'] = 'abcd'
    d['raw'] = b'efg'
    d['names'] = ['x', 'yy']
    d.close()
    d = H5Dict(path, mode='r')
    assert d['text'] == 'abcd' and d['text'].decode('utf8') == 'abcd'
    assert d['raw'] == b'efg'
    assert [n.decode('utf8') for n in d['names']] == ['x', 'yy']
    d.close()


# -- NumPy 2 ---------------------------------------------------------------------

def test_pad_sequences_on_numpy_2():
    from keras.preprocessing.sequence import pad_sequences
    out = pad_sequences([[1, 2, 3], [4], [5, 6]], maxlen=4, padding='post', truncating='pre')
    np.testing.assert_array_equal(out, [[1, 2, 3, 0], [4, 0, 0, 0], [5, 6, 0, 0]])
    words = pad_sequences([['a', 'b'], ['c']], maxlen=3, dtype=object, value='<pad>')
    assert words.tolist() == [['<pad>', 'a', 'b'], ['<pad>', '<pad>', 'c']]


def test_shapes_and_summary_show_plain_ints():
    model = Sequential([L.Conv2D(2, 3, input_shape=(8, 8, 1)), L.Flatten(),
                        L.Reshape((-1, 4)), L.Dense(2)])
    assert model.layers[1].output_shape == (None, 72)
    assert all(type(d) is int for d in model.layers[1].output_shape[1:])
    assert all(type(d) is int for d in model.layers[2].output_shape[1:])
    lines = []
    model.summary(print_fn=lines.append)
    text = '\n'.join(lines)
    assert '(None, 72)' in text and '(None, 18, 4)' in text and 'np.' not in text
