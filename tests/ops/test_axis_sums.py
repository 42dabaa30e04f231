"""ops.axis_sums: which reductions take the kernel, and the same values,
shapes and dtypes as NumPy on both routes; then through K.sum / K.mean and
a bias gradient."""
import numpy as np
import pytest

import cyback as K
from cyback.ops import axis_sums


@pytest.mark.parametrize("shape,axes,view", [
    ((2, 5, 5, 8), (1, 2), (2, 25, 8)),
    ((32, 7, 16), (0, 1), (1, 224, 16)),
    ((4, 3), (0,), (1, 4, 3)),
    ((4, 3, 2), (1,), (4, 3, 2)),
    ((4, 3), (1,), None),          # the last axis: NumPy's contiguous sum
    ((4, 3, 2), (0, 2), None),     # not one run of axes
    ((4, 3, 1), (0, 1), None),     # nothing left to vectorise over
    ((4, 0, 2), (1,), None),       # an empty reduction
    ((4, 3), (), None),
])
def test_middle_view(shape, axes, view):
    assert axis_sums.middle_view(shape, axes) == view


CASES = [((2, 5, 5, 8), (1, 2)), ((32, 7, 16), (0, 1)), ((9, 3), (0,)), ((3, 4, 5), (2,)),
         ((3, 4, 5), (0, 2)), ((3, 4, 5), None), ((0, 4, 5), (0,)), ((6, 1, 1, 4), (1, 2))]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32"])
@pytest.mark.parametrize("shape,axes", CASES)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("mean", [False, True])
def test_matches_numpy(shape, axes, keepdims, mean, dtype):
    x = (np.random.default_rng(1).standard_normal(shape) * 4).astype(dtype)
    if mean and 0 in shape:
        return              # NumPy warns and gives NaN; not this module's business
    y = axis_sums.sum_axes(x, axes, keepdims, mean)
    ref = (np.mean if mean else np.sum)(x.astype(np.float64), axis=axes, keepdims=keepdims)
    assert y.shape == np.shape(ref) and y.dtype == x.dtype
    tol = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12, "int32": 0.5}[dtype]
    if dtype == "int32" and mean:
        tol = 1.0
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=tol, atol=tol)


def test_non_contiguous_input():
    x = np.random.default_rng(2).standard_normal((8, 6, 10)).astype(np.float32)
    v = x[:, :, ::2]
    np.testing.assert_allclose(axis_sums.sum_axes(v, (0, 1)), v.sum(axis=(0, 1)), rtol=1e-5)


def test_global_average_pooling_and_its_gradient():
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((3, 4, 5, 6)).astype(np.float32)
    x = K.placeholder((None, 4, 5, 6))
    y = K.mean(x, axis=[1, 2])
    w = K.variable(rng.standard_normal(6).astype(np.float32))
    loss = K.sum(y * w)
    f = K.function([x], [y] + K.gradients(loss, [x]))
    yv, gx = f([xv])
    np.testing.assert_allclose(yv, xv.mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gx, np.broadcast_to(K.get_value(w) / 20, xv.shape), rtol=1e-6)


def test_bias_gradient_sums_over_every_axis_but_the_channels():
    rng = np.random.default_rng(4)
    xv = rng.standard_normal((2, 3, 7, 5)).astype(np.float32)
    gv = rng.standard_normal((2, 3, 7, 5)).astype(np.float32)
    x = K.placeholder((None, 3, 7, 5))
    g = K.placeholder((None, 3, 7, 5))
    b = K.variable(np.zeros(5, np.float32))
    out = K.bias_add(x, b)
    f = K.function([x, g], K.gradients(K.sum(out * g), [b]))
    np.testing.assert_allclose(f([xv, gv])[0], gv.sum(axis=(0, 1, 2)), rtol=1e-5, atol=1e-5)


def test_remembered_plans_serve_only_their_own_key():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6, 5, 8)).astype(np.float32)
    axis_sums._PLANS.clear()
    for _ in range(2):      # the second round reads the remembered plans
        np.testing.assert_allclose(axis_sums.sum_axes(x, (1, 2), True, True),
                                   x.mean(axis=(1, 2), keepdims=True), rtol=1e-5)
        np.testing.assert_allclose(axis_sums.sum_axes(x, (1, 2)), x.sum(axis=(1, 2)), rtol=1e-5)
        # same shape, not contiguous: NumPy's route
        v = np.swapaxes(x, 1, 2).copy().swapaxes(1, 2)
        np.testing.assert_allclose(axis_sums.sum_axes(v, (1, 2)), x.sum(axis=(1, 2)), rtol=1e-5)
        xd = x.astype(np.float64)
        np.testing.assert_allclose(axis_sums.sum_axes(xd, (1, 2)), xd.sum(axis=(1, 2)))
    assert ((2, 6, 5, 8), np.dtype(np.float32).num, (1, 2), True) in axis_sums._PLANS
    # many shapes: the memo stays bounded
    for n in range(1, axis_sums._PLANS_MAX + 10):
        axis_sums.sum_axes(np.ones((n, 2, 3), np.float32), (0, 1))
    assert len(axis_sums._PLANS) <= axis_sums._PLANS_MAX
    assert axis_sums.sum_axes(np.ones((5, 2, 3), np.float32), (0, 1)).tolist() == [10.0] * 3


@pytest.mark.parametrize("shape,axes,keepdims", [
    ((2, 398, 250), (1,), False),        # a global max pool of codes over time
    ((3, 4, 5, 6), (1, 2), True),
    ((1, 7, 1), (1,), False),            # inner of 1: NumPy
    ((2, 3), None, False),
])
def test_max_of_codes_matches_numpy(shape, axes, keepdims):
    x = np.random.default_rng(5).integers(0, 256, shape, dtype=np.uint8)
    for want_max, fn in ((True, np.max), (False, np.min)):
        got = axis_sums.extreme_axes(x, axes, keepdims, want_max)
        want = fn(x, axis=axes, keepdims=keepdims)
        assert got.dtype == np.uint8 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    # sums of codes stay NumPy's
    np.testing.assert_array_equal(axis_sums.sum_axes(x, axes, keepdims),
                                  np.sum(x, axis=axes, keepdims=keepdims, dtype=np.uint8))
