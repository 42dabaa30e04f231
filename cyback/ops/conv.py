"""Convolution ops: ordinary (conv), depthwise and locally connected (local)
convolutions, each as three ops that are one another's gradients.

    Conv(x, k)             -> y   the forward pass
    ConvInput(dy, k[, s])  -> dx  its input gradient; also the transposed conv
    ConvKernel(x, dy)      -> dk  its kernel gradient

All three are linear in each argument, and the gradient of each is one of the
others (see ``grad``), so every second derivative (x, kernel, mixed) exists.

The ``family`` parameter picks the kernels from ``cyback.kernels``:
'conv' (kernel (*k, C, F)), 'depthwise' (kernel (*k, C, M), output C*M
channels) and 'local' (kernel (P, K, F): one (K, F) matrix per output
position, 'valid' padding, no dilation; its window is ``kernel_size``).

Pads are worked out when the op runs, from the actual input size, so 'same'
and 'causal' work with spatial sizes unknown while building.
"""
import numpy as np

from cyback.graph.op import Op
from cyback.graph.shapes import format_shape
from cyback.kernels import conv as _conv
from cyback.kernels import conv_utils
from cyback.kernels import depthwise as _dw
from cyback.kernels import linalg as _linalg
from cyback.kernels import local as _local
from cyback.ops import shape as shp
from cyback.ops.depthwise_block import BlockStage
from cyback.ops.linalg import PackPanels
from cyback.ops.manip import spatial_zero_padding


class Geometry(object):
    """What the three ops of one convolution share: a plain value (tuples and
    strings only) so that ops built from the same call merge under CSE."""

    _FIELDS = ("api", "family", "rank", "strides", "dilation", "padding", "channels_last",
               "kernel_size", "local_out", "extra_pads")
    __slots__ = _FIELDS + ("_checked", "_calls", "_last", "_packed_calls")

    def __init__(self, api, family, rank, strides, dilation, padding, channels_last,
                 kernel_size=None, local_out=None, extra_pads=None):
        self.api = api
        self.family = family
        self.rank = rank
        self.strides = tuple(strides)
        self.dilation = tuple(dilation)
        self.padding = padding
        self.channels_last = bool(channels_last)
        self.kernel_size = None if kernel_size is None else tuple(kernel_size)
        # local only: the output positions (Keras's output_shape), known even
        # when the input's spatial sizes are not
        self.local_out = None if local_out is None else tuple(local_out)
        # zeros around the input's spatial axes, (before, after) per axis, on
        # top of what ``padding`` adds: a zero-padding op before the
        # convolution, taken into it by an inference plan (Conv.rewrite) so
        # that the padded copy of the input is never made
        self.extra_pads = None if extra_pads is None else \
            tuple((int(b), int(a)) for b, a in extra_pads)
        # (x shape, kernel shape) -> (pads, output shape), for shapes already
        # checked: a batch-1 convolution is over in microseconds, checking it
        # is not
        self._checked = {}
        # (x shape, kernel shape, dtype, bias?, residual?, activation) ->
        # the kernel module's prepared forward call for these arguments
        self._calls = {}
        self._last = None
        # the same key -> the packed kernel's prepared call, or None where
        # its rule does not take the shapes (forward_packed)
        self._packed_calls = {}

    def __getstate__(self):
        # the memos are rebuilt on use (prepared kernel calls do not pickle)
        return self.as_tuple()

    def __setstate__(self, state):
        self.extra_pads = None      # absent from the state of older pickles
        for name, value in zip(self._FIELDS, state):
            setattr(self, name, value)
        self._checked = {}
        self._calls = {}
        self._last = None
        self._packed_calls = {}

    def as_tuple(self):
        return tuple(getattr(self, s) for s in self._FIELDS)

    def __eq__(self, other):
        return isinstance(other, Geometry) and self.as_tuple() == other.as_tuple()

    def __hash__(self):
        return hash(self.as_tuple())

    def __repr__(self):
        return "Geometry%r" % (self.as_tuple(),)

    # -------------------------------------------------------------- layout

    def spatial(self, shape):
        return tuple(shape[1:-1]) if self.channels_last else tuple(shape[2:])

    def channels(self, shape):
        return shape[-1] if self.channels_last else shape[1]

    def assemble(self, n, spatial, c):
        return (n,) + tuple(spatial) + (c,) if self.channels_last else (n, c) + tuple(spatial)

    def with_extra_pads(self, pads):
        """This geometry with ``pads`` more zeros around the spatial axes."""
        if self.extra_pads is not None:
            pads = tuple((b + b0, a + a0) for (b, a), (b0, a0) in zip(pads, self.extra_pads))
        return Geometry(*(self.as_tuple()[:-1] + (pads,)))

    def _padded(self, sizes):
        """Spatial sizes once the extra pads are added."""
        if self.extra_pads is None:
            return tuple(sizes)
        return tuple(None if n is None else n + b + a for n, (b, a) in zip(sizes, self.extra_pads))

    def window(self, kshape):
        """The kernel's spatial extent."""
        return self.kernel_size if self.family == "local" else tuple(kshape[:self.rank])

    def in_channels(self, kshape):
        """Input channels the kernel expects (None when it cannot say)."""
        if self.family == "local":
            k = int(np.prod(self.kernel_size))
            return None if kshape[1] is None or k == 0 else kshape[1] // k
        return kshape[-2]

    def out_channels(self, kshape):
        if self.family == "depthwise":
            a, b = kshape[-2], kshape[-1]
            return None if a is None or b is None else a * b
        return kshape[-1]

    # -------------------------------------------------------------- shapes

    def out_spatial(self, sizes, kshape):
        """Static output sizes (None where unknown); raises when a known input
        is too small for a 'valid' window."""
        win = self.window(kshape)
        sizes = self._padded(sizes)
        out = []
        for i, (n, k, s, d) in enumerate(zip(sizes, win, self.strides, self.dilation)):
            if n is None or k is None:
                out.append(None)
                continue
            span = (k - 1) * d + 1
            if self.padding == "valid" and n < span:
                raise ValueError("%s: the %s window %s is larger than the input's spatial "
                                 "shape %s with padding='valid'"
                                 % (self.api, "dilated kernel" if d > 1 else "kernel",
                                    format_shape(win), format_shape(sizes)))
            out.append(conv_utils.conv_output_length(n, k, s, d, self.padding))
        return tuple(out)

    def pads(self, sizes, kshape):
        win = self.window(kshape)
        pads = tuple(conv_utils.conv_pads(n, k, s, d, self.padding)
                     for n, k, s, d in zip(self._padded(sizes), win, self.strides,
                                           self.dilation))
        if self.extra_pads is None:
            return pads
        return tuple((b + b0, a + a0) for (b, a), (b0, a0) in zip(pads, self.extra_pads))

    def check(self, xshape, kshape):
        """Channel and local-kernel consistency of an input and a kernel shape."""
        c, kc = self.channels(xshape), self.in_channels(kshape)
        if self.family == "local":
            feat = None if c is None else c * int(np.prod(self.kernel_size))
            if feat is not None and kshape[1] is not None and kshape[1] != feat:
                raise ValueError("%s: the kernel %s must have feature_dim = prod(kernel_size) "
                                 "* channels = %d for kernel_size %s and input %s"
                                 % (self.api, format_shape(kshape), feat, self.kernel_size,
                                    format_shape(xshape)))
            return
        if c is not None and kc is not None and c != kc:
            raise ValueError("%s: the kernel %s expects %d input channels but the input %s has "
                             "%d (data_format=%s)"
                             % (self.api, format_shape(kshape), kc, format_shape(xshape), c,
                                "channels_last" if self.channels_last else "channels_first"))

    def y_shape(self, xshape, kshape):
        self.check(xshape, kshape)
        out = self.out_spatial(self.spatial(xshape), kshape)
        if self.family == "local" and self.local_out is not None:
            if None not in out and out != self.local_out:
                raise ValueError("%s: the input %s with kernel_size %s and strides %s gives "
                                 "output positions %s, but the kernel %s / output_shape are "
                                 "for %s"
                                 % (self.api, format_shape(xshape), self.kernel_size, self.strides,
                                    format_shape(out), format_shape(kshape),
                                    format_shape(self.local_out)))
            out = self.local_out
        return self.assemble(xshape[0], out, self.out_channels(kshape))

    # -------------------------------------------------------------- kernels

    def forward(self, x, k, bias=None, activation=None, residual=None):
        """The convolution; for conv and depthwise, optionally + a per-channel
        ``bias`` (for conv, then + a ``residual`` shaped like the output) and
        then ``activation`` ('relu', 'relu6') inside the kernel."""
        y = self.forward_again(x, k, bias, activation, residual)
        if y is not None:
            return y
        if self.family != "local" and x.dtype.char in "fd" and k.dtype == x.dtype and \
                (residual is None or self.family == "conv") and 0 not in x.shape:
            key = (x.shape, k.shape, x.dtype, bias is None, residual is None, activation)
            call = self._calls.get(key)
            if call is None:
                call = self._forward_call(x, k, bias, residual, activation)
                self._calls[key] = call
            conv = self.family == "conv"
            self._last = (x.shape, x.dtype, activation, bias is None, residual is None, call,
                          conv)
            return call(x, k, bias, residual) if conv else call(x, k, bias)
        x, k, dt = _operands(x, k)
        pads = self._checked.get((x.shape, k.shape))
        pads = self._check_forward(x.shape, k.shape) if pads is None else pads[0]
        if self.family == "conv":
            y = _conv.conv_forward(x, k, self.strides, self.dilation, pads,
                                   self.channels_last, bias=bias, residual=residual,
                                   activation=activation)
        elif self.family == "depthwise":
            if 0 in x.shape:
                return np.zeros(self.y_shape(x.shape, k.shape), dt)
            y = _dw.depthwise_forward(x, k, self.strides, self.dilation, pads,
                                      self.channels_last, bias, activation)
        else:
            y = _local.local_forward(x, k, self.kernel_size, self.strides, self.channels_last)
        return y.astype(dt, copy=False)

    def forward_again(self, x, k, bias=None, activation=None, residual=None):
        """forward through the last prepared call when x has its shape and
        dtype and the epilogue is the same kind, else None: a plan's step
        calls with the same arguments each time, and a key and a lookup
        would be a large part of what a batch-1 step spends around its
        kernel. The
        call checks the arrays itself (conv_forward takes any that do not
        fit)."""
        last = self._last
        if last is None or x.shape != last[0] or x.dtype != last[1] or \
                activation != last[2] or (bias is None) != last[3] or \
                (residual is None) != last[4]:
            return None
        return last[5](x, k, bias, residual) if last[6] else last[5](x, k, bias)

    def epilogue_fits(self, x, k, bias, residual):
        """Whether a kernel can take this bias (1-D) and residual in its
        epilogue: float arrays of x's dtype, a bias per output channel, a
        residual of the output's shape, and a non-empty x."""
        dt = x.dtype
        return k.dtype == dt and dt.char in "fd" and 0 not in x.shape and \
            (bias is None or (bias.dtype == dt and
                              bias.size == self.out_channels(k.shape))) and \
            (residual is None or (residual.dtype == dt and
                                  residual.shape == self.forward_shape(x.shape, k.shape)))

    def forward_packed(self, x, k, packed, bias=None, activation=None, residual=None):
        """forward with the kernel also given packed (``PackedConv``): the
        packed product where its rule takes these shapes
        (kernels/conv_packed.pxi), else ``forward``."""
        key = (x.shape, x.dtype, k.shape, bias is None, residual is None, activation)
        call = self._packed_calls.get(key, False)
        if call is False:
            call = None
            if self.family == "conv" and x.dtype == np.float32 and k.dtype == x.dtype and \
                    0 not in x.shape:
                pads = self._check_forward(x.shape, k.shape)
                call = _conv.packed_forward_call(x.shape, k.shape, self.strides, self.dilation,
                                                 pads, self.channels_last, x.dtype,
                                                 bias is not None, residual is not None,
                                                 activation)
            if len(self._packed_calls) >= 64:
                self._packed_calls.clear()
            self._packed_calls[key] = call
        if call is not None:
            # a strided or unaligned array runs the packed kernel on a copy:
            # another kernel would sum in another order, and the same values
            # must give the same bits whatever their layout
            if not x.flags.carray:
                x = np.require(x, requirements=("C", "A"))
            if residual is not None and not residual.flags.carray:
                residual = np.require(residual, requirements=("C", "A"))
            y = call(x, packed, bias, residual)
            if y is not None:
                return y
        return self.forward(x, k, bias, activation, residual)

    def prepared(self, x, k, bias=None, activation=None, residual=None):
        """The prepared kernel call ``forward`` runs these arrays on (after a
        run on them made it), or None: ``call(x, k, bias, residual)`` for
        conv, ``call(x, k, bias)`` for depthwise."""
        if self.family == "local" or x.dtype.char not in "fd" or k.dtype != x.dtype or \
                (residual is not None and self.family != "conv") or 0 in x.shape:
            return None
        return self._calls.get((x.shape, k.shape, x.dtype, bias is None, residual is None,
                                activation))

    def packed_prepared(self, x, k, bias=None, activation=None, residual=None):
        """The packed product's prepared call ``forward_packed`` runs these
        arrays on, ``call(x, packed, bias, residual)``, or None (none made
        yet, or the packed rule declines the shapes)."""
        return self._packed_calls.get((x.shape, x.dtype, k.shape, bias is None,
                                       residual is None, activation))

    def _forward_call(self, x, k, bias, residual, activation):
        """The kernel's prepared call for these arguments' shapes, after the
        checks (the Keras name in their errors)."""
        pads = self._check_forward(x.shape, k.shape)
        if len(self._calls) >= 64:
            self._calls.clear()
        if self.family == "depthwise":
            return _dw.forward_call(x.shape, k.shape, self.strides, self.dilation, pads,
                                    self.channels_last, x.dtype, bias is not None, activation)
        return _conv.forward_call(x.shape, k.shape, self.strides, self.dilation, pads,
                                  self.channels_last, x.dtype, bias is not None,
                                  residual is not None, activation)

    def _check_forward(self, xshape, kshape):
        """The pads of a forward pass, after the checks; remembered with the
        output shape."""
        sizes = self.spatial(xshape)
        self.check(xshape, kshape)
        self._check_run(sizes, kshape)
        pads = self.pads(sizes, kshape)
        if len(self._checked) >= 64:
            self._checked.clear()
        self._checked[(xshape, kshape)] = (pads, self.y_shape(xshape, kshape))
        return pads

    def forward_shape(self, xshape, kshape):
        """The output shape of a forward pass on these run-time shapes."""
        known = self._checked.get((xshape, kshape))
        if known is None:
            self._check_forward(xshape, kshape)
            known = self._checked[(xshape, kshape)]
        return known[1]

    def backward_input(self, dy, k, xshape):
        dy, k, dt = _operands(dy, k)
        xshape = tuple(int(d) for d in xshape)
        sizes = self.spatial(xshape)
        self._check_run(sizes, k.shape)
        want = self.y_shape(xshape, k.shape)
        if dy.shape != want:
            raise ValueError("%s: the input has shape %s but a convolution producing %s "
                             "(kernel %s, strides %s, padding %r) takes inputs of shape %s"
                             % (self.api, format_shape(dy.shape), format_shape(xshape),
                                format_shape(k.shape), self.strides, self.padding,
                                format_shape(want)))
        if self.family == "conv":
            dx = _conv.conv_backward_input(dy, k, xshape, self.strides, self.dilation,
                                           self.pads(sizes, k.shape), self.channels_last)
        elif self.family == "depthwise":
            if 0 in xshape or dy.size == 0:
                return np.zeros(xshape, dt)
            dx = _dw.depthwise_backward_input(dy, k, xshape, self.strides, self.dilation,
                                              self.pads(sizes, k.shape), self.channels_last)
        else:
            dx = _local.local_backward_input(dy, k, xshape, self.kernel_size, self.strides,
                                             self.channels_last)
        return dx.astype(dt, copy=False)

    def backward_kernel(self, x, dy, kshape):
        x, dy, dt = _operands(x, dy)
        sizes = self.spatial(x.shape)
        self._check_run(sizes, kshape)
        if self.family == "conv":
            dk = _conv.conv_backward_kernel(x, dy, kshape, self.strides, self.dilation,
                                            self.pads(sizes, kshape), self.channels_last)
        elif self.family == "depthwise":
            if x.size == 0 or dy.size == 0:
                return np.zeros(kshape, dt)
            dk = _dw.depthwise_backward_kernel(x, dy, kshape, self.strides, self.dilation,
                                               self.pads(sizes, kshape), self.channels_last)
        else:
            dk = _local.local_backward_kernel(x, dy, kshape, self.kernel_size, self.strides,
                                              self.channels_last)
        return dk.astype(dt, copy=False)

    def _check_run(self, sizes, kshape):
        # Sizes unknown when building are checked here, with the Keras name.
        self.out_spatial(sizes, kshape)


def _operands(a, b):
    """Two float arrays as the kernels want them: C-contiguous and writable
    (Cython memoryviews reject read-only buffers, and Constants are read-only),
    float16 widened to float32. Returns them and the result dtype."""
    dt = a.dtype
    work = np.float32 if dt == np.float16 else dt
    return _writable(a, work), _writable(b, work), dt


def _writable(a, dtype):
    if a.dtype != dtype or not a.flags.c_contiguous or not a.flags.writeable:
        return np.array(a, dtype=dtype, order="C")
    return a


def _static_or_tensor(t):
    """A tensor's shape as the ops take it: a static tuple when fully known,
    else (static with None, run-time shape tensor)."""
    if all(d is not None for d in t.shape):
        return tuple(t.shape), None
    return tuple(t.shape), shp.shape_of(t)


# ------------------------------------------------------------------ ops

class Conv(Op):
    """y = conv(x, kernel)."""

    # compute returns a new array, so an element-wise epilogue may run on it
    # in place (graph/fusion.py)
    fresh_output = True
    epilogue_host = True

    def __init__(self, geom):
        self.geom = geom
        self.api = geom.api

    def infer(self, x, k):
        return [(self.geom.y_shape(x.shape, k.shape), x.dtype)]

    def compute(self, x, k):
        return (self.geom.forward(x, k),)

    def rewrite(self, inputs, ctx):
        """In an inference plan, a zero padding of the input's spatial axes
        (Keras's ZeroPadding before a strided convolution: MobileNetV2,
        ResNet50) goes into the convolution's own pads: the kernels take any
        (before, after) pads, and the padded copy costs a pass over a large
        tensor."""
        g = self.geom
        if not ctx.inference or g.family not in ("conv", "depthwise"):
            return None
        absorbed = _absorbed_pads(g, ctx.producer(inputs[0]))
        if absorbed is None:
            return None
        g, x = absorbed
        return [Conv(g)(x, inputs[1])]

    def lower(self, inputs, ctx):
        """In an inference plan, after the rewrites (BatchNorm folded into
        the kernel, paddings taken in), a float32 channels_last kernel is
        packed once: see PackedConv."""
        if not ctx.inference or ctx.is_weight(inputs[0]):
            return None
        return PackedConv.replacing(self.geom, inputs[0], inputs[1], ctx)

    def kernel_epilogue(self, bias_axis, activation, out, residual=False, exact=False):
        """Whether the kernel can add a per-channel bias (on ``bias_axis``,
        counted from the end, or None for no bias), then (``residual``) an
        array shaped like the output, and apply ``activation`` ('relu',
        'relu6' or None) to each output row itself: conv can; depthwise can
        without the residual."""
        g = self.geom
        if g.family == "local" or (g.family == "depthwise" and (g.rank > 2 or residual)):
            return False
        if bias_axis is not None:
            want = -1 if g.channels_last else -(len(out.shape) - 1)
            if bias_axis != want:
                return False
        return activation in (None, "relu", "relu6")

    def compute_epilogue(self, inputs, bias, activation, residual=None):
        """conv(x, k) + bias + residual, then the activation, in one kernel
        pass; None when these arrays do not suit the kernel (the caller falls
        back)."""
        x, k = inputs
        if bias is not None and bias.ndim != 1:
            bias = bias.reshape(-1)
        # a fused step's later calls: these arrays passed the checks below
        y = self.geom.forward_again(x, k, bias, activation, residual)
        if y is not None:
            return y
        if not self.geom.epilogue_fits(x, k, bias, residual):
            return None
        return self.geom.forward(x, k, bias, activation, residual)

    def bind(self, inputs):
        """A plan step's direct call (Op.bind): the kernel's prepared call."""
        return self.bind_epilogue(inputs, None, None, None)

    def bind_epilogue(self, inputs, bias, activation, residual):
        """The direct call of ``compute_epilogue(inputs, bias, activation,
        residual)`` for arrays like these (Fused.bind): ``(call, positions,
        False)``, the positions over ``inputs + [bias, residual]``, or None."""
        return _bind_direct(self.geom, inputs[0], inputs[1], bias, activation, residual,
                            len(inputs))

    def block_stage(self, inputs, bias=None, residual=None, activation=None):
        """What this convolution, then + bias + residual and the activation,
        can be in a depthwise block of an inference plan (ops/
        depthwise_block.py), or None."""
        return BlockStage.of(self.geom, inputs[0], inputs[1], bias, residual, activation)

    def scale_output(self, inputs, out, v, ctx):
        """conv(x, k) * v for a vector v along the output channels: the
        kernel's output channels scaled (BatchNorm folding)."""
        x, k = inputs
        g = self.geom
        if g.family not in ("conv", "depthwise") or not ctx.is_weight(k) or \
                None in k.shape:
            return None
        axis = out.ndim - 1 if g.channels_last else 1
        if ctx.channel_vector(v, out, axis) is None:
            return None
        if g.family == "conv":
            scale = shp.reshape(v, (k.shape[-1],))
        else:
            scale = shp.reshape(v, (k.shape[-2], k.shape[-1]))
        return Conv(g)(x, k * scale)

    def grad(self, inputs, outputs, grads):
        x, k = inputs
        g = grads[0]
        return [conv_input(self.geom, g, k, x), conv_kernel(self.geom, x, g, k)]


def _bind_direct(g, x, k, bias, activation, residual, n_inputs):
    """``(call, positions)`` of the direct kernel's prepared call on these
    arrays, the positions over the step's ``n_inputs`` inputs followed by
    bias and residual; None where forward takes another path."""
    if (bias is not None and bias.ndim != 1) or not g.epilogue_fits(x, k, bias, residual):
        return None
    call = g.prepared(x, k, bias, activation, residual)
    if call is None:
        return None
    return call, _trimmed((0, 1, None if bias is None else n_inputs,
                           None if residual is None else n_inputs + 1)), False


def _trimmed(positions):
    # trailing None arguments are the calls' defaults
    while positions and positions[-1] is None:
        positions = positions[:-1]
    return positions


def _absorbed_pads(g, made):
    """(geometry with the pads of a zero padding ``made`` = (op, inputs)
    taken in, the padding's input) when ``made`` is a zero padding of the
    spatial axes only (Conv.rewrite), else None."""
    spatial = spatial_zero_padding(made, g.channels_last, g.rank)
    if spatial is None:
        return None
    return g.with_extra_pads(spatial), made[1][0]


class PackedConv(Op):
    """y = conv(x, kernel), with the kernel also given as
    ``linalg.PackPanels`` of it seen as a (K, F) matrix: an inference plan's
    frozen weights pack it once (Conv.lower puts this op in). Calls of
    few output positions run as the patch matrix times the packed panels
    (kernels/conv_packed.pxi); the others, and whatever the packed rule does
    not take, run as Conv (the kernel is an input too). Sums run in another
    order than the other strategies': values differ in the last bits, the
    same on every call and for any thread count."""

    fresh_output = True
    epilogue_host = True

    def __init__(self, geom):
        self.geom = geom
        self.api = geom.api

    @staticmethod
    def replacing(g, x, k, ctx):
        """``[PackedConv(g)(x, k, PackPanels(...)(k))]`` for a channels_last
        float32 convolution of a frozen kernel of known shape where the
        packed kernel runs, else None. Where x's spatial sizes are known, the
        kernel is packed only when the packed rule takes the layer at batch
        1 (larger batches only add positions): the packed copy is memory a
        layer of large maps (a network's stem) would never use."""
        if g.family != "conv" or not g.channels_last or x.dtype != "float32" or \
                k.dtype != "float32" or not ctx.is_weight(k) or None in k.shape or \
                not _linalg.packed_available():
            return None
        if None not in x.shape[1:]:
            one = (1,) + tuple(x.shape[1:])
            try:
                pads = g._check_forward(one, k.shape)
                probe = _conv.packed_forward_call(one, k.shape, g.strides, g.dilation, pads,
                                                  True, np.float32)
            except (ValueError, TypeError):
                probe = None
            if probe is None:
                return None
        return [PackedConv(g)(x, k, PackPanels(k.ndim - 1)(k))]

    def infer(self, x, k, packed):
        return [(self.geom.y_shape(x.shape, k.shape), x.dtype)]

    def compute(self, x, k, packed):
        return (self.geom.forward_packed(x, k, packed),)

    def kernel_epilogue(self, bias_axis, activation, out, residual=False, exact=False):
        return Conv(self.geom).kernel_epilogue(bias_axis, activation, out, residual, exact)

    def block_stage(self, inputs, bias=None, residual=None, activation=None):
        return BlockStage.of(self.geom, inputs[0], inputs[1], bias, residual, activation)

    def bind(self, inputs):
        return self.bind_epilogue(inputs, None, None, None)

    def bind_epilogue(self, inputs, bias, activation, residual):
        """As Conv.bind_epilogue: the packed product's prepared call (None
        where the packed rule declines these shapes)."""
        x, k, packed = inputs
        if x.dtype != np.float32 or (bias is not None and bias.ndim != 1) or \
                not self.geom.epilogue_fits(x, k, bias, residual):
            return None
        call = self.geom.packed_prepared(x, k, bias, activation, residual)
        if call is None:
            # the packed rule declined these shapes; the direct call runs
            # whatever it is given, so a step whose shapes could change (a
            # shape read from a fed value) would no longer ask the rule
            return None
        return call, _trimmed((0, 2, None if bias is None else 3,
                               None if residual is None else 4)), False

    def compute_epilogue(self, inputs, bias, activation, residual=None):
        x, k, packed = inputs
        if bias is not None and bias.ndim != 1:
            bias = bias.reshape(-1)
        if x.dtype != np.float32 or not self.geom.epilogue_fits(x, k, bias, residual):
            return None
        return self.geom.forward_packed(x, k, packed, bias, activation, residual)


class ConvInput(Op):
    """dx = the input gradient of conv for output gradient dy (the transposed
    convolution). ``static`` is dx's shape, None where a third input, a 1-D int
    tensor, gives it at run time."""

    def __init__(self, geom, static):
        self.geom = geom
        self.api = geom.api
        self.static = tuple(static)

    def infer(self, dy, k, *shape):
        g = self.geom
        static = list(self.static)
        if static[0] is None:
            static[0] = dy.shape[0]
        ci = -1 if g.channels_last else 1
        if static[ci] is None:
            static[ci] = g.in_channels(k.shape)
        static = tuple(static)
        want = g.y_shape(static, k.shape)
        for a, b in zip(want, dy.shape):
            if a is not None and b is not None and a != b:
                raise ValueError("%s: the input has shape %s but a convolution producing %s "
                                 "(kernel %s, strides %s, padding %r) takes inputs of shape %s"
                                 % (self.api, format_shape(dy.shape), format_shape(static),
                                    format_shape(k.shape), g.strides, g.padding,
                                    format_shape(want)))
        return [(static, dy.dtype)]

    def compute(self, dy, k, *shape):
        xshape = tuple(shape[0]) if shape else self.static
        return (self.geom.backward_input(dy, k, xshape),)

    def grad(self, inputs, outputs, grads):
        dy, k = inputs[:2]
        g = grads[0]
        return [Conv(self.geom)(g, k), conv_kernel(self.geom, g, dy, k)] + \
            [None] * (len(inputs) - 2)


class ConvKernel(Op):
    """dk = the kernel gradient of conv, for input x and output gradient dy."""

    def __init__(self, geom, kshape):
        self.geom = geom
        self.api = geom.api
        self.kshape = tuple(kshape)

    def infer(self, x, dy):
        return [(self.kshape, x.dtype)]

    def compute(self, x, dy):
        return (self.geom.backward_kernel(x, dy, self.kshape),)

    def grad(self, inputs, outputs, grads):
        x, dy = inputs
        g = grads[0]
        return [conv_input(self.geom, dy, g, x), Conv(self.geom)(x, g)]


def conv_input(geom, dy, k, like):
    """ConvInput with the output shape of ``like``."""
    static, tensor = _static_or_tensor(like)
    op = ConvInput(geom, static)
    return op(dy, k) if tensor is None else op(dy, k, tensor)


def conv_kernel(geom, x, dy, like):
    if any(d is None for d in like.shape):
        raise ValueError("%s: the kernel's shape %s must be fully known to differentiate"
                         % (geom.api, format_shape(like.shape)))
    return ConvKernel(geom, like.shape)(x, dy)


def conv(geom, x, k):
    return Conv(geom)(x, k)


def conv_transpose(geom, x, k, static, shape_tensor):
    """The transposed convolution of x to an output of shape ``static`` (None
    entries given at run time by ``shape_tensor``)."""
    op = ConvInput(geom, static)
    return op(x, k) if shape_tensor is None else op(x, k, shape_tensor)

