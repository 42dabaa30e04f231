"""Sums and means over axes, with the common neural-network case on a kernel.

A mean over the spatial axes of NHWC (global average pooling) or a bias
gradient (a sum over every axis but the last) reduces a run of axes that is
followed by kept axes. NumPy walks such a reduction one output row at a time
and runs 5-10x slower than a pass over the data, so these go to
``kernels.reduce.sum_middle`` on the (outer, n, inner) view; everything
else stays with NumPy.
"""
import numpy as np

from cyback.kernels import reduce as _reduce

_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def middle_view(shape, axes):
    """(outer, n, inner) when ``axes`` (sorted) are consecutive, at least one
    axis after them is kept and its size is more than 1, and n >= 1; else None."""
    if not axes or axes[-1] - axes[0] != len(axes) - 1 or axes[-1] >= len(shape) - 1:
        return None
    outer = n = inner = 1
    for i, d in enumerate(shape):
        if i < axes[0]:
            outer *= d
        elif i <= axes[-1]:
            n *= d
        else:
            inner *= d
    if n < 1 or inner < 2:
        return None
    return outer, n, inner


def sum_axes(x, axes, keepdims=False, mean=False):
    """x summed (or averaged, with ``mean``) over the sorted tuple ``axes``
    (None: all), in x's dtype."""
    x = np.asarray(x)
    view = None
    if axes is not None and x.dtype in _KERNEL_DTYPES and x.flags.c_contiguous:
        view = middle_view(x.shape, axes)
    if view is None:
        y = np.asarray((np.mean if mean else np.sum)(x, axis=axes, keepdims=keepdims))
        return y if y.dtype == x.dtype else y.astype(x.dtype)
    y = _reduce.sum_middle(x, view[0], view[1], view[2], mean)
    if keepdims:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return y.reshape(shape)
