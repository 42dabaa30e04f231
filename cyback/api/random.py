"""Random tensors and randomly initialised variables of the Keras backend API.

Tensors draw fresh numbers every time they are computed; a seed fixes the
sequence (the same in every process). See cyback/ops/random.py.
"""

import numpy as np

from cyback import config
from cyback.api.core import variable
from cyback.graph import calls as _calls
from cyback.graph import limits
from cyback.graph.tensor import Tensor, dtype_name, is_float_dtype, is_int_dtype
from cyback.ops import elementwise as ew
from cyback.ops import random as rnd
from cyback.ops import shape as shp

__all__ = [
    "random_normal", "random_uniform", "random_binomial", "truncated_normal",
    "random_normal_variable", "random_uniform_variable",
]


def _dtype(api, dtype, floats_only=True):
    dtype = config.floatx() if dtype is None else dtype_name(dtype)
    if not is_float_dtype(dtype) and (floats_only or not is_int_dtype(dtype)):
        raise TypeError("%s: dtype must be a float type%s, got %s"
                        % (api, "" if floats_only else " or an int type", dtype))
    return dtype


def _number(api, name, v):
    if isinstance(v, Tensor):
        return v
    if isinstance(v, (bool, np.bool_)):
        raise TypeError("%s: %s must be a number, got %r" % (api, name, v))
    try:
        arr = np.asarray(v)
        if arr.ndim != 0 or arr.dtype.kind not in "iuf":
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError("%s: %s must be a number or a scalar tensor, got %r"
                        % (api, name, v)) from None
    out = float(arr)
    if not np.isfinite(out):
        raise ValueError("%s: %s must be finite, got %r" % (api, name, v))
    return out


def _affine(t, scale, shift):
    """``t * scale + shift`` for tensor-valued parameters."""
    if not (isinstance(scale, (int, float)) and scale == 1):
        t = t * ew.cast(scale, t.dtype) if isinstance(scale, Tensor) else t * scale
    if not (isinstance(shift, (int, float)) and shift == 0):
        t = t + (ew.cast(shift, t.dtype) if isinstance(shift, Tensor) else shift)
    return t


def _normal(api, shape, mean, stddev, dtype, seed, truncated):
    dtype = _dtype(api, dtype)
    mean, stddev = _number(api, "mean", mean), _number(api, "stddev", stddev)
    if isinstance(stddev, float) and stddev < 0:
        raise ValueError("%s: stddev must be non-negative, got %r" % (api, stddev))
    if isinstance(mean, Tensor) or isinstance(stddev, Tensor):
        z = rnd.random_tensor(api, rnd.RandomNormal, shape, dtype, seed, mean=0.0, stddev=1.0,
                              truncated=truncated)
        return _affine(z, stddev, mean)
    return rnd.random_tensor(api, rnd.RandomNormal, shape, dtype, seed, mean=mean,
                             stddev=stddev, truncated=truncated)


def random_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    """Samples of N(mean, stddev²) in a tensor of ``shape`` (ints and/or
    symbolic scalars)."""
    return _normal("random_normal", shape, mean, stddev, dtype, seed, False)


def truncated_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    """Normal samples, redrawn where they fall more than 2 stddev from the mean."""
    return _normal("truncated_normal", shape, mean, stddev, dtype, seed, True)


def random_uniform(shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
    """Samples of U[minval, maxval) (an int dtype draws integers)."""
    api = "random_uniform"
    dtype = _dtype(api, dtype, floats_only=False)
    lo, hi = _number(api, "minval", minval), _number(api, "maxval", maxval)
    if not is_float_dtype(dtype):
        if isinstance(lo, Tensor) or isinstance(hi, Tensor) or lo != int(lo) or hi != int(hi):
            raise TypeError("%s: integer samples need int minval and maxval, got %r and %r"
                            % (api, minval, maxval))
        if hi <= lo:
            raise ValueError("%s: need minval < maxval for integer samples, got %r and %r"
                             % (api, minval, maxval))
        return rnd.random_tensor(api, rnd.RandomUniform, shape, dtype, seed, minval=int(lo),
                                 maxval=int(hi))
    if isinstance(lo, Tensor) or isinstance(hi, Tensor):
        u = rnd.random_tensor(api, rnd.RandomUniform, shape, dtype, seed, minval=0.0,
                              maxval=1.0)
        lo_t = ew.cast(lo, dtype) if isinstance(lo, Tensor) else lo
        hi_t = ew.cast(hi, dtype) if isinstance(hi, Tensor) else hi
        return u * (hi_t - lo_t) + lo_t
    if hi < lo:
        raise ValueError("%s: maxval %r is below minval %r" % (api, maxval, minval))
    return rnd.random_tensor(api, rnd.RandomUniform, shape, dtype, seed, minval=lo, maxval=hi)


def random_binomial(shape, p=0.0, dtype=None, seed=None):
    """1 with probability ``p``, else 0."""
    api = "random_binomial"
    dtype = _dtype(api, dtype, floats_only=False)
    p = _number(api, "p", p)
    if isinstance(p, Tensor):
        u = rnd.random_tensor(api, rnd.RandomUniform, shape, "float32", seed, minval=0.0,
                              maxval=1.0)
        return ew.cast(ew.less(u, ew.cast(p, "float32")), dtype)
    if not 0 <= p <= 1:
        raise ValueError("%s: p must be in [0, 1], got %r" % (api, p))
    return rnd.random_tensor(api, rnd.RandomBinomial, shape, dtype, seed, p=p)


# ------------------------------------------------------------------ variables

def _static_shape(api, shape, dtype):
    static, tensor = shp.shape_arg(api, shape)
    if tensor is not None:
        raise ValueError("%s: a variable needs a fully known shape, got %r" % (api, shape))
    shp.check_static_shape(api, static)
    limits.check_shape(api, static, dtype, "the variable")
    return static


def random_normal_variable(shape, mean, scale, dtype=None, name=None, seed=None):
    """A variable of N(mean, scale²) samples."""
    api = "random_normal_variable"
    dtype = _dtype(api, dtype)
    static = _static_shape(api, shape, dtype)
    mean, scale = _number(api, "mean", mean), _number(api, "scale", scale)
    if isinstance(mean, Tensor) or isinstance(scale, Tensor):
        raise TypeError("%s: mean and scale must be numbers" % api)
    if scale < 0:
        raise ValueError("%s: scale must be non-negative, got %r" % (api, scale))
    rng = rnd.generator(rnd.make_seed(api, seed))
    value = rng.standard_normal(static, dtype=np.float64 if dtype == "float64" else np.float32)
    value *= scale      # in place: the samples and the variable's copy, no more
    value += mean
    return variable(value, dtype=dtype, name=name)


def random_uniform_variable(shape, low, high, dtype=None, name=None, seed=None):
    """A variable of U[low, high) samples."""
    api = "random_uniform_variable"
    dtype = _dtype(api, dtype)
    static = _static_shape(api, shape, dtype)
    low, high = _number(api, "low", low), _number(api, "high", high)
    if isinstance(low, Tensor) or isinstance(high, Tensor):
        raise TypeError("%s: low and high must be numbers" % api)
    if high < low:
        raise ValueError("%s: high %r is below low %r" % (api, high, low))
    rng = rnd.generator(rnd.make_seed(api, seed))
    value = rng.random(static, dtype=np.float64 if dtype == "float64" else np.float32)
    value *= high - low
    value += low
    return variable(value, dtype=dtype, name=name)


# errors escaping each function name it; nodes remember it (graph/calls.py)
_calls.name_functions(globals(), __all__)
