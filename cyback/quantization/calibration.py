"""Activation ranges from calibration batches, and the scale and zero point
they give.

An ``Observer`` sees every batch of one tensor (a quantized layer's input).
``minmax`` keeps the smallest and largest value in one pass. ``percentile``
and ``entropy`` take two: the first finds the range, the second fills a
histogram of ``BINS`` bins over it, from which

- ``percentile`` clips at the given percentile of the values at each end;
- ``entropy`` picks the clipping window whose 256-level (127 for int8)
  quantization loses the least information about the histogram: the window
  minimising the Kullback-Leibler divergence between the clipped histogram
  (values outside folded into the edge bins) and its quantized version, the
  method TensorRT introduced for int8 (there on |x|); for asymmetric uint8
  ranges the upper end is chosen first, then the lower one.

The range always includes 0, so that 0.0 (a convolution's padding, a ReLU's
output) has an exact code.
"""
import math

import numpy as np

METHODS = ("minmax", "percentile", "entropy")
ACTIVATIONS = ("uint8", "int8")
BINS = 2048
#: the narrowest window ``entropy`` considers, in bins
MIN_WINDOW_BINS = 128


class Observer(object):
    """The range of one tensor over the calibration batches."""

    def __init__(self, method, percentile=99.99, symmetric=False):
        if method not in METHODS:
            raise ValueError("quantize: method must be one of %s, got %r" % (METHODS, method))
        if not 50 < percentile <= 100:
            raise ValueError("quantize: percentile must be in (50, 100], got %r" % (percentile,))
        self.method = method
        self.percentile = float(percentile)
        self.symmetric = symmetric
        self.low = math.inf
        self.high = -math.inf
        self.count = 0
        self.hist = None

    @property
    def passes(self):
        """Passes over the calibration data this method needs."""
        return 1 if self.method == "minmax" else 2

    def observe(self, x, pass_index=0):
        x = np.asarray(x, dtype=np.float32).ravel()
        x = x[np.isfinite(x)]
        if x.size == 0:
            return
        if pass_index == 0:
            self.low = min(self.low, float(x.min()))
            self.high = max(self.high, float(x.max()))
            self.count += x.size
            return
        lo, hi = self._hist_range()
        if hi <= lo:
            return
        values = np.abs(x) if self.symmetric else x
        counts, _ = np.histogram(values, bins=BINS, range=(lo, hi))
        self.hist = counts.astype(np.int64) if self.hist is None else self.hist + counts

    def _hist_range(self):
        low, high = min(self.low, 0.0), max(self.high, 0.0)
        if self.symmetric:
            return 0.0, max(-low, high)
        return low, high

    def range(self):
        """The calibrated (low, high), low <= 0 <= high."""
        if self.count == 0:
            raise ValueError("quantize: the calibration data gave no finite values for a "
                             "quantized layer's input")
        lo, hi = self._hist_range()
        if self.method == "minmax" or self.hist is None or hi <= lo:
            return (-hi, hi) if self.symmetric else (lo, hi)
        edges = np.linspace(lo, hi, BINS + 1)
        if self.method == "percentile":
            first, last = _percentile_bins(self.hist, self.percentile, not self.symmetric)
        else:
            first, last = _entropy_window(self.hist, lo, hi, 127 if self.symmetric else 255)
        a, b = min(float(edges[first]), 0.0), max(float(edges[last + 1]), 0.0)
        return (-b, b) if self.symmetric else (a, b)

    def scale_and_zero(self, activations):
        return scale_and_zero(*self.range(), activations=activations)


def scale_and_zero(low, high, activations="uint8"):
    """(scale, zero point) of the uint8 codes for values in [low, high]:
    ``uint8`` spreads 256 codes over the range (which includes 0, at the zero
    point); ``int8`` is symmetric, codes -127..127 around a zero point of
    128 (the kernels take activations as unsigned bytes)."""
    if activations not in ACTIVATIONS:
        raise ValueError("quantize: activations must be one of %s, got %r"
                         % (ACTIVATIONS, activations))
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    if activations == "int8":
        bound = max(-low, high)
        scale = bound / 127.0
        zero = 128
    else:
        scale = (high - low) / 255.0
        zero = None
    scale = float(np.float32(scale))
    if not (scale > 0 and math.isfinite(scale)):
        # a constant input (zero, or too small for float32 scales): any scale
        # codes 0.0 exactly
        return 1.0, 128 if activations == "int8" else 0
    if zero is None:
        zero = int(min(max(round(-low / scale), 0), 255))
    return scale, zero


def _percentile_bins(hist, percentile, both_ends):
    """The first and last bins inside the percentile (and, with
    ``both_ends``, its complement at the low end)."""
    cum = np.cumsum(hist)
    total = cum[-1]
    if total == 0:
        return 0, len(hist) - 1
    tail = total * (100.0 - percentile) / 100.0
    last = int(np.searchsorted(cum, total - tail, side="left"))
    first = int(np.searchsorted(cum, tail, side="right")) if both_ends else 0
    first = min(first, last)
    return first, min(last, len(hist) - 1)


def _entropy_window(hist, lo, hi, levels):
    """The bins (first, last) of the window with the least KL divergence:
    the upper end searched with the lower one at the minimum, then the lower
    end with that upper one (zero stays inside; each end moves in steps of
    8 bins, the window keeps MIN_WINDOW_BINS or all of them)."""
    n = len(hist)
    if hist.sum() == 0:
        return 0, n - 1
    zero = min(max(int((0.0 - lo) / (hi - lo) * n), 0), n - 1)
    least = min(MIN_WINDOW_BINS, n)

    def best(windows):
        found, found_kl = None, math.inf
        for first, last in windows:
            kl = _kl_of_window(hist, first, last, levels)
            if kl < found_kl:
                found, found_kl = (first, last), kl
        return found

    lasts = sorted(set(range(max(zero, least - 1), n, 8)) | {n - 1})
    _, last = best((0, last) for last in lasts) or (0, n - 1)
    firsts = sorted(set(range(min(zero, last + 1 - least), -1, -8)) | {0})
    first, _ = best((first, last) for first in firsts if first >= 0) or (0, last)
    return first, last


def _kl_of_window(hist, first, last, levels):
    p = hist[first:last + 1].astype(np.float64)
    p[0] += hist[:first].sum()
    p[-1] += hist[last + 1:].sum()
    width = p.size
    # each code covers a run of bins; its count is spread over the run's
    # non-empty bins (empty bins stay empty in the quantized histogram)
    groups = np.minimum((np.arange(width) * levels) // width, levels - 1)
    nonzero = hist[first:last + 1] > 0
    sums = np.bincount(groups, weights=hist[first:last + 1].astype(np.float64),
                       minlength=levels)
    counts = np.bincount(groups, weights=nonzero.astype(np.float64), minlength=levels)
    q = np.where(nonzero, sums[groups] / np.maximum(counts[groups], 1), 0.0)
    # the folded outliers are part of p, not of what the codes reproduce
    ps = p / p.sum()
    qs_total = q.sum()
    if qs_total == 0:
        return math.inf
    qs = q / qs_total
    mask = ps > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(ps[mask] * (np.log(ps[mask]) - np.log(np.where(qs[mask] > 0,
                                                                           qs[mask], 1e-12)))))
