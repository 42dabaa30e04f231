"""Global poolings with keepdims: NumPy references, masks, gradients, configs,
saving, bad arguments."""
import keras
import numpy as np
import pytest

from cyback.layers import pooling as P

from .helpers import check_layer_grads, config_round_trip, fit_save_reload

K = keras.backend


def _run(layer, x):
    ph = K.placeholder(shape=(None,) + x.shape[1:], dtype=x.dtype.name)
    out = layer(ph)
    return K.function([ph], [out])([x])[0]


CASES = [
    (P.GlobalAveragePooling1D, np.mean, (2, 5, 3)),
    (P.GlobalMaxPooling1D, np.max, (2, 5, 3)),
    (P.GlobalAveragePooling2D, np.mean, (2, 4, 5, 3)),
    (P.GlobalMaxPooling2D, np.max, (2, 4, 5, 3)),
    (P.GlobalAveragePooling3D, np.mean, (2, 3, 2, 4, 3)),
    (P.GlobalMaxPooling3D, np.max, (2, 3, 2, 4, 3)),
]


@pytest.mark.parametrize('cls, reduce, shape', CASES)
@pytest.mark.parametrize('keepdims', [False, True])
@pytest.mark.parametrize('data_format', ['channels_last', 'channels_first'])
def test_matches_numpy(cls, reduce, shape, keepdims, data_format):
    x = np.random.RandomState(0).randn(*shape)
    layer = cls(data_format=data_format, keepdims=keepdims, dtype='float64')
    rank = len(shape) - 2
    axes = tuple(range(1, 1 + rank)) if data_format == 'channels_last' else \
        tuple(range(2, 2 + rank))
    expected = reduce(x, axis=axes, keepdims=keepdims)
    np.testing.assert_allclose(_run(layer, x), expected, rtol=1e-12)
    assert layer.compute_output_shape((None,) + shape[1:]) == (None,) + expected.shape[1:]


@pytest.mark.parametrize('keepdims', [False, True])
def test_average_1d_respects_the_mask(keepdims):
    tokens = keras.layers.Input((None,), dtype='int32')
    h = keras.layers.Embedding(6, 3, mask_zero=True)(tokens)
    out = P.GlobalAveragePooling1D(keepdims=keepdims)(h)
    model = keras.models.Model(tokens, out)
    t = np.array([[1, 2, 0, 0], [3, 4, 5, 1]])
    table = K.get_value(model.layers[1].embeddings)
    m = (t != 0)[..., None]
    expected = (table[t] * m).sum(1, keepdims=keepdims) / m.sum(1, keepdims=keepdims)
    np.testing.assert_allclose(model.predict(t), expected, rtol=1e-6)


@pytest.mark.parametrize('cls, shape', [(P.GlobalAveragePooling2D, (2, 3, 2, 2)),
                                        (P.GlobalMaxPooling1D, (2, 4, 3))])
def test_gradients(cls, shape, one_thread):
    check_layer_grads(cls(keepdims=True, dtype='float64'), np.random.RandomState(1).randn(*shape))


def test_config_round_trip_and_names():
    layer = P.GlobalAveragePooling2D(keepdims=True, data_format='channels_first')
    config_round_trip(layer)
    for cls, _, _ in CASES:
        assert cls.__name__ == getattr(keras.layers, cls.__name__).__name__


def test_model_fits_saves_and_reloads(tmp_path):
    inp = keras.layers.Input((4, 4, 3))
    x = keras.layers.Conv2D(4, 3, padding='same')(inp)
    x = P.GlobalAveragePooling2D(keepdims=True)(x)
    x = keras.layers.Conv2D(2, 1)(x)
    out = keras.layers.Flatten()(P.GlobalMaxPooling2D(keepdims=True)(x))
    model = keras.models.Model(inp, out)
    rs = np.random.RandomState(2)
    fit_save_reload(model, rs.randn(3, 4, 4, 3).astype('float32'),
                    rs.randn(3, 2).astype('float32'), tmp_path)


@pytest.mark.parametrize('make, error, match', [
    (lambda: P.GlobalAveragePooling2D(keepdims=1), TypeError, 'keepdims'),
    (lambda: P.GlobalMaxPooling2D(data_format='nhwc'), ValueError, 'data_format'),
])
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_input_rank():
    with pytest.raises(ValueError, match='ndim'):
        P.GlobalAveragePooling2D()(keras.layers.Input((4, 3)))
