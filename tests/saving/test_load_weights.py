"""cyback.saving.load_weights: weight files of tf_keras and Keras 3 into
models built in code with Keras 2.3.1."""
import os
import warnings

import keras
import numpy as np
import pytest

import cyback
from cyback.saving import ModelFileError, WeightMismatchError, load_weights

from .conftest import FIXTURES_DIR
from .test_fixtures import assert_outputs, reference

L = keras.layers


def cnn_bn(units=5, names=False):
    """fixtures' cnn_bn in Keras 2.3.1; names=True names every layer as the
    tf_keras file does."""
    def name(n):
        return {'name': n} if names else {}
    return keras.models.Sequential([
        L.Conv2D(6, 3, padding='same', name='conv_a', input_shape=(12, 12, 3)),
        L.BatchNormalization(**name('batch_normalization')),
        L.Activation('relu'),
        L.MaxPooling2D(2),
        L.Dropout(0.3),
        L.Conv2D(8, 3, strides=2, use_bias=False, **name('conv2d')),
        L.BatchNormalization(momentum=0.9, epsilon=1e-3, **name('batch_normalization_1')),
        L.ReLU(),
        L.Flatten(),
        L.Dense(units, activation='softmax', **name('dense')),
    ])


def embedding_bilstm():
    ids = L.Input((7,), dtype='int32')
    x = L.Embedding(20, 4, mask_zero=True)(ids)
    x = L.Bidirectional(L.LSTM(3))(x)
    return keras.models.Model(ids, L.Dense(2)(x))


WEIGHT_FILES = ['%s.%s' % (name, kind) for name in ('cnn_bn', 'embedding_bilstm')
                for kind in ('tf_keras.save_weights.h5', 'tf_keras.weights.h5',
                             'keras3.weights.h5', 'tf_keras.h5', 'keras3.h5',
                             'keras3.keras')]
BUILDERS = {'cnn_bn': cnn_bn, 'embedding_bilstm': embedding_bilstm}


@pytest.mark.parametrize('filename', WEIGHT_FILES)
def test_into_a_model_built_in_code(filename):
    name = filename.split('.')[0]
    model = BUILDERS[name]()
    assert load_weights(model, os.path.join(FIXTURES_DIR, filename)) is model
    framework = filename.split('.')[1]
    _, xs, ys = reference('%s.%s.npz' % (name, framework))
    assert_outputs(model, xs, ys)


def test_by_name_loads_only_the_named_layers():
    path = os.path.join(FIXTURES_DIR, 'cnn_bn.tf_keras.save_weights.h5')
    full = cnn_bn(names=True)
    load_weights(full, path, by_name=True)
    _, xs, ys = reference('cnn_bn.tf_keras.npz')
    assert_outputs(full, xs, ys)

    # A model that shares only its first layer with the file.
    partial = keras.models.Sequential([
        L.Conv2D(6, 3, padding='same', name='conv_a', input_shape=(12, 12, 3)),
        L.Conv2D(2, 1, name='not_in_file'),
    ])
    before = cyback.eval(partial.layers[1].kernel)
    load_weights(partial, path, by_name=True)
    np.testing.assert_array_equal(cyback.eval(partial.layers[0].kernel),
                                  cyback.eval(full.layers[0].kernel))
    np.testing.assert_array_equal(cyback.eval(partial.layers[1].kernel), before)


def test_shape_mismatch_names_the_layer_and_shapes():
    model = cnn_bn(units=4, names=True)
    path = os.path.join(FIXTURES_DIR, 'cnn_bn.tf_keras.save_weights.h5')
    with pytest.raises(WeightMismatchError) as info:
        load_weights(model, path)
    message = str(info.value)
    assert "layer 'dense'" in message
    assert '(32, 5)' in message and '(32, 4)' in message
    assert '(5,)' in message and '(4,)' in message
    assert path in message


def test_skip_mismatch_leaves_the_layer_and_loads_the_rest():
    model = cnn_bn(units=4, names=True)
    dense_before = cyback.eval(model.layers[-1].kernel)
    path = os.path.join(FIXTURES_DIR, 'cnn_bn.tf_keras.save_weights.h5')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        load_weights(model, path, skip_mismatch=True)
    assert any("'dense'" in str(w.message) for w in caught)
    np.testing.assert_array_equal(cyback.eval(model.layers[-1].kernel), dense_before)
    reference_model = cnn_bn(names=True)
    load_weights(reference_model, path)
    np.testing.assert_array_equal(cyback.eval(model.layers[0].kernel),
                                  cyback.eval(reference_model.layers[0].kernel))


@pytest.mark.parametrize('kind', ['tf_keras.save_weights.h5', 'keras3.weights.h5'])
def test_other_architecture_is_refused(kind):
    model = embedding_bilstm()
    with pytest.raises((WeightMismatchError, ModelFileError)) as info:
        load_weights(model, os.path.join(FIXTURES_DIR, 'cnn_bn.' + kind))
    assert 'cnn_bn.' + kind in str(info.value)


def test_wrong_layer_count_by_position():
    model = keras.models.Sequential([L.Dense(3, input_shape=(4,))])
    with pytest.raises(ModelFileError, match='weights for 5 layers, the model has 1'):
        load_weights(model, os.path.join(FIXTURES_DIR, 'cnn_bn.tf_keras.save_weights.h5'))


def test_keras3_weights_go_by_class_and_position():
    # Keras 3 addresses layers as layers/<class>_<n>: a model whose Dense
    # layers come in another order gets the shapes checked, not silently
    # wrong weights.
    model = keras.models.Sequential([
        L.Conv2D(6, 3, padding='same', input_shape=(12, 12, 3)),
        L.BatchNormalization(),
        L.Conv2D(8, 3, strides=2, padding='same', use_bias=False),
        L.BatchNormalization(),
        L.Flatten(),
        L.Dense(5),
    ])
    with pytest.raises(WeightMismatchError, match="dense"):
        load_weights(model, os.path.join(FIXTURES_DIR, 'cnn_bn.keras3.weights.h5'))


def test_weights_stay_untouched_when_loading_fails():
    model = cnn_bn(units=4, names=True)
    before = [cyback.eval(w) for w in model.weights]
    with pytest.raises(WeightMismatchError):
        load_weights(model, os.path.join(FIXTURES_DIR, 'cnn_bn.tf_keras.save_weights.h5'))
    for w, value in zip(model.weights, before):
        np.testing.assert_array_equal(cyback.eval(w), value)
