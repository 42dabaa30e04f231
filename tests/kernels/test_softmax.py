import numpy as np
import pytest

from cyback.kernels.softmax import softmax_last


def _reference(x):
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0, m)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype,rtol", [("float32", 2e-6), ("float64", 1e-13)])
@pytest.mark.parametrize("shape", [(1, 1), (1, 10), (7, 3), (2, 3, 257), (4096, 5), (5,)])
def test_matches_reference(shape, dtype, rtol):
    x = (np.random.RandomState(0).randn(*shape) * 20).astype(dtype)
    y = softmax_last(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_allclose(y, _reference(x), rtol=rtol, atol=1e-30)
    np.testing.assert_allclose(y.sum(-1), 1, rtol=10 * rtol)


def test_non_contiguous_and_empty():
    x = np.random.RandomState(1).randn(6, 8).astype("float32")
    np.testing.assert_allclose(softmax_last(x.T), _reference(x.T), rtol=2e-6)
    np.testing.assert_allclose(softmax_last(x[:, ::2]), _reference(x[:, ::2]), rtol=2e-6)
    assert softmax_last(np.zeros((0, 3), "float32")).shape == (0, 3)
    assert softmax_last(np.zeros((3, 0), "float64")).shape == (3, 0)


def test_infinities_and_nan():
    x = np.array([[-np.inf, -np.inf], [-np.inf, 0.0], [1.0, np.nan]], "float32")
    y = softmax_last(x)
    assert np.isnan(y[0]).all()             # 0 / 0, as NumPy gives
    np.testing.assert_array_equal(y[1], [0.0, 1.0])
    assert np.isnan(y[2]).all()


def test_bad_arguments():
    with pytest.raises(TypeError, match="softmax"):
        softmax_last(np.ones((2, 2), "int32"))
    with pytest.raises(ValueError, match="softmax"):
        softmax_last(np.float32(1.0))
