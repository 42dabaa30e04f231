"""The int8 recurrent layers: LSTM, GRU (both reset_after forms) and
SimpleRNN with their input projection in int8 against the float layer run
on the dequantized input and kernel, Keras's RNN options (masking,
return_sequences, return_state, go_backwards, stateful, initial states),
the fused recurrent loop, saving, the report, and the accuracy target of
issue 43 on a generated text set."""
import keras
import numpy as np
import pytest

import cyback
import cyback.quantization as cq
from cyback.graph.function import topo_nodes
from cyback.ops.rnn_cell import FusedRecurrent

L = keras.layers

KINDS = [('LSTM', {}), ('GRU', {}), ('GRU', {'reset_after': True}), ('SimpleRNN', {})]


def ref_codes(x, scale, zero):
    v = np.clip(np.asarray(x, np.float32) / np.float32(scale), np.float32(-zero),
                np.float32(255 - zero))
    return np.rint(v).astype(np.int64) + zero


def dequantized_twin(kind, kw, q_layer, x_shape, **options):
    """The float layer computing what the int8 one does, up to float32
    rounding: its kernel is the int8 codes times their scales."""
    inp = L.Input(batch_shape=x_shape)
    twin = getattr(L, kind)(q_layer.units, **kw, **options)
    model = keras.models.Model(inp, twin(inp))
    codes, scale = q_layer.get_weights()[:2]
    twin.set_weights([codes.astype(np.float32) * scale] + q_layer.get_weights()[2:])
    return model


def dequantized_input(x, layer):
    s, z = layer.input_scale, layer.input_zero_point
    return ((ref_codes(x, s, z) - z) * np.float32(s)).astype(np.float32)


def one_layer(kind, kw, x_shape, **options):
    inp = L.Input(batch_shape=x_shape, name='x')
    out = getattr(L, kind)(5, name='rnn', **kw, **options)(inp)
    return keras.models.Model(inp, out)


@pytest.mark.parametrize('kind,kw', KINDS)
@pytest.mark.parametrize('options', [{}, {'return_sequences': True},
                                     {'go_backwards': True, 'return_sequences': True},
                                     {'unroll': True}])
def test_matches_the_float_layer_on_dequantized_operands(kind, kw, options):
    rs = np.random.RandomState(1)
    x = rs.randn(6, 7, 9).astype(np.float32)
    model = one_layer(kind, kw, (None, 7, 9), **options)
    model.get_layer('rnn').set_weights([w + rs.randn(*w.shape).astype(np.float32) * 0.1
                                        for w in model.get_layer('rnn').get_weights()])
    q = cyback.quantize(model, x)
    layer = q.get_layer('rnn')
    assert type(layer).__name__ == 'Quantized' + kind
    got = q.predict(x)
    twin = dequantized_twin(kind, kw, layer, (None, 7, 9), **options)
    want = twin.predict(dequantized_input(x, layer))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    # and the float model within quantization error
    ref = model.predict(x)
    assert np.abs(got - ref).max() < 0.03 * np.abs(ref).max() + 1e-3


@pytest.mark.parametrize('kind,kw', KINDS)
def test_masking_and_the_fused_loop(kind, kw):
    rs = np.random.RandomState(2)
    tokens = rs.randint(1, 30, size=(8, 10))
    tokens[:4, 6:] = 0
    inp = L.Input((10,), name='tokens')
    h = L.Embedding(30, 6, mask_zero=True, name='embed')(inp)
    out = getattr(L, kind)(5, name='rnn', return_sequences=True, **kw)(h)
    model = keras.models.Model(inp, out)
    q = cyback.quantize(model, tokens)
    assert FusedRecurrent in {type(n.op) for n in topo_nodes([q.output])}
    got = q.predict(tokens)
    # masked steps repeat the last unmasked output, as in the float layer
    np.testing.assert_array_equal(got[:4, 6:], np.repeat(got[:4, 5:6], 4, axis=1))
    embedded = keras.models.Model(inp, h).predict(tokens)
    layer = q.get_layer('rnn')
    twin_in = L.Input((10, 6))
    twin = getattr(L, kind)(5, return_sequences=True, **kw)
    twin_model = keras.models.Model(twin_in, twin(L.Masking(0.0)(twin_in)))
    codes, scale = layer.get_weights()[:2]
    twin.set_weights([codes.astype(np.float32) * scale] + layer.get_weights()[2:])
    deq = dequantized_input(embedded, layer)
    deq[:4, 6:] = 0.0
    np.testing.assert_allclose(got, twin_model.predict(deq), rtol=1e-5, atol=2e-6)


def test_return_state_and_initial_states():
    rs = np.random.RandomState(3)
    x = rs.randn(4, 5, 3).astype(np.float32)
    h0 = rs.randn(4, 6).astype(np.float32)
    c0 = rs.randn(4, 6).astype(np.float32)
    inp, hi, ci = L.Input((5, 3)), L.Input((6,)), L.Input((6,))
    outs = L.LSTM(6, return_state=True, name='rnn')(inp, initial_state=[hi, ci])
    model = keras.models.Model([inp, hi, ci], outs)
    q = cyback.quantize(model, [x, h0, c0])
    got = q.predict([x, h0, c0])
    want = model.predict([x, h0, c0])
    assert len(got) == 3
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert np.abs(g - w).max() < 0.02
    np.testing.assert_array_equal(got[0], got[1])


def test_stateful_carries_the_state_between_calls():
    rs = np.random.RandomState(4)
    x = rs.randn(2, 4, 3).astype(np.float32)
    model = one_layer('GRU', {}, (2, 4, 3), stateful=True)
    q = cyback.quantize(model, x)
    first, second = q.predict(x, batch_size=2), q.predict(x, batch_size=2)
    assert not np.array_equal(first, second)
    q.reset_states()
    np.testing.assert_array_equal(q.predict(x, batch_size=2), first)
    model.reset_states()
    ref_first, ref_second = model.predict(x, batch_size=2), model.predict(x, batch_size=2)
    assert np.abs(second - ref_second).max() < 0.02
    assert np.abs(first - ref_first).max() < 0.02


@pytest.mark.parametrize('kind,kw', KINDS)
def test_saves_loads_and_reports(kind, kw, tmp_path):
    rs = np.random.RandomState(5)
    x = rs.randn(6, 7, 4).astype(np.float32)
    model = one_layer(kind, kw, (None, 7, 4))
    q = cyback.quantize(model, x, activations='int8')
    path = str(tmp_path / 'q.h5')
    q.save(path)
    back = cyback.load_model(path)
    assert type(back.get_layer('rnn')) is type(q.get_layer('rnn'))
    assert back.get_layer('rnn').get_config() == q.get_layer('rnn').get_config()
    np.testing.assert_array_equal(back.predict(x), q.predict(x))
    weights = q.get_layer('rnn').get_weights()
    assert weights[0].dtype == np.int8 and weights[2].dtype == np.float32
    rep = cq.report(model, q, x)
    assert [r.name for r in rep] == ['rnn']
    assert rep['rnn'].rel_rms == rep['rnn'].isolated_rel_rms < 0.02


def test_skip_keeps_the_recurrent_layer_float():
    x = np.random.RandomState(6).randn(4, 5, 3).astype(np.float32)
    model = one_layer('LSTM', {}, (None, 5, 3))
    q = cyback.quantize(model, x, skip=['rnn'])
    assert type(q.get_layer('rnn')) is L.LSTM
    np.testing.assert_array_equal(q.predict(x), model.predict(x))


def test_inference_only():
    x = np.random.RandomState(7).randn(4, 5, 3).astype(np.float32)
    q = cyback.quantize(one_layer('SimpleRNN', {}, (None, 5, 3)), x)
    with pytest.raises(TypeError, match='no gradient'):
        keras.backend.gradients(keras.backend.sum(q.output), q.input)


# ---------------------------------------------------------------- accuracy

def text_set(n, rs, length=12, vocab=24):
    """Sequences of token ids (0: padding, at the end of the shorter ones)
    where tokens 1 and 2 appear once each and token 3 at most once among
    noise tokens 4..vocab-1: class = 2 * (2 comes before 1) + (3 appears),
    which takes the order of the tokens, not just their presence."""
    x = rs.randint(4, vocab, size=(n, length))
    lengths = rs.randint(6, length + 1, size=n)
    y = np.zeros(n, np.int64)
    for i in range(n):
        first, second, third = rs.choice(lengths[i], 3, replace=False)
        x[i, first], x[i, second] = 1, 2
        has3 = rs.rand() < 0.5
        if has3:
            x[i, third] = 3
        x[i, lengths[i]:] = 0
        y[i] = 2 * int(second < first) + int(has3)
    return x, y


@pytest.mark.parametrize('kind', ['LSTM', 'GRU'])
def test_text_model_int8_top1_within_half_a_point(kind):
    x, y = text_set(3000, np.random.RandomState(3))
    x_train, y_train, x_test, y_test = x[:2000], y[:2000], x[2000:], y[2000:]
    keras.backend.reset_uids()
    np.random.seed(3)
    inp = L.Input((12,), name='tokens')
    h = L.Embedding(24, 8, mask_zero=True, name='embed')(inp)
    h = getattr(L, kind)(16, name='rnn')(h)
    out = L.Dense(4, activation='softmax', name='classes')(h)
    model = keras.models.Model(inp, out)
    model.compile(keras.optimizers.Adam(0.01), 'sparse_categorical_crossentropy')
    model.fit(x_train, y_train, batch_size=64, epochs=3, verbose=0)
    float_acc = np.mean(model.predict(x_test, batch_size=256).argmax(1) == y_test)
    assert float_acc > 0.9, 'the float model did not learn the order (%.3f)' % float_acc
    q = cyback.quantize(model, x_train[:256])
    assert type(q.get_layer('rnn')).__name__ == 'Quantized' + kind
    int8_acc = np.mean(q.predict(x_test, batch_size=256).argmax(1) == y_test)
    assert int8_acc >= float_acc - 0.005, (float_acc, int8_acc)
