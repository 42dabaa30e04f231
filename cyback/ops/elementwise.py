"""Element-wise ops: unary and binary tables, cast, where, clip.

Each table row is a name, the NumPy computation and the derivative rule.
Binary ops broadcast; their gradients are summed back to each input's shape by
``unbroadcast``.
"""
import numbers

import numpy as np
import scipy.special

from cyback import config
from cyback.graph.op import Op
from cyback.graph.tensor import Constant, Tensor, as_tensor, dtype_name, is_float_dtype
from cyback.kernels import ewise as _ewise
from cyback.ops import axis_sums

# ------------------------------------------------------------------ dtypes

def result_dtype(a, b):
    """Binary result dtype: equal dtypes stay; a float operand wins over an
    integer or bool one (no float64 from float32 * int32); else NumPy's rule."""
    if a == b:
        return a
    fa, fb = is_float_dtype(a), is_float_dtype(b)
    if fa and not fb:
        return a
    if fb and not fa:
        return b
    return np.result_type(a, b).name


def _is_scalar(v):
    return isinstance(v, (numbers.Number, np.generic)) and not isinstance(v, Tensor)


def weak(value, like_dtype):
    """A Python/NumPy scalar as a Constant of the other operand's dtype, so that
    ``x * 2.0`` keeps float32 and ``i + 1`` keeps int32. A number that dtype
    cannot hold (-1 for uint8) is a ValueError, as in TensorFlow."""
    if _is_scalar(value):
        if isinstance(value, (bool, np.bool_)):
            return Constant(np.asarray(value, dtype=like_dtype if like_dtype != "bool" else "bool"))
        if is_float_dtype(like_dtype) or (isinstance(value, (numbers.Integral, np.integer))
                                          and like_dtype != "bool"):
            try:
                with np.errstate(over="ignore"):
                    return Constant(np.asarray(value, dtype=like_dtype))
            except OverflowError:
                raise ValueError("the number %s does not fit the dtype %s of the other operand"
                                 % (_short(value), like_dtype)) from None
        return Constant(np.asarray(value, dtype=config.floatx()))
    return numeric(as_tensor(value))


def numeric(t, what="operands"):
    """``t`` if its dtype holds numbers or bools, else a TypeError (a string
    or object array given where a tensor belongs)."""
    if t.dtype not in _NUMERIC:
        raise TypeError("%s must be numeric (numbers, or arrays or tensors of numbers), got "
                        "dtype %s" % (what, t.dtype))
    return t


_NUMERIC = {"bool", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
            "uint16", "uint32", "uint64", "complex64", "complex128"}


def _short(value):
    text = repr(value)
    return text if len(text) <= 40 else text[:30] + "..."


def pair(x, y):
    if isinstance(x, Tensor) and not isinstance(y, Tensor):
        return x, weak(y, x.dtype)
    if isinstance(y, Tensor) and not isinstance(x, Tensor):
        return weak(x, y.dtype), y
    return numeric(as_tensor(x)), numeric(as_tensor(y))


# ------------------------------------------------------------------ shapes

def broadcast_shapes(api, *shapes):
    """Static broadcast of shapes with None for unknown sizes."""
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(ndim):
        dims = [s[i - ndim + len(s)] for s in shapes if i - ndim + len(s) >= 0]
        known = [d for d in dims if d is not None and d != 1]
        if len(set(known)) > 1:
            raise ValueError("%s: shapes %s cannot be broadcast together"
                             % (api, " and ".join(str(tuple(s)) for s in shapes)))
        if known:
            out.append(known[0])
        elif any(d is None for d in dims):
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def _fully_known(shape):
    return all(d is not None for d in shape)


class SumToShape(Op):
    """Sum ``g`` down to the shape of ``like`` (undo broadcasting)."""

    api = "gradient"
    shape_only_inputs = (1,)

    def inline_src(self, ins, outs, ns, args):
        # Inside a loop step the shapes mostly agree already: test before calling.
        ns["sum_to"] = sum_to
        return "(%s if %s.shape == %s.shape else sum_to(%s, %s.shape))" % (
            args[0], args[0], args[1], args[0], args[1]), None, False

    def infer(self, g, like):
        return [(like.shape, g.dtype)]

    def compute(self, g, like):
        return (sum_to(g, like.shape),)

    def steps_summed(self, ins):
        # a bias gradient summed over a loop's steps: one reduction of the
        # stacked per-step gradients over (time, broadcast axes) after it
        return (0,)

    def sum_over_steps(self, stacked, like, sum_steps):
        return unbroadcast(sum_steps(stacked[0]), like)

    def grad(self, inputs, outputs, grads):
        return [broadcast_like(grads[0], inputs[0]), None]


def sum_to(g, shape):
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = axis_sums.sum_axes(g, tuple(range(lead)))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if axes:
        g = axis_sums.sum_axes(g, axes, keepdims=True)
    return g.reshape(shape)


class BroadcastLike(Op):
    """Broadcast ``x`` to the shape of ``like``."""

    api = "gradient"
    shape_only_inputs = (1,)

    def infer(self, x, like):
        return [(broadcast_shapes("broadcast", x.shape, like.shape), x.dtype)]

    def compute(self, x, like):
        return (np.broadcast_to(x, np.broadcast_shapes(x.shape, like.shape)),)

    def grad(self, inputs, outputs, grads):
        return [unbroadcast(grads[0], inputs[0]), None]


def unbroadcast(g, x):
    """The gradient ``g`` of a broadcast result, reduced to ``x``'s shape."""
    if g is None:
        return None
    if g.shape == x.shape and _fully_known(x.shape):
        return g
    return SumToShape()(g, x)


def broadcast_like(x, like):
    if x.shape == like.shape and _fully_known(x.shape):
        return x
    return BroadcastLike()(x, like)


# ------------------------------------------------------------------ unary

def _sigmoid(x):
    return scipy.special.expit(x)


def _softplus(x):
    return np.logaddexp(np.zeros((), x.dtype), x)


def _softsign(x):
    return x / (1 + np.abs(x))


def _erf(x):
    # float32 through the vectorised kernel (absolute error <= 2e-7), float64
    # through SciPy
    if x.dtype == np.float32:
        return _ewise.erf_f32(x)
    return scipy.special.erf(x)


# name: (NumPy function, gradient (x, y, g) -> tensor or None)
UNARY = {
    "negative": (np.negative, lambda x, y, g: -g),
    "abs": (np.abs, lambda x, y, g: g * sign(x)),
    "sign": (np.sign, None),
    "square": (np.square, lambda x, y, g: g * x * 2),
    "sqrt": (np.sqrt, lambda x, y, g: g / (y * 2)),
    "exp": (np.exp, lambda x, y, g: g * y),
    "expm1": (np.expm1, lambda x, y, g: g * (y + 1)),
    "log": (np.log, lambda x, y, g: g / x),
    "log1p": (np.log1p, lambda x, y, g: g / (x + 1)),
    "sin": (np.sin, lambda x, y, g: g * cos(x)),
    "cos": (np.cos, lambda x, y, g: -g * sin(x)),
    "tanh": (np.tanh, lambda x, y, g: g * (1 - square(y))),
    "sigmoid": (_sigmoid, lambda x, y, g: g * y * (1 - y)),
    "softplus": (_softplus, lambda x, y, g: g * sigmoid(x)),
    "softsign": (_softsign, lambda x, y, g: g / square(abs_(x) + 1)),
    # d/dx erf(x) = 2/sqrt(pi) exp(-x^2); cyback.layers' exact gelu needs it.
    "erf": (_erf, lambda x, y, g: g * exp(-square(x)) * (2 / np.sqrt(np.pi))),
    "reciprocal": (np.reciprocal, lambda x, y, g: -g * square(y)),
    "round": (np.round, None),
    "floor": (np.floor, None),
    "ceil": (np.ceil, None),
    "logical_not": (np.logical_not, None),
}


_EWISE_UNARY = {"negative", "abs", "square", "sqrt", "exp", "expm1", "log", "log1p", "tanh",
                "sigmoid", "softplus", "softsign", "reciprocal", "erf"}


def sigmoid_tanh(x, out=None):
    """sigmoid(x) = (1 + tanh(x / 2)) / 2: NumPy's vectorised tanh makes this
    several times faster than scipy's expit on float32 gates, within one unit in
    the last place of 0.5 (absolute), and it cannot overflow."""
    y = np.multiply(x, 0.5, out=out)
    np.tanh(y, out=y)
    y *= 0.5
    y += 0.5
    return y


def _time_mapped_elementwise(op, ins, variant):
    # Right-aligned broadcasting survives a new leading time axis as long as
    # every per-step operand already has the full output rank.
    out_rank = len(op.infer(*ins)[0][0])
    if all(x.ndim == out_rank for x, v in zip(ins, variant) if v):
        return op
    return None


class Unary(Op):
    def __init__(self, name):
        self.name = name
        self.api = name

    def infer(self, x):
        dtype = "bool" if self.name == "logical_not" else x.dtype
        return [(x.shape, dtype)]

    def compute(self, x):
        y = UNARY[self.name][0](x)
        return (y if y.dtype == x.dtype or self.name == "logical_not" else y.astype(x.dtype),)

    def ewise(self, b, x):
        if self.name not in _EWISE_UNARY:
            return None
        return b.emit(self.name, x)

    def time_mapped(self, ins, variant):
        return _time_mapped_elementwise(self, ins, variant)

    def inline_src(self, ins, outs, ns, args):
        if ins[0].dtype not in ("float32", "float64") or self.name == "logical_not":
            return None
        if self.name == "sigmoid":
            ns["u_sigmoid_tanh"] = sigmoid_tanh
            return "u_sigmoid_tanh(%s)" % args[0], None, True
        fn = "u_" + self.name
        ns[fn] = UNARY[self.name][0]
        return "%s(%s)" % (fn, args[0]), None, isinstance(ns[fn], np.ufunc)

    def grad(self, inputs, outputs, grads):
        rule = UNARY[self.name][1]
        if rule is None:
            return [None]
        return [rule(inputs[0], outputs[0], grads[0])]


def _unary(name):
    op = Unary(name)

    def apply(x):
        x = numeric(as_tensor(x), "x")
        if name not in ("negative", "abs", "sign", "square", "round", "logical_not") \
                and not is_float_dtype(x.dtype):
            x = cast(x, config.floatx())
        return op(x)
    apply.__name__ = name
    return apply


negative = _unary("negative")
abs_ = _unary("abs")
sign = _unary("sign")
square = _unary("square")
sqrt = _unary("sqrt")
exp = _unary("exp")
expm1 = _unary("expm1")
log = _unary("log")
log1p = _unary("log1p")
sin = _unary("sin")
cos = _unary("cos")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
softplus = _unary("softplus")
softsign = _unary("softsign")
erf = _unary("erf")
reciprocal = _unary("reciprocal")
round_ = _unary("round")
floor = _unary("floor")
ceil = _unary("ceil")
logical_not = _unary("logical_not")


# ------------------------------------------------------------------ binary

def _div(a, b):
    return np.true_divide(a, b)


def _pow(a, b):
    return np.power(a, b)


def _safe_log(x):
    return log(maximum(x, np.finfo(x.dtype).tiny))


# name: (NumPy function, gradient wrt x, gradient wrt y), each (x, y, z, g) -> tensor
BINARY = {
    "add": (np.add, lambda x, y, z, g: g, lambda x, y, z, g: g),
    "subtract": (np.subtract, lambda x, y, z, g: g, lambda x, y, z, g: -g),
    "multiply": (np.multiply, lambda x, y, z, g: g * y, lambda x, y, z, g: g * x),
    "divide": (_div, lambda x, y, z, g: g / y, lambda x, y, z, g: -g * z / y),
    "power": (_pow, lambda x, y, z, g: g * y * power(x, y - 1),
              lambda x, y, z, g: g * z * _safe_log(x)),
    "maximum": (np.maximum, lambda x, y, z, g: g * cast(greater_equal(x, y), g.dtype),
                lambda x, y, z, g: g * cast(less(x, y), g.dtype)),
    "minimum": (np.minimum, lambda x, y, z, g: g * cast(less_equal(x, y), g.dtype),
                lambda x, y, z, g: g * cast(greater(x, y), g.dtype)),
    "floor_divide": (np.floor_divide, None, None),
    "mod": (np.mod, lambda x, y, z, g: g, lambda x, y, z, g: -g * floor(x / y)),
    "equal": (np.equal, None, None),
    "not_equal": (np.not_equal, None, None),
    "greater": (np.greater, None, None),
    "greater_equal": (np.greater_equal, None, None),
    "less": (np.less, None, None),
    "less_equal": (np.less_equal, None, None),
    "logical_and": (np.logical_and, None, None),
    "logical_or": (np.logical_or, None, None),
}

_EWISE_BINARY = {"add", "subtract", "multiply", "divide", "maximum", "minimum"}

_BOOL_RESULT = {"equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
                "logical_and", "logical_or"}


class Binary(Op):
    def __init__(self, name):
        self.name = name
        self.api = name

    def infer(self, x, y):
        shape = broadcast_shapes(self.name, x.shape, y.shape)
        if self.name in _BOOL_RESULT:
            return [(shape, "bool")]
        dtype = result_dtype(x.dtype, y.dtype)
        if self.name == "divide" and not is_float_dtype(dtype):
            dtype = config.floatx()
        return [(shape, dtype)]

    def compute(self, x, y):
        z = BINARY[self.name][0](x, y)
        return (np.asarray(z),)

    def bind(self, inputs):
        """A plan step's direct call (Op.bind): the NumPy ufunc itself, where
        it returns an array (an operand of one or more dimensions)."""
        fn = BINARY[self.name][0]
        if type(self) is not Binary or not isinstance(fn, np.ufunc) or \
                not any(isinstance(a, np.ndarray) and a.ndim for a in inputs):
            return None
        return fn, (0, 1), False

    def ewise(self, b, x, y):
        if self.name not in _EWISE_BINARY:
            return None
        return b.emit(self.name, x, y)

    def time_mapped(self, ins, variant):
        return _time_mapped_elementwise(self, ins, variant)

    def inline_src(self, ins, outs, ns, args):
        if type(self) is not Binary:
            return None     # _BinaryCast must cast NumPy's result
        fn = "b_" + self.name
        ns[fn] = BINARY[self.name][0]
        return "%s(%s, %s)" % (fn, args[0], args[1]), None, isinstance(ns[fn], np.ufunc)

    def addends(self, inputs):
        return list(inputs) if self.name == "add" else None

    def rewrite(self, inputs, ctx):
        # At inference, a product with a per-channel weight vector (a
        # BatchNorm's scale) goes into the weights of the op before it; a sum
        # adds its weight terms first (see _weights_summed_first).
        if not ctx.inference or type(self) is not Binary:
            return None
        if self.name == "add":
            return _weights_summed_first(inputs, ctx)
        if self.name != "multiply":
            return None
        for t, v in (inputs, inputs[::-1]):
            if ctx.is_weight(v) and not ctx.is_weight(t):
                scaled = ctx.scale(t, v)
                if scaled is not None:
                    return [scaled]
        return None

    def lower(self, inputs, ctx):
        # At inference, a weight added to the output of an op that can take
        # it into its kernel as a bias (its ``absorb_bias`` hook: a packed
        # product's bias shaped like several of its axes) goes in there; so
        # does a tensor of the output's shape an op adds in its epilogue (its
        # ``absorb_residual`` hook: an int8 layer's residual sum).
        if self.name != "add" or type(self) is not Binary or not ctx.inference:
            return None
        for t, b in (inputs, inputs[::-1]):
            made = ctx.producer(t)
            if made is None or ctx.is_weight(t) or ctx.users(t) != 1:
                continue
            hook = getattr(made[0], "absorb_bias" if ctx.is_weight(b) else "absorb_residual",
                           None)
            out = hook(made[1], b, ctx) if hook is not None else None
            if out is not None:
                return [out]
        return None

    def scale_output(self, inputs, out, v, ctx):
        # (t + w) * v = t * v + w * v, for a weight w and a t that can absorb v
        if self.name != "add":
            return None
        for t, w in (inputs, inputs[::-1]):
            if ctx.is_weight(w) and not ctx.is_weight(t):
                scaled = ctx.scale(t, v)
                if scaled is not None:
                    return add(scaled, multiply(w, v))
        return None

    def grad(self, inputs, outputs, grads):
        _, gx, gy = BINARY[self.name]
        x, y = inputs
        z, g = outputs[0], grads[0]
        if gx is None:
            return [None, None]
        return [unbroadcast(gx(x, y, z, g), x) if is_float_dtype(x.dtype) else None,
                unbroadcast(gy(x, y, z, g), y) if is_float_dtype(y.dtype) else None]


def _sum_terms(t, ctx, dtype, terms, depth=0):
    # the terms of a tree of adds of one dtype whose inner sums have no
    # other reader, in order
    made = ctx.producer(t)
    if depth < 16 and made is not None and type(made[0]) is Binary and \
            made[0].name == "add" and t.dtype == dtype and ctx.users(t) == 1 and \
            not ctx.is_weight(t):
        for x in made[1]:
            _sum_terms(x, ctx, dtype, terms, depth + 1)
    else:
        terms.append(t)


def _weights_summed_first(inputs, ctx):
    """A sum of data terms and two or more weight terms (a conv's bias, then
    a BatchNorm's shift; a residual block's two branches with theirs) as
    ``(anchor + (sum of the weights)) + the other data terms``, the anchor
    being the first data term whose op can take a bias into its kernel
    (``epilogue_host``), else the first: the weights' sum is one vector that
    an inference plan computes once, and the kernel adds it as its bias,
    then the rest as its residual, in its epilogue (graph/fusion.py). None
    for fewer weight terms (one bias is taken as it is). Rounds differently
    from the sum as written, as BatchNorm folding does."""
    dtype = result_dtype(inputs[0].dtype, inputs[1].dtype)
    if any(x.dtype != dtype for x in inputs) or not is_float_dtype(dtype):
        return None
    terms = []
    for x in inputs:
        _sum_terms(x, ctx, dtype, terms)
    weights = [t for t in terms if ctx.is_weight(t)]
    data = [t for t in terms if not ctx.is_weight(t)]
    if not data or len(weights) < 2 or any(t.dtype != dtype for t in terms):
        return None
    hosts = [t for t in data if getattr((ctx.producer(t) or (None,))[0], "epilogue_host", False)]
    anchor = hosts[0] if hosts else data[0]
    w = weights[0]
    for x in weights[1:]:
        w = add(w, x)
    out = add(anchor, w)
    for x in data:
        if x is not anchor:
            out = add(out, x)
    return [out]


class _BinaryCast(Binary):
    """A binary op whose NumPy result must be cast to the inferred dtype."""

    def __init__(self, name, dtype):
        super().__init__(name)
        self.dtype = dtype

    def compute(self, x, y):
        return (np.asarray(BINARY[self.name][0](x, y)).astype(self.dtype, copy=False),)


def _binary(name):
    plain = Binary(name)

    def apply(x, y):
        x, y = pair(x, y)
        spec = plain.infer(x, y)[0]
        if name in _BOOL_RESULT or np.result_type(x.dtype, y.dtype).name == spec[1]:
            return plain(x, y)
        return _BinaryCast(name, spec[1])(x, y)
    apply.__name__ = name
    return apply


add = _binary("add")
subtract = _binary("subtract")
multiply = _binary("multiply")
divide = _binary("divide")
power = _binary("power")
maximum = _binary("maximum")
minimum = _binary("minimum")
floor_divide = _binary("floor_divide")
mod = _binary("mod")
equal = _binary("equal")
not_equal = _binary("not_equal")
greater = _binary("greater")
greater_equal = _binary("greater_equal")
less = _binary("less")
less_equal = _binary("less_equal")
logical_and = _binary("logical_and")
logical_or = _binary("logical_or")


# ------------------------------------------------------------------ others

class Cast(Op):
    api = "cast"

    def __init__(self, dtype):
        self.dtype = dtype

    def infer(self, x):
        return [(x.shape, self.dtype)]

    def compute(self, x):
        return (np.asarray(x).astype(self.dtype, copy=False),)

    def time_mapped(self, ins, variant):
        return _time_mapped_elementwise(self, ins, variant)

    def grad(self, inputs, outputs, grads):
        x = inputs[0]
        if not is_float_dtype(x.dtype) or not is_float_dtype(self.dtype):
            return [None]
        return [cast(grads[0], x.dtype)]


def cast(x, dtype):
    x = numeric(as_tensor(x), "x")
    dtype = dtype_name(dtype)
    if x.dtype == dtype:
        return x
    return Cast(dtype)(x)


class Where(Op):
    """``cond ? a : b`` with broadcasting (the compute behind K.switch)."""

    api = "switch"

    def infer(self, cond, a, b):
        shape = broadcast_shapes("switch", cond.shape, a.shape, b.shape)
        return [(shape, result_dtype(a.dtype, b.dtype))]

    def compute(self, cond, a, b):
        out = np.where(cond, a, b)
        return (out.astype(result_dtype(a.dtype, b.dtype), copy=False),)

    def inline_src(self, ins, outs, ns, args):
        if not ins[1].dtype == ins[2].dtype == outs[0].dtype:
            return None
        ns["np_where"] = np.where
        return "np_where(%s, %s, %s)" % tuple(args), None, False

    def simplify(self, inputs):
        # A known scalar condition picks one branch; the other is never
        # computed (dropout draws nothing at test time) as long as the chosen
        # branch alone already has the result's static shape.
        cond = inputs[0]
        if type(cond) is Constant and cond.value.ndim == 0:
            chosen = inputs[1] if cond.value else inputs[2]
            if chosen.shape == self.infer(*inputs)[0][0]:
                return [chosen]
        return None

    def grad(self, inputs, outputs, grads):
        cond, a, b = inputs
        g = grads[0]
        zero = zeros_like_tensor(g)
        return [None, unbroadcast(where(cond, g, zero), a), unbroadcast(where(cond, zero, g), b)]


def where(cond, a, b):
    a, b = pair(a, b)
    return Where()(as_tensor(cond), a, b)


class Clip(Op):
    api = "clip"

    def infer(self, x, lo, hi):
        return [(broadcast_shapes("clip", x.shape, lo.shape, hi.shape), x.dtype)]

    def compute(self, x, lo, hi):
        return (np.clip(x, lo, hi).astype(x.dtype, copy=False),)

    def ewise(self, b, x, lo, hi):
        return b.emit("minimum", b.emit("maximum", x, lo), hi)

    def grad(self, inputs, outputs, grads):
        x, lo, hi = inputs
        inside = logical_and(greater_equal(x, lo), less_equal(x, hi))
        return [unbroadcast(grads[0] * cast(inside, grads[0].dtype), x), None, None]


def clip(x, lo, hi):
    x = as_tensor(x)
    return Clip()(x, weak(lo, x.dtype), weak(hi, x.dtype))


class Fill(Op):
    """An array filled with ``value``, in ``dtype``, of the shape of ``like``;
    or, given ``dims``, of a shape made from like's: one ``(axis, factor)``
    per output axis, ``like.shape[axis] * factor``, or ``factor`` itself when
    axis is None. (The plan optimizer folds reductions, expand_dims and tiles
    of a fill into a fill: Keras builds an RNN's zero initial state that way.)"""

    api = "ones_like"
    shape_only_inputs = (0,)
    inline_in_plan = True

    def __init__(self, value, dtype, dims=None):
        self.value = value
        self.dtype = dtype
        self.dims = dims

    def dims_of(self, rank):
        """``dims`` spelled out for a ``like`` of this rank."""
        return self.dims if self.dims is not None else tuple((i, 1) for i in range(rank))

    def _shape(self, shape):
        if self.dims is None:
            return tuple(shape)
        return tuple(f if a is None else None if shape[a] is None else shape[a] * f
                     for a, f in self.dims)

    def infer(self, like):
        return [(self._shape(like.shape), self.dtype)]

    def compute(self, like):
        shape = self._shape(np.shape(like))
        if self.value == 0:
            # an RNN's initial state, at every call of a batch-1 plan: zeros
            # take a third of np.full's time there
            return (np.zeros(shape, self.dtype),)
        return (np.full(shape, self.value, dtype=self.dtype),)

    def inline_src(self, ins, outs, ns, args):
        like = args[0]
        if self.dims is None:
            shape = "%s.shape" % like
        else:
            shape = "(%s)" % "".join(
                "%d, " % f if a is None else "%s.shape[%d] * %d, " % (like, a, f)
                for a, f in self.dims)
        key = "fill%d" % len(ns)
        ns[key] = (np.dtype(self.dtype), self.value)
        ns["np_zeros"], ns["np_full"] = np.zeros, np.full
        if self.value == 0:
            return "np_zeros(%s, %s[0])" % (shape, key), None, False
        return "np_full(%s, %s[1], dtype=%s[0])" % (shape, key, key), None, False


def as_fill(t, ctx):
    """``(Fill op, its like tensor)`` when the plan that ``ctx`` optimizes
    makes ``t`` with a Fill, else None."""
    step = ctx.producer(t)
    if step is None or not isinstance(step[0], Fill):
        return None
    return step[0], step[1][0]


def ones_like(x, dtype=None):
    x = as_tensor(x)
    return Fill(1, dtype_name(dtype) if dtype else x.dtype)(x)


def zeros_like_tensor(x, dtype=None):
    x = as_tensor(x)
    return Fill(0, dtype_name(dtype) if dtype else x.dtype)(x)
