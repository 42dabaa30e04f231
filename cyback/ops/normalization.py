"""Layer normalization over the last axis as one op.

    LayerNorm(eps, scale, center)(x[, gamma][, beta])
        = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta

with the mean and the biased variance of each row of the last axis. Written
with mean/var/sqrt ops it is a dozen plan steps (two reductions, their
broadcasts, the scaling); here the statistics and the scaling are one pass per
row (``kernels/reduce.pyx``, ``layer_norm_last``) and the gradient is the
closed form below, written with ops so that second derivatives exist.
"""
import numpy as np

from cyback.graph.op import Op
from cyback.graph.shapes import format_shape
from cyback.kernels import reduce as _reduce
from cyback.ops import elementwise as ew
from cyback.ops import reduction as red


class LayerNorm(Op):
    """y = (x - mean) * rsqrt(var + epsilon) [* gamma] [+ beta] over the last axis."""

    api = "layer_normalization"
    fresh_output = True

    def __init__(self, epsilon, scale, center):
        self.epsilon = float(epsilon)
        self.scale = bool(scale)
        self.center = bool(center)

    def _params(self, params):
        gamma = params[0] if self.scale else None
        beta = params[-1] if self.center else None
        return gamma, beta

    def infer(self, x, *params):
        if len(params) != self.scale + self.center:
            raise ValueError("%s: expected %d parameter vector(s) (gamma if scale, beta if "
                             "center), got %d" % (self.api, self.scale + self.center, len(params)))
        if x.ndim < 1:
            raise ValueError("%s: expected an input of rank >= 1, got a scalar" % self.api)
        if not x.dtype.startswith("float"):
            raise TypeError("%s: expected a float input, got %s" % (self.api, x.dtype))
        n = x.shape[-1]
        for p in params:
            if p.ndim != 1 or (n is not None and p.shape[0] is not None and p.shape[0] != n):
                raise ValueError("%s: gamma and beta must be vectors of the last axis's length "
                                 "%s, got shape %s for an input of shape %s"
                                 % (self.api, n, format_shape(p.shape), format_shape(x.shape)))
        return [(x.shape, x.dtype)]

    def compute(self, x, *params):
        gamma, beta = self._params(params)
        if x.dtype.char in "fd":
            return (_reduce.layer_norm_last(x, gamma, beta, self.epsilon),)
        # float16: computed in float32, as the kernels take no half floats
        y = _reduce.layer_norm_last(x.astype(np.float32),
                                    None if gamma is None else gamma.astype(np.float32),
                                    None if beta is None else beta.astype(np.float32),
                                    self.epsilon)
        return (y.astype(x.dtype),)

    def bind(self, inputs):
        """A plan step's direct call (Op.bind): the kernel's prepared call for
        this shape of x, with gamma and beta at their positions."""
        x = inputs[0]
        if x.dtype.char not in "fd" or x.size == 0:
            return None
        gamma, beta = self._params(inputs[1:])
        if any(v is not None and v.dtype != x.dtype for v in (gamma, beta)):
            return None
        call = _reduce.layer_norm_call(x.shape, x.dtype, gamma is not None, beta is not None,
                                       self.epsilon)
        return call, (0, 1 if self.scale else None,
                      len(inputs) - 1 if self.center else None), False

    def grad(self, inputs, outputs, grads):
        x = inputs[0]
        gamma, _ = self._params(inputs[1:])
        g = grads[0]

        def mean(t):
            return red.reduce(t, "mean", -1, True)

        centered = x - mean(x)
        inv = ew.reciprocal(ew.sqrt(mean(ew.square(centered)) + self.epsilon))
        xhat = centered * inv
        # d/dx of xhat applied to gs: inv * (gs - mean(gs) - xhat * mean(gs * xhat))
        gs = g if gamma is None else g * gamma
        dx = inv * (gs - mean(gs) - xhat * mean(gs * xhat))
        out = [dx]
        rows = tuple(range(x.ndim - 1))
        if self.scale:
            out.append(red.reduce(g * xhat, "sum", rows, False) if rows else g * xhat)
        if self.center:
            out.append(red.reduce(g, "sum", rows, False) if rows else g)
        return out


def layer_norm(x, gamma=None, beta=None, epsilon=1e-3):
    """Layer normalization of ``x`` over its last axis, scaled by the vector
    ``gamma`` and shifted by ``beta`` when given."""
    params = [p for p in (gamma, beta) if p is not None]
    return LayerNorm(epsilon, gamma is not None, beta is not None)(x, *params)
