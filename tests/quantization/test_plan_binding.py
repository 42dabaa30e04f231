"""int8 steps in bound plans (graph/binding.py): a quantized convolution,
depthwise convolution or Dense that reads codes runs its remembered kernel
call directly from the second call on, with the plain plan's bits."""
import keras
import numpy as np
import pytest

import cyback
from cyback.graph import binding

K = keras.backend


def _blocks():
    # an inverted residual (its sum read as codes) and a Dense head on codes
    inp = keras.layers.Input((10, 9, 6))
    x = keras.layers.Conv2D(12, 1, activation='relu')(inp)
    x = keras.layers.DepthwiseConv2D(3, padding='same')(x)
    x = keras.layers.ReLU(6.0)(x)
    x = keras.layers.Conv2D(6, 1)(x)
    x = keras.layers.Add()([x, inp])
    x = keras.layers.Conv2D(8, 1, activation='relu')(x)
    x = keras.layers.Dense(5, activation='relu')(x)
    x = keras.layers.Dense(3)(x)
    return keras.models.Model(inp, x)


@pytest.fixture
def quantized():
    rng = np.random.RandomState(0)
    model = _blocks()
    data = rng.standard_normal((16, 10, 9, 6)).astype('float32')
    return cyback.quantize(model, data), data


def _plain(f, x):
    previous = binding.set_enabled(False)
    try:
        return f([x])[0]
    finally:
        binding.set_enabled(previous)


def test_int8_steps_bind_and_keep_the_bits(quantized):
    q, data = quantized
    previous = binding.set_enabled(True)
    try:
        f = K.function(q.inputs, q.outputs)
        for batch in (1, 1, 1, 3, 3, 3, 1):
            x = data[:batch]
            np.testing.assert_array_equal(f([x])[0], _plain(f, x))
        plan = f._plan(0)
        src = plan.binding.source()
    finally:
        binding.set_enabled(previous)
    bound = [line for line in src.splitlines() if ' = K' in line and 'quantized' in line]
    # the convolutions and the Dense layers that read codes, and the
    # depthwise convolution (the first convolution quantizes its float input)
    assert len(bound) >= 4, src
    assert any('quantized_depthwise' in line for line in bound), src
