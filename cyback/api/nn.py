"""Activations, crossentropies, normalization, dropout, in_top_k and bias_add
of the Keras backend API (Keras 2.3.1 TensorFlow-backend semantics)."""
import numbers

import numpy as np

from cyback import config
from cyback.api._args import integer
from cyback.graph import calls as _calls
from cyback.graph.shapes import format_shape
from cyback.graph.tensor import Tensor, as_tensor, is_float_dtype, is_int_dtype
from cyback.ops import elementwise as ew
from cyback.ops import nn as nn_ops
from cyback.ops import random as rnd
from cyback.ops import reduction as red
from cyback.ops import shape as shp

__all__ = [
    "relu", "elu", "softmax", "softplus", "softsign", "sigmoid", "hard_sigmoid", "tanh",
    "categorical_crossentropy", "sparse_categorical_crossentropy", "binary_crossentropy",
    "l2_normalize", "in_top_k", "bias_add", "dropout", "batch_normalization",
    "normalize_batch_in_training",
]


def _float(x, api, name="x"):
    if x is None:
        raise TypeError("%s: %s must be a tensor, got None" % (api, name))
    x = as_tensor(x)
    if not is_float_dtype(x.dtype):
        if x.dtype not in ("bool",) and not is_int_dtype(x.dtype):
            raise TypeError("%s: %s must be a numeric tensor, got dtype %s" % (api, name, x.dtype))
        x = ew.cast(x, config.floatx())
    return x


def _like(t, x, api, name):
    """``t`` as a float tensor in x's dtype."""
    t = ew.weak(t, x.dtype)
    if t.dtype not in ("bool",) and not is_float_dtype(t.dtype) and not is_int_dtype(t.dtype):
        raise TypeError("%s: %s must be numeric, got dtype %s" % (api, name, t.dtype))
    return ew.cast(t, x.dtype)


def _scalar(api, name, v, allow_none=False):
    """A Python float from a number or 0-d array (Keras layers pass
    ``K.cast_to_floatx(alpha)``)."""
    if v is None and allow_none:
        return None
    if isinstance(v, Tensor) or isinstance(v, (bool, np.bool_)):
        raise TypeError("%s: %s must be a Python number, got %r" % (api, name, v))
    try:
        arr = np.asarray(v)
        if arr.ndim != 0 or arr.dtype.kind not in "iuf":
            raise TypeError
        out = float(arr)
    except (TypeError, ValueError):
        raise TypeError("%s: %s must be a number, got %r" % (api, name, v)) from None
    if np.isnan(out):
        raise ValueError("%s: %s must not be nan" % (api, name))
    return out


def _axis(api, axis, ndim):
    if isinstance(axis, bool) or not isinstance(axis, (numbers.Integral, np.integer)):
        raise TypeError("%s: axis must be an int, got %r" % (api, axis))
    if not -ndim <= axis < ndim:
        raise ValueError("%s: axis %d is out of range for a tensor of rank %d"
                         % (api, axis, ndim))
    return int(axis) % ndim


# ------------------------------------------------------------------ activations

def relu(x, alpha=0.0, max_value=None, threshold=0.0):
    """Rectified linear unit: ``x`` above ``threshold`` (else 0), capped at
    ``max_value``, with slope ``alpha`` below the threshold."""
    x = _float(x, "relu")
    alpha = _scalar("relu", "alpha", alpha)
    max_value = _scalar("relu", "max_value", max_value, allow_none=True)
    threshold = _scalar("relu", "threshold", threshold)
    return nn_ops.Relu(alpha, max_value, threshold)(x)


def elu(x, alpha=1.0):
    """Exponential linear unit: ``x`` for x > 0, else ``alpha * (exp(x) - 1)``."""
    x = _float(x, "elu")
    return nn_ops.Elu(_scalar("elu", "alpha", alpha))(x)


def softmax(x, axis=-1):
    """Softmax along ``axis`` (shifted by the maximum, so large inputs are safe)."""
    x = _float(x, "softmax")
    if x.ndim == 0:
        raise ValueError("softmax: expected a tensor of rank >= 1, got a scalar")
    return nn_ops.Softmax(_axis("softmax", axis, x.ndim))(x)


def softplus(x):
    return ew.softplus(x)


def softsign(x):
    return ew.softsign(x)


def sigmoid(x):
    return ew.sigmoid(x)


def tanh(x):
    return ew.tanh(x)


def hard_sigmoid(x):
    """``clip(0.2 * x + 0.5, 0, 1)``."""
    x = _float(x, "hard_sigmoid")
    return ew.clip(x * 0.2 + 0.5, 0.0, 1.0)


# ------------------------------------------------------------------ crossentropies

def _clip_eps(output):
    eps = config.epsilon()
    return ew.clip(output, eps, 1.0 - eps)


def categorical_crossentropy(target, output, from_logits=False, axis=-1):
    """``-sum(target * log(output), axis)``; probabilities are first scaled to
    sum to 1 and clipped to ``[epsilon, 1 - epsilon]``."""
    api = "categorical_crossentropy"
    output = _float(output, api, "output")
    target = _like(target, output, api, "target")
    if output.ndim == 0:
        raise ValueError("%s: output must have rank >= 1, got a scalar" % api)
    axis = _axis(api, axis, output.ndim)
    if target.ndim != output.ndim or not all(
            a is None or b is None or a == b for a, b in zip(target.shape, output.shape)):
        raise ValueError("%s: target and output must have the same shape, got %s and %s"
                         % (api, format_shape(target.shape), format_shape(output.shape)))
    if from_logits:
        return nn_ops.SoftmaxCrossEntropy(axis)(target, output)
    output = output / red.reduce_sum(output, axis, keepdims=True)
    output = _clip_eps(output)
    return -red.reduce_sum(target * ew.log(output), axis)


def sparse_categorical_crossentropy(target, output, from_logits=False, axis=-1):
    """Categorical crossentropy with integer class targets (shape of ``output``
    without ``axis``, or with a trailing 1)."""
    api = "sparse_categorical_crossentropy"
    output = _float(output, api, "output")
    target = as_tensor(target)
    if not (is_int_dtype(target.dtype) or is_float_dtype(target.dtype)):
        raise TypeError("%s: target must hold class indices (ints or whole floats), got dtype %s"
                        % (api, target.dtype))
    if output.ndim == 0:
        raise ValueError("%s: output must have rank >= 1, got a scalar" % api)
    axis = _axis(api, axis, output.ndim)
    if not from_logits:
        output = ew.log(_clip_eps(output))
    return nn_ops.SparseSoftmaxCrossEntropy(axis)(target, output)


def binary_crossentropy(target, output, from_logits=False):
    """Element-wise ``-(t log(p) + (1 - t) log(1 - p))``; probabilities are
    clipped to ``[epsilon, 1 - epsilon]`` and turned back into logits."""
    api = "binary_crossentropy"
    output = _float(output, api, "output")
    target = _like(target, output, api, "target")
    ew.broadcast_shapes(api, target.shape, output.shape)
    if not from_logits:
        output = _clip_eps(output)
        output = ew.log(output / (1.0 - output))
    return nn_ops.SigmoidCrossEntropy()(target, output)


# ------------------------------------------------------------------ others

def l2_normalize(x, axis=None):
    """``x / sqrt(max(sum(x ** 2, axis), 1e-12))``."""
    x = _float(x, "l2_normalize")
    axes = red.normalize_axes("l2_normalize", axis, x.ndim)
    square_sum = red.reduce_sum(ew.square(x), axes, keepdims=True)
    return x / ew.sqrt(ew.maximum(square_sum, 1e-12))


def in_top_k(predictions, targets, k):
    """Whether ``predictions[i, targets[i]]`` is among the ``k`` largest of row
    i (ties at the boundary count as in)."""
    api = "in_top_k"
    predictions, targets = as_tensor(predictions), as_tensor(targets)
    if predictions.ndim != 2:
        raise ValueError("%s: predictions must be 2-D (batch_size, classes), got shape %s"
                         % (api, format_shape(predictions.shape)))
    if targets.ndim != 1:
        raise ValueError("%s: targets must be 1-D (batch_size,), got shape %s"
                         % (api, format_shape(targets.shape)))
    b1, b2 = predictions.shape[0], targets.shape[0]
    if b1 is not None and b2 is not None and b1 != b2:
        raise ValueError("%s: predictions of shape %s and targets of shape %s have different "
                         "batch sizes" % (api, format_shape(predictions.shape),
                                          format_shape(targets.shape)))
    if not is_int_dtype(targets.dtype):
        raise TypeError("%s: targets must be int32 or int64, got %s" % (api, targets.dtype))
    if not is_float_dtype(predictions.dtype):
        raise TypeError("%s: predictions must be a float tensor, got %s"
                        % (api, predictions.dtype))
    return nn_ops.InTopK(integer(api, "k", k))(predictions, targets)


def bias_add(x, bias, data_format=None):
    """``x + bias`` with the bias on the channels axis (axis 1 for
    channels_first inputs of rank 3 to 5, else the last axis)."""
    api = "bias_add"
    data_format = config.normalize_data_format(data_format)
    x, bias = as_tensor(x), as_tensor(bias)
    n = x.ndim
    if n < 2:
        raise ValueError("%s: x must have a batch axis and at least one more, got shape %s"
                         % (api, format_shape(x.shape)))
    if bias.ndim not in (1, n - 1):
        raise ValueError("%s: unexpected bias dimensions %d (shape %s), expected 1 or %d for x "
                         "of shape %s" % (api, bias.ndim, format_shape(bias.shape), n - 1,
                                          format_shape(x.shape)))
    channels_first = data_format == "channels_first" and 3 <= n <= 5
    if bias.ndim == 1:
        ch = 1 if channels_first else n - 1
        c, b = x.shape[ch], bias.shape[0]
        if c is not None and b is not None and c != b:
            raise ValueError("%s: bias of shape %s does not match the %d channels (axis %d) of x "
                             "of shape %s (%s)" % (api, format_shape(bias.shape), c, ch,
                                                   format_shape(x.shape), data_format))
        if ch != n - 1:
            bias = shp.reshape_static_dims(bias, tuple(i for i in range(n) if i != ch), n)
        return ew.add(x, bias)
    if channels_first:
        # Keras reshapes (not transposes) a (spatial..., C) bias to (C, spatial...);
        # models trained that way need the same layout.
        dims = [d if d is not None else shp.shape_of(bias)[i] for i, d in enumerate(bias.shape)]
        bias = shp.reshape(bias, [1, dims[-1]] + dims[:-1])
    expect = bias.shape[-(n - 1):]
    for xd, bd in zip(x.shape[1:], expect):
        if xd is not None and bd is not None and xd != bd:
            raise ValueError("%s: bias of shape %s does not match x of shape %s (%s)"
                             % (api, format_shape(bias.shape), format_shape(x.shape), data_format))
    return ew.add(x, bias)


def dropout(x, level, noise_shape=None, seed=None):
    """Inverted dropout: zero each entry with probability ``level`` and scale
    the rest by ``1 / (1 - level)``. ``noise_shape`` entries that are None (or
    symbolic) follow x."""
    api = "dropout"
    x = _float(x, api)
    if isinstance(level, Tensor):
        keep_t = 1.0 - ew.cast(level, x.dtype)
        u = rnd.random_tensor(api, rnd.RandomUniform, _noise_shape(api, x, noise_shape),
                              x.dtype, seed, minval=0.0, maxval=1.0)
        return x * ew.cast(ew.less(u, keep_t), x.dtype) / keep_t
    level = _scalar(api, "level", level)
    if not 0 <= level < 1:
        raise ValueError("%s: level must be in the range [0, 1), got %r" % (api, level))
    seed = rnd.make_seed(api, seed)
    if level == 0:
        return x
    mask = rnd.random_tensor(api, rnd.DropoutMask, _noise_shape(api, x, noise_shape), x.dtype,
                             seed, keep=1.0 - level)
    return x * mask


def _noise_shape(api, x, noise_shape):
    if noise_shape is None:
        return shp.shape_of(x) if None in x.shape else x.shape
    if isinstance(noise_shape, Tensor):
        static, _ = shp.shape_arg(api, noise_shape)
        if len(static) != x.ndim:
            raise ValueError("%s: noise_shape of rank %d does not match x of shape %s"
                             % (api, len(static), format_shape(x.shape)))
        return noise_shape
    if not isinstance(noise_shape, (list, tuple)):
        raise TypeError("%s: noise_shape must be a tuple/list or a 1-D int tensor, got %r"
                        % (api, noise_shape))
    if len(noise_shape) != x.ndim:
        raise ValueError("%s: noise_shape %r must have one entry per axis of x of shape %s"
                         % (api, tuple(noise_shape), format_shape(x.shape)))
    out = []
    for i, d in enumerate(noise_shape):
        if d is None:
            d = x.shape[i] if x.shape[i] is not None else shp.shape_of(x)[i]
        known = shp.static_int(d)
        if known is not None and x.shape[i] is not None and known not in (1, x.shape[i]):
            raise ValueError("%s: noise_shape %r is not broadcastable to x of shape %s"
                             % (api, tuple(noise_shape), format_shape(x.shape)))
        out.append(d)
    return out


# ------------------------------------------------------------------ batch norm

def _check_param(api, name, p, x):
    if p.ndim > x.ndim or any(pd is not None and xd is not None and pd not in (1, xd)
                              for pd, xd in zip(p.shape[::-1], x.shape[::-1])):
        raise ValueError("%s: %s of shape %s does not broadcast to x of shape %s"
                         % (api, name, format_shape(p.shape), format_shape(x.shape)))


def _normalize(x, mean, var, beta, gamma, epsilon):
    inv = ew.reciprocal(ew.sqrt(var + epsilon))
    if gamma is not None:
        inv = inv * gamma
    shift = -mean * inv if beta is None else beta - mean * inv
    return x * inv + shift


def batch_normalization(x, mean, var, beta, gamma, axis=-1, epsilon=0.001):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` (beta, gamma may be
    None). 1-D parameters go on ``axis``; others broadcast against x."""
    api = "batch_normalization"
    x = _float(x, api)
    epsilon = _scalar(api, "epsilon", epsilon)
    if x.ndim == 0:
        raise ValueError("%s: x must have rank >= 1, got a scalar" % api)
    ax = _axis(api, axis, x.ndim)
    params = []
    for name, p in (("mean", mean), ("var", var), ("beta", beta), ("gamma", gamma)):
        if p is None:
            if name in ("mean", "var"):
                raise ValueError("%s: %s must be a tensor, got None" % (api, name))
            params.append(None)
            continue
        p = _like(p, x, api, name)
        if p.ndim == 1 and x.ndim > 1:
            c, d = x.shape[ax], p.shape[0]
            if c is not None and d is not None and d not in (1, c):
                raise ValueError("%s: %s of shape %s does not match axis %d of x of shape %s"
                                 % (api, name, format_shape(p.shape), ax, format_shape(x.shape)))
            if ax != x.ndim - 1:
                p = shp.reshape_static_dims(p, tuple(i for i in range(x.ndim) if i != ax),
                                            x.ndim)
        _check_param(api, name, p, x)
        params.append(p)
    mean, var, beta, gamma = params
    return _normalize(x, mean, var, beta, gamma, epsilon)


def normalize_batch_in_training(x, gamma, beta, reduction_axes, epsilon=0.001):
    """Normalize x by the mean and (biased) variance over ``reduction_axes``.

    Returns ``(normed, mean, var)`` with mean and var of the shape of the
    axes that are kept, as Keras's TensorFlow backend does."""
    api = "normalize_batch_in_training"
    x = _float(x, api)
    epsilon = _scalar(api, "epsilon", epsilon)
    if reduction_axes is None or isinstance(reduction_axes, (list, tuple)) and \
            not reduction_axes:
        raise ValueError("%s: reduction_axes must list at least one axis, got %r"
                         % (api, reduction_axes))
    axes = red.normalize_axes(api, reduction_axes, x.ndim)
    mean = red.reduce(x, "mean", axes)
    mean_b = red.expand_reduced(mean, x.ndim, axes)
    var = red.reduce(ew.square(x - mean_b), "mean", axes)
    var_b = red.expand_reduced(var, x.ndim, axes)
    kept = [i for i in range(x.ndim) if i not in axes]

    def broadcast(p, name):
        if p is None:
            return None
        p = _like(p, x, api, name)
        if p.ndim == x.ndim or p.ndim == 0:
            out = p
        elif p.ndim == len(kept):
            for i, d in zip(kept, p.shape):
                if d is not None and x.shape[i] is not None and d not in (1, x.shape[i]):
                    raise ValueError("%s: %s of shape %s does not match the kept axes %s of x "
                                     "of shape %s" % (api, name, format_shape(p.shape), kept,
                                                      format_shape(x.shape)))
            out = red.expand_reduced(p, x.ndim, axes)
        else:
            # Keras reshapes the parameter to x's shape with the reduced axes set to 1.
            target = [1 if i in axes else (x.shape[i] if x.shape[i] is not None
                                           else shp.shape_of(x)[i]) for i in range(x.ndim)]
            out = shp.reshape(p, target)
        _check_param(api, name, out, x)
        return out

    normed = _normalize(x, mean_b, var_b, broadcast(beta, "beta"), broadcast(gamma, "gamma"),
                        epsilon)
    return normed, mean, var


# errors escaping each function name it; nodes remember it (graph/calls.py)
_calls.name_functions(globals(), __all__)
