"""The uint8 codes of a float tensor: ``clip(rint(x / scale), -zero, 255 -
zero) + zero`` (``qgemm.quantize``), as an op an int8 plan puts where a
float32 tensor made of weights only is read as codes (an embedding table
gathered for an int8 layer: computed once, with the frozen weights)."""
import numpy as np

from cyback.graph.op import Op
from cyback.kernels import qgemm


class Codes(Op):
    api = "quantize"

    def __init__(self, scale, zero):
        self.scale = float(scale)
        self.zero = int(zero)

    def infer(self, x):
        if x.dtype not in ("float16", "float32", "float64"):
            raise ValueError("%s: expected a float input, got %s" % (self.api, x.dtype))
        return [(x.shape, "uint8")]

    def compute(self, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        return (qgemm.quantize(x, self.scale, self.zero),)

    def grad(self, inputs, outputs, output_grads):
        raise TypeError("%s has no gradient: uint8 codes are for int8 inference" % self.api)
