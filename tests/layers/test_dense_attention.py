"""Attention and AdditiveAttention against NumPy references and tf_keras: masks,
causal masking, dropout, gradients, configs, saving, bad arguments."""
import keras
import numpy as np
import pytest

from cyback.layers.dense_attention import AdditiveAttention, Attention

from .helpers import check_layer_grads, config_round_trip, fit_save_reload

K = keras.backend


def np_attention(scores, value, q_mask=None, v_mask=None, causal=False):
    hidden = np.zeros_like(scores)
    if v_mask is not None:
        hidden = np.maximum(hidden, 1.0 - v_mask[:, None, :])
    if causal:
        tq, tv = scores.shape[1:]
        hidden = np.maximum(hidden, np.triu(np.ones((tq, tv)), 1)[None])
    s = scores - 1e9 * hidden
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out = w @ value
    if q_mask is not None:
        out = out * q_mask[..., None]
    return out, w


def _placeholders(*arrays):
    return [K.placeholder(shape=(None,) + a.shape[1:], dtype=a.dtype.name) for a in arrays]


RS = np.random.RandomState(0)
Q, V, KEY = RS.randn(2, 3, 4), RS.randn(2, 5, 4), RS.randn(2, 5, 4)
QM = np.array([[1, 1, 0], [1, 1, 1]], 'float64')
VM = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]], 'float64')


@pytest.mark.parametrize('score_mode, use_scale', [('dot', False), ('dot', True),
                                                   ('concat', False), ('concat', True)])
@pytest.mark.parametrize('causal', [False, True])
def test_attention_matches_numpy(score_mode, use_scale, causal):
    layer = Attention(use_scale=use_scale, score_mode=score_mode, dtype='float64')
    phs = _placeholders(Q, V, KEY, QM, VM)
    out = layer(phs[:3], mask=phs[3:], use_causal_mask=causal, return_attention_scores=True)
    weights = [np.array(1.7), np.array(0.6)][:len(layer.weights)]
    layer.set_weights(weights)
    scale = 1.7 if use_scale else 1.0
    if score_mode == 'dot':
        scores = scale * np.einsum('bqd,bvd->bqv', Q, KEY)
    else:
        cw = weights[-1]
        scores = cw * np.tanh(scale * (Q[:, :, None] + KEY[:, None])).sum(-1)
    expected, w = np_attention(scores, V, QM, VM, causal)
    got, got_w = K.function(phs, out)([Q, V, KEY, QM, VM])
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_w, w, rtol=1e-10, atol=1e-12)


def test_additive_attention_matches_numpy():
    layer = AdditiveAttention(dtype='float64')
    phs = _placeholders(Q, V, QM, VM)
    out = layer(phs[:2], mask=phs[2:])
    scale = np.array([0.5, -1.0, 2.0, 0.3])
    layer.set_weights([scale])
    scores = (scale * np.tanh(Q[:, :, None] + V[:, None])).sum(-1)
    np.testing.assert_allclose(K.function(phs, [out])([Q, V, QM, VM])[0],
                               np_attention(scores, V, QM, VM)[0], rtol=1e-10, atol=1e-12)


def _from_reference(reference, case, layer):
    layer.set_weights([reference['%s/w/%s' % (case, w.name.split('/', 1)[1])]
                       for w in layer.weights])


def test_matches_tf_keras(reference):
    q, v = reference['attention_concat/in0'], reference['attention_concat/in1']
    qm, vm = (reference['attention_concat/in%d' % i].astype('float32') for i in (2, 3))
    phs = _placeholders(q, v, qm, vm)
    layer = Attention(use_scale=True, score_mode='concat', name='att')
    out = layer(phs[:2], mask=phs[2:], return_attention_scores=True)
    _from_reference(reference, 'attention_concat', layer)
    got = K.function(phs, out)([q, v, qm, vm])
    np.testing.assert_allclose(got[0], reference['attention_concat/out0'], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(got[1], reference['attention_concat/out1'], rtol=1e-5,
                               atol=1e-6)

    causal = Attention(use_scale=True, name='att')
    out = causal(phs[:2] + [phs[1]], use_causal_mask=True)
    _from_reference(reference, 'attention_causal', causal)
    np.testing.assert_allclose(K.function(phs[:2], [out])([q, v])[0],
                               reference['attention_causal/out0'], rtol=1e-5, atol=1e-6)

    additive = AdditiveAttention(name='att')
    out = additive(phs[:2], mask=phs[2:])
    _from_reference(reference, 'additive_attention', additive)
    np.testing.assert_allclose(K.function(phs, [out])([q, v, qm, vm])[0],
                               reference['additive_attention/out0'], rtol=1e-5, atol=1e-6)


def test_keras_masks_flow_in_and_out():
    q_tokens = keras.layers.Input((None,), dtype='int32')
    v_tokens = keras.layers.Input((None,), dtype='int32')
    embedding = keras.layers.Embedding(8, 4, mask_zero=True)
    layer = Attention()
    out = layer([embedding(q_tokens), embedding(v_tokens)])
    assert layer.get_output_mask_at(0) is embedding.get_output_mask_at(0)
    model = keras.models.Model([q_tokens, v_tokens], out)
    qt, vt = np.array([[1, 2, 0]]), np.array([[3, 4, 5, 0]])
    table = K.get_value(embedding.embeddings).astype('float64')
    scores = np.einsum('bqd,bvd->bqv', table[qt], table[vt])
    expected = np_attention(scores, table[vt], (qt != 0) * 1.0, (vt != 0) * 1.0)[0]
    np.testing.assert_allclose(model.predict([qt, vt]), expected, rtol=1e-5, atol=1e-6)


def test_dropout_only_in_training(fresh_learning_phase):
    layer = Attention(dropout=0.5, dtype='float64')
    phs = _placeholders(Q, V)
    f = K.function(phs + [K.learning_phase()], [layer(phs)])
    scores = np.einsum('bqd,bvd->bqv', Q, V)
    np.testing.assert_allclose(f([Q, V, 0])[0], np_attention(scores, V)[0], rtol=1e-10)
    assert not np.allclose(f([Q, V, 1])[0], np_attention(scores, V)[0])


@pytest.mark.parametrize('make', [lambda: Attention(use_scale=True, score_mode='concat',
                                                    dtype='float64'),
                                  lambda: AdditiveAttention(dtype='float64')])
def test_gradients(make, one_thread):
    layer = make()
    layer.build([(None, 3, 4), (None, 5, 4)])
    layer.set_weights([np.full(w.shape, 0.7) for w in layer.weights])
    check_layer_grads(layer, [Q, V])


@pytest.mark.parametrize('layer', [Attention(use_scale=True, score_mode='concat', dropout=0.1),
                                   AdditiveAttention(use_scale=False, causal=True)])
def test_config_round_trip(layer):
    config_round_trip(layer)


def test_model_fits_saves_and_reloads(tmp_path):
    q = keras.layers.Input((3, 4))
    v = keras.layers.Input((5, 4))
    a = Attention(use_scale=True)([q, v])
    b = AdditiveAttention()([q, v])
    out = keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.add([a, b])))
    model = keras.models.Model([q, v], out)
    rs = np.random.RandomState(1)
    fit_save_reload(model, [rs.randn(4, 3, 4).astype('float32'),
                            rs.randn(4, 5, 4).astype('float32')],
                    rs.randn(4, 1).astype('float32'), tmp_path)


@pytest.mark.parametrize('make, error, match', [
    (lambda: Attention(score_mode='add'), ValueError, 'score_mode'),
    (lambda: Attention(use_scale=1), TypeError, 'use_scale'),
    (lambda: AdditiveAttention(dropout=1.5), ValueError, 'dropout'),
    (lambda: Attention(causal='no'), TypeError, 'causal'),
])
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_inputs():
    q = keras.layers.Input((3, 4))
    with pytest.raises(ValueError, match='query, value'):
        Attention()(q)
    with pytest.raises(ValueError, match='rank 3'):
        Attention()([keras.layers.Input((4,)), keras.layers.Input((4,))])
