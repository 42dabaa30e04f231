"""A Keras Bidirectional RNN's two directions run side by side in predict
(graph/concurrent.py): the same bits as one after the other, on any thread
count."""
import keras
import numpy as np
import pytest

import cyback as K
from cyback.graph import concurrent
from cyback.kernels import runtime

L = keras.layers


def _model(layer, merge_mode, masking):
    inp = L.Input((7, 3))
    x = L.Masking(0.0)(inp) if masking else inp
    y = L.Bidirectional(layer, merge_mode=merge_mode)(x)
    return keras.models.Model(inp, y)


@pytest.fixture
def threads():
    before = runtime.get_max_threads()
    yield runtime.set_num_threads
    runtime.set_num_threads(before)


@pytest.mark.parametrize("layer,merge_mode,masking", [
    (lambda: L.LSTM(5), "concat", False),
    (lambda: L.LSTM(4, return_sequences=True), "sum", True),
    (lambda: L.GRU(4, reset_after=True), "ave", False),
    (lambda: L.GRU(3, return_sequences=True, implementation=1), "mul", True),
    (lambda: L.SimpleRNN(4), "concat", False),
])
def test_directions_side_by_side(layer, merge_mode, masking, threads, monkeypatch):
    model = _model(layer(), merge_mode, masking)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 7, 3)).astype("float32")
    x[1, 5:] = 0.0          # a masked tail
    side = K.function(model.inputs, model.outputs)
    assert any(isinstance(op, concurrent.Concurrent) for op in side.plan_ops())
    monkeypatch.setattr(concurrent, "run_side_by_side", lambda steps: steps)
    in_turn = K.function(model.inputs, model.outputs)
    assert not any(isinstance(op, concurrent.Concurrent) for op in in_turn.plan_ops())
    want = {len(b): in_turn([b])[0] for b in (x, x[:1])}
    for n in (1, 2, 3):
        threads(n)
        for batch in (x, x[:1]):
            assert np.array_equal(side([batch])[0], want[len(batch)])
    np.testing.assert_allclose(model.predict(x), want[3], rtol=1e-6, atol=1e-6)
