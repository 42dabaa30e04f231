"""The loader's parts on their own: naming rules, the code finder, the
tensor-operation layer, the compile translation."""
import os

import keras
import numpy as np
import pytest

import cyback
from cyback.saving import compile_config, safety, weights
from cyback.saving.op_layers import OPS, TensorOp

from .conftest import FIXTURES_DIR
from .test_fixtures import reference


@pytest.mark.parametrize('name, snake', [
    ('Conv2D', 'conv2d'), ('BatchNormalization', 'batch_normalization'), ('ReLU', 're_lu'),
    ('GlobalAveragePooling2D', 'global_average_pooling2d'), ('LSTM', 'lstm'),
    ('MultiHeadAttention', 'multi_head_attention'), ('Conv2DTranspose', 'conv2d_transpose'),
    ('InputLayer', 'input_layer'), ('DepthwiseConv2D', 'depthwise_conv2d'),
    ('UpSampling2D', 'up_sampling2d'), ('TFOpLambda', 'tf_op_lambda'), ('PReLU', 'p_re_lu'),
    ('Functional', 'functional'), ('EinsumDense', 'einsum_dense')])
def test_snake_case_is_keras3s(name, snake):
    assert weights.snake_case(name) == snake


@pytest.mark.parametrize('parts, key', [
    (['kernel:0'], ('kernel',)),
    (['forward_lstm', 'lstm_cell', 'kernel:0'], ('forward', 'kernel')),
    (['backward_lstm_1', 'recurrent_kernel'], ('backward', 'recurrent_kernel')),
    (['query', 'bias:0'], ('query', 'bias')),
    (['attention_output_2', 'kernel'], ('attention_output', 'kernel')),
    (['dense', 'kernel'], ('kernel',)),
    (['gru_cell', 'bias:0'], ('bias',)),
])
def test_canonical_keys(parts, key):
    assert weights.canonical_key(parts) == key


def test_depthwise_kernel_alias():
    assert weights.canonical_key(['kernel'], {'kernel': 'depthwise_kernel'}) == (
        'depthwise_kernel',)


def test_find_code_in_every_form():
    config = {'class_name': 'Functional', 'config': {'layers': [
        {'class_name': 'Lambda', 'name': 'k2',
         'config': {'name': 'k2', 'function': ['YQ==', None, None], 'function_type': 'lambda',
                    'output_shape': ['Yg==', None, None], 'output_shape_type': 'lambda'}},
        {'class_name': 'Lambda', 'name': 'k3',
         'config': {'name': 'k3', 'function': {'class_name': '__lambda__',
                                               'config': {'code': 'YQ=='}}}},
        {'class_name': 'Dense', 'name': 'act',
         'config': {'name': 'act', 'activation': {'class_name': '__lambda__',
                                                  'config': {'code': 'YQ=='}}}},
        {'class_name': 'Lambda', 'name': 'named',
         'config': {'name': 'named', 'function': 'my_function', 'function_type': 'function',
                    'output_shape_type': 'raw'}},
        {'class_name': 'TFOpLambda', 'name': 'op',
         'config': {'name': 'op', 'function': 'math.add'}},
    ]}}
    findings = safety.find_code(config)
    assert len(findings) == 4
    assert any("'k2': its function" in f for f in findings)
    assert any("'k2': its output_shape" in f for f in findings)
    assert any("'k3': its function" in f for f in findings)
    assert any("Dense 'act'" in f and '__lambda__' in f for f in findings)
    assert not any('named' in f or "'op'" in f for f in findings)
    assert safety.find_code({'class_name': 'Sequential', 'config': []}) == []


def test_find_code_in_training_config():
    findings = safety.find_code({'class_name': 'Sequential', 'config': []},
                                {'loss': {'class_name': '__lambda__', 'config': {}}})
    assert findings and 'training config' in findings[0]


# -- TensorOp ---------------------------------------------------------------------

_NUMPY = {
    'add': np.add, 'subtract': np.subtract, 'multiply': np.multiply, 'divide': np.divide,
    'maximum': np.maximum, 'minimum': np.minimum, 'not_equal': np.not_equal,
    'equal': np.equal, 'negative': np.negative, 'sqrt': np.sqrt, 'square': np.square,
    'abs': np.abs, 'exp': np.exp, 'log': np.log, 'sigmoid': lambda a: 1 / (1 + np.exp(-a)),
    'tanh': np.tanh, 'relu': lambda a: np.maximum(a, 0),
    'relu6': lambda a: np.clip(a, 0, 6), 'mean': np.mean, 'sum': np.sum, 'max': np.max,
    'min': np.min, 'any': np.any, 'all': np.all,
}


def _run(layer, arrays):
    tensors = [keras.layers.Input(batch_shape=a.shape, dtype=str(a.dtype)) for a in arrays]
    out = layer(tensors[0] if len(tensors) == 1 else tensors)
    assert tuple(out._keras_shape) == tuple(cyback.int_shape(out))
    return cyback.function(tensors, [out])(arrays)[0]


@pytest.mark.parametrize('op', sorted(OPS))
def test_tensor_op_against_numpy(op, rng):
    kind = OPS[op][0]
    a = rng.uniform(0.5, 2.0, size=(2, 3, 5)).astype('float32')
    b = rng.uniform(0.5, 2.0, size=(1, 3, 1)).astype('float32')
    if op in ('any', 'all'):
        a = a > 1.0
    if kind == 'binary':
        both = _run(TensorOp(op, [{'input': 0}, {'input': 1}]), [a, b])
        np.testing.assert_allclose(both, _NUMPY[op](a, b), rtol=1e-6)
        right = _run(TensorOp(op, [{'input': 0}, {'constant': 1.5}]), [a])
        np.testing.assert_allclose(right, _NUMPY[op](a, np.float32(1.5)), rtol=1e-6)
        left = _run(TensorOp(op, [{'constant': [1.0, 2.0, 3.0, 4.0, 5.0]}, {'input': 0}]), [a])
        np.testing.assert_allclose(left, _NUMPY[op](np.arange(1, 6, dtype='float32'), a),
                                   rtol=1e-6)
    elif kind == 'unary':
        # Negative values too, except where NumPy would give NaN (cyback's
        # sqrt follows Keras and clips at 0).
        x = a if op in ('sqrt', 'log') else a - 1.0
        np.testing.assert_allclose(_run(TensorOp(op, [{'input': 0}]), [x]), _NUMPY[op](x),
                                   rtol=1e-6)
    else:
        for axis, keepdims in ((None, False), (1, False), ([0, 2], True), (-1, True)):
            got = _run(TensorOp(op, [{'input': 0}], axis=axis, keepdims=keepdims), [a])
            want = _NUMPY[op](a, axis=tuple(axis) if isinstance(axis, list) else axis,
                              keepdims=keepdims)
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_zero_masked_steps(rng):
    from cyback.saving.op_layers import ZeroMaskedSteps
    x = keras.layers.Input((5, 3))
    masked = keras.layers.Masking(0.0)(x)
    ones_where_masked = keras.layers.Activation('exponential')(masked)
    zeroed = ZeroMaskedSteps()
    out = zeroed(ones_where_masked)
    values = rng.standard_normal((2, 5, 3)).astype('float32')
    values[0, 3:] = 0.0
    values[1, 1, :] = 0.0
    keep = np.any(values != 0.0, axis=-1)
    got, mask = cyback.function([x], [out, zeroed.output_mask])([values])
    np.testing.assert_allclose(got, np.exp(values) * keep[..., None], rtol=1e-6)
    np.testing.assert_array_equal(mask, keep)
    assert ZeroMaskedSteps.from_config(zeroed.get_config()).get_config() == zeroed.get_config()


def test_tensor_op_config_round_trip():
    layer = TensorOp('mean', [{'input': 0}], axis=[1, 2], keepdims=True, name='m')
    again = TensorOp.from_config(layer.get_config())
    assert again.get_config() == layer.get_config()
    assert again.name == 'm' and not again.trainable


@pytest.mark.parametrize('args, match', [
    (('cumsum', [{'input': 0}]), 'unknown operation'),
    (('add', [{'input': 0}]), 'takes 2 operand'),
    (('add', [{'constant': 1}, {'constant': 2}]), 'no tensor operand'),
    (('add', [{'input': 0}, {'tensor': 1}]), 'operand is'),
])
def test_tensor_op_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        TensorOp(*args)


# -- compile --------------------------------------------------------------------------

@pytest.mark.parametrize('filename', ['cnn_bn.tf_keras.h5', 'cnn_bn.tf_keras.keras',
                                      'cnn_bn.keras3.keras', 'cnn_bn.keras3.h5'])
def test_compile_from_the_saved_config(filename, rng):
    model = cyback.load_model(os.path.join(FIXTURES_DIR, filename), compile=True)
    assert isinstance(model.optimizer, keras.optimizers.Adam)
    assert model.optimizer.get_config()['learning_rate'] == pytest.approx(0.005)
    assert model.loss == 'categorical_crossentropy'
    _, xs, _ = reference(filename)
    y = np.eye(5, dtype='float32')[[0, 3, 1]]
    loss_before = model.evaluate(xs[0], y, verbose=0)[0]
    model.fit(xs[0], y, epochs=3, verbose=0)
    assert model.evaluate(xs[0], y, verbose=0)[0] < loss_before
    assert 'accuracy' in model.metrics_names or 'acc' in model.metrics_names


def test_compile_without_a_training_config():
    with pytest.raises(ValueError, match='saved uncompiled'):
        cyback.load_model(os.path.join(FIXTURES_DIR, 'nested.keras3.keras'), compile=True)


@pytest.mark.parametrize('optimizer, match', [
    ({'class_name': 'AdamW', 'config': {'learning_rate': 0.1}}, 'AdamW'),
    ({'class_name': 'Adam', 'config': {'learning_rate': 0.1, 'weight_decay': 0.01}},
     'weight_decay'),
    ({'class_name': 'SGD', 'config': {'learning_rate': {'class_name': 'ExponentialDecay'}}},
     'schedule'),
    ({'class_name': 'Adam', 'config': {'learning_rate': 0.1, 'use_ema': True}}, 'use_ema'),
])
def test_compile_refuses_what_keras2_cannot_do(optimizer, match):
    model = keras.models.Sequential([keras.layers.Dense(1, input_shape=(2,))])
    with pytest.raises(ValueError, match=match):
        compile_config.compile_model(model, {'optimizer': optimizer, 'loss': 'mse'}, None, {},
                                     'file.keras')


def test_compile_keras3_loss_object():
    model = keras.models.Sequential([keras.layers.Dense(3, input_shape=(2,))])
    compile_config.compile_model(model, {
        'optimizer': {'class_name': 'SGD', 'config': {'learning_rate': 0.5, 'momentum': 0.9,
                                                      'nesterov': True, 'name': 'sgd'}},
        'loss': {'module': 'keras.losses', 'class_name': 'CategoricalCrossentropy',
                 'config': {'from_logits': True, 'label_smoothing': 0.0}},
        'metrics': ['mae']}, None, {}, 'file.keras')
    assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert model.optimizer.get_config()['nesterov'] is True
    assert isinstance(model.loss, keras.losses.CategoricalCrossentropy)
