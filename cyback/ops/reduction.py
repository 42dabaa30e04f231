"""Reductions over axes (sum, mean, max, min, prod, any, all, argmax, argmin)
and scans (cumsum, cumprod)."""
import numbers

import numpy as np

from cyback import config
from cyback.graph.op import Op
from cyback.graph.tensor import as_tensor, is_float_dtype
from cyback.ops import axis_sums
from cyback.ops import elementwise as ew
from cyback.ops.shape import reshape_static_dims


def normalize_axes(api, axis, ndim):
    """A sorted tuple of non-negative axes, or None for all axes."""
    if axis is None:
        return None
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    out = []
    for a in axes:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (numbers.Integral, np.integer)):
            raise TypeError("%s: axis must be an int or a list of ints, got %r" % (api, axis))
        a = int(a)
        if not -ndim <= a < max(ndim, 1):
            raise ValueError("%s: axis %d is out of range for a tensor of rank %d" % (api, a, ndim))
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ValueError("%s: repeated axis in %r" % (api, axis))
    return tuple(sorted(out))


def reduced_shape(shape, axes, keepdims):
    if axes is None:
        axes = tuple(range(len(shape)))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


_NUMPY = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean,
          "any": np.any, "all": np.all}


class Reduce(Op):
    def __init__(self, kind, axes, keepdims):
        self.kind = kind
        self.axes = axes
        self.keepdims = keepdims
        self.api = kind

    def infer(self, x):
        dtype = "bool" if self.kind in ("any", "all") else x.dtype
        return [(reduced_shape(x.shape, self.axes, self.keepdims), dtype)]

    def compute(self, x):
        if self.kind in ("sum", "mean"):
            return (axis_sums.sum_axes(x, self.axes, self.keepdims, self.kind == "mean"),)
        fn = _NUMPY[self.kind]
        if self.kind in ("max", "min") and x.size == 0:
            # TF gives -inf/+inf (the identity) for an empty reduction.
            fill = -np.inf if self.kind == "max" else np.inf
            shape = reduced_shape(x.shape, self.axes, self.keepdims)
            if is_float_dtype(x.dtype.name):
                return (np.full(shape, fill, x.dtype),)
            if x.dtype.kind == "b":
                return (np.full(shape, self.kind == "min", x.dtype),)
            info = np.iinfo(x.dtype)
            return (np.full(shape, info.min if self.kind == "max" else info.max, x.dtype),)
        if self.kind in ("max", "min"):
            y = axis_sums.extreme_axes(x, self.axes, self.keepdims, self.kind == "max")
        else:
            y = np.asarray(fn(x, axis=self.axes, keepdims=self.keepdims))
        if y.dtype != x.dtype and self.kind not in ("any", "all"):
            y = y.astype(x.dtype)
        return (y,)

    def codes_wanted(self, position, ctx=None, outputs=None):
        # a max or min commutes with a monotone quantization: an int8 plan
        # may reduce the uint8 codes its readers want (``share``); codes of
        # -inf and +inf are the empty max's and min's fills
        if self.kind not in ("max", "min") or ctx is None:
            return None
        return ctx.codes_all_want(outputs[0])

    def share(self, inputs, ctx):
        if self.kind not in ("max", "min") or not ctx.inference:
            return None
        return ctx.codes_through(self, inputs)

    def static_value(self, entries):
        """The result for a 1-D int input whose ``entries`` are all known when
        building (``shape.static_int``: ``K.prod(K.shape(x)[1:])``), or None."""
        if self.kind == "sum":
            return int(np.sum(entries))
        if self.kind == "prod":
            return int(np.prod(entries))
        return None

    def rewrite(self, inputs, ctx):
        # A reduction of a fill is a fill: over static, non-empty axes, the
        # max, min or mean of one value is that value, the sum of zeros zero.
        src = ew.as_fill(inputs[0], ctx)
        if src is None or self.kind not in ("sum", "mean", "max", "min"):
            return None
        fill, like = src
        shape = inputs[0].shape
        axes = tuple(range(len(shape))) if self.axes is None else self.axes
        if any(shape[a] is None or shape[a] == 0 for a in axes) or \
                (self.kind == "sum" and fill.value != 0):
            return None
        dims = fill.dims_of(like.ndim)
        if self.keepdims:
            dims = tuple((None, 1) if i in axes else d for i, d in enumerate(dims))
        else:
            dims = tuple(d for i, d in enumerate(dims) if i not in axes)
        return [ew.Fill(fill.value, fill.dtype, dims)(like)]

    def grad(self, inputs, outputs, grads):
        x, y, g = inputs[0], outputs[0], grads[0]
        if self.kind in ("any", "all"):
            return [None]
        if not self.keepdims:
            g = expand_reduced(g, x.ndim, self.axes)
            y = expand_reduced(y, x.ndim, self.axes)
        if self.kind == "sum":
            return [ew.broadcast_like(g, x)]
        if self.kind == "mean":
            return [ew.broadcast_like(g, x) / count_ratio(x, y)]
        if self.kind == "prod":
            return [ew.broadcast_like(g * y, x) / x]
        # max/min: split the gradient evenly between ties, as TensorFlow does.
        hit = ew.cast(ew.equal(x, y), x.dtype)
        ties = reduce(hit, "sum", self.axes, True)
        return [ew.broadcast_like(g / ties, x) * hit]


def expand_reduced(t, ndim, axes):
    """Put back the reduced axes of ``t`` as size-1 axes."""
    if axes is None:
        axes = tuple(range(ndim))
    return reshape_static_dims(t, axes, ndim)


class CountRatio(Op):
    """size(x) / size(y) as a scalar of x's dtype (elements averaged by a mean)."""

    api = "mean"

    def infer(self, x, y):
        return [((), x.dtype)]

    def compute(self, x, y):
        return (np.asarray(x.size / max(y.size, 1), dtype=x.dtype),)

    def simplify(self, inputs):
        x, y = inputs
        if all(d is not None for d in x.shape + y.shape):
            size = int(np.prod(x.shape)) / max(int(np.prod(y.shape)), 1)
            return [as_tensor(np.asarray(size, dtype=x.dtype))]
        return None


def count_ratio(x, y):
    return CountRatio()(x, y)


def reduce(x, kind, axis=None, keepdims=False):
    x = as_tensor(x)
    axes = normalize_axes(kind, axis, x.ndim)
    if kind in ("any", "all") and x.dtype != "bool":
        x = ew.cast(x, "bool")
    if kind in ("sum", "prod") and x.dtype == "bool":
        # Counting: True + True is 2, not True.
        x = ew.cast(x, "int32")
    if kind == "mean" and not is_float_dtype(x.dtype):
        x = ew.cast(x, config.floatx())
    if axes == () or x.ndim == 0:
        return x        # any / all of a scalar: the cast to bool above
    return Reduce(kind, axes, bool(keepdims))(x)


def reduce_sum(x, axis=None, keepdims=False):
    return reduce(x, "sum", axis, keepdims)


class ArgReduce(Op):
    def __init__(self, kind, axis):
        self.kind = kind
        self.axis = axis
        self.api = kind

    def infer(self, x):
        return [(reduced_shape(x.shape, (self.axis,), False), "int64")]

    def compute(self, x):
        if x.shape[self.axis] == 0:
            raise ValueError("%s: cannot reduce an empty axis %d of shape %s"
                             % (self.kind, self.axis, x.shape))
        fn = np.argmax if self.kind == "argmax" else np.argmin
        return (np.asarray(fn(x, axis=self.axis)).astype("int64"),)


def single_axis(api, axis, ndim):
    """One non-negative axis (argmax, cumsum: a list is not accepted)."""
    if axis is None:
        raise TypeError("%s: axis must be an int, got None" % api)
    if isinstance(axis, (list, tuple)):
        if len(axis) != 1:
            raise TypeError("%s: axis must be a single int, got %r" % (api, axis))
        axis = axis[0]
    return normalize_axes(api, axis, ndim)[0]


def arg_reduce(x, kind, axis=-1):
    x = as_tensor(x)
    if x.ndim == 0:
        raise ValueError("%s: expected a tensor of rank >= 1, got a scalar" % kind)
    axis = single_axis(kind, axis, x.ndim)
    return ArgReduce(kind, axis)(x)


class Cumulative(Op):
    def __init__(self, kind, axis, reverse=False):
        self.kind = kind
        self.axis = axis
        self.reverse = reverse
        self.api = kind

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        fn = np.cumsum if self.kind == "cumsum" else np.cumprod
        if self.reverse:
            x = np.flip(x, self.axis)
        y = fn(x, axis=self.axis, dtype=x.dtype)
        if self.reverse:
            y = np.flip(y, self.axis)
        return (np.ascontiguousarray(y),)

    def grad(self, inputs, outputs, grads):
        x, y, g = inputs[0], outputs[0], grads[0]
        back = Cumulative("cumsum", self.axis, not self.reverse)
        if self.kind == "cumsum":
            return [back(g)]
        return [back(g * y) / x]


def cumulative(x, kind, axis=0):
    x = as_tensor(x)
    if x.ndim == 0:
        raise ValueError("%s: expected a tensor of rank >= 1, got a scalar" % kind)
    axis = single_axis(kind, axis, x.ndim)
    return Cumulative(kind, axis)(x)
