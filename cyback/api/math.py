"""Element-wise math, comparisons, reductions and scans of the Keras backend API."""
import numpy as np

from cyback import config
from cyback.api.core import stop_gradient
from cyback.graph import calls as _calls
from cyback.graph.tensor import Tensor, as_tensor, is_float_dtype
from cyback.ops import elementwise as ew
from cyback.ops import reduction as red
from cyback.ops.linalg import batch_dot, dot
from cyback.ops.shape import transpose as _transpose

__all__ = [
    "max", "min", "sum", "prod", "mean", "any", "all", "var", "std", "argmax", "argmin",
    "logsumexp", "cumsum", "cumprod", "square", "abs", "sqrt", "exp", "log", "round", "sign",
    "pow", "clip", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "maximum", "minimum", "sin", "cos", "dot", "batch_dot", "transpose",
]

_builtin_max = max


def max(x, axis=None, keepdims=False):
    return red.reduce(x, "max", axis, keepdims)


def min(x, axis=None, keepdims=False):
    return red.reduce(x, "min", axis, keepdims)


def sum(x, axis=None, keepdims=False):
    return red.reduce(x, "sum", axis, keepdims)


def prod(x, axis=None, keepdims=False):
    return red.reduce(x, "prod", axis, keepdims)


def mean(x, axis=None, keepdims=False):
    return red.reduce(x, "mean", axis, keepdims)


def any(x, axis=None, keepdims=False):
    return red.reduce(x, "any", axis, keepdims)


def all(x, axis=None, keepdims=False):
    return red.reduce(x, "all", axis, keepdims)


def var(x, axis=None, keepdims=False):
    x = as_tensor(x)
    if not is_float_dtype(x.dtype):
        x = ew.cast(x, config.floatx())
    m = mean(x, axis, keepdims=True)
    return mean(ew.square(x - m), axis, keepdims)


def std(x, axis=None, keepdims=False):
    return ew.sqrt(var(x, axis, keepdims))


def argmax(x, axis=-1):
    return red.arg_reduce(x, "argmax", axis)


def argmin(x, axis=-1):
    return red.arg_reduce(x, "argmin", axis)


def logsumexp(x, axis=None, keepdims=False):
    """log(sum(exp(x))) computed stably by shifting by the maximum."""
    x = as_tensor(x)
    axes = red.normalize_axes("logsumexp", axis, x.ndim)
    if not is_float_dtype(x.dtype):
        x = ew.cast(x, config.floatx())
    m = stop_gradient(max(x, axis, keepdims=True))
    # An all -inf slice has max -inf; shifting by it would give nan.
    m = ew.where(ew.less(ew.abs_(m), np.inf), m, ew.zeros_like_tensor(m))
    out = ew.log(sum(ew.exp(x - m), axis, keepdims=True)) + m
    if not keepdims:
        out = sum(out, axes if axes is not None else None, keepdims=False) \
            if axes != () else out
    return out


def cumsum(x, axis=0):
    return red.cumulative(x, "cumsum", axis)


def cumprod(x, axis=0):
    return red.cumulative(x, "cumprod", axis)


def square(x):
    return ew.square(x)


def abs(x):
    return ew.abs_(x)


def sqrt(x):
    """Square root; negative inputs are clipped to 0 first, as Keras does."""
    x = as_tensor(x)
    if not is_float_dtype(x.dtype):
        x = ew.cast(x, config.floatx())
    return ew.sqrt(ew.clip(x, 0.0, np.inf))


def exp(x):
    return ew.exp(x)


def log(x):
    return ew.log(x)


def round(x):
    return ew.round_(x)


def sign(x):
    return ew.sign(x)


def pow(x, a):
    return ew.power(x, a)


def clip(x, min_value, max_value):
    if min_value is None:
        min_value = -np.inf
    if max_value is None:
        max_value = np.inf
    for name, v in (("min_value", min_value), ("max_value", max_value)):
        if not isinstance(v, Tensor) and (
                isinstance(v, str) or np.asarray(v).dtype.kind not in "biuf"):
            raise TypeError("clip: %s must be a number or a tensor, got %r" % (name, v))
    if not isinstance(min_value, Tensor) and not isinstance(max_value, Tensor) \
            and max_value < min_value:
        max_value = min_value
    return ew.clip(x, min_value, max_value)


def equal(x, y):
    return ew.equal(x, y)


def not_equal(x, y):
    return ew.not_equal(x, y)


def greater(x, y):
    return ew.greater(x, y)


def greater_equal(x, y):
    return ew.greater_equal(x, y)


def less(x, y):
    return ew.less(x, y)


def less_equal(x, y):
    return ew.less_equal(x, y)


def maximum(x, y):
    return ew.maximum(x, y)


def minimum(x, y):
    return ew.minimum(x, y)


def sin(x):
    return ew.sin(x)


def cos(x):
    return ew.cos(x)


def transpose(x):
    """Reverse the axes (a matrix transpose for 2-D)."""
    x = as_tensor(x)
    return _transpose(x, tuple(range(x.ndim))[::-1])


# errors escaping each function name it; nodes remember it (graph/calls.py)
_calls.name_functions(globals(), __all__)
