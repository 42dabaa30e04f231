"""Rescaling, Normalization, Resizing and CenterCrop against NumPy references and
tf_keras / Keras 3 outputs; gradients, configs, saving, bad arguments."""
import keras
import numpy as np
import pytest

from cyback.layers.preprocessing import (
    CenterCrop,
    Normalization,
    Rescaling,
    Resizing,
    resize_matrix,
)

from .helpers import check_layer_grads, config_round_trip, fit_save_reload

K = keras.backend


def _run(layer, x):
    ph = K.placeholder(shape=(None,) + x.shape[1:], dtype=x.dtype.name)
    out = layer(ph)
    return K.function([ph], [out])([x])[0]


def np_resize_bilinear(img, out_h, out_w):
    """Per-pixel half-pixel bilinear resize of (B, H, W, C) images, as TF 2 computes it."""
    b, h, w, c = img.shape
    out = np.zeros((b, out_h, out_w, c))
    for y in range(out_h):
        sy = (y + 0.5) * h / out_h - 0.5
        y0 = int(np.floor(sy))
        fy = sy - y0
        ya, yb = min(max(y0, 0), h - 1), min(max(y0 + 1, 0), h - 1)
        for x in range(out_w):
            sx = (x + 0.5) * w / out_w - 0.5
            x0 = int(np.floor(sx))
            fx = sx - x0
            xa, xb = min(max(x0, 0), w - 1), min(max(x0 + 1, 0), w - 1)
            top = img[:, ya, xa] * (1 - fx) + img[:, ya, xb] * fx
            bottom = img[:, yb, xa] * (1 - fx) + img[:, yb, xb] * fx
            out[:, y, x] = top * (1 - fy) + bottom * fy
    return out


def np_resize_nearest(img, out_h, out_w):
    h, w = img.shape[1:3]
    ys = [min(int(np.floor((y + 0.5) * h / out_h)), h - 1) for y in range(out_h)]
    xs = [min(int(np.floor((x + 0.5) * w / out_w)), w - 1) for x in range(out_w)]
    return img[:, ys][:, :, xs]


IMG = np.random.RandomState(0).rand(2, 5, 7, 3) * 10


@pytest.mark.parametrize('size', [(5, 7), (8, 11), (3, 4), (1, 1), (10, 3), (5, 2)])
def test_resize_bilinear_matches_numpy(size):
    got = _run(Resizing(*size, dtype='float64'), IMG)
    np.testing.assert_allclose(got, np_resize_bilinear(IMG, *size), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('size', [(8, 3), (2, 9), (5, 7)])
def test_resize_nearest_matches_numpy(size):
    got = _run(Resizing(*size, interpolation='nearest', dtype='float64'), IMG)
    np.testing.assert_array_equal(got, np_resize_nearest(IMG, *size))


def test_resize_channels_first():
    x = IMG.transpose(0, 3, 1, 2)
    got = _run(Resizing(4, 9, data_format='channels_first', dtype='float64'), x)
    np.testing.assert_allclose(got, np_resize_bilinear(IMG, 4, 9).transpose(0, 3, 1, 2),
                               rtol=1e-12)


def test_resize_matrix_rows_sum_to_one():
    for n_in, n_out in [(5, 3), (3, 5), (7, 7), (1, 4)]:
        for mode in ('bilinear', 'nearest'):
            np.testing.assert_allclose(resize_matrix(n_in, n_out, mode).sum(1), 1.0)


@pytest.mark.parametrize('case, make', [
    ('resize_bilinear_up', lambda: Resizing(8, 11)),
    ('resize_bilinear_down', lambda: Resizing(3, 4)),
    ('resize_nearest', lambda: Resizing(8, 3, interpolation='nearest')),
    ('resize_crop', lambda: Resizing(4, 4, crop_to_aspect_ratio=True)),
    ('resize_k3_pad', lambda: Resizing(4, 4, pad_to_aspect_ratio=True, fill_value=7.0)),
    ('center_crop', lambda: CenterCrop(3, 4)),
    ('center_crop_upsize', lambda: CenterCrop(6, 6)),
    ('rescaling_k3', lambda: Rescaling([0.5, 1.0, 2.0], offset=-1.0)),
])
def test_matches_tf_keras_and_keras3(reference, case, make):
    x = reference[case + '/in0']
    np.testing.assert_allclose(_run(make(), x), reference[case + '/out0'], rtol=1e-5,
                               atol=1e-4)


def test_center_crop_with_unknown_size():
    layer = CenterCrop(2, 3)
    ph = K.placeholder(shape=(None, None, None, 3))
    out = layer(ph)
    f = K.function([ph], [out])
    for h, w in [(5, 7), (4, 6), (2, 3)]:
        x = np.random.RandomState(h).rand(1, h, w, 3).astype('float32')
        top, left = (h - 2) // 2, (w - 3) // 2
        np.testing.assert_array_equal(f([x])[0], x[:, top:top + 2, left:left + 3])
    assert layer.compute_output_shape((None, None, None, 3)) == (None, 2, 3, 3)


def test_rescaling_and_integer_images():
    x = np.arange(24, dtype='uint8').reshape(1, 2, 4, 3)
    got = _run(Rescaling(1 / 255.0, offset=-0.5), x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, x / 255.0 - 0.5, rtol=1e-6)
    got = _run(Rescaling([1.0, 2.0, 3.0]), x.astype('float32'))
    np.testing.assert_allclose(got, x * np.array([1.0, 2.0, 3.0]))


def test_normalization_with_given_mean_and_variance():
    x = np.random.RandomState(1).randn(4, 3, 2)
    layer = Normalization(axis=-1, mean=[1.0, -2.0], variance=[4.0, 0.25], dtype='float64')
    np.testing.assert_allclose(_run(layer, x), (x - [1.0, -2.0]) / [2.0, 0.5], rtol=1e-12)
    assert layer.weights == []
    inverse = Normalization(axis=-1, mean=[1.0, -2.0], variance=[4.0, 0.25], invert=True,
                            dtype='float64')
    np.testing.assert_allclose(_run(inverse, x), x * [2.0, 0.5] + [1.0, -2.0], rtol=1e-12)
    scalar = Normalization(axis=None, mean=3.0, variance=0.0, dtype='float64')
    # variance 0: divided by epsilon, not by zero.
    np.testing.assert_allclose(_run(scalar, x), (x - 3.0) / K.epsilon())


def test_normalization_adapted_state_as_tf_keras_saves_it(reference):
    layer = Normalization(axis=-1, name='norm')
    x = reference['normalization/in0']
    _run(layer, x)
    assert [(w.name, w.shape, K.dtype(w)) for w in layer.weights] == [
        ('norm/mean', (3,), 'float32'), ('norm/variance', (3,), 'float32'),
        ('norm/count', (), 'int64')]
    assert layer.trainable_weights == []
    layer.set_weights([reference['normalization/w/' + n] for n in ('mean', 'variance',
                                                                   'count')])
    np.testing.assert_allclose(_run(layer, x), reference['normalization/out0'], rtol=1e-5,
                               atol=1e-5)


def test_normalization_axes_and_adapt():
    rs = np.random.RandomState(2)
    data = rs.randn(50, 3, 4) * [[1.0], [2.0], [3.0]] + 5.0
    layer = Normalization(axis=[1, 2], dtype='float64')
    layer.adapt(data)
    mean, variance, count = layer.get_weights()
    np.testing.assert_allclose(mean, data.mean(0))
    np.testing.assert_allclose(variance, data.var(0))
    assert count == 50
    np.testing.assert_allclose(_run(layer, data), (data - mean) / np.sqrt(variance),
                               rtol=1e-10)
    middle = Normalization(axis=1, dtype='float64')
    middle.adapt(data)
    m = data.mean((0, 2))[None, :, None]
    s = data.std((0, 2))[None, :, None]
    np.testing.assert_allclose(_run(middle, data), (data - m) / s, rtol=1e-10)


@pytest.mark.parametrize('make, shape', [
    (lambda: Resizing(4, 3, dtype='float64'), (1, 3, 5, 2)),
    (lambda: Resizing(3, 3, crop_to_aspect_ratio=True, dtype='float64'), (1, 3, 5, 1)),
    (lambda: CenterCrop(2, 2, dtype='float64'), (2, 3, 4, 1)),
    (lambda: Rescaling([2.0, 0.5], offset=1.0, dtype='float64'), (2, 3, 2)),
    (lambda: Normalization(mean=[1.0, 2.0], variance=[2.0, 3.0], dtype='float64'), (2, 2)),
])
def test_gradients_reach_the_input(make, shape, one_thread):
    check_layer_grads(make(), np.random.RandomState(3).randn(*shape))


@pytest.mark.parametrize('layer', [
    Rescaling(1 / 127.5, offset=-1), Rescaling([1.0, 2.0], offset=[0.0, 1.0]),
    Normalization(axis=[1, 2]), Normalization(axis=None, mean=2.0, variance=3.0, invert=True),
    Normalization(mean=[1.0, 2.0], variance=[3.0, 4.0]),
    Resizing(3, 4, interpolation='nearest', crop_to_aspect_ratio=True),
    Resizing(3, 4, pad_to_aspect_ratio=True, fill_value=1.0, data_format='channels_first'),
    CenterCrop(5, 6, data_format='channels_last'),
])
def test_config_round_trip(layer):
    config_round_trip(layer)


def test_model_fits_saves_and_reloads(tmp_path):
    inp = keras.layers.Input((6, 8, 3))
    x = Rescaling(1 / 255.0)(inp)
    norm = Normalization()
    x = norm(x)
    x = Resizing(4, 4, crop_to_aspect_ratio=True)(x)
    x = CenterCrop(3, 3)(x)
    out = keras.layers.Dense(2)(keras.layers.Flatten()(x))
    model = keras.models.Model(inp, out)
    rs = np.random.RandomState(4)
    images = (rs.rand(5, 6, 8, 3) * 255).astype('float32')
    norm.adapt(images / 255.0)
    loaded = fit_save_reload(model, images, rs.randn(5, 2).astype('float32'), tmp_path)
    np.testing.assert_allclose(loaded.layers[2].get_weights()[0], norm.get_weights()[0])


@pytest.mark.parametrize('make, error, match', [
    (lambda: Rescaling('a'), TypeError, 'scale'),
    (lambda: Rescaling(1.0, offset=float('nan')), ValueError, 'offset'),
    (lambda: Normalization(mean=1.0), ValueError, 'both mean and variance'),
    (lambda: Normalization(mean=1.0, variance=-1.0), ValueError, 'negative'),
    (lambda: Normalization(axis='x'), TypeError, 'axis'),
    (lambda: Normalization(invert=1), TypeError, 'invert'),
    (lambda: Resizing(0, 4), ValueError, 'height'),
    (lambda: Resizing(4, 4.5), TypeError, 'width'),
    (lambda: Resizing(4, 4, interpolation='bicubic'), ValueError, 'bicubic'),
    (lambda: Resizing(4, 4, antialias=True), ValueError, 'antialias'),
    (lambda: Resizing(4, 4, crop_to_aspect_ratio=True, pad_to_aspect_ratio=True), ValueError,
     'both'),
    (lambda: Resizing(4, 4, data_format='nhwc'), ValueError, 'data_format'),
    (lambda: CenterCrop(2, None), TypeError, 'width'),
])
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize('layer, shape, match', [
    (Resizing(3, 3), (None, None, 4, 3), 'must be known'),
    (Resizing(3, 3), (None, 4, 3), 'rank 4'),
    (CenterCrop(3, 3), (None, 4, 4, 3, 1), 'rank 4'),
    (Normalization(axis=1), (None, None, 3), 'must be known'),
    (Normalization(axis=3), (None, 2, 3), 'out of range'),
    (Normalization(mean=[1.0, 2.0], variance=[1.0, 2.0]), (None, 3), 'broadcast'),
])
def test_bad_input_shapes(layer, shape, match):
    with pytest.raises(ValueError, match=match):
        layer(keras.layers.Input(batch_shape=shape))
