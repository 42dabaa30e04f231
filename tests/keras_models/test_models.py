"""Keras 2.3.1 on cyback, end to end: every layer family trains, the training
machinery (optimizers, losses, metrics, callbacks, generators, weights)
works, and models survive saving and loading.

Models are tiny and train a handful of full-batch steps: the question is
whether the loss falls, not how far.
"""

import csv
import os

import keras
import numpy as np
import pytest
from keras import backend as K
from keras import layers as L
from keras.models import Model, Sequential

N = 16          # samples per model
EPOCHS = 6      # full-batch steps per fit


def _rng(seed=0):
    return np.random.RandomState(seed)


def _randn(*shape, **kw):
    return _rng(kw.get('seed', 0)).standard_normal(shape).astype('float32')


def _targets_like(model, seed=1):
    shapes = model.output_shape if isinstance(model.output_shape, list) \
        else [model.output_shape]
    ys = [_randn(N, *s[1:], seed=seed + i) for i, s in enumerate(shapes)]
    return ys if len(ys) > 1 else ys[0]


def assert_loss_falls(model, x, y=None, loss='mse', optimizer=None,
                      epochs=EPOCHS, **fit_kwargs):
    """Compile, fit full batch, and check that the training loss fell."""
    if y is None:
        y = _targets_like(model)
    model.compile(optimizer=optimizer or keras.optimizers.Adam(lr=0.01),
                  loss=loss)
    before = model.evaluate(x, y, batch_size=N, verbose=0)
    history = model.fit(x, y, batch_size=N, epochs=epochs, shuffle=False,
                        verbose=0, **fit_kwargs)
    after = model.evaluate(x, y, batch_size=N, verbose=0)
    assert np.isfinite(history.history['loss']).all(), history.history
    assert after < before, (before, after, history.history['loss'])
    return history


def _seq(*layers):
    return Sequential(list(layers))


# --------------------------------------------------------------------------
# Layer families: (id, builder returning (model, x)).

def _x(*shape):
    return _randn(N, *shape, seed=3)


LAYER_CASES = {
    # core
    'dense_activation': lambda: (_seq(
        L.Dense(8, input_shape=(5,)), L.Activation('relu'),
        L.Dense(3, activation='tanh')), _x(5)),
    'dense_3d_input': lambda: (_seq(
        L.Dense(4, activation='sigmoid', input_shape=(3, 5)), L.Flatten(),
        L.Dense(2)), _x(3, 5)),
    'dropout_reshape_permute': lambda: (_seq(
        L.Dense(12, input_shape=(6,)), L.Dropout(0.3), L.Reshape((3, 4)),
        L.Permute((2, 1)), L.Flatten(), L.Dense(2)), _x(6)),
    'repeatvector_lambda': lambda: (_seq(
        L.Dense(4, input_shape=(3,)), L.RepeatVector(3),
        # Keras infers a Lambda's output shape only on tf/cntk: give it.
        L.Lambda(lambda t: K.sum(t, axis=1), output_shape=(4,)),
        L.Dense(2)), _x(3)),
    'activity_regularization': lambda: (_seq(
        L.Dense(4, input_shape=(3,), kernel_regularizer='l2',
                bias_regularizer='l1'),
        L.ActivityRegularization(l1=0.01, l2=0.01), L.Dense(2)), _x(3)),
    'spatial_dropout': lambda: (_seq(
        L.Conv2D(3, 2, input_shape=(5, 5, 2)), L.SpatialDropout2D(0.3),
        L.Reshape((16, 3)), L.SpatialDropout1D(0.2), L.Flatten(),
        L.Dense(2)), _x(5, 5, 2)),
    # convolutions
    'conv1d': lambda: (_seq(
        L.Conv1D(4, 3, strides=2, padding='same', input_shape=(9, 2)),
        L.Conv1D(3, 2, dilation_rate=2, padding='causal'), L.Flatten(),
        L.Dense(2)), _x(9, 2)),
    'conv2d': lambda: (_seq(
        L.Conv2D(4, (3, 2), strides=(2, 1), padding='same', activation='relu',
                 input_shape=(7, 6, 2)),
        L.Conv2D(3, 2, dilation_rate=2), L.Flatten(), L.Dense(2)),
        _x(7, 6, 2)),
    'conv2d_channels_first': lambda: (_seq(
        L.Conv2D(3, 3, data_format='channels_first', input_shape=(2, 6, 5)),
        L.MaxPooling2D(2, data_format='channels_first'), L.Flatten(),
        L.Dense(2)), _x(2, 6, 5)),
    'conv3d': lambda: (_seq(
        L.Conv3D(3, (2, 3, 2), padding='same', input_shape=(4, 5, 4, 2)),
        L.Conv3D(2, 2, strides=2), L.Flatten(), L.Dense(2)), _x(4, 5, 4, 2)),
    'conv2d_transpose': lambda: (_seq(
        L.Conv2DTranspose(3, 3, strides=2, padding='same',
                          input_shape=(3, 4, 2)),
        L.Conv2DTranspose(2, (2, 3), padding='valid'), L.Flatten(),
        L.Dense(2)), _x(3, 4, 2)),
    'conv3d_transpose': lambda: (_seq(
        L.Conv3DTranspose(2, 2, strides=2, input_shape=(2, 3, 2, 2)),
        L.Flatten(), L.Dense(2)), _x(2, 3, 2, 2)),
    'separable_conv1d': lambda: (_seq(
        L.SeparableConv1D(4, 3, depth_multiplier=2, padding='same',
                          input_shape=(8, 3)),
        L.Flatten(), L.Dense(2)), _x(8, 3)),
    'separable_conv2d': lambda: (_seq(
        L.SeparableConv2D(4, 3, depth_multiplier=2, strides=2,
                          input_shape=(7, 7, 3)),
        L.Flatten(), L.Dense(2)), _x(7, 7, 3)),
    'depthwise_conv2d': lambda: (_seq(
        L.DepthwiseConv2D(3, depth_multiplier=2, padding='same',
                          input_shape=(5, 6, 3)),
        L.Flatten(), L.Dense(2)), _x(5, 6, 3)),
    'upsampling': lambda: (_seq(
        L.UpSampling1D(2, input_shape=(3, 2)), L.Reshape((3, 2, 2)),
        L.UpSampling2D((2, 1)), L.UpSampling2D(2, interpolation='bilinear'),
        L.Reshape((6, 4, 2, 2)), L.UpSampling3D((1, 2, 1)), L.Flatten(),
        L.Dense(2)), _x(3, 2)),
    'zeropadding_cropping': lambda: (_seq(
        L.ZeroPadding1D((1, 2), input_shape=(4, 2)), L.Cropping1D((2, 1)),
        L.Reshape((2, 2, 2)), L.ZeroPadding2D(((1, 0), (2, 1))),
        L.Cropping2D(((0, 1), (1, 1))), L.Reshape((1, 2, 3, 2)),
        L.ZeroPadding3D(1), L.Cropping3D(((1, 0), (1, 1), (0, 2))),
        L.Conv3D(2, 1), L.Flatten(), L.Dense(2)), _x(4, 2)),
    # pooling
    'pooling_1d': lambda: (_seq(
        L.Conv1D(3, 2, input_shape=(9, 2)), L.MaxPooling1D(2),
        L.AveragePooling1D(2, strides=1, padding='same'), L.Flatten(),
        L.Dense(2)), _x(9, 2)),
    'pooling_2d': lambda: (_seq(
        L.Conv2D(3, 2, input_shape=(7, 7, 2)),
        L.MaxPooling2D((2, 3), strides=(1, 2), padding='same'),
        L.AveragePooling2D(2), L.Flatten(), L.Dense(2)), _x(7, 7, 2)),
    'pooling_3d': lambda: (_seq(
        L.Conv3D(2, 1, input_shape=(4, 5, 4, 2)), L.MaxPooling3D(2),
        L.AveragePooling3D((1, 2, 2), padding='same'), L.Flatten(),
        L.Dense(2)), _x(4, 5, 4, 2)),
    'global_pooling': lambda: _global_pooling_model(),
    # locally connected
    'locally_connected_1d': lambda: (_seq(
        L.LocallyConnected1D(3, 2, input_shape=(6, 2)), L.Flatten(),
        L.Dense(2)), _x(6, 2)),
    'locally_connected_2d': lambda: (_seq(
        L.LocallyConnected2D(2, (2, 2), strides=(2, 1),
                             input_shape=(5, 4, 2)),
        L.LocallyConnected2D(2, 2), L.Flatten(),
        L.Dense(2)), _x(5, 4, 2)),
    # recurrent
    'simple_rnn': lambda: (_seq(
        L.SimpleRNN(5, return_sequences=True, input_shape=(5, 3)),
        L.SimpleRNN(3, go_backwards=True)), _x(5, 3)),
    'gru': lambda: (_seq(
        L.GRU(5, return_sequences=True, reset_after=True,
              input_shape=(5, 3)),
        L.GRU(3, reset_after=False, go_backwards=True)), _x(5, 3)),
    'lstm': lambda: (_seq(
        L.LSTM(5, return_sequences=True, input_shape=(5, 3)),
        L.LSTM(3, go_backwards=True)), _x(5, 3)),
    'recurrent_dropout': lambda: (_seq(
        L.LSTM(4, dropout=0.2, recurrent_dropout=0.2, return_sequences=True,
               input_shape=(5, 3)),
        L.GRU(3, dropout=0.2, recurrent_dropout=0.2),
        L.Dense(2)), _x(5, 3)),
    'rnn_unroll': lambda: (_seq(
        L.SimpleRNN(4, unroll=True, return_sequences=True,
                    input_shape=(4, 3)),
        L.LSTM(3, unroll=True)), _x(4, 3)),
    'masking': lambda: (_seq(
        L.Masking(0.0, input_shape=(6, 3)),
        L.LSTM(4, return_sequences=True), L.GRU(3)), _masked_x()),
    'return_state': lambda: _return_state_model(),
    'conv_lstm_2d': lambda: (_seq(
        L.ConvLSTM2D(2, (2, 2), padding='same', return_sequences=True,
                     input_shape=(3, 4, 4, 1)),
        L.ConvLSTM2D(2, (2, 2)), L.Flatten(), L.Dense(2)), _x(3, 4, 4, 1)),
    'embedding': lambda: (_seq(
        L.Embedding(10, 4, input_length=5), L.Flatten(), L.Dense(2)),
        _rng(4).randint(0, 10, size=(N, 5)).astype('int32')),
    'embedding_mask_zero': lambda: (_seq(
        L.Embedding(10, 4, mask_zero=True, input_length=5),
        L.SimpleRNN(3)), _padded_ids()),
    'batch_normalization': lambda: (_seq(
        L.Dense(4, input_shape=(3,)), L.BatchNormalization(momentum=0.5),
        L.Reshape((2, 2, 1)), L.Conv2D(2, 1), L.BatchNormalization(axis=-1),
        L.Flatten(), L.Dense(2)), _x(3)),
    'batch_normalization_channels_first': lambda: (_seq(
        L.Conv2D(3, 2, data_format='channels_first', input_shape=(2, 4, 4)),
        L.BatchNormalization(axis=1, center=False, scale=True), L.Flatten(),
        L.Dense(2)), _x(2, 4, 4)),
    'merge': lambda: _merge_model(),
    'noise': lambda: (_seq(
        L.Dense(4, input_shape=(3,)), L.GaussianNoise(0.1),
        L.GaussianDropout(0.2), L.AlphaDropout(0.2), L.Dense(2)), _x(3)),
    'advanced_activations': lambda: (_seq(
        L.Dense(6, input_shape=(3,)), L.LeakyReLU(0.2), L.Dense(6), L.PReLU(),
        L.Dense(6), L.ELU(0.5), L.Dense(6), L.ThresholdedReLU(0.1),
        L.Dense(6), L.ReLU(max_value=6.0, negative_slope=0.1),
        L.Dense(4), L.Softmax()), _x(3)),
    'bidirectional': lambda: _bidirectional_model(),
    'time_distributed': lambda: (_seq(
        L.TimeDistributed(L.Dense(4), input_shape=(5, 3)),
        L.TimeDistributed(L.Dense(2, activation='tanh')), L.Flatten(),
        L.Dense(2)), _x(5, 3)),
    'time_distributed_conv': lambda: (_seq(
        L.TimeDistributed(L.Conv2D(2, 2), input_shape=(3, 4, 4, 1)),
        L.TimeDistributed(L.Flatten()), L.LSTM(2)), _x(3, 4, 4, 1)),
}


def _global_pooling_model():
    a = L.Input((6, 3))
    b = L.Input((5, 4, 3))
    c = L.Input((3, 4, 3, 3))
    feats = [L.GlobalMaxPooling1D()(a), L.GlobalAveragePooling1D()(a),
             L.GlobalMaxPooling2D()(b), L.GlobalAveragePooling2D()(b),
             L.GlobalMaxPooling3D()(c), L.GlobalAveragePooling3D()(c)]
    out = L.Dense(2)(L.Concatenate()(feats))
    return Model([a, b, c], out), [_x(6, 3), _x(5, 4, 3), _x(3, 4, 3, 3)]


def _masked_x():
    x = _x(6, 3)
    for i in range(N):
        x[i, 6 - (i % 4):] = 0.0
    return x


def _padded_ids():
    ids = _rng(5).randint(1, 10, size=(N, 5)).astype('int32')
    for i in range(N):
        ids[i, 5 - (i % 3):] = 0
    return ids


def _return_state_model():
    inp = L.Input((5, 3))
    seq, h, c = L.LSTM(4, return_sequences=True, return_state=True)(inp)
    out_gru, h_gru = L.GRU(4, return_state=True)(seq, initial_state=h)
    out_rnn = L.SimpleRNN(4)(seq, initial_state=[c])
    out = L.Dense(2)(L.Concatenate()([out_gru, h_gru, out_rnn]))
    return Model(inp, out), _x(5, 3)


def _merge_model():
    a, b = L.Input((4,)), L.Input((4,))
    da, db = L.Dense(4)(a), L.Dense(4)(b)
    merged = [L.Add()([da, db]), L.Subtract()([da, db]),
              L.Multiply()([da, db]), L.Average()([da, db]),
              L.Maximum()([da, db]), L.Minimum()([da, db]),
              L.Concatenate(axis=-1)([da, db]),
              L.Dot(axes=1)([da, db]), L.Dot(axes=1, normalize=True)([da, db])]
    out = L.Dense(2)(L.Concatenate()(merged))
    return Model([a, b], out), [_x(4), _randn(N, 4, seed=9)]


def _bidirectional_model():
    inp = L.Input((5, 3))
    outs = [L.Bidirectional(L.LSTM(3, return_sequences=True),
                            merge_mode=mode)(inp)
            for mode in ('concat', 'sum', 'mul', 'ave')]
    seq = L.Concatenate()(outs)
    last = L.Bidirectional(L.GRU(2), merge_mode='concat')(seq)
    return Model(inp, L.Dense(2)(last)), _x(5, 3)


@pytest.mark.parametrize('case', sorted(LAYER_CASES))
def test_layer_family_trains(case):
    model, x = LAYER_CASES[case]()
    assert_loss_falls(model, x)
    y_pred = model.predict(x, batch_size=5)  # batch size that does not divide N
    assert np.isfinite(y_pred).all()
    assert y_pred.shape == (N,) + model.output_shape[1:]


def test_stateful_rnn():
    batch = 4
    model = _seq(L.LSTM(3, stateful=True, batch_input_shape=(batch, 2, 3)),
                 L.Dense(2))
    model.compile('adam', 'mse')
    x = _randn(batch, 2, 3)
    first = model.predict(x, batch_size=batch)
    second = model.predict(x, batch_size=batch)
    assert not np.allclose(first, second)       # state carried over
    model.reset_states()
    np.testing.assert_allclose(model.predict(x, batch_size=batch), first,
                               rtol=1e-6, atol=1e-6)
    y = _randn(batch, 2, seed=2)
    losses = [model.train_on_batch(x, y) for _ in range(5)]
    assert np.isfinite(losses).all()


def test_rnn_masking_ignores_padded_steps():
    model = _seq(L.Masking(0.0, input_shape=(None, 2)), L.SimpleRNN(3))
    x = _randn(2, 5, 2)
    padded = x.copy()
    padded[:, 3:] = 0.0
    cut = model.predict(x[:, :3])
    np.testing.assert_allclose(model.predict(padded), cut, rtol=1e-5,
                               atol=1e-6)


# --------------------------------------------------------------------------
# Functional API

def test_functional_multi_input_multi_output_shared_layers():
    a, b = L.Input((4,), name='a'), L.Input((4,), name='b')
    shared = L.Dense(5, activation='tanh', name='shared')
    ha, hb = shared(a), shared(b)
    out1 = L.Dense(2, name='out1')(L.Concatenate()([ha, hb]))
    out2 = L.Dense(3, activation='softmax', name='out2')(L.Add()([ha, hb]))
    model = Model([a, b], [out1, out2])
    assert len(model.trainable_weights) == 6  # shared kernel+bias once
    xa, xb = _x(4), _randn(N, 4, seed=8)
    y1 = _randn(N, 2, seed=1)
    y2 = keras.utils.to_categorical(_rng(2).randint(0, 3, N), 3)
    model.compile(keras.optimizers.Adam(lr=0.01),
                  loss={'out1': 'mse', 'out2': 'categorical_crossentropy'},
                  loss_weights={'out1': 1.0, 'out2': 0.5},
                  metrics={'out2': ['accuracy']})
    before = model.evaluate({'a': xa, 'b': xb}, {'out1': y1, 'out2': y2},
                            verbose=0)
    assert len(before) == len(model.metrics_names)
    hist = model.fit([xa, xb], [y1, y2], batch_size=N, epochs=EPOCHS,
                     verbose=0)
    assert set(['loss', 'out1_loss', 'out2_loss']) <= set(hist.history)
    after = model.evaluate([xa, xb], [y1, y2], verbose=0)
    assert after[0] < before[0]
    # total loss = out1 + 0.5 * out2
    np.testing.assert_allclose(after[0], after[1] + 0.5 * after[2],
                               rtol=1e-5)
    p1, p2 = model.predict([xa, xb])
    assert p1.shape == (N, 2) and p2.shape == (N, 3)
    np.testing.assert_allclose(p2.sum(axis=1), 1.0, rtol=1e-5)


def test_nested_models_and_layer_reuse():
    inner = _seq(L.Dense(4, activation='relu', input_shape=(3,)), L.Dense(3))
    inp = L.Input((3,))
    out = L.Dense(2)(inner(inner(inp)))
    model = Model(inp, out)
    assert_loss_falls(model, _x(3))


# --------------------------------------------------------------------------
# Optimizers

OPTIMIZERS = {
    'sgd': lambda: keras.optimizers.SGD(lr=0.05),
    'sgd_momentum_nesterov': lambda: keras.optimizers.SGD(
        lr=0.05, momentum=0.9, nesterov=True, decay=1e-3),
    'rmsprop': lambda: keras.optimizers.RMSprop(lr=0.01),
    'adagrad': lambda: keras.optimizers.Adagrad(lr=0.05),
    'adadelta': lambda: keras.optimizers.Adadelta(lr=1.0),
    'adam': lambda: keras.optimizers.Adam(lr=0.01),
    'adam_amsgrad': lambda: keras.optimizers.Adam(lr=0.01, amsgrad=True),
    'adamax': lambda: keras.optimizers.Adamax(lr=0.01),
    'nadam': lambda: keras.optimizers.Nadam(lr=0.01),
    'clipnorm': lambda: keras.optimizers.SGD(lr=0.05, clipnorm=0.5),
    'clipvalue': lambda: keras.optimizers.Adam(lr=0.01, clipvalue=0.1),
}


@pytest.mark.parametrize('name', sorted(OPTIMIZERS))
def test_optimizer_reduces_loss(name):
    model = _seq(L.Dense(6, activation='tanh', input_shape=(4,)), L.Dense(2))
    assert_loss_falls(model, _x(4), optimizer=OPTIMIZERS[name](), epochs=10)


@pytest.mark.parametrize('name', ['sgd', 'rmsprop', 'adagrad', 'adadelta',
                                  'adam', 'adamax', 'nadam'])
def test_optimizer_by_name_and_config_round_trip(name):
    opt = keras.optimizers.get(name)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert type(again) is type(opt)
    assert again.get_config() == opt.get_config()


def test_sgd_step_matches_numpy():
    model = _seq(L.Dense(2, input_shape=(3,)))
    model.compile(keras.optimizers.SGD(lr=0.1), 'mse')
    w, b = model.get_weights()
    x, y = _randn(4, 3), _randn(4, 2, seed=1)
    model.train_on_batch(x, y)
    grad_out = 2.0 * (x.dot(w) + b - y) / y.size
    np.testing.assert_allclose(model.get_weights()[0],
                               w - 0.1 * x.T.dot(grad_out), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(model.get_weights()[1],
                               b - 0.1 * grad_out.sum(axis=0), rtol=1e-5,
                               atol=1e-6)


# --------------------------------------------------------------------------
# Losses and metrics, against NumPy

EPS = 1e-7


def _np_losses():
    clip = lambda p: np.clip(p, EPS, 1 - EPS)  # noqa: E731
    return {
        'mean_squared_error': lambda t, p: np.mean((p - t) ** 2, -1),
        'mean_absolute_error': lambda t, p: np.mean(np.abs(p - t), -1),
        'mean_absolute_percentage_error': lambda t, p: 100. * np.mean(
            np.abs((t - p) / np.clip(np.abs(t), EPS, None)), -1),
        'mean_squared_logarithmic_error': lambda t, p: np.mean(
            (np.log(np.clip(p, EPS, None) + 1)
             - np.log(np.clip(t, EPS, None) + 1)) ** 2, -1),
        'squared_hinge': lambda t, p: np.mean(
            np.maximum(1. - t * p, 0.) ** 2, -1),
        'hinge': lambda t, p: np.mean(np.maximum(1. - t * p, 0.), -1),
        'categorical_hinge': lambda t, p: np.maximum(
            0., np.max((1. - t) * p, -1) - np.sum(t * p, -1) + 1.),
        'logcosh': lambda t, p: np.mean(
            (p - t) + np.log1p(np.exp(-2 * (p - t))) - np.log(2.), -1),
        'categorical_crossentropy': lambda t, p: -np.sum(
            t * np.log(clip(p / p.sum(-1, keepdims=True))), -1),
        'binary_crossentropy': lambda t, p: np.mean(
            -(t * np.log(clip(p)) + (1 - t) * np.log(1 - clip(p))), -1),
        'kullback_leibler_divergence': lambda t, p: np.sum(
            clip(t) * np.log(clip(t) / clip(p)), -1),
        'poisson': lambda t, p: np.mean(p - t * np.log(p + EPS), -1),
        'cosine_proximity': lambda t, p: -np.sum(
            t / np.linalg.norm(t, axis=-1, keepdims=True)
            * p / np.linalg.norm(p, axis=-1, keepdims=True), -1),
    }


@pytest.mark.parametrize('name', sorted(_np_losses()))
def test_loss_matches_numpy(name):
    rng = _rng(7)
    t = rng.uniform(0.05, 1.0, (5, 4)).astype('float32')
    p = rng.uniform(0.05, 1.0, (5, 4)).astype('float32')
    if name in ('categorical_crossentropy', 'categorical_hinge'):
        t = np.eye(4, dtype='float32')[rng.randint(0, 4, 5)]
        p = p / p.sum(-1, keepdims=True)
    if name in ('hinge', 'squared_hinge'):
        t = np.sign(t - 0.5).astype('float32')
    fn = keras.losses.get(name)
    got = K.eval(fn(K.variable(t), K.variable(p)))
    np.testing.assert_allclose(got, _np_losses()[name](t, p), rtol=1e-4,
                               atol=1e-6)


def test_sparse_categorical_crossentropy_matches_numpy():
    rng = _rng(3)
    p = rng.uniform(0.05, 1.0, (6, 5)).astype('float32')
    p /= p.sum(-1, keepdims=True)
    labels = rng.randint(0, 5, 6)
    got = K.eval(keras.losses.sparse_categorical_crossentropy(
        K.variable(labels[:, None].astype('float32')), K.variable(p)))
    np.testing.assert_allclose(got, -np.log(p[np.arange(6), labels]),
                               rtol=1e-5)


def test_accuracy_metrics_match_numpy():
    rng = _rng(4)
    p = rng.uniform(0, 1, (8, 5)).astype('float32')
    labels = rng.randint(0, 5, 8)
    onehot = np.eye(5, dtype='float32')[labels]
    m = keras.metrics
    ev = lambda f, t: K.eval(f(K.variable(t), K.variable(p)))  # noqa: E731
    np.testing.assert_allclose(ev(m.categorical_accuracy, onehot),
                               (p.argmax(-1) == labels).astype('float32'))
    np.testing.assert_allclose(
        ev(m.sparse_categorical_accuracy,
           labels[:, None].astype('float32')).ravel(),
        (p.argmax(-1) == labels).astype('float32'))
    top3 = np.argsort(-p, axis=-1)[:, :3]
    expected = np.array([labels[i] in top3[i] for i in range(8)], 'float32')
    np.testing.assert_allclose(
        ev(lambda t, q: m.top_k_categorical_accuracy(t, q, k=3), onehot),
        expected)
    binary_t = (rng.uniform(0, 1, (8, 5)) > 0.5).astype('float32')
    np.testing.assert_allclose(ev(m.binary_accuracy, binary_t),
                               np.mean(binary_t == (p > 0.5), -1))


def test_metrics_reported_by_fit_and_evaluate():
    model = _seq(L.Dense(3, activation='softmax', input_shape=(4,)))
    labels = _rng(1).randint(0, 3, N)
    y = keras.utils.to_categorical(labels, 3)
    model.compile('adam', 'categorical_crossentropy',
                  metrics=['accuracy', 'mae', keras.metrics.top_k_categorical_accuracy])
    hist = model.fit(_x(4), y, epochs=2, batch_size=N, verbose=0)
    assert {'loss', 'accuracy', 'mae'} <= set(hist.history) or \
        {'loss', 'acc', 'mean_absolute_error'} <= set(hist.history)
    values = model.evaluate(_x(4), y, verbose=0)
    p = model.predict(_x(4))
    acc = np.mean(p.argmax(-1) == labels)
    np.testing.assert_allclose(values[1], acc, rtol=1e-6)


# --------------------------------------------------------------------------
# Callbacks

def _small_model():
    model = _seq(L.Dense(4, activation='tanh', input_shape=(3,)), L.Dense(1))
    model.compile(keras.optimizers.SGD(lr=0.01), 'mse')
    return model, _x(3), _randn(N, 1, seed=1)


def test_early_stopping():
    model, x, y = _small_model()
    stop = keras.callbacks.EarlyStopping(monitor='loss', min_delta=1e3,
                                         patience=2)
    hist = model.fit(x, y, epochs=20, batch_size=N, verbose=0,
                     callbacks=[stop])
    assert len(hist.history['loss']) == 3
    assert stop.stopped_epoch == 2


def test_early_stopping_restore_best_weights():
    model, x, y = _small_model()
    stop = keras.callbacks.EarlyStopping(monitor='val_loss', patience=1,
                                         restore_best_weights=True)
    model.fit(x, y, epochs=5, batch_size=N, verbose=0, callbacks=[stop],
              validation_data=(x, y))
    assert np.isfinite(model.evaluate(x, y, verbose=0))


def test_model_checkpoint(tmp_path):
    model, x, y = _small_model()
    pattern = str(tmp_path / 'ckpt-{epoch:02d}-{loss:.3f}.h5')
    model.fit(x, y, epochs=3, batch_size=N, verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(pattern)])
    files = sorted(os.listdir(str(tmp_path)))
    assert len(files) == 3 and files[0].startswith('ckpt-01-')
    best = str(tmp_path / 'best.h5')
    model.fit(x, y, epochs=3, batch_size=N, verbose=0, validation_data=(x, y),
              callbacks=[keras.callbacks.ModelCheckpoint(
                  best, monitor='val_loss', save_best_only=True)])
    reloaded = keras.models.load_model(best)
    assert np.isfinite(reloaded.predict(x)).all()
    weights_only = str(tmp_path / 'w.h5')
    model.fit(x, y, epochs=1, batch_size=N, verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(
                  weights_only, save_weights_only=True)])
    model.load_weights(weights_only)


def test_reduce_lr_on_plateau():
    model, x, y = _small_model()
    reduce = keras.callbacks.ReduceLROnPlateau(monitor='loss', factor=0.5,
                                               patience=1, min_delta=1e3,
                                               cooldown=0, min_lr=1e-4)
    hist = model.fit(x, y, epochs=4, batch_size=N, verbose=0,
                     callbacks=[reduce])
    assert float(K.get_value(model.optimizer.lr)) < 0.01
    assert 'lr' in hist.history


def test_learning_rate_scheduler():
    model, x, y = _small_model()
    seen = []

    def schedule(epoch, lr=None):
        seen.append(epoch)
        return 0.1 / (epoch + 1)

    model.fit(x, y, epochs=3, batch_size=N, verbose=0,
              callbacks=[keras.callbacks.LearningRateScheduler(schedule)])
    assert seen == [0, 1, 2]
    np.testing.assert_allclose(K.get_value(model.optimizer.lr), 0.1 / 3,
                               rtol=1e-6)


def test_csv_logger(tmp_path):
    model, x, y = _small_model()
    path = str(tmp_path / 'log.csv')
    model.fit(x, y, epochs=3, batch_size=N, verbose=0, validation_split=0.25,
              callbacks=[keras.callbacks.CSVLogger(path)])
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert [int(r['epoch']) for r in rows] == [0, 1, 2]
    assert all(np.isfinite(float(r['loss'])) for r in rows)
    assert 'val_loss' in rows[0]


def test_lambda_callback_and_history():
    model, x, y = _small_model()
    batches = []
    cb = keras.callbacks.LambdaCallback(
        on_batch_end=lambda batch, logs: batches.append(logs['loss']))
    hist = model.fit(x, y, epochs=2, batch_size=4, verbose=0, callbacks=[cb])
    assert len(batches) == 2 * (N // 4)
    assert hist.epoch == [0, 1]


# --------------------------------------------------------------------------
# Data handling: generators, validation split, weights

def test_fit_generator_and_friends():
    model, x, y = _small_model()

    def batches():
        while True:
            for i in range(0, N, 4):
                yield x[i:i + 4], y[i:i + 4]

    before = model.evaluate(x, y, verbose=0)
    model.fit_generator(batches(), steps_per_epoch=N // 4, epochs=4,
                        verbose=0, validation_data=batches(),
                        validation_steps=2)
    assert model.evaluate(x, y, verbose=0) < before
    loss = model.evaluate_generator(batches(), steps=N // 4)
    # Keras 2.3.1's evaluate_generator reports the loss of the last batch
    # (training_generator.py), whatever the backend.
    np.testing.assert_allclose(loss, model.test_on_batch(x[-4:], y[-4:]),
                               rtol=1e-5)
    pred = model.predict_generator((xb for xb, _ in batches()),
                                   steps=N // 4)
    np.testing.assert_allclose(pred, model.predict(x), rtol=1e-5, atol=1e-6)


def test_fit_with_sequence():
    model, x, y = _small_model()

    class Batches(keras.utils.Sequence):
        def __len__(self):
            return N // 4

        def __getitem__(self, i):
            return x[4 * i:4 * i + 4], y[4 * i:4 * i + 4]

    before = model.evaluate(x, y, verbose=0)
    model.fit_generator(Batches(), epochs=4, verbose=0, shuffle=False)
    assert model.evaluate(x, y, verbose=0) < before


def test_validation_split():
    model, x, y = _small_model()
    hist = model.fit(x, y, epochs=2, batch_size=4, validation_split=0.25,
                     verbose=0)
    assert len(hist.history['val_loss']) == 2
    # validation is the last quarter, never trained on: its loss is exactly
    # what evaluate says on those samples after training
    np.testing.assert_allclose(
        hist.history['val_loss'][-1],
        model.evaluate(x[12:], y[12:], batch_size=4, verbose=0), rtol=1e-5)


def test_sample_weights():
    model = _seq(L.Dense(1, input_shape=(3,)))
    model.compile(keras.optimizers.SGD(lr=0.1), 'mse')
    x, y = _x(3), _randn(N, 1, seed=1)
    before = model.get_weights()
    model.train_on_batch(x, y, sample_weight=np.zeros(N))
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    sw = _rng(2).uniform(0.5, 2.0, N).astype('float32')
    per_sample = ((model.predict(x) - y) ** 2).mean(-1)
    np.testing.assert_allclose(
        model.evaluate(x, y, sample_weight=sw, batch_size=N, verbose=0),
        # Keras 2.3.1 reduces weighted losses by sum over batch size
        np.sum(per_sample * sw) / N, rtol=1e-5)
    hist = model.fit(x, y, sample_weight=sw, epochs=3, batch_size=N,
                     verbose=0)
    assert hist.history['loss'][-1] < hist.history['loss'][0]


def test_class_weights():
    model = _seq(L.Dense(2, activation='softmax', input_shape=(3,)))
    model.compile(keras.optimizers.SGD(lr=0.1), 'categorical_crossentropy')
    x = _x(3)
    y = keras.utils.to_categorical(_rng(1).randint(0, 2, N), 2)
    before = model.get_weights()
    model.fit(x, y, class_weight={0: 0.0, 1: 0.0}, epochs=1, batch_size=N,
              verbose=0)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    hist = model.fit(x, y, class_weight={0: 1.0, 1: 3.0}, epochs=3,
                     batch_size=N, verbose=0)
    assert hist.history['loss'][-1] < hist.history['loss'][0]


def test_train_test_predict_on_batch_and_learning_phase():
    model = _seq(L.Dense(8, input_shape=(3,)), L.Dropout(0.5), L.Dense(1))
    model.compile('sgd', 'mse')
    x, y = _x(3), _randn(N, 1, seed=1)
    # test phase: dropout off, so predictions are deterministic
    np.testing.assert_array_equal(model.predict_on_batch(x),
                                  model.predict_on_batch(x))
    np.testing.assert_allclose(model.test_on_batch(x, y),
                               np.mean((model.predict(x) - y) ** 2),
                               rtol=1e-5)
    assert np.isfinite(model.train_on_batch(x, y))


# --------------------------------------------------------------------------
# Saving and loading

def _trained_functional():
    inp = L.Input((5, 3))
    h = L.Conv1D(4, 2, activation='relu')(inp)
    h = L.BatchNormalization()(h)
    h = L.LSTM(3)(h)
    out = L.Dense(2, activation='softmax')(h)
    model = Model(inp, out)
    model.compile(keras.optimizers.Adam(lr=0.01), 'categorical_crossentropy',
                  metrics=['accuracy'])
    x = _x(5, 3)
    y = keras.utils.to_categorical(_rng(1).randint(0, 2, N), 2)
    model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    return model, x, y


def test_save_and_load_model(tmp_path):
    model, x, y = _trained_functional()
    path = str(tmp_path / 'model.h5')
    model.save(path)
    reloaded = keras.models.load_model(path)
    np.testing.assert_array_equal(reloaded.predict(x), model.predict(x))
    # the optimizer state came along: one more identical step on each
    for a, b in zip(reloaded.optimizer.get_weights(),
                    model.optimizer.get_weights()):
        np.testing.assert_array_equal(a, b)
    model.train_on_batch(x, y)
    reloaded.train_on_batch(x, y)
    np.testing.assert_allclose(reloaded.predict(x), model.predict(x),
                               rtol=1e-5, atol=1e-6)


def test_save_and_load_sequential_without_optimizer(tmp_path):
    model = _seq(L.Conv2D(2, 2, input_shape=(4, 4, 1)), L.Flatten(),
                 L.Dense(2))
    path = str(tmp_path / 'model.h5')
    model.save(path, include_optimizer=False)
    reloaded = keras.models.load_model(path, compile=False)
    x = _x(4, 4, 1)
    np.testing.assert_array_equal(reloaded.predict(x), model.predict(x))


def test_save_and_load_weights(tmp_path):
    model, x, _ = _trained_functional()
    path = str(tmp_path / 'weights.h5')
    model.save_weights(path)
    keras.backend.reset_uids()
    other, _, _ = _trained_functional()
    assert not np.array_equal(other.predict(x), model.predict(x))
    other.load_weights(path)
    np.testing.assert_array_equal(other.predict(x), model.predict(x))
    other.load_weights(path, by_name=True)
    np.testing.assert_array_equal(other.predict(x), model.predict(x))


def test_json_and_yaml_round_trip():
    model, x, _ = _trained_functional()
    for text, load in ((model.to_json(), keras.models.model_from_json),
                       (model.to_yaml(), keras.models.model_from_yaml)):
        clone = load(text)
        clone.set_weights(model.get_weights())
        np.testing.assert_array_equal(clone.predict(x), model.predict(x))
    seq = _seq(L.Dense(3, input_shape=(2,)), L.Dense(1))
    clone = keras.models.model_from_json(seq.to_json())
    assert clone.get_config() == seq.get_config()


def test_clone_model():
    model, x, _ = _trained_functional()
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    np.testing.assert_array_equal(clone.predict(x), model.predict(x))


# --------------------------------------------------------------------------
# Determinism

def _train_once(reseed):
    reseed(123)
    keras.backend.reset_uids()
    model = _seq(L.Dense(6, activation='relu', input_shape=(4,)),
                 L.Dropout(0.3), L.Dense(2))
    model.compile(keras.optimizers.Adam(lr=0.01), 'mse')
    model.fit(_x(4), _randn(N, 2, seed=1), batch_size=4, epochs=2,
              shuffle=True, verbose=0)
    return model.get_weights()


def test_fixed_seed_is_deterministic(reseed):
    first = _train_once(reseed)
    second = _train_once(reseed)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------
# Sessions

def test_session_helpers_on_keras_backend():
    # keras/backend/__init__.py re-exports these only for TensorFlow/CNTK;
    # cyback adds them so that user code calling them keeps working.
    for name in ('clear_session', 'get_session', 'set_session',
                 'manual_variable_initialization'):
        assert callable(getattr(K, name))
    v = K.variable(np.ones((2, 2)))
    np.testing.assert_array_equal(K.get_session().run(v * 2), 2 * np.ones((2, 2)))


def test_clear_session_loop_keeps_memory_flat():
    # Every graph object a model built must be freed: count live cyback
    # tensors (bytes would also see CPython's one-off table growth).
    import gc

    from cyback.graph.tensor import Tensor
    x, y = _x(8), _randn(N, 1, seed=3)

    def live_tensors():
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, Tensor))

    def build_and_train():
        K.clear_session()
        model = _seq(L.Dense(16, activation='relu', input_shape=(8,)),
                     L.Dropout(0.1), L.Dense(1))
        model.compile('adam', 'mse')
        model.fit(x, y, epochs=1, verbose=0)
        model.predict(x)

    build_and_train()
    before = live_tensors()
    for _ in range(8):
        build_and_train()
    assert live_tensors() <= before


# --------------------------------------------------------------------------
# A real architecture

def test_mobilenet_from_keras_applications_trains():
    # Depthwise/pointwise convolutions, ReLU(6.), BatchNormalization,
    # ZeroPadding and global pooling together, as keras.applications builds them.
    from keras import applications
    model = applications.MobileNet(weights=None, input_shape=(32, 32, 3), classes=3,
                                   alpha=0.25)
    model.compile(keras.optimizers.Adam(lr=1e-3), 'categorical_crossentropy')
    x = _randn(8, 32, 32, 3, seed=4)
    y = keras.utils.to_categorical(np.arange(8) % 3, 3)
    before = model.evaluate(x, y, verbose=0)
    for _ in range(4):
        model.train_on_batch(x, y)
    p = model.predict(x)
    assert p.shape == (8, 3) and np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    assert model.evaluate(x, y, verbose=0) < before


def test_lambda_infers_its_output_shape():
    # Keras infers a Lambda's output shape only on TensorFlow/CNTK and
    # otherwise assumes the input shape; cyback's compat layer infers it.
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        model = _seq(L.Lambda(lambda x: K.mean(x, axis=1), input_shape=(5, 3)),
                     L.Dense(4, activation='tanh'),
                     L.Lambda(lambda x: K.reshape(x, (-1, 2, 2))), L.Flatten(), L.Dense(1))
        a, b = L.Input((4,)), L.Input((6,))
        joined = L.Lambda(lambda t: K.concatenate([t[0], t[1]]))([a, b])
    assert model.layers[0].output_shape == (None, 3)
    assert model.layers[2].output_shape == (None, 2, 2)
    assert K.int_shape(joined) == (None, 10)
    model.compile('adam', 'mse')
    x, y = _randn(N, 5, 3, seed=2), _randn(N, 1, seed=3)
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=EPOCHS, batch_size=N, verbose=0)
    assert model.evaluate(x, y, verbose=0) < before
