"""Convolution and pooling functions of the Keras backend API.

Thin: each function checks and normalises its arguments (strides, dilation,
padding, data_format, output_shape) and builds ops from ``cyback.ops.conv``
and ``cyback.ops.pool``. Shapes follow Keras 2.3.1's TensorFlow backend:
kernels (*k, in, out), transposed-conv kernels (*k, out, in), depthwise
kernels (*k, C, multiplier), local kernels (positions, feature_dim, filters).

Second derivatives: every convolution (conv, transposed, depthwise, separable,
local) is differentiable to any order in both the input and the kernel;
pooling to any order in its input (max pooling's routing is piecewise
constant, so it adds no x-dependence of its own).
"""
import numbers

import numpy as np

from cyback import config
from cyback.api._args import integer
from cyback.graph import calls as _calls
from cyback.graph.shapes import format_shape
from cyback.graph.tensor import Tensor, as_tensor, is_float_dtype
from cyback.ops import conv as cv
from cyback.ops import pool as pl
from cyback.ops import shape as shp

__all__ = [
    "conv1d", "conv2d", "conv3d", "conv2d_transpose", "conv3d_transpose",
    "separable_conv1d", "separable_conv2d", "depthwise_conv2d", "local_conv1d",
    "local_conv2d", "pool2d", "pool3d",
]



# ------------------------------------------------------------------ arguments

def _ints(api, name, value, rank):
    """``rank`` positive ints from an int or a sequence of ints."""
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool):
        value = (int(value),) * rank
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError("%s: %s must be an int or a tuple of %d ints, got %r"
                        % (api, name, rank, value)) from None
    if len(items) != rank:
        raise ValueError("%s: %s must have %d entries, got %r" % (api, name, rank, value))
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (numbers.Integral, np.integer)):
            raise TypeError("%s: %s must hold ints, got %r" % (api, name, value))
        if v < 1:
            raise ValueError("%s: %s must be positive, got %r" % (api, name, value))
        out.append(integer(api, name, v))
    return tuple(out)


def _padding(api, padding, allowed=("valid", "same")):
    p = padding.lower() if isinstance(padding, str) else padding
    if p not in allowed:
        raise ValueError("%s: padding must be one of %s, got %r"
                         % (api, ", ".join(repr(a) for a in allowed), padding))
    return p


def _channels_last(api, data_format):
    try:
        return config.normalize_data_format(data_format) == "channels_last"
    except ValueError:
        raise ValueError("%s: data_format must be 'channels_first' or 'channels_last', got %r"
                         % (api, data_format)) from None


def _no_strided_dilation(api, strides, dilation):
    # TensorFlow's convolution rejects the combination; so do we rather than
    # pick a meaning for it.
    if any(s > 1 for s in strides) and any(d > 1 for d in dilation):
        raise ValueError("%s: strides > 1 cannot be combined with dilation_rate > 1, got "
                         "strides=%s and dilation_rate=%s" % (api, strides, dilation))


def _operands(api, names, values):
    """Tensors of one float dtype. Non-tensor values (NumPy arrays) take the
    dtype of the first tensor among the operands, as TensorFlow converts them."""
    target = next((v.dtype for v in values if isinstance(v, Tensor)), None)
    out = []
    for name, v in zip(names, values):
        if not isinstance(v, Tensor):
            try:
                v = as_tensor(v) if target is None else as_tensor(np.asarray(v, dtype=target))
            except (TypeError, ValueError):
                raise TypeError("%s: %s must be a tensor or array-like, got %r"
                                % (api, name, type(v).__name__)) from None
            if target is None:
                target = v.dtype
        if not is_float_dtype(v.dtype):
            raise TypeError("%s: %s must be a float tensor, got dtype %s" % (api, name, v.dtype))
        out.append(v)
    dtypes = [v.dtype for v in out]
    if len(set(dtypes)) > 1:
        raise TypeError("%s: %s must share one dtype, got %s"
                        % (api, " and ".join(names), ", ".join(dtypes)))
    return out


def _rank(api, name, t, ndim, what):
    if t.ndim != ndim:
        raise ValueError("%s: %s must be %d-D %s, got shape %s"
                         % (api, name, ndim, what, format_shape(t.shape)))


def _known_kernel(api, name, k):
    if any(d is None for d in k.shape):
        raise ValueError("%s: the shape of %s must be fully known, got %s"
                         % (api, name, format_shape(k.shape)))


def _layout(rank, cl):
    sp = ", ".join(["d", "h", "w"][3 - rank:])
    return "(batch, %s, channels)" % sp if cl else "(batch, channels, %s)" % sp


# ------------------------------------------------------------------ convolutions

def _conv(api, rank, x, kernel, strides, padding, data_format, dilation_rate,
          paddings=("valid", "same")):
    cl = _channels_last(api, data_format)
    strides = _ints(api, "strides", strides, rank)
    dilation = _ints(api, "dilation_rate", dilation_rate, rank)
    padding = _padding(api, padding, paddings)
    x, kernel = _operands(api, ("x", "kernel"), (x, kernel))
    _rank(api, "x", x, rank + 2, "input " + _layout(rank, cl))
    _rank(api, "kernel", kernel, rank + 2, "kernel (*kernel_size, in_channels, filters)")
    _known_kernel(api, "kernel", kernel)
    _no_strided_dilation(api, strides, dilation)
    geom = cv.Geometry(api, "conv", rank, strides, dilation, padding, cl)
    return cv.conv(geom, x, kernel)


def conv1d(x, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
    """1-D convolution; 'causal' pads on the left only, so output t never sees
    input t + 1 onwards."""
    return _conv("conv1d", 1, x, kernel, strides, padding, data_format, dilation_rate,
                 ("valid", "same", "causal"))


def conv2d(x, kernel, strides=(1, 1), padding="valid", data_format=None,
           dilation_rate=(1, 1)):
    return _conv("conv2d", 2, x, kernel, strides, padding, data_format, dilation_rate)


def conv3d(x, kernel, strides=(1, 1, 1), padding="valid", data_format=None,
           dilation_rate=(1, 1, 1)):
    return _conv("conv3d", 3, x, kernel, strides, padding, data_format, dilation_rate)


def _output_shape(api, x, output_shape, rank):
    """(static, tensor) of a transposed convolution's output shape; a None
    batch entry means x's batch size, as in Keras."""
    n = rank + 2
    if isinstance(output_shape, Tensor):
        if output_shape.ndim != 1 or output_shape.shape[0] != n:
            raise ValueError("%s: output_shape must be a 1-D int tensor of length %d, got %r"
                             % (api, n, output_shape))
        static, tensor = shp.shape_arg(api, output_shape)
    else:
        try:
            entries = list(np.asarray(output_shape).tolist()
                           if isinstance(output_shape, np.ndarray) else output_shape)
        except TypeError:
            raise TypeError("%s: output_shape must be a tuple of %d ints, got %r"
                            % (api, n, output_shape)) from None
        if len(entries) != n:
            raise ValueError("%s: output_shape must have %d entries (batch, spatial..., "
                             "channels), got %r" % (api, n, output_shape))
        if entries[0] is None:
            entries[0] = shp.getitem(shp.shape_of(x), 0)
        if any(e is None for e in entries[1:]):
            raise ValueError("%s: only the batch entry of output_shape may be None, got %r"
                             % (api, output_shape))
        static, tensor = shp.shape_arg(api, entries)
    if any(d is not None and d < 0 for d in static):
        raise ValueError("%s: negative size in output_shape %s" % (api, format_shape(static)))
    return static, tensor


def _conv_transpose(api, rank, x, kernel, output_shape, strides, padding, data_format,
                    dilation_rate):
    cl = _channels_last(api, data_format)
    strides = _ints(api, "strides", strides, rank)
    dilation = _ints(api, "dilation_rate", dilation_rate, rank)
    padding = _padding(api, padding)
    x, kernel = _operands(api, ("x", "kernel"), (x, kernel))
    _rank(api, "x", x, rank + 2, "input " + _layout(rank, cl))
    _rank(api, "kernel", kernel, rank + 2,
          "kernel (*kernel_size, out_channels, in_channels)")
    _known_kernel(api, "kernel", kernel)
    _no_strided_dilation(api, strides, dilation)
    static, tensor = _output_shape(api, x, output_shape, rank)
    geom = cv.Geometry(api, "conv", rank, strides, dilation, padding, cl)
    c_in, c_out = geom.channels(x.shape), geom.channels(static)
    if c_in is not None and c_in != kernel.shape[-1]:
        raise ValueError("%s: the kernel %s takes %d input channels (its last axis) but x %s "
                         "has %d" % (api, format_shape(kernel.shape), kernel.shape[-1],
                                     format_shape(x.shape), c_in))
    if c_out is not None and c_out != kernel.shape[-2]:
        raise ValueError("%s: output_shape %s has %d channels but the kernel %s makes %d "
                         "(its second last axis)" % (api, format_shape(static), c_out,
                                                     format_shape(kernel.shape), kernel.shape[-2]))
    return cv.conv_transpose(geom, x, kernel, static, tensor)


def conv2d_transpose(x, kernel, output_shape, strides=(1, 1), padding="valid",
                     data_format=None, dilation_rate=(1, 1)):
    """The transpose (input gradient) of conv2d, producing ``output_shape``
    (given in the layout of ``data_format``; its batch entry may be None or
    symbolic)."""
    return _conv_transpose("conv2d_transpose", 2, x, kernel, output_shape, strides, padding,
                           data_format, dilation_rate)


def conv3d_transpose(x, kernel, output_shape, strides=(1, 1, 1), padding="valid",
                     data_format=None):
    return _conv_transpose("conv3d_transpose", 3, x, kernel, output_shape, strides, padding,
                           data_format, (1, 1, 1))


def _depthwise(api, rank, x, depthwise_kernel, strides, padding, cl, dilation, paddings):
    padding = _padding(api, padding, paddings)
    _rank(api, "x", x, rank + 2, "input " + _layout(rank, cl))
    _rank(api, "depthwise_kernel", depthwise_kernel, rank + 2,
          "kernel (*kernel_size, in_channels, depth_multiplier)")
    _known_kernel(api, "depthwise_kernel", depthwise_kernel)
    _no_strided_dilation(api, strides, dilation)
    geom = cv.Geometry(api, "depthwise", rank, strides, dilation, padding, cl)
    return cv.conv(geom, x, depthwise_kernel)


def depthwise_conv2d(x, depthwise_kernel, strides=(1, 1), padding="valid", data_format=None,
                     dilation_rate=(1, 1)):
    """Each input channel c convolved with depthwise_kernel[..., c, m] gives
    output channel c * multiplier + m."""
    api = "depthwise_conv2d"
    cl = _channels_last(api, data_format)
    strides = _ints(api, "strides", strides, 2)
    dilation = _ints(api, "dilation_rate", dilation_rate, 2)
    x, k = _operands(api, ("x", "depthwise_kernel"), (x, depthwise_kernel))
    return _depthwise(api, 2, x, k, strides, padding, cl, dilation, ("valid", "same"))


def _separable(api, rank, x, depthwise_kernel, pointwise_kernel, strides, padding,
               data_format, dilation_rate, paddings):
    cl = _channels_last(api, data_format)
    strides = _ints(api, "strides", strides, rank)
    dilation = _ints(api, "dilation_rate", dilation_rate, rank)
    x, dk, pk = _operands(api, ("x", "depthwise_kernel", "pointwise_kernel"),
                          (x, depthwise_kernel, pointwise_kernel))
    _rank(api, "pointwise_kernel", pk, rank + 2,
          "kernel (%s, in_channels * depth_multiplier, filters)" % ", ".join(["1"] * rank))
    _known_kernel(api, "pointwise_kernel", pk)
    y = _depthwise(api, rank, x, dk, strides, padding, cl, dilation, paddings)
    mid = dk.shape[-2] * dk.shape[-1]
    if any(d != 1 for d in pk.shape[:rank]) or pk.shape[-2] != mid:
        raise ValueError("%s: pointwise_kernel must have shape (%s, %d, filters) for the "
                         "depthwise_kernel %s, got %s"
                         % (api, ", ".join(["1"] * rank), mid, format_shape(dk.shape),
                            format_shape(pk.shape)))
    geom = cv.Geometry(api, "conv", rank, (1,) * rank, (1,) * rank, "valid", cl)
    return cv.conv(geom, y, pk)


def separable_conv1d(x, depthwise_kernel, pointwise_kernel, strides=1, padding="valid",
                     data_format=None, dilation_rate=1):
    """Depthwise 1-D convolution then a pointwise (size-1) convolution."""
    return _separable("separable_conv1d", 1, x, depthwise_kernel, pointwise_kernel, strides,
                      padding, data_format, dilation_rate, ("valid", "same", "causal"))


def separable_conv2d(x, depthwise_kernel, pointwise_kernel, strides=(1, 1), padding="valid",
                     data_format=None, dilation_rate=(1, 1)):
    """Depthwise 2-D convolution then a pointwise (1x1) convolution."""
    return _separable("separable_conv2d", 2, x, depthwise_kernel, pointwise_kernel, strides,
                      padding, data_format, dilation_rate, ("valid", "same"))


# ------------------------------------------------------------------ locally connected

def _local(api, rank, inputs, kernel, kernel_size, strides, out, data_format):
    cl = _channels_last(api, data_format)
    kernel_size = _ints(api, "kernel_size", kernel_size, rank)
    strides = _ints(api, "strides", strides, rank)
    x, kernel = _operands(api, ("inputs", "kernel"), (inputs, kernel))
    _rank(api, "inputs", x, rank + 2, "input " + _layout(rank, cl))
    _rank(api, "kernel", kernel, 3, "kernel (output positions, feature_dim, filters)")
    _known_kernel(api, "kernel", kernel)
    if out is None:
        out = (kernel.shape[0],)
    elif kernel.shape[0] != int(np.prod(out)):
        raise ValueError("%s: the kernel %s has %d output positions but output_shape %s "
                         "needs %d" % (api, format_shape(kernel.shape), kernel.shape[0], out,
                                       int(np.prod(out))))
    geom = cv.Geometry(api, "local", rank, strides, (1,) * rank, "valid", cl,
                       kernel_size=kernel_size, local_out=out)
    return cv.conv(geom, x, kernel)


def local_conv1d(inputs, kernel, kernel_size, strides, data_format=None):
    """1-D convolution with a separate (feature_dim, filters) matrix at each of
    the kernel.shape[0] output positions."""
    return _local("local_conv1d", 1, inputs, kernel, kernel_size, strides, None, data_format)


def local_conv2d(inputs, kernel, kernel_size, strides, output_shape, data_format=None):
    """2-D convolution with unshared weights; output_shape = (rows, cols)."""
    api = "local_conv2d"
    out = _ints(api, "output_shape", output_shape, 2)
    return _local(api, 2, inputs, kernel, kernel_size, strides, out, data_format)


# ------------------------------------------------------------------ pooling

def _pool(api, rank, x, pool_size, strides, padding, data_format, pool_mode):
    cl = _channels_last(api, data_format)
    pool_size = _ints(api, "pool_size", pool_size, rank)
    strides = _ints(api, "strides", strides, rank)
    padding = _padding(api, padding)
    if pool_mode not in ("max", "avg"):
        raise ValueError("%s: pool_mode must be 'max' or 'avg', got %r" % (api, pool_mode))
    x, = _operands(api, ("x",), (x,))
    _rank(api, "x", x, rank + 2, "input " + _layout(rank, cl))
    return pl.pool(api, x, pool_size, strides, padding, cl, pool_mode)


def pool2d(x, pool_size, strides=(1, 1), padding="valid", data_format=None, pool_mode="max"):
    return _pool("pool2d", 2, x, pool_size, strides, padding, data_format, pool_mode)


def pool3d(x, pool_size, strides=(1, 1, 1), padding="valid", data_format=None,
           pool_mode="max"):
    return _pool("pool3d", 3, x, pool_size, strides, padding, data_format, pool_mode)


# errors escaping each function name it; nodes remember it (graph/calls.py)
_calls.name_functions(globals(), __all__)
