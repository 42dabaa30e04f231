"""cyback.kernels.linalg: the OpenMP-split GEMM and the batched GEMM."""
import numpy as np
import pytest

from cyback.kernels import linalg, runtime
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
    (("abc", np.ones((3, 2))), TypeError),
    (([[1.0, 2.0]], np.ones((2, 2))), TypeError),
])
def test_matmul_bad_arguments(bad, err):
    with pytest.raises(err, match="matmul"):
        matmul(*bad)


def test_batch_gemm_refuses_what_is_not_an_array():
    with pytest.raises(TypeError, match="batch_gemm: expected two NumPy arrays"):
        batch_gemm("abc", np.ones((1, 2, 2)))


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("nb,m,k,n", [(3, 4, 5, 6), (2, 300, 300, 300), (1, 1, 7, 1), (0, 2, 2, 2)])
def test_batch_gemm_matches_numpy(ta, tb, nb, m, k, n, rng):
    a = rng.standard_normal((nb, k, m) if ta else (nb, m, k))
    b = rng.standard_normal((nb, n, k) if tb else (nb, k, n))
    ref = np.matmul(a.transpose(0, 2, 1) if ta else a, b.transpose(0, 2, 1) if tb else b)
    np.testing.assert_allclose(batch_gemm(a, b, ta, tb), ref, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- dense_rows

def _dense_ref(x, w, b, act):
    ref = x.astype(np.float64) @ w.astype(np.float64) + (0 if b is None else b)
    if act:
        ref = np.maximum(ref, 0)
    if act == 2:
        ref = np.minimum(ref, 6)
    return ref


@pytest.fixture
def one_thread():
    # kernels.linalg.dense does only what the calling thread should: with the
    # tests' cutoff of 0 (conftest) a team of 2 takes every larger product
    old = runtime.get_max_threads()
    runtime.set_num_threads(1)
    yield
    runtime.set_num_threads(old)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("m,k,n", [(1, 8, 3), (5, 32, 64), (32, 64, 10), (300, 7, 1),
                                   (33, 1, 65)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_dense_matches_numpy(m, k, n, act, dtype, tol, with_bias, one_thread):
    rng = np.random.default_rng(m * 100 + k + n)
    x = (rng.standard_normal((m, k)) * 3).astype(dtype)
    w = rng.standard_normal((k, n)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype) if with_bias else None
    y = linalg.dense(x, w, b, act)
    assert y.dtype == dtype and y.shape == (m, n)
    np.testing.assert_allclose(y, _dense_ref(x, w, b, act), rtol=tol, atol=tol * max(1, k))


def test_dense_keeps_nan_and_reads_read_only_operands(one_thread):
    w = np.ones((3, 4), np.float32)
    w.flags.writeable = False
    x = np.ones((32, 3), np.float32)
    x[5, 1] = np.nan
    x[7] = 5
    x.flags.writeable = False
    for act in (0, 1, 2):
        y = linalg.dense(x, w, None, act)
        assert np.isnan(y[5]).all() and not np.isnan(np.delete(y, 5, axis=0)).any()
    np.testing.assert_array_equal(linalg.dense(x, w, None, 2)[7], np.full(4, 6))
    np.testing.assert_array_equal(linalg.dense(-x, w, None, 1)[7], np.zeros(4))


def test_dense_declines_what_it_does_not_take(one_thread):
    x = np.ones((32, 8), np.float32)
    w = np.ones((8, 4), np.float32)
    b = np.ones(4, np.float32)
    assert linalg.dense(x, np.asfortranarray(w), b) is None                # layout
    assert linalg.dense(x[:, ::2], w[:4], b) is None
    assert linalg.dense(x, w.astype(np.float64), b) is None                # dtypes
    assert linalg.dense(x.astype(np.float16), w.astype(np.float16)) is None
    assert linalg.dense(x, w, np.ones(5, np.float32)) is None              # bias size
    assert linalg.dense(x, w, b.astype(np.float64)) is None                # bias dtype
    assert linalg.dense(x, np.ones((7, 4), np.float32)) is None            # k
    assert linalg.dense(x[0], w) is None                                   # rank
    assert linalg.dense(x, w, b, 3) is None                                # activation
    assert linalg.dense(x, w, b, -1) is None
    assert linalg.dense(x.astype(">f4"), w, b) is None                     # byte order
    assert linalg.dense(x[:0], w, b) is None                               # empty
    assert linalg.dense(x[:, :0], w[:0], b) is None
    # the same product on a team of 2 goes to matmul (the tests' cutoff is 0)
    runtime.set_num_threads(2)
    assert linalg.dense(x, w, b) is None
    np.testing.assert_array_equal(linalg.dense(x[:1], w, b), np.full((1, 4), 9))


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 32, 64), (4, 128, 10), (3, 7, 13),
                                   (1, 256, 128), (2, 0, 5), (0, 8, 3)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_dense_rows_matches_numpy(m, k, n, act, dtype, tol, with_bias):
    rng = np.random.default_rng(m * 100 + k + n)
    x = (rng.standard_normal((m, k)) * 3).astype(dtype)
    w = rng.standard_normal((k, n)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype) if with_bias else None
    y = linalg.dense_rows(x, w, b, act)
    ref = x.astype(np.float64) @ w.astype(np.float64) + (0 if b is None else b)
    if act:
        ref = np.maximum(ref, 0)
    if act == 2:
        ref = np.minimum(ref, 6)
    assert y.dtype == dtype and y.shape == (m, n)
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol * max(1, k))


def test_dense_rows_keeps_nan_and_reads_read_only_weights():
    w = np.ones((3, 4), np.float32)
    w.flags.writeable = False
    x = np.array([[np.nan, 1, 1]], np.float32)
    for act in (0, 1, 2):
        assert np.isnan(linalg.dense_rows(x, w, None, act)).all()
    big = np.full((1, 3), 5, np.float32)
    np.testing.assert_array_equal(linalg.dense_rows(big, w, None, 2), np.full((1, 4), 6))


@pytest.mark.parametrize("kernel", ["dense_rows", "dense_t"])
def test_dense_kernels_decline_what_they_do_not_take(kernel):
    # the same checks for both layouts of the weights: (k, n) and, for
    # dense_t, (n, k)
    fn = getattr(linalg, kernel)
    t = kernel == "dense_t"

    def w_of(k, n, dtype=np.float32):
        return np.ones((n, k) if t else (k, n), dtype)
    x = np.ones((1, 8), np.float32)
    w = w_of(8, 4)
    b = np.ones(4, np.float32)
    np.testing.assert_array_equal(fn(x, w, b), np.full((1, 4), 9))           # takes this
    assert fn(np.ones((5, 8), np.float32), w, b) is None                      # rows
    assert fn(x, np.asfortranarray(w)) is None                                # w's layout
    assert fn(x, w.astype(np.float64), b) is None                             # dtypes
    assert fn(x.astype(np.float16), w.astype(np.float16)) is None
    assert fn(x, w, np.ones(5, np.float32)) is None                           # bias size
    assert fn(x, w_of(7, 4)) is None                                          # k
    assert fn(x[0], w) is None                                                # rank
    assert fn(x, w, b, 3) is None                                             # activation
    assert fn(x.astype(">f4"), w, b) is None                                  # byte order
    assert fn(x[:, ::2], w_of(4, 4)) is None                                  # x's layout
    if t:
        assert fn(np.ones((2, 8), np.float32), w, b) is None                  # rows
    else:
        assert fn(x, w_of(8, 5000)) is None                                   # weights


# ---------------------------------------------------------------- dense_t

def _kernel_sets():
    """(name, setter) for each of dense_t's kernel sets this CPU runs."""
    sets = [("baseline", lambda: linalg._use_avx2(False))]
    if linalg._use_avx2(True):
        sets.append(("avx2", lambda: (linalg._use_avx2(True), linalg._use_avx512(False))))
    if linalg._use_avx512(True):
        sets.append(("avx512", lambda: linalg._use_avx512(True)))
    return sets


@pytest.fixture
def restore_sets():
    yield
    linalg._use_avx2(True)
    linalg._use_avx512(True)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 9216, 10), (1, 64, 10), (1, 33, 4),
                                   (1, 128, 16), (1, 0, 3), (0, 8, 3), (1, 31, 0),
                                   (1, 1000, 7)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_dense_t_matches_numpy_on_every_kernel_set(m, k, n, act, dtype, tol, with_bias,
                                                   restore_sets):
    rng = np.random.default_rng(m * 100 + k + n)
    x = (rng.standard_normal((m, k)) * 3).astype(dtype)
    wt = rng.standard_normal((n, k)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype) if with_bias else None
    ref = x.astype(np.float64) @ wt.T.astype(np.float64) + (0 if b is None else b)
    if act:
        ref = np.maximum(ref, 0)
    if act == 2:
        ref = np.minimum(ref, 6)
    for name, use in _kernel_sets():
        use()
        y = linalg.dense_t(x, wt, b, act)
        assert y.dtype == dtype and y.shape == (m, n), name
        np.testing.assert_allclose(y, ref, rtol=tol, atol=tol * max(1, k) ** 0.5 * 4,
                                   err_msg=name)
        # the same order of sums at every call
        np.testing.assert_array_equal(linalg.dense_t(x, wt, b, act), y)


def test_dense_t_keeps_nan_and_reads_read_only_weights():
    wt = np.ones((4, 40), np.float32)
    wt.flags.writeable = False
    x = np.ones((1, 40), np.float32)
    x[0, 37] = np.nan
    for act in (0, 1, 2):
        assert np.isnan(linalg.dense_t(x, wt, None, act)).all()
    np.testing.assert_array_equal(linalg.dense_t(np.ones((1, 40), np.float32), wt, None, 2),
                                  np.full((1, 4), 6))

