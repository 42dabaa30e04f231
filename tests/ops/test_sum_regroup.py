"""An inference plan adds a sum's weight terms first (Binary.rewrite): a
conv's bias and a BatchNorm's shift become one bias that the kernel adds in
its epilogue, with a residual after it; the values of the graph as written,
up to rounding."""
import numpy as np
import pytest
from unoptimized import run_unoptimized

import cyback as K


def _bn(y, rng, c):
    mean = K.variable(rng.standard_normal(c).astype("float32"))
    var = K.variable(rng.uniform(0.5, 1.5, c).astype("float32"))
    beta = K.variable(rng.standard_normal(c).astype("float32"))
    gamma = K.variable(rng.uniform(0.5, 1.5, c).astype("float32"))
    return K.batch_normalization(y, mean, var, beta, gamma, epsilon=1e-3)


def _conv(y, rng, c, f, bias=True):
    k = K.variable(0.3 * rng.standard_normal((1, 1, c, f)).astype("float32"))
    y = K.conv2d(y, k)
    if bias:
        y = K.bias_add(y, K.variable(rng.standard_normal(f).astype("float32")))
    return y


def test_bias_and_batchnorm_shift_are_one_bias_in_the_kernel(rng):
    x = K.placeholder((None, 6, 6, 8))
    y = K.relu(_bn(_conv(x, rng, 8, 16), rng, 16))
    f = K.function([x], [y])
    steps = f.plan_ops()
    assert len(steps) == 1 and steps[0].in_kernel is not None, steps
    feed = rng.standard_normal((2, 6, 6, 8)).astype("float32")
    np.testing.assert_allclose(f([feed])[0], run_unoptimized([x], [y], [feed])[0], rtol=1e-5,
                               atol=1e-5)


def test_a_residual_block_adds_both_branches_biases_once(rng):
    x = K.placeholder((None, 6, 6, 16))
    main = _bn(_conv(x, rng, 16, 16), rng, 16)
    short = _bn(_conv(x, rng, 16, 16), rng, 16)
    y = K.relu(main + short)
    f = K.function([x], [y])
    steps = f.plan_ops()
    # the shortcut's conv, then the main conv with one bias, the shortcut as
    # its residual and the relu in its epilogue
    assert len(steps) == 2 and steps[1].in_kernel is not None, steps
    feed = rng.standard_normal((1, 6, 6, 16)).astype("float32")
    np.testing.assert_allclose(f([feed])[0], run_unoptimized([x], [y], [feed])[0], rtol=1e-5,
                               atol=1e-5)


def test_a_sum_read_twice_is_not_computed_again_inside_the_next_sum(rng):
    # MobileNetV2: a block's output (a conv, its BatchNorm) feeds the next
    # block's conv and its residual add; that add must read it, not redo it
    x = K.placeholder((None, 5, 5, 8))
    block = _bn(_conv(x, rng, 8, 12, bias=False), rng, 12)
    out = _bn(_conv(block, rng, 12, 12, bias=False), rng, 12) + block
    f = K.function([x], [out])
    steps = f.plan_ops()
    assert len(steps) == 2, steps
    feed = rng.standard_normal((3, 5, 5, 8)).astype("float32")
    np.testing.assert_allclose(f([feed])[0], run_unoptimized([x], [out], [feed])[0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_plain_sums_of_data_and_weights(dtype, rng):
    x = K.placeholder((None, 7), dtype=dtype)
    z = K.placeholder((None, 7), dtype=dtype)
    a = K.variable(rng.standard_normal(7), dtype=dtype)
    b = K.variable(rng.standard_normal(7), dtype=dtype)
    y = ((x + a) + z) + b
    f = K.function([x, z], [y])
    feeds = [rng.standard_normal((4, 7)).astype(dtype), rng.standard_normal((4, 7)).astype(dtype)]
    tol = 1e-12 if dtype == "float64" else 1e-6
    np.testing.assert_allclose(f(feeds)[0], run_unoptimized([x, z], [y], feeds)[0], rtol=tol,
                               atol=tol)


def test_training_plans_keep_the_sum_as_written(rng):
    x = K.placeholder((None, 6, 6, 8))
    y = _bn(_conv(x, rng, 8, 16), rng, 16)
    loss = K.sum(y)
    w = K.variable(np.ones(16, np.float32))
    step = K.function([x], [loss * w[0]], updates=[K.update_add(w, K.zeros_like(w))])
    feed = rng.standard_normal((1, 6, 6, 8)).astype("float32")
    want = run_unoptimized([x], [loss * w[0]], [feed])[0]
    np.testing.assert_array_equal(step([feed])[0], want)
