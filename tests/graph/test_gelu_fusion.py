"""The exact gelu, 0.5 * x * (1 + erf(x / sqrt(2))), in plans: inference plans
fuse it into one element-wise program (the 'erf' opcode of
cyback/kernels/ewise.pyx); training plans keep erf out of their programs (it
is not NumPy-bit-identical) and stay bit-identical with the optimizer off."""
import math

import numpy as np
import pytest
from scipy import special

import cyback as K
from cyback.ops.elementwise import erf


def gelu(x):
    # cyback.layers' exact gelu, written here: cyback.layers needs Keras, and
    # this test is about the graph (it runs where Keras is not installed)
    return 0.5 * x * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))


@pytest.fixture(autouse=True)
def _optimizer_on():
    K.set_graph_optimizer(True)
    yield
    K.set_graph_optimizer(True)


def _steps(f):
    return [repr(op) for op in f.plan_ops(0)]


def _gelu64(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + special.erf(x / np.sqrt(2)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_inference_gelu_is_one_program(dtype):
    x = K.placeholder((None, 67), dtype=dtype)
    f = K.function([x], [gelu(x)])
    steps = _steps(f)
    assert len(steps) == 1 and steps[0].startswith("Fused(") and "erf" in steps[0], steps
    X = (np.random.default_rng(0).standard_normal((5, 67)) * 3).astype(dtype)
    y = f([X])[0]
    assert y.dtype == dtype
    tol = 1e-6 if dtype == "float32" else 1e-14
    np.testing.assert_allclose(y, _gelu64(X), rtol=tol, atol=tol)
    K.set_graph_optimizer(False)
    np.testing.assert_allclose(f([X])[0], y, rtol=tol, atol=tol)


def _train(optimize):
    K.set_graph_optimizer(optimize)
    try:
        rng = np.random.default_rng(3)
        x = K.placeholder((None, 16))
        w = K.variable(rng.standard_normal((16, 16)).astype("float32") * 0.5)
        loss = K.mean(K.square(gelu(K.dot(x, w))))
        train = K.function([x], [loss], updates=[K.update_sub(w, 0.1 * K.gradients(loss, [w])[0])])
        X = rng.standard_normal((8, 16)).astype("float32")
        losses = [train([X])[0] for _ in range(3)]
        return losses, K.get_value(w), _steps(train)
    finally:
        K.set_graph_optimizer(True)


def test_training_keeps_erf_out_of_programs_and_bits_identical():
    l_off, w_off, _ = _train(False)
    l_on, w_on, steps = _train(True)
    assert not any(s.startswith("Fused(") and "erf" in s for s in steps), steps
    np.testing.assert_array_equal(np.array(l_on), np.array(l_off))
    np.testing.assert_array_equal(w_on, w_off)
