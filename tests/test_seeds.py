"""The seeds' examples (seeds/004, 003, 002) for config, core and math, as
written, with the outputs they show. TensorFlow-specific reprs and the
'float32_ref' variable dtype are TF details; cyback gives 'float32'."""
import numpy as np
import pytest

import cyback as K

pytestmark = pytest.mark.usefixtures("fresh_learning_phase")


def test_intro_backend_code():
    inputs = K.placeholder(shape=(2, 4, 5))
    assert K.int_shape(inputs) == (2, 4, 5)
    inputs = K.placeholder(shape=(None, 4, 5))
    assert K.int_shape(inputs) == (None, 4, 5)
    inputs = K.placeholder(ndim=3)
    assert K.ndim(inputs) == 3
    val = np.random.random((3, 4, 5))
    var = K.variable(value=val)
    np.testing.assert_allclose(K.eval(var), val, rtol=1e-6)
    var = K.zeros(shape=(3, 4, 5))
    var = K.ones(shape=(3, 4, 5))
    assert K.int_shape(var) == (3, 4, 5)
    b = K.random_uniform_variable(shape=(3, 4), low=0, high=1)
    c = K.random_normal_variable(shape=(3, 4), mean=0, scale=1)
    d = K.random_normal_variable(shape=(3, 4), mean=0, scale=1)
    a = b + c * K.abs(d)
    c = K.dot(a, K.transpose(b))
    assert K.int_shape(c) == (3, 3)
    a = K.sum(b, axis=1)
    assert K.int_shape(a) == (3,)
    a = K.softmax(b)
    a = K.concatenate([b, c], axis=-1)
    assert K.int_shape(a) == (3, 7)


def test_get_uid():
    K.reset_uids()
    assert K.get_uid("dense") == 1
    assert K.get_uid("dense") == 2


def test_learning_phase_and_clear_session():
    K.set_learning_phase(1)
    assert K.learning_phase() == 1
    K.clear_session()
    assert K.get_uid("dense") == 1


def test_is_sparse_and_to_dense():
    a = K.placeholder((2, 2), sparse=False)
    assert K.is_sparse(a) is False
    b = K.placeholder((2, 2), sparse=True)
    assert K.is_sparse(b) is True
    c = K.to_dense(b)
    assert K.is_sparse(c) is False


def test_variable_example(capsys):
    val = np.array([[1, 2], [3, 4]])
    kvar = K.variable(value=val, dtype="float64", name="example_var")
    assert K.dtype(kvar) == "float64"
    print(kvar)
    assert capsys.readouterr().out == "example_var\n"
    out = kvar.eval()
    np.testing.assert_array_equal(out, np.array([[1., 2.], [3., 4.]]))
    assert out.dtype == np.float64


def test_placeholder_example():
    input_ph = K.placeholder(shape=(2, 4, 5))
    assert input_ph._keras_shape == (2, 4, 5)
    assert input_ph.shape == (2, 4, 5) and input_ph.dtype == "float32"


def test_shape_example():
    val = np.array([[1, 2], [3, 4]])
    kvar = K.variable(value=val)
    inputs = K.placeholder(shape=(2, 4, 5))
    assert K.int_shape(K.shape(kvar)) == (2,) and K.shape(kvar).dtype == "int32"
    assert K.int_shape(K.shape(inputs)) == (3,)
    out = K.shape(kvar).eval()
    np.testing.assert_array_equal(out, np.array([2, 2], dtype="int32"))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(K.shape(inputs).eval(), [2, 4, 5])


def test_int_shape_ndim_size_examples():
    inputs = K.placeholder(shape=(2, 4, 5))
    assert K.int_shape(inputs) == (2, 4, 5)
    val = np.array([[1, 2], [3, 4]])
    kvar = K.variable(value=val)
    assert K.int_shape(kvar) == (2, 2)
    assert K.ndim(inputs) == 3
    assert K.ndim(kvar) == 2
    size = K.eval(K.size(kvar))
    assert size == 4 and size.dtype == np.int32


def test_dtype_examples():
    assert K.dtype(K.placeholder(shape=(2, 4, 5))) == "float32"
    assert K.dtype(K.placeholder(shape=(2, 4, 5), dtype="float32")) == "float32"
    assert K.dtype(K.placeholder(shape=(2, 4, 5), dtype="float64")) == "float64"
    kvar = K.variable(np.array([[1, 2], [3, 4]]))
    assert K.dtype(kvar) == "float32"
    kvar = K.variable(np.array([[1, 2], [3, 4]]), dtype="float32")
    assert K.dtype(kvar) == "float32"


def test_eval_example():
    kvar = K.variable(np.array([[1, 2], [3, 4]]), dtype="float32")
    out = K.eval(kvar)
    np.testing.assert_array_equal(out, np.array([[1., 2.], [3., 4.]], dtype=np.float32))
    assert out.dtype == np.float32


def test_zeros_ones_eye_examples():
    out = K.eval(K.zeros((3, 4)))
    assert out.dtype == np.float32 and out.tolist() == [[0.0] * 4] * 3
    out = K.eval(K.ones((3, 4)))
    assert out.dtype == np.float32 and out.tolist() == [[1.0] * 4] * 3
    out = K.eval(K.eye(3))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1., 0., 0.], [0., 1., 0.], [0., 0., 1.]])
    np.testing.assert_array_equal(K.eval(K.eye((2, 3))), [[1., 0., 0.], [0., 1., 0.]])


def test_zeros_like_ones_like_examples():
    kvar = K.variable(np.random.random((2, 3)))
    out = K.eval(K.zeros_like(kvar))
    assert out.dtype == np.float32 and out.tolist() == [[0.0] * 3] * 2
    out = K.eval(K.ones_like(kvar))
    assert out.dtype == np.float32 and out.tolist() == [[1.0] * 3] * 2


def test_random_variable_examples():
    kvar = K.random_uniform_variable((2, 3), 0, 1)
    out = K.eval(kvar)
    assert out.shape == (2, 3) and out.dtype == np.float32
    assert out.min() >= 0 and out.max() < 1
    out = K.eval(K.random_normal_variable((2, 3), 0, 1))
    assert out.shape == (2, 3) and out.dtype == np.float32


def test_count_params_example():
    kvar = K.zeros((2, 3))
    assert K.count_params(kvar) == 6
    np.testing.assert_array_equal(K.eval(kvar), [[0., 0., 0.], [0., 0., 0.]])


def test_cast_example():
    input = K.placeholder((2, 3), dtype="float32")   # noqa: A001 (as in the seed)
    assert input.dtype == "float32"
    out = K.cast(input, dtype="float16")
    assert out.dtype == "float16" and K.int_shape(out) == (2, 3)
    assert input.dtype == "float32"
    input = K.cast(input, dtype="float16")   # noqa: A001
    assert input.dtype == "float16"


def test_dot_examples():
    x = K.placeholder(shape=(2, 3))
    y = K.placeholder(shape=(3, 4))
    assert K.int_shape(K.dot(x, y)) == (2, 4)
    x = K.placeholder(shape=(32, 28, 3))
    y = K.placeholder(shape=(3, 4))
    xy = K.dot(x, y)
    assert K.int_shape(xy) == (32, 28, 4) and xy.dtype == "float32"
    x = K.variable(np.random.uniform(0, 1, (2, 3)))
    y = K.ones((4, 3, 5))
    xy = K.dot(x, y)
    assert K.int_shape(xy) == (2, 4, 5)


def test_batch_dot_examples():
    x = K.variable([[1, 2], [3, 4]])
    y = K.variable([[5, 6], [7, 8]])
    # the main diagonal of x.dot(y.T), kept as (batch_size, 1)
    np.testing.assert_array_equal(K.eval(K.batch_dot(x, y, axes=1)), [[17], [53]])
    x_batch = K.ones(shape=(32, 20, 1))
    y_batch = K.ones(shape=(32, 30, 20))
    xy_batch_dot = K.batch_dot(x_batch, y_batch, axes=[1, 2])
    assert K.int_shape(xy_batch_dot) == (32, 1, 30)
    xy_batch_dot = K.batch_dot(x_batch, y_batch, axes=(1, 2))
    assert K.int_shape(xy_batch_dot) == (32, 1, 30)
    np.testing.assert_array_equal(K.eval(xy_batch_dot), np.full((32, 1, 30), 20.0))
    # shape inference example: (100, 20) . (100, 30, 20) with axes (1, 2) -> (100, 30)
    assert K.int_shape(K.batch_dot(K.placeholder((100, 20)), K.placeholder((100, 30, 20)),
                                   axes=(1, 2))) == (100, 30)


def test_transpose_examples():
    var = K.variable([[1, 2, 3], [4, 5, 6]])
    out = K.eval(var)
    assert out.dtype == np.float32 and out.tolist() == [[1., 2., 3.], [4., 5., 6.]]
    var_transposed = K.transpose(var)
    np.testing.assert_array_equal(K.eval(var_transposed), [[1., 4.], [2., 5.], [3., 6.]])
    inputs = K.placeholder((2, 3))
    input_transposed = K.transpose(inputs)
    assert K.int_shape(input_transposed) == (3, 2) and input_transposed.dtype == "float32"


def test_print_tensor_example(capsys):
    x = K.variable([1.0, 2.0])
    x = K.print_tensor(x, message="x is: ")
    K.eval(x)
    assert capsys.readouterr().out.startswith("x is: ")


def test_config_examples():
    assert K.backend() == "cyback"
    assert K.epsilon() == 1e-07
    K.set_epsilon(1e-05)
    assert K.epsilon() == 1e-05
    assert K.floatx() == "float32"
    K.set_floatx("float16")
    assert K.floatx() == "float16"
    K.set_floatx("float64")
    assert K.floatx() == "float64"
    K.set_floatx("float32")
    arr = np.array([1.0, 2.0], dtype="float64")
    assert arr.dtype == np.float64
    new_arr = K.cast_to_floatx(arr)
    np.testing.assert_array_equal(new_arr, np.array([1., 2.], dtype=np.float32))
    assert new_arr.dtype == np.dtype("float32")
    assert K.image_data_format() == "channels_last"
    K.set_image_data_format("channels_first")
    assert K.image_data_format() == "channels_first"
    K.set_image_data_format("channels_last")
    assert K.image_data_format() == "channels_last"


def test_seed_002_typo_is_an_attribute_error():
    with pytest.raises(AttributeError):
        K.set_espilon(1e-5)


def test_gradients_and_stop_gradient_docs():
    v = K.variable([1.0, 2.0])
    g = K.gradients(K.sum(K.square(v)), [v])
    np.testing.assert_allclose(K.eval(g[0]), [2, 4])
    s = K.stop_gradient([v, v])
    assert isinstance(s, list) and len(s) == 2
    assert not isinstance(K.stop_gradient(v), list)


def test_function_doc_raises_on_invalid_kwargs():
    x = K.placeholder((2,))
    with pytest.raises(ValueError):
        K.function([x], [x], not_a_session_kwarg=True)
