"""Activation ranges (minmax, percentile, entropy), the scale and zero point
they give, and the symmetric per-channel weight codes."""

import numpy as np
import pytest

from cyback.quantization import calibration, weights
from cyback.quantization.calibration import Observer, scale_and_zero


def observe(method, batches, **kwargs):
    obs = Observer(method, **kwargs)
    for p in range(obs.passes):
        for b in batches:
            obs.observe(b, p)
    return obs


# ---------------------------------------------------------------- scale and zero point

def test_uint8_scale_and_zero_point_cover_the_range_with_zero_exact():
    scale, zero = scale_and_zero(-1.0, 3.0)
    assert scale == np.float32(4.0 / 255)
    assert zero == round(1.0 / scale) == 64
    # codes 0 and 255 reach the ends, to within a step
    assert abs((0 - zero) * scale - -1.0) <= scale and abs((255 - zero) * scale - 3.0) <= scale
    # a range not containing 0 is widened to it
    assert scale_and_zero(2.0, 5.0) == scale_and_zero(0.0, 5.0)
    s, z = scale_and_zero(0.0, 5.0)
    assert z == 0 and s == np.float32(5.0 / 255)
    s, z = scale_and_zero(-5.0, -1.0)
    assert z == 255 and s == np.float32(5.0 / 255)


def test_int8_is_symmetric_around_128():
    s, z = scale_and_zero(-0.5, 2.54, activations="int8")
    assert z == 128 and s == np.float32(2.54 / 127)
    s, z = scale_and_zero(-3.0, 1.0, activations="int8")
    assert z == 128 and s == np.float32(3.0 / 127)


def test_constant_inputs_get_a_usable_scale():
    assert scale_and_zero(0.0, 0.0) == (1.0, 0)
    assert scale_and_zero(0.0, 0.0, activations="int8") == (1.0, 128)
    assert scale_and_zero(-1e-45, 0.0) == (1.0, 0)      # the step underflows in float32


def test_bad_options():
    with pytest.raises(ValueError, match="activations"):
        scale_and_zero(0, 1, activations="int4")
    with pytest.raises(ValueError, match="method"):
        Observer("mse")
    with pytest.raises(ValueError, match="percentile"):
        Observer("percentile", percentile=20)
    with pytest.raises(ValueError, match="no finite values"):
        Observer("minmax").range()
    with pytest.raises(ValueError, match="no finite values"):
        observe("minmax", [np.array([np.nan, np.inf], np.float32)]).range()


# ---------------------------------------------------------------- ranges

def test_minmax_is_the_observed_range_across_batches(rng):
    batches = [rng.standard_normal((4, 7)).astype(np.float32) for _ in range(5)]
    obs = observe("minmax", batches)
    assert obs.passes == 1
    lo = min(b.min() for b in batches)
    hi = max(b.max() for b in batches)
    assert obs.range() == (pytest.approx(lo), pytest.approx(hi))
    assert observe("minmax", [np.array([1.0, 2.0], np.float32)]).range() == (0.0, 2.0)
    sym = observe("minmax", batches, symmetric=True).range()
    assert sym == (-max(-lo, hi), max(-lo, hi))
    # non-finite values are not part of a range
    assert observe("minmax", [np.array([np.nan, -np.inf, 1.5], np.float32)]).range() == (0, 1.5)


def test_percentile_clips_the_outliers(rng):
    x = rng.uniform(-1, 1, 100000).astype(np.float32)
    x[:5] = [-50, 40, 60, -70, 80]
    lo, hi = observe("percentile", [x[:50000], x[50000:]], percentile=99.9).range()
    assert -1.1 < lo < -0.95 and 0.95 < hi < 1.1
    lo100, hi100 = observe("percentile", [x], percentile=100).range()
    assert lo100 == pytest.approx(-70) and hi100 == pytest.approx(80)
    # symmetric: the percentile of |x|
    lo, hi = observe("percentile", [x], percentile=99.9, symmetric=True).range()
    assert lo == -hi and 0.95 < hi < 1.1


def test_entropy_keeps_a_uniform_range_and_clips_long_tails(rng):
    x = rng.uniform(0, 4, 200000).astype(np.float32)
    lo, hi = observe("entropy", [x]).range()
    assert lo == 0 and hi > 3.8
    # a ReLU of a Gaussian with a few huge values: the window drops the tail
    g = np.maximum(rng.standard_normal(200000), 0).astype(np.float32)
    g[:3] = [100, 200, 300]
    lo, hi = observe("entropy", [g]).range()
    assert lo == 0 and 2 < hi < 60
    lo, hi = observe("entropy", [g - 1.0]).range()
    assert lo < 0 < hi < 60
    lo, hi = observe("entropy", [np.concatenate([g, -g])], symmetric=True).range()
    assert lo == -hi and 2 < hi < 60


def test_histogram_methods_read_the_data_twice(rng):
    assert Observer("percentile").passes == 2 and Observer("entropy").passes == 2
    obs = Observer("entropy")
    obs.observe(np.zeros(10, np.float32), 0)
    obs.observe(np.zeros(10, np.float32), 1)
    assert obs.range() == (0.0, 0.0)
    assert obs.scale_and_zero("uint8") == (1.0, 0)


def test_kl_prefers_the_window_that_loses_least():
    # a decaying histogram with one far outlier: in the full range each
    # code spans 8 bins of a steep slope; a window around the mass keeps
    # its shape
    hist = np.zeros(calibration.BINS, np.int64)
    hist[:400] = (1e6 * np.exp(-np.arange(400) / 30.0)).astype(np.int64)
    hist[-1] = 1
    first, last = calibration._entropy_window(hist, 0.0, 1.0, 255)
    assert first == 0 and 127 <= last < 600
    assert calibration._kl_of_window(hist, 0, last, 255) < \
        calibration._kl_of_window(hist, 0, calibration.BINS - 1, 255)
    # the same with the mass below zero as well: the lower end moves too
    both = np.concatenate([hist[::-1], hist])
    first, last = calibration._entropy_window(both, -1.0, 1.0, 255)
    assert 0 < first < 2048 - 127 and 2048 + 127 <= last < 2048 + 600


# ---------------------------------------------------------------- weights

def test_weights_per_channel(rng):
    w = rng.standard_normal((3, 3, 4, 6)) * np.array([1, 10, 0.1, 0, 1e-3, 5])
    codes, scale = weights.quantize_kernel(w)
    assert codes.dtype == np.int8 and codes.shape == w.shape
    assert scale.dtype == np.float32 and scale.shape == (6,)
    flat = w.reshape(-1, 6)
    for n in (0, 1, 2, 4, 5):
        assert scale[n] == np.float32(np.abs(flat[:, n]).max() / 127)
        assert np.abs(codes.reshape(-1, 6)[:, n]).max() == 127
        want = np.clip(np.rint(flat[:, n] / np.float64(scale[n])), -127, 127)
        assert np.array_equal(codes.reshape(-1, 6)[:, n], want)
    # an all-zero channel: scale 1, codes 0
    assert scale[3] == 1.0 and not codes[..., 3].any()
    assert codes.min() >= -127


def test_weights_per_tensor_and_bad_kernels(rng):
    w = rng.standard_normal((5, 4)) * np.array([1, 2, 3, 4])
    codes, scale = weights.quantize_kernel(w, per_channel=False)
    assert np.all(scale == np.float32(np.abs(w).max() / 127))
    assert np.abs(codes).max() == 127
    with pytest.raises(ValueError, match="NaN"):
        weights.quantize_kernel(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="output axis"):
        weights.quantize_kernel(np.zeros((3, 0)))
    codes, scale = weights.quantize_kernel(np.zeros((0, 3)))
    assert codes.shape == (0, 3) and np.all(scale == 1)
