"""Pooling ops (max and average, 1 to 3 spatial axes) and their gradients.

    Pool(x)                 -> y
    PoolGrad(x, y, dy)      -> dx   (max: routes dy to each window's first max)
    PoolGrad(x, dy)         -> dx   (avg: spreads dy over each window's real cells)
    MaxPoolGather(x, y, g)  -> the adjoint of max PoolGrad: g read at each
                               window's first max

PoolGrad is linear in dy, and its adjoint is an average pool (avg) or
MaxPoolGather (max), so second derivatives through pooling work. The routing
itself is piecewise constant in x, so it contributes no gradient of x.

'same' pads as TensorFlow does; padded cells never win a max and do not count
in an average (the kernels skip them).
"""
import functools

import numpy as np

from cyback.graph.op import Op
from cyback.graph.shapes import format_shape
from cyback.kernels import conv_utils, qgemm
from cyback.kernels import pool as _pool
from cyback.ops.manip import spatial_zero_padding
from cyback.ops.nn import Relu


class _PoolBase(Op):
    #: pads taken in from a zero padding before a max pool (Pool.rewrite):
    #: one (before, after) pair per spatial axis, added to ``padding``'s own;
    #: None without (and in the state of older pickles)
    extra_pads = None

    def __init__(self, api, pool_size, strides, padding, channels_last, mode, extra_pads=None):
        self.api = api
        self.pool_size = tuple(pool_size)
        self.strides = tuple(strides)
        self.padding = padding
        self.channels_last = bool(channels_last)
        self.mode = mode
        self.extra_pads = None if extra_pads is None else \
            tuple((int(b), int(a)) for b, a in extra_pads)

    def _params(self):
        return (self.api, self.pool_size, self.strides, self.padding, self.channels_last,
                self.mode, self.extra_pads)

    def spatial(self, shape):
        return tuple(shape[1:-1]) if self.channels_last else tuple(shape[2:])

    def _padded(self, sizes):
        # the spatial sizes with the extra pads in (what ``padding`` applies to)
        if self.extra_pads is None:
            return sizes
        return tuple(None if n is None else n + b + a for n, (b, a) in zip(sizes, self.extra_pads))

    def out_shape(self, shape):
        sizes = self.spatial(shape)
        out = []
        for n, k, s in zip(self._padded(sizes), self.pool_size, self.strides):
            if n is not None and self.padding == "valid" and n < k:
                raise ValueError("%s: pool_size %s is larger than the input's spatial shape %s "
                                 "with padding='valid' (input %s)"
                                 % (self.api, self.pool_size, format_shape(sizes),
                                    format_shape(shape)))
            out.append(conv_utils.conv_output_length(n, k, s, 1, self.padding))
        if self.channels_last:
            return (shape[0],) + tuple(out) + (shape[-1],)
        return (shape[0], shape[1]) + tuple(out)

    def pads(self, shape):
        own = tuple(conv_utils.conv_pads(n, k, s, 1, self.padding)
                    for n, k, s in zip(self._padded(self.spatial(shape)), self.windows(shape),
                                       self.strides))
        if self.extra_pads is None:
            return own
        return tuple((b + b0, a + a0) for (b, a), (b0, a0) in zip(own, self.extra_pads))

    def windows(self, shape):
        """The pool size the kernels get for an input of ``shape``: with
        'same' padding, a window wider than ``(out - 1) * stride + size``
        covers the whole axis at every output, as does that width itself
        (same parity, so the padding shrinks evenly on both sides): the
        results are the same, and the kernels need not step through a window
        of a billion cells, nearly all padding."""
        if self.padding != "same":
            return self.pool_size
        out = []
        for n, k, s in zip(self._padded(self.spatial(shape)), self.pool_size, self.strides):
            whole = (conv_utils.conv_output_length(n, k, s, 1, "same") - 1) * s + n
            out.append(k if k <= whole else whole + (k - whole) % 2)
        return tuple(out)


def _non_negative(made):
    """Whether the step ``made`` = (op, inputs) (or None: a leaf) gives
    values >= 0 only: a relu with no negative slope nor threshold."""
    if made is None or not isinstance(made[0], Relu):
        return False
    op = made[0]
    return op.alpha == 0 and op.threshold >= 0 and (op.max_value is None or op.max_value >= 0)


def _work(a):
    """Float16 widened to float32; read-only or strided arrays copied."""
    work = np.float32 if a.dtype == np.float16 else a.dtype
    if a.dtype != work or not a.flags.c_contiguous or not a.flags.writeable:
        return np.array(a, dtype=work, order="C")
    return a


def _subsample(x, index, avg):
    """The pooling of one-cell windows: x's cells at ``index``, in a new
    array (None for an array of another rank: a bound step's decline). The
    average adds the cell to +0.0 and divides by one, as the kernel does (so
    -0.0 gives +0.0); the max copies it."""
    if np.ndim(x) != len(index):
        return None
    cells = x[index]
    return np.add(cells, x.dtype.type(0)) if avg else np.array(cells, order="C")


# (op parameters, input shape, dtype) -> the kernel's prepared call: a
# batch-1 pooling is over before its checks would be. Kept here, not on the
# op, whose attributes are its identity for CSE and pickling.
_CALLS = {}


class Pool(_PoolBase):
    def infer(self, x):
        return [(self.out_shape(x.shape), x.dtype)]

    def codes_wanted(self, position, ctx=None, outputs=None):
        # a max commutes with a monotone quantization: an int8 plan may pool
        # the uint8 codes its readers want (``share``)
        if self.mode != "max" or position != 0 or ctx is None:
            return None
        return ctx.codes_all_want(outputs[0])

    def share(self, inputs, ctx):
        if self.mode != "max" or not ctx.inference:
            return None
        return ctx.codes_through(self, inputs)

    def rewrite(self, inputs, ctx):
        """In an inference plan, a zero padding of a relu's output before a
        max pool (Keras's ZeroPadding before ResNet50's and DenseNet's first
        pool) goes into the pool's own pads: the kernels skip padded cells,
        which gives the same maxima where the real cells are >= 0 and every
        window holds one, and the padded copy costs a pass over a large
        tensor."""
        # 'valid' only: with 'same' the pads of both together could reach
        # the window, past what the kernels take
        if not ctx.inference or self.mode != "max" or self.padding != "valid" or \
                self.extra_pads is not None:
            return None
        made = ctx.producer(inputs[0])
        spatial = spatial_zero_padding(made, self.channels_last, len(self.pool_size))
        if spatial is None or any(b >= k or a >= k for (b, a), k in zip(spatial, self.pool_size)):
            return None
        if not _non_negative(ctx.producer(made[1][0])):
            return None
        return [Pool(self.api, self.pool_size, self.strides, self.padding, self.channels_last,
                     self.mode, spatial)(made[1][0])]

    def compute(self, x):
        if x.dtype == np.uint8 and self.mode == "max":
            return (self._max_of_codes(x),)
        if self._subsamples(x):
            return (_subsample(x, self._steps(x.ndim), self.mode == "avg"),)
        key = (self._params(), x.shape, x.dtype)
        call = _CALLS.get(key)
        if call is not None:
            return (call(x),)
        shape = self.out_shape(x.shape)
        if x.size == 0 or 0 in shape:
            return (np.zeros(shape, x.dtype),)
        if x.dtype.char in "fd":
            if len(_CALLS) >= 256:
                _CALLS.clear()
            call = _pool.forward_call(x.shape, self.windows(x.shape), self.strides,
                                      self.pads(x.shape), self.channels_last, self.mode, x.dtype)
            _CALLS[key] = call
            return (call(x),)
        y = _pool.pool_forward(_work(x), self.windows(x.shape), self.strides, self.pads(x.shape),
                               self.channels_last, self.mode)
        return (y.astype(x.dtype, copy=False),)

    def _subsamples(self, x):
        # a window of one cell (NASNet's strided 1x1 average pools) takes
        # every stride-th cell: no padding either way, no kernel needed
        return all(k == 1 for k in self.pool_size) and x.dtype.char in "fd"

    def _steps(self, ndim):
        # the index taking every stride-th cell of each spatial axis
        steps = tuple(slice(None, None, s) for s in self.strides)
        if self.channels_last:
            return (slice(None),) + steps + (slice(None),) * (ndim - 1 - len(steps))
        return (slice(None),) * (ndim - len(steps)) + steps

    def bind(self, inputs):
        """A plan step's direct call (Op.bind): the kernel's prepared call
        for this window and input shape."""
        x = inputs[0]
        if x.dtype == np.uint8:
            return None
        if self._subsamples(x):
            return functools.partial(_subsample, index=self._steps(x.ndim),
                                     avg=self.mode == "avg"), (0,), False
        call = _CALLS.get((self._params(), x.shape, x.dtype))
        return None if call is None else (call, (0,), False)

    def _max_of_codes(self, x):
        """The max pool of uint8 codes: a kernel for channels_last 2-D, else
        NumPy, where padding takes code 0, the smallest, which never wins
        over a window's real cells."""
        axes = range(1, x.ndim - 1) if self.channels_last else range(2, x.ndim)
        shape = self.out_shape(x.shape)
        if x.size == 0 or 0 in shape:
            return np.zeros(shape, x.dtype)
        if self.channels_last and x.ndim == 4:
            return qgemm.max_pool(x, self.windows(x.shape), self.strides, self.pads(x.shape))
        widths = [(0, 0)] * x.ndim
        for a, p in zip(axes, self.pads(x.shape)):
            widths[a] = p
        xp = np.pad(x, widths)
        y = None
        for offsets in np.ndindex(*self.windows(x.shape)):
            index = [slice(None)] * x.ndim
            for a, o, s in zip(axes, offsets, self.strides):
                index[a] = slice(o, o + (shape[a] - 1) * s + 1, s)
            v = xp[tuple(index)]
            y = v.copy() if y is None else np.maximum(y, v, out=y)
        return y

    def grad(self, inputs, outputs, grads):
        x, y, g = inputs[0], outputs[0], grads[0]
        op = PoolGrad(*self._params())
        return [op(x, y, g) if self.mode == "max" else op(x, g)]


class PoolGrad(_PoolBase):
    def infer(self, x, *rest):
        return [(x.shape, rest[-1].dtype)]

    def compute(self, x, *rest):
        dy = rest[-1]
        y = rest[0] if self.mode == "max" else None
        if x.size == 0 or dy.size == 0:
            return (np.zeros(x.shape, dy.dtype),)
        dt = dy.dtype
        dx = _pool.pool_backward(_work(x), None if y is None else _work(y), _work(dy),
                                 self.windows(x.shape), self.strides, self.pads(x.shape),
                                 self.channels_last, self.mode)
        return (dx.astype(dt, copy=False),)

    def grad(self, inputs, outputs, grads):
        g = grads[0]
        if self.mode == "max":
            x, y, _ = inputs
            return [None, None, MaxPoolGather(*self._params())(x, y, g)]
        return [None, Pool(*self._params())(g)]


class MaxPoolGather(_PoolBase):
    """out[window] = g at the window's first cell (in D, H, W order) equal to
    the window's max: the same cell that PoolGrad routes to. Only second
    derivatives use it, so it is plain NumPy."""

    def infer(self, x, y, g):
        return [(y.shape, g.dtype)]

    def compute(self, x, y, g):
        if y.size == 0:
            return (np.zeros(y.shape, g.dtype),)
        nd = x.ndim - 2
        pw = ((0, 0), (0, 0)) + self.pads(x.shape)
        sizes = self.windows(x.shape)
        if self.channels_last:
            x, y, g = (np.moveaxis(a, -1, 1) for a in (x, y, g))
        # NaN padding equals nothing, so a padded cell is never picked.
        xp = np.pad(x.astype(np.float64), pw, constant_values=np.nan)
        gp = np.pad(g, pw)
        out = y.shape[2:]
        xw, gw = (self._windows(a, nd, out, sizes) for a in (xp, gp))
        first = np.argmax(xw == y[..., None], axis=-1)
        r = np.take_along_axis(gw, first[..., None], axis=-1)[..., 0]
        if self.channels_last:
            r = np.moveaxis(r, 1, -1)
        return (np.ascontiguousarray(r, dtype=g.dtype),)

    def _windows(self, a, nd, out, sizes):
        axes = tuple(range(2, 2 + nd))
        w = np.lib.stride_tricks.sliding_window_view(a, sizes, axis=axes)
        index = (slice(None), slice(None)) + tuple(
            slice(0, (o - 1) * s + 1, s) for o, s in zip(out, self.strides))
        w = w[index]
        return w.reshape(w.shape[:2 + nd] + (-1,))

    def grad(self, inputs, outputs, grads):
        x, y, _ = inputs
        return [None, None, PoolGrad(*self._params())(x, y, grads[0])]


def pool(api, x, pool_size, strides, padding, channels_last, mode):
    return Pool(api, pool_size, strides, padding, channels_last, mode)(x)
