"""Grouped Conv1D/Conv2D, Conv1DTranspose and DepthwiseConv1D against NumPy
references and tf_keras; gradients, configs, saving, bad arguments."""
import keras
import numpy as np
import pytest

from cyback.layers.convolutional import Conv1D, Conv1DTranspose, Conv2D, DepthwiseConv1D

from .helpers import check_layer_grads, config_round_trip, fit_save_reload

K = keras.backend


def _run(layer, x):
    ph = K.placeholder(shape=(None,) + x.shape[1:], dtype=x.dtype.name)
    out = layer(ph)
    return K.function([ph], [out])([x])[0]


def _set_random(layer, seed=0):
    rs = np.random.RandomState(seed)
    values = [rs.randn(*w.shape).astype(K.dtype(w)) for w in layer.weights]
    layer.set_weights(values)
    return values


def np_conv1d(x, w, stride=1, dilation=1, pad=(0, 0)):
    """(B, T, C) * (k, C, F), valid after padding ``pad`` zeros."""
    x = np.pad(x, ((0, 0), pad, (0, 0)))
    k = w.shape[0]
    span = dilation * (k - 1) + 1
    n = (x.shape[1] - span) // stride + 1
    out = np.zeros((x.shape[0], n, w.shape[2]))
    for t in range(n):
        window = x[:, t * stride:t * stride + span:dilation]      # (B, k, C)
        out[:, t] = np.einsum('bkc,kcf->bf', window, w)
    return out


def np_conv2d_valid(x, w, strides=(1, 1)):
    kh, kw = w.shape[:2]
    oh = (x.shape[1] - kh) // strides[0] + 1
    ow = (x.shape[2] - kw) // strides[1] + 1
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * strides[0]:i * strides[0] + kh, j * strides[1]:j * strides[1] + kw]
            out[:, i, j] = np.einsum('bhwc,hwcf->bf', patch, w)
    return out


def np_grouped(conv, x, w, groups, **kwargs):
    cin, cout = x.shape[-1] // groups, w.shape[-1] // groups
    return np.concatenate([conv(x[..., g * cin:(g + 1) * cin], w[..., g * cout:(g + 1) * cout],
                                **kwargs) for g in range(groups)], axis=-1)


@pytest.mark.parametrize('groups, filters, channels', [(2, 4, 6), (3, 6, 3), (3, 3, 3),
                                                      (1, 4, 4), (2, 2, 4)])
def test_conv2d_groups_matches_numpy(groups, filters, channels):
    x = np.random.RandomState(1).randn(2, 5, 4, channels)
    layer = Conv2D(filters, (3, 2), groups=groups, strides=(1, 2), dtype='float64')
    _run(layer, x)
    kernel, bias = _set_random(layer)
    assert kernel.shape == (3, 2, channels // groups, filters)
    expected = np_grouped(np_conv2d_valid, x, kernel, groups, strides=(1, 2)) + bias
    np.testing.assert_allclose(_run(layer, x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('groups, filters, padding', [(3, 6, 'causal'), (6, 12, 'valid'),
                                                      (2, 4, 'same'), (6, 6, 'causal')])
def test_conv1d_groups_matches_numpy(groups, filters, padding):
    x = np.random.RandomState(2).randn(2, 7, 6)
    layer = Conv1D(filters, 3, groups=groups, padding=padding, dilation_rate=2,
                   dtype='float64', use_bias=False)
    _run(layer, x)
    (kernel,) = _set_random(layer)
    pad = {'valid': (0, 0), 'causal': (4, 0), 'same': (2, 2)}[padding]
    expected = np_grouped(np_conv1d, x, kernel, groups, dilation=2, pad=pad)
    np.testing.assert_allclose(_run(layer, x), expected, rtol=1e-10, atol=1e-10)


def test_conv2d_groups_channels_first():
    x = np.random.RandomState(3).randn(2, 4, 5, 5)
    layer = Conv2D(6, 3, groups=2, data_format='channels_first', dtype='float64')
    _run(layer, x)
    kernel, bias = _set_random(layer)
    expected = np_grouped(np_conv2d_valid, x.transpose(0, 2, 3, 1), kernel, 2) + bias
    np.testing.assert_allclose(_run(layer, x), expected.transpose(0, 3, 1, 2), rtol=1e-10)


def np_depthwise_conv1d(x, w, stride=1, pad=(0, 0)):
    """(B, T, C) * (k, C, M) -> (B, T', C * M)."""
    b, _, c = x.shape
    m = w.shape[2]
    out = [np_conv1d(x[..., i:i + 1], w[:, i:i + 1, :], stride=stride, pad=pad)
           for i in range(c)]
    return np.stack(out, axis=2).reshape(b, -1, c * m)


@pytest.mark.parametrize('kwargs, pad', [
    (dict(kernel_size=3, depth_multiplier=2), (0, 0)),
    (dict(kernel_size=3, padding='same'), (1, 1)),
    (dict(kernel_size=2, padding='causal', depth_multiplier=3), (1, 0)),
    (dict(kernel_size=3, strides=2), (0, 0)),
])
def test_depthwise_conv1d_matches_numpy(kwargs, pad):
    x = np.random.RandomState(4).randn(2, 7, 3)
    layer = DepthwiseConv1D(dtype='float64', **kwargs)
    _run(layer, x)
    kernel, bias = _set_random(layer)
    assert [w.name.split('/')[-1] for w in layer.weights] == ['depthwise_kernel', 'bias']
    expected = np_depthwise_conv1d(x, kernel, kwargs.get('strides', 1), pad) + bias
    got = _run(layer, x)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
    assert layer.compute_output_shape((2, 7, 3)) == got.shape


def np_conv1d_transpose(x, w, stride, dilation, out_len, pad_left):
    """(B, T, C) and a (k, F, C) kernel: scatter each input step into the output."""
    k = w.shape[0]
    full = (x.shape[1] - 1) * stride + dilation * (k - 1) + 1
    out = np.zeros((x.shape[0], max(full, out_len + pad_left) + 1, w.shape[1]))
    for t in range(x.shape[1]):
        for j in range(k):
            out[:, t * stride + j * dilation] += x[:, t] @ w[j].T
    return out[:, pad_left:pad_left + out_len]


@pytest.mark.parametrize('kwargs, out_len, pad_left', [
    (dict(kernel_size=3, strides=2, padding='same'), 10, 0),
    (dict(kernel_size=4, strides=3, output_padding=1), 17, 0),
    (dict(kernel_size=3, dilation_rate=2), 9, 0),
    (dict(kernel_size=1, strides=2), 10, 0),
])
def test_conv1d_transpose_matches_numpy(kwargs, out_len, pad_left):
    x = np.random.RandomState(5).randn(2, 5, 3)
    layer = Conv1DTranspose(4, dtype='float64', **kwargs)
    _run(layer, x)
    kernel, bias = _set_random(layer)
    assert kernel.shape == (kwargs['kernel_size'], 4, 3)
    expected = np_conv1d_transpose(x, kernel, kwargs.get('strides', 1),
                                   kwargs.get('dilation_rate', 1), out_len, pad_left) + bias
    got = _run(layer, x)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
    assert layer.compute_output_shape((None, 5, 3)) == (None, out_len, 4)


@pytest.mark.parametrize('case, make', [
    ('conv2d_groups', lambda: Conv2D(4, 3, groups=2, padding='same', name='c')),
    ('conv2d_depthwise_groups', lambda: Conv2D(8, (3, 2), groups=4, strides=(2, 1),
                                               name='c')),
    ('conv1d_groups', lambda: Conv1D(6, 3, groups=3, padding='causal', dilation_rate=2,
                                     name='c')),
    ('conv1d_transpose', lambda: Conv1DTranspose(4, 3, strides=2, padding='same', name='c')),
    ('conv1d_transpose_valid', lambda: Conv1DTranspose(3, 4, strides=3, output_padding=1,
                                                       name='c')),
    ('conv1d_transpose_dilated', lambda: Conv1DTranspose(2, 3, dilation_rate=2, name='c')),
    ('depthwise_conv1d', lambda: DepthwiseConv1D(3, depth_multiplier=2, padding='same',
                                                 name='c')),
    ('depthwise_conv1d_strided', lambda: DepthwiseConv1D(4, strides=2, name='c')),
])
def test_matches_tf_keras(reference, case, make):
    layer = make()
    x = reference[case + '/in0']
    _run(layer, x)
    layer.set_weights([reference['%s/w/%s' % (case, w.name.split('/', 1)[1])]
                       for w in layer.weights])
    np.testing.assert_allclose(_run(layer, x), reference[case + '/out0'], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize('make, shape', [
    (lambda: Conv2D(4, 2, groups=2, dtype='float64'), (1, 3, 3, 4)),
    (lambda: Conv2D(4, 2, groups=2, padding='same', dtype='float64'), (1, 2, 3, 2)),
    (lambda: Conv1D(4, 2, groups=2, padding='causal', dtype='float64'), (2, 4, 2)),
    (lambda: DepthwiseConv1D(2, depth_multiplier=2, dtype='float64'), (2, 4, 2)),
    (lambda: Conv1DTranspose(2, 3, strides=2, padding='same', dtype='float64'), (2, 3, 2)),
])
def test_gradients(make, shape, one_thread):
    layer = make()
    layer.build((None,) + shape[1:])
    _set_random(layer)
    check_layer_grads(layer, np.random.RandomState(6).randn(*shape))


def test_groups_one_is_stock_keras():
    x = np.random.RandomState(7).randn(2, 5, 5, 3).astype('float32')
    ours = Conv2D(4, 3)
    stock = keras.layers.Conv2D(4, 3)
    _run(ours, x)
    _run(stock, x)
    stock.set_weights(ours.get_weights())
    np.testing.assert_array_equal(_run(ours, x), _run(stock, x))
    assert ours.get_config()['groups'] == 1


@pytest.mark.parametrize('layer', [
    Conv2D(6, 3, groups=3, strides=2, padding='same', kernel_regularizer='l2'),
    Conv1D(4, 2, groups=2, padding='causal', dilation_rate=2),
    Conv1DTranspose(3, 4, strides=2, output_padding=1, activation='relu'),
    DepthwiseConv1D(5, depth_multiplier=3, padding='causal', use_bias=False),
])
def test_config_round_trip(layer):
    config_round_trip(layer)


def test_model_fits_saves_and_reloads(tmp_path):
    inp = keras.layers.Input((8, 4))
    x = Conv1D(6, 3, groups=2, padding='same')(inp)
    x = DepthwiseConv1D(3, depth_multiplier=2, padding='causal')(x)
    x = Conv1DTranspose(4, 3, strides=2, padding='same')(x)
    x = keras.layers.Reshape((4, 4, 4))(x)
    x = Conv2D(4, 3, groups=4, padding='same')(x)
    out = keras.layers.Dense(1)(keras.layers.Flatten()(x))
    model = keras.models.Model(inp, out)
    rs = np.random.RandomState(8)
    fit_save_reload(model, rs.randn(3, 8, 4).astype('float32'),
                    rs.randn(3, 1).astype('float32'), tmp_path)


@pytest.mark.parametrize('make, error, match', [
    (lambda: Conv2D(5, 3, groups=2), ValueError, 'multiple of groups'),
    (lambda: Conv2D(4, 3, groups=0), ValueError, 'groups'),
    (lambda: Conv1D(4, 3, groups=1.5), TypeError, 'groups'),
    (lambda: Conv1DTranspose(4, 3, padding='causal'), ValueError, 'padding'),
    (lambda: Conv1DTranspose(4, 3, strides=2, output_padding=2), ValueError, 'output_padding'),
    (lambda: Conv1DTranspose(0, 3), ValueError, 'filters'),
    (lambda: DepthwiseConv1D(3, depth_multiplier=0), ValueError, 'depth_multiplier'),
    (lambda: DepthwiseConv1D((3, 3)), ValueError, 'kernel_size'),
    (lambda: DepthwiseConv1D(3, strides=2, dilation_rate=2), ValueError, 'dilation_rate'),
])
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize('layer, shape, match', [
    (Conv2D(4, 3, groups=2), (None, 5, 5, 3), 'multiple of groups'),
    (Conv1D(4, 3, groups=2), (None, 5, None), 'must be known'),
    (DepthwiseConv1D(3), (None, 5, 3, 1), 'rank 3|ndim'),
    (Conv1DTranspose(3, 3), (None, 5, None), 'must be known'),
])
def test_bad_input_shapes(layer, shape, match):
    with pytest.raises(ValueError, match=match):
        layer(keras.layers.Input(batch_shape=shape))


def test_unknown_lengths_give_the_known_length_result():
    x = np.random.RandomState(9).randn(2, 5, 4)
    for make in (lambda: Conv1DTranspose(3, 3, strides=2, dtype='float64'),
                 lambda: DepthwiseConv1D(2, padding='causal', dtype='float64'),
                 lambda: Conv1D(4, 2, groups=2, dtype='float64')):
        known, unknown = make(), make()
        ph_known = K.placeholder(shape=(None, 5, 4), dtype='float64')
        ph_unknown = K.placeholder(shape=(None, None, 4), dtype='float64')
        out_known, out_unknown = known(ph_known), unknown(ph_unknown)
        unknown.set_weights(known.get_weights())
        np.testing.assert_allclose(K.function([ph_unknown], [out_unknown])([x])[0],
                                   K.function([ph_known], [out_known])([x])[0], rtol=1e-12)
