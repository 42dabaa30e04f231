"""An int8 1-D convolution and a max (or min) over its positions as one step
of an inference plan: a text CNN's Conv1D + GlobalMaxPooling1D.

The kernel (``qgemm.WindowExtremeCall``) keeps each output column's greatest
and least sums over the positions and requantizes one row per sequence
instead of every position; the result is the same, to the bit, as the two
steps (the epilogue is monotonic in the sum: include/cyback_qgemm.h,
``cb_q_extremes_finish``). The plan optimizer joins the two steps
(``graph/optimize.py``, ``join_sole_readers``) where the convolution's
output has no other reader; ``QuantizedConv.join_reader`` asks ``join``
here.

Only inference plans hold this op (no gradient).
"""
import numpy as np

from cyback.graph.op import Op
from cyback.kernels import qgemm
from cyback.ops.reduction import Reduce


class QuantizedConvExtreme(Op):
    """``reduce(conv(x, packed, vectors))`` for a QuantizedConv ``conv`` of
    rank 1 without dilation, residual or second output and a Reduce
    ``reduce`` taking the max or min over the positions (axis 1)."""

    api = "quantized_conv"
    fresh_output = True

    def __init__(self, conv, reduce):
        self.conv = conv
        self.reduce = reduce

    @staticmethod
    def join(conv, reader, ins):
        """``(op, inputs)`` of the step joining ``conv`` (reading ``ins``) and
        the ``reader`` of its output, or None where they do not join."""
        if not isinstance(reader, Reduce) or reader.kind not in qgemm.KINDS or \
                tuple(reader.axes) != (1,) or conv.rank != 1 or conv.dilation != (1,) or \
                conv.residual_in or conv.also_codes is not None or len(ins) != 3:
            return None
        return QuantizedConvExtreme(conv, reader), list(ins)

    def describe(self):
        return "%s > %s over positions" % (self.conv.describe(), self.reduce.kind)

    def infer(self, x, packed, vectors):
        (shape, dtype), = self.conv.infer(x, packed, vectors)
        out = (shape[0], 1, shape[2]) if self.reduce.keepdims else (shape[0], shape[2])
        return [(out, dtype)]

    def compute(self, x, packed, vectors):
        conv = self.conv
        q = conv._quantized_input(x)
        if q.ndim == 3:
            (before, after), = conv._pads(q.shape[1:2])
            if before or after:
                q = np.pad(q, ((0, 0), (before, after), (0, 0)), constant_values=conv.in_zero)
        if q.ndim != 3 or q.shape[1] < conv.kernel_size[0]:
            # no window (the convolution says why) or an odd input: the two steps
            return self.reduce.compute(conv.compute(x, packed, vectors)[0])
        y = self._call(q.shape[2], packed, vectors)(q)
        return (y[:, None] if self.reduce.keepdims else y,)

    def _call(self, channels, packed, vectors):
        calls = vars(self).setdefault("_calls", {})
        key = (channels, id(packed), id(vectors))
        call = calls.get(key)
        if call is None or not call.matches(packed, vectors):
            scale, zero = self.conv.out_codes or (None, None)
            call = qgemm.WindowExtremeCall(packed, vectors, channels, self.conv.kernel_size[0],
                                           self.conv.strides[0], self.conv.in_zero,
                                           self.conv.activation, scale, zero,
                                           self.reduce.kind)
            if len(calls) >= 8:
                calls.clear()
            calls[key] = call
        return call

    def __getstate__(self):
        # the prepared kernel calls are made again after unpickling
        state = dict(vars(self))
        state.pop("_calls", None)
        return state

    def grad(self, inputs, outputs, output_grads):
        raise TypeError("%s has no gradient: int8 layers are for inference (this step exists "
                        "only in inference plans)" % self.api)
