"""cyback.api.core: leaves, shape helpers, values, fills, updates, print_tensor."""
import numpy as np
import pytest
import scipy.sparse as sp

import cyback as K

# ------------------------------------------------------------------ variables

def test_variable_from_array_list_number():
    a = np.arange(6).reshape(2, 3)
    v = K.variable(a)
    assert v.dtype == "float32" and K.int_shape(v) == (2, 3)
    np.testing.assert_array_equal(K.eval(v), a)
    a[0, 0] = 100   # the variable holds a copy
    assert K.eval(v)[0, 0] == 0
    assert K.eval(K.variable([[1, 2]], dtype="int32")).dtype == np.int32
    assert K.variable(3.0).shape == ()
    assert K.variable(np.ones(3), dtype=np.float64).dtype == "float64"
    assert K.is_variable(v) and not K.is_variable(a)
    assert v._keras_shape == (2, 3) and v._uses_learning_phase is False


def test_variable_from_tensor_and_sparse():
    t = K.variable([1.0, 2.0]) * 2
    v = K.variable(t)
    np.testing.assert_allclose(K.eval(v), [2, 4])
    m = sp.csr_matrix(np.array([[0, 1.5], [2, 0]]))
    vs = K.variable(m)
    np.testing.assert_allclose(K.eval(vs), m.toarray())
    assert vs.dtype == "float32"


def test_variable_name_and_constraint():
    c = lambda w: w   # noqa: E731
    v = K.variable(1.0, name="weight", constraint=c)
    assert v.name == "weight" and v.constraint is c


def test_variable_bad_value():
    with pytest.raises(TypeError, match="variable"):
        K.variable("not a number")
    with pytest.raises(TypeError):
        K.variable(1.0, dtype="no_such_dtype")


# ------------------------------------------------------------------ constants

def test_constant():
    c = K.constant([1, 2, 3])
    assert c.dtype == "float32"
    np.testing.assert_array_equal(K.eval(c), [1, 2, 3])
    np.testing.assert_array_equal(K.eval(K.constant(7, shape=(2, 3))), np.full((2, 3), 7))
    np.testing.assert_array_equal(K.eval(K.constant(np.arange(6), shape=(3, 2), dtype="int32")),
                                  np.arange(6).reshape(3, 2))
    with pytest.raises(ValueError, match="constant"):
        K.constant([1, 2, 3], shape=(2, 2))
    assert not K.is_variable(c) and K.is_tensor(c) and not K.is_placeholder(c)


# ------------------------------------------------------------------ placeholders

def test_placeholder_shape_ndim_dtype():
    p = K.placeholder(shape=(None, 4, 5))
    assert K.int_shape(p) == (None, 4, 5) and p._keras_shape == (None, 4, 5)
    assert K.ndim(K.placeholder(ndim=3)) == 3
    assert K.int_shape(K.placeholder(ndim=2)) == (None, None)
    assert K.placeholder(shape=(2,), ndim=5).ndim == 1   # shape wins
    assert K.dtype(K.placeholder((2,), dtype="int64")) == "int64"
    assert K.is_placeholder(p) and not K.is_placeholder(K.variable(1.0))


def test_placeholder_errors():
    with pytest.raises(ValueError, match="placeholder"):
        K.placeholder()
    with pytest.raises(ValueError, match="placeholder"):
        K.placeholder((2, -1))
    with pytest.raises(ValueError, match="sparse"):
        K.placeholder((2, 2, 2), sparse=True)


def test_sparse_placeholder_and_to_dense():
    p = K.placeholder((None, 3), sparse=True)
    assert K.is_sparse(p)
    d = K.to_dense(p)
    assert not K.is_sparse(d)
    f = K.function([p], [d * 2])
    m = sp.csr_matrix(np.array([[0, 1, 0], [2, 0, 3]], "float32"))
    np.testing.assert_allclose(f([m])[0], m.toarray() * 2)
    np.testing.assert_allclose(f([m.toarray()])[0], m.toarray() * 2)
    assert K.is_sparse(m) and not K.is_sparse(np.ones(2))
    np.testing.assert_array_equal(K.to_dense(m), m.toarray())


def test_is_helpers():
    v = K.variable(1.0)
    assert K.is_tensor(v) and K.is_tensor(v * 2) and not K.is_tensor(np.ones(2))
    assert K.is_keras_tensor(K.placeholder((2,))) is False
    with pytest.raises(ValueError):
        K.is_keras_tensor(np.array([1, 2]))
    t = v * 2
    t._keras_history = ("layer", 0, 0)
    assert K.is_keras_tensor(t)


# ------------------------------------------------------------------ shape helpers

def test_shape_int_shape_ndim_size_dtype():
    x = K.placeholder((None, 4, 5))
    s = K.shape(x)
    assert K.int_shape(s) == (3,) and s.dtype == "int32"
    f = K.function([x], [s, K.size(x)])
    shape, size = f([np.zeros((2, 4, 5))])
    np.testing.assert_array_equal(shape, [2, 4, 5])
    assert size == 40
    v = K.variable(np.zeros((2, 3)))
    np.testing.assert_array_equal(K.eval(K.shape(v)), [2, 3])
    assert int(K.eval(K.size(v))) == 6
    assert K.int_shape(v) == (2, 3) and K.int_shape(np.zeros((4, 1))) == (4, 1)
    assert K.get_variable_shape(v) == (2, 3)
    assert K.ndim(v) == 2 and K.ndim(np.zeros(3)) == 1
    assert K.dtype(v) == "float32" and K.dtype(np.zeros(2, "int8")) == "int8"


def test_count_params():
    assert K.count_params(K.zeros((2, 3))) == 6
    assert K.count_params(K.variable(1.0)) == 1
    assert K.count_params(K.zeros((0, 3))) == 0
    with pytest.raises(ValueError, match="count_params"):
        K.count_params(K.placeholder((None, 3)))


# ------------------------------------------------------------------ fills

@pytest.mark.parametrize("fn,val", [(K.zeros, 0), (K.ones, 1)])
def test_zeros_ones_static_give_variables(fn, val):
    v = fn((3, 4))
    assert K.is_variable(v) and v.dtype == "float32"
    np.testing.assert_array_equal(K.eval(v), np.full((3, 4), val))
    assert fn((2,), dtype="int32").dtype == "int32"
    assert fn((2,), name="z").name == "z"
    assert K.eval(fn((0, 2))).shape == (0, 2)
    assert K.eval(fn(3)).shape == (3,)


@pytest.mark.parametrize("fn,val", [(K.zeros, 0), (K.ones, 1)])
def test_zeros_ones_symbolic_give_tensors(fn, val):
    x = K.placeholder((None, 3))
    t = fn((K.shape(x)[0], 2))
    assert not K.is_variable(t) and K.int_shape(t) == (None, 2)
    np.testing.assert_array_equal(K.function([x], [t])([np.zeros((4, 3))])[0],
                                  np.full((4, 2), val))


def test_fill_errors():
    with pytest.raises(ValueError, match="zeros"):
        K.zeros((2, -3))
    with pytest.raises(ValueError, match="ones"):
        K.ones((None, 3))


def test_eye():
    np.testing.assert_array_equal(K.eval(K.eye(3)), np.eye(3))
    np.testing.assert_array_equal(K.eval(K.eye((2, 3))), np.eye(2, 3))
    assert K.is_variable(K.eye(2)) and K.eye(2, dtype="float64").dtype == "float64"
    with pytest.raises(ValueError, match="eye"):
        K.eye(-1)
    with pytest.raises(ValueError, match="eye"):
        K.eye((1, 2, 3))


def test_zeros_like_ones_like():
    x = K.placeholder((None, 3), dtype="float64")
    z, o = K.zeros_like(x), K.ones_like(x, dtype="int32")
    assert z.dtype == "float64" and o.dtype == "int32" and K.int_shape(o) == (None, 3)
    zv, ov = K.function([x], [z, o])([np.full((2, 3), 5.0)])
    np.testing.assert_array_equal(zv, np.zeros((2, 3)))
    np.testing.assert_array_equal(ov, np.ones((2, 3)))


def test_identity_and_cast():
    v = K.variable([1.5, -2.5])
    i = K.identity(v, name="same")
    assert i is not v
    np.testing.assert_array_equal(K.eval(i), [1.5, -2.5])
    c = K.cast(v, "int32")
    assert c.dtype == "int32"
    np.testing.assert_array_equal(K.eval(c), [1, -2])
    assert K.cast(v, np.float16).dtype == "float16"
    assert K.cast(v, "float32") is v
    with pytest.raises(TypeError):
        K.cast(v, "no_such_dtype")


# ------------------------------------------------------------------ values

def test_get_set_value():
    v = K.variable(np.zeros((2, 2)))
    K.set_value(v, [[1, 2], [3, 4]])
    np.testing.assert_array_equal(K.get_value(v), [[1, 2], [3, 4]])
    assert K.get_value(v).dtype == np.float32
    got = K.get_value(v)
    got[0, 0] = 99
    assert K.get_value(v)[0, 0] == 1
    with pytest.raises(ValueError, match=r"set_value.*\(2, 2\).*\(3,\)"):
        K.set_value(v, np.ones(3))
    with pytest.raises(TypeError, match="set_value"):
        K.set_value(K.placeholder((2,)), np.ones(2))
    np.testing.assert_array_equal(K.get_value(v * 2), [[2, 4], [6, 8]])


def test_batch_get_set_value():
    a, b = K.variable(0.0), K.variable(np.zeros(2))
    K.batch_set_value([(a, 1.0), (b, [2.0, 3.0])])
    assert K.batch_get_value([a, b])[0] == 1.0
    np.testing.assert_array_equal(K.batch_get_value([a, b])[1], [2, 3])
    # all or nothing on a shape error
    with pytest.raises(ValueError, match="batch_set_value"):
        K.batch_set_value([(a, 5.0), (b, np.ones(3))])
    assert K.get_value(a) == 1.0
    assert K.batch_get_value([]) == []


def test_eval_forms():
    assert K.eval(K.variable(2.0)) == 2.0
    np.testing.assert_array_equal(K.eval(np.array([1, 2])), [1, 2])
    np.testing.assert_array_equal(K.variable([1.0, 2.0]).eval(), [1, 2])
    with pytest.raises(ValueError, match="placeholder"):
        K.eval(K.placeholder((2,)) * 2)


# ------------------------------------------------------------------ print_tensor

def test_print_tensor(capsys):
    x = K.placeholder((2,))
    y = K.print_tensor(x * 2, message="x is: ")
    f = K.function([x], [y + 1])
    out = f([np.array([1.0, 2.0])])[0]
    np.testing.assert_allclose(out, [3, 5])
    assert capsys.readouterr().out == "x is: [2. 4.]\n"
    f([np.array([0.0, 0.0])])
    assert "x is: [0. 0.]" in capsys.readouterr().out
    # gradients pass through
    v = K.variable([1.0, 2.0])
    np.testing.assert_allclose(K.eval(K.gradients(K.sum(K.print_tensor(v) * 3), [v])[0]),
                               [3, 3])


# ------------------------------------------------------------------ updates

def test_update_functions():
    v = K.variable([1.0, 2.0])
    K.function([], [], updates=[K.update(v, [5.0, 6.0])])([])
    np.testing.assert_array_equal(K.get_value(v), [5, 6])
    K.function([], [], updates=[K.update_add(v, 1.0)])([])
    np.testing.assert_array_equal(K.get_value(v), [6, 7])
    K.function([], [], updates=[K.update_sub(v, K.constant([1.0, 2.0]))])([])
    np.testing.assert_array_equal(K.get_value(v), [5, 5])
    K.function([], [], updates=[K.moving_average_update(v, K.constant([15.0, 25.0]), 0.5)])([])
    np.testing.assert_allclose(K.get_value(v), [10, 15])


def test_update_keeps_dtype_and_checks():
    i = K.variable([1, 2], dtype="int32")
    K.function([], [], updates=[K.update_add(i, 1)])([])
    assert K.get_value(i).dtype == np.int32 and K.get_value(i).tolist() == [2, 3]
    with pytest.raises(TypeError, match="update"):
        K.update(K.placeholder((2,)), 1.0)
    with pytest.raises(TypeError, match="update_add"):
        K.update_add(np.ones(2), 1.0)
    with pytest.raises(TypeError, match="moving_average_update"):
        K.moving_average_update(K.constant(1.0), 1.0, 0.9)
    with pytest.raises(ValueError, match="update"):
        K.update(K.variable(np.ones(2)), K.variable(np.ones(3)))
