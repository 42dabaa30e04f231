"""LayerNorm: one op for layer normalization over the last axis, against a NumPy
reference, with its closed-form gradient against finite differences."""
import numpy as np
import pytest

import cyback as K
from cyback.kernels import reduce as kreduce
from cyback.kernels import runtime
from cyback.ops.normalization import LayerNorm, layer_norm

from gradcheck import check_grads
from instruction_sets import instruction_set


def np_layer_norm(x, gamma=None, beta=None, eps=1e-3):
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    y = (x64 - mean) / np.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("shape", [(3, 7), (2, 4, 128), (1, 1), (5, 1), (0, 6), (2, 3, 17)])
@pytest.mark.parametrize("params", ["both", "gamma", "beta", "none"])
def test_kernel_matches_numpy(dtype, tol, shape, params):
    rs = np.random.RandomState(0)
    x = (rs.randn(*shape) * 3 + 10).astype(dtype)      # far from 0: a one-pass variance would lose
    n = shape[-1]
    gamma = rs.uniform(0.5, 1.5, n).astype(dtype) if params in ("both", "gamma") else None
    beta = rs.randn(n).astype(dtype) if params in ("both", "beta") else None
    y = kreduce.layer_norm_last(x, gamma, beta, 1e-3)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_allclose(y, np_layer_norm(x, gamma, beta), rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(3, 7), (2, 4, 128), (1, 8), (5, 1), (2, 3, 17), (4, 100)])
@pytest.mark.parametrize("params", ["both", "gamma", "beta", "none"])
def test_avx2_rows_give_the_baseline_bits(shape, params):
    # include/cyback_layernorm.h: the baseline loop's lanes and roundings
    rs = np.random.RandomState(1)
    x = (rs.randn(*shape) * 30 - 7).astype(np.float32)
    x.flat[::5] = 0.0
    n = shape[-1]
    gamma = rs.uniform(-1.5, 1.5, n).astype(np.float32) if params in ("both", "gamma") else None
    beta = rs.randn(n).astype(np.float32) if params in ("both", "beta") else None
    with instruction_set(kreduce, "baseline"):
        want = kreduce.layer_norm_last(x, gamma, beta, 1e-5)
    with instruction_set(kreduce, "avx2"):
        got = kreduce.layer_norm_last(x, gamma, beta, 1e-5)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, np_layer_norm(x, gamma, beta, 1e-5), rtol=2e-5, atol=2e-5)


def test_kernel_takes_non_contiguous_input_and_gives_the_same_bits_at_any_thread_count():
    rs = np.random.RandomState(1)
    x = rs.randn(300, 2, 130).astype("float32")[:, 1, :]
    assert not x.flags.c_contiguous
    gamma, beta = rs.rand(130).astype("float32"), rs.randn(130).astype("float32")
    runtime.force_team_threads(1)
    try:
        one = kreduce.layer_norm_last(x, gamma, beta, 1e-5)
    finally:
        runtime.force_team_threads(None)
    runtime.force_team_threads(2)
    try:
        two = kreduce.layer_norm_last(x, gamma, beta, 1e-5)
    finally:
        runtime.force_team_threads(None)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, np_layer_norm(x, gamma, beta, 1e-5), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("bad,match", [
    (dict(x=np.zeros((2, 3), "int32")), "float32 or float64"),
    (dict(x=np.float32(1.0)), "rank >= 1"),
    (dict(gamma=np.ones(4, "float32")), "gamma must be a vector of 3"),
    (dict(beta=np.ones((1, 3), "float32")), "beta must be a vector of 3"),
    (dict(eps=-1.0), "epsilon must be >= 0"),
    (dict(eps=float("nan")), "epsilon must be >= 0"),
])
def test_kernel_bad_arguments(bad, match):
    args = dict(x=np.zeros((2, 3), "float32"), gamma=None, beta=None, eps=1e-3)
    args.update(bad)
    with pytest.raises((TypeError, ValueError), match=match):
        kreduce.layer_norm_last(args["x"], args["gamma"], args["beta"], args["eps"])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_op_through_a_function(dtype):
    rs = np.random.RandomState(2)
    x = K.placeholder((None, 4, 6), dtype=dtype)
    gamma = K.variable(rs.uniform(0.5, 1.5, 6), dtype=dtype)
    beta = K.variable(rs.randn(6), dtype=dtype)
    y = layer_norm(x, gamma, beta, 1e-3)
    assert K.int_shape(y) == (None, 4, 6) and K.dtype(y) == dtype
    xv = rs.randn(3, 4, 6).astype(dtype)
    got = K.function([x], [y])([xv])[0]
    assert got.dtype == dtype
    tol = 2e-3 if dtype == "float16" else 2e-5
    np.testing.assert_allclose(got, np_layer_norm(xv, K.get_value(gamma), K.get_value(beta)),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("scale,center", [(True, True), (True, False), (False, True),
                                          (False, False)])
def test_gradients_against_finite_differences(scale, center):
    rs = np.random.RandomState(3)
    x = rs.randn(2, 3, 5) * 2 + 1
    params = [rs.uniform(0.5, 1.5, 5)] * scale + [rs.randn(5)] * center

    def build(xp, *ps):
        return LayerNorm(1e-3, scale, center)(xp, *ps)

    check_grads(build, x, *params, rtol=1e-5, atol=1e-7)


def test_second_derivative_exists():
    rs = np.random.RandomState(4)
    x = rs.randn(2, 4)

    def build(xp):
        y = LayerNorm(1e-3, False, False)(xp)
        return K.gradients(K.sum(y * y * y), [xp])[0]

    check_grads(build, x, rtol=1e-4, atol=1e-6)


def test_op_bad_arguments():
    x = K.placeholder((None, 3))
    with pytest.raises(ValueError, match="vectors of the last axis's length 3"):
        layer_norm(x, K.variable(np.ones(4)))
    with pytest.raises(ValueError, match="expected 2 parameter"):
        LayerNorm(1e-3, True, True)(x, K.variable(np.ones(3)))
    with pytest.raises(TypeError, match="float input"):
        layer_norm(K.placeholder((None, 3), dtype="int32"))
    with pytest.raises(ValueError, match="rank >= 1"):
        layer_norm(K.placeholder(()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("params", ["both", "gamma", "beta", "none"])
def test_prepared_call_gives_the_kernels_bits_and_declines_what_does_not_fit(dtype, params):
    rs = np.random.RandomState(2)
    x = (rs.randn(3, 5, 17) * 4 + 2).astype(dtype)
    gamma = rs.randn(17).astype(dtype) if params in ("both", "gamma") else None
    beta = rs.randn(17).astype(dtype) if params in ("both", "beta") else None
    call = kreduce.layer_norm_call(x.shape, dtype, gamma is not None, beta is not None, 1e-4)
    got = call(x, gamma, beta)
    assert got.dtype == dtype and got.shape == x.shape
    assert got.tobytes() == kreduce.layer_norm_last(x, gamma, beta, 1e-4).tobytes()
    assert call(x[:1], gamma, beta) is None                     # another shape
    assert call(np.asfortranarray(x), gamma, beta) is None      # another layout
    assert call(x.astype(np.float16), gamma, beta) is None      # another dtype
    other = rs.randn(17).astype(dtype)
    assert call(x, None if gamma is not None else other, beta) is None
    assert call(x, gamma, None if beta is not None else other) is None
    if gamma is not None:
        assert call(x, gamma[:16], beta) is None


@pytest.mark.parametrize("args", [((0, 4), np.float32, True, True, 1e-3),
                                  ((2, 4), np.int32, True, True, 1e-3),
                                  ((2, 4), np.float32, True, True, -1.0), ((), np.float32,
                                                                          False, False, 1e-3)])
def test_prepared_call_bad_arguments(args):
    with pytest.raises(ValueError, match="layer_norm_call"):
        kreduce.layer_norm_call(*args)
