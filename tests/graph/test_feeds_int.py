"""Integer feeds never wrap around: a value outside the placeholder's dtype
(or a float that is not a whole number) is a ValueError naming the
placeholder and the function, and so is an out-of-range gather index."""
import numpy as np
import pytest

import cyback as K


def _lookup(dtype="int32"):
    table = K.variable(np.arange(10.0).reshape(10, 1))
    idx = K.placeholder((None,), dtype=dtype, name="idx")
    return K.function([idx], [K.gather(table, idx)], name="lookup")


@pytest.mark.parametrize("value,shown", [
    ([2 ** 40 + 7], "1099511627783"),
    ([2 ** 32 + 3], "4294967299"),
    (np.array([2 ** 40 + 7], np.int64), "1099511627783"),
    (np.array([2 ** 64 - 1], np.uint64), "18446744073709551615"),
    ([1e20], "1e\\+20"),
    ([-1e20], "-1e\\+20"),
    ([2.0 ** 31], "2147483648"),
])
def test_out_of_range_int32_feed(value, shown):
    f = _lookup()
    with pytest.raises(ValueError, match=r"^function 'lookup': placeholder 'idx' has dtype "
                       r"int32; the value fed holds %s, outside \[-2147483648, 2147483647\]"
                       % shown):
        f([value])


@pytest.mark.parametrize("value,msg", [([1.5], "non-integral"), ([np.nan], "NaN"),
                                       ([np.inf], "infinite")])
def test_non_integral_float_feed(value, msg):
    with pytest.raises((ValueError, TypeError), match="placeholder 'idx'"):
        _lookup()([value])


@pytest.mark.parametrize("dtype,value,ok", [
    ("uint8", [255], True), ("uint8", [256], False), ("uint8", [-1], False),
    ("int8", [-128, 127], True), ("int8", [128], False),
    ("int64", [2 ** 40], True), ("int64", np.array([2 ** 63], np.uint64), False),
    ("int32", np.array([7], np.uint8), True), ("int32", [True, False], True),
])
def test_range_per_dtype(dtype, value, ok):
    ph = K.placeholder((None,), dtype=dtype, name="n")
    f = K.function([ph], [ph + 0], name="ident")
    if ok:
        out = f([value])[0]
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out, np.asarray(value).astype(np.int64))
    else:
        with pytest.raises(ValueError, match="function 'ident': placeholder 'n' has dtype %s"
                           % dtype):
            f([value])


def test_in_range_values_pass_and_empty_feed():
    f = _lookup()
    np.testing.assert_array_equal(f([[9, -10, 0.0]])[0].ravel(), [9, 0, 0])
    assert f([np.zeros(0, np.int64)])[0].shape == (0, 1)


@pytest.mark.parametrize("index", [10, -11, 2 ** 31 - 1, -2 ** 31])
def test_gather_index_out_of_range_at_run_time(index):
    with pytest.raises(ValueError, match=r"gather: index %d is out of range for a reference "
                       r"of shape \(10, 1\)" % index):
        _lookup()([[0, index]])


def test_gather_with_large_python_int_index_does_not_wrap():
    table = K.variable(np.arange(10.0).reshape(10, 1))
    with pytest.raises(ValueError, match="gather: index 1099511627779 is out of range"):
        K.gather(table, [2 ** 40 + 3])
    # Python ints that fit take int32, as before.
    assert K.constant(0).dtype == "float32"
    from cyback.graph.tensor import as_tensor
    assert as_tensor([1, 2]).dtype == "int32" and as_tensor([2 ** 40]).dtype == "int64"
