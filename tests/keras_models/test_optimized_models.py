"""Keras 2.3.1 models on cyback with the plan optimizer (BatchNorm folding,
element-wise fusion, frozen weights) against the same models with it off.

Every BatchNormalization gets random statistics (set_weights), so folding it
into the conv / depthwise / dense before it changes the weights for real.
After fit(), set_weights and load_weights the optimized predict function,
built and called before, must see the new weights (its weight-only steps are
cached and refolded by variable version).
"""

import numpy as np
import pytest
from keras import layers as L
from keras.models import Model, Sequential

import cyback
from cyback.ops import depthwise_block

N = 6


@pytest.fixture(autouse=True)
def _optimizer_on(monkeypatch):
    cyback.set_graph_optimizer(True)
    # depthwise blocks joined whatever their size (these models are small)
    monkeypatch.setattr(depthwise_block, "MIN_INTERMEDIATE_BYTES", 0)
    monkeypatch.setattr(depthwise_block, "MIN_ROW_PIXELS", 1)
    yield
    cyback.set_graph_optimizer(True)


def _randomize_batchnorm(model, rng):
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            c = gamma.shape
            layer.set_weights([
                (rng.uniform(0.5, 2.0, c) * rng.choice([-1, 1], c)).astype('float32'),
                rng.standard_normal(c).astype('float32'),
                rng.standard_normal(c).astype('float32'),
                rng.uniform(0.2, 3.0, c).astype('float32')])


def _mlp():
    return Sequential([
        L.Dense(16, input_shape=(7,)), L.BatchNormalization(), L.Activation('relu'),
        L.Dense(8, activation='tanh'), L.Dense(3, activation='softmax')]), (7,)


def _cnn(fmt='channels_last'):
    axis = -1 if fmt == 'channels_last' else 1
    shape = (8, 8, 3) if fmt == 'channels_last' else (3, 8, 8)
    return Sequential([
        L.Conv2D(6, 3, padding='same', data_format=fmt, input_shape=shape),
        L.BatchNormalization(axis=axis), L.ReLU(6.),
        L.MaxPooling2D(2, data_format=fmt),
        L.Conv2D(4, 3, use_bias=False, data_format=fmt),
        L.BatchNormalization(axis=axis), L.ReLU(),
        L.GlobalAveragePooling2D(data_format=fmt), L.Dense(2)]), shape


def _depthwise():
    return Sequential([
        L.DepthwiseConv2D(3, depth_multiplier=2, padding='same', input_shape=(7, 7, 3)),
        L.BatchNormalization(), L.ReLU(6.),
        L.Conv2D(5, 1), L.BatchNormalization(), L.Activation('relu'),
        L.Flatten(), L.Dense(2)]), (7, 7, 3)


def _separable():
    return Sequential([
        L.SeparableConv2D(5, 3, depth_multiplier=2, input_shape=(7, 6, 3)),
        L.BatchNormalization(), L.Activation('relu'),
        L.AveragePooling2D(2), L.Flatten(), L.Dense(2)]), (7, 6, 3)


def _resnet_block():
    x = L.Input((6, 6, 4))
    h = L.Conv2D(4, 3, padding='same')(x)
    h = L.BatchNormalization()(h)
    h = L.Activation('relu')(h)
    h = L.Conv2D(4, 3, padding='same', use_bias=False)(h)
    h = L.BatchNormalization()(h)
    h = L.Add()([h, x])
    h = L.ReLU(6.)(h)
    y = L.Dense(2)(L.GlobalAveragePooling2D()(h))
    return Model(x, y), (6, 6, 4)


def _inverted_residuals():
    # MobileNetV2's blocks: 1x1 expansion, depthwise (strided after a
    # ZeroPadding2D), 1x1 projection, BatchNorm after each, a residual
    x = L.Input((10, 9, 4))
    h = x
    for strides, out in ((1, 4), (2, 6)):
        inp = h
        h = L.Conv2D(16, 1, use_bias=False)(h)
        h = L.ReLU(6.)(L.BatchNormalization()(h))
        if strides == 2:
            h = L.ZeroPadding2D(((0, 1), (0, 1)))(h)
        h = L.DepthwiseConv2D(3, strides=strides, use_bias=False,
                              padding='same' if strides == 1 else 'valid')(h)
        h = L.ReLU(6.)(L.BatchNormalization()(h))
        h = L.BatchNormalization()(L.Conv2D(out, 1, use_bias=False)(h))
        if strides == 1:
            h = L.Add()([inp, h])
    y = L.Dense(2)(L.GlobalAveragePooling2D()(h))
    return Model(x, y), (10, 9, 4)


def _conv1d_lstm():
    return Sequential([
        L.Conv1D(6, 3, padding='causal', input_shape=(9, 2)),
        L.BatchNormalization(), L.Activation('relu'),
        L.LSTM(5), L.Dense(2)]), (9, 2)


def _recurrent(layer, **kw):
    return lambda: (Sequential([layer(5, input_shape=(9, 2), **kw), L.Dense(2)]), (9, 2))


MODELS = {
    'mlp': _mlp,
    'gru': _recurrent(L.GRU, reset_after=True),
    'gru_impl1': _recurrent(L.GRU, implementation=1),
    'gru_v1': _recurrent(L.GRU, implementation=2),
    'gru_masked_v2': lambda: (Sequential([L.Masking(0.5, input_shape=(9, 2)),
                                          L.GRU(5, implementation=2, reset_after=True),
                                          L.Dense(2)]), (9, 2)),
    'gru_backwards': _recurrent(L.GRU, reset_after=True, go_backwards=True),
    'lstm_impl1': _recurrent(L.LSTM, implementation=1),
    'lstm': _recurrent(L.LSTM, implementation=2),
    'lstm_backwards': _recurrent(L.LSTM, go_backwards=True, return_sequences=True),
    'lstm_masked': lambda: (Sequential([L.Masking(0.5, input_shape=(9, 2)),
                                        L.LSTM(5, implementation=2), L.Dense(2)]), (9, 2)),
    'gru_masked': lambda: (Sequential([L.Masking(0.5, input_shape=(9, 2)),
                                       L.GRU(5, implementation=1, reset_after=True),
                                       L.Dense(2)]), (9, 2)),
    'cnn': _cnn,
    'cnn_channels_first': lambda: _cnn('channels_first'),
    'depthwise': _depthwise,
    'separable': _separable,
    'resnet_block': _resnet_block,
    'inverted_residuals': _inverted_residuals,
    'conv1d_lstm': _conv1d_lstm,
}


def _build(name, seed=0):
    model, shape = MODELS[name]()
    rng = np.random.RandomState(seed)
    _randomize_batchnorm(model, rng)
    x = rng.standard_normal((N,) + shape).astype('float32')
    return model, x


def _predict(model, x, optimize):
    cyback.set_graph_optimizer(optimize)
    try:
        return model.predict(x, batch_size=N)
    finally:
        cyback.set_graph_optimizer(True)


def _fresh_unoptimized(model, x):
    """The model's output from a new function built with the optimizer off."""
    cyback.set_graph_optimizer(False)
    try:
        f = cyback.function(model.inputs, model.outputs)
        return f([x])[0]
    finally:
        cyback.set_graph_optimizer(True)


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _predict_steps(model, optimize):
    cyback.set_graph_optimizer(optimize)
    try:
        return [repr(op) for op in model.predict_function.plan_ops(0)]
    finally:
        cyback.set_graph_optimizer(True)


@pytest.mark.parametrize('name', sorted(MODELS))
def test_predict_matches_unoptimized(name):
    model, x = _build(name)
    want = _predict(model, x, False)
    got = _predict(model, x, True)
    _close(got, want)
    _close(_predict(model, x[:1], True), want[:1])
    opt, plain = _predict_steps(model, True), _predict_steps(model, False)
    assert len(opt) < len(plain)
    assert any(s.startswith('Fused') for s in opt) or name == 'inverted_residuals'
    if name == 'inverted_residuals':
        assert any(s.startswith('DepthwiseBlock') for s in opt)


@pytest.mark.parametrize('name', ['mlp', 'cnn', 'resnet_block', 'conv1d_lstm',
                                  'inverted_residuals'])
def test_predict_follows_fit_and_set_weights(name):
    model, x = _build(name, seed=1)
    model.compile(optimizer='sgd', loss='mse')
    before = model.predict(x, batch_size=N)         # caches the frozen weights
    _close(before, _fresh_unoptimized(model, x))
    y = np.random.RandomState(2).standard_normal((N,) + model.output_shape[1:]) \
        .astype('float32')
    model.fit(x, y, batch_size=3, epochs=1, shuffle=False, verbose=0)
    after = model.predict(x, batch_size=N)
    _close(after, _fresh_unoptimized(model, x))
    assert not np.allclose(after, before, rtol=1e-4, atol=1e-4)
    # set_weights on every layer (BatchNorm statistics included)
    _randomize_batchnorm(model, np.random.RandomState(3))
    _close(model.predict(x, batch_size=N), _fresh_unoptimized(model, x))


@pytest.mark.parametrize('name', ['cnn', 'separable'])
def test_predict_follows_load_weights(name, tmp_path):
    model, x = _build(name, seed=4)
    saved = model.predict(x, batch_size=N)
    path = str(tmp_path / 'w.h5')
    model.save_weights(path)
    _randomize_batchnorm(model, np.random.RandomState(5))
    model.layers[0].set_weights([w * -0.5 for w in model.layers[0].get_weights()])
    changed = model.predict(x, batch_size=N)
    assert not np.allclose(changed, saved, rtol=1e-4, atol=1e-4)
    _close(changed, _fresh_unoptimized(model, x))
    model.load_weights(path)
    _close(model.predict(x, batch_size=N), saved)


def _fit_twice(optimize):
    """Losses and weights of a small CNN + BatchNorm trained two epochs with
    the optimizer ``optimize``, from the same seeds."""
    cyback.set_graph_optimizer(optimize)
    try:
        np.random.seed(0)
        cyback.reset_uids()
        model = Sequential([
            L.Conv2D(4, 3, input_shape=(6, 6, 3)), L.BatchNormalization(), L.ReLU(6.),
            L.Flatten(), L.Dense(3, activation='elu'), L.Dense(2, activation='softmax')])
        model.compile(optimizer='adam', loss='categorical_crossentropy')
        rng = np.random.RandomState(1)
        x = rng.standard_normal((8, 6, 6, 3)).astype('float32')
        y = np.eye(2, dtype='float32')[rng.randint(0, 2, 8)]
        history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        fused = [op for op in model.train_function.plan_ops(1)
                 if repr(op).startswith('Fused')]
        return history.history['loss'], model.get_weights(), fused
    finally:
        cyback.set_graph_optimizer(True)


def test_training_is_bit_identical_with_the_optimizer():
    loss_off, weights_off, _ = _fit_twice(False)
    loss_on, weights_on, fused = _fit_twice(True)
    assert fused          # the training plan did get (exact) fusion
    assert loss_on == loss_off
    for a, b in zip(weights_on, weights_off):
        np.testing.assert_array_equal(a, b)


def test_learning_phase_function_with_a_rewrite_after_dropout():
    # A rewrite (BatchNorm folded into the Dense after a Dropout) re-walks
    # the graph; the walk must keep the learning phase the plan was built
    # for, or the Dropout's switch reads an unbound phase (it did).
    import keras.backend as K
    rng = np.random.default_rng(7)
    model = Sequential([L.Dense(8, input_shape=(4,)), L.Dropout(0.5), L.Dense(6),
                        L.BatchNormalization(), L.Dense(2)])
    _randomize_batchnorm(model, rng)
    x = rng.standard_normal((5, 4)).astype('float32')
    f = K.function(model.inputs + [K.learning_phase()], model.outputs)
    got = f([x, 0])[0]
    cyback.set_graph_optimizer(False)
    want = K.function(model.inputs + [K.learning_phase()], model.outputs)([x, 0])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-6)
    assert f([x, 1])[0].shape == (5, 2)


@pytest.mark.parametrize('name', ['gru', 'gru_impl1', 'gru_backwards', 'lstm_impl1',
                                  'gru_masked'])
def test_fused_recurrent_reads_gate_slices_whole(name):
    # The projection hoisted out of the loop and cut back into gates (and a
    # recurrent kernel sliced per gate) reach the fused cell whole: no
    # GetItem step feeds it, no join at each call, the same values.
    model, x = _build(name)
    want = _predict(model, x, False)
    _close(_predict(model, x, True), want)
    ops = model.predict_function.plan_ops(0)
    fused = [op for op in ops if type(op).__name__ == 'FusedRecurrent']
    assert len(fused) == 1
    assert not any('.' in role for role in fused[0].roles), fused[0].roles
    gate_slices = [op for op in ops if type(op).__name__ == 'GetItem'
                   and op.spec[-1][0] == 'slice' and op.spec[-1][1:3] != (None, None)]
    assert not gate_slices, ops
    # the cell also takes its projection in (the test below): the head's
    # product remains (a GRU of implementation 1 with reset_after adds two
    # biases to two gates' projections, the input's then the recurrent one:
    # an inference plan adds the two first, Binary.rewrite, so that
    # projection goes in too)
    products = 1
    # (a head of few columns is a NarrowProduct: the kernel read transposed;
    # a wider float32 one a PackedProduct: the kernel packed in panels)
    assert sum(any(k in repr(op) for k in ('TensorDot', 'NarrowProduct', 'PackedProduct'))
               for op in ops) == products


@pytest.mark.parametrize('name', ['lstm_impl1', 'lstm', 'lstm_backwards', 'lstm_masked',
                                  'conv1d_lstm', 'gru', 'gru_impl1', 'gru_backwards',
                                  'gru_masked_v2', 'gru_v1'])
@pytest.mark.parametrize('batch', [1, 7, 8, 13])
def test_recurrent_layer_projects_its_input_in_its_steps(monkeypatch, name, batch):
    # Inference: the LSTM's or GRU's input projection x @ W + b becomes part
    # of the fused op, which from _PROJECT_MIN_ROWS rows on projects each
    # thread's rows inside its steps (and below it runs the product first):
    # no TensorDot step for it, the same values either way.
    from cyback.kernels import rnn_cell as kernels
    from cyback.ops import rnn_cell as ops
    model, _ = _build(name)
    x = np.random.RandomState(batch).standard_normal((batch, 9, 2)).astype('float32')
    want = _fresh_unoptimized(model, x)
    calls = []
    projected = 'gru_forward_projected' if name.startswith('gru') else 'lstm_forward_projected'
    inside = getattr(kernels, projected)
    monkeypatch.setattr(kernels, projected, lambda *a, **k: calls.append(1) or inside(*a, **k))
    f = cyback.function(model.inputs, model.outputs)
    _close(f([x])[0], want)
    fused = [op for op in f.plan_ops() if type(op).__name__ == 'FusedRecurrent']
    assert len(fused) == 1 and {'x', 'W', 'xb'} <= set(fused[0].roles), fused
    assert 'zx' not in fused[0].roles
    assert bool(calls) == (batch >= ops._PROJECT_MIN_ROWS)
