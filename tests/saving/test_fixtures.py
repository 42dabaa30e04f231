"""Every fixture model file loads with cyback.load_model and reproduces the
saving framework's outputs (fixtures/README.md)."""
import glob
import os

import keras
import numpy as np
import pytest

import cyback
from cyback.saving import UnsafeModelError

from .conftest import FIXTURES_DIR

TOLERANCE = 1e-4
FORMATS = ('tf_keras.h5', 'tf_keras.keras', 'keras3.keras', 'keras3.h5')


def _model_files():
    found = []
    for fmt in FORMATS:
        for path in sorted(glob.glob(os.path.join(FIXTURES_DIR, '*.' + fmt))):
            found.append(os.path.basename(path))
    return found


MODEL_FILES = _model_files()


def reference(filename):
    """The .npz of a model file: inputs and the framework's outputs."""
    name, framework = filename.split('.')[:2]
    data = np.load(os.path.join(FIXTURES_DIR, '%s.%s.npz' % (name, framework)))
    xs = [data['x%d' % i] for i in range(len(data.files)) if 'x%d' % i in data.files]
    ys = [data['y%d' % i] for i in range(len(data.files)) if 'y%d' % i in data.files]
    return data, xs, ys


def predict(model, xs):
    outputs = model.predict(xs if len(xs) > 1 else xs[0], batch_size=len(xs[0]))
    return outputs if isinstance(outputs, list) else [outputs]


def assert_outputs(model, xs, ys):
    got = predict(model, xs)
    assert len(got) == len(ys)
    for out, want in zip(got, ys):
        np.testing.assert_allclose(out, want, rtol=TOLERANCE, atol=TOLERANCE)


def test_every_model_and_format_is_present():
    names = {f.split('.')[0] for f in MODEL_FILES}
    assert names >= {'cnn_bn', 'embedding_bilstm', 'bigru_sequences', 'gru_timedistributed',
                     'mobilenet_v2', 'efficientnet_b0', 'transformer_block',
                     'attention_masks', 'two_in_two_out', 'nested', 'shared_layer',
                     'stateful_rnn', 'masking_lstm', 'tensor_ops', 'lambda_layer'}
    for name in names:
        for fmt in ('tf_keras.h5', 'keras3.keras', 'keras3.h5'):
            assert '%s.%s' % (name, fmt) in MODEL_FILES


@pytest.mark.parametrize('filename', [f for f in MODEL_FILES
                                      if not f.startswith(('lambda_layer', 'stateful_rnn'))])
def test_loads_and_matches(filename):
    model = cyback.load_model(os.path.join(FIXTURES_DIR, filename))
    data, xs, ys = reference(filename)
    assert isinstance(model, keras.models.Model)
    assert len(model.inputs) == len(xs)
    assert_outputs(model, xs, ys)


@pytest.mark.parametrize('filename', [f for f in MODEL_FILES if f.startswith('stateful_rnn')])
def test_stateful_rnn_carries_its_state(filename):
    model = cyback.load_model(os.path.join(FIXTURES_DIR, filename))
    data, xs, ys = reference(filename)
    assert_outputs(model, xs, ys)
    # The second call starts from the state the first left.
    assert_outputs(model, [data['x0_next']], [data['y0_next']])
    model.reset_states()
    assert_outputs(model, xs, ys)


@pytest.mark.parametrize('filename', [f for f in MODEL_FILES if f.startswith('lambda_layer')])
def test_lambda_refused_by_default(filename):
    path = os.path.join(FIXTURES_DIR, filename)
    with pytest.raises(UnsafeModelError) as info:
        cyback.load_model(path)
    message = str(info.value)
    assert 'safe_mode=False' in message
    assert "Lambda layer 'lambda'" in message
    assert path in message


@pytest.mark.parametrize('filename', [f for f in MODEL_FILES if f.startswith('lambda_layer')])
def test_lambda_loads_with_safe_mode_off(filename):
    model = cyback.load_model(os.path.join(FIXTURES_DIR, filename), safe_mode=False)
    data, xs, ys = reference(filename)
    assert_outputs(model, xs, ys)


@pytest.mark.parametrize('filename', ['embedding_bilstm.keras3.keras',
                                      'masking_lstm.keras3.keras', 'masking_lstm.keras3.h5'])
def test_masks_from_the_file_are_computed_by_keras(filename):
    # Keras 3 writes masks as operation nodes (NotEqual, Any) feeding mask=;
    # the loaded model has no such nodes: Keras 2.3.1 computes the mask from
    # Embedding(mask_zero) / Masking, and the next layer receives it.
    model = cyback.load_model(os.path.join(FIXTURES_DIR, filename))
    kinds = [type(layer).__name__ for layer in model.layers]
    assert 'TensorOp' not in kinds
    consumer = model.layers[2]
    assert consumer.input_mask is not None


def test_hard_sigmoid_follows_the_writer():
    # tf.keras 2.x: clip(0.2 x + 0.5); Keras 3: relu6(x + 3) / 6.
    tf_model = cyback.load_model(os.path.join(FIXTURES_DIR, 'tensor_ops.tf_keras.h5'))
    k3_model = cyback.load_model(os.path.join(FIXTURES_DIR, 'tensor_ops.keras3.keras'))
    assert tf_model.layers[-1].activation.__name__ == 'hard_sigmoid'
    assert k3_model.layers[-1].activation.__name__ == 'hard_sigmoid_keras3'


def test_layer_names_and_weights_come_from_the_file():
    import h5py
    path = os.path.join(FIXTURES_DIR, 'cnn_bn.tf_keras.h5')
    model = cyback.load_model(path)
    assert model.name == 'cnn_bn'
    assert model.layers[0].name == 'conv_a'
    with h5py.File(path, 'r') as f:
        kernel = f['model_weights/conv_a/conv_a/kernel:0'][()]
        mean = f['model_weights/batch_normalization/batch_normalization/moving_mean:0'][()]
    np.testing.assert_array_equal(cyback.eval(model.layers[0].kernel), kernel)
    bn = model.get_layer('batch_normalization')
    np.testing.assert_array_equal(cyback.eval(bn.moving_mean), mean)
