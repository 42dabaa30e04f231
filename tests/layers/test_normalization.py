"""LayerNormalization, GroupNormalization and UnitNormalization against NumPy
references and tf_keras outputs; gradients, masks, configs, saving, bad arguments."""
import keras
import numpy as np
import pytest

from cyback.layers.normalization import GroupNormalization, LayerNormalization, UnitNormalization

from .helpers import check_layer_grads, config_round_trip, fit_save_reload

K = keras.backend


def _run(layer, x, **kwargs):
    ph = K.placeholder(shape=(None,) + x.shape[1:], dtype=x.dtype.name)
    out = layer(ph, **kwargs)
    return K.function([ph], [out])([x])[0]


def _set_random_weights(layer, seed=1):
    rs = np.random.RandomState(seed)
    layer.set_weights([rs.uniform(0.5, 1.5, w.shape).astype(K.dtype(w))
                       for w in layer.weights])
    return [K.get_value(w) for w in layer.weights]


def layer_norm_ref(x, axes, eps, gamma=None, beta=None, rms=False):
    mean = x.mean(axis=tuple(axes), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=tuple(axes), keepdims=True)
    shape = [1] * x.ndim
    for a in axes:
        shape[a] = x.shape[a]
    y = (x if rms else x - mean) / np.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma.reshape(shape)
    if beta is not None:
        y = y + beta.reshape(shape)
    return y


def group_norm_ref(x, groups, axis, eps, gamma, beta, mask=None):
    axis = axis % x.ndim
    c = x.shape[axis]
    shape = list(x.shape)
    shape[axis:axis + 1] = [groups, c // groups]
    g = x.reshape(shape)
    red = tuple(a for a in range(1, g.ndim) if a != axis)
    if mask is None:
        w = np.ones_like(g)
    else:
        m = mask.astype(x.dtype).reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
        w = np.broadcast_to(m, x.shape).reshape(shape)
    mean = (g * w).sum(red, keepdims=True) / w.sum(red, keepdims=True)
    var = (((g - mean) ** 2) * w).sum(red, keepdims=True) / w.sum(red, keepdims=True)
    y = ((g - mean) / np.sqrt(var + eps)).reshape(x.shape)
    bshape = [1] * x.ndim
    bshape[axis] = c
    return y * gamma.reshape(bshape) + beta.reshape(bshape)


@pytest.mark.parametrize('shape, axis', [
    ((3, 7), -1), ((2, 5, 3), -1), ((2, 5, 3), [1, 2]), ((2, 5, 3), 1),
    ((2, 3, 4, 5), [-1, 1]), ((1, 1, 6), (2,)),
])
@pytest.mark.parametrize('center, scale', [(True, True), (False, True), (True, False),
                                           (False, False)])
def test_layer_norm_matches_numpy(shape, axis, center, scale):
    x = np.random.RandomState(0).randn(*shape) * 3 + 2
    layer = LayerNormalization(axis=axis, epsilon=1e-3, center=center, scale=scale,
                               dtype='float64')
    out_fn = _run(layer, x)
    weights = _set_random_weights(layer)
    out = _run(layer, x)
    axes = sorted(a % len(shape) for a in (axis if isinstance(axis, (list, tuple)) else [axis]))
    gamma = weights[0] if scale else None
    beta = weights[-1] if center else None
    np.testing.assert_allclose(out, layer_norm_ref(x, axes, 1e-3, gamma, beta), rtol=1e-10,
                               atol=1e-12)
    assert out_fn.shape == x.shape
    names = [w.name.split('/')[-1] for w in layer.weights]
    assert names == (['gamma'] if scale else []) + (['beta'] if center else [])
    for w in layer.weights:
        assert w.shape == tuple(shape[a] for a in axes)


def test_layer_norm_rms_scaling_keras3():
    x = np.random.RandomState(1).randn(2, 3, 4) + 1
    layer = LayerNormalization(rms_scaling=True, dtype='float64')
    _run(layer, x)
    (gamma,) = _set_random_weights(layer)
    assert [w.name.split('/')[-1] for w in layer.weights] == ['gamma']
    np.testing.assert_allclose(_run(layer, x), layer_norm_ref(x, [2], 1e-3, gamma, rms=True),
                               rtol=1e-10)


def _load_reference_weights(layer, reference, case):
    layer.set_weights([reference['%s/w/%s' % (case, w.name.split('/', 1)[1])]
                       for w in layer.weights])


@pytest.mark.parametrize('case, make', [
    ('layer_norm', lambda: LayerNormalization(axis=[1, 2], name='ln')),
    ('layer_norm_k3_rms', lambda: LayerNormalization(rms_scaling=True, name='ln')),
    ('group_norm', lambda: GroupNormalization(groups=2, name='gn')),
])
def test_matches_tf_keras(reference, case, make):
    layer = make()
    x = reference[case + '/in0']
    _run(layer, x)
    _load_reference_weights(layer, reference, case)
    np.testing.assert_allclose(_run(layer, x), reference[case + '/out0'], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize('shape, groups, axis', [
    ((2, 5, 6), 3, -1), ((2, 5, 6), -1, -1), ((2, 5, 6), 1, -1), ((2, 4, 3, 3), 2, 1),
    ((3, 2, 2, 8), 4, 3), ((1, 7, 4), 2, 2),
])
def test_group_norm_matches_numpy(shape, groups, axis):
    x = np.random.RandomState(2).randn(*shape) * 2 - 1
    layer = GroupNormalization(groups=groups, axis=axis, epsilon=1e-3, dtype='float64')
    _run(layer, x)
    gamma, beta = _set_random_weights(layer)
    g = shape[axis] if groups == -1 else groups
    np.testing.assert_allclose(_run(layer, x), group_norm_ref(x, g, axis, 1e-3, gamma, beta),
                               rtol=1e-10, atol=1e-12)
    assert [w.shape for w in layer.weights] == [(shape[axis],)] * 2


def test_group_norm_mask_weights_the_moments():
    x = np.random.RandomState(3).randn(2, 5, 4)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], bool)
    layer = GroupNormalization(groups=2, dtype='float64')
    ph = K.placeholder(shape=(None, 5, 4), dtype='float64')
    mph = K.placeholder(shape=(None, 5), dtype='bool')
    out = layer(ph, mask=mph)
    gamma, beta = _set_random_weights(layer)
    got = K.function([ph, mph], [out])([x, mask])[0]
    np.testing.assert_allclose(got, group_norm_ref(x, 2, -1, 1e-3, gamma, beta, mask),
                               rtol=1e-10)
    # The moments ignore masked steps: changing them changes only those steps.
    x2 = x.copy()
    x2[0, 3:] += 100
    got2 = K.function([ph, mph], [out])([x2, mask])[0]
    np.testing.assert_allclose(got2[0, :3], got[0, :3], rtol=1e-10)


@pytest.mark.parametrize('shape, axis', [((3, 4), -1), ((2, 3, 4), [1, 2]), ((2, 3, 4), 1)])
def test_unit_norm_matches_numpy(shape, axis):
    x = np.random.RandomState(4).randn(*shape)
    x[0] = 0.0
    axes = tuple(a % len(shape) for a in (axis if isinstance(axis, list) else [axis]))
    expected = x / np.sqrt(np.maximum((x ** 2).sum(axes, keepdims=True), 1e-12))
    out = _run(UnitNormalization(axis=axis, dtype='float64'), x)
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    assert np.all(np.isfinite(out)) and np.all(out[0] == 0)


@pytest.mark.parametrize('make, shape', [
    (lambda: LayerNormalization(axis=[1, 2], dtype='float64'), (2, 3, 4)),
    (lambda: LayerNormalization(rms_scaling=True, dtype='float64'), (2, 5)),
    (lambda: GroupNormalization(groups=2, dtype='float64'), (2, 3, 4)),
    (lambda: GroupNormalization(groups=3, axis=1, dtype='float64'), (2, 6, 2)),
    (lambda: UnitNormalization(axis=[1, 2], dtype='float64'), (2, 3, 2)),
])
def test_gradients(make, shape, one_thread):
    layer = make()
    x = np.random.RandomState(5).randn(*shape)
    layer.build((None,) + shape[1:])
    if layer.weights:
        _set_random_weights(layer)
    check_layer_grads(layer, x)


def test_masks_pass_through():
    tokens = keras.layers.Input((None,), dtype='int32')
    embedding = keras.layers.Embedding(10, 4, mask_zero=True)
    h = embedding(tokens)
    for layer in (LayerNormalization(), GroupNormalization(groups=2), UnitNormalization()):
        layer(h)
        assert layer.get_output_mask_at(0) is embedding.get_output_mask_at(0)
    model = keras.models.Model(tokens, keras.layers.LSTM(3)(LayerNormalization()(h)))
    x = np.array([[3, 2, 0, 0, 0, 0], [3, 2, 5, 5, 5, 5]])
    y = model.predict(x)
    # Masked steps are skipped by the LSTM: the padded row equals the prefix alone.
    short = keras.models.Model(tokens, model.output).predict(x[:, :2])
    np.testing.assert_allclose(y[0], short[0], rtol=1e-5)


@pytest.mark.parametrize('layer', [
    LayerNormalization(axis=[1, 2], epsilon=1e-5, center=False,
                       gamma_regularizer='l2', beta_constraint='non_neg'),
    LayerNormalization(rms_scaling=True),
    GroupNormalization(groups=4, axis=1, scale=False, gamma_initializer='zeros'),
    UnitNormalization(axis=[1, 2]),
])
def test_config_round_trip(layer):
    clone = config_round_trip(layer)
    assert type(clone) is type(layer)


def test_model_fits_saves_and_reloads(tmp_path):
    inp = keras.layers.Input((4, 6))
    h = LayerNormalization(axis=[1, 2])(inp)
    h = GroupNormalization(groups=3)(h)
    h = UnitNormalization()(h)
    out = keras.layers.Dense(2)(keras.layers.Flatten()(h))
    model = keras.models.Model(inp, out)
    rs = np.random.RandomState(0)
    fit_save_reload(model, rs.randn(5, 4, 6).astype('float32'),
                    rs.randn(5, 2).astype('float32'), tmp_path)


@pytest.mark.parametrize('make, error, match', [
    (lambda: LayerNormalization(axis='x'), TypeError, 'axis'),
    (lambda: LayerNormalization(axis=[]), ValueError, 'axis'),
    (lambda: LayerNormalization(axis=[1, 1]), ValueError, 'repeated'),
    (lambda: LayerNormalization(epsilon=-1.0), ValueError, 'epsilon'),
    (lambda: LayerNormalization(center='yes'), TypeError, 'center'),
    (lambda: GroupNormalization(groups=0), ValueError, 'groups'),
    (lambda: GroupNormalization(groups=2.5), TypeError, 'groups'),
    (lambda: GroupNormalization(axis=[1, 2]), TypeError, 'axis'),
    (lambda: UnitNormalization(axis=None), TypeError, 'axis'),
])
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize('layer, shape, match', [
    (LayerNormalization(axis=3), (None, 4, 5), 'out of range'),
    (LayerNormalization(axis=0), (None, 4, 5), 'batch axis'),
    (LayerNormalization(axis=1), (None, None, 5), 'must be known'),
    (GroupNormalization(groups=4), (None, 3, 6), 'multiple of groups'),
    (GroupNormalization(groups=8), (None, 3, 6), 'cannot be more'),
    (GroupNormalization(groups=2), (None, 3, None), 'must be known'),
    (UnitNormalization(axis=[1, -2]), (None, 3, 4), 'twice'),
])
def test_bad_input_shapes(layer, shape, match):
    with pytest.raises(ValueError, match=match):
        layer(keras.layers.Input(batch_shape=shape))


def test_group_norm_with_unknown_lengths():
    x = np.random.RandomState(6).randn(2, 5, 6)
    layer = GroupNormalization(groups=3, dtype='float64')
    ph = K.placeholder(shape=(None, None, 6), dtype='float64')
    out = layer(ph)
    assert K.int_shape(out) == (None, None, 6)
    gamma, beta = _set_random_weights(layer)
    np.testing.assert_allclose(K.function([ph], [out])([x])[0],
                               group_norm_ref(x, 3, -1, 1e-3, gamma, beta), rtol=1e-10)


@pytest.mark.parametrize('center,scale', [(True, True), (False, True), (True, False),
                                          (False, False)])
def test_layer_norm_over_the_last_axis_is_one_op(center, scale):
    # the statistics and the scaling in one kernel pass (ops/normalization.py)
    x = np.random.RandomState(5).randn(3, 4, 6).astype('float32') * 3 + 2
    layer = LayerNormalization(epsilon=1e-3, center=center, scale=scale)
    ph = K.placeholder(shape=(None, 4, 6))
    f = K.function([ph], [layer(ph)])
    weights = _set_random_weights(layer)
    ops = [type(op).__name__ for op in f.plan_ops()]
    assert 'LayerNorm' in ops and 'Reduce' not in ops
    gamma = weights[0] if scale else None
    beta = weights[-1] if center else None
    np.testing.assert_allclose(f([x])[0], layer_norm_ref(x, [2], 1e-3, gamma, beta),
                               rtol=1e-5, atol=1e-5)
    axis_1 = LayerNormalization(axis=1)       # not the last axis: the general graph
    g = K.function([ph], [axis_1(ph)])
    assert 'LayerNorm' not in [type(op).__name__ for op in g.plan_ops()]
