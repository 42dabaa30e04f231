"""int8 inference ops: a Dense layer and a channels_last 1-D/2-D convolution
whose product runs on uint8 activations and int8 weights with int32 sums
(``cyback.kernels.qgemm``); their input and output are float32.

    packed = PackInt8()(kernel)                       int8 (..., N) -> packed bytes
    vectors = EpilogueVectors(in_scale)(scale[, bias])  per-column scale and bias
    y = QuantizedDense(units, in_scale, in_zero, activation)(x, packed, vectors)
    y = QuantizedConv(rank, filters, kernel_size, ...)(x, packed, vectors)

``packed`` and ``vectors`` depend on weights only, so an inference plan
computes them once with its frozen weights (graph/frozen.py) and each call
quantizes x (one scale and zero point for the tensor), forms the uint8
patches of a convolution (padding takes the zero point, the code of 0.0),
multiplies and dequantizes in the product's epilogue:

    y = act(float32(sum (q(x) - in_zero) * w) * (in_scale * scale[n]) + bias[n])

with act none, relu or relu6 applied there; other activations are the
layer's business. The ops are forward only: differentiating through one
raises a TypeError, since a quantized model is for inference.

In an inference plan (the ``lower`` walk) a per-channel bias added to an
int8 op's output, a residual sum and a relu / relu6 after it go into its
epilogue (``absorb_bias``, ``absorb_residual``, ``absorb_activation``), and
(the ``share`` walk) an int8 op whose readers include int8 ops hands them
uint8 codes of their input quantization, made in its epilogue (``out_codes``
on the writer, or ``also_codes`` beside a float32 output other readers take;
``codes_in`` on the reader): no quantization pass. The codes are the ones
the reader would have made from the float32 output: the epilogue
requantizes with the quantization kernel's own arithmetic.
"""
import math

import numpy as np

from cyback.graph.op import Op
from cyback.graph.optimize import Context
from cyback.kernels import conv_utils, qgemm
from cyback.ops.manip import spatial_zero_padding
from cyback.ops.quantized_extreme import QuantizedConvExtreme
from cyback.ops.shape import reshape

#: activations the product's epilogue applies itself
FUSED_ACTIVATIONS = ("linear", "relu", "relu6")


def _no_gradient(api):
    raise TypeError("%s has no gradient: int8 layers are for inference. Train the float32 "
                    "model and quantize it again with cyback.quantize." % api)


class _ResidualShape(Exception):
    """A fused residual whose run-time shape is not the output's."""


def _residual_rows(residual, shape):
    # the residual as the product's (rows, columns) -- for codes, (codes rows,
    # scale, zero point) -- or None
    if residual is None:
        return None
    if isinstance(residual, tuple):
        rows = _residual_rows(residual[0], shape)
        return (rows,) + tuple(residual[1:])
    if residual.shape != tuple(shape):
        raise _ResidualShape()
    return residual.reshape(-1, shape[-1]) if len(shape) else residual


ANY_CODES = Context.ANY_CODES


def _known(api, what, dims):
    if any(d is None for d in dims):
        raise ValueError("%s: the %s must be known when the graph is built, got %s"
                         % (api, what, dims))


class PackInt8(Op):
    """The packed form of an int8 kernel (..., N), taken as a (K, N) matrix
    with K the product of the other axes (a Keras kernel (kh, kw, C, F) in the
    row order of the convolution's patches)."""

    api = "quantized_weights"

    def infer(self, w):
        if w.dtype != "int8":
            raise ValueError("%s: the kernel must be int8, got %s" % (self.api, w.dtype))
        if w.ndim < 2:
            raise ValueError("%s: the kernel must have 2 or more axes, got shape %s"
                             % (self.api, w.shape))
        _known(self.api, "kernel shape", w.shape)
        k = int(np.prod(w.shape[:-1]))
        if k > qgemm.MAX_K:
            raise ValueError("%s: a kernel of %d inputs per output is above the %d the int32 "
                             "sums allow" % (self.api, k, qgemm.MAX_K))
        return [((qgemm.packed_size(k, w.shape[-1]),), "uint8")]

    def compute(self, w):
        w = np.asarray(w)
        return (qgemm.pack_weights(w.reshape(-1, w.shape[-1])),)

    def grad(self, inputs, outputs, output_grads):
        _no_gradient(self.api)


class EpilogueVectors(Op):
    """The product's per-column vectors: in_scale * scale (float32) and the
    bias, padded as ``qgemm.epilogue_vectors`` lays them out."""

    api = "quantized_weights"

    def __init__(self, in_scale):
        self.in_scale = float(in_scale)

    def infer(self, scale, bias=None):
        if scale.ndim != 1 or (bias is not None and bias.shape != scale.shape):
            raise ValueError("%s: expected a vector of scales and a bias of its shape, got %s "
                             "and %s" % (self.api, scale.shape,
                                         None if bias is None else bias.shape))
        _known(self.api, "number of scales", scale.shape)
        width = -(-scale.shape[0] // qgemm.PANEL_COLUMNS) * qgemm.PANEL_COLUMNS
        return [((1 if bias is None else 2, width), "float32")]

    def compute(self, scale, bias=None):
        return (qgemm.epilogue_vectors(self.in_scale, scale, bias),)

    def grad(self, inputs, outputs, output_grads):
        _no_gradient(self.api)


class _Quantized(Op):
    """What the Dense and convolution ops share: the input's quantization
    (scale, zero point) and the fused activation."""

    fresh_output = True
    epilogue_host = True
    #: x is uint8 codes of (in_scale, in_zero), made by the int8 op before
    codes_in = False
    #: (scale, zero point) of the uint8 codes the op outputs, or None: float32
    out_codes = None
    #: (scale, zero point) of uint8 codes the op outputs as well as its
    #: float32 output (two outputs: float32, codes), or None
    also_codes = None
    #: the last operand is a float32 residual of the output's shape, added
    #: after the bias and before the activation
    residual_in = False
    #: (scale, zero point) when that residual operand is uint8 codes instead
    residual_codes = None
    #: whether inference plans hand codes from one int8 op to the next
    #: (``share``); off, to compare, in tests and benchmarks
    chaining = True
    #: whether a residual another int8 op makes as codes is read as those
    #: codes (the sum then sees the residual quantized, as the int8 paths of
    #: other engines do); off: the float32 residual, to the bit of no chaining
    quantized_residual = True

    def __init__(self, in_scale, in_zero, activation):
        if activation not in FUSED_ACTIVATIONS:
            raise ValueError("%s: the fused activation must be one of %s, got %r"
                             % (self.api, FUSED_ACTIVATIONS, activation))
        self.in_scale = float(in_scale)
        self.in_zero = int(in_zero)
        self.activation = activation

    def _with(self, **changes):
        # not copy.copy: once a plan has been pickled, copyreg holds a reducer
        # for every op class, with a state setter copy.copy cannot take
        op = type(self).__new__(type(self))
        vars(op).update(vars(self))
        vars(op).update(changes)
        vars(op).pop("_runs", None)
        return op

    def __getstate__(self):
        # the prepared kernel calls are made again after unpickling
        state = dict(vars(self))
        state.pop("_runs", None)
        return state

    # A batch-1 step of a few µs spent about 2 µs in the op's Python before
    # its prepared kernel call (sizes, pads, checks, the calls' cache): the
    # op keeps, per input shape and operand arrays, the call to make and the
    # shapes around it. ``_runs`` maps (input shape, id(packed), id(vectors),
    # activation) to (prepared call, shape it takes the input in, output
    # shape); an entry is used only for the arrays its call was made for.

    def _run(self, q, packed, vectors, activation, residual):
        """The op's output from its remembered run for these operands, or
        None when it has none."""
        runs = vars(self).get("_runs")
        run = None if runs is None else runs.get((q.shape, id(packed), id(vectors), activation))
        if run is None or not run[0].matches(packed, vectors):
            return None
        call, rows, out_shape = run
        if residual is None:
            y = call(q.reshape(rows))
        else:
            y = call(q.reshape(rows), _residual_rows(residual, out_shape))
        if type(y) is tuple:
            return tuple(a.reshape(out_shape) for a in y)
        return y.reshape(out_shape)

    def _remember_run(self, q, packed, vectors, activation, call, rows, out_shape):
        runs = vars(self).setdefault("_runs", {})
        _remember(runs, (q.shape, id(packed), id(vectors), activation),
                  (call, rows, out_shape))

    def bind(self, inputs):
        """A plan step's direct call (Op.bind): the op's remembered run
        (``_runs``) for these codes and weights, without the op's Python
        around it; None for an op of two outputs or one that quantizes its
        float input itself, and where the op has no remembered run."""
        if not self.codes_in or self.also_codes is not None or \
                getattr(self, "multiplier", 1) > 1 or getattr(self, "pointwise", None):
            return None
        own, res = self._split(inputs)
        q, packed, vectors = own[:3]
        runs = vars(self).get("_runs")
        run = None if runs is None else runs.get((q.shape, id(packed), id(vectors), None))
        if run is None or not run[0].matches(packed, vectors) or \
                (res is not None and res.shape != tuple(run[2])):
            return None
        call, rows, out_shape = run
        kind = None if res is None else ("float32" if self.residual_codes is None else "uint8")
        bound = qgemm.bound_run(call, q.shape, rows, out_shape, kind, self.residual_codes)
        positions = (0, 1, 2) if res is None else (0, 1, 2, len(inputs) - 1)
        return bound, positions, False

    def describe(self):
        """'quantized_conv + residual relu (uint8 in, float32 and uint8 out)':
        the residual and activation in the epilogue, and which side is uint8
        codes, for a profile or a plan listing."""
        sides = [side for side, on in (("uint8 in", self.codes_in),
                                       ("uint8 out", self.out_codes is not None),
                                       ("float32 and uint8 out", self.also_codes is not None))
                 if on]
        return self.api + (" + residual" if self.residual_in else "") + \
            (" codes" if self.residual_codes is not None else "") + \
            ("" if self.activation == "linear" else " " + self.activation) + \
            (" (%s)" % ", ".join(sides) if sides else "")

    @property
    def n_outputs(self):
        return 1 if self.also_codes is None else 2

    def _out_dtype(self):
        return "float32" if self.out_codes is None else "uint8"

    def _outputs(self, shape):
        if self.also_codes is not None:
            return [(shape, "float32"), (shape, "uint8")]
        return [(shape, self._out_dtype())]

    def _split(self, operands):
        """(the op's own operands, the residual operand or None)"""
        if self.residual_in:
            return operands[:-1], operands[-1]
        return operands, None

    def infer(self, *operands):
        own, residual = self._split(operands)
        shape = self._shape(*own)
        dtype = "float32" if self.residual_codes is None else "uint8"
        if residual is not None and (residual.dtype != dtype or
                                     tuple(residual.shape) != tuple(shape)):
            raise ValueError("%s: the residual must be %s of the output's shape %s, got "
                             "%s %s" % (self.api, dtype, shape, residual.dtype, residual.shape))
        return self._outputs(shape)

    def compute(self, *operands, activation=None, residual=None):
        if not self.residual_in:
            y = self._compute(*operands, activation=activation, residual=residual)
            return y if type(y) is tuple else (y,)
        own, res = self._split(operands)
        if res is not None:
            residual = np.asarray(res)
            if self.residual_codes is not None:
                residual = (residual,) + tuple(self.residual_codes)
            try:
                return self._pair(self._compute(*own, activation=activation,
                                                residual=residual))
            except _ResidualShape:
                # a residual that broadcasts at run time: added after the op
                if isinstance(residual, tuple):
                    codes, scale, zero = residual
                    residual = (codes.astype(np.int32) - zero).astype(np.float32) * \
                        np.float32(scale)
                y = self._with(out_codes=None, also_codes=None, residual_in=False,
                               residual_codes=None)._compute(*own, activation="linear")
                return self._pair(self._finish(y + residual, activation or self.activation))
        return self._pair(self._compute(*own, activation=activation, residual=residual))

    @staticmethod
    def _pair(y):
        return y if isinstance(y, tuple) else (y,)

    def _finish(self, y, activation):
        # the epilogue's activation and requantization, in NumPy
        y = np.asarray(y, dtype=np.float32)
        if activation in ("relu", "relu6"):
            y = np.maximum(np.float32(0), y)
        if activation == "relu6":
            y = np.minimum(np.float32(6), y)
        codes = self.out_codes or self.also_codes
        if codes is None:
            return y
        q = qgemm.quantize(np.ascontiguousarray(y), *codes)
        return (y, q) if self.also_codes is not None else q

    @staticmethod
    def _shaped(y, shape):
        if isinstance(y, tuple):
            return tuple(a.reshape(shape) for a in y)
        return y.reshape(shape)

    def _check_input(self, x):
        if self.codes_in and x.dtype != "uint8":
            raise ValueError("%s: expected uint8 codes, got %s" % (self.api, x.dtype))
        if not self.codes_in and x.dtype not in ("float16", "float32", "float64"):
            raise ValueError("%s: expected a float input, got %s" % (self.api, x.dtype))

    def _check_operands(self, x, packed, vectors, k, n):
        self._check_input(x)
        if packed.dtype != "uint8" or packed.ndim != 1 or vectors.dtype != "float32" or \
                vectors.ndim != 2:
            raise ValueError("%s: expected packed weights (PackInt8) and epilogue vectors "
                             "(EpilogueVectors), got %s %s and %s %s"
                             % (self.api, packed.dtype, packed.shape, vectors.dtype,
                                vectors.shape))
        if k is not None and packed.shape[0] is not None and \
                packed.shape[0] != qgemm.packed_size(k, n):
            raise ValueError("%s: the packed weights do not hold a (%d, %d) kernel for an "
                             "input of %d features" % (self.api, k, n, k))

    def _product(self, a, packed, vectors, activation=None, zero=None, residual=None):
        return self._product_call(packed, vectors, activation, zero)(a, residual)

    def _product_call(self, packed, vectors, activation=None, zero=None):
        scale, out_zero = self._codes_out()
        return _product_call(packed, vectors, self.in_zero if zero is None else zero,
                             activation or self.activation, scale, out_zero,
                             self.also_codes is not None)

    def _codes_out(self):
        return self.out_codes or self.also_codes or (None, None)

    def _takes_residual(self):
        return True

    def _plain(self):
        # float32 out, no residual operand: what the hooks that change the
        # epilogue's vectors or its tail start from
        return self.out_codes is None and self.also_codes is None and not self.residual_in

    def _out_vectors_at(self):
        """Where the epilogue vectors (EpilogueVectors) of the op's output are
        among its operands."""
        return 2

    def scale_output(self, inputs, out, v, ctx):
        """``out * v`` for a per-channel weight vector ``v`` (BatchNorm folded
        into the op at inference): the epilogue's scales and bias times ``v``.
        Not through a fused activation (relu does not commute with a negative
        scale)."""
        at = self._out_vectors_at()
        vectors = inputs[at]
        if self.activation != "linear" or not self._plain() or \
                vectors.node is None or not isinstance(vectors.node.op, EpilogueVectors) or \
                ctx.channel_vector(v, out, out.ndim - 1) is None or out.shape[-1] is None:
            return None
        made = vectors.node
        v = reshape(v, (out.shape[-1],))
        parts = [made.inputs[0] * v] + [b * v for b in made.inputs[1:]]
        new = list(inputs)
        new[at] = made.op(*parts)
        return self(*new)

    def absorb_bias(self, inputs, b, ctx):
        """This op's output + ``b`` for a float32 weight vector ``b`` along the
        channels (a BatchNorm's shift, a bias): ``b`` added into the
        epilogue's bias row once, with the frozen weights (asked by
        ``Binary('add').lower``); None through a fused activation or codes."""
        at = self._out_vectors_at()
        vectors = inputs[at]
        if self.activation != "linear" or not self._plain() or \
                vectors.node is None or not isinstance(vectors.node.op, EpilogueVectors):
            return None
        made = vectors.node
        n = made.inputs[0].shape[0]
        if b.dtype != "float32" or b.ndim > inputs[0].ndim or b.shape[-1:] != (n,) or \
                any(d != 1 for d in b.shape[:-1]):
            return None
        b = reshape(b, (n,))
        bias = made.inputs[1] + b if len(made.inputs) > 1 else b
        new = list(inputs)
        new[at] = made.op(made.inputs[0], bias)
        return self(*new)

    def absorb_residual(self, inputs, r, ctx):
        """This op's output + ``r`` for a float32 tensor ``r`` of the output's
        shape (a residual block's sum), added in the epilogue after the bias
        (asked by ``Binary('add').lower``); the activation a relu after the
        sum brings applies after it."""
        if self.activation != "linear" or not self._plain() or not self._takes_residual() or \
                r.dtype != "float32" or ctx.is_weight(r):
            return None
        if tuple(r.shape) != tuple(self._shape(*inputs)):
            return None
        return self._with(residual_in=True)(*inputs, r)

    def absorb_activation(self, inputs, activation, ctx):
        """This op's output through ``activation`` (relu or relu6), applied in
        its epilogue (asked by ``Relu.lower``); None when it has one."""
        if self.activation != "linear" or self.out_codes is not None or \
                self.also_codes is not None:
            return None
        return self._with(activation=activation)(*inputs)

    def codes_wanted(self, position, ctx=None, outputs=None):
        """The (scale, zero point) of the codes this op would take for
        operand ``position`` in place of a float32 tensor, ANY_CODES for a
        residual operand (codes of whatever quantization), or None."""
        if not _Quantized.chaining:
            return None
        if position == 0 and not self.codes_in:
            return (self.in_scale, self.in_zero)
        if self.residual_in and self.residual_codes is None and \
                _Quantized.quantized_residual and outputs and outputs[0].node is not None and \
                position == len(outputs[0].node.inputs) - 1:
            return ANY_CODES
        return None

    def share(self, inputs, ctx):
        """The third walk of an inference plan: an input another op makes as
        codes of this op's quantization is read as those codes; and an output
        several ops read, some as codes of one quantization, is made as codes
        too, by the epilogue (only codes when no reader takes float32)."""
        if not (ctx.inference and _Quantized.chaining):
            return None
        op, inputs, changed = self, list(inputs), False
        made = ctx.codes.get(inputs[0])
        if made is not None and made[0] == op.codes_wanted(0):
            op, inputs[0], changed = op._with(codes_in=True), made[1], True
        made = ctx.codes.get(inputs[-1]) if op.residual_in else None
        if made is not None and op.residual_codes is None and _Quantized.quantized_residual:
            op, inputs[-1], changed = op._with(residual_codes=made[0]), made[1], True
        out = ctx.outputs[0]
        wants = ctx.codes_wanted(out)
        codes = [w for w in wants if w is not None and w != ANY_CODES]
        if op.out_codes is None and op.also_codes is None and codes and \
                all(w == codes[0] for w in codes):
            scale, zero = codes[0]
            if None not in wants and len(wants) == ctx.users(out):
                y = op._with(out_codes=(scale, zero))(*inputs)
                ctx.codes[y] = ((scale, zero), y)
                return [y]
            if op._dual_ok():
                y, q = op._with(also_codes=(scale, zero))(*inputs)
                ctx.codes[y] = ((scale, zero), q)
                return [y]
        return [op(*inputs)] if changed else None

    def _dual_ok(self):
        return True

    def kernel_epilogue(self, bias_axis, activation, out, residual=False, exact=False):
        """Whether the epilogue takes a per-channel bias add (into its bias row),
        a float32 residual of the output's shape (a product's epilogue, not
        the depthwise kernel's) and relu / relu6 (as its fused activation)
        after the product: only for an op without an activation of its own
        (a bias added after it cannot move inside it), never in an exact
        (training) fusion."""
        if exact or (bias_axis is not None and bias_axis != -1) or not self._plain() or \
                (residual and (out.dtype != "float32" or not self._takes_residual())):
            return False
        return self.activation == "linear"

    def compute_epilogue(self, inputs, bias, activation, residual=None):
        """The op's output + ``bias`` + ``residual``, then ``activation``, from
        its own epilogue; None when the arrays do not suit it."""
        at = self._out_vectors_at()
        if residual is not None and (not isinstance(residual, np.ndarray) or
                                     residual.dtype != np.float32):
            return None
        arrays = list(inputs)
        if bias is not None:
            vectors = arrays[at]
            bias = np.asarray(bias, dtype=np.float32).reshape(-1)
            if bias.shape[0] > vectors.shape[1]:
                return None
            merged = np.zeros((2, vectors.shape[1]), dtype=np.float32)
            merged[:vectors.shape[0]] = vectors
            merged[1, :bias.shape[0]] += bias
            arrays[at] = merged
        try:
            return self.compute(*arrays, activation=activation, residual=residual)[0]
        except _ResidualShape:
            return None

    def _quantized_input(self, x):
        x = np.asarray(x)
        if self.codes_in:
            return x
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        return qgemm.quantize(x, self.in_scale, self.in_zero)

    def grad(self, inputs, outputs, output_grads):
        _no_gradient(self.api)


class QuantizedDense(_Quantized):
    """y (..., units) = the int8 product of x (..., K) with a packed (K, units)
    kernel, dequantized to float32."""

    api = "quantized_dense"

    def __init__(self, units, in_scale, in_zero, activation="linear"):
        super().__init__(in_scale, in_zero, activation)
        self.units = int(units)

    def _shape(self, x, packed, vectors):
        if x.ndim < 1:
            raise ValueError("%s: expected an input with a feature axis, got a scalar"
                             % self.api)
        self._check_operands(x, packed, vectors, x.shape[-1], self.units)
        return tuple(x.shape[:-1]) + (self.units,)

    def _compute(self, x, packed, vectors, activation=None, residual=None):
        q = self._quantized_input(x)
        y = self._run(q, packed, vectors, activation, residual)
        if y is not None:
            return y
        k = q.shape[-1]
        if packed.shape[0] != _packed_bytes(k, self.units):
            raise ValueError("%s: the input has %d features, the packed kernel is %s"
                             % (self.api, k, qgemm.packed_shape(packed)))
        shape = q.shape[:-1] + (self.units,)
        call = self._product_call(packed, vectors, activation)
        self._remember_run(q, packed, vectors, activation, call, (-1, k), shape)
        res = None if residual is None else _residual_rows(residual, shape)
        return self._shaped(call(q.reshape(-1, k), res), shape)


def _patches(q, window, strides, dilation, pads, out, pad_value):
    """The uint8 patch matrix of a channels_last convolution of any rank
    (taps in the kernel's row order, channels fastest), in NumPy: the 3-D
    convolution's, which qgemm.im2col (2-D) does not make."""
    q = np.pad(q, [(0, 0)] + list(pads) + [(0, 0)], constant_values=pad_value)
    taps = []
    for tap in np.ndindex(*window):
        index = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                      for t, d, o, s in zip(tap, dilation, out, strides))
        taps.append(q[(slice(None),) + index])
    return np.stack(taps, axis=-2).reshape(-1, len(taps) * q.shape[-1])


# (op geometry, input spatial sizes) -> (output sizes, pads): a batch-1 int8
# model recomputed them at every step of every call, about a tenth of its
# time in Python
_WINDOWS = {}


def _window(op, sizes):
    """(output spatial sizes, pads) of ``op``'s window (QuantizedConv,
    QuantizedDepthwiseConv) over an input of spatial ``sizes``, worked out
    once per geometry and shape (raising as ``op._out_spatial`` does)."""
    key = (type(op), op.kernel_size, op.strides, op.dilation, op.padding,
           getattr(op, "extra_pads", None), tuple(sizes))
    found = _WINDOWS.get(key)
    if found is None:
        found = (tuple(op._out_spatial(sizes)), tuple(op._pads(sizes)))
        _remember(_WINDOWS, key, found)
    return found


def _remember(cache, key, value):
    if len(cache) >= 1024:
        cache.clear()
    cache[key] = value


# (packed kernel, epilogue vectors, epilogue settings) -> qgemm.ProductCall,
# keyed by the arrays' ids; a call is used only for the arrays it was made
# for (``matches``), so a freed array's id taken by a new one is no hazard
_PRODUCT_CALLS = {}


def _product_call(packed, vectors, zero, activation, scale, out_zero, keep_float):
    key = (id(packed), id(vectors), zero, activation, scale, out_zero, keep_float)
    call = _PRODUCT_CALLS.get(key)
    if call is None or not call.matches(packed, vectors):
        call = qgemm.ProductCall(packed, vectors, zero, activation, scale, out_zero,
                                 keep_float)
        _remember(_PRODUCT_CALLS, key, call)
    return call


# the same for qgemm.DepthwiseCall, keyed also by the channels and the window
_DEPTHWISE_CALLS = {}


# (K, N) -> bytes of the packed (K, N) kernel
_PACKED_BYTES = {}


def _packed_bytes(k, n):
    found = _PACKED_BYTES.get((k, n))
    if found is None:
        found = qgemm.packed_size(k, n)
        _remember(_PACKED_BYTES, (k, n), found)
    return found


# (conv geometry, input shape, filters) -> _ConvCall
_CONV_CALLS = {}


class _ConvCall:
    """What a QuantizedConv does with an input of one shape, worked out once:
    the output shape, the pads, the packed kernel's size in bytes and whether
    the convolution is a plain product of the input's rows (1x1, stride 1,
    no padding). Per call the rest of the op's Python is a few µs in a
    batch-1 step of 10-20 µs."""

    __slots__ = ("out_shape", "pads", "k", "packed_bytes", "product")

    def __init__(self, op, shape):
        b, c = shape[0], shape[-1]
        out, pads = _window(op, shape[1:-1])
        self.out_shape = (b,) + out + (op.filters,)
        self.pads = list(pads)
        self.k = c * math.prod(op.kernel_size)
        self.packed_bytes = _packed_bytes(self.k, op.filters)
        self.product = op.kernel_size == (1,) * op.rank and \
            op.strides == (1,) * op.rank and all(p == (0, 0) for p in pads)


def _conv_call(op, shape):
    key = (op.rank, op.kernel_size, op.strides, op.dilation, op.padding, op.extra_pads,
           op.filters, shape)
    found = _CONV_CALLS.get(key)
    if found is None:
        found = _ConvCall(op, shape)
        _remember(_CONV_CALLS, key, found)
    return found


class _ZeroPadded:
    """The zero padding an int8 window op takes in from a Pad before it:
    ``extra_pads``, (before, after) per spatial axis on top of the op's
    ``padding``, which the kernels fill with the code of 0.0."""

    extra_pads = None

    def _padded(self, sizes):
        if self.extra_pads is None:
            return tuple(sizes)
        return tuple(None if n is None else n + b + a
                     for n, (b, a) in zip(sizes, self.extra_pads))

    def _with_extra(self, pads):
        if self.extra_pads is None:
            return list(pads)
        return [(b + b0, a + a0) for (b, a), (b0, a0) in zip(pads, self.extra_pads)]

    def rewrite(self, inputs, ctx):
        """In an inference plan, a zero padding of the input's spatial axes
        (a ZeroPadding2D before a strided convolution: ResNet's stem,
        MobileNet's depthwise layers) goes into the op's pads."""
        if not ctx.inference:
            return None
        made = ctx.producer(inputs[0])
        spatial = spatial_zero_padding(made, True, len(self.kernel_size))
        if spatial is None:
            return None
        extra = tuple(self._with_extra(spatial))
        return [self._with(extra_pads=extra)(made[1][0], *inputs[1:])]


class QuantizedConv(_ZeroPadded, _Quantized):
    """y = the int8 convolution of a channels_last x (N, W, C),
    (N, H, W, C) or (N, D, H, W, C) with a packed kernel (kernel_size +
    (C, filters)), dequantized to float32. Padding 'valid', 'same' or
    'causal' (1-D). The 3-D convolution's patches are formed in NumPy."""

    api = "quantized_conv"

    def __init__(self, rank, filters, kernel_size, strides, dilation, padding, in_scale,
                 in_zero, activation="linear", extra_pads=None):
        super().__init__(in_scale, in_zero, activation)
        self.extra_pads = None if extra_pads is None else \
            tuple((int(b), int(a)) for b, a in extra_pads)
        if rank not in (1, 2, 3):
            raise ValueError("%s: rank must be 1, 2 or 3, got %r" % (self.api, rank))
        if padding not in ("valid", "same", "causal") or (padding == "causal" and rank != 1):
            raise ValueError("%s: padding must be 'valid' or 'same' (or 'causal' in 1-D), "
                             "got %r" % (self.api, padding))
        self.rank = rank
        self.filters = int(filters)
        self.kernel_size = tuple(int(v) for v in kernel_size)
        self.strides = tuple(int(v) for v in strides)
        self.dilation = tuple(int(v) for v in dilation)
        self.padding = padding
        for name in ("kernel_size", "strides", "dilation"):
            value = getattr(self, name)
            if len(value) != rank or min(value) < 1:
                raise ValueError("%s: %s must be %d integers >= 1, got %r"
                                 % (self.api, name, rank, value))

    def _out_spatial(self, sizes):
        out = []
        sizes = self._padded(sizes)
        for n, k, s, d in zip(sizes, self.kernel_size, self.strides, self.dilation):
            if n is None:
                out.append(None)
                continue
            if self.padding == "valid" and n < (k - 1) * d + 1:
                raise ValueError("%s: the kernel window %s (dilation %s) is larger than the "
                                 "input's spatial shape %s with padding='valid'"
                                 % (self.api, self.kernel_size, self.dilation, tuple(sizes)))
            out.append(conv_utils.conv_output_length(n, k, s, d, self.padding))
        return tuple(out)

    def _pads(self, sizes):
        return self._with_extra([conv_utils.conv_pads(n, kk, s, d, self.padding)
                                 for n, kk, s, d in zip(self._padded(sizes), self.kernel_size,
                                                        self.strides, self.dilation)])

    def _shape(self, x, packed, vectors):
        if x.ndim != self.rank + 2:
            raise ValueError("%s: expected a %d-D input (batch, %sspatial, channels), got "
                             "shape %s" % (self.api, self.rank + 2,
                                           "" if self.rank == 1 else "%d " % self.rank,
                                           x.shape))
        c = x.shape[-1]
        self._check_operands(x, packed, vectors,
                             None if c is None else c * int(np.prod(self.kernel_size)),
                             self.filters)
        out = self._out_spatial(x.shape[1:-1])
        return (x.shape[0],) + out + (self.filters,)

    def _compute(self, x, packed, vectors, activation=None, residual=None):
        q = self._quantized_input(x)
        y = self._run(q, packed, vectors, activation, residual)
        if y is not None:
            return y
        call = _conv_call(self, q.shape)
        if packed.shape[0] != call.packed_bytes:
            raise ValueError("%s: an input of %d channels and a %s window need a (%d, %d) "
                             "kernel, the packed one is %s"
                             % (self.api, q.shape[-1], self.kernel_size, call.k, self.filters,
                                qgemm.packed_shape(packed)))
        out_shape = call.out_shape
        res = None if residual is None else _residual_rows(residual, out_shape)
        if call.product:
            # a 1x1 convolution is a product as it is
            product = self._product_call(packed, vectors, activation)
            self._remember_run(q, packed, vectors, activation, product, (-1, q.shape[-1]),
                               out_shape)
            y = product(q.reshape(-1, q.shape[-1]), res)
        else:
            y = self._window_product(q, call, packed, vectors, activation, res)
        if type(y) is tuple:
            return tuple(a.reshape(out_shape) for a in y)
        return y.reshape(out_shape)

    def join_reader(self, reader, ins, reader_ins):
        """A max or min over the positions of a 1-D convolution's output as one
        step with it (``graph/optimize.py``, ``join_sole_readers``)."""
        return QuantizedConvExtreme.join(self, reader, ins)

    def _window_product(self, q, call, packed, vectors, activation, res):
        b, pads, out = q.shape[0], call.pads, call.out_shape[1:-1]
        if self.rank == 3:
            a = _patches(q, self.kernel_size, self.strides, self.dilation, pads, out,
                         self.in_zero)
            return self._product(a, packed, vectors, activation, residual=res)
        if self.rank == 1 and b == 1 and self.strides == (1,) and self.dilation == (1,):
            # one sequence's windows are overlapping rows of it: kw * C bytes
            # every C, read in place
            c = q.shape[-1]
            qp = np.pad(q[0], (pads[0], (0, 0)), constant_values=self.in_zero) \
                if pads[0] != (0, 0) else np.ascontiguousarray(q[0])
            # (as_strided makes the same view in ten times the time)
            a = np.ndarray((out[0], call.k), np.uint8, qp, 0, (c, 1))
            return self._product(a, packed, vectors, activation, residual=res)
        # the patch rows formed a block at a time by the kernel
        if self.rank == 1:
            q, window, strides, dilation, pads = (
                q[:, None], (1,) + self.kernel_size, (1,) + self.strides,
                (1,) + self.dilation, [(0, 0)] + pads)
        else:
            window, strides, dilation = self.kernel_size, self.strides, self.dilation
        scale, zero = self._codes_out()
        return qgemm.conv(q, packed, vectors, window, strides, dilation, pads, self.in_zero,
                          activation or self.activation, scale, zero, res,
                          self.also_codes is not None)


class PackDepthwise(Op):
    """The packed form of an int8 depthwise kernel (kh, kw, C, M), its
    C * M output channels in Keras's order (channel c, multiplier m at
    c * M + m): ``qgemm.pack_depthwise``."""

    api = "quantized_weights"

    def infer(self, w):
        if w.dtype != "int8" or w.ndim != 4:
            raise ValueError("%s: a depthwise kernel must be int8 (kh, kw, C, M), got %s %s"
                             % (self.api, w.dtype, w.shape))
        _known(self.api, "kernel shape", w.shape)
        kh, kw, c, m = w.shape
        if kh * kw > qgemm.MAX_K:
            raise ValueError("%s: a window of %d taps is above the %d the int32 sums allow"
                             % (self.api, kh * kw, qgemm.MAX_K))
        width = -(-(c * m) // qgemm.PANEL_COLUMNS) * qgemm.PANEL_COLUMNS
        return [((kh * kw + 1 + kh, width), "int32")]

    def compute(self, w):
        w = np.asarray(w)
        return (qgemm.pack_depthwise(w.reshape(w.shape[0], w.shape[1], -1)),)

    def grad(self, inputs, outputs, output_grads):
        _no_gradient(self.api)


class QuantizedDepthwiseConv(_ZeroPadded, _Quantized):
    """y = the int8 depthwise convolution of a channels_last x (N, H, W, C)
    with a packed kernel (``PackDepthwise``, depth multiplier M: each input
    channel feeds M output channels), dequantized to float32 (N, OH, OW,
    C * M); padding 'valid' or 'same'.

    With ``pointwise`` (a separable convolution) the depthwise result is
    requantized in the depthwise epilogue to uint8 codes of
    (``mid_scale``, ``mid_zero``) and multiplied by a packed (C * M,
    filters) kernel in int8: operands (x, dw_packed, dw_vectors, pw_packed,
    pw_vectors), the bias and activation in the second epilogue."""

    api = "quantized_depthwise_conv"

    def _out_vectors_at(self):
        return 2 if self.pointwise is None else 4

    def __init__(self, kernel_size, strides, dilation, padding, multiplier, in_scale, in_zero,
                 activation="linear", pointwise=None, mid_scale=None, mid_zero=None,
                 extra_pads=None):
        super().__init__(in_scale, in_zero, activation)
        # zeros around the spatial axes on top of ``padding``: a zero padding
        # before the op, taken into it by an inference plan (``rewrite``)
        self.extra_pads = None if extra_pads is None else \
            tuple((int(b), int(a)) for b, a in extra_pads)
        self.kernel_size = tuple(int(v) for v in kernel_size)
        self.strides = tuple(int(v) for v in strides)
        self.dilation = tuple(int(v) for v in dilation)
        if padding not in ("valid", "same"):
            raise ValueError("%s: padding must be 'valid' or 'same', got %r"
                             % (self.api, padding))
        for name in ("kernel_size", "strides", "dilation"):
            value = getattr(self, name)
            if len(value) != 2 or min(value) < 1:
                raise ValueError("%s: %s must be 2 integers >= 1, got %r"
                                 % (self.api, name, value))
        self.padding = padding
        self.multiplier = int(multiplier)
        self.pointwise = None if pointwise is None else int(pointwise)
        if self.pointwise is not None:
            self.mid_scale = float(mid_scale)
            self.mid_zero = int(mid_zero)

    def _out_spatial(self, sizes):
        return tuple(None if n is None else
                     conv_utils.conv_output_length(n, k, s, d, self.padding)
                     for n, k, s, d in zip(self._padded(sizes), self.kernel_size,
                                           self.strides, self.dilation))

    def _pads(self, sizes):
        return self._with_extra([conv_utils.conv_pads(n, k, s, d, self.padding)
                                 for n, k, s, d in zip(self._padded(sizes), self.kernel_size,
                                                       self.strides, self.dilation)])

    def _shape(self, x, packed, vectors, pw_packed=None, pw_vectors=None):
        if x.ndim != 4:
            raise ValueError("%s: expected a 4-D input (batch, 2 spatial, channels), got "
                             "shape %s" % (self.api, x.shape))
        self._check_input(x)
        if packed.dtype != "int32" or packed.ndim != 2 or vectors.dtype != "float32":
            raise ValueError("%s: expected packed depthwise weights (PackDepthwise) and "
                             "epilogue vectors, got %s %s and %s"
                             % (self.api, packed.dtype, packed.shape, vectors.dtype))
        if (pw_packed is None) != (self.pointwise is None):
            raise ValueError("%s: the pointwise operands and the op's pointwise width go "
                             "together" % self.api)
        c = x.shape[-1]
        width = self.pointwise if self.pointwise is not None else \
            (None if c is None else c * self.multiplier)
        for n, k, s, d in zip(self._padded(x.shape[1:3]), self.kernel_size, self.strides,
                              self.dilation):
            if n is not None and self.padding == "valid" and n < (k - 1) * d + 1:
                raise ValueError("%s: the kernel window %s (dilation %s) is larger than the "
                                 "input's spatial shape %s with padding='valid'"
                                 % (self.api, self.kernel_size, self.dilation, x.shape[1:3]))
        return (x.shape[0],) + self._out_spatial(x.shape[1:3]) + (width,)

    def _depthwise(self, q, packed, vectors, pads, activation, scale, zero):
        return self._depthwise_call(q, packed, vectors, pads, activation, scale, zero)(q)

    def _depthwise_call(self, q, packed, vectors, pads, activation, scale, zero):
        key = (id(packed), id(vectors), q.shape[-1], self.in_zero, self.kernel_size,
               self.strides, self.dilation, pads, activation, scale, zero)
        call = _DEPTHWISE_CALLS.get(key)
        if call is None or not call.matches(packed, vectors):
            call = qgemm.DepthwiseCall(packed, vectors, q.shape[-1], self.in_zero,
                                       self.kernel_size, self.strides, self.dilation, pads,
                                       activation, scale, zero)
            _remember(_DEPTHWISE_CALLS, key, call)
        return call

    def _takes_residual(self):
        return self.pointwise is not None

    def _dual_ok(self):
        return self.pointwise is not None

    def _compute(self, x, packed, vectors, pw_packed=None, pw_vectors=None, activation=None,
                 residual=None):
        q = self._quantized_input(x)
        if self.multiplier > 1:
            q = np.repeat(q, self.multiplier, axis=-1)
        if self.pointwise is None:
            y = self._run(q, packed, vectors, activation, None)
            if y is not None:
                return y
        pads = _window(self, q.shape[1:3])[1]
        given, activation = activation, activation or self.activation
        if self.pointwise is None:
            scale, zero = self.out_codes or (None, None)
            call = self._depthwise_call(q, packed, vectors, pads, activation, scale, zero)
            y = call(q)
            self._remember_run(q, packed, vectors, given, call, q.shape, y.shape)
            return y
        mid = self._depthwise(q, packed, vectors, pads, "linear", self.mid_scale, self.mid_zero)
        res = _residual_rows(residual, mid.shape[:-1] + (self.pointwise,))
        y = self._product(mid.reshape(-1, mid.shape[-1]), pw_packed, pw_vectors, activation,
                          zero=self.mid_zero, residual=res)
        return self._shaped(y, mid.shape[:-1] + (self.pointwise,))
