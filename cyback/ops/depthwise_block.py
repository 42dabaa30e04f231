"""A depthwise block as one step of an inference plan: an optional 1x1
expansion, a depthwise convolution and an optional 1x1 projection
(MobileNetV2's inverted residual, a MobileNet depthwise-separable pair),
channels_last, each stage with its bias and relu / relu6, the projection
with a residual (kernels/conv_blocks.pxi runs it row by row, the intermediate
tensors never written out).

The plan optimizer finds the stages after element-wise fusion
(``graph/optimize.py``, ``join_depthwise_blocks``): each conv step says what
stage it can be (``Conv.block_stage``, ``BlockStage`` here) and the
depthwise stage joins its neighbours (``BlockStage.join``) where the tensor
between them is large: the row-by-row kernel reads each 1x1 kernel once per
image row, which costs more than it saves on maps small enough to stay in
cache (their 1x1 layers run as packed products, kernels/conv_packed.pxi).

Only inference plans hold this op (no gradient: a training plan keeps its
layers as written).
"""
import numpy as np

from cyback.graph.op import Op
from cyback.kernels import conv as _conv

#: Fewest bytes per image of the tensor a join keeps out of memory (the
#: expanded tensor, or the depthwise output when there is no expansion):
#: smaller ones stay in L2 between the separate layers.
MIN_INTERMEDIATE_BYTES = 512 << 10
#: Fewest pixels per image row: the row kernel's 1x1 products run a row at
#: a time, which on shorter rows leaves most of a register tile empty.
MIN_ROW_PIXELS = 16

_ACTIVATIONS = (None, "relu", "relu6")


class BlockStage(object):
    """What a conv step of a plan can be in a depthwise block: ``kind``
    'pointwise' (a 1x1, stride-1 unpadded convolution) or 'depthwise' (depth
    multiplier 1, no dilation), with its geometry, input ``x``, ``kernel``,
    ``bias`` and ``residual`` tensors (or None) and activation."""

    __slots__ = ("kind", "geom", "x", "kernel", "bias", "residual", "act")

    def __init__(self, kind, geom, x, kernel, bias, residual, act):
        self.kind, self.geom, self.x, self.kernel = kind, geom, x, kernel
        self.bias, self.residual, self.act = bias, residual, act

    @staticmethod
    def of(geom, x, kernel, bias, residual, act):
        """The stage a convolution of ``geom`` on ``x`` with ``kernel`` (then
        + bias + residual, act) can be, or None."""
        if geom.family not in ("conv", "depthwise") or geom.rank != 2 or \
                not geom.channels_last or act not in _ACTIVATIONS or \
                x.dtype not in ("float32", "float64") or kernel.dtype != x.dtype or \
                len(x.shape) != 4 or None in x.shape[1:] or None in kernel.shape or \
                (bias is not None and bias.dtype != x.dtype):
            return None
        if geom.family == "conv":
            pointwise = kernel.shape[:2] == (1, 1) and geom.strides == (1, 1) and \
                geom.dilation == (1, 1) and not any(a or b for a, b in geom.extra_pads or ())
            return BlockStage("pointwise", geom, x, kernel, bias, residual, act) \
                if pointwise else None
        if kernel.shape[3] != 1 or geom.dilation != (1, 1) or residual is not None or \
                kernel.shape[0] > _conv.BLOCK_MAX_TAP_ROWS:
            return None
        return BlockStage("depthwise", geom, x, kernel, bias, residual, act)

    def join(self, expand, project):
        """``(op, inputs)`` of the block of this depthwise stage with the
        ``expand`` and ``project`` stages (pointwise, or None), or None where
        the block does not pay (see the module's docstring) or cannot run."""
        if expand is None and project is None:
            return None
        if expand is not None and (expand.kind != "pointwise" or expand.residual is not None):
            return None
        if project is not None and project.kind != "pointwise":
            return None
        channels = [self.x.shape[3], self.kernel.shape[2]] + \
            ([expand.x.shape[3]] if expand is not None else []) + \
            ([project.kernel.shape[3]] if project is not None else [])
        if max(channels) > _conv.BLOCK_MAX_CHANNELS:
            return None
        middle = self.x.shape if expand is not None else \
            self.geom.y_shape(self.x.shape, self.kernel.shape)
        if self.x.shape[2] < MIN_ROW_PIXELS or None in middle[1:] or \
                int(np.prod(middle[1:])) * np.dtype(self.x.dtype).itemsize < \
                MIN_INTERMEDIATE_BYTES:
            return None
        op = DepthwiseBlock(self.geom, expand.act if expand is not None else None, self.act,
                            project.act if project is not None else None,
                            expand is not None, project is not None,
                            expand is not None and expand.bias is not None,
                            self.bias is not None,
                            project is not None and project.bias is not None,
                            project is not None and project.residual is not None)
        ins = [expand.x if expand is not None else self.x]
        for stage in (expand, self, project):
            if stage is not None:
                ins.append(stage.kernel)
                if stage.bias is not None:
                    ins.append(stage.bias)
        if op.residual:
            ins.append(project.residual)
        return op, ins


class DepthwiseBlock(Op):
    """(x, [expand kernel, [bias]], depthwise kernel, [bias], [project kernel,
    [bias]], [residual]) -> the block's output; kernels in Keras's shapes
    ((1, 1, C, E), (KH, KW, E, 1), (1, 1, E, F)), ``geom`` the depthwise
    stage's geometry."""

    api = "depthwise_block"
    fresh_output = True

    def __init__(self, geom, expand_act, depthwise_act, project_act, expand, project,
                 expand_bias, depthwise_bias, project_bias, residual):
        self.geom = geom
        self.acts = (expand_act, depthwise_act, project_act)
        self.expand, self.project, self.residual = expand, project, residual
        self.biases = (expand_bias, depthwise_bias, project_bias)

    def _split(self, args):
        """(x, expand (k, b), depthwise (k, b), project (k, b), residual)."""
        it = iter(args)
        x = next(it)
        stages = []
        for present, has_bias in zip((self.expand, True, self.project), self.biases):
            if not present:
                stages.append(None)
                continue
            k = next(it)
            stages.append((k, next(it) if has_bias else None))
        res = next(it) if self.residual else None
        return x, stages[0], stages[1], stages[2], res

    def describe(self):
        names = (["conv2d"] if self.expand else []) + ["depthwise_conv2d"] + \
            (["conv2d"] if self.project else [])
        return "block(%s)" % " > ".join(names)

    def infer(self, *inputs):
        x, expand, depthwise, project, _ = self._split(inputs)
        shape = x.shape
        if expand is not None:
            shape = shape[:3] + (expand[0].shape[3],)
        shape = self.geom.y_shape(shape, depthwise[0].shape)
        if project is not None:
            shape = shape[:3] + (project[0].shape[3],)
        return [(shape, x.dtype)]

    def compute(self, *arrays):
        x, expand, depthwise, project, res = self._split(arrays)
        ae, ad, ap = self.acts
        kd = depthwise[0]
        h_shape = x.shape[:3] + (kd.shape[2],)
        pads = self.geom._check_forward(h_shape, kd.shape)
        stages = [None if expand is None else
                  (expand[0].reshape(expand[0].shape[2:]), _vector(expand[1]), ae),
                  (kd.reshape(kd.shape[:3]), _vector(depthwise[1]), ad),
                  None if project is None else
                  (project[0].reshape(project[0].shape[2:]), _vector(project[1]), ap)]
        return (_conv.block_forward(x, stages[0], stages[1], stages[2], res,
                                      self.geom.strides, pads),)


def _vector(bias):
    # a per-channel bias as the plan holds it ((F,) or (1, 1, 1, F))
    return bias if bias is None or bias.ndim == 1 else bias.reshape(-1)
