"""Residual sums whose residual another int8 layer makes as codes read those
codes (ops/quantized.py, ``_Quantized.quantized_residual``): the epilogue adds
(code - zero) * scale, and the layer that made them need not write float32."""
import numpy as np
import pytest

import cyback
import cyback as K
from cyback.ops import quantized as qops

from .test_plan_chaining import _compiled, _labels, _quantized


def _run(q, data, on, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(qops._Quantized, 'quantized_residual', on)
        return _compiled(q, data)


@pytest.mark.parametrize('name', ['two_blocks'])
def test_residuals_read_as_codes_stay_close_to_float_residuals(name, monkeypatch):
    model, q, data = _quantized(name)
    f_on, got = _run(q, data, True, monkeypatch)
    f_off, want = _run(q, data, False, monkeypatch)
    on, off = _labels(f_on), _labels(f_off)
    assert any('+ residual codes' in label for label in on), on
    assert not any('residual codes' in label for label in off), off
    # fewer float32 outputs written beside the codes
    assert sum('float32 and uint8 out' in label for label in on) < \
        sum('float32 and uint8 out' in label for label in off), (on, off)
    reference = model.predict(data)
    reference = reference[0] if isinstance(reference, list) else reference
    scale = np.max(np.abs(reference))
    err_on = np.max(np.abs(got - reference)) / scale
    err_off = np.max(np.abs(want - reference)) / scale
    # the residual's quantization adds an error of the order of the codes' step
    assert err_on < 0.08 and err_on < 3 * err_off + 0.01, (err_on, err_off)
    assert not np.array_equal(got, want)     # the residual really is quantized


def test_the_codes_residual_is_the_dequantized_codes(monkeypatch):
    # one residual block: its sum is conv(x) + (codes - zero) * scale, where
    # the codes are the ones the block's first layer made of its input
    inp = K.placeholder((None, 6, 6, 8))
    rng = np.random.RandomState(3)
    import keras
    x_in = keras.layers.Input((6, 6, 8))
    a = keras.layers.Conv2D(8, 1, activation='relu')(x_in)
    b = keras.layers.Conv2D(8, 3, padding='same')(a)
    out = keras.layers.Conv2D(8, 1)(keras.layers.ReLU()(keras.layers.Add()([a, b])))
    model = keras.models.Model(x_in, out)
    for w in model.weights:
        K.set_value(w, rng.standard_normal(K.int_shape(w)).astype('float32') * 0.3)
    data = rng.standard_normal((16, 6, 6, 8)).astype('float32')
    q = cyback.quantize(model, data)
    f, got = _run(q, data, True, monkeypatch)
    labels = _labels(f)
    assert any('+ residual codes relu' in label for label in labels), labels
    # the first layer's float32 output has no reader left: codes only
    assert labels[0].endswith('(uint8 out)'), labels
    _, want = _run(q, data, False, monkeypatch)
    assert np.max(np.abs(got - want)) < 0.1 * np.max(np.abs(want))
    del inp


def test_an_empty_batch_and_one_row(monkeypatch):
    model, q, data = _quantized('bottleneck')
    f, whole = _run(q, data, True, monkeypatch)
    assert f([data[:0]])[0].shape == (0,) + whole.shape[1:]
    np.testing.assert_array_equal(f([data[:1]])[0], whole[:1])
