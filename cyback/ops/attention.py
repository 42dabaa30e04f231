"""Scaled dot-product attention as one op: ``softmax(q k^T + bias) v`` for
every batch and head, the heads on axis 2 as Keras's MultiHeadAttention lays
them out after its projections.

Built from ``batch_dot``, ``softmax`` and the transposes between them, an
attention is a dozen steps, and at batch 1 the steps cost more than the
products (kernels/attention.pyx runs it as one, with no head copied out and
no score tensor written). The gradient is one op too (``AttentionGrad``),
which forms the probabilities again from q and k instead of keeping them.
"""
import numpy as np

from cyback.graph.op import Op
from cyback.kernels import attention as _attention
from cyback.ops import elementwise as ew


def _dims(api, q, k, v, bias):
    """(B, T, S, H, D, Dv) from the static shapes (None where unknown), or a
    ValueError saying which shapes disagree."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.ndim != 4:
            raise ValueError("%s: the %s must be 4-D (batch, positions, heads, channels), got "
                             "shape %s" % (api, name, t.shape))

    def same(a, b):
        return a is None or b is None or a == b
    ok = (same(q.shape[0], k.shape[0]) and same(q.shape[0], v.shape[0]) and
          same(q.shape[2], k.shape[2]) and same(q.shape[2], v.shape[2]) and
          same(q.shape[3], k.shape[3]) and same(k.shape[1], v.shape[1]))
    if not ok:
        raise ValueError("%s: query %s, key %s and value %s do not match (expected (B, T, H, "
                         "D), (B, S, H, D) and (B, S, H, Dv))" % (api, q.shape, k.shape, v.shape))
    if bias is not None and not 2 <= bias.ndim <= 4:
        raise ValueError("%s: the score bias must have rank 2 to 4 and end in (T, S), got "
                         "shape %s" % (api, bias.shape))

    def first(*values):
        return next((x for x in values if x is not None), None)
    return (first(q.shape[0], k.shape[0], v.shape[0]), q.shape[1], first(k.shape[1], v.shape[1]),
            first(q.shape[2], k.shape[2], v.shape[2]), first(q.shape[3], k.shape[3]), v.shape[3])


class Attention(Op):
    """(q (B, T, H, D), k (B, S, H, D), v (B, S, H, Dv)[, bias]) -> (B, T, H, Dv):
    per batch b and head h, ``softmax(q_bh k_bh^T + bias_bh) v_bh``; ``bias``
    broadcasts to (B, H, T, S) (a mask's large negative values). q comes
    scaled: MultiHeadAttention folds 1/sqrt(D) into the query's kernel."""

    api = "MultiHeadAttention"

    def __init__(self, biased=False):
        self.biased = bool(biased)

    def infer(self, q, k, v, *bias):
        b, t, _, h, _, dv = _dims(self.api, q, k, v, bias[0] if bias else None)
        return [((b, t, h, dv), ew.result_dtype(ew.result_dtype(q.dtype, k.dtype), v.dtype))]

    def compute(self, q, k, v, *bias):
        dtype = np.result_type(q, k, v)
        if dtype != np.float32 and dtype != np.float64:
            dtype = np.dtype(np.float64)
        q, k, v = (np.asarray(a, dtype) for a in (q, k, v))
        return (_attention.attention(q, k, v, bias[0] if bias else None),)

    def bind(self, inputs):
        """A plan step's direct call (Op.bind): the kernel's prepared call for
        these shapes and strides (without a bias)."""
        if len(inputs) != 3:
            return None
        call = _attention.attention_call(*inputs)
        return None if call is None else (call, (0, 1, 2), False)

    def grad(self, inputs, outputs, grads):
        if grads[0] is None:
            return [None] * len(inputs)
        outs = AttentionGrad(self.biased)(*(list(inputs) + [grads[0]]))
        return list(outs)


def _probabilities(q, k, bias):
    """(B, H, T, S) softmax of the biased scores, in float64 for float64 input."""
    scores = np.matmul(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1))
    if bias is not None:
        scores = scores + bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
    scores = scores - np.max(scores, axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= np.sum(p, axis=-1, keepdims=True)
    return p


def _sum_to(x, shape):
    """``x`` (B, H, T, S) summed over the axes ``shape`` broadcasts along."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


class AttentionGrad(Op):
    """The gradients of ``Attention`` with respect to q, k, v (and the bias)
    given the output's gradient g: with P the probabilities,
    dv = P^T g, dS = P * (g v^T - rowsum(g v^T * P)), dq = dS k, dk = dS^T q."""

    api = "MultiHeadAttention"

    def __init__(self, biased=False):
        self.biased = bool(biased)
        self.n_outputs = 4 if self.biased else 3

    def infer(self, q, k, v, *rest):
        out = [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]
        if self.biased:
            out.append((rest[0].shape, rest[0].dtype))
        return out

    def compute(self, q, k, v, *rest):
        bias, g = (rest[0], rest[1]) if self.biased else (None, rest[0])
        dtype = np.result_type(q, k, v, g)
        if dtype != np.float32:
            dtype = np.dtype(np.float64)
        qf, kf, vf, gf = (np.asarray(a, dtype) for a in (q, k, v, g))
        p = _probabilities(qf, kf, None if bias is None else np.asarray(bias, dtype))
        gh = gf.transpose(0, 2, 1, 3)                               # (B, H, T, Dv)
        dv = np.matmul(p.transpose(0, 1, 3, 2), gh)                 # (B, H, S, Dv)
        dp = np.matmul(gh, vf.transpose(0, 2, 3, 1))                # (B, H, T, S)
        ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
        dq = np.matmul(ds, kf.transpose(0, 2, 1, 3))                # (B, H, T, D)
        dk = np.matmul(ds.transpose(0, 1, 3, 2), qf.transpose(0, 2, 1, 3))  # (B, H, S, D)
        out = [dq.transpose(0, 2, 1, 3).astype(q.dtype), dk.transpose(0, 2, 1, 3).astype(k.dtype),
               dv.transpose(0, 2, 1, 3).astype(v.dtype)]
        if self.biased:
            out.append(_sum_to(ds, np.shape(bias)).reshape(np.shape(bias)).astype(
                np.asarray(bias).dtype))
        return tuple(np.ascontiguousarray(a) for a in out)

    def grad(self, inputs, outputs, grads):
        raise ValueError("MultiHeadAttention: second derivatives through the fused attention "
                         "of the inference phase are not available; take them with the "
                         "learning phase set to 1, where the attention runs as separate ops")
