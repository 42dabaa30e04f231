"""int8 layers in inference plans: a BatchNormalization after an int8 convolution
is folded into its epilogue (scales and bias, any sign), the bias add and
relu / relu6 after it run in the epilogue too; and the Conv2D of models loaded
from files (cyback.layers' class, with groups) is quantized like Keras's own."""
import keras
import numpy as np
import pytest

import cyback
import cyback.layers
from cyback.graph import optimize


def _model(conv_class, negative_gamma):
    rng = np.random.RandomState(0)
    inp = keras.layers.Input((9, 9, 3))
    x = conv_class(8, 3, use_bias=False, name='conv')(inp)
    x = keras.layers.BatchNormalization(name='bn1')(x)
    x = keras.layers.ReLU(6.0)(x)
    x = keras.layers.DepthwiseConv2D(3, padding='same', use_bias=False, name='dw')(x)
    x = keras.layers.BatchNormalization(name='bn2')(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(4, 1, name='project')(x)
    x = keras.layers.BatchNormalization(name='bn3')(x)
    model = keras.models.Model(inp, x)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.get_weights()[0].shape[0]
            gamma = rng.uniform(0.5, 1.5, c)
            if negative_gamma:
                gamma[::2] *= -1
            layer.set_weights([gamma, rng.normal(0, 0.3, c), rng.normal(0, 0.3, c),
                               rng.uniform(0.5, 1.5, c)])
    return model, rng.standard_normal((16, 9, 9, 3)).astype('float32')


def _labels(function):
    labels = []
    for op in function.plan_ops():
        describe = getattr(op, 'describe', None)
        labels.append(describe() if describe else (op.api or type(op).__name__))
    return labels


@pytest.mark.parametrize('negative_gamma', [False, True])
def test_batchnorm_bias_and_relu_go_into_the_int8_epilogue(negative_gamma):
    model, x = _model(cyback.layers.Conv2D, negative_gamma)
    q = cyback.quantize(model, x)
    classes = {layer.name: type(layer).__name__ for layer in q.layers}
    assert classes['conv'] == 'QuantizedConv2D' and classes['dw'] == 'QuantizedDepthwiseConv2D'
    K = keras.backend
    f = K.function(q.inputs, q.outputs)
    labels = _labels(f)
    # conv, bn1, ReLU(6) / dw, bn2, ReLU / project, bn3: one step each, uint8
    # codes between them
    assert labels == ['quantized_conv relu6 (uint8 out)',
                      'quantized_depthwise_conv relu (uint8 in, uint8 out)',
                      'quantized_conv (uint8 in)'], labels
    got = f([x])[0]
    optimize.set_graph_optimizer(False)
    try:
        plain = K.function(q.inputs, q.outputs)
        assert any('multiply' in label for label in _labels(plain))
        want = plain([x])[0]
    finally:
        optimize.set_graph_optimizer(True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # and the int8 model still tracks the float one
    ref = model.predict(x)
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()


def test_loaded_conv2d_class_is_quantized_unless_grouped():
    model, x = _model(cyback.layers.Conv2D, False)
    assert type(model.get_layer('conv')) is cyback.layers.Conv2D
    q = cyback.quantize(model, x)
    assert type(q.get_layer('conv')).__name__ == 'QuantizedConv2D'
    inp = keras.layers.Input((6, 6, 4))
    grouped = keras.models.Model(inp, cyback.layers.Conv2D(4, 3, groups=2, name='g')(inp))
    q = cyback.quantize(grouped, np.random.RandomState(1).randn(4, 6, 6, 4).astype('float32'))
    assert type(q.get_layer('g')) is cyback.layers.Conv2D


def _padded_depthwise(pads, padding):
    inp = keras.layers.Input((8, 7, 5))
    x = keras.layers.ZeroPadding2D(pads)(inp)
    x = keras.layers.DepthwiseConv2D(3, strides=2, padding=padding, name='dw')(x)
    return keras.models.Model(inp, x)


def _padded_stem(pads, padding):
    # ResNet's: ZeroPadding2D(3), then a 7x7 convolution with stride 2
    inp = keras.layers.Input((8, 7, 5))
    x = keras.layers.ZeroPadding2D(pads)(inp)
    x = keras.layers.Conv2D(6, 3, strides=2, padding=padding, activation='relu')(x)
    x = keras.layers.Conv2D(4, 1)(x)
    return keras.models.Model(inp, x)


def _padded_conv1d(pads, padding):
    inp = keras.layers.Input((8, 7))
    x = keras.layers.ZeroPadding1D(pads[1])(inp)
    x = keras.layers.Conv1D(6, 3, strides=2, padding=padding)(x)
    return keras.models.Model(inp, x)


@pytest.mark.parametrize('build', [_padded_depthwise, _padded_stem, _padded_conv1d])
@pytest.mark.parametrize('padding', ['valid', 'same'])
@pytest.mark.parametrize('pads', [((0, 1), (0, 1)), ((2, 0), (1, 3))])
def test_zero_padding_goes_into_the_int8_window_pads(build, padding, pads):
    rng = np.random.RandomState(2)
    model = build(pads, padding)
    data = rng.standard_normal((6,) + model.input_shape[1:]).astype('float32')
    q = cyback.quantize(model, data)
    K = keras.backend
    f = K.function(q.inputs, q.outputs)
    pad = 'spatial_2d_padding' if len(data.shape) == 4 else 'temporal_padding'
    assert pad not in _labels(f)
    got = f([data])[0]
    optimize.set_graph_optimizer(False)
    try:
        plain = K.function(q.inputs, q.outputs)
        assert pad in _labels(plain)
        want = plain([data])[0]
    finally:
        optimize.set_graph_optimizer(True)
    assert got.shape == want.shape == model.predict(data).shape
    np.testing.assert_array_equal(got, want)


def test_a_bias_after_an_int8_layer_with_its_own_relu_stays_outside_it():
    # relu(conv) + b is not relu(conv + b): the add must not enter the epilogue
    rng = np.random.RandomState(3)
    inp = keras.layers.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, activation='relu', name='conv')(inp)
    shift = keras.backend.constant(np.full(4, -0.5, 'float32'))
    x = keras.layers.Lambda(lambda t: t + shift)(x)
    model = keras.models.Model(inp, x)
    data = rng.standard_normal((8, 6, 6, 3)).astype('float32')
    q = cyback.quantize(model, data)
    K = keras.backend
    f = K.function(q.inputs, q.outputs)
    got = f([data])[0]
    optimize.set_graph_optimizer(False)
    try:
        want = K.function(q.inputs, q.outputs)([data])[0]
    finally:
        optimize.set_graph_optimizer(True)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert got.min() < -0.49          # the subtraction came after the relu
