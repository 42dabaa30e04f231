"""A quantized Keras text CNN (Conv1D + GlobalMaxPooling1D) in inference
plans: the convolution and the max over its positions run as one step
(ops/quantized_extreme.py), the plan's results keeping their bits against the
same plan with the two steps apart, for each padding, stride, batch size and
output kind; the steps stay apart where the join does not hold."""
import pickle

import keras
import numpy as np
import pytest

import cyback
from cyback.graph import optimize
from cyback.ops.quantized_extreme import QuantizedConvExtreme

K = keras.backend


def _text_cnn(padding='valid', strides=1, dilation=1, pooled=None, head=True, filters=12):
    inp = keras.layers.Input((30,), dtype='int32')
    x = keras.layers.Embedding(50, 8)(inp)
    x = keras.layers.Conv1D(filters, 3, strides=strides, padding=padding,
                            dilation_rate=dilation, activation='relu')(x)
    x = (pooled or keras.layers.GlobalMaxPooling1D())(x)
    if head:
        x = keras.layers.Dense(3, activation='softmax')(x)
    return keras.models.Model(inp, x)


def _quantized(model, seed=5):
    rng = np.random.RandomState(seed)
    # a bias and kernel signs that make both the greatest and least sums matter
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv1D):
            w, b = layer.get_weights()
            layer.set_weights([w, rng.normal(0, 0.3, b.shape)])
    data = rng.randint(0, 50, (16, 30)).astype('int32')
    return cyback.quantize(model, data), data


def _functions(q, monkeypatch):
    joined = K.function(q.inputs, q.outputs)
    with monkeypatch.context() as m:
        m.setattr(optimize, 'join_sole_readers', lambda steps, targets: steps)
        apart = K.function(q.inputs, q.outputs)
    return joined, apart


def _joined_steps(f):
    return [op for op in f.plan_ops() if isinstance(op, QuantizedConvExtreme)]


@pytest.mark.parametrize('padding,strides', [('valid', 1), ('same', 1), ('causal', 1),
                                             ('valid', 2), ('same', 3)])
@pytest.mark.parametrize('head', [True, False], ids=['codes', 'float32'])
def test_same_bits_as_the_two_steps(padding, strides, head, monkeypatch):
    # with a Dense after it the pooled output is uint8 codes; as the model's
    # output it is float32
    q, data = _quantized(_text_cnn(padding, strides, head=head))
    joined, apart = _functions(q, monkeypatch)
    assert len(_joined_steps(joined)) == 1 and not _joined_steps(apart)
    for rows in (data, data[:1], data[:3], data[:0]):
        got, want = joined([rows])[0], apart([rows])[0]
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (padding, strides)


def test_a_min_over_positions_and_kept_dims(monkeypatch):
    pooled = keras.layers.Lambda(lambda t: -K.min(t, axis=1, keepdims=True))
    q, data = _quantized(_text_cnn(pooled=pooled, head=False))
    joined, apart = _functions(q, monkeypatch)
    (op,) = _joined_steps(joined)
    assert op.reduce.kind == 'min' and op.describe().endswith('> min over positions')
    got, want = joined([data])[0], apart([data])[0]
    assert got.shape == (16, 1, 12) and got.tobytes() == want.tobytes()


def test_steps_stay_apart_where_the_join_does_not_hold(monkeypatch):
    # a dilated convolution's windows are not rows of its input
    q, data = _quantized(_text_cnn(dilation=2))
    assert not _joined_steps(K.function(q.inputs, q.outputs))
    # the convolution's output read by another layer too
    inp = keras.layers.Input((30,), dtype='int32')
    x = keras.layers.Embedding(50, 8)(inp)
    x = keras.layers.Conv1D(12, 3, activation='relu')(x)
    model = keras.models.Model(inp, [keras.layers.GlobalMaxPooling1D()(x),
                                     keras.layers.GlobalAveragePooling1D()(x)])
    q, data = _quantized(model)
    assert not _joined_steps(K.function(q.inputs, q.outputs))
    # a max over the channels, not the positions
    pooled = keras.layers.Lambda(lambda t: K.max(t, axis=2))
    q, data = _quantized(_text_cnn(pooled=pooled, head=False))
    assert not _joined_steps(K.function(q.inputs, q.outputs))


def test_a_sequence_shorter_than_the_window_raises_as_before(monkeypatch):
    inp = keras.layers.Input((None,), dtype='int32')
    x = keras.layers.Embedding(50, 8)(inp)
    x = keras.layers.Conv1D(6, 5, activation='relu')(x)
    model = keras.models.Model(inp, keras.layers.GlobalMaxPooling1D()(x))
    q, data = _quantized(model)
    joined, apart = _functions(q, monkeypatch)
    assert _joined_steps(joined)
    assert joined([data[:, :9]])[0].tobytes() == apart([data[:, :9]])[0].tobytes()
    with pytest.raises(ValueError, match="larger than the input"):
        apart([data[:, :4]])
    with pytest.raises(ValueError, match="larger than the input"):
        joined([data[:, :4]])


def test_the_function_pickles_after_the_step_ran():
    q, data = _quantized(_text_cnn())
    f = K.function(q.inputs, q.outputs)
    want = f([data])[0]
    (op,) = _joined_steps(f)
    assert '_calls' in vars(op)
    g = pickle.loads(pickle.dumps(f))
    assert g([data])[0].tobytes() == want.tobytes()


def test_no_gradient():
    op = QuantizedConvExtreme(None, None)
    with pytest.raises(TypeError, match="no gradient"):
        op.grad([], [], [])
