"""Arguments checked before anything is allocated (issue 40, item 4), and
errors that name the function called. Each case is one the random-call fuzzer
(tests/test_fuzz.py) or the issue found.

Integer arguments are Python or NumPy ints: bools and floats, even whole
ones, are a TypeError (as TensorFlow's). Sizes are bounded
(cyback/graph/limits.py): a result no array could have is a ValueError naming
the function and the shape, raised while building; a large result of
constants is computed when the function runs, not while the graph is built.
"""
import tracemalloc

import numpy as np
import pytest

import cyback as K
from cyback.graph import limits
from cyback.graph.tensor import Constant

# more bytes than any machine running these tests has
HUGE = 2 ** 62


class _Peak(object):
    """``with _Peak() as p:`` ... ``p.bytes``: the most memory NumPy and
    Python allocated inside the block."""

    def __enter__(self):
        tracemalloc.start()
        return self

    def __exit__(self, *exc):
        self.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


# ------------------------------------------------------------------ one_hot

def test_one_hot_of_a_billion_classes_builds_without_allocating():
    indices = K.constant([1, 2], dtype="int32")
    with _Peak() as peak:
        y = K.one_hot(indices, 10 ** 9)
    assert type(y) is not Constant and K.int_shape(y) == (2, 10 ** 9)
    assert peak.bytes < 2 ** 20


@pytest.mark.parametrize("bad", [3.0, np.float32(3), True, "3", None])
def test_one_hot_num_classes_must_be_an_int(bad):
    with pytest.raises(TypeError, match="one_hot: num_classes must be an int"):
        K.one_hot(K.constant([0, 1], dtype="int32"), bad)


def test_one_hot_values_with_numpy_int_classes_and_out_of_range_indices():
    idx = np.array([[0, 2], [-1, 3]], "int64")
    got = K.eval(K.one_hot(K.constant(idx, dtype="int64"), np.int64(3)))
    want = np.zeros((2, 2, 3), "float32")
    for (i, j), c in np.ndenumerate(idx):
        if 0 <= c < 3:
            want[i, j, c] = 1
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_one_hot_too_large_for_the_batch_fed_is_a_value_error_at_run_time():
    x = K.placeholder((None,), dtype="int32")
    f = K.function([x], [K.one_hot(x, HUGE // 8)])
    with pytest.raises(ValueError, match=r"one_hot: .*shape \(3, %d\)" % (HUGE // 8)):
        f([np.array([0, 1, 2], "int32")])


# ------------------------------------------------------------------ repeats, tiles

@pytest.mark.parametrize("rep", [1e9, 2.0, True])
def test_repeat_elements_rep_must_be_an_int(rep):
    with pytest.raises(TypeError, match="repeat_elements: rep must be an int"):
        K.repeat_elements(K.constant(np.ones((3, 2))), rep, 1)


def test_repeat_elements_beyond_memory_is_refused_before_allocating():
    x = K.constant(np.ones((3, 2000), "float32"))
    with _Peak() as peak:
        with pytest.raises(ValueError, match=r"repeat_elements: .*shape \(3, 2000000000000\)"):
            K.repeat_elements(x, 10 ** 9, 1)
    assert peak.bytes < 2 ** 20


def test_repeat_names_itself_for_a_bad_count():
    with pytest.raises(ValueError, match="^repeat: "):
        K.repeat(K.placeholder((2, 3)), -1)
    with pytest.raises(TypeError, match="^repeat: "):
        K.repeat(K.placeholder((2, 3)), 2.5)


def test_a_large_tile_of_a_constant_is_computed_when_run():
    x = K.constant(np.arange(4.0, dtype="float32"))
    with _Peak() as peak:
        y = K.tile(x, 2 ** 27)      # 2 GiB: not made while building
    assert type(y) is not Constant and peak.bytes < 2 ** 20
    small = K.tile(x, 3)            # small results are still folded
    assert type(small) is Constant
    np.testing.assert_array_equal(K.eval(small), np.tile(np.arange(4.0), 3))


# ------------------------------------------------------------------ arange

def test_arange_of_a_billion_values_is_made_when_run():
    with _Peak() as peak:
        y = K.arange(0, 10 ** 9)
    assert type(y) is not Constant and K.int_shape(y) == (10 ** 9,)
    assert peak.bytes < 2 ** 20
    np.testing.assert_array_equal(K.eval(K.arange(2, 8, 2)), [2, 4, 6])


@pytest.mark.parametrize("args, message", [
    ((0, 10 ** 15), "arange: the result would have shape"),
    ((0, np.inf), "arange: start, stop and step must be finite"),
    ((0, 1e300, 1e-300), "arange: .* makes more values than an array can hold"),
    ((0, 5, 0), "arange: step must be a non-zero number"),
    ((0, 5, np.nan), "arange: step must be a non-zero number"),
])
def test_arange_bounds_and_steps(args, message):
    with pytest.raises(ValueError, match=message):
        K.arange(*args)


# ------------------------------------------------------------------ leaves and fills

@pytest.mark.parametrize("fn", [K.zeros, K.ones])
def test_fills_beyond_memory_are_refused(fn):
    with pytest.raises(ValueError, match=r"%s: the array would have shape \(%d, %d\)"
                       % (fn.__name__, HUGE, 4)):
        fn((HUGE, 4))


@pytest.mark.parametrize("fn", [K.zeros, K.ones, K.random_normal, K.random_uniform])
@pytest.mark.parametrize("shape", [(2.0, 3), (True, 3), np.array([2.0, 3.0])])
def test_shape_entries_must_be_ints(fn, shape):
    with pytest.raises(TypeError, match=r"^%s: .*integers" % fn.__name__):
        fn(shape)


def test_numpy_int_shape_entries_are_accepted():
    assert K.int_shape(K.zeros((np.int64(2), np.int32(3)))) == (2, 3)
    assert K.int_shape(K.random_normal(np.array([2, 3]))) == (2, 3)


def test_eye_sizes():
    np.testing.assert_array_equal(K.eval(K.eye((np.int64(2), 3))), np.eye(2, 3))
    with pytest.raises(TypeError, match="eye: size must be an int"):
        K.eye(2.0)
    with pytest.raises(TypeError, match="eye: size must be an int"):
        K.eye((2, True))
    with pytest.raises(ValueError, match=r"eye: the matrix would have shape \(%d, %d\)"
                       % (2 ** 40, 2 ** 40)):
        K.eye(2 ** 40)


def test_constant_shape():
    np.testing.assert_array_equal(K.eval(K.constant(1.5, shape=(2, np.int64(2)))),
                                  np.full((2, 2), 1.5))
    with pytest.raises(TypeError, match="constant: shape entries must be integers"):
        K.constant(1.0, shape=(2.0, 2))
    with pytest.raises(ValueError, match=r"constant: the array would have shape"):
        K.constant(1.0, shape=(HUGE, 2))
    big = K.constant(1.0, shape=(2 ** 28,))     # 1 GiB: filled when run, not now
    assert type(big) is not Constant and K.int_shape(big) == (2 ** 28,)
    with pytest.raises(TypeError, match="constant: cannot make a float32 constant"):
        K.constant("a")


def test_placeholder_shape_and_ndim():
    assert K.int_shape(K.placeholder(ndim=np.int64(2))) == (None, None)
    with pytest.raises(TypeError, match="placeholder: ndim must be an int"):
        K.placeholder(ndim=2.0)
    with pytest.raises(TypeError, match="placeholder: ndim must be an int"):
        K.placeholder(ndim=True)
    with pytest.raises(ValueError, match="placeholder: ndim 1000000000 is more than the 64"):
        K.placeholder(ndim=10 ** 9)      # never builds a billion-entry shape
    with pytest.raises(TypeError, match="placeholder: shape entries must be an int"):
        K.placeholder((None, 3.0))
    with pytest.raises(ValueError, match="placeholder: a value fed to it would have shape"):
        K.placeholder((HUGE, HUGE))


@pytest.mark.parametrize("fn", [K.random_normal_variable, K.random_uniform_variable])
def test_random_variables_beyond_memory_are_refused(fn):
    with pytest.raises(ValueError, match=r"%s: the variable would have shape" % fn.__name__):
        fn((HUGE, 2), 0.0, 1.0)


def test_random_tensors_beyond_memory_are_refused_when_built():
    with pytest.raises(ValueError, match=r"random_uniform: the result would have shape"):
        K.random_uniform((HUGE, 2))


def test_a_random_shape_fed_at_run_time_is_checked_then():
    n = K.placeholder((), dtype="int32")
    f = K.function([n], [K.random_normal(K.stack([n, 2 ** 31 - 1]))])
    with pytest.raises(ValueError, match=r"random_normal: the result would have shape"):
        f([np.int32(2 ** 30)])


# ------------------------------------------------------------------ ctc_decode

@pytest.mark.parametrize("kwargs", [{"beam_width": 2.0}, {"top_paths": True},
                                    {"beam_width": "3"}])
def test_ctc_decode_counts_must_be_ints(kwargs):
    y = K.constant(np.full((1, 3, 4), 0.25, "float32"))
    with pytest.raises(TypeError, match="ctc_decode: (beam_width|top_paths) must be an int"):
        K.ctc_decode(y, K.constant([3], dtype="int32"), greedy=False, **kwargs)


# ------------------------------------------------------------------ numbers mixed with tensors

def test_a_number_the_tensor_dtype_cannot_hold_is_a_value_error():
    x = K.constant(np.array([1, 2], "uint8"), dtype="uint8")
    for fn in (K.maximum, K.minimum, K.greater, K.less_equal, K.equal):
        with pytest.raises(ValueError, match="%s: the number -1 does not fit the dtype uint8"
                           % fn.__name__):
            fn(x, -1)
    with pytest.raises(ValueError, match="pow: the number 300 does not fit"):
        K.pow(x, 300)


def test_strings_where_numbers_belong_are_type_errors():
    x = K.constant([1.0, 2.0])
    with pytest.raises(TypeError, match="pow: operands must be numeric"):
        K.pow(x, "a")
    with pytest.raises(TypeError, match="abs: x must be numeric"):
        K.abs("a")
    with pytest.raises(TypeError, match="clip: min_value must be a number or a tensor"):
        K.clip(x, "a", 1.0)
    with pytest.raises(TypeError, match="clip: max_value must be a number or a tensor"):
        K.clip(x, 0.0, [1, "b"])


# ------------------------------------------------------------------ axes and ranks

@pytest.mark.parametrize("fn", [K.argmax, K.argmin, K.cumsum, K.cumprod])
def test_a_single_axis_cannot_be_none(fn):
    with pytest.raises(TypeError, match="%s: axis must be an int, got None" % fn.__name__):
        fn(K.constant(np.ones((2, 3))), None)


def test_bias_add_needs_a_batch_axis_and_one_more():
    with pytest.raises(ValueError, match=r"bias_add: x must have a batch axis and at least one "
                       r"more, got shape \(3,\)"):
        K.bias_add(K.constant([1.0, 2.0, 3.0]), K.constant([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("fn", [K.var, K.std])
def test_var_and_std_name_themselves(fn):
    x = K.constant(np.ones((2, 3)))
    with pytest.raises(ValueError, match="^%s: .*axis 5 is out of range" % fn.__name__):
        fn(x, 5)
    with pytest.raises(TypeError, match="^%s: " % fn.__name__):
        fn(x, True)


# ------------------------------------------------------------------ errors while running

def test_a_run_time_error_names_the_function_that_built_the_op():
    a, b = K.placeholder((None, None)), K.placeholder((None, None))
    phase = K.placeholder((), dtype="bool")
    f = K.function([a, b, phase], [K.in_train_phase(a, b, training=phase)])
    np.testing.assert_array_equal(f([np.ones((2, 2)), np.zeros((2, 2)), True])[0],
                                  np.ones((2, 2)))
    with pytest.raises(ValueError, match="^in_train_phase: .*while running switch"):
        f([np.ones((2, 2)), np.ones((3, 3)), True])


def test_an_error_folding_a_weight_only_value_names_the_function():
    labels = K.variable(np.zeros((0, 0), "int32"), dtype="int32")
    y_pred = K.variable(np.full((1, 3, 4), 0.25, "float32"))
    lengths = K.variable(np.array([[3]], "int32"), dtype="int32")
    loss = K.ctc_batch_cost(labels, y_pred, lengths, lengths)
    with pytest.raises(ValueError, match="^ctc_batch_cost: ctc_loss: labels must have shape"):
        K.function([], [loss])


def test_rnn_over_zero_time_steps_fed_at_run_time():
    x = K.placeholder((2, None, 3))

    def step(x_t, states):
        return x_t, [states[0] + 1.0]
    last, _, _ = K.rnn(step, x, [K.zeros((2, 1))])
    f = K.function([x], [last])
    np.testing.assert_array_equal(f([np.ones((2, 4, 3))])[0], np.ones((2, 3)))
    with pytest.raises(ValueError, match="^rnn: the inputs have 0 time steps"):
        f([np.ones((2, 0, 3))])


@pytest.mark.parametrize("fn", [K.foldl, K.foldr])
def test_a_fold_of_nothing_without_initializer_fed_at_run_time(fn):
    x = K.placeholder((None, 3))
    f = K.function([x], [fn(lambda acc, v: acc + v, x)])
    np.testing.assert_array_equal(f([np.ones((4, 3))])[0], np.full(3, 4.0))
    with pytest.raises(ValueError, match="^%s: elems is empty and no initializer was given"
                       % fn.__name__):
        f([np.ones((0, 3))])


def test_the_size_bound_follows_the_address_space_limit():
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = 2 ** 44
    if soft != resource.RLIM_INFINITY and soft < cap or hard != resource.RLIM_INFINITY \
            and hard < cap:
        pytest.skip("an address-space limit is already in force")
    before = limits.memory_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        assert limits.memory_bytes() == min(cap, before)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# ------------------------------------------------------------------ pooling, reductions

@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_a_same_pool_wider_than_the_input_reduces_whole_axes_at_once(mode, data_format):
    # A billion-row window with 'same' padding covers all 5 rows at each of
    # the ceil(5 / 2) outputs; the kernels get the narrowest window that does
    # (their single-channel loop steps through every cell of the window).
    x = np.random.RandomState(3).randn(2, 5, 5, 3)
    y = K.eval(K.pool2d(K.constant(x, dtype="float64"), (10 ** 9, 1), strides=(2, 1),
                        padding="same", data_format=data_format, pool_mode=mode))
    rows = 1 if data_format == "channels_last" else 2
    reduce = np.max if mode == "max" else np.mean
    want = np.repeat(reduce(x, axis=rows, keepdims=True), 3, axis=rows)
    np.testing.assert_allclose(y, want, rtol=1e-6)


@pytest.mark.parametrize("fn", [K.any, K.all])
def test_any_and_all_of_a_scalar_with_an_axis(fn):
    v = K.variable(3, dtype="int32")
    assert K.eval(fn(v, 0, keepdims=True)) == np.bool_(True)
    assert K.eval(fn(K.constant(0.0), 0)) == np.bool_(False)


@pytest.mark.parametrize("build, numpy_fn", [
    (lambda x: K.repeat_elements(x, 2 ** 31, 1), "repeat"),
    (lambda x: K.resize_volumes(K.reshape(x, (1, -1, 4, 1, 1)), 2 ** 31, 1, 1,
                                "channels_last"), "repeat"),
    (lambda x: K.tile(x, (1, 2 ** 31, 1)), "tile"),
])
def test_huge_counts_of_nothing_make_empty_results_directly(monkeypatch, build, numpy_fn):
    # An axis of size 0 fed at run time: the result is empty, however large
    # the count; NumPy would step through the 2**31 repetitions of nothing
    # (a minute), so the ops make the empty result without it.
    x = K.placeholder((3, 4, None), dtype="uint8")
    f = K.function([x], [build(x)])

    def refuse(*args, **kwargs):
        raise AssertionError("np.%s called for an empty result" % numpy_fn)
    monkeypatch.setattr(np, numpy_fn, refuse)
    out = f([np.zeros((3, 4, 0), "uint8")])[0]
    assert out.size == 0 and out.dtype == np.uint8
