"""cyback.ops.quantized_extreme: an int8 1-D convolution and the max / min
over its positions as one step of an inference plan, built from the ops
(tests/quantization/test_conv_extreme_plans.py runs quantized Keras models):
the same bits as the two steps, which stay apart where the join does not
hold; no gradient."""
import numpy as np
import pytest

import cyback as K
from cyback.graph import optimize
from cyback.ops import quantized as qops
from cyback.ops.quantized_extreme import QuantizedConvExtreme


def _conv(x, rng, filters=9, window=(3,), strides=(1,), dilation=(1,), padding="valid"):
    w = rng.integers(-127, 128, window + (x.shape[-1], filters), dtype=np.int8)
    scale = (rng.uniform(1e-3, 1e-2, filters) * np.where(rng.random(filters) < 0.3, -1, 1))
    bias = rng.standard_normal(filters).astype(np.float32)
    op = qops.QuantizedConv(1, filters, window, strides, dilation, padding, 0.03, 77, "relu")
    return op(x, qops.PackInt8()(K.variable(w, dtype="int8")),
              qops.EpilogueVectors(0.03)(K.variable(scale.astype(np.float32)),
                                         K.variable(bias)))


def _both(inputs, outputs, monkeypatch):
    joined = K.function(inputs, outputs)
    with monkeypatch.context() as m:
        m.setattr(optimize, "join_sole_readers", lambda steps, targets: steps)
        apart = K.function(inputs, outputs)
    return joined, apart


def _joined(f):
    return [op for op in f.plan_ops() if isinstance(op, QuantizedConvExtreme)]


@pytest.mark.parametrize("padding,strides", [("valid", 1), ("same", 1), ("causal", 1),
                                             ("valid", 2), ("same", 3)])
@pytest.mark.parametrize("kind,keepdims", [("max", False), ("min", True)])
def test_same_bits_as_the_two_steps(padding, strides, kind, keepdims, rng, monkeypatch):
    x = K.placeholder(shape=(None, 20, 6))
    y = _conv(x, rng, strides=(strides,), padding=padding)
    pooled = (K.max if kind == "max" else K.min)(y, axis=1, keepdims=keepdims)
    joined, apart = _both([x], [pooled], monkeypatch)
    assert len(_joined(joined)) == 1 and not _joined(apart)
    assert _joined(joined)[0].describe().endswith("> %s over positions" % kind)
    xv = (rng.standard_normal((4, 20, 6)) * 2).astype(np.float32)
    for rows in (xv, xv[:1], xv[:0]):
        got, want = joined([rows])[0], apart([rows])[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def test_steps_stay_apart_where_the_join_does_not_hold(rng):
    x = K.placeholder(shape=(None, 20, 6))
    # dilated windows are not rows of the input
    y = _conv(x, rng, dilation=(2,))
    assert not _joined(K.function([x], [K.max(y, axis=1)]))
    # the convolution's output is read elsewhere too (here: an output)
    y = _conv(x, rng)
    assert not _joined(K.function([x], [K.max(y, axis=1), y]))
    # a max over the channels
    assert not _joined(K.function([x], [K.max(y, axis=2)]))
    # a sum over the positions
    assert not _joined(K.function([x], [K.sum(y, axis=1)]))


def test_no_gradient():
    with pytest.raises(TypeError, match="no gradient"):
        QuantizedConvExtreme(None, None).grad([], [], [])
