"""Python operators on tensors (``x + y``, ``x[i]``, ``-x`` ...)."""
from cyback.graph.tensor import Tensor
from cyback.ops import elementwise as ew
from cyback.ops.linalg import dot
from cyback.ops.shape import getitem


def _swap(fn):
    return lambda self, other: fn(other, self)


Tensor.__add__ = ew.add
Tensor.__radd__ = _swap(ew.add)
Tensor.__sub__ = ew.subtract
Tensor.__rsub__ = _swap(ew.subtract)
Tensor.__mul__ = ew.multiply
Tensor.__rmul__ = _swap(ew.multiply)
Tensor.__truediv__ = ew.divide
Tensor.__rtruediv__ = _swap(ew.divide)
Tensor.__floordiv__ = ew.floor_divide
Tensor.__rfloordiv__ = _swap(ew.floor_divide)
Tensor.__mod__ = ew.mod
Tensor.__rmod__ = _swap(ew.mod)
Tensor.__pow__ = ew.power
Tensor.__rpow__ = _swap(ew.power)
Tensor.__neg__ = ew.negative
Tensor.__pos__ = lambda self: self
Tensor.__abs__ = ew.abs_
Tensor.__lt__ = ew.less
Tensor.__le__ = ew.less_equal
Tensor.__gt__ = ew.greater
Tensor.__ge__ = ew.greater_equal
Tensor.__and__ = ew.logical_and
Tensor.__or__ = ew.logical_or
Tensor.__invert__ = ew.logical_not
Tensor.__getitem__ = getitem


def _matmul(x, y):
    return dot(x, y)


Tensor.__matmul__ = _matmul
Tensor.__rmatmul__ = _swap(_matmul)
