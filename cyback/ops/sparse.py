"""Products of a sparse 2-D matrix (a sparse placeholder, fed scipy.sparse and
kept as CSR) with a dense tensor, and the concatenation of sparse matrices.

Sparse inputs are leaves: the gradient flows to the dense side only.
"""
import numpy as np

from cyback.graph.op import Op
from cyback.graph.shapes import format_shape
from cyback.graph.tensor import as_tensor, is_float_dtype
from cyback.ops import elementwise as ew


def is_sparse_tensor(x):
    return bool(getattr(x, "sparse", False))
class ToDense(Op):
    """A sparse tensor's dense value (K.to_dense)."""

    api = "to_dense"

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        return (x.toarray() if hasattr(x, "toarray") else np.asarray(x),)

    def grad(self, inputs, outputs, grads):
        return [grads[0]]


class SparseDot(Op):
    """``S @ D`` (``sparse_left``) or ``D @ S``, with ``S`` transposed when
    ``transpose`` is set. S is 2-D; D is 1-D or 2-D."""

    api = "dot"

    def __init__(self, sparse_left, transpose):
        self.sparse_left = sparse_left
        self.transpose = transpose

    def _s_shape(self, s):
        return tuple(reversed(s.shape)) if self.transpose else tuple(s.shape)

    def infer(self, a, b):
        s, d = (a, b) if self.sparse_left else (b, a)
        rows, cols = self._s_shape(s)
        if self.sparse_left:
            k, out = d.shape[0], (rows,) + tuple(d.shape[1:])
            inner = cols
        else:
            k, out = d.shape[-1], tuple(d.shape[:-1]) + (cols,)
            inner = rows
        if k is not None and inner is not None and k != inner:
            raise ValueError("dot: cannot multiply shapes %s and %s (%d != %d)"
                             % (format_shape(a.shape), format_shape(b.shape),
                                inner if self.sparse_left else k, k if self.sparse_left else inner))
        return [(out, ew.result_dtype(a.dtype, b.dtype))]

    def compute(self, a, b):
        dtype = ew.result_dtype(np.dtype(a.dtype).name, np.dtype(b.dtype).name)
        if self.sparse_left:
            s = a.T if self.transpose else a
            out = s @ np.asarray(b)
        else:
            s = b.T if self.transpose else b
            # Let the sparse operand drive the product: (D S)^T = S^T D^T.
            out = (s.T @ np.asarray(a).T).T
        out = out.toarray() if hasattr(out, "toarray") else np.asarray(out)
        return (out.astype(dtype, copy=False),)

    def grad(self, inputs, outputs, grads):
        a, b = inputs
        g = grads[0]
        flipped = SparseDot(self.sparse_left, not self.transpose)
        if self.sparse_left:
            # d(S D)/dD: S^T g
            return [None, flipped(a, g) if is_float_dtype(b.dtype) else None]
        # d(D S)/dD: g S^T
        return [flipped(g, b) if is_float_dtype(a.dtype) else None, None]


class SparseConcat(Op):
    """Join 2-D sparse tensors along ``axis`` into one CSR matrix. Any input
    value (scipy.sparse in any format, or the dense storage of a sparse
    variable) is taken as CSR. Sparse inputs are leaves: no gradient."""

    api = "concatenate"

    def __init__(self, axis):
        self.axis = axis

    def infer(self, *xs):
        other = 1 - self.axis
        sizes = [x.shape[self.axis] for x in xs]
        known = {x.shape[other] for x in xs if x.shape[other] is not None}
        if len(known) > 1:
            raise ValueError("concatenate: sparse tensors of shapes %s do not match on axis %d"
                             % (", ".join(format_shape(x.shape) for x in xs), other))
        shape = [None, None]
        shape[self.axis] = None if None in sizes else sum(sizes)
        shape[other] = known.pop() if known else None
        dtype = xs[0].dtype
        for x in xs[1:]:
            dtype = ew.result_dtype(dtype, x.dtype)
        return [(tuple(shape), dtype)]

    def compute(self, *xs):
        import scipy.sparse as sp
        dtype = np.dtype(xs[0].dtype).name
        for x in xs[1:]:
            dtype = ew.result_dtype(dtype, np.dtype(x.dtype).name)
        mats = [sp.csr_matrix(x) for x in xs]
        join = sp.vstack if self.axis == 0 else sp.hstack
        return (join(mats, format="csr").astype(dtype),)

    def grad(self, inputs, outputs, grads):
        return [None] * len(inputs)


def sparse_concatenate(tensors, axis):
    """The concatenation of 2-D sparse tensors along axis 0 or 1, sparse."""
    out = SparseConcat(axis)(*tensors)
    out.sparse = True
    return out


def sparse_dot(x, y):
    """``x @ y`` where one of x, y is a sparse 2-D tensor and the other is
    dense (1-D or 2-D)."""
    x, y = as_tensor(x), as_tensor(y)
    sx, sy = is_sparse_tensor(x), is_sparse_tensor(y)
    if sx and sy:
        raise ValueError("dot: the product of two sparse tensors is not supported (shapes "
                         "%s and %s); convert one with to_dense"
                         % (format_shape(x.shape), format_shape(y.shape)))
    sparse, dense = (x, y) if sx else (y, x)
    if sparse.ndim != 2:
        raise ValueError("dot: a sparse operand must be 2-D, got shape %s"
                         % format_shape(sparse.shape))
    if dense.ndim not in (1, 2):
        raise ValueError("dot: the dense operand of a sparse product must be 1-D or 2-D, got "
                         "shapes %s and %s" % (format_shape(x.shape), format_shape(y.shape)))
    if not is_float_dtype(dense.dtype):
        dense = ew.cast(dense, sparse.dtype if is_float_dtype(sparse.dtype) else "float32")
    return SparseDot(sx, False)(x if sx else dense, dense if sx else y)


def maybe_sparse_dot(x, y):
    """The sparse product when x or y is sparse, else None (for ``dot``)."""
    if is_sparse_tensor(x) or is_sparse_tensor(y):
        return sparse_dot(x, y)
    return None
