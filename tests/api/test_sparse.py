"""Sparse placeholders: to_dense and sparse × dense products (the seeds'
is_sparse example is in tests/test_seeds.py)."""
import numpy as np
import pytest
import scipy.sparse as sp

import cyback as K
from cyback.ops.sparse import maybe_sparse_dot, sparse_dot


def _csr(rng, shape, density=0.3, dtype="float32"):
    return sp.random(*shape, density=density, format="csr", random_state=1,
                     dtype=dtype)


def test_to_dense_runs(rng):
    b = K.placeholder((None, 5), sparse=True)
    c = K.to_dense(b)
    assert K.int_shape(c) == (None, 5)
    m = _csr(rng, (3, 5))
    out = K.function([b], [c])([m])[0]
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, m.toarray())
    # Dense values and other sparse formats are accepted too.
    np.testing.assert_array_equal(K.function([b], [c])([m.tocoo()])[0], m.toarray())
    np.testing.assert_array_equal(K.function([b], [c])([m.toarray()])[0], m.toarray())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sparse_dot_values(dtype, rng):
    s = K.placeholder((None, 6), sparse=True, dtype=dtype)
    w = K.placeholder((6, 4), dtype=dtype)
    out = sparse_dot(s, w)
    assert K.int_shape(out) == (None, 4) and K.dtype(out) == dtype
    m = _csr(rng, (5, 6), dtype=dtype)
    wv = rng.standard_normal((6, 4)).astype(dtype)
    got = K.function([s, w], [out])([m, wv])[0]
    assert isinstance(got, np.ndarray) and got.dtype == dtype
    np.testing.assert_allclose(got, m.toarray() @ wv, rtol=1e-5)
    # dense × sparse
    d = K.placeholder((None, 5), dtype=dtype)
    s2 = K.placeholder((5, 3), sparse=True, dtype=dtype)
    out2 = sparse_dot(d, s2)
    assert K.int_shape(out2) == (None, 3)
    dv = rng.standard_normal((2, 5)).astype(dtype)
    m2 = _csr(rng, (5, 3), dtype=dtype)
    np.testing.assert_allclose(K.function([d, s2], [out2])([dv, m2])[0], dv @ m2.toarray(),
                               rtol=1e-5)
    # a 1-D dense operand
    v = K.placeholder((6,), dtype=dtype)
    vv = rng.standard_normal(6).astype(dtype)
    np.testing.assert_allclose(K.function([s, v], [sparse_dot(s, v)])([m, vv])[0],
                               m.toarray() @ vv, rtol=1e-5)


def test_sparse_dot_empty_rows_and_matrix(rng):
    s = K.placeholder((None, 4), sparse=True)
    w = K.variable(rng.standard_normal((4, 2)))
    f = K.function([s], [sparse_dot(s, w)])
    np.testing.assert_array_equal(f([sp.csr_matrix((3, 4), dtype="float32")])[0],
                                  np.zeros((3, 2)))
    assert f([sp.csr_matrix((0, 4), dtype="float32")])[0].shape == (0, 2)


def test_sparse_dot_gradient(rng):
    s = K.placeholder((None, 6), sparse=True, dtype="float64")
    w = K.variable(rng.standard_normal((6, 3)), dtype="float64")
    wt = K.constant(rng.uniform(0.5, 1.5, (4, 3)), "float64")
    loss = K.sum(sparse_dot(s, w) * wt)
    grad = K.gradients(loss, [w])[0]
    m = _csr(rng, (4, 6), dtype="float64")
    got = K.function([s], [grad])([m])[0]
    np.testing.assert_allclose(got, m.toarray().T @ K.eval(wt), rtol=1e-12)
    # Dense on the left: d(D S)/dD = g S^T; and a second derivative exists.
    d = K.variable(rng.standard_normal((2, 4)), dtype="float64")
    s2 = K.placeholder((4, 5), sparse=True, dtype="float64")
    out = sparse_dot(d, s2)
    g = K.gradients(K.sum(K.square(out)), [d])[0]
    m2 = _csr(rng, (4, 5), density=0.5, dtype="float64")
    got = K.function([s2], [g])([m2])[0]
    dense = m2.toarray()
    np.testing.assert_allclose(got, 2 * (K.eval(d) @ dense) @ dense.T, rtol=1e-12)
    hess = K.gradients(K.sum(g), [d])[0]
    np.testing.assert_allclose(K.function([s2], [hess])([m2])[0],
                               np.tile(2 * (dense @ dense.T).sum(1), (2, 1)), rtol=1e-12)


def test_maybe_sparse_dot():
    a, b = K.placeholder((2, 3)), K.placeholder((3, 4))
    assert maybe_sparse_dot(a, b) is None
    s = K.placeholder((2, 3), sparse=True)
    assert K.int_shape(maybe_sparse_dot(s, b)) == (2, 4)


def test_sparse_dot_errors():
    s = K.placeholder((2, 3), sparse=True)
    with pytest.raises(ValueError, match="dot: cannot multiply shapes \\(2, 3\\) and \\(4, 5\\)"):
        sparse_dot(s, K.placeholder((4, 5)))
    with pytest.raises(ValueError, match="dot: the product of two sparse tensors"):
        sparse_dot(s, K.placeholder((3, 2), sparse=True))
    with pytest.raises(ValueError, match="dot: the dense operand of a sparse product must be "
                                         "1-D or 2-D"):
        sparse_dot(s, K.placeholder((3, 2, 2)))
    f = K.function([s], [K.to_dense(s)])
    with pytest.raises(ValueError, match="expects shape \\(2, 3\\)"):
        f([sp.csr_matrix((2, 4), dtype="float32")])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate_of_sparse_stays_sparse(rng, axis):
    """As TensorFlow's sparse_concat: Keras's backend test checks is_sparse."""
    m1 = _csr(rng, (4, 5))
    m2 = _csr(rng, (4, 5), dtype="float64") if axis else _csr(rng, (3, 5))
    a, b = K.variable(m1), K.variable(m2, dtype=m2.dtype.name)
    assert K.is_sparse(a) and K.is_sparse(b)
    out = K.concatenate([a, b], axis=axis)
    assert K.is_sparse(out)
    want = np.concatenate([m1.toarray(), m2.toarray()], axis=axis)
    assert K.int_shape(out) == want.shape
    got = K.eval(out)
    assert isinstance(got, np.ndarray) and got.dtype == out.dtype
    np.testing.assert_allclose(got, want)
    # Placeholders fed scipy matrices in any format; the function gives CSR.
    p1 = K.placeholder((None, 5), sparse=True)
    p2 = K.placeholder((None, 5), sparse=True)
    cat = K.concatenate([p1, p2], axis=0)
    assert K.is_sparse(cat) and K.int_shape(cat) == (None, 5)
    res = K.function([p1, p2], [cat])([m1.tocoo(), m1])[0]
    assert sp.issparse(res)
    np.testing.assert_allclose(res.toarray(), np.concatenate([m1.toarray()] * 2))
    np.testing.assert_allclose(K.eval(K.to_dense(K.concatenate([a, a]))),
                               np.concatenate([m1.toarray()] * 2, axis=-1))


def test_concatenate_mixing_sparse_and_dense_is_dense(rng):
    m = _csr(rng, (2, 3))
    out = K.concatenate([K.variable(m), K.variable(np.ones((2, 1)))])
    assert not K.is_sparse(out)
    np.testing.assert_allclose(K.eval(out), np.hstack([m.toarray(), np.ones((2, 1))]))


def test_concatenate_sparse_shape_mismatch():
    with pytest.raises(ValueError, match="concatenate"):
        K.concatenate([K.placeholder((2, 3), sparse=True), K.placeholder((2, 4), sparse=True)],
                      axis=0)
