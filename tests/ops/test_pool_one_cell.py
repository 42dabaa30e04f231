"""Pooling with windows of one cell (ops/pool.py, ``_subsample``): every
stride-th cell, with the kernel's bits (an average adds to +0.0, so -0.0
becomes +0.0; NaNs stay NaN), from arrays of any layout, in both data
formats, and in plans (NASNet's adjust blocks pool a cropped, padded map:
a strided view)."""
import numpy as np
import pytest

import cyback as K
from cyback.kernels import pool as kernels
from cyback.ops.pool import Pool

CASES = [((2, 7, 9, 5), (2, 2), "valid"), ((2, 7, 9, 5), (2, 3), "same"),
         ((1, 5, 6, 4), (1, 1), "valid"), ((3, 11, 4), (2,), "same"),
         ((1, 4, 5, 6, 3), (2, 1, 3), "same"), ((1, 1, 1, 2), (3, 3), "same")]


def _values(shape, dtype, rng):
    x = rng.standard_normal(shape).astype(dtype)
    x.flat[::7] = -0.0
    x.flat[::11] = np.nan
    x.flat[::13] = np.inf
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("shape,strides,padding", CASES)
def test_one_cell_windows_give_the_kernels_bits(dtype, mode, channels_last, shape, strides,
                                                padding):
    rng = np.random.default_rng(len(shape))
    x = _values(shape, dtype, rng)
    op = Pool("pool", (1,) * len(strides), strides, padding, channels_last, mode)
    want = kernels.pool_forward(x, (1,) * len(strides), strides, op.pads(x.shape),
                                channels_last, mode)
    wide = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
    wide[..., ::2] = x
    for given in (x, wide[..., ::2]):          # contiguous and a strided view
        got = op.compute(given)[0]
        assert got.shape == want.shape == op.out_shape(x.shape) and got.dtype == dtype
        assert got.flags.c_contiguous and not np.shares_memory(got, given)
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))


def test_a_plan_pools_a_cropped_padded_map_as_the_kernel_would():
    # ZeroPadding2D(((0, 1), (0, 1))), Cropping2D(((1, 0), (1, 0))), then a
    # strided 1x1 average pool: NASNet's adjust block
    rng = np.random.default_rng(0)
    x = K.placeholder((None, 9, 9, 4))
    shifted = K.spatial_2d_padding(x, ((0, 1), (0, 1)))[:, 1:, 1:, :]
    f = K.function([x], [K.pool2d(shifted, (1, 1), strides=(2, 2), pool_mode="avg"),
                         K.pool2d(x, (1, 1), strides=(2, 2), padding="same")])
    xv = _values((2, 9, 9, 4), np.float32, rng)
    for _ in range(3):
        avg, mx = f([xv])
    padded = np.pad(xv, ((0, 0), (0, 1), (0, 1), (0, 0)))[:, 1:, 1:, :]
    np.testing.assert_array_equal(avg, padded[:, ::2, ::2, :] + np.float32(0))
    np.testing.assert_array_equal(mx, xv[:, ::2, ::2, :])
    assert np.array_equal(np.signbit(mx), np.signbit(xv[:, ::2, ::2, :]))
