"""Sums, means, maxima and minima over axes, with the common neural-network
case on a kernel.

A mean over the spatial axes of NHWC (global average pooling) or a bias
gradient (a sum over every axis but the last) reduces a run of axes that is
followed by kept axes. NumPy walks such a reduction one output row at a time
and runs several times slower than a pass over the data, so these go to
``kernels.reduce.sum_middle`` on the (outer, n, inner) view, and a max or
min over such axes (global max pooling) to ``kernels.reduce.extreme_middle``;
everything else stays with NumPy.
"""
import numpy as np

from cyback.kernels import qgemm as _qgemm
from cyback.kernels import reduce as _reduce

_KERNEL_TYPENUMS = (np.dtype(np.float32).num, np.dtype(np.float64).num)


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


def _kernel_plan(shape, typenum, axes, keepdims):
    """(outer, n, inner, output shape) for the kernel, or None for NumPy."""
    if axes is None or typenum not in _KERNEL_TYPENUMS:
        return None
    view = middle_view(shape, axes)
    if view is None:
        return None
    return view + (_reduced(shape, axes, keepdims),)


def _reduced(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


# A plan's reduction sees the same few shapes call after call (a global
# average pool: one per batch size), and working the view out takes about as
# long as the kernel's pass over a batch-1 feature map.
_PLANS = {}
_PLANS_MAX = 256


def sum_axes(x, axes, keepdims=False, mean=False):
    """x summed (or averaged, with ``mean``) over the sorted tuple ``axes``
    (None: all), in x's dtype."""
    x = np.asarray(x)
    plan = _plan(x, axes, keepdims)
    if plan is None or not x.flags.c_contiguous:
        y = np.asarray((np.mean if mean else np.sum)(x, axis=axes, keepdims=keepdims))
        return y if y.dtype == x.dtype else y.astype(x.dtype)
    return _reduce.sum_middle(x, plan[0], plan[1], plan[2], mean).reshape(plan[3])


def _plan(x, axes, keepdims):
    key = (x.shape, x.dtype.num, axes, keepdims)
    plan = _PLANS.get(key, False)
    if plan is False:
        plan = _kernel_plan(x.shape, x.dtype.num, axes, keepdims)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def extreme_axes(x, axes, keepdims=False, want_max=True):
    """The max (or min) of x over the sorted tuple ``axes`` (None: all), for
    a non-empty reduction; NaN wins, as in np.max."""
    x = np.asarray(x)
    if x.dtype == np.uint8 and want_max and axes is not None and x.flags.c_contiguous:
        # an int8 plan's global max pool of codes
        view = middle_view(x.shape, axes)
        if view is not None:
            return _qgemm.max_middle(x.reshape(view)).reshape(_reduced(x.shape, axes,
                                                                       keepdims))
    plan = _plan(x, axes, keepdims)
    if plan is None or not x.flags.c_contiguous:
        return np.asarray((np.max if want_max else np.min)(x, axis=axes, keepdims=keepdims))
    return _reduce.extreme_middle(x, plan[0], plan[1], plan[2], want_max).reshape(plan[3])
