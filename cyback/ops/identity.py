"""Ops that pass their input through: identity (a copy), stop_gradient (no
gradient) and print_tensor (prints the value each time it is computed)."""
import sys

import numpy as np

from cyback.graph.op import Op


class Identity(Op):
    api = "identity"

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        # a copy, as TensorFlow's identity is a new tensor: returned from a
        # function, the result must not be a variable's own storage
        return (np.array(x, copy=True),)

    def grad(self, inputs, outputs, grads):
        return [grads[0]]


class StopGradient(Op):
    api = "stop_gradient"

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        return (x,)


class PrintTensor(Op):
    api = "print_tensor"
    pure = False

    def __init__(self, message):
        self.message = message

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        sys.stdout.write("%s%s\n" % (self.message, np.array2string(np.asarray(x))))
        sys.stdout.flush()
        return (x,)

    def grad(self, inputs, outputs, grads):
        return [grads[0]]
