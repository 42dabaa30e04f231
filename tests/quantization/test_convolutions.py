"""The int8 DepthwiseConv2D, SeparableConv2D, Conv3D and channels_first
Conv1D/2D layers: bit for bit against a NumPy integer reference of the
documented computation, and against the float layer within quantization
error; saving and loading; the report."""
import keras
import numpy as np
import pytest

import cyback
import cyback.quantization as cq
from cyback.kernels import conv_utils

L = keras.layers


def ref_codes(x, scale, zero):
    v = np.clip(np.asarray(x, np.float32) / np.float32(scale), np.float32(-zero),
                np.float32(255 - zero))
    return np.rint(v).astype(np.int64) + zero


def window_sums(q, codes, strides, dilation, padding, depthwise):
    """int64 sums of the (zero-point-free) codes q over each window, with
    padding at 0: a full convolution (codes (..., C, F)) or a depthwise one
    (codes (..., C) per channel)."""
    window = codes.shape[:q.ndim - 2]
    sizes = q.shape[1:-1]
    pads = [conv_utils.conv_pads(n, k, s, d, padding)
            for n, k, s, d in zip(sizes, window, strides, dilation)]
    out = [conv_utils.conv_output_length(n, k, s, d, padding)
           for n, k, s, d in zip(sizes, window, strides, dilation)]
    qp = np.pad(q, [(0, 0)] + pads + [(0, 0)])
    width = codes.shape[-1]
    acc = np.zeros((q.shape[0],) + tuple(out) + (width,), np.int64)
    for tap in np.ndindex(*window):
        sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                   for t, d, o, s in zip(tap, dilation, out, strides))
        part = qp[(slice(None),) + sl]
        w = codes[tap].astype(np.int64)
        acc += part * w if depthwise else np.einsum('...c,cf->...f', part, w)
    return acc


def epilogue(acc, in_scale, w_scale, bias, act):
    y = acc.astype(np.int32).astype(np.float32) * (np.float32(in_scale) * w_scale)
    if bias is not None:
        y = y + bias
    if act in ('relu', 'relu6'):
        y = np.maximum(np.float32(0), y)
    if act == 'relu6':
        y = np.minimum(np.float32(6), y)
    return y


def ref_depthwise(layer, x, middle=None):
    c = layer.get_config()
    weights = layer.get_weights()
    codes, scale = weights[0], weights[1]
    s, z = c['input_scale'], c['input_zero_point']
    q = ref_codes(x, s, z) - z
    m = codes.shape[-1]
    q = np.repeat(q, m, axis=-1)
    flat = codes.reshape(codes.shape[:2] + (-1,))
    acc = window_sums(q, flat, c['strides'], c['dilation_rate'], c['padding'], True)
    if middle is None:
        return epilogue(acc, s, scale, weights[2] if c['use_bias'] else None, c['activation'])
    # separable: the depthwise result to uint8 codes, then the 1x1 product
    y = epilogue(acc, s, scale, None, 'linear')
    ms, mz = c['depthwise_output_scale'], c['depthwise_output_zero_point']
    mid = ref_codes(y, ms, mz) - mz
    pw, pw_scale = weights[2], weights[3]
    acc2 = np.einsum('...c,cf->...f', mid, pw[0, 0].astype(np.int64))
    return epilogue(acc2, ms, pw_scale, weights[4] if c['use_bias'] else None, c['activation'])


def ref_conv(layer, x):
    c = layer.get_config()
    weights = layer.get_weights()
    first = c['data_format'] == 'channels_first'
    if first:
        x = np.moveaxis(x, 1, -1)
    s, z = c['input_scale'], c['input_zero_point']
    acc = window_sums(ref_codes(x, s, z) - z, weights[0], c['strides'], c['dilation_rate'],
                      c['padding'], False)
    y = epilogue(acc, s, weights[1], weights[2] if c['use_bias'] else None, c['activation'])
    return np.moveaxis(y, -1, 1) if first else y


CASES = [
    ('depthwise', (9, 10, 5),
     lambda: L.DepthwiseConv2D(3, padding='same', activation='relu', name='t')),
    ('depthwise_multiplier', (9, 10, 5),
     lambda: L.DepthwiseConv2D((3, 2), strides=2, depth_multiplier=3, name='t')),
    ('depthwise_dilated', (11, 9, 17),
     lambda: L.DepthwiseConv2D(3, dilation_rate=2, use_bias=False, name='t')),
    ('separable', (9, 10, 5),
     lambda: L.SeparableConv2D(7, 3, padding='same', activation='relu', name='t')),
    ('separable_multiplier', (9, 10, 5),
     lambda: L.SeparableConv2D(7, 3, depth_multiplier=2, strides=2, name='t')),
    ('conv3d', (5, 6, 7, 3), lambda: L.Conv3D(4, (2, 3, 3), padding='same', name='t')),
    ('conv3d_channels_first', (3, 5, 6, 7),
     lambda: L.Conv3D(4, 3, strides=(1, 2, 1), data_format='channels_first', name='t')),
    ('conv2d_channels_first', (3, 8, 9),
     lambda: L.Conv2D(4, 3, padding='same', data_format='channels_first', activation='relu',
                      name='t')),
    ('conv1d_channels_first', (3, 9),
     lambda: L.Conv1D(4, 3, strides=2, data_format='channels_first', name='t')),
]


@pytest.mark.parametrize('name,shape,make', CASES, ids=[c[0] for c in CASES])
def test_against_the_integer_reference_and_the_float_layer(name, shape, make, tmp_path):
    rs = np.random.RandomState(len(name))
    inp = L.Input(shape)
    model = keras.models.Model(inp, make()(inp))
    model.set_weights([w + rs.uniform(-0.2, 0.2, w.shape).astype(np.float32)
                       for w in model.get_weights()])
    x = rs.randn(4, *shape).astype(np.float32)
    q = cyback.quantize(model, x)
    layer = q.get_layer('t')
    assert type(layer).__name__ == 'Quantized' + type(model.get_layer('t')).__name__
    got = q.predict(x)
    if 'depthwise' in name:
        want = ref_depthwise(layer, x)
    elif 'separable' in name:
        want = ref_depthwise(layer, x, middle=True)
    else:
        want = ref_conv(layer, x)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    ref = model.predict(x)
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
    assert cq.report(model, q, x)['t'].rel_rms < 0.03
    path = str(tmp_path / 'q.h5')
    q.save(path)
    back = cyback.load_model(path)
    assert back.get_layer('t').get_config() == layer.get_config()
    assert back.predict(x).tobytes() == got.tobytes()


def test_separable_calibrates_the_depthwise_result():
    rs = np.random.RandomState(2)
    inp = L.Input((6, 6, 3))
    model = keras.models.Model(inp, L.SeparableConv2D(4, 3, name='t')(inp))
    x = rs.randn(8, 6, 6, 3).astype(np.float32)
    mid = keras.backend.function([inp], [keras.backend.depthwise_conv2d(
        inp, model.get_layer('t').depthwise_kernel)])([x])[0]
    for activations in ('uint8', 'int8'):
        layer = cyback.quantize(model, x, activations=activations).get_layer('t')
        scale, zero = cq.scale_and_zero(mid.min(), mid.max(), activations)
        assert (layer.depthwise_output_scale, layer.depthwise_output_zero_point) == \
            (scale, zero)
