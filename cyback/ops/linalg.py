"""Tensor contractions: ``dot`` (NumPy/Theano nD semantics) and ``batch_dot``.

Both are one general op each — a contraction of chosen axes — whose gradient
is again a contraction followed by a transpose, so second derivatives come
for free.
"""
import math

import numpy as np

from cyback.graph.op import Op
from cyback.graph.tensor import as_tensor
from cyback.kernels import linalg as _linalg
from cyback.kernels import runtime as _runtime
from cyback.ops import elementwise as ew
from cyback.ops.shape import reshape, reshape_static_dims, transpose
from cyback.ops.sparse import maybe_sparse_dot

# kernels.linalg.dense's activation codes
_ACTIVATIONS = {None: 0, "relu": 1, "relu6": 2}


def _free(ndim, axes, start=0):
    return [i for i in range(start, ndim) if i not in axes]


def _check_contracted(api, x, y, ax, ay):
    for a, b in zip(ax, ay):
        dx, dy = x.shape[a], y.shape[b]
        if dx is not None and dy is not None and dx != dy:
            raise ValueError("%s: cannot contract axis %d of shape %s with axis %d of shape %s "
                             "(%d != %d)" % (api, a, x.shape, b, y.shape, dx, dy))


def _grad_perm(free_axes, contracted_axes):
    """Permutation that puts a contraction result (free axes, then contracted
    axes) back in the input's axis order."""
    order = list(free_axes) + list(contracted_axes)
    return tuple(int(i) for i in np.argsort(order))


class TensorDot(Op):
    api = "dot"
    # compute returns a new array, so an element-wise epilogue may run on it
    # in place (graph/fusion.py)
    fresh_output = True
    epilogue_host = True

    def __init__(self, ax, ay):
        self.ax = ax
        self.ay = ay

    def rewrite(self, inputs, ctx):
        # At inference, a Dense kernel of few columns is also read transposed
        # (computed once with the frozen weights): see NarrowProduct.
        x, w = inputs
        if not ctx.inference or self.ax != (1,) or self.ay != (0,) or x.ndim != 2 or \
                w.ndim != 2 or not ctx.is_weight(w) or ctx.is_weight(x) or \
                w.shape[1] is None or w.shape[1] > NarrowProduct.MAX_COLUMNS or \
                x.dtype != w.dtype or x.dtype not in ("float32", "float64"):
            return None
        return [NarrowProduct()(x, w, TransposedCopy()(w))]

    def lower(self, inputs, ctx):
        # At inference, other float32 weights are packed once into panels
        # (see PackedProduct), once the rewrites that look for a TensorDot
        # (BatchNorm folding, the recurrent cells' projections) are done.
        x, w = inputs
        if not ctx.inference or not ctx.is_weight(w) or ctx.is_weight(x):
            return None
        return PackedProduct.replacing(self, x, w)

    def infer(self, x, y):
        _check_contracted(self.api, x, y, self.ax, self.ay)
        shape = tuple(x.shape[i] for i in _free(x.ndim, self.ax)) + \
            tuple(y.shape[i] for i in _free(y.ndim, self.ay))
        return [(shape, ew.result_dtype(x.dtype, y.dtype))]

    def compute(self, x, y):
        return (contract(x, y, self.ax, self.ay),)

    def kernel_epilogue(self, bias_axis, activation, out, residual=False, exact=False):
        """A bias along the output's last axis starts the GEMM's accumulator
        (see graph/op.py): the product then needs no pass of its own for it.
        A product the calling thread does (kernels.linalg.dense) also
        applies relu or relu6 in the same call; larger ones apply it in place
        after the product.
        Neither rounds as a product followed by an add does, so training
        plans (``exact``) keep the add."""
        return not exact and bias_axis == -1 and activation in (None, "relu", "relu6") and \
            not residual and self.ay == (0,) and len(self.ax) == 1

    def compute_epilogue(self, inputs, bias, activation, residual=None):
        x, y = inputs
        if x.ndim >= 2 and self.ax == (x.ndim - 1,) and self.ay == (0,) and residual is None \
                and bias is not None and (x.ndim == 2 or x.flags.c_contiguous):
            # a Dense layer's step (on the 2-D view of a stack of rows),
            # checked by the kernel, which does it on the calling thread when
            # it is small: the calls around it cost as much as its product at
            # batch 32, and an LSTM's input projection at batch 1 takes it
            out = _linalg.dense(x if x.ndim == 2 else x.reshape(-1, x.shape[-1]), y,
                                bias if bias.ndim == 1 else bias.reshape(-1),
                                _ACTIVATIONS[activation])
            if out is not None:
                return out if x.ndim == 2 else out.reshape(x.shape[:-1] + y.shape[1:])
        if y.ndim != 2 or self.ax != (x.ndim - 1,) or bias is None or residual is not None \
                or x.dtype != y.dtype or bias.dtype != x.dtype or x.dtype.char not in "fd" \
                or bias.size != y.shape[1]:
            return None
        out = contract(x, y, self.ax, self.ay, bias.reshape(-1))
        # relu / relu6 in place: exact, as the element-wise program's would
        # be, and cheaper than starting that program for a small product
        # (a batch-32 MLP layer; benchmarks/bench_models.py)
        if activation is not None:
            np.maximum(out, 0, out=out)
            if activation == "relu6":
                np.minimum(out, 6, out=out)
        return out

    def time_mapped(self, ins, variant):
        # x_t @ W over all steps is one product of the (T, ...) stack
        if variant == [True, False] and self.ax == (ins[0].ndim - 1,):
            return TensorDot((self.ax[0] + 1,), self.ay)
        return None

    def steps_summed(self, ins):
        # a weight gradient summed over a loop's steps (h_t^T @ dz_t): one
        # product over (time, contracted axes) of the stacked operands
        return (0, 1)

    def sum_over_steps(self, stacked, like, sum_steps):
        a, b = stacked
        return TensorDot((0,) + tuple(i + 1 for i in self.ax),
                         (0,) + tuple(i + 1 for i in self.ay))(a, b)

    def inline_src(self, ins, outs, ns, args):
        x, y = ins
        if x.ndim != 2 or y.ndim != 2 or not x.dtype == y.dtype == outs[0].dtype or \
                x.dtype not in ("float32", "float64"):
            return None
        ns["np_dot"] = np.dot
        a0 = args[0] if self.ax == (1,) else args[0] + ".T"
        a1 = args[1] if self.ay == (0,) else args[1] + ".T"
        macs = "%s.shape[0] * %s.shape[1] * %s.shape[1]" % (a0, a0, a1)
        return "np_dot(%s, %s)" % (a0, a1), macs, False

    def scale_output(self, inputs, out, v, ctx):
        """(x @ w) * v for a vector v along the last axis: w's columns scaled
        (BatchNorm after a Dense layer)."""
        x, w = inputs
        if self.ay != (0,) or w.ndim != 2 or self.ax != (x.ndim - 1,) or \
                not ctx.is_weight(w) or w.shape[1] is None:
            return None
        if ctx.channel_vector(v, out, out.ndim - 1) is None:
            return None
        return TensorDot(self.ax, self.ay)(x, w * reshape(v, (w.shape[1],)))

    def grad(self, inputs, outputs, grads):
        x, y = inputs
        g = grads[0]
        fx, fy = _free(x.ndim, self.ax), _free(y.ndim, self.ay)
        g_fx = tuple(range(len(fx)))
        g_fy = tuple(range(len(fx), len(fx) + len(fy)))
        # dx: contract g's y-free axes with y's free axes → (fx..., ay...)
        dx = TensorDot(g_fy, tuple(fy))(g, y)
        dx = transpose(dx, _grad_perm(fx, self.ax))
        # dy: contract x's free axes with g's x-free axes → (ay ≡ ax..., fy...)
        dy = TensorDot(tuple(fx), g_fx)(x, g)
        dy = transpose(dy, _grad_perm(self.ay, fy))
        return [dx, dy]


class NarrowProduct(Op):
    """``x @ w`` for a 2-D x and a weight w (k, n) of at most MAX_COLUMNS
    columns, given also transposed (``wt``: an inference plan's frozen
    weights compute it once; TensorDot.rewrite puts this op in).

    Rows of n values are too short for a vector, and a row of x times w
    adds each output's k products in one chain; one row of x goes instead
    to kernels.linalg.dense_t, a dot product per output of two contiguous
    rows of k values, several times faster for one row. Several rows keep
    the product (it reads w once for all of them), and so do kernels wider
    than MAX_COLUMNS, where the product's rows are long enough again. The
    sums run in another order than the product's: values differ in the last
    bits."""

    api = "dot"
    fresh_output = True
    epilogue_host = True
    MAX_COLUMNS = 16
    _DOT = TensorDot((1,), (0,))

    def infer(self, x, w, wt):
        return self._DOT.infer(x, w)

    def compute(self, x, w, wt):
        out = _linalg.dense_t(x, wt) if x.shape[0] <= _linalg.DENSE_T_MAX_ROWS else None
        return (out,) if out is not None else self._DOT.compute(x, w)

    def kernel_epilogue(self, bias_axis, activation, out, residual=False, exact=False):
        return self._DOT.kernel_epilogue(bias_axis, activation, out, residual, exact)

    def scale_output(self, inputs, out, v, ctx):
        # (x @ w) * v: the product's rule (w's columns scaled), both layouts
        scaled = self._DOT.scale_output(inputs[:2], out, v, ctx)
        if scaled is None:
            return None
        x, w = scaled.node.inputs
        return NarrowProduct()(x, w, TransposedCopy()(w))

    def compute_epilogue(self, inputs, bias, activation, residual=None):
        x, w, wt = inputs
        if residual is None:
            # (the kernels check the rest; several rows: the product's first
            # path, without a call of its own)
            if x.shape[0] <= _linalg.DENSE_T_MAX_ROWS:
                out = _linalg.dense_t(x, wt, bias, _ACTIVATIONS[activation])
            elif bias is not None:
                out = _linalg.dense(x, w, bias if bias.ndim == 1 else bias.reshape(-1),
                                    _ACTIVATIONS[activation])
            else:
                out = None
            if out is not None:
                return out
        return self._DOT.compute_epilogue((x, w), bias, activation, residual)


class PackedProduct(Op):
    """``x @ w`` over x's last ``nk`` axes and a float32 weight w's first
    ``nk`` (a Dense layer, an attention block's projections), given also as
    ``kernels.linalg.pack_panels`` of w seen as a (k, n) matrix: an inference
    plan's frozen weights pack it once (TensorDot.lower puts this op in).
    With ``biased``, a fourth input is a bias shaped like w's free axes
    (an attention projection's (heads, size) bias, which the fused
    epilogue's per-channel bias cannot be), added in the kernel's tiles
    (``absorb_bias``, asked by ``Binary('add').lower``).

    BLAS packs w on every call, which for few rows costs as much as the
    multiply-adds, and splits such products poorly over threads; the
    packed kernel (include/cyback_packed_gemm.h) reads the panels as they
    are, splits the columns over the team and applies a bias, a residual
    and relu / relu6 in its registers. Products of more than MAX_ROWS rows,
    and CPUs without AVX2, keep BLAS (w is an input too). The sums run in
    another order than BLAS's: values differ in the last bits, the same on
    every call and for any thread count."""

    api = "dot"
    fresh_output = True
    epilogue_host = True
    #: the most rows it takes, and from how many rows on only with an inner
    #: axis of LONG_K or more, or with a bias, residual or activation to
    #: apply: a bare product is as fast through BLAS from there
    #: (benchmarks/bench_linalg.py, "packed" rows), but BLAS then leaves the
    #: tail to a pass of its own over the output (a Transformer block's
    #: 512-row products with their bias and residual: 1.05-1.09x the block)
    MAX_ROWS = _linalg.PACKED_MAX_ROWS
    SHORT_K_MAX_ROWS = 256
    LONG_K = 512

    def __init__(self, nk, biased=False):
        self.nk = nk
        self.biased = biased

    @staticmethod
    def replacing(dot, x, w):
        """``[PackedProduct(...)(x, w, PackPanels(...)(w))]`` for TensorDot
        ``dot`` of x and a weight w, when it is a product of x's trailing
        axes with w's leading ones in float32 of known sizes and the kernel
        runs here; else None."""
        nk = len(dot.ax)
        if x.dtype != "float32" or not _linalg.packed_available() or \
                dot.ax != tuple(range(x.ndim - nk, x.ndim)) or dot.ay != tuple(range(nk)) or \
                w.ndim <= nk or any(d is None for d in w.shape):
            return None
        return [PackedProduct(nk)(x, w, PackPanels(nk)(w))]

    def _dot(self, x):
        return TensorDot(tuple(range(x.ndim - self.nk, x.ndim)), tuple(range(self.nk)))

    def infer(self, x, w, packed, *bias):
        return self._dot(x).infer(x, w)

    def absorb_bias(self, inputs, b, ctx):
        """This product + b for a weight b shaped like w's free axes, when
        there are two or more of them (one is a per-channel bias, which the
        fused epilogue takes), as one biased product; else None."""
        if self.biased or len(inputs) != 3:
            return None
        x, w, packed = inputs
        if w.ndim - self.nk < 2 or b.shape != w.shape[self.nk:] or b.dtype != "float32":
            return None
        return PackedProduct(self.nk, biased=True)(x, w, packed, b)

    def _sizes(self, x, w, tail):
        """(k, n, output shape, rows) when the packed kernel takes this
        product (with a ``tail`` to apply or not), else None."""
        k = math.prod(w.shape[:self.nk])
        n = math.prod(w.shape[self.nk:])
        shape = x.shape[:x.ndim - self.nk] + w.shape[self.nk:]
        rows = math.prod(shape[:x.ndim - self.nk])
        if rows > self.MAX_ROWS or (rows > self.SHORT_K_MAX_ROWS and k < self.LONG_K and
                                    not tail) or x.dtype != np.float32:
            return None
        return k, n, shape, rows

    def _run(self, x, w, packed, bias=None, residual=None, act=0):
        sizes = self._sizes(x, w, bias is not None or residual is not None or act)
        if sizes is None:
            return None
        k, n, shape, rows = sizes
        if residual is not None:
            residual = residual.reshape(rows, n)
        out = _linalg.packed_product(x.reshape(rows, k), packed, n,
                                     None if bias is None else bias.reshape(-1), residual, act)
        return None if out is None else out.reshape(shape)

    def compute(self, x, w, packed, *bias):
        b = bias[0] if bias else None
        out = self._run(x, w, packed, b)
        if out is None:
            out = contract(x, w, self._dot(x).ax, self._dot(x).ay)
            if b is not None:
                out = out + b
        return (out,)

    def kernel_epilogue(self, bias_axis, activation, out, residual=False, exact=False):
        # a biased product has its bias: it takes a residual and relu / relu6
        if self.biased:
            return not exact and bias_axis is None and activation in (None, "relu", "relu6")
        return not exact and bias_axis == -1 and activation in (None, "relu", "relu6")

    def compute_epilogue(self, inputs, bias, activation, residual=None):
        x, w, packed = inputs[:3]
        if self.biased:
            bias = inputs[3]
        if bias is not None and bias.size != math.prod(w.shape[self.nk:]):
            return None
        return self._run(x, w, packed, bias, residual, _ACTIVATIONS[activation])

    def bind(self, inputs):
        """A plan step's direct call (Op.bind): the packed kernel's prepared
        call for this shape of x."""
        return self.bind_epilogue(inputs, None, None, None)

    def bind_epilogue(self, inputs, bias, activation, residual):
        """As Conv.bind_epilogue: ``(call, positions, False)`` over ``inputs
        + [bias, residual]`` (a biased product's bias is its fourth input),
        or None where compute_epilogue would not run the packed kernel."""
        x, w, packed = inputs[:3]
        bias_at = len(inputs)
        if self.biased:
            bias, bias_at = inputs[3], 3
        act = _ACTIVATIONS.get(activation)
        if act is None or (bias is not None and bias.size != math.prod(w.shape[self.nk:])) \
                or not _linalg.packed_available():
            return None
        sizes = self._sizes(x, w, bias is not None or residual is not None or act)
        if sizes is None or 0 in (sizes[0], sizes[3]) or 0 in x.shape:
            return None
        k, n, shape, rows = sizes
        call = _linalg.packed_product_call(x.shape, k, n, shape, bias is not None,
                                         residual is not None, act)
        return call, (0, 2, None if bias is None else bias_at,
                      None if residual is None else len(inputs) + 1), False

    def time_mapped(self, ins, variant):
        # x_t @ W over all steps: the same product of the (T, ...) stack
        return self if variant == [True] + [False] * (len(ins) - 1) else None


class PackPanels(Op):
    """``kernels.linalg.pack_panels`` of a weight w seen as a (k, n) matrix,
    k its first ``nk`` axes: PackedProduct's layout of w, which an inference
    plan's frozen prelude computes once."""

    api = "dot"

    def __init__(self, nk, biased=False):
        self.nk = nk
        self.biased = biased

    def infer(self, w):
        k = math.prod(w.shape[:self.nk])
        n = math.prod(w.shape[self.nk:])
        return [(((n + _linalg.PANEL - 1) // _linalg.PANEL, k, _linalg.PANEL), "float32")]

    def compute(self, w):
        k = math.prod(w.shape[:self.nk])
        return (_linalg.pack_panels(w.reshape(k, -1)),)


class TransposedCopy(Op):
    """``w.T`` of a 2-D w as a C-contiguous array: NarrowProduct's kernel read
    transposed, which an inference plan's frozen prelude computes once."""

    api = "transpose"

    def infer(self, w):
        return [((w.shape[1], w.shape[0]), w.dtype)]

    def compute(self, w):
        return (np.ascontiguousarray(np.transpose(w)),)


def contract(x, y, ax, ay, bias=None):
    """``np.tensordot(x, y, (ax, ay))`` (+ ``bias``, a vector along the last
    axis, only for ``(..., k) @ (k, n)``), with large float products on
    cyback's OpenMP GEMM. The operands are laid out as (free, contracted) and
    (contracted, free) matrices; a transposed layout stays a transposed view,
    which the kernel reads without copying."""
    if x.ndim == 2 and y.ndim == 2 and ax == (1,) and ay == (0,) and \
            2.0 * x.shape[0] * x.shape[1] * y.shape[1] < _runtime.parallel_min_work():
        out = np.dot(x, y)     # small dense products: no reshape bookkeeping
        if bias is not None:
            out += bias
        return out
    if len(ax) == 1 and ax[0] == x.ndim - 1 and ay == (0,) and y.ndim == 2:
        # Dense layers: (..., k) @ (k, n).
        a, b = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), y
        shape = x.shape[:-1] + y.shape[1:]
    else:
        fx, fy = _free(x.ndim, ax), _free(y.ndim, ay)
        free_x = tuple(x.shape[i] for i in fx)
        free_y = tuple(y.shape[i] for i in fy)
        k = math.prod(x.shape[i] for i in ax)
        a = np.transpose(x, fx + list(ax)).reshape(math.prod(free_x), k)
        b = np.transpose(y, list(ay) + fy).reshape(k, math.prod(free_y))
        shape = free_x + free_y
    if 2.0 * a.shape[0] * a.shape[1] * b.shape[1] < _runtime.parallel_min_work() or \
            a.dtype != b.dtype or a.dtype.char not in "fd":
        out = np.dot(a, b)
        if bias is not None:
            out += bias
        return out.reshape(shape)
    out = _linalg.small_k_product(a, b, bias)
    if out is None:
        out = _linalg.matmul(a, b, bias)
    return out.reshape(shape)


def dot(x, y):
    x, y = as_tensor(x), as_tensor(y)
    out = maybe_sparse_dot(x, y)
    if out is not None:
        return out
    if x.ndim == 0 or y.ndim == 0:
        return ew.multiply(x, y)
    ay = 0 if y.ndim == 1 else y.ndim - 2
    x, y = _common_float(x, y)
    return TensorDot((x.ndim - 1,), (ay,))(x, y)


def _common_float(x, y):
    dtype = ew.result_dtype(x.dtype, y.dtype)
    return ew.cast(x, dtype), ew.cast(y, dtype)


class BatchTensorDot(Op):
    """Contraction with axis 0 as a batch axis: (B, fx..., fy...)."""

    api = "batch_dot"

    def __init__(self, ax, ay):
        self.ax = ax
        self.ay = ay

    def infer(self, x, y):
        _check_contracted(self.api, x, y, self.ax, self.ay)
        b = x.shape[0] if x.shape[0] is not None else y.shape[0]
        if None not in (x.shape[0], y.shape[0]) and x.shape[0] != y.shape[0]:
            raise ValueError("batch_dot: batch sizes differ: %s and %s" % (x.shape, y.shape))
        shape = (b,) + tuple(x.shape[i] for i in _free(x.ndim, self.ax, 1)) + \
            tuple(y.shape[i] for i in _free(y.ndim, self.ay, 1))
        return [(shape, ew.result_dtype(x.dtype, y.dtype))]

    def compute(self, x, y):
        key = (self.ax, self.ay, x.shape, y.shape)
        layout = _batch_layouts.get(key)
        if layout is None:
            layout = _batch_layout(self.ax, self.ay, x.shape, y.shape)
        perm_a, perm_b, a_shape, b_shape, out_shape = layout
        # the identity permutation (an attention's (B, T, K) @ (B, K, S)) is skipped:
        # at batch 1 the transposes cost as much as the product
        a = (x if perm_a is None else np.transpose(x, perm_a)).reshape(a_shape)
        b = (y if perm_b is None else np.transpose(y, perm_b)).reshape(b_shape)
        if a.dtype == b.dtype and (a.dtype == np.float32 or a.dtype == np.float64):
            out = _linalg.batch_gemm(a, b)
        else:
            out = np.matmul(a, b)
        return (out.reshape(out_shape),)

    def grad(self, inputs, outputs, grads):
        x, y = inputs
        g = grads[0]
        fx, fy = _free(x.ndim, self.ax, 1), _free(y.ndim, self.ay, 1)
        g_fx = tuple(range(1, 1 + len(fx)))
        g_fy = tuple(range(1 + len(fx), 1 + len(fx) + len(fy)))
        dx = BatchTensorDot(g_fy, tuple(fy))(g, y)
        dx = transpose(dx, _grad_perm([0] + fx, self.ax))
        dy = BatchTensorDot(tuple(fx), g_fx)(x, g)
        dy = transpose(dy, _grad_perm([0] + list(self.ay), fy))
        return [dx, dy]


# (ax, ay, x shape, y shape) -> what BatchTensorDot.compute needs, worked out once
_batch_layouts = {}


def _batch_layout(ax, ay, xshape, yshape):
    """BatchTensorDot's transposes and shapes for these run-time shapes:
    (x's permutation or None, y's or None, (nb, m, k), (nb, k, n), the output
    shape); remembered."""
    if xshape[0] != yshape[0]:
        raise ValueError("batch_dot: batch sizes differ: %s and %s" % (xshape, yshape))
    fx, fy = _free(len(xshape), ax, 1), _free(len(yshape), ay, 1)
    nb = xshape[0]
    xs = [xshape[i] for i in fx]
    ys = [yshape[i] for i in fy]
    m, n = int(np.prod(xs)), int(np.prod(ys))
    k = int(np.prod([xshape[i] for i in ax]))
    perm_a, perm_b = [0] + fx + list(ax), [0] + list(ay) + fy
    layout = (None if perm_a == sorted(perm_a) else perm_a,
              None if perm_b == sorted(perm_b) else perm_b,
              (nb, m, k), (nb, k, n), tuple([nb] + xs + ys))
    if len(_batch_layouts) >= 256:
        _batch_layouts.clear()
    _batch_layouts[(ax, ay, xshape, yshape)] = layout
    return layout


def batch_dot(x, y, axes=None):
    x, y = as_tensor(x), as_tensor(y)
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError("batch_dot: both tensors need rank >= 2 (a batch axis and at least one "
                         "more), got shapes %s and %s" % (x.shape, y.shape))
    if axes is None:
        axes = (x.ndim - 1, y.ndim - 1 if y.ndim == 2 else y.ndim - 2)
    elif isinstance(axes, (int, np.integer)):
        axes = (int(axes), int(axes))
    axes = list(axes)
    if len(axes) != 2:
        raise ValueError("batch_dot: axes must be an int or a pair of ints, got %r" % (axes,))
    ax, ay = [int(a[0]) if isinstance(a, (list, tuple)) else int(a) for a in axes]
    ax = ax % x.ndim if -x.ndim <= ax < x.ndim else None
    ay = ay % y.ndim if -y.ndim <= ay < y.ndim else None
    if ax in (None, 0) or ay in (None, 0):
        raise ValueError("batch_dot: axes %r must name non-batch axes of shapes %s and %s"
                         % (axes, x.shape, y.shape))
    x, y = _common_float(x, y)
    out = BatchTensorDot((ax,), (ay,))(x, y)
    if out.ndim == 1:
        out = reshape_static_dims(out, (1,), 2)
    return out
