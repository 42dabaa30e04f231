"""EinsumDense against np.einsum and tf_keras; weight shapes, gradients, configs,
saving, bad arguments."""
import keras
import numpy as np
import pytest
from scipy.special import erf

from cyback.layers import activations as A
from cyback.layers.einsum_dense import EinsumDense

from .helpers import check_layer_grads, config_round_trip, fit_save_reload

K = keras.backend


def _run(layer, x):
    ph = K.placeholder(shape=(None,) + x.shape[1:], dtype=x.dtype.name)
    out = layer(ph)
    return K.function([ph], [out])([x])[0], out


def _random_weights(layer, seed=0):
    rs = np.random.RandomState(seed)
    values = [rs.randn(*w.shape).astype(K.dtype(w)) for w in layer.weights]
    layer.set_weights(values)
    return values


# equation, output_shape, bias_axes, input shape, kernel shape, bias shape, output shape
CASES = [
    ('abc,cd->abd', (None, 4), 'd', (2, 3, 5), (5, 4), (4,), (2, 3, 4)),
    ('abc,cde->abde', (None, 2, 3), 'de', (2, 3, 5), (5, 2, 3), (2, 3), (2, 3, 2, 3)),
    ('abcd,cde->abe', (3, 6), 'e', (2, 3, 4, 5), (4, 5, 6), (6,), (2, 3, 6)),
    ('ab,bc->ac', 7, None, (3, 4), (4, 7), None, (3, 7)),
    ('abc,cd->abd', (None, 4), 'bd', (2, 3, 5), (5, 4), (3, 4), (2, 3, 4)),
    ('...b,bc->...c', 3, 'c', (2, 4, 5, 6), (6, 3), (3,), (2, 4, 5, 3)),
    ('ab...,bc->ac...', 3, 'c', (2, 4, 5), (4, 3), (3, 1), (2, 3, 5)),
    ('abc,bd->abd', (3, 2), 'd', (2, 3, 4), (3, 2), (2,), (2, 3, 2)),
    ('ab,cd->acd', (3, 2), None, (2, 5), (3, 2), None, (2, 3, 2)),
]


@pytest.mark.parametrize('eq, out_shape, bias, in_shape, k_shape, b_shape, o_shape', CASES)
def test_matches_np_einsum(eq, out_shape, bias, in_shape, k_shape, b_shape, o_shape):
    layer = EinsumDense(eq, out_shape, bias_axes=bias, dtype='float64')
    x = np.random.RandomState(1).randn(*in_shape)
    _, sym = _run(layer, x)
    values = _random_weights(layer)
    assert [w.name.split('/')[-1] for w in layer.weights] == \
        ['kernel'] + (['bias'] if bias else [])
    assert tuple(layer.weights[0].shape) == k_shape
    if bias:
        assert tuple(layer.weights[1].shape) == b_shape
    got, _ = _run(layer, x)
    expected = np.einsum(eq, x, values[0])
    if bias:
        expected = expected + values[1]
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    assert got.shape == o_shape
    assert layer.compute_output_shape((None,) + in_shape[1:]) == (None,) + o_shape[1:]
    assert K.int_shape(sym)[1:] == o_shape[1:]


def test_activation():
    layer = EinsumDense('abc,cd->abd', (None, 3), bias_axes='d', activation=A.gelu,
                        dtype='float64')
    x = np.random.RandomState(2).randn(2, 4, 5)
    _run(layer, x)
    kernel, bias = _random_weights(layer)
    z = np.einsum('abc,cd->abd', x, kernel) + bias
    np.testing.assert_allclose(_run(layer, x)[0], 0.5 * z * (1 + erf(z / np.sqrt(2))),
                               rtol=1e-10)


@pytest.mark.parametrize('case, eq, out_shape, bias', [
    ('einsum_dense', 'abc,cde->abde', (None, 3, 2), 'de'),
    ('einsum_dense_left', '...b,bc->...c', 3, 'c'),
    ('einsum_dense_right', 'ab...,bc->ac...', 3, 'c'),
])
def test_matches_tf_keras(reference, case, eq, out_shape, bias):
    activation = A.gelu if case == 'einsum_dense' else None
    layer = EinsumDense(eq, out_shape, bias_axes=bias, activation=activation, name='ed')
    x = reference[case + '/in0']
    _run(layer, x)
    layer.set_weights([reference['%s/w/%s' % (case, w.name.split('/', 1)[1])]
                       for w in layer.weights])
    np.testing.assert_allclose(_run(layer, x)[0], reference[case + '/out0'], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize('eq, out_shape, bias, in_shape', [
    ('abc,cde->abde', (None, 2, 2), 'de', (2, 3, 3)),
    ('abcd,cde->abe', (2, 3), 'e', (2, 2, 2, 3)),
    ('...b,bc->...c', 2, 'c', (2, 3, 3)),
])
def test_gradients(eq, out_shape, bias, in_shape, one_thread):
    layer = EinsumDense(eq, out_shape, bias_axes=bias, activation=A.swish, dtype='float64')
    layer.build((None,) + in_shape[1:])
    _random_weights(layer)
    check_layer_grads(layer, np.random.RandomState(3).randn(*in_shape))


def test_config_round_trip_and_keras3_keys():
    layer = EinsumDense('abc,cd->abd', output_shape=[None, 4], bias_axes='d',
                        kernel_regularizer='l2', lora_rank=2, lora_alpha=4.0)
    clone = config_round_trip(layer)
    assert clone.get_config()['lora_rank'] == 2
    assert 'lora_rank' not in EinsumDense('ab,bc->ac', 3).get_config()


def test_model_fits_saves_and_reloads(tmp_path):
    inp = keras.layers.Input((3, 4))
    h = EinsumDense('abc,cde->abde', (None, 2, 5), bias_axes='de')(inp)
    out = EinsumDense('abcd,cde->abe', (None, 2), bias_axes='e')(h)
    model = keras.models.Model(inp, out)
    rs = np.random.RandomState(0)
    fit_save_reload(model, rs.randn(4, 3, 4).astype('float32'),
                    rs.randn(4, 3, 2).astype('float32'), tmp_path)


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(equation='abc,cd', output_shape=4), ValueError, 'IN1,IN2->OUT'),
    (dict(equation='abc->abd', output_shape=4), ValueError, 'IN1,IN2->OUT'),
    (dict(equation=3, output_shape=4), TypeError, 'equation'),
    (dict(equation='abc,cd->abx', output_shape=4), ValueError, 'neither operand'),
    (dict(equation='aab,bc->ac', output_shape=4), ValueError, 'repeats'),
    (dict(equation='a1,bc->ac', output_shape=4), ValueError, 'letters'),
    (dict(equation='ab,bc->ac', output_shape=0), ValueError, 'output_shape'),
    (dict(equation='ab,bc->ac', output_shape='4'), TypeError, 'output_shape'),
    (dict(equation='ab,bc->ac', output_shape=4, bias_axes=1), TypeError, 'bias_axes'),
    (dict(equation='ab,bc->ac', output_shape=4, quantization_config={}), ValueError,
     'quantized'),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        EinsumDense(**kwargs)


@pytest.mark.parametrize('eq, out_shape, bias, shape, match', [
    ('abc,cd->abd', (4,), None, (None, 3, 5), 'must give 2 sizes'),
    ('abc,cd->abd', (2, 4), None, (None, 3, 5), 'differ at the shared axis'),
    ('abc,cd->abd', (None, 4), 'x', (None, 3, 5), 'bias axis'),
    ('abc,ce->abd', (None, 4), None, (None, 3, 5), 'neither'),
    ('abc,cd->abd', (None, 4), None, (None, 3, None), 'must be known'),
    ('abc,cd->abd', (None, 4), None, (None, 3), 'ranks'),
])
def test_bad_input_shapes(eq, out_shape, bias, shape, match):
    with pytest.raises(ValueError, match=match):
        EinsumDense(eq, out_shape, bias_axes=bias)(keras.layers.Input(batch_shape=shape))
