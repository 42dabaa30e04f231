"""Variable updates. An update is a tensor whose value is the variable's new
value; a Function that computes one assigns it after all its outputs are
computed (see graph/function.py)."""
import numbers

import numpy as np

from cyback.graph.function import Assign
from cyback.graph.op import Op
from cyback.graph.tensor import Tensor, Variable, as_tensor
from cyback.ops import elementwise as ew


class AssignOp(Op, Assign):
    pure = False

    def __init__(self, api="update"):
        # The function the user called (update, update_add, ...), for errors.
        self.api = api

    def infer(self, var, value):
        if value.ndim != var.ndim or any(a is not None and b is not None and a != b
                                         for a, b in zip(var.shape, value.shape)):
            raise ValueError("%s: the new value of variable '%s' has shape %s, the "
                             "variable has shape %s" % (self.api, var.name, value.shape,
                                                        var.shape))
        return [(var.shape, var.dtype)]

    def compute(self, var, value):
        return (np.asarray(value, dtype=var.dtype),)


def _assign(api, x, new_x):
    new_x = ew.cast(ew.weak(new_x, x.dtype) if not isinstance(new_x, Tensor) else new_x, x.dtype)
    return AssignOp(api)(x, new_x)


def _check(api, x, **operands):
    if not isinstance(x, Variable):
        raise TypeError("%s: expected a variable to update, got %r" % (api, x))
    for name, value in operands.items():
        if isinstance(value, Tensor) or isinstance(value, (numbers.Number, np.number)):
            continue
        kind = getattr(np.asarray(value) if not isinstance(value, np.ndarray) else value,
                       "dtype", None)
        if value is None or kind is None or kind.kind not in "biuf":
            raise TypeError("%s: %s must be a tensor or a number (array), got %r"
                            % (api, name, value))


def _named(api, build):
    """``build()``, with shape errors of the ops it makes named after ``api``."""
    try:
        return build()
    except ValueError as e:
        raise ValueError("%s: %s" % (api, e)) from e


def update(x, new_x):
    _check("update", x, new_x=new_x)
    return _assign("update", x, new_x)


def update_add(x, increment):
    _check("update_add", x, increment=increment)
    return _assign("update_add", x, _named("update_add", lambda: ew.add(x, increment)))


def update_sub(x, decrement):
    _check("update_sub", x, decrement=decrement)
    return _assign("update_sub", x, _named("update_sub", lambda: ew.subtract(x, decrement)))


def moving_average_update(x, value, momentum):
    """x ← x * momentum + value * (1 - momentum)."""
    _check("moving_average_update", x, value=value, momentum=momentum)
    value = as_tensor(value) if isinstance(value, Tensor) else ew.weak(value, x.dtype)
    return _assign("moving_average_update", x, _named("moving_average_update", lambda: ew.add(
        ew.multiply(x, momentum), ew.multiply(value, 1 - momentum))))
