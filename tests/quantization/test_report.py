"""cyback.quantization.report: per int8 layer, its output error against the
float layer, in the model and on the float layer's own input."""
import keras
import numpy as np
import pytest

import cyback
import cyback.quantization as cq

L = keras.layers


def grid_model(rng):
    """A Dense layer whose weights and inputs lie on the int8 grids (its
    only error is float32 rounding) before one that does not."""
    inp = L.Input((6,), name='x')
    exact = L.Dense(4, name='exact')
    noisy = L.Dense(3, name='noisy')
    model = keras.models.Model(inp, noisy(exact(inp)))
    codes = rng.integers(-127, 128, (6, 4))
    codes[0] = 127                                 # the scale is 1 / 64 per channel
    exact.set_weights([(codes / 64.0).astype(np.float32), np.zeros(4, np.float32)])
    noisy.set_weights([rng.standard_normal((4, 3)).astype(np.float32),
                       rng.standard_normal(3).astype(np.float32)])
    # inputs on a grid of 1/8 from -4 to 27.875 (256 steps: uint8 codes exactly)
    data = (rng.integers(0, 256, (64, 6)) / 8.0 - 4.0).astype(np.float32)
    data[0] = -4.0
    data[1] = 27.875
    return model, data


def test_rows_and_values(rng):
    model, data = grid_model(rng)
    q = cyback.quantize(model, data)
    assert q.get_layer('exact').input_scale == 0.125
    rep = cq.report(model, q, data, batch_size=10)
    assert [r.name for r in rep] == ['exact', 'noisy'] and len(rep) == 2
    assert rep['exact'].class_name == 'QuantizedDense'
    exact, noisy = rep['exact'], rep['noisy']
    assert exact.rel_rms < 1e-6 and exact.isolated_rel_rms < 1e-6
    assert exact.max_abs == exact.isolated_max_abs   # nothing before it
    assert noisy.rel_rms > 1e-4 and noisy.isolated_rel_rms > 1e-4
    # measured against NumPy
    f = keras.models.Model(model.inputs, model.get_layer('noisy').output).predict(data)
    g = q.predict(data)
    assert noisy.max_abs == pytest.approx(np.abs(f.astype(np.float64) - g).max(), rel=1e-6)
    rel = np.sqrt(((g.astype(np.float64) - f) ** 2).sum() / (f.astype(np.float64) ** 2).sum())
    assert noisy.rel_rms == pytest.approx(rel, rel=1e-6)
    text = str(rep)
    assert 'exact' in text and 'noisy' in text and 'isolated rel RMS' in text
    with pytest.raises(KeyError):
        rep['missing']


def test_skip_what_the_report_flags(rng):
    model, data = grid_model(rng)
    q = cyback.quantize(model, data, skip=['noisy'])
    rep = cq.report(model, q, (b for b in np.array_split(data, 3)))
    assert [r.name for r in rep] == ['exact']


def test_bad_arguments(rng):
    model, data = grid_model(rng)
    q = cyback.quantize(model, data)
    with pytest.raises(TypeError, match='float_model'):
        cq.report('model', q, data)
    inp = L.Input((6,))
    other = keras.models.Model(inp, L.Dense(4, name='elsewhere')(inp))
    with pytest.raises(ValueError, match="no layer 'exact'"):
        cq.report(other, q, data)
    with pytest.raises(ValueError, match='no samples'):
        cq.report(model, q, data[:0])
    assert len(cq.report(model, model, data)) == 0
