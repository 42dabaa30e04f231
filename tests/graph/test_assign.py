"""Assignment to variables (set_value, batch_set_value, function updates,
Keras load_weights): all or nothing, every value converted and checked first,
errors naming the variable, and a version bumped by every assignment."""
import numpy as np
import pytest

import cyback as K
from cyback.graph.tensor import assign_all


def _vars():
    a = K.variable(np.zeros((2, 2)), name="a")
    b = K.variable(np.zeros(3), name="b")
    i = K.variable(np.zeros(2), dtype="int32", name="i")
    return a, b, i


@pytest.mark.parametrize("bad,err,msg", [
    (np.array(["x", "y", "z"]), TypeError, r"variable 'b' has dtype float32.*<U1"),
    (None, TypeError, r"variable 'b'.*None"),
    (np.array([1.0, None, 2.0], dtype=object), TypeError, r"variable 'b'.*object"),
    ([1.0, None, 2.0], TypeError, r"variable 'b'"),
    (np.ones(3, complex), TypeError, r"variable 'b'.*complex"),
    (np.ones(4), ValueError, r"variable 'b' has shape \(3,\).*\(4,\)"),
    (b"abc", TypeError, r"variable 'b'"),
])
def test_batch_set_value_checks_everything_before_assigning(bad, err, msg):
    a, b, i = _vars()
    with pytest.raises(err, match=msg):
        K.batch_set_value([(a, np.ones((2, 2))), (b, bad), (i, [1, 2])])
    assert not K.get_value(a).any() and not K.get_value(i).any()
    with pytest.raises(err, match="^batch_set_value"):
        K.batch_set_value([(a, np.ones((2, 2))), (b, bad)])


@pytest.mark.parametrize("bad,err,msg", [
    (None, TypeError, "None"),
    ("hello", TypeError, "dtype"),
    ([[1.0, 2.0], [3.0, None]], TypeError, "object"),
])
def test_set_value_rejects_non_numbers(bad, err, msg):
    a, _, _ = _vars()
    with pytest.raises(err, match=r"^set_value: variable 'a'.*" + msg):
        K.set_value(a, bad)
    np.testing.assert_array_equal(K.get_value(a), np.zeros((2, 2)))


@pytest.mark.parametrize("value,ok", [
    ([1, 2], True), ([1.0, -2.0], True), ([True, False], True),
    ([2 ** 31, 0], False), ([-2 ** 31 - 1, 0], False), ([1.5, 0], False),
    ([np.nan, 0], False), ([np.inf, 0], False), (np.array([2 ** 40, 7], np.int64), False),
    (np.array([2 ** 31 - 1, -2 ** 31], np.int64), True),
])
def test_integer_variables_take_only_representable_values(value, ok):
    _, _, i = _vars()
    if ok:
        K.set_value(i, value)
        np.testing.assert_array_equal(K.get_value(i), np.asarray(value, np.int64))
        assert K.get_value(i).dtype == np.int32
    else:
        with pytest.raises(ValueError, match=r"set_value: variable 'i' has dtype int32"):
            K.set_value(i, value)
        assert not K.get_value(i).any()


@pytest.mark.parametrize("dtype,value", [("float32", 1e300), ("float16", 70000),
                                          ("float16", -1e10)])
def test_float_values_beyond_the_dtype_range(dtype, value):
    v = K.variable(np.zeros(2), dtype=dtype, name="f")
    with pytest.raises(ValueError, match=r"set_value: variable 'f' has dtype %s; the new value "
                       r"holds .*beyond its largest number" % dtype):
        K.set_value(v, [0.0, value])
    K.set_value(v, [np.inf, -np.inf])            # infinities stay infinities
    assert np.isinf(K.get_value(v)).all()
    K.set_value(v, [np.nan, 1.0])
    assert np.isnan(K.get_value(v)[0])


def test_bool_variable():
    v = K.variable(np.zeros(2, bool), dtype="bool")
    K.set_value(v, [1, 0])
    assert K.get_value(v).tolist() == [True, False]
    with pytest.raises(ValueError, match="bool"):
        K.set_value(v, [2, 0])


def test_value_is_copied_and_cast():
    a = K.variable(np.zeros(3), name="a")
    src = np.arange(3, dtype="float64")
    K.set_value(a, src)
    src[0] = 99
    assert K.get_value(a).tolist() == [0, 1, 2] and K.get_value(a).dtype == np.float32
    same = np.ones(3, "float32")
    K.set_value(a, same)
    same[0] = 5
    assert K.get_value(a)[0] == 1


def test_update_with_wrong_runtime_shape_assigns_nothing():
    a = K.variable(np.zeros(2), name="a")
    b = K.variable(np.zeros(2), name="b")
    x = K.placeholder((None,))
    f = K.function([x], [], updates=[K.update(a, a + 1), K.update(b, x)])
    with pytest.raises(ValueError, match=r"update: variable 'b' has shape \(2,\)"):
        f([np.ones(3, "float32")])
    assert not K.get_value(a).any()


def test_assign_all_rejects_bad_pairs():
    a = K.variable(0.0)
    with pytest.raises(TypeError, match="set_value: expected variables"):
        assign_all([(K.placeholder(()), 1.0)], "set_value")
    with pytest.raises(TypeError, match="batch_set_value: expected \\(variable, value\\) pairs"):
        K.batch_set_value([a])
    with pytest.raises(TypeError, match="symbolic"):
        K.set_value(a, K.constant(1.0))


# ------------------------------------------------------------------ versions

def test_every_assignment_path_bumps_the_version():
    a = K.variable(np.zeros(2), name="a")
    seen = [a._version]

    def bumped():
        assert a._version not in seen
        assert a._version > seen[-1]
        seen.append(a._version)
    K.set_value(a, [1.0, 2.0])
    bumped()
    K.batch_set_value([(a, [3.0, 4.0])])
    bumped()
    K.set_value(a, K.get_value(a))          # same value: still an assignment
    bumped()
    f = K.function([], [], updates=[K.update_add(a, 1.0)])
    f([])
    bumped()
    K.function([], [], updates=[(a, a * 2)])([])
    bumped()
    K.function([], [K.sum(a)])([])          # reading does not bump
    assert a._version == seen[-1]
    with pytest.raises(TypeError):
        K.set_value(a, None)                # a rejected value does not either
    assert a._version == seen[-1]


def test_versions_never_repeat_across_variables():
    vs = [K.variable(0.0) for _ in range(3)]
    K.batch_set_value([(v, 1.0) for v in vs])
    versions = [v._version for v in vs]
    assert len(set(versions)) == 3


# ------------------------------------------------------------------ update ops

@pytest.mark.parametrize("api,args", [
    ("update_add", (np.zeros(3), np.ones(2))),
    ("update_sub", (np.zeros(3), np.ones(2))),
    ("moving_average_update", (np.zeros(3), np.ones(2), 0.9)),
    ("update", (np.zeros(3), np.ones(2))),
])
def test_update_shape_errors_name_the_function(api, args):
    v = K.variable(args[0])
    rest = [K.constant(a) if isinstance(a, np.ndarray) else a for a in args[1:]]
    with pytest.raises(ValueError, match="^%s: " % api):
        getattr(K, api)(v, *rest)


@pytest.mark.parametrize("api,args,name", [
    ("update_add", ("x",), "increment"), ("update_sub", (None,), "decrement"),
    ("update", ("s",), "new_x"),
    ("moving_average_update", ("a", 0.9), "value"),
    ("moving_average_update", (1.0, "m"), "momentum"),
])
def test_update_operands_must_be_numbers(api, args, name):
    v = K.variable(np.zeros(3))
    with pytest.raises(TypeError, match="^%s: %s must be a tensor or a number" % (api, name)):
        getattr(K, api)(v, *args)


def test_moving_average_update_value():
    v = K.variable(np.full(3, 2.0))
    K.function([], [], updates=[K.moving_average_update(v, np.array([0.0, 1.0, 2.0]), 0.75)])([])
    np.testing.assert_allclose(K.get_value(v), 2.0 * 0.75 + np.array([0.0, 1.0, 2.0]) * 0.25)


def test_run_time_update_shape_error_names_the_update_function():
    v = K.variable(np.zeros((1, 2)), name="v")
    x = K.placeholder((None, None))
    f = K.function([x], [], updates=[K.update_add(v, x)])
    with pytest.raises(ValueError, match=r"^update_add: variable 'v' has shape \(1, 2\), the new "
                       r"value has shape \(3, 2\)"):
        f([np.ones((3, 2), "float32")])
