"""cyback.kernels.linalg: the OpenMP-split GEMM and the batched GEMM."""
import numpy as np
import pytest

from cyback.kernels import runtime
from cyback.kernels.linalg import batch_gemm, matmul

SHAPES = [(1, 300, 70), (70, 300, 1), (51, 25, 129), (5, 3, 2), (1, 1, 1), (0, 3, 4),
          (3, 0, 4), (4, 3, 0)]


def _layouts(rng, shape, dtype):
    base = rng.standard_normal(shape).astype(dtype)
    yield base
    yield np.asfortranarray(base)                       # a transposed buffer
    wide = rng.standard_normal((shape[0], 2 * shape[1])).astype(dtype)
    strided = wide[:, ::2]
    strided[...] = base
    yield strided                                       # neither layout: copied


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_matches_numpy(m, k, n, dtype, rng):
    tol = 1e-4 if dtype == "float32" else 1e-10
    for a in _layouts(rng, (m, k), dtype):
        for b in _layouts(rng, (k, n), dtype):
            out = matmul(a, b)
            assert out.dtype == dtype and out.shape == (m, n)
            np.testing.assert_allclose(out, np.asarray(a, np.float64) @ np.asarray(b, np.float64),
                                       rtol=tol, atol=tol)


@pytest.mark.parametrize("m,k,n", SHAPES + [(700, 64, 512)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_with_bias_matches_numpy(m, k, n, dtype, rng):
    # The bias starts the accumulator (k == 0: the result is the bias).
    tol = 1e-4 if dtype == "float32" else 1e-10
    bias = rng.standard_normal(n).astype(dtype)
    for a in _layouts(rng, (m, k), dtype):
        b = rng.standard_normal((k, n)).astype(dtype)
        out = matmul(a, b, bias)
        assert out.dtype == dtype and out.shape == (m, n)
        want = np.asarray(a, np.float64) @ np.asarray(b, np.float64) + bias
        np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("bias", [np.ones(3), np.ones((1, 2)), np.ones(2, "float32")])
def test_matmul_bad_bias(bias):
    with pytest.raises(ValueError, match="matmul: bias"):
        matmul(np.ones((2, 3)), np.ones((3, 2)), bias)


def test_matmul_same_result_for_1_and_2_threads(rng):
    a = rng.standard_normal((97, 64)).astype("float32")
    b = rng.standard_normal((64, 33)).astype("float32")
    wide = rng.standard_normal((1, 64)).astype("float32")
    n0 = runtime.get_max_threads()
    try:
        runtime.set_num_threads(1)
        one = matmul(a, b), matmul(wide, b)
        runtime.set_num_threads(2)
        two = matmul(a, b), matmul(wide, b)
    finally:
        runtime.set_num_threads(n0)
    for x, y in zip(one, two):
        np.testing.assert_array_equal(x, y)


def test_matmul_read_only_input(rng):
    a = rng.standard_normal((4, 3))
    a.setflags(write=False)
    np.testing.assert_allclose(matmul(a, a.T), a @ a.T)


@pytest.mark.parametrize("bad,err", [
    ((np.ones((2, 3)), np.ones((4, 2))), ValueError),
    ((np.ones(3), np.ones((3, 2))), ValueError),
    ((np.ones((2, 3), "float32"), np.ones((3, 2))), TypeError),
    ((np.ones((2, 3), "int32"), np.ones((3, 2), "int32")), TypeError),
])
def test_matmul_bad_arguments(bad, err):
    with pytest.raises(err, match="matmul"):
        matmul(*bad)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("nb,m,k,n", [(3, 4, 5, 6), (2, 300, 300, 300), (1, 1, 7, 1), (0, 2, 2, 2)])
def test_batch_gemm_matches_numpy(ta, tb, nb, m, k, n, rng):
    a = rng.standard_normal((nb, k, m) if ta else (nb, m, k))
    b = rng.standard_normal((nb, n, k) if tb else (nb, k, n))
    ref = np.matmul(a.transpose(0, 2, 1) if ta else a, b.transpose(0, 2, 1) if tb else b)
    np.testing.assert_allclose(batch_gemm(a, b, ta, tb), ref, rtol=1e-10, atol=1e-10)
