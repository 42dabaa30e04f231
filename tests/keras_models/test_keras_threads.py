"""Keras models used from several threads at once: training steps on one
model lose no update (the optimizer's iteration count is exact) and predict
stays correct."""

import keras
import numpy as np
from keras import backend as K
from keras import layers as L
from thread_runner import run_threads


def _model():
    model = keras.models.Sequential([
        L.Dense(32, activation='tanh', input_shape=(8,)),
        L.Dense(32, activation='tanh'),
        L.Dense(1)])
    model.compile('adam', 'mse')
    return model


def test_train_on_batch_from_four_threads_counts_every_step():
    model = _model()
    x = np.random.rand(16, 8).astype('float32')
    y = np.random.rand(16, 1).astype('float32')
    model.train_on_batch(x, y)   # builds the train function once
    start = int(K.get_value(model.optimizer.iterations))
    n = 50
    run_threads(4, lambda i: [model.train_on_batch(x, y) for _ in range(n)])
    assert int(K.get_value(model.optimizer.iterations)) == start + 4 * n
    assert np.isfinite(model.evaluate(x, y, verbose=0))


def test_predict_from_four_threads_is_correct():
    model = _model()
    xs = [np.random.rand(5 + i, 8).astype('float32') for i in range(4)]
    expected = [model.predict(x) for x in xs]
    ok = []

    def work(i):
        for _ in range(30):
            ok.append(np.allclose(model.predict(xs[i]), expected[i], rtol=1e-6))
    run_threads(4, work)
    assert len(ok) == 120 and all(ok)
