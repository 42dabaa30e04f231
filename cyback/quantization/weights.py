"""Weights to int8: symmetric, per output channel (or one scale for the
tensor), codes -127..127.

A kernel (..., N) has N output channels along its last axis (Dense (K, N),
Conv2D (kh, kw, C, N)); channel n gets scale[n] = max |w[..., n]| / 127 and
codes rint(w / scale[n]). Symmetric weights need no zero point, so the
product's zero-point term is the activations' alone; -128 is left unused so
that w and -w have codes of the same magnitude.
"""
import numpy as np


def quantize_kernel(kernel, per_channel=True):
    """(int8 codes of kernel's shape, float32 scales (N,))."""
    w = np.asarray(kernel, dtype=np.float64)
    if w.ndim < 1 or w.shape[-1] == 0:
        raise ValueError("quantize: a kernel needs an output axis, got shape %s" % (w.shape,))
    if not np.all(np.isfinite(w)):
        raise ValueError("quantize: the kernel holds NaN or infinite weights")
    flat = w.reshape(-1, w.shape[-1])
    bound = np.abs(flat).max(axis=0) if flat.shape[0] else np.zeros(w.shape[-1])
    if not per_channel:
        bound = np.full(w.shape[-1], bound.max(initial=0.0))
    scale = (bound / 127.0).astype(np.float32)
    # an all-zero channel (or one too small for a float32 scale) codes as 0
    dead = ~(scale > 0)
    scale[dead] = 1.0
    codes = np.rint(flat / scale.astype(np.float64))
    codes[:, dead] = 0
    codes = np.clip(codes, -127, 127).astype(np.int8)
    return codes.reshape(w.shape), scale
