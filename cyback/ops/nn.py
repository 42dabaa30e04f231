"""Neural-network ops: relu/elu, softmax and log-softmax, the fused
crossentropies, in_top_k and the one-hot mask their gradients use.

The crossentropy ops take logits; the API turns probabilities into logits
first (clipping by epsilon as Keras does), so each op has one closed-form
gradient.
"""
import numpy as np

from cyback.graph.op import Op
from cyback.graph.shapes import format_shape
from cyback.kernels import softmax as _softmax
from cyback.ops import elementwise as ew
from cyback.ops import reduction as red


def _dims_agree(a, b):
    return a is None or b is None or a == b


def _same_shape(api, what, a, b):
    if not _compatible(a.shape, b.shape):
        raise ValueError("%s: %s must have the same shape, got %s and %s"
                         % (api, what, format_shape(a.shape), format_shape(b.shape)))


def _compatible(a, b):
    return len(a) == len(b) and all(_dims_agree(x, y) for x, y in zip(a, b))


def _drop_axis(shape, axis):
    return tuple(d for i, d in enumerate(shape) if i != axis)


# ------------------------------------------------------------------ relu

class Relu(Op):
    """Keras 2.3.1's relu: ``x`` above ``threshold`` (else 0), clipped to
    ``[0, max_value]``, minus ``alpha * relu(threshold - x)``."""

    api = "relu"

    def __init__(self, alpha, max_value, threshold):
        self.alpha = alpha
        self.max_value = max_value
        self.threshold = threshold

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        t, a, m = self.threshold, self.alpha, self.max_value
        if t == 0 and a == 0 and m is None:
            return (np.maximum(x, np.zeros((), x.dtype)),)
        y = np.where(x > t, x, np.zeros((), x.dtype)) if t != 0 else np.maximum(x, 0)
        if m is not None:
            y = np.clip(y, 0, m)
        if a != 0:
            y = y - a * np.maximum(t - x, 0)
        return (np.asarray(y, dtype=x.dtype),)

    def lower(self, inputs, ctx):
        # At inference, relu / relu6 after an op that applies it in its kernel
        # (an int8 layer's epilogue: its ``absorb_activation`` hook) goes in there.
        if not ctx.inference or self.alpha != 0 or self.threshold != 0 or \
                self.max_value not in (None, 6) or ctx.users(inputs[0]) != 1:
            return None
        made = ctx.producer(inputs[0])
        hook = getattr(made[0], "absorb_activation", None) if made is not None else None
        out = hook(made[1], "relu" if self.max_value is None else "relu6", ctx) \
            if hook is not None else None
        return None if out is None else [out]

    def ewise(self, b, x):
        # the same steps as compute, so the results are identical
        t, a, m = self.threshold, self.alpha, self.max_value
        zero = b.const(0)
        y = b.emit("select_gt", x, b.const(t), x, zero) if t != 0 else b.emit("maximum", x, zero)
        if m is not None:
            y = b.emit("minimum", b.emit("maximum", y, zero), b.const(m))
        if a != 0:
            below = b.emit("maximum", b.emit("subtract", b.const(t), x), zero)
            y = b.emit("subtract", y, b.emit("multiply", b.const(a), below))
        return y

    def grad(self, inputs, outputs, grads):
        return [grads[0] * ReluSlope(self.alpha, self.max_value, self.threshold)(inputs[0])]


class ReluSlope(Op):
    """The derivative of Relu, piecewise constant (so its own gradient is zero)."""

    api = "relu"

    def __init__(self, alpha, max_value, threshold):
        self.alpha = alpha
        self.max_value = max_value
        self.threshold = threshold

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def ewise(self, b, x):
        # the plain and the ReLU6 slopes: selects, identical to compute
        t, a, m = self.threshold, self.alpha, self.max_value
        if a != 0 or (m is not None and not (t == 0 and m == 6)):
            return None
        zero = b.const(0)
        s = b.emit("select_gt", x, b.const(t), b.const(1), zero)
        if m is not None:
            s = b.emit("select_gt", b.const(m), x, s, zero)
        return s

    def compute(self, x):
        t, a, m = self.threshold, self.alpha, self.max_value
        base = x > t
        if m is not None:
            if t == 0 and m == 6:
                # TF's relu6 gradient excludes the upper bound.
                base &= x < m
            else:
                # clip_by_value passes the gradient at its bounds.
                y = np.where(base, x, 0)
                base &= (y >= 0) & (y <= m)
        s = base.astype(x.dtype)
        if a != 0:
            s += a * (x < t)
        return (s,)


# ------------------------------------------------------------------ elu

class Elu(Op):
    api = "elu"

    def __init__(self, alpha):
        self.alpha = alpha

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        neg = np.expm1(np.minimum(x, 0))
        if self.alpha != 1:
            neg *= self.alpha
        return (np.where(x > 0, x, neg).astype(x.dtype, copy=False),)

    def ewise(self, b, x):
        zero = b.const(0)
        neg = b.emit("expm1", b.emit("minimum", x, zero))
        if self.alpha != 1:
            neg = b.emit("multiply", neg, b.const(self.alpha))
        return b.emit("select_gt", x, zero, x, neg)

    def grad(self, inputs, outputs, grads):
        x, y = inputs[0], outputs[0]
        # Below 0, d/dx alpha*(exp(x)-1) = y + alpha.
        slope = ew.where(ew.greater(x, 0), ew.ones_like(y), y + self.alpha)
        return [grads[0] * slope]


# ------------------------------------------------------------------ softmax

def _max_keep(x, axis):
    if x.size == 0:
        return np.zeros(tuple(1 if i == axis else d for i, d in enumerate(x.shape)), x.dtype)
    m = np.max(x, axis=axis, keepdims=True)
    # An all -inf slice would give nan from inf - inf; shift it by 0 instead.
    return np.where(np.isneginf(m), np.zeros((), x.dtype), m)


def softmax_array(x, axis):
    e = np.exp(x - _max_keep(x, axis))
    e /= e.sum(axis=axis, keepdims=True)
    return e


def log_softmax_array(x, axis):
    z = x - _max_keep(x, axis)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


class Softmax(Op):
    api = "softmax"

    def __init__(self, axis):
        self.axis = axis

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        if self.axis in (-1, x.ndim - 1) and x.dtype.char in "fd" and x.ndim:
            return (_softmax.softmax_last(x),)
        return (softmax_array(x, self.axis).astype(x.dtype, copy=False),)

    def grad(self, inputs, outputs, grads):
        y, g = outputs[0], grads[0]
        return [y * (g - red.reduce_sum(g * y, self.axis, keepdims=True))]


class LogSoftmax(Op):
    api = "softmax"

    def __init__(self, axis):
        self.axis = axis

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        return (log_softmax_array(x, self.axis).astype(x.dtype, copy=False),)

    def grad(self, inputs, outputs, grads):
        g = grads[0]
        return [g - ew.exp(outputs[0]) * red.reduce_sum(g, self.axis, keepdims=True)]


# ------------------------------------------------------------------ crossentropies

class SoftmaxCrossEntropy(Op):
    """``-sum(target * log_softmax(logits), axis)``."""

    api = "categorical_crossentropy"

    def __init__(self, axis):
        self.axis = axis

    def infer(self, target, logits):
        _same_shape(self.api, "target and output", target, logits)
        return [(_drop_axis(logits.shape, self.axis), logits.dtype)]

    def compute(self, target, logits):
        logp = log_softmax_array(logits, self.axis)
        loss = -np.sum(target * logp, axis=self.axis)
        return (np.asarray(loss, dtype=logits.dtype),)

    def grad(self, inputs, outputs, grads):
        target, logits = inputs
        g = red.expand_reduced(grads[0], logits.ndim, (self.axis,))
        total = red.reduce_sum(target, self.axis, keepdims=True)
        d_logits = g * (Softmax(self.axis)(logits) * total - target)
        d_target = -g * LogSoftmax(self.axis)(logits)
        return [d_target, d_logits]


class OneHotAlong(Op):
    """1 where ``axis`` of ``like`` equals ``labels`` (labels have like's shape
    without ``axis``), else 0; in like's dtype."""

    api = "sparse_categorical_crossentropy"

    def __init__(self, axis):
        self.axis = axis

    def infer(self, labels, like):
        return [(like.shape, like.dtype)]

    def compute(self, labels, like):
        labels = _labels(labels, like, self.axis)
        n = like.shape[self.axis]
        shape = [1] * like.ndim
        shape[self.axis] = n
        classes = np.arange(n).reshape(shape)
        return ((np.expand_dims(labels, self.axis) == classes).astype(like.dtype),)


def _labels(labels, logits, axis):
    """Integer labels in the loss shape (logits' shape without ``axis``); Keras
    flattens the target, so any shape with the right number of elements goes."""
    shape = _drop_axis(logits.shape, axis)
    labels = np.asarray(labels)
    if labels.size != int(np.prod(shape)):
        raise ValueError("sparse_categorical_crossentropy: target of shape %s does not match "
                         "output of shape %s (expected %s labels)"
                         % (labels.shape, logits.shape, format_shape(shape)))
    labels = labels.reshape(shape)
    if labels.dtype.kind not in "iub":
        labels = labels.astype(np.int64)
    n = logits.shape[axis]
    if labels.size and (labels.min() < 0 or labels.max() >= n):
        bad = labels[(labels < 0) | (labels >= n)].ravel()[0]
        raise ValueError("sparse_categorical_crossentropy: label %d is out of range for %d "
                         "classes" % (bad, n))
    return labels


class SparseSoftmaxCrossEntropy(Op):
    """``-log_softmax(logits)[label]`` along ``axis``."""

    api = "sparse_categorical_crossentropy"

    def __init__(self, axis):
        self.axis = axis

    def infer(self, labels, logits):
        shape = _drop_axis(logits.shape, self.axis)
        if not (_compatible(labels.shape, shape) or _compatible(labels.shape, shape + (1,))):
            known = None not in labels.shape and None not in shape
            if known and int(np.prod(labels.shape)) != int(np.prod(shape)) or \
                    not known and labels.ndim not in (len(shape), len(shape) + 1):
                raise ValueError("sparse_categorical_crossentropy: target of shape %s does not "
                                 "match output of shape %s; expected %s or %s"
                                 % (format_shape(labels.shape), format_shape(logits.shape),
                                    format_shape(shape), format_shape(shape + (1,))))
        return [(shape, logits.dtype)]

    def compute(self, labels, logits):
        labels = _labels(labels, logits, self.axis)
        logp = log_softmax_array(logits, self.axis)
        picked = np.take_along_axis(logp, np.expand_dims(labels, self.axis).astype(np.intp),
                                    axis=self.axis)
        return (np.asarray(-np.squeeze(picked, self.axis), dtype=logits.dtype),)

    def grad(self, inputs, outputs, grads):
        labels, logits = inputs
        g = red.expand_reduced(grads[0], logits.ndim, (self.axis,))
        return [None, g * (Softmax(self.axis)(logits) - OneHotAlong(self.axis)(labels, logits))]


class SigmoidCrossEntropy(Op):
    """``max(x, 0) - x * z + log(1 + exp(-|x|))`` for logits x and targets z."""

    api = "binary_crossentropy"

    def infer(self, target, logits):
        shape = ew.broadcast_shapes(self.api, target.shape, logits.shape)
        return [(shape, logits.dtype)]

    def compute(self, target, logits):
        x, z = logits, target
        loss = np.maximum(x, 0) - x * z + np.log1p(np.exp(-np.abs(x)))
        return (np.asarray(loss, dtype=logits.dtype),)

    def grad(self, inputs, outputs, grads):
        target, logits = inputs
        g = grads[0]
        return [ew.unbroadcast(-g * logits, target),
                ew.unbroadcast(g * (ew.sigmoid(logits) - target), logits)]


# ------------------------------------------------------------------ in_top_k

class InTopK(Op):
    """TF's rule: true when fewer than k classes score strictly higher than the
    target (so ties at the boundary are all in); false for an out-of-range
    target or a row holding a non-finite score."""

    api = "in_top_k"

    def __init__(self, k):
        self.k = k

    def infer(self, predictions, targets):
        return [((predictions.shape[0] if predictions.shape[0] is not None
                  else targets.shape[0],), "bool")]

    def compute(self, predictions, targets):
        p = np.asarray(predictions)
        t = np.asarray(targets).astype(np.int64)
        if p.shape[0] != t.shape[0]:
            raise ValueError("in_top_k: predictions of shape %s and targets of shape %s have "
                             "different batch sizes" % (p.shape, t.shape))
        n, c = p.shape
        valid = (t >= 0) & (t < c)
        rows = np.arange(n)
        score = p[rows, np.where(valid, t, 0)] if c else np.zeros(n, p.dtype)
        higher = (p > score[:, None]).sum(axis=1)
        finite = np.isfinite(p).all(axis=1)
        return (valid & finite & (higher < self.k),)
