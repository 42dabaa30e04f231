"""The accuracy target of issue 43: a CNN trained here on scikit-learn's
digits keeps its top-1 accuracy within 0.5 points in int8, with each
calibration method."""
import keras
import numpy as np
import pytest

import cyback
import cyback.quantization as cq

L = keras.layers

datasets = pytest.importorskip('sklearn.datasets')


@pytest.fixture(scope='module')
def digits_cnn():
    digits = datasets.load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    order = np.random.RandomState(7).permutation(len(y))
    x, y = x[order], y[order]
    x_train, y_train, x_test, y_test = x[:1100], y[:1100], x[1100:], y[1100:]
    keras.backend.reset_uids()
    np.random.seed(7)
    inp = L.Input((8, 8, 1), name='digit')
    h = L.Conv2D(16, 3, padding='same', activation='relu', name='conv1')(inp)
    h = L.Conv2D(32, 3, activation='relu', name='conv2')(h)
    h = L.MaxPooling2D(name='pool')(h)
    h = L.Flatten(name='flat')(h)
    h = L.Dense(64, activation='relu', name='fc')(h)
    out = L.Dense(10, activation='softmax', name='classes')(h)
    model = keras.models.Model(inp, out)
    model.compile(keras.optimizers.Adam(0.003), 'sparse_categorical_crossentropy')
    model.fit(x_train, y_train, batch_size=32, epochs=12, verbose=0)
    return model, x_train, x_test, y_test


def accuracy(model, x, y):
    return float(np.mean(model.predict(x, batch_size=128).argmax(axis=1) == y))


@pytest.mark.parametrize('method', ['minmax', 'percentile', 'entropy'])
def test_int8_top1_within_half_a_point(digits_cnn, method):
    model, x_train, x_test, y_test = digits_cnn
    float_acc = accuracy(model, x_test, y_test)
    assert float_acc > 0.93, 'the float model did not train (%.3f)' % float_acc
    q = cyback.quantize(model, x_train[:300], method=method)
    assert [type(layer).__name__ for layer in q.layers if 'Quantized' in type(layer).__name__] \
        == ['QuantizedConv2D', 'QuantizedConv2D', 'QuantizedDense', 'QuantizedDense']
    int8_acc = accuracy(q, x_test, y_test)
    assert int8_acc >= float_acc - 0.005, (method, float_acc, int8_acc)
    rep = cq.report(model, q, x_test[:200])
    assert all(r.rel_rms < 0.1 for r in rep), str(rep)
