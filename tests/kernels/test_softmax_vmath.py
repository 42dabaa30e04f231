"""float32 softmax rows through the vectorised exp (include/cyback_vmath.h) on
every instruction set the CPU has: against a float64 reference, sums, -inf
masks, NaN and -inf rows, odd row lengths, and the same bits whatever the
row's place, the thread count, or AVX-512 against AVX2."""
import numpy as np
import pytest

from cyback.kernels import runtime, softmax
from cyback.kernels.softmax import softmax_last

from instruction_sets import instruction_set

SETS = ["avx512", "avx2", "baseline"]
LENGTHS = [1, 7, 15, 16, 17, 33, 64, 1000]


@pytest.fixture(params=SETS)
def iset(request):
    with instruction_set(softmax, request.param) as which:
        yield which


def _reference(x):
    x = x.astype(np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0, m)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("n", LENGTHS)
def test_matches_float64_and_sums_to_one(n, iset):
    x = (np.random.default_rng(n).standard_normal((9, n)) * 3).astype(np.float32)
    y = softmax_last(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    # x - max is rounded in float32 first: 2e-6 relative covers it
    np.testing.assert_allclose(y, _reference(x), rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(y.sum(-1, dtype=np.float64), 1.0, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n", [7, 17, 64])
def test_masked_entries_are_exact_zeros(n, iset):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, n)).astype(np.float32)
    mask = rng.uniform(size=x.shape) < 0.4
    mask[:, 0] = False
    x[mask] = -np.inf
    y = softmax_last(x)
    assert np.all(y[mask] == 0) and not np.any(np.signbit(y[mask]))
    assert np.all(y[~mask] > 0)
    np.testing.assert_allclose(y.sum(-1, dtype=np.float64), 1.0, rtol=0, atol=1e-6)
    # a large negative additive mask: the same exact zeros
    x2 = np.where(mask, np.float32(-1e30), x)
    np.testing.assert_array_equal(softmax_last(x2)[mask], 0)


@pytest.mark.parametrize("n", [1, 7, 17, 33])
def test_nan_and_infinite_rows(n, iset):
    x = np.zeros((5, n), np.float32)
    x[0, n // 2] = np.nan          # NaN anywhere: the whole row is NaN
    x[1] = -np.inf                 # a row of -inf: 0 / 0, NaN as in NumPy
    x[2, -1] = np.inf              # +inf: inf - inf, NaN as in NumPy
    x[3, 0] = 3.0
    y = softmax_last(x)
    assert np.isnan(y[0]).all() and np.isnan(y[1]).all() and np.isnan(y[2]).all()
    np.testing.assert_allclose(y[3], _reference(x[3:4])[0], rtol=2e-6)
    np.testing.assert_allclose(y[4], 1.0 / n, rtol=1e-6)


def test_extreme_values(iset):
    x = np.array([[88.0, 87.0, -88.0, 0.0], [-1e30, 1e30, 0.0, 3e38],
                  [1e-40, -1e-40, 0.0, -0.0]], np.float32)
    y = softmax_last(x)
    np.testing.assert_allclose(y, _reference(x), rtol=2e-6, atol=1e-30)
    assert y[1, 3] == 1.0 and np.all(y[1, :3] == 0)


def test_rows_do_not_depend_on_their_place_or_the_thread_count(iset):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((37, 33)) * 5).astype(np.float32)
    runtime.force_team_threads(1)
    try:
        one = softmax_last(x)
    finally:
        runtime.force_team_threads(None)
    runtime.force_team_threads(2)
    try:
        two = softmax_last(x)
    finally:
        runtime.force_team_threads(None)
    np.testing.assert_array_equal(one, two)
    for r in (0, 5, 36):
        np.testing.assert_array_equal(softmax_last(x[r]), one[r])
    # non-contiguous input (copied first)
    np.testing.assert_array_equal(softmax_last(np.asfortranarray(x)), one)
    np.testing.assert_array_equal(softmax_last(x[::2]), one[::2])


@pytest.mark.parametrize("n", LENGTHS)
def test_same_bits_on_avx512_and_avx2(n):
    if not softmax._use_avx512(True):
        softmax._use_avx2(True)
        pytest.skip("needs avx512: AVX-512 is off: no AVX-512F on this CPU, or CYBACK_AVX512=0")
    x = (np.random.default_rng(n).standard_normal((6, n)) * 4).astype(np.float32)
    wide = softmax_last(x)
    with instruction_set(softmax, "avx2"):
        np.testing.assert_array_equal(softmax_last(x), wide)


def test_float64_keeps_libm():
    x = np.random.default_rng(2).standard_normal((4, 33))
    np.testing.assert_allclose(softmax_last(x), _reference(x), rtol=1e-13)
