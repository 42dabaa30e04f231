"""kernels.reduce.sum_middle against float64 NumPy sums, on every path: one
thread and a team, strips of full and partial width, rows split between
threads (few outer items, long rows), and the argument checks."""
import numpy as np
import pytest

from cyback.kernels import reduce, runtime

from instruction_sets import instruction_set


def _reference(x, mean):
    s = x.astype(np.float64).sum(axis=1)
    return s / x.shape[1] if mean else s


# Rounding is bounded relative to the sum of |x| along the rows (the result
# itself may cancel to near zero): float32 blocked sums stay well inside 1e-6.
EPS = {"float32": 1e-6, "float64": 1e-14}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape", [(1, 1, 2), (1, 1024, 32), (3, 7, 5), (2, 600, 130),
                                   (32, 49, 16), (1, 257, 64), (1, 5000, 3), (5, 1, 65)])
@pytest.mark.parametrize("mean", [False, True])
def test_matches_reference(shape, dtype, threads, mean):
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    old = runtime.get_max_threads()
    try:
        runtime.set_num_threads(threads)
        y = reduce.sum_middle(x, *shape, mean=mean)
    finally:
        runtime.set_num_threads(old)
    assert y.shape == (shape[0], shape[2]) and y.dtype == x.dtype
    bound = EPS[dtype] * np.abs(x.astype(np.float64)).sum(axis=1) / (shape[1] if mean else 1)
    assert np.all(np.abs(y - _reference(x, mean)) <= bound)


def test_rounding_grows_slowly_with_the_row_count():
    # 10^6 rows of 0.1: a running float32 sum (NumPy's over this axis) is
    # 1% off; the blocked sum's error grows with 128 + n / 128 additions
    x = np.full((1, 10 ** 6, 2), 0.1, np.float32)
    exact = 10 ** 6 * np.float64(np.float32(0.1))
    running = np.cumsum(x[0, :, 0])[-1]
    y = reduce.sum_middle(x, 1, 10 ** 6, 2)
    assert abs(running - exact) > 5e-3 * exact
    np.testing.assert_allclose(y, exact, rtol=1e-4)


@pytest.mark.parametrize("shape", [(1, 4096, 8), (2, 300, 200), (64, 50, 16)])
def test_results_do_not_depend_on_the_thread_count(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    old = runtime.get_max_threads()
    got = []
    try:
        for threads in (1, 2, 3, 2):
            runtime.set_num_threads(threads)
            got.append(reduce.sum_middle(x, *shape))
    finally:
        runtime.set_num_threads(old)
    for y in got[1:]:
        np.testing.assert_array_equal(y, got[0])


def test_nan_and_inf_propagate():
    x = np.zeros((2, 300, 4), np.float32)
    x[0, 17, 1] = np.nan
    x[1, 299, 3] = np.inf
    y = reduce.sum_middle(x, 2, 300, 4)
    assert np.isnan(y[0, 1]) and np.isinf(y[1, 3])
    assert np.count_nonzero(y) == 2


def test_empty_outer():
    y = reduce.sum_middle(np.zeros((0, 3, 4), np.float64), 0, 3, 4)
    assert y.shape == (0, 4) and y.dtype == np.float64


@pytest.mark.parametrize("x,view,error", [
    (np.zeros((2, 3, 4), np.float16), (2, 3, 4), TypeError),
    (np.zeros((2, 3, 4), np.int32), (2, 3, 4), TypeError),
    (np.zeros((4, 3, 2), np.float32).transpose(), (2, 3, 4), TypeError),
    (np.zeros((2, 3, 4), np.float32), (2, 3, 5), ValueError),
    (np.zeros((2, 0, 4), np.float32), (2, 0, 4), ValueError),
    (np.zeros((2, 3, 4), np.float32), (-2, -3, 4), ValueError),
])
def test_bad_arguments(x, view, error):
    with pytest.raises(error, match="sum_middle"):
        reduce.sum_middle(x, *view)


# ---------------------------------------------------------------- extreme_middle

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 398, 250), (3, 7, 5), (2, 49, 130),
                                   (5, 3, 64)])
@pytest.mark.parametrize("want_max", [True, False])
def test_extreme_middle_matches_numpy(shape, dtype, threads, want_max):
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    saved = runtime.get_max_threads()
    runtime.set_num_threads(threads)
    try:
        got = reduce.extreme_middle(x, *shape, want_max=want_max)
    finally:
        runtime.set_num_threads(saved)
    want = (np.max if want_max else np.min)(x, axis=1)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("want_max", [True, False])
def test_extreme_middle_takes_nan_and_inf_as_numpy_does(want_max):
    x = np.random.default_rng(3).standard_normal((2, 9, 70)).astype(np.float32)
    x[0, 4, 3] = np.nan
    x[1, 0, 65] = np.nan         # the first row: NaN stays
    x[1, 8, 2] = np.inf
    x[0, 8, 1] = -np.inf
    got = reduce.extreme_middle(x, 2, 9, 70, want_max)
    np.testing.assert_array_equal(got, (np.max if want_max else np.min)(x, axis=1))


@pytest.mark.parametrize("x,view,error", [
    (np.zeros((2, 3), np.int32), (2, 3, 1), TypeError),
    (np.zeros((4, 3), np.float32)[::2], (2, 3, 1), TypeError),
    (np.zeros((2, 3), np.float32), (2, 0, 3), ValueError),
    (np.zeros((2, 3), np.float32), (2, 2, 2), ValueError),
])
def test_extreme_middle_bad_arguments(x, view, error):
    with pytest.raises(error, match="extreme_middle"):
        reduce.extreme_middle(x, *view)


@pytest.mark.parametrize("which", ["avx512", "avx2"])
@pytest.mark.parametrize("want_max", [True, False])
@pytest.mark.parametrize("shape", [(1, 398, 250), (3, 5, 7), (2, 1, 70), (4, 33, 129), (1, 7, 1),
                                   (2, 9, 64), (1, 3, 65)])
def test_extreme_strips_in_registers_give_the_baseline_bits(which, want_max, shape):
    # include/cyback_extreme.h: a NaN wins, infinities and signed zeros keep
    # the baseline loop's choice
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    x.flat[::17] = np.nan
    x.flat[::13] = -0.0
    x.flat[::19] = 0.0
    x.flat[::23] = np.inf
    x.flat[::29] = -np.inf
    with instruction_set(reduce, "baseline"):
        want = reduce.extreme_middle(x, *shape, want_max)
    with instruction_set(reduce, which):
        got = reduce.extreme_middle(x, *shape, want_max)
    assert got.tobytes() == want.tobytes()
    np.testing.assert_array_equal(got, (np.max if want_max else np.min)(x, axis=1))
