"""MultiHeadAttention against a NumPy reference and tf_keras / Keras 3 outputs;
masks, dropout, call forms, gradients, configs, saving, bad arguments."""
import keras
import numpy as np
import pytest

import cyback.layers
from cyback.layers import activations as A
from cyback.layers.attention import MultiHeadAttention
from cyback.layers.normalization import LayerNormalization

from .helpers import check_layer_grads, config_round_trip, fit_save_reload

K = keras.backend


def np_softmax(x, axes):
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


def np_mha(w, q, v, k=None, mask=None, use_bias=True):
    """Rank-3 multi-head attention, head by head. ``w``: name -> array."""
    k = v if k is None else k

    def proj(x, name):
        y = np.einsum('btd,dnh->btnh', x, w[name + '/kernel'])
        return y + w[name + '/bias'] if use_bias else y

    qp, kp, vp = proj(q, 'query'), proj(k, 'key'), proj(v, 'value')
    qp = qp / np.sqrt(qp.shape[-1])
    scores = np.einsum('btnh,bsnh->bnts', qp, kp)
    if mask is not None:
        scores = scores + (1.0 - mask[:, None].astype(scores.dtype)) * -1e9
    probs = np_softmax(scores, (-1,))
    ctx = np.einsum('bnts,bsnh->btnh', probs, vp)
    out = np.einsum('btnh,nho->bto', ctx, w['attention_output/kernel'])
    if use_bias:
        out = out + w['attention_output/bias']
    return out, probs


def _weights(layer):
    return {w.name.split('/', 1)[1]: K.get_value(w) for w in layer.weights}


def _set_random(layer, seed=0, scale=0.5):
    rs = np.random.RandomState(seed)
    layer.set_weights([rs.randn(*w.shape).astype(K.dtype(w)) * scale for w in layer.weights])
    return _weights(layer)


def _placeholders(*arrays):
    return [K.placeholder(shape=(None,) + a.shape[1:], dtype=a.dtype.name) for a in arrays]


def test_self_attention_matches_numpy():
    rs = np.random.RandomState(1)
    q = rs.randn(3, 5, 6)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dtype='float64')
    qp, = _placeholders(q)
    out = layer([qp, qp], return_attention_scores=True)
    w = _set_random(layer)
    got, scores = K.function([qp], out)([q])
    expected, probs = np_mha(w, q, q)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(scores, probs, rtol=1e-10, atol=1e-12)
    assert [(n, w[n].shape) for n in w] == [
        ('query/kernel', (6, 2, 4)), ('query/bias', (2, 4)),
        ('key/kernel', (6, 2, 4)), ('key/bias', (2, 4)),
        ('value/kernel', (6, 2, 4)), ('value/bias', (2, 4)),
        ('attention_output/kernel', (2, 4, 6)), ('attention_output/bias', (6,))]


def test_cross_attention_with_key_and_mask_matches_numpy():
    rs = np.random.RandomState(2)
    q, v, k = rs.randn(2, 3, 4), rs.randn(2, 7, 5), rs.randn(2, 7, 3)
    mask = rs.rand(2, 3, 7) > 0.3
    mask[:, :, 0] = True
    layer = MultiHeadAttention(3, 2, use_bias=False, dtype='float64')
    qp, vp, kp, mp = _placeholders(q, v, k, mask)
    out = layer(qp, vp, kp, attention_mask=mp)
    w = _set_random(layer)
    got = K.function([qp, vp, kp, mp], [out])([q, v, k, mask])[0]
    np.testing.assert_allclose(got, np_mha(w, q, v, k, mask, use_bias=False)[0], rtol=1e-10)
    assert list(w) == ['query/kernel', 'key/kernel', 'value/kernel',
                       'attention_output/kernel']


def _from_reference(reference, case, layer):
    layer.set_weights([reference['%s/w/%s' % (case, w.name.split('/', 1)[1])]
                       for w in layer.weights])


def test_matches_tf_keras_causal_and_mask(reference):
    case = 'mha_causal'
    x, pad = reference[case + '/in0'], reference[case + '/in1']
    layer = MultiHeadAttention(num_heads=2, key_dim=3, name='mha')
    xp, mp = _placeholders(x, pad)
    mask = K.expand_dims(K.cast(mp, 'float32'), 1) * K.ones_like(xp[:, :, :1])
    out = layer([xp, xp], attention_mask=mask, use_causal_mask=True,
                return_attention_scores=True)
    _from_reference(reference, case, layer)
    got, scores = K.function([xp, mp], out)([x, pad])
    np.testing.assert_allclose(got, reference[case + '/out0'], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(scores, reference[case + '/out1'], rtol=1e-5, atol=1e-6)


def test_matches_tf_keras_cross(reference):
    case = 'mha_cross'
    arrays = [reference[case + '/in%d' % i] for i in range(3)]
    layer = MultiHeadAttention(num_heads=3, key_dim=2, value_dim=4, use_bias=False,
                               output_shape=(5,), name='mha')
    phs = _placeholders(*arrays)
    out = layer(phs)
    _from_reference(reference, case, layer)
    np.testing.assert_allclose(K.function(phs, [out])(arrays)[0], reference[case + '/out0'],
                               rtol=1e-5, atol=1e-5)


def test_matches_tf_keras_two_attention_axes(reference):
    case = 'mha_axes'
    arrays = [reference[case + '/in%d' % i] for i in range(2)]
    layer = MultiHeadAttention(num_heads=2, key_dim=2, attention_axes=(1, 2), name='mha')
    phs = _placeholders(*arrays)
    out = layer(phs, return_attention_scores=True)
    assert [K.int_shape(t)[1:] for t in out] == [(3, 2, 4), (2, 3, 2, 3, 2)]
    _from_reference(reference, case, layer)
    got = K.function(phs, out)(arrays)
    np.testing.assert_allclose(got[0], reference[case + '/out0'], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], reference[case + '/out1'], rtol=1e-5, atol=1e-6)


def test_matches_keras3_gate_and_sliding_window(reference):
    case = 'mha_k3_gate'
    x = reference[case + '/in0']
    layer = MultiHeadAttention(num_heads=2, key_dim=2, use_gate=True, sliding_window=2,
                               name='mha')
    xp, = _placeholders(x)
    out = layer(xp, xp, return_attention_scores=True)
    assert [w.name for w in layer.weights][4:6] == ['mha/gate/kernel', 'mha/gate/bias']
    _from_reference(reference, case, layer)
    got = K.function([xp], out)([x])
    np.testing.assert_allclose(got[0], reference[case + '/out0'], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], reference[case + '/out1'], rtol=1e-5, atol=1e-6)


def test_keras_masks_of_query_and_value_combine():
    q_tokens = keras.layers.Input((None,), dtype='int32')
    v_tokens = keras.layers.Input((None,), dtype='int32')
    embedding = keras.layers.Embedding(9, 4, mask_zero=True)
    q, v = embedding(q_tokens), embedding(v_tokens)
    layer = MultiHeadAttention(2, 3)
    out = layer([q, v])
    # The output carries the query's mask.
    assert layer.get_output_mask_at(0) is embedding.get_output_mask_at(0)
    model = keras.models.Model([q_tokens, v_tokens], out)
    qt = np.array([[1, 2, 3, 0], [4, 0, 0, 0]])
    vt = np.array([[5, 6, 0, 0, 0], [7, 8, 2, 1, 0]])
    w = _weights(layer)
    table = K.get_value(embedding.embeddings)
    mask = (qt != 0)[:, :, None] & (vt != 0)[:, None, :]
    expected = np_mha(w, table[qt].astype('float64'), table[vt].astype('float64'),
                      mask=mask)[0]
    np.testing.assert_allclose(model.predict([qt, vt]), expected, rtol=1e-4, atol=1e-5)
    # Padding the value further changes no unmasked query step: masked steps get no
    # attention. (A masked query step attends uniformly to every step, as in tf.keras.)
    vt2 = np.concatenate([vt, np.zeros((2, 3), int)], axis=1)
    rows = qt != 0
    np.testing.assert_allclose(model.predict([qt, vt2])[rows], expected[rows], rtol=1e-4,
                               atol=1e-5)


def test_causal_mask_hides_the_future():
    rs = np.random.RandomState(3)
    x = rs.randn(2, 5, 4).astype('float32')
    layer = MultiHeadAttention(2, 2)
    xp, = _placeholders(x)
    f = K.function([xp], [layer(xp, xp, use_causal_mask=True)])
    base = f([x])[0]
    x2 = x.copy()
    x2[:, 3:] += 10.0
    changed = f([x2])[0]
    np.testing.assert_allclose(changed[:, :3], base[:, :3], rtol=1e-5, atol=1e-6)
    assert not np.allclose(changed[:, 3:], base[:, 3:])


def test_dropout_only_in_training(fresh_learning_phase):
    rs = np.random.RandomState(4)
    x = rs.randn(2, 6, 4).astype('float32')
    with_dropout = MultiHeadAttention(2, 3, dropout=0.5)
    xp, = _placeholders(x)
    out = with_dropout(xp, xp)
    plain = MultiHeadAttention(2, 3)
    plain_out = plain(xp, xp)
    plain.set_weights(with_dropout.get_weights())
    phase = K.learning_phase()
    f = K.function([xp, phase], [out, plain_out])
    test_out, reference_out = f([x, 0])
    np.testing.assert_allclose(test_out, reference_out, rtol=1e-6)
    train_a, _ = f([x, 1])
    train_b, _ = f([x, 1])
    assert not np.allclose(train_a, reference_out)
    assert not np.allclose(train_a, train_b)
    # training= fixes the branch whatever the learning phase.
    fixed = K.function([xp, phase], [with_dropout(xp, xp, training=False)])
    np.testing.assert_allclose(fixed([x, 1])[0], reference_out, rtol=1e-6)


def test_attention_mask_keras_tensor_is_saved(tmp_path):
    q = keras.layers.Input((4, 3))
    m = keras.layers.Input((4, 4))
    layer = MultiHeadAttention(2, 2, name='mha')
    out = layer(q, q, attention_mask=m)
    # The mask joined the node's inputs: [query, value, key (= value), mask].
    assert len(layer.get_input_at(0)) == 4
    model = keras.models.Model([q, m], out)
    rs = np.random.RandomState(5)
    x = rs.randn(3, 4, 3).astype('float32')
    mask = np.tril(np.ones((4, 4), 'float32'))[None].repeat(3, 0)
    loaded = fit_save_reload(model, [x, mask], np.zeros((3, 4, 3), 'float32'), tmp_path)
    unmasked = loaded.predict([x, np.ones_like(mask)])
    assert not np.allclose(unmasked, loaded.predict([x, mask]))


def test_call_forms_agree():
    rs = np.random.RandomState(6)
    q, v = rs.randn(2, 3, 4), rs.randn(2, 5, 4)
    layer = MultiHeadAttention(2, 2, dtype='float64')
    qp, vp = _placeholders(q, v)
    outs = [layer(qp, vp), layer([qp, vp]), layer([qp, vp, vp]), layer(query=qp, value=vp),
            layer(qp, vp, key=vp)]
    got = K.function([qp, vp], outs)([q, v])
    for g in got[1:]:
        np.testing.assert_allclose(g, got[0], rtol=1e-12)


def test_gradients(one_thread):
    rs = np.random.RandomState(7)
    q, v = rs.randn(2, 3, 4), rs.randn(2, 2, 3)
    layer = MultiHeadAttention(2, 2, value_dim=3, output_shape=(2,), dtype='float64')
    layer.build([(None, 3, 4), (None, 2, 3)])
    _set_random(layer)
    check_layer_grads(layer, [q, v])


def test_gradients_with_mask_and_two_axes(one_thread):
    rs = np.random.RandomState(8)
    q = rs.randn(1, 2, 2, 3)
    mask = np.array([[[[1, 1], [0, 1]], [[1, 0], [1, 1]]]] * 2, bool).reshape(1, 2, 2, 2, 2)
    layer = MultiHeadAttention(2, 2, attention_axes=[1, 2], dtype='float64')
    layer.build([(None, 2, 2, 3), (None, 2, 2, 3)])
    _set_random(layer)
    check_layer_grads(layer, [q, q, q, mask])


def test_transformer_block_fits_saves_and_reloads(tmp_path):
    tokens = keras.layers.Input((6,), dtype='int32')
    x = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
    attended = MultiHeadAttention(2, 4, dropout=0.1)([x, x])
    x = LayerNormalization(epsilon=1e-6)(keras.layers.add([x, attended]))
    h = keras.layers.Dense(16, activation=A.gelu)(x)
    x = LayerNormalization(epsilon=1e-6)(keras.layers.add([x, keras.layers.Dense(8)(h)]))
    out = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(x))
    model = keras.models.Model(tokens, out)
    rs = np.random.RandomState(9)
    t = rs.randint(1, 20, size=(4, 6))
    t[0, 4:] = 0
    loaded = fit_save_reload(model, t, rs.randn(4, 1).astype('float32'), tmp_path)
    assert type(loaded.layers[2]) is MultiHeadAttention


def test_return_scores_in_a_functional_model():
    q = keras.layers.Input((3, 4))
    out, scores = MultiHeadAttention(2, 5)(q, q, return_attention_scores=True)
    model = keras.models.Model(q, [out, scores])
    assert model.output_shape == [(None, 3, 4), (None, 2, 3, 3)]
    got = model.predict(np.random.RandomState(0).randn(2, 3, 4))
    np.testing.assert_allclose(got[1].sum(-1), 1.0, rtol=1e-5)


def test_config_round_trip():
    layer = MultiHeadAttention(4, 8, value_dim=6, dropout=0.2, use_bias=False,
                               output_shape=[3, 2], attention_axes=2,
                               kernel_regularizer='l2', use_gate=True, sliding_window=3)
    clone = config_round_trip(layer)
    assert clone.attention_axes == (2,)
    # tf.keras configs carry the input shapes; they are accepted.
    built = MultiHeadAttention(2, 2)
    built([keras.layers.Input((3, 4)), keras.layers.Input((5, 6))])
    config = built.get_config()
    assert config['query_shape'] == [None, 3, 4]
    assert MultiHeadAttention.from_config(config).get_config() == config
    assert 'MultiHeadAttention' in cyback.layers.custom_objects()


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(num_heads=0, key_dim=2), ValueError, 'num_heads'),
    (dict(num_heads=2, key_dim='2'), TypeError, 'key_dim'),
    (dict(num_heads=2, key_dim=2, value_dim=0), ValueError, 'value_dim'),
    (dict(num_heads=2, key_dim=2, dropout=1.0), ValueError, 'dropout'),
    (dict(num_heads=2, key_dim=2, dropout=-0.1), ValueError, 'dropout'),
    (dict(num_heads=2, key_dim=2, attention_axes=[]), ValueError, 'attention_axes'),
    (dict(num_heads=2, key_dim=2, attention_axes='1'), TypeError, 'attention_axes'),
    (dict(num_heads=2, key_dim=2, sliding_window=0), ValueError, 'sliding_window'),
    (dict(num_heads=2, key_dim=2, output_shape=[0]), ValueError, 'output_shape'),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiHeadAttention(**kwargs)


@pytest.mark.parametrize('shapes, kwargs, match', [
    ([(None, 4)] * 2, {}, 'rank >= 3'),
    ([(None, 3, 4), (None, 3, 2, 4)], {}, 'same rank'),
    ([(None, 3, 4), (None, 5, 4), (None, 6, 4)], {}, 'agree on every axis'),
    ([(None, 3, None), (None, 5, 4)], {}, 'must be known'),
    ([(None, 3, 4)] * 2, dict(attention_axes=[0]), 'attention_axes'),
    ([(None, 3, 4)] * 2, dict(attention_axes=[2]), 'attention_axes'),
    ([(None, 3, 4)] * 2, dict(attention_axes=[1, -1]), 'repeat'),
    ([(None, 2, 3, 4)] * 2, dict(sliding_window=2), 'rank 3'),
])
def test_bad_input_shapes(shapes, kwargs, match):
    layer = MultiHeadAttention(2, 2, **kwargs)
    with pytest.raises(ValueError, match=match):
        layer([keras.layers.Input(batch_shape=s) for s in shapes])


def test_bad_calls():
    q = keras.layers.Input((3, 4))
    with pytest.raises(ValueError, match='query and a value'):
        MultiHeadAttention(2, 2)(q)
    with pytest.raises(ValueError, match='query and a value'):
        MultiHeadAttention(2, 2)([q])
    with pytest.raises(TypeError, match='use_causal_mask'):
        MultiHeadAttention(2, 2)(q, q, use_causal_mask='yes')
    with pytest.raises(ValueError, match='given twice'):
        MultiHeadAttention(2, 2)([q, q, q, keras.layers.Input((3, 3))],
                                 attention_mask=K.ones((1, 3, 3)))


@pytest.mark.parametrize('use_bias', [True, False])
@pytest.mark.parametrize('shape,axes', [((2, 5, 6), None), ((2, 3, 4, 6), (1, 2)),
                                        ((1, 1, 6), None)])
def test_self_attention_from_one_product_matches_three(use_bias, shape, axes):
    # query is value is key: q, k and v come from one product of the joined kernels
    rs = np.random.RandomState(7)
    x = rs.randn(*shape)
    layer = MultiHeadAttention(num_heads=2, key_dim=3, use_bias=use_bias, attention_axes=axes,
                               dtype='float64')
    xp, other = _placeholders(x, x)
    joined = layer([xp, xp])
    separate = layer([xp, other])            # the same values through three products
    _set_random(layer, seed=3)
    f = K.function([xp, other], [joined, separate])
    got, want = f([x, x])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    grads = K.gradients(K.sum(joined * joined), layer.trainable_weights)
    assert all(g is not None for g in grads)
    values = K.function([xp], grads)([x])
    want_grads = K.function([xp, other], K.gradients(K.sum(separate * separate),
                                                     layer.trainable_weights))([x, x])
    assert len(values) == (8 if use_bias else 4)
    for a, b in zip(values, want_grads):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_self_attention_with_other_value_dim_keeps_three_products():
    rs = np.random.RandomState(8)
    x = rs.randn(2, 4, 5)
    layer = MultiHeadAttention(num_heads=2, key_dim=3, value_dim=2, dtype='float64')
    xp, = _placeholders(x)
    out = layer([xp, xp])
    w = _set_random(layer, seed=4)
    got = K.function([xp], [out])([x])[0]
    np.testing.assert_allclose(got, np_mha_general(w, x), rtol=1e-10, atol=1e-12)


def np_mha_general(w, x):
    def proj(name):
        return np.einsum('btd,dnh->btnh', x, w[name + '/kernel']) + w[name + '/bias']
    q, k, v = proj('query') / np.sqrt(w['query/kernel'].shape[-1]), proj('key'), proj('value')
    probs = np_softmax(np.einsum('btnh,bsnh->bnts', q, k), (-1,))
    ctx = np.einsum('bnts,bsnh->btnh', probs, v)
    return np.einsum('btnh,nho->bto', ctx, w['attention_output/kernel']) + \
        w['attention_output/bias']


@pytest.mark.parametrize('masked', [False, True])
def test_inference_runs_one_fused_attention_that_matches_the_training_ops(
        fresh_learning_phase, masked):
    rs = np.random.RandomState(11)
    q = rs.randn(3, 5, 6).astype('float32')
    v = rs.randn(3, 4, 6).astype('float32')
    mask = rs.rand(3, 5, 4) > 0.3
    mask[:, :, 0] = True
    layer = MultiHeadAttention(3, 2, value_dim=4)
    qp, vp = _placeholders(q, v)
    mp = K.placeholder(shape=(None, 5, 4), dtype='bool')
    out = layer(qp, vp, attention_mask=mp if masked else None)
    w = _set_random(layer)
    phase = K.learning_phase()
    inputs = [qp, vp] + ([mp] if masked else [])
    f = K.function(inputs + [phase], [out])
    feed = [q, v] + ([mask] if masked else [])
    fused, separate = f(feed + [0])[0], f(feed + [1])[0]
    expected, _ = np_mha(w, q.astype('float64'), v.astype('float64'),
                         mask=mask if masked else None)
    np.testing.assert_allclose(fused, expected, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(fused, separate, rtol=2e-5, atol=2e-6)
    ops = [type(op).__name__ for op in f.plan_ops(0)]
    assert ops.count('Attention') == 1 and 'Softmax' not in ops
    assert 'Attention' not in [type(op).__name__ for op in f.plan_ops(1)]


def test_scores_returned_keep_the_separate_ops():
    rs = np.random.RandomState(12)
    x = rs.randn(2, 4, 6).astype('float32')
    layer = MultiHeadAttention(2, 3)
    xp, = _placeholders(x)
    out, scores = layer(xp, xp, return_attention_scores=True)
    f = K.function([xp], [out, scores])
    got_out, got_scores = f([x])
    assert 'Attention' not in [type(op).__name__ for op in f.plan_ops(0)]
    np.testing.assert_allclose(got_scores.sum(-1), 1, rtol=1e-5)
