"""Identity, LeakyReLU (negative_slope), LayerScale, StochasticDepth and
CustomScaleLayer: values, masks, training behaviour, gradients, configs, saving."""
import keras
import numpy as np
import pytest

from cyback.layers.core import (
    CustomScaleLayer,
    Identity,
    LayerScale,
    LeakyReLU,
    StochasticDepth,
)

from .helpers import check_layer_grads, config_round_trip, fit_save_reload

K = keras.backend


def _run(layer, x, **kwargs):
    ph = K.placeholder(shape=(None,) + x.shape[1:], dtype=x.dtype.name)
    out = layer(ph, **kwargs)
    return K.function([ph], [out])([x])[0]


def test_identity_and_its_mask():
    x = np.random.RandomState(0).randn(2, 3)
    np.testing.assert_array_equal(_run(Identity(dtype='float64'), x), x)
    tokens = keras.layers.Input((None,), dtype='int32')
    embedding = keras.layers.Embedding(5, 2, mask_zero=True)
    layer = Identity()
    layer(embedding(tokens))
    assert layer.get_output_mask_at(0) is embedding.get_output_mask_at(0)


@pytest.mark.parametrize('kwargs, slope', [({}, 0.3), (dict(negative_slope=0.1), 0.1),
                                           (dict(alpha=0.2), 0.2),
                                           (dict(alpha=0.2, negative_slope=0.2), 0.2)])
def test_leaky_relu(kwargs, slope):
    x = np.linspace(-3, 3, 13).reshape(1, -1)
    layer = LeakyReLU(dtype='float64', **kwargs)
    np.testing.assert_allclose(_run(layer, x), np.where(x >= 0, x, slope * x), rtol=1e-6)
    config = layer.get_config()
    assert config['negative_slope'] == config['alpha'] == pytest.approx(slope)
    assert LeakyReLU.from_config(config).get_config() == config


def test_layer_scale():
    x = np.random.RandomState(1).randn(2, 3, 4)
    layer = LayerScale(1e-6, 4, dtype='float64')
    np.testing.assert_allclose(_run(layer, x), x * 1e-6)
    assert [(w.name.split('/')[-1], w.shape) for w in layer.weights] == [('gamma', (4,))]
    gamma = np.array([1.0, -2.0, 0.5, 3.0])
    layer.set_weights([gamma])
    np.testing.assert_allclose(_run(layer, x), x * gamma)
    check_layer_grads(layer, x)


def test_stochastic_depth_is_identity_at_inference(fresh_learning_phase):
    x = np.random.RandomState(2).rand(400, 3) + 1.0
    layer = StochasticDepth(0.25, dtype='float64')
    ph = K.placeholder(shape=(None, 3), dtype='float64')
    f = K.function([ph, K.learning_phase()], [layer(ph)])
    np.testing.assert_array_equal(f([x, 0])[0], x)
    train = f([x, 1])[0]
    dropped = np.all(train == 0, axis=1)
    # Whole samples are dropped, the rest scaled by 1 / keep.
    np.testing.assert_allclose(train[~dropped], x[~dropped] / 0.75, rtol=1e-12)
    assert 0.15 < dropped.mean() < 0.35
    np.testing.assert_array_equal(_run(StochasticDepth(0.5), x.astype('float32'),
                                       training=False), x.astype('float32'))


def test_custom_scale_layer():
    a, b = np.random.RandomState(3).randn(2, 2, 3)
    pa, pb = (K.placeholder(shape=(None, 3), dtype='float64') for _ in range(2))
    out = CustomScaleLayer(0.17, dtype='float64')([pa, pb])
    np.testing.assert_allclose(K.function([pa, pb], [out])([a, b])[0], a + 0.17 * b)
    check_layer_grads(CustomScaleLayer(0.5, dtype='float64'), [a, b])


@pytest.mark.parametrize('layer', [Identity(), LeakyReLU(negative_slope=0.05),
                                   LayerScale(0.1, 8), StochasticDepth(0.1),
                                   CustomScaleLayer(0.2)])
def test_config_round_trip(layer):
    config_round_trip(layer)


def test_convnext_block_fits_saves_and_reloads(tmp_path):
    inp = keras.layers.Input((4, 4, 3))
    x = keras.layers.Conv2D(3, 3, padding='same')(inp)
    x = LayerScale(0.5, 3)(x)
    x = StochasticDepth(0.1)(x)
    x = CustomScaleLayer(0.3)([inp, x])
    x = LeakyReLU(negative_slope=0.1)(Identity()(x))
    out = keras.layers.Dense(1)(keras.layers.Flatten()(x))
    model = keras.models.Model(inp, out)
    rs = np.random.RandomState(4)
    fit_save_reload(model, rs.randn(3, 4, 4, 3).astype('float32'),
                    rs.randn(3, 1).astype('float32'), tmp_path)


@pytest.mark.parametrize('make, error, match', [
    (lambda: LeakyReLU(negative_slope=0.1, alpha=0.2), ValueError, 'not both'),
    (lambda: LeakyReLU(negative_slope='x'), TypeError, 'negative_slope'),
    (lambda: LayerScale('a', 3), TypeError, 'init_values'),
    (lambda: LayerScale(0.1, 0), ValueError, 'projection_dim'),
    (lambda: StochasticDepth(1.0), ValueError, 'drop_path_rate'),
    (lambda: StochasticDepth(-0.1), ValueError, 'drop_path_rate'),
    (lambda: CustomScaleLayer(None), TypeError, 'scale'),
])
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_inputs():
    with pytest.raises(ValueError, match='projection_dim'):
        LayerScale(0.1, 4)(keras.layers.Input((3,)))
    with pytest.raises(ValueError, match='two tensors'):
        CustomScaleLayer(0.1)(keras.layers.Input((3,)))
