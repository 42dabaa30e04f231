"""Shape ops: symbolic shapes, reshape, transpose, indexing, concatenation, fills.

A "shape argument" (for reshape, zeros, tile, random_* ...) may mix Python ints
and symbolic scalars (``K.shape(x)[0]``) or be a 1-D int tensor; ``shape_arg``
turns it into a static tuple (None where unknown) plus, when something is
symbolic, an int64 tensor holding the run-time value.
"""
import functools
import numbers

import numpy as np

from cyback.graph import limits
from cyback.graph.op import Op
from cyback.graph.shapes import format_shape
from cyback.graph.tensor import Constant, Tensor, as_tensor, is_int_dtype
from cyback.kernels import ewise as _ewise
from cyback.ops import elementwise as ew

# ------------------------------------------------------------------ shape of

class ShapeOf(Op):
    api = "shape"

    shape_only_inputs = (0,)

    def infer(self, x):
        return [((x.ndim,), "int32")]

    def compute(self, x):
        return (np.asarray(np.shape(x), dtype="int32"),)

    def simplify(self, inputs):
        x = inputs[0]
        if all(d is not None for d in x.shape):
            return [Constant(np.asarray(x.shape, dtype="int32"))]
        return None


def shape_of(x):
    return ShapeOf()(as_tensor(x))


def static_int(t):
    """The value of a scalar int tensor if it is known when building, else None."""
    if isinstance(t, (numbers.Integral, np.integer)):
        return int(t)
    if type(t) is Constant:
        return int(t.value) if t.value.ndim == 0 else None
    node = getattr(t, "node", None)
    if node is not None and isinstance(node.op, GetItem) and node.inputs[0].ndim == 1:
        spec = node.op.spec
        if len(spec) == 1 and spec[0][0] == "int" and not isinstance(spec[0][1], tuple):
            entries = static_entries(node.inputs[0])
            if entries is not None and -len(entries) <= spec[0][1] < len(entries):
                return entries[spec[0][1]]
        return None
    if node is not None and isinstance(node.op, ew.Cast):
        return static_int(node.inputs[0])
    if node is not None and isinstance(node.op, ew.Binary) and node.op.name in _STATIC_ARITH \
            and t.ndim == 0 and is_int_dtype(t.dtype):
        a, b = (static_int(x) if x.ndim == 0 else None for x in node.inputs)
        if a is not None and b is not None:
            return _STATIC_ARITH[node.op.name](a, b)
    if node is not None and t.ndim == 0 and is_int_dtype(t.dtype) and \
            hasattr(node.op, "static_value") and node.inputs[0].ndim == 1:
        # a reduction of known sizes (ops/reduction.py)
        entries = static_entries(node.inputs[0])
        if entries is not None and None not in entries:
            return node.op.static_value(entries)
    return None


# Size arithmetic that Keras code does on symbolic shapes (``K.shape(x)[1] * 2``).
_STATIC_ARITH = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b,
                 "multiply": lambda a, b: a * b,
                 "floor_divide": lambda a, b: a // b if b else None}


def static_entries(t):
    """The entries of a 1-D int tensor that are known when building, None for
    the others; None when even the length is unknown."""
    if type(t) is Constant:
        return tuple(int(v) for v in np.atleast_1d(t.value))
    if t.ndim != 1 or t.shape[0] is None:
        return None
    node = t.node
    op = node.op if node is not None else None
    found = None
    if isinstance(op, MakeShape):
        found = tuple(op.pattern)
    elif isinstance(op, ShapeOf):
        found = tuple(node.inputs[0].shape)
    elif isinstance(op, ew.Cast):
        found = static_entries(node.inputs[0])
    elif isinstance(op, Concatenate):
        parts = [static_entries(x) for x in node.inputs]
        if all(p is not None for p in parts):
            found = sum(parts, ())
    elif isinstance(op, ExpandTo) and node.inputs[0].ndim == 0:
        found = (static_int(node.inputs[0]),)
    elif isinstance(op, GetItem) and len(op.spec) == 1 and op.spec[0][0] == "slice" and \
            not any(isinstance(v, tuple) for v in op.spec[0][1:]):
        src = static_entries(node.inputs[0])
        if src is not None:
            found = tuple(src[slice(*op.spec[0][1:])])
    elif isinstance(op, ew.Binary) and op.name in _STATIC_ARITH and is_int_dtype(t.dtype):
        a, b = (static_entries(x) if x.ndim == 1 else
                (static_int(x),) * t.shape[0] if x.ndim == 0 else None for x in node.inputs)
        if a is not None and b is not None and len(a) == len(b) == t.shape[0]:
            found = tuple(None if u is None or v is None else _STATIC_ARITH[op.name](u, v)
                          for u, v in zip(a, b))
    if found is None or len(found) != t.shape[0]:
        return (None,) * t.shape[0]
    return found


class MakeShape(Op):
    """A 1-D int64 tensor from static ints and symbolic scalars (``None`` slots)."""

    api = "shape"

    def __init__(self, pattern):
        self.pattern = pattern

    def infer(self, *scalars):
        return [((len(self.pattern),), "int64")]

    def compute(self, *scalars):
        it = iter(scalars)
        return (np.asarray([int(next(it)) if p is None else p for p in self.pattern],
                           dtype="int64"),)


def shape_arg(api, shape):
    """``(static, tensor)``: static is a tuple of ints/None; tensor is None when
    every entry is known. Entries are integers (Python or NumPy ints, int
    tensors): bools and floats, even whole ones, are a TypeError."""
    if isinstance(shape, Tensor):
        if type(shape) is Constant:
            if not is_int_dtype(shape.dtype) or shape.ndim > 1:
                raise TypeError("%s: a shape must hold integers, got a constant of dtype %s "
                                "and shape %s" % (api, shape.dtype, format_shape(shape.shape)))
            return tuple(int(d) for d in np.atleast_1d(shape.value)), None
        if shape.ndim != 1 or shape.shape[0] is None or not is_int_dtype(shape.dtype):
            raise ValueError("%s: a shape tensor must be a 1-D int tensor of known length, "
                             "got %r" % (api, shape))
        static = static_entries(shape)
        if None not in static:
            return static, None
        return static, shape
    if isinstance(shape, (numbers.Integral, np.integer)) and \
            not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    if isinstance(shape, np.ndarray):
        if shape.dtype.kind not in "iu" or shape.ndim > 1:
            raise TypeError("%s: a shape must hold integers, got an array of dtype %s and "
                            "shape %s" % (api, shape.dtype, format_shape(shape.shape)))
        shape = shape.tolist()
    if not isinstance(shape, (list, tuple)):
        raise TypeError("%s: shape must be a tuple/list of ints or a 1-D int tensor, got %r"
                        % (api, shape))
    pattern, scalars = [], []
    for d in shape:
        if isinstance(d, Tensor) and not is_int_dtype(d.dtype):
            raise TypeError("%s: shape entries must be integers, got a %s tensor %r"
                            % (api, d.dtype, d))
        if isinstance(d, (bool, np.bool_, float, np.floating)):
            raise TypeError("%s: shape entries must be integers, got %r in %r"
                            % (api, d, tuple(shape)))
        known = static_int(d)
        if known is not None and not -2 ** 63 <= known < 2 ** 63:
            raise ValueError("%s: shape entry %d is out of the range of 64-bit ints"
                             % (api, known))
        if known is not None:
            pattern.append(known)
        elif isinstance(d, Tensor):
            if d.ndim != 0 and not (d.ndim == 1 and d.shape[0] == 1):
                raise ValueError("%s: shape entries must be scalars, got %r" % (api, d))
            pattern.append(None)
            scalars.append(d if d.ndim == 0 else GetItem((("int", 0),))(d))
        elif d is None:
            raise ValueError("%s: shape %r has an unknown (None) entry; use K.shape(x)[i] "
                             "for a size known only at run time" % (api, tuple(shape)))
        else:
            raise TypeError("%s: shape entries must be ints or scalar tensors, got %r"
                            % (api, d))
    if not scalars:
        return tuple(pattern), None
    return tuple(pattern), MakeShape(tuple(pattern))(*scalars)


def check_static_shape(api, shape):
    for d in shape:
        if d is not None and d < 0:
            raise ValueError("%s: negative dimension in shape %s" % (api, format_shape(shape)))


# ------------------------------------------------------------------ fills

class FillShape(Op):
    """``value`` in an array of a (possibly symbolic) shape."""

    api = "zeros"

    def __init__(self, value, dtype, static):
        self.value = value
        self.dtype = dtype
        self.static = static

    def infer(self, *shape_tensor):
        return [(self.static, self.dtype)]

    def compute(self, *shape_tensor):
        shape = tuple(int(d) for d in shape_tensor[0]) if shape_tensor else self.static
        limits.check_shape(self.api, shape, self.dtype)
        return (np.full(shape, self.value, dtype=self.dtype),)


def fill(api, shape, value, dtype):
    static, tensor = shape_arg(api, shape)
    check_static_shape(api, static)
    if tensor is None:
        limits.check_shape(api, static, dtype, "the array")
        if limits.foldable(static, dtype):
            return Constant(np.full(static, value, dtype=dtype))
        return FillShape(value, dtype, static)()     # made when a function runs
    return FillShape(value, dtype, static)(tensor)


def zeros_like(x, dtype=None):
    return ew.zeros_like_tensor(x, dtype)


# ------------------------------------------------------------------ reshape

def _resolve_reshape(api, in_shape, target, same=()):
    """Static output shape of a reshape, resolving one -1 when possible.

    ``same`` pairs (target position, input axis) where the target entry is the
    input's own run-time size on that axis (``K.shape(x)[0]``): such sizes
    cancel out, so ``(K.shape(x)[0], -1)`` of a (None, 4, 5) tensor is (None, 20).
    """
    if sum(1 for d in target if d == -1) > 1:
        raise ValueError("%s: at most one -1 allowed in shape %s" % (api, format_shape(target)))
    for d in target:
        if d is not None and d < -1:
            raise ValueError("%s: invalid dimension %d in shape %s"
                             % (api, d, format_shape(target)))
    if same and -1 in target:
        pos = {p for p, _ in same}
        axes = {a for _, a in same}
        in_rest = [d for i, d in enumerate(in_shape) if i not in axes]
        t_rest = [d for j, d in enumerate(target) if j not in pos and d != -1]
        if all(d is not None for d in in_rest + t_rest):
            n, r = int(np.prod(in_rest)), int(np.prod(t_rest))
            if r and n % r == 0:
                return tuple(n // r if d == -1 else d for d in target)
    known_in = all(d is not None for d in in_shape)
    size_in = int(np.prod(in_shape)) if known_in else None
    if -1 in target:
        rest = [d for d in target if d != -1]
        if known_in and all(d is not None for d in rest):
            r = int(np.prod(rest))
            if r == 0 or size_in % r:
                raise ValueError("%s: cannot reshape a tensor of shape %s into %s"
                                 % (api, format_shape(in_shape), format_shape(target)))
            return tuple(size_in // r if d == -1 else d for d in target)
        return tuple(None if d == -1 else d for d in target)
    if known_in and all(d is not None for d in target) and int(np.prod(target)) != size_in:
        raise ValueError("%s: cannot reshape a tensor of shape %s (%d elements) into %s"
                         % (api, format_shape(in_shape), size_in, format_shape(target)))
    return tuple(target)


class Reshape(Op):
    api = "reshape"

    def __init__(self, target, same=()):
        self.target = target   # static pattern (ints, -1 or None for symbolic)
        self.same = same       # see _resolve_reshape

    def infer(self, x, *shape_tensor):
        return [(_resolve_reshape("reshape", x.shape, self.target, self.same), x.dtype)]

    def compute(self, x, *shape_tensor):
        shape = tuple(int(d) for d in shape_tensor[0]) if shape_tensor else self.target
        if x.size == 0 and -1 in shape and self.same:
            # NumPy cannot size a -1 among zeros; the sizes that are x's own
            # (K.shape(x)[0] for an empty batch) cancel out, leaving a known size.
            shape = _resolve_reshape("reshape", x.shape, shape, self.same)
        try:
            return (np.reshape(x, shape),)
        except ValueError:
            raise ValueError("reshape: cannot reshape an array of shape %s into %s"
                             % (x.shape, shape)) from None

    def grad(self, inputs, outputs, grads):
        return [reshape_like(grads[0], inputs[0])] + [None] * (len(inputs) - 1)


class ReshapeLike(Op):
    api = "reshape"

    shape_only_inputs = (1,)

    def infer(self, x, like):
        return [(like.shape, x.dtype)]

    def compute(self, x, like):
        return (np.reshape(x, np.shape(like)),)

    def grad(self, inputs, outputs, grads):
        return [reshape_like(grads[0], inputs[0]), None]


def reshape_like(x, like):
    if x.shape == like.shape and all(d is not None for d in x.shape):
        return x
    if all(d is not None for d in like.shape):
        return Reshape(tuple(like.shape))(x)
    return ReshapeLike()(x, like)


def reshape(x, shape):
    x = as_tensor(x)
    static, tensor = shape_arg("reshape", shape)
    if tensor is None:
        if tuple(static) == x.shape and None not in x.shape:
            return x
        return Reshape(tuple(static))(x)
    # Symbolic entries become None in the pattern; -1 stays -1.
    same = ()
    if isinstance(shape, (list, tuple)):
        same = tuple((j, a) for j, a in enumerate(_own_dim(x, d) for d in shape) if a is not None)
    return Reshape(tuple(static), same)(x, tensor)


def _own_dim(x, d):
    """The axis i when ``d`` is ``shape(x)[i]`` for this very ``x``, else None."""
    node = getattr(d, "node", None)
    if node is None or not isinstance(node.op, GetItem) or len(node.op.spec) != 1 or \
            node.op.spec[0][0] != "int" or isinstance(node.op.spec[0][1], tuple):
        return None
    src = node.inputs[0].node
    if src is None or not isinstance(src.op, ShapeOf) or src.inputs[0] is not x:
        return None
    return node.op.spec[0][1] % x.ndim


def reshape_static_dims(t, axes, ndim):
    """Insert size-1 axes at ``axes`` so that ``t`` has rank ``ndim``."""
    pattern = []
    it = iter(range(t.ndim))
    for i in range(ndim):
        pattern.append(("new",) if i in axes else ("old", next(it)))
    return ExpandTo(tuple(pattern))(t)


class ExpandTo(Op):
    """Insert size-1 axes (pattern of ('old', i) / ('new',))."""

    api = "expand_dims"

    def __init__(self, pattern):
        self.pattern = pattern

    def infer(self, x):
        return [(tuple(1 if p[0] == "new" else x.shape[p[1]] for p in self.pattern), x.dtype)]

    def compute(self, x):
        index = tuple(None if p[0] == "new" else slice(None) for p in self.pattern)
        return (x[index],)

    def rewrite(self, inputs, ctx):
        # new axes of a fill: a fill
        src = ew.as_fill(inputs[0], ctx)
        if src is None:
            return None
        fill, like = src
        dims = fill.dims_of(like.ndim)
        return [ew.Fill(fill.value, fill.dtype,
                        tuple((None, 1) if p[0] == "new" else dims[p[1]]
                              for p in self.pattern))(like)]

    def grad(self, inputs, outputs, grads):
        return [reshape_like(grads[0], inputs[0])]


# ------------------------------------------------------------------ transpose

class Transpose(Op):
    api = "permute_dimensions"
    inline_in_plan = True

    def __init__(self, perm):
        self.perm = perm

    def infer(self, x):
        return [(tuple(x.shape[p] for p in self.perm), x.dtype)]

    def compute(self, x):
        return (np.transpose(x, self.perm),)

    def inline_src(self, ins, outs, ns, args):
        ns["np_transpose"] = np.transpose
        return "np_transpose(%s, %r)" % (args[0], tuple(self.perm)), None, False

    def grad(self, inputs, outputs, grads):
        return [Transpose(tuple(np.argsort(self.perm).tolist()))(grads[0])]


def transpose(x, perm):
    x = as_tensor(x)
    perm = tuple(int(p) for p in perm)
    if sorted(perm) != list(range(x.ndim)):
        raise ValueError("permute_dimensions: pattern %s is not a permutation of the %d axes of "
                         "a tensor of shape %s" % (perm, x.ndim, format_shape(x.shape)))
    if perm == tuple(range(x.ndim)):
        return x
    return Transpose(perm)(x)


# ------------------------------------------------------------------ indexing

def _index_spec(x, index):
    """Turn a Python index into a hashable spec plus the tensors it uses."""
    if not isinstance(index, tuple):
        index = (index,)
    spec, tensors = [], []

    def part(v):
        if v is None:
            return None
        k = static_int(v) if isinstance(v, Tensor) else None
        if k is not None:
            return k
        if isinstance(v, Tensor):
            if v.ndim != 0:
                raise IndexError("slice bounds must be scalars, got %r" % (v,))
            tensors.append(v)
            return ("t", len(tensors) - 1)
        if isinstance(v, (numbers.Integral, np.integer)):
            return int(v)
        raise IndexError("invalid slice bound %r" % (v,))

    for item in index:
        if item is None:
            spec.append(("new",))
        elif item is Ellipsis:
            spec.append(("ellipsis",))
        elif isinstance(item, slice):
            spec.append(("slice", part(item.start), part(item.stop), part(item.step)))
        elif isinstance(item, (numbers.Integral, np.integer)) and not isinstance(item, bool):
            spec.append(("int", int(item)))
        elif isinstance(item, Tensor) and item.ndim == 0:
            k = static_int(item)
            if k is not None:
                spec.append(("int", k))
            else:
                tensors.append(item)
                spec.append(("int", ("t", len(tensors) - 1)))
        elif isinstance(item, (Tensor, list, np.ndarray)):
            t = as_tensor(item)
            if not is_int_dtype(t.dtype) and t.dtype != "bool":
                raise IndexError("tensor indices must be integers, got dtype %s" % t.dtype)
            tensors.append(t)
            spec.append(("array", len(tensors) - 1))
        else:
            raise IndexError("unsupported index %r" % (item,))
    if sum(1 for s in spec if s[0] == "ellipsis") > 1:
        raise IndexError("an index can only have a single ellipsis")
    n_used = sum(tensors[s[1]].ndim if s[0] == "array" and tensors[s[1]].dtype == "bool"
                 else 1 for s in spec if s[0] in ("int", "slice", "array"))
    if n_used > x.ndim:
        raise IndexError("too many indices (%d) for a tensor of rank %d" % (n_used, x.ndim))
    # Expand the ellipsis (or pad at the end) so every axis is named once.
    fill = [("slice", None, None, None)] * (x.ndim - n_used)
    if any(s[0] == "ellipsis" for s in spec):
        i = next(i for i, s in enumerate(spec) if s[0] == "ellipsis")
        spec = spec[:i] + fill + spec[i + 1:]
    else:
        spec = spec + fill
    return tuple(spec), tensors


def _slice_len(n, start, stop, step):
    if n is None or any(isinstance(v, tuple) for v in (start, stop, step)):
        return None
    return len(range(*slice(start, stop, step).indices(n)))


class GetItem(Op):
    api = "__getitem__"
    inline_in_plan = True

    def __init__(self, spec):
        self.spec = spec

    def infer(self, x, *tensors):
        # NumPy's rule: the advanced indices (arrays, and ints when an array is
        # present) broadcast together; their shape replaces them in place when
        # they are adjacent, otherwise it goes first.
        has_array = any(s[0] == "array" for s in self.spec)
        shape, axis = [], 0
        adv_shapes, adv_at, adv_spec_pos = [], None, []
        for k, s in enumerate(self.spec):
            if s[0] == "new":
                shape.append(1)
                continue
            if s[0] == "array":
                t = tensors[s[1]]
                if adv_at is None:
                    adv_at = len(shape)
                adv_spec_pos.append(k)
                if t.dtype == "bool":
                    for j, d in enumerate(t.shape):
                        n = x.shape[axis + j]
                        if d is not None and n is not None and d != n:
                            raise IndexError("boolean index of shape %s does not match axis "
                                             "%d of size %d" % (format_shape(t.shape), axis + j, n))
                    adv_shapes.append((None,))
                    axis += t.ndim
                else:
                    adv_shapes.append(t.shape)
                    axis += 1
                continue
            n = x.shape[axis]
            if s[0] == "int":
                if not isinstance(s[1], tuple) and n is not None and not -n <= s[1] < n:
                    raise IndexError("index %d is out of bounds for axis %d with size %d"
                                     % (s[1], axis, n))
                if has_array:
                    if adv_at is None:
                        adv_at = len(shape)
                    adv_spec_pos.append(k)
                    adv_shapes.append(())
            else:
                if s[3] == 0:
                    raise ValueError("slice step cannot be zero")
                shape.append(_slice_len(n, s[1], s[2], s[3]))
            axis += 1
        if adv_shapes:
            adv = ew.broadcast_shapes("__getitem__", *adv_shapes) if any(adv_shapes) else ()
            adjacent = adv_spec_pos == list(range(adv_spec_pos[0], adv_spec_pos[-1] + 1))
            at = adv_at if adjacent else 0
            shape[at:at] = list(adv)
        return [(tuple(shape), x.dtype)]

    def time_mapped(self, ins, variant):
        # static slicing of one step is slicing of the stack past its time axis
        if len(ins) != 1:
            return None
        return GetItem((("slice", None, None, None),) + tuple(self.spec))

    def inline_src(self, ins, outs, ns, args):
        if len(ins) != 1:
            return None
        idx = "ix%d" % len(ns)
        ns[idx] = self.index(())
        return "%s[%s]" % (args[0], idx), None, False

    def index(self, tensors):
        """The Python index for this spec, given the values of its tensors."""
        def val(v):
            return int(tensors[v[1]]) if isinstance(v, tuple) else v
        out = []
        for s in self.spec:
            if s[0] == "new":
                out.append(None)
            elif s[0] == "int":
                out.append(val(s[1]))
            elif s[0] == "slice":
                out.append(slice(val(s[1]), val(s[2]), val(s[3])))
            else:
                arr = np.asarray(tensors[s[1]])
                # A mask is its nonzero() positions (what NumPy does), which
                # also lets ScatterAdd use np.add.at.
                out.extend(np.nonzero(arr) if arr.dtype == np.bool_ else (arr,))
        return tuple(out)

    def compute(self, x, *tensors):
        return (np.asarray(x[self.index(tensors)]),)

    def grad(self, inputs, outputs, grads):
        return [ScatterAdd(self.spec)(grads[0], inputs[0], *inputs[1:])] + \
            [None] * (len(inputs) - 1)


class EndOf(GetItem):
    """``x[0]`` or ``x[-1]`` of a tensor whose leading size is known only at
    run time: a ValueError naming ``api`` (with ``message``) when that size
    is 0 (an rnn over no time steps, a fold of an empty tensor), where
    indexing would raise IndexError."""

    inline_in_plan = False

    def __init__(self, spec, api, message):
        super().__init__(spec)
        self.api = api
        self.message = message

    def compute(self, x):
        if x.shape[0] == 0:
            raise ValueError("%s: %s" % (self.api, self.message))
        return super().compute(x)

    def inline_src(self, ins, outs, ns, args):
        return None


def end_of(x, index, api, message):
    """``x[index]`` (0 or -1), checked at run time when x's leading size is
    unknown (see ``EndOf``)."""
    if x.shape[0] is not None:
        return getitem(x, index)
    spec, _ = _index_spec(x, index)
    return EndOf(spec, api, message)(x)


class ScatterAdd(Op):
    """zeros_like(x) with ``g`` added at ``x[index]`` (the gradient of indexing)."""

    api = "__getitem__"

    shape_only_inputs = (1,)

    def __init__(self, spec):
        self.spec = spec

    def infer(self, g, x, *tensors):
        return [(x.shape, g.dtype)]

    def static_scatter(self, ins):
        """``(g, like, index)`` when the index is static (no index tensors):
        a loop then adds several slices' gradients into one buffer."""
        if len(ins) != 2:
            return None
        return ins[0], ins[1], GetItem(self.spec).index(())

    def compute(self, g, x, *tensors):
        index = GetItem(self.spec).index(tensors)
        out = np.zeros(np.shape(x), dtype=g.dtype)
        if any(isinstance(i, np.ndarray) for i in index):
            np.add.at(out, index, g)
        else:
            out[index] += g
        return (out,)

    def grad(self, inputs, outputs, grads):
        return [GetItem(self.spec)(grads[0], *inputs[2:]), None] + [None] * (len(inputs) - 2)


def getitem(x, index):
    x = as_tensor(x)
    spec, tensors = _index_spec(x, index)
    return GetItem(spec)(x, *tensors)


# ------------------------------------------------------------------ concatenate

#: About the size (all inputs' bytes, estimated as the first's times their
#: number) from which channels_last concatenations run on the team's copy
#: kernel (kernels/ewise.pyx concat_last): NumPy copies narrow channel runs on
#: one thread at about half a copy's speed; below it, the threads' start
#: costs more than that.
_CONCAT_KERNEL_BYTES = 256 << 10


class Concatenate(Op):
    api = "concatenate"

    def __init__(self, axis):
        self.axis = axis

    def infer(self, *xs):
        a = self.axis
        ref = xs[0]
        for x in xs[1:]:
            if x.ndim != ref.ndim:
                raise ValueError("concatenate: all tensors must have the same rank, got shapes %s"
                                 % ", ".join(format_shape(t.shape) for t in xs))
        shape = []
        for i in range(ref.ndim):
            dims = [x.shape[i] for x in xs]
            if i == a:
                shape.append(None if None in dims else sum(dims))
            else:
                known = {d for d in dims if d is not None}
                if len(known) > 1:
                    raise ValueError("concatenate: shapes %s differ outside axis %d"
                                     % (", ".join(format_shape(t.shape) for t in xs), a))
                shape.append(known.pop() if known else None)
        dtype = xs[0].dtype
        for x in xs[1:]:
            dtype = ew.result_dtype(dtype, x.dtype)
        return [(tuple(shape), dtype)]

    def _on_kernel(self, xs):
        # whether compute takes the team's copy kernel for these arrays
        x0 = xs[0]
        nd = np.ndim(x0)
        return nd >= 2 and self.axis in (-1, nd - 1) and 1 < len(xs) <= 64 and \
            type(x0) is np.ndarray and x0.dtype.char in "fd" and \
            x0.size * len(xs) * x0.itemsize >= _CONCAT_KERNEL_BYTES and \
            all(type(x) is np.ndarray and x.dtype == x0.dtype and x.ndim == nd and
                x.flags.c_contiguous and x.shape[:-1] == x0.shape[:-1] for x in xs)

    def compute(self, *xs):
        if self._on_kernel(xs):
            x0 = xs[0]
            out = np.empty(x0.shape[:-1] + (sum(x.shape[-1] for x in xs),), x0.dtype)
            return (_ewise.concat_last(xs, out),)
        return (np.concatenate(xs, axis=self.axis),)

    def bind(self, xs):
        """A plan step's direct call (Op.bind), given its operands as a list:
        the copy kernel's prepared call where compute takes the kernel, else
        NumPy's concatenate along the axis."""
        positions = tuple(range(len(xs)))
        if self._on_kernel(xs):
            return _ewise.concat_last_call([x.shape for x in xs], xs[0].dtype), positions, True
        return functools.partial(np.concatenate, axis=self.axis), positions, True

    def grad(self, inputs, outputs, grads):
        if len(inputs) == 1:
            return [grads[0]]
        sizes = tuple(x.shape[self.axis] for x in inputs)
        shapes = tuple(x.shape for x in inputs)
        if None in sizes:
            # Sizes known only at run time: read them from the inputs.
            parts = ConcatSplit(self.axis, shapes, None)(grads[0], *inputs)
        else:
            parts = ConcatSplit(self.axis, shapes, sizes)(grads[0])
        return list(parts)


class ConcatSplit(Op):
    """``g`` cut into the parts that came from each input of a concatenation
    along ``axis``: one op with one output per input, so that the gradient of
    an n-way concatenation (an unrolled RNN's stacked outputs) has O(n) edges,
    not n ops each reading all n inputs. ``sizes`` are the inputs' static sizes
    along the axis, or None when they are read from the inputs, which then
    follow ``g``."""

    api = "concatenate"

    def __init__(self, axis, shapes, sizes):
        self.axis = axis
        self.shapes = shapes
        self.sizes = sizes
        self.n_outputs = len(shapes)

    def infer(self, g, *xs):
        return [(shape, g.dtype) for shape in self.shapes]

    def compute(self, g, *xs):
        sizes = self.sizes if self.sizes is not None else [np.shape(x)[self.axis] for x in xs]
        index = [slice(None)] * g.ndim
        parts, start = [], 0
        for size in sizes:
            index[self.axis] = slice(start, start + size)
            parts.append(g[tuple(index)])
            start += size
        return tuple(parts)

    def grad(self, inputs, outputs, grads):
        parts = [gi if gi is not None else ew.zeros_like_tensor(o, o.dtype)
                 for gi, o in zip(grads, outputs)]
        return [Concatenate(self.axis)(*parts)] + [None] * (len(inputs) - 1)


def concatenate(tensors, axis=-1):
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("concatenate: expected at least one tensor")
    ndim = tensors[0].ndim
    if ndim == 0:
        raise ValueError("concatenate: cannot concatenate scalars; use stack")
    if not -ndim <= axis < ndim:
        raise ValueError("concatenate: axis %d is out of range for rank %d" % (axis, ndim))
    if len(tensors) == 1:
        return tensors[0]
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = ew.result_dtype(dtype, t.dtype)
    tensors = [ew.cast(t, dtype) for t in tensors]
    return Concatenate(axis % ndim)(*tensors)
