"""Shape-manipulation ops beyond reshape/transpose/indexing: gather, tile,
repeat, padding, reversal, slicing, squeezing, one-hot, arange and the linear
interpolation behind bilinear resizing.

Each op's gradient is written with its adjoint op (tile ↔ tile-sum, pad ↔
crop, gather ↔ scatter-add, interpolate ↔ its transpose), and each adjoint's
gradient is the forward op again, so second derivatives work.

Sizes that are only known at run time are None in static shapes; ops that
need a size at run time read it from their input arrays or from a shape
tensor (``shape.shape_of``), never from the static shape.
"""
import math

import numpy as np

from cyback.graph import limits
from cyback.graph.op import Op
from cyback.graph.shapes import format_shape
from cyback.graph.tensor import Constant
from cyback.ops import elementwise as ew
from cyback.ops.codes import Codes
from cyback.ops.shape import GetItem, reshape_like, reshape_static_dims, shape_of, static_entries


def _mul(a, b):
    if a == 0 or b == 0:
        return 0
    return None if a is None or b is None else a * b


# ------------------------------------------------------------------ gather

class Gather(Op):
    """``reference[indices]`` along axis 0 (an embedding lookup)."""

    api = "gather"

    def infer(self, ref, idx):
        return [(tuple(idx.shape) + tuple(ref.shape[1:]), ref.dtype)]

    def compute(self, ref, idx):
        try:
            # np.take checks the range itself (mode 'raise': -n <= i < n)
            return (np.take(ref, idx, axis=0),)
        except IndexError:
            n = ref.shape[0]
            bad = idx[(idx >= n) | (idx < -n)].ravel()[0]
            raise ValueError("gather: index %d is out of range for a reference of shape %s"
                             % (bad, ref.shape)) from None

    def share(self, inputs, ctx):
        # rows of a weight table gathered for int8 layers only (an embedding
        # before an int8 convolution or recurrent layer): the table's codes
        # are made once, with the frozen weights, and gathered
        ref, idx = inputs
        if not ctx.inference or not ctx.is_weight(ref):
            return None
        want = ctx.codes_all_want(ctx.outputs[0])
        if want is None:
            return None
        y = Gather()(Codes(*want)(ref), idx)
        ctx.codes[y] = (want, y)
        return [y]

    def grad(self, inputs, outputs, grads):
        ref, idx = inputs
        return [GatherGrad()(grads[0], idx, shape_of(ref)), None]


class GatherGrad(Op):
    """Zeros of the reference's shape with ``g`` summed in at each index."""

    api = "gather"

    def infer(self, g, idx, ref_shape):
        return [(static_entries(ref_shape), g.dtype)]

    def compute(self, g, idx, ref_shape):
        out = np.zeros(tuple(int(d) for d in ref_shape), dtype=g.dtype)
        np.add.at(out, idx, g)
        return (out,)

    def grad(self, inputs, outputs, grads):
        return [Gather()(grads[0], inputs[1]), None, None]


# ------------------------------------------------------------------ tile

class Tile(Op):
    """``np.tile(x, reps)`` with one repetition count per axis; ``reps`` is a
    static tuple (None where a count is symbolic, then given as a tensor)."""

    api = "tile"

    def __init__(self, reps):
        self.reps = reps

    def infer(self, x, *reps_tensor):
        return [(tuple(_mul(d, r) for d, r in zip(x.shape, self.reps)), x.dtype)]

    def compute(self, x, *reps_tensor):
        reps = tuple(int(r) for r in reps_tensor[0]) if reps_tensor else self.reps
        if any(r < 0 for r in reps):
            raise ValueError("tile: negative repetition count in %s" % (reps,))
        shape = [d * r for d, r in zip(x.shape, reps)]
        limits.check_shape("tile", shape, x.dtype)
        if 0 in shape:
            return (np.zeros(shape, x.dtype),)     # (np.tile repeats nothing r times)
        return (np.tile(x, reps),)

    def rewrite(self, inputs, ctx):
        # a fill tiled by static counts: a fill
        src = ew.as_fill(inputs[0], ctx)
        if src is None or len(inputs) > 1 or None in self.reps or \
                len(self.reps) != inputs[0].ndim:
            return None
        fill, like = src
        dims = fill.dims_of(like.ndim)
        return [ew.Fill(fill.value, fill.dtype,
                        tuple((a, f * r) for (a, f), r in zip(dims, self.reps)))(like)]

    def grad(self, inputs, outputs, grads):
        x = inputs[0]
        return [TileSum(self.reps)(grads[0], shape_of(x), *inputs[1:])] + \
            [None] * (len(inputs) - 1)


class TileSum(Op):
    """The adjoint of Tile: the sum of the tiled copies of ``g``."""

    api = "tile"

    def __init__(self, reps):
        self.reps = reps

    def infer(self, g, x_shape, *reps_tensor):
        return [(static_entries(x_shape), g.dtype)]

    def compute(self, g, x_shape, *reps_tensor):
        reps = tuple(int(r) for r in reps_tensor[0]) if reps_tensor else self.reps
        dims = tuple(int(d) for d in x_shape)
        split = []
        for r, d in zip(reps, dims):
            split.extend((r, d))
        out = g.reshape(split).sum(axis=tuple(range(0, 2 * len(dims), 2)))
        return (np.asarray(out, dtype=g.dtype).reshape(dims),)

    def grad(self, inputs, outputs, grads):
        return [Tile(self.reps)(grads[0], *inputs[2:]), None] + [None] * (len(inputs) - 2)


# ------------------------------------------------------------------ repeat

class RepeatElements(Op):
    """``np.repeat(x, rep, axis)``."""

    api = "repeat_elements"

    def __init__(self, rep, axis):
        self.rep = rep
        self.axis = axis

    def infer(self, x):
        shape = list(x.shape)
        shape[self.axis] = _mul(shape[self.axis], self.rep)
        return [(tuple(shape), x.dtype)]

    def compute(self, x):
        shape = list(x.shape)
        shape[self.axis] *= self.rep
        limits.check_shape(self.api, shape, x.dtype)
        if 0 in shape:
            # NumPy steps through every repetition even of nothing
            return (np.zeros(shape, x.dtype),)
        return (np.repeat(x, self.rep, axis=self.axis),)

    def grad(self, inputs, outputs, grads):
        return [RepeatSum(self.rep, self.axis)(grads[0])]


class RepeatSum(Op):
    """The adjoint of RepeatElements: sums each run of ``rep`` entries."""

    api = "repeat_elements"

    def __init__(self, rep, axis):
        self.rep = rep
        self.axis = axis

    def infer(self, g):
        shape = list(g.shape)
        d = shape[self.axis]
        shape[self.axis] = None if d is None else d // self.rep
        return [(tuple(shape), g.dtype)]

    def compute(self, g):
        a = self.axis
        n = g.shape[a] // self.rep
        split = g.shape[:a] + (n, self.rep) + g.shape[a + 1:]
        return (g.reshape(split).sum(axis=a + 1, dtype=g.dtype),)

    def grad(self, inputs, outputs, grads):
        return [RepeatElements(self.rep, self.axis)(grads[0])]


# ------------------------------------------------------------------ linear interpolation

def _lerp_weights(factor, dtype, ndim, axis):
    # Output row y*factor + k samples input row y + k/factor (TensorFlow's
    # resize_bilinear with align_corners=False, half_pixel_centers=False).
    shape = [1] * (ndim + 1)
    shape[axis + 1] = factor
    return (np.arange(factor, dtype=dtype) / np.asarray(factor, dtype=dtype)).reshape(shape)


def _half_pixel_taps(n, factor, dtype, ndim, axis):
    """Source rows and weights of TF 2's bilinear resize (half-pixel centres):
    output row o samples input coordinate (o + 0.5) / factor - 0.5, clamped
    to [0, n - 1]. Returns (lo, hi, t) with t shaped to broadcast on ``axis``."""
    c = np.maximum((np.arange(n * factor) + 0.5) / factor - 0.5, 0.0)
    lo = np.floor(c).astype(np.intp)
    hi = np.minimum(lo + 1, n - 1)
    shape = [1] * ndim
    shape[axis] = n * factor
    return lo, hi, (c - lo).astype(dtype).reshape(shape)


class Interp1D(Op):
    """Upsample axis ``axis`` by the integer ``factor`` with linear interpolation,
    clamping at the last row. ``half_pixel`` samples at pixel centres as TF 2's
    tf.image.resize does; otherwise as TF 1's resize_bilinear (Keras 2.3.1)."""

    api = "resize_images"

    def __init__(self, factor, axis, half_pixel=False):
        self.factor = factor
        self.axis = axis
        self.half_pixel = half_pixel

    def infer(self, x):
        shape = list(x.shape)
        shape[self.axis] = _mul(shape[self.axis], self.factor)
        return [(tuple(shape), x.dtype)]

    def compute(self, x):
        a, f = self.axis, self.factor
        out_shape = list(x.shape)
        out_shape[a] *= f
        limits.check_shape(self.api, out_shape, x.dtype)
        if 0 in out_shape:
            return (np.zeros(out_shape, dtype=x.dtype),)
        if self.half_pixel:
            lo, hi, t = _half_pixel_taps(x.shape[a], f, x.dtype, x.ndim, a)
            below = np.take(x, lo, axis=a)
            out = below + (np.take(x, hi, axis=a) - below) * t
            return (np.ascontiguousarray(out, dtype=x.dtype),)
        nxt = np.concatenate([np.take(x, np.arange(1, x.shape[a]), axis=a),
                              np.take(x, [-1], axis=a)], axis=a)
        lo = np.expand_dims(x, a + 1)
        hi = np.expand_dims(nxt, a + 1)
        t = _lerp_weights(f, x.dtype, x.ndim, a)
        out = lo + (hi - lo) * t
        return (np.ascontiguousarray(out.reshape(out_shape), dtype=x.dtype),)

    def grad(self, inputs, outputs, grads):
        return [Interp1DGrad(self.factor, self.axis, self.half_pixel)(grads[0])]


class Interp1DGrad(Op):
    """The transpose of Interp1D."""

    api = "resize_images"

    def __init__(self, factor, axis, half_pixel=False):
        self.factor = factor
        self.axis = axis
        self.half_pixel = half_pixel

    def infer(self, g):
        shape = list(g.shape)
        d = shape[self.axis]
        shape[self.axis] = None if d is None else d // self.factor
        return [(tuple(shape), g.dtype)]

    def compute(self, g):
        a, f = self.axis, self.factor
        n = g.shape[a] // f
        if self.half_pixel and n:
            lo, hi, t = _half_pixel_taps(n, f, g.dtype, g.ndim, a)
            out = np.zeros(g.shape[:a] + (n,) + g.shape[a + 1:], dtype=g.dtype)
            dest = np.moveaxis(out, a, 0)   # a view: the sums land in out
            to_hi = g * t
            np.add.at(dest, lo, np.moveaxis(g - to_hi, a, 0))
            np.add.at(dest, hi, np.moveaxis(to_hi, a, 0))
            return (out,)
        g = g.reshape(g.shape[:a] + (n, f) + g.shape[a + 1:])
        t = _lerp_weights(f, g.dtype, g.ndim - 1, a)
        to_hi = (g * t).sum(axis=a + 1, dtype=g.dtype)
        out = g.sum(axis=a + 1, dtype=g.dtype) - to_hi
        if n == 0:
            return (out,)
        # Row y's "next" row is y + 1, except the last row, which is its own.
        head = [slice(None)] * out.ndim
        tail = list(head)
        head[a], tail[a] = slice(1, None), slice(None, -1)
        out[tuple(head)] += to_hi[tuple(tail)]
        last = list(head)
        last[a] = slice(n - 1, n)
        out[tuple(last)] += to_hi[tuple(last)]
        return (out,)

    def grad(self, inputs, outputs, grads):
        return [Interp1D(self.factor, self.axis, self.half_pixel)(grads[0])]


# ------------------------------------------------------------------ padding

class Pad(Op):
    """Zero padding by static ``(before, after)`` amounts per axis."""

    def __init__(self, pads, api="pad"):
        self.pads = pads
        self.api = api

    def infer(self, x):
        shape = tuple(None if d is None else d + b + a for d, (b, a) in zip(x.shape, self.pads))
        return [(shape, x.dtype)]

    def codes_wanted(self, position, ctx=None, outputs=None):
        # zeros are the codes of 0.0 where the zero point is 0 (a relu's
        # output): an int8 plan may pad the uint8 codes its readers want
        want = ctx.codes_all_want(outputs[0]) if ctx is not None else None
        return want if want is not None and want[1] == 0 else None

    def share(self, inputs, ctx):
        return ctx.codes_through(self, inputs) if ctx.inference else None

    def compute(self, x):
        shape = tuple(d + b + a for d, (b, a) in zip(x.shape, self.pads))
        limits.check_shape(self.api, shape, x.dtype)
        # only the border is zeroed: np.zeros would write the whole array
        # once more before x is copied in (NASNet's pads of 12 MB at batch 8)
        out = np.empty(shape, dtype=x.dtype)
        for axis, (d, (b, a)) in enumerate(zip(x.shape, self.pads)):
            lead = (slice(None),) * axis
            if b:
                out[lead + (slice(0, b),)] = 0
            if a:
                out[lead + (slice(b + d, None),)] = 0
        out[tuple(slice(b, b + d) for d, (b, a) in zip(x.shape, self.pads))] = x
        return (out,)

    def grad(self, inputs, outputs, grads):
        spec = tuple(("slice", b, -a if a else None, None) for b, a in self.pads)
        return [GetItem(spec)(grads[0])]


def spatial_zero_padding(made, channels_last, rank):
    """The (before, after) pads of the ``rank`` spatial axes when the step
    ``made`` = (op, inputs) (or None) is a zero padding of those axes only
    (none of the batch or channel axis, none negative), else None: what an
    inference plan's rewrites take into a convolution's or pool's own pads."""
    if made is None or not isinstance(made[0], Pad) or len(made[1]) != 1:
        return None
    pads = made[0].pads
    channel = len(pads) - 1 if channels_last else 1
    spatial = pads[1:-1] if channels_last else pads[2:]
    if pads[0] != (0, 0) or pads[channel] != (0, 0) or len(spatial) != rank or \
            any(b < 0 or a < 0 for b, a in spatial):
        return None
    return tuple(spatial)


# ------------------------------------------------------------------ reverse

class Reverse(Op):
    api = "reverse"

    def __init__(self, axes):
        self.axes = axes

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        return (np.flip(x, self.axes),)

    def grad(self, inputs, outputs, grads):
        return [Reverse(self.axes)(grads[0])]


# ------------------------------------------------------------------ squeeze

class Squeeze(Op):
    api = "squeeze"

    def __init__(self, axis):
        self.axis = axis

    def infer(self, x):
        return [(x.shape[:self.axis] + x.shape[self.axis + 1:], x.dtype)]

    def compute(self, x):
        if x.shape[self.axis] != 1:
            raise ValueError("squeeze: cannot squeeze axis %d of a tensor of shape %s: its "
                             "size is not 1" % (self.axis, x.shape))
        return (np.squeeze(x, self.axis),)

    def grad(self, inputs, outputs, grads):
        return [reshape_static_dims(grads[0], (self.axis,), inputs[0].ndim)]


# ------------------------------------------------------------------ batch_flatten

class BatchFlatten(Op):
    api = "batch_flatten"
    inline_in_plan = True

    def infer(self, x):
        rest = x.shape[1:]
        inner = int(np.prod(rest)) if all(d is not None for d in rest) else None
        if 0 in rest:
            inner = 0
        return [((x.shape[0], inner), x.dtype)]

    def compute(self, x):
        # Reshape with an explicit inner size: (0, -1) is ambiguous to NumPy.
        return (x.reshape(x.shape[0], math.prod(x.shape[1:])),)

    def inline_src(self, ins, outs, ns, args):
        ns["math_prod"] = math.prod
        return "%s.reshape(%s.shape[0], math_prod(%s.shape[1:]))" % (args[0], args[0],
                                                                     args[0]), None, False

    def grad(self, inputs, outputs, grads):
        return [reshape_like(grads[0], inputs[0])]


# ------------------------------------------------------------------ slice

class Slice(Op):
    """``x[start:start + size]`` per axis (TensorFlow's ``tf.slice``: size -1
    runs to the end). ``start``/``size`` are static tuples with None where a
    value is symbolic; the symbolic ones come as 1-D tensors after ``x``."""

    api = "slice"

    def __init__(self, start, size, n_tensors):
        self.start = start
        self.size = size
        self.n_tensors = n_tensors  # (has start tensor, has size tensor)

    def _static_shape(self, x_shape):
        shape = []
        for i, (d, b, s) in enumerate(zip(x_shape, self.start, self.size)):
            if s is not None and s != -1:
                out = s
            elif s == -1 and b is not None and d is not None:
                out = d - b
            else:
                out = None
            if d is not None and b is not None and (b > d or (out is not None and b + out > d)):
                raise ValueError("slice: start %s and size %s are out of range on axis %d of a "
                                 "tensor of shape %s" % (format_shape(self.start),
                                                         format_shape(self.size), i,
                                                         format_shape(x_shape)))
            shape.append(out)
        return tuple(shape)

    def infer(self, x, *tensors):
        return [(self._static_shape(x.shape), x.dtype)]

    def _bounds(self, shape, tensors):
        it = iter(tensors)
        start = [int(v) for v in next(it)] if self.n_tensors[0] else list(self.start)
        size = [int(v) for v in next(it)] if self.n_tensors[1] else list(self.size)
        index = []
        for i, (d, b, s) in enumerate(zip(shape, start, size)):
            e = d if s == -1 else b + s
            if b < 0 or s < -1 or b > d or e > d:
                raise ValueError("slice: start %s and size %s are out of range on axis %d of a "
                                 "tensor of shape %s" % (tuple(start), tuple(size), i,
                                                         tuple(shape)))
            index.append(slice(b, e))
        return tuple(index)

    def compute(self, x, *tensors):
        return (x[self._bounds(x.shape, tensors)],)

    def grad(self, inputs, outputs, grads):
        return [SliceGrad(self.start, self.size, self.n_tensors)(
            grads[0], shape_of(inputs[0]), *inputs[1:])] + [None] * (len(inputs) - 1)


class SliceGrad(Op):
    """Zeros of the sliced tensor's shape with ``g`` in the slice."""

    api = "slice"

    def __init__(self, start, size, n_tensors):
        self.start = start
        self.size = size
        self.n_tensors = n_tensors

    def infer(self, g, x_shape, *tensors):
        return [(static_entries(x_shape), g.dtype)]

    def compute(self, g, x_shape, *tensors):
        shape = tuple(int(d) for d in x_shape)
        out = np.zeros(shape, dtype=g.dtype)
        out[Slice(self.start, self.size, self.n_tensors)._bounds(shape, tensors)] = g
        return (out,)

    def grad(self, inputs, outputs, grads):
        return [Slice(self.start, self.size, self.n_tensors)(grads[0], *inputs[2:]), None] + \
            [None] * (len(inputs) - 2)


# ------------------------------------------------------------------ one_hot

class OneHot(Op):
    """float32 one-hot rows (TensorFlow's default dtype); an index outside
    [0, num_classes) gives a row of zeros, as in ``tf.one_hot``."""

    api = "one_hot"

    def __init__(self, num_classes):
        self.num_classes = num_classes

    def infer(self, idx):
        return [(tuple(idx.shape) + (self.num_classes,), "float32")]

    def compute(self, idx):
        # zeros, then a 1 where each index is in range: no array of the
        # result's size but the result itself
        c = self.num_classes
        limits.check_shape(self.api, idx.shape + (c,), "float32")
        out = np.zeros(idx.shape + (c,), dtype="float32")
        flat = out.reshape(-1, c)
        rows = idx.reshape(-1)
        hit = (rows >= 0) & (rows < c)
        flat[np.flatnonzero(hit), rows[hit].astype(np.intp)] = 1
        return (out,)


# ------------------------------------------------------------------ arange

class Arange(Op):
    """``arange(start, stop, step)`` of run-time scalars, cast to ``dtype``."""

    api = "arange"

    def __init__(self, dtype):
        self.dtype = dtype

    def infer(self, start, stop, step):
        # known bounds give the length (so that a long range of constants is
        # left for the run rather than computed while building)
        if all(type(t) is Constant for t in (start, stop, step)):
            n = arange_length(start.value.item(), stop.value.item(), step.value.item())
            return [((n,), self.dtype)]
        return [((None,), self.dtype)]

    def compute(self, start, stop, step):
        return (arange_values(start.item(), stop.item(), step.item(), self.dtype),)


def arange_length(start, stop, step):
    """How many values ``arange(start, stop, step)`` has (a Python int, exact
    for ints); a ValueError for a zero or NaN step or infinite bounds."""
    if step == 0 or step != step:
        raise ValueError("arange: step must be a non-zero number, got %r" % (step,))
    if any(isinstance(v, float) and not np.isfinite(v) for v in (start, stop, step)):
        raise ValueError("arange: start, stop and step must be finite, got %r, %r and %r"
                         % (start, stop, step))
    if all(isinstance(v, (int, np.integer)) for v in (start, stop, step)):
        n = -((int(start) - int(stop)) // int(step))
    else:
        n = np.ceil((stop - start) / step)
        if not np.isfinite(n):
            raise ValueError("arange: %r to %r by %r makes more values than an array can hold"
                             % (start, stop, step))
        n = int(n)
    return max(n, 0)


def arange_values(start, stop, step, dtype):
    limits.check_shape("arange", (arange_length(start, stop, step),), dtype)
    return np.arange(start, stop, step).astype(dtype)


class PatternBroadcast(Op):
    """Identity that checks at run time that the axes declared broadcastable
    have size 1 (Theano's patternbroadcast)."""

    api = "pattern_broadcast"

    def __init__(self, axes):
        self.axes = axes

    def infer(self, x):
        return [(tuple(1 if i in self.axes else d for i, d in enumerate(x.shape)), x.dtype)]

    def compute(self, x):
        for a in self.axes:
            if x.shape[a] != 1:
                raise ValueError("pattern_broadcast: axis %d is declared broadcastable but "
                                 "has size %d in a tensor of shape %s" % (a, x.shape[a],
                                                                          x.shape))
        return (x,)

    def grad(self, inputs, outputs, grads):
        return [grads[0]]
