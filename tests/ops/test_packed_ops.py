"""Inference plans pack float32 Dense and conv kernels once (TensorDot.lower,
Conv.lower: PackedProduct, PackedConv): the graph's values up to the order of
sums, the weights' later values, and training plans left alone."""
import pickle

import numpy as np
import pytest
from unoptimized import run_unoptimized

import cyback as K
from cyback.kernels import linalg as kernels_linalg
from cyback.ops.linalg import TensorDot

pytestmark = pytest.mark.skipif(not kernels_linalg.packed_available(),
                                reason="needs avx2: the packed kernels run from AVX2 on")


def _plan_names(f):
    return " ".join(repr(op) for op in f.plan_ops())


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("rows", [1, 3, 64, 300, 700])
def test_a_dense_layer_is_packed_with_its_bias_and_relu(rows, rng):
    x = K.placeholder((None, 37))
    w = K.variable(rng.standard_normal((37, 50)).astype("float32"))
    b = K.variable(rng.standard_normal(50).astype("float32"))
    y = K.relu(K.bias_add(K.dot(x, w), b))
    f = K.function([x], [y])
    assert "PackedProduct" in _plan_names(f)
    feed = rng.standard_normal((rows, 37)).astype("float32")
    got = f([feed])[0]
    want = np.maximum(feed.astype(np.float64) @ K.get_value(w) + K.get_value(b), 0)
    _close(got, want)
    # the frozen weights follow the variables
    K.set_value(w, -K.get_value(w))
    _close(f([feed])[0], np.maximum(feed @ K.get_value(w) + K.get_value(b), 0))


def test_a_product_over_several_axes_with_a_residual(rng):
    # an attention block's output projection: (batch, T, heads, d) x (heads, d, units)
    x = K.placeholder((None, 6, 2, 5))
    r = K.placeholder((None, 6, 20))
    w = K.variable(rng.standard_normal((2, 5, 20)).astype("float32"))
    b = K.variable(rng.standard_normal(20).astype("float32"))
    y = TensorDot((2, 3), (0, 1))(x, w) + b + r
    f = K.function([x, r], [y])
    assert "PackedProduct" in _plan_names(f)
    feeds = [rng.standard_normal((3, 6, 2, 5)).astype("float32"),
             rng.standard_normal((3, 6, 20)).astype("float32")]
    _close(f(feeds)[0], run_unoptimized([x, r], [y], feeds)[0])


def test_a_bias_over_several_axes_goes_into_the_packed_product(rng):
    # an attention block's joined q/k/v projection: (batch, T, d) x (d, heads, 3 * size)
    # with a (heads, 3 * size) bias, then a relu
    x = K.placeholder((None, 6, 8))
    w = K.variable(rng.standard_normal((8, 2, 12)).astype("float32"))
    b = K.variable(rng.standard_normal((2, 12)).astype("float32"))
    y = K.relu(TensorDot((2,), (0,))(x, w) + b)
    f = K.function([x], [y])
    steps = f.plan_ops()
    assert len(steps) == 1 and steps[0].base.biased and steps[0].in_kernel is not None, steps
    feed = rng.standard_normal((3, 6, 8)).astype("float32")
    want = np.maximum(np.tensordot(feed.astype(np.float64), K.get_value(w), (2, 0))
                      + K.get_value(b), 0)
    _close(f([feed])[0], want)
    # rows past the packed kernel's bound take BLAS, the bias added after
    big = rng.standard_normal((200, 6, 8)).astype("float32")
    _close(f([big])[0], np.maximum(np.tensordot(big.astype(np.float64), K.get_value(w),
                                                (2, 0)) + K.get_value(b), 0))


def test_batchnorm_after_dense_is_folded_before_packing(rng):
    x = K.placeholder((None, 12))
    w = K.variable(rng.standard_normal((12, 24)).astype("float32"))
    gamma = K.variable(rng.uniform(0.5, 1.5, 24).astype("float32"))
    beta = K.variable(rng.standard_normal(24).astype("float32"))
    y = K.dot(x, w) * gamma + beta
    f = K.function([x], [y])
    names = _plan_names(f)
    assert "PackedProduct" in names and "multiply" not in names
    feed = rng.standard_normal((5, 12)).astype("float32")
    _close(f([feed])[0], run_unoptimized([x], [y], [feed])[0])


def test_float64_and_training_plans_are_not_packed(rng):
    x64 = K.placeholder((None, 8), dtype="float64")
    w64 = K.variable(rng.standard_normal((8, 30)), dtype="float64")
    assert "Packed" not in _plan_names(K.function([x64], [K.dot(x64, w64)]))
    x = K.placeholder((None, 8))
    w = K.variable(rng.standard_normal((8, 30)).astype("float32"))
    loss = K.sum(K.dot(x, w))
    step = K.function([x], [loss], updates=[K.update_sub(w, 0.1 * K.gradients(loss, [w])[0])])
    assert "Packed" not in _plan_names(step)


def test_products_of_two_inputs_are_not_packed(rng):
    x = K.placeholder((None, 8))
    v = K.placeholder((8, 30))
    assert "Packed" not in _plan_names(K.function([x, v], [K.dot(x, v)]))


def _conv_case(rng, c=72, f=40, size=7, ksize=5):
    x = K.placeholder((None, size, size, c))
    k = K.variable(rng.standard_normal((ksize, ksize, c, f)).astype("float32"))
    return x, k


def test_a_conv_with_batchnorm_residual_and_relu_runs_packed(rng):
    x, k = _conv_case(rng)
    r = K.placeholder((None, 7, 7, 40))
    gamma = K.variable(rng.uniform(0.5, 1.5, 40).astype("float32"))
    beta = K.variable(rng.standard_normal(40).astype("float32"))
    y = K.relu(K.conv2d(x, k, padding="same") * gamma + beta + r)
    f = K.function([x, r], [y])
    names = _plan_names(f)
    assert "PackedConv" in names
    feeds = [rng.standard_normal((1, 7, 7, 72)).astype("float32"),
             rng.standard_normal((1, 7, 7, 40)).astype("float32")]
    got = f(feeds)[0]
    _close(got, run_unoptimized([x, r], [y], feeds)[0])
    # a larger batch leaves the packed rule (too many positions): the same values
    big = [np.repeat(a, 12, axis=0) for a in feeds]
    _close(f(big)[0][:1], got)


def test_a_conv_of_large_maps_keeps_its_kernel_unpacked(rng):
    # 40 x 40 positions at batch 1: the packed rule never takes it, so no
    # packed copy of the kernel is made
    x = K.placeholder((None, 40, 40, 72))
    k = K.variable(rng.standard_normal((5, 5, 72, 40)).astype("float32"))
    f = K.function([x], [K.conv2d(x, k, padding="same")])
    assert "Packed" not in _plan_names(f)
    # unknown sizes: packed, the rule decides per call
    x = K.placeholder((None, None, None, 72))
    f = K.function([x], [K.conv2d(x, k, padding="same")])
    assert "PackedConv" in _plan_names(f)
    feed = rng.standard_normal((1, 7, 7, 72)).astype("float32")
    _close(f([feed])[0], run_unoptimized([x], [K.conv2d(x, k, padding="same")], [feed])[0])


def test_a_padding_is_taken_in_before_the_kernel_is_packed(rng):
    x, k = _conv_case(rng, ksize=3)
    y = K.conv2d(K.spatial_2d_padding(x, ((0, 1), (0, 1))), k, strides=(2, 2))
    f = K.function([x], [y])
    names = _plan_names(f)
    assert "PackedConv" in names and "Pad" not in names
    feed = rng.standard_normal((2, 7, 7, 72)).astype("float32")
    _close(f([feed])[0], run_unoptimized([x], [y], [feed])[0])


def test_channels_first_and_depthwise_are_not_packed(rng):
    x = K.placeholder((None, 72, 7, 7))
    k = K.variable(rng.standard_normal((5, 5, 72, 40)).astype("float32"))
    f = K.function([x], [K.conv2d(x, k, data_format="channels_first")])
    assert "Packed" not in _plan_names(f)
    x = K.placeholder((None, 7, 7, 72))
    dk = K.variable(rng.standard_normal((3, 3, 72, 1)).astype("float32"))
    assert "Packed" not in _plan_names(K.function([x], [K.depthwise_conv2d(x, dk)]))


def test_a_packed_plan_pickles_and_runs_again(rng):
    x, k = _conv_case(rng)
    w = K.variable(rng.standard_normal((40, 30)).astype("float32"))
    y = K.dot(K.mean(K.conv2d(x, k), axis=(1, 2)), w)
    f = K.function([x], [y])
    feed = rng.standard_normal((1, 7, 7, 72)).astype("float32")
    want = f([feed])[0]
    g = pickle.loads(pickle.dumps(f))
    np.testing.assert_array_equal(g([feed])[0], want)
