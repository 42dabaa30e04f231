"""Integer arguments of the backend API.

An integer argument (an axis, a count, a size, a class count) must be an
integer: a Python int or a NumPy integer, or a scalar int tensor whose value
is known while building. bools are refused, as are floats, even whole ones
(TensorFlow refuses ``one_hot(x, 3.0)`` too): a float there is usually a
division that should have been ``//``. Errors name the function and the
argument.
"""
import numbers

import numpy as np

from cyback.graph.tensor import Tensor
from cyback.ops import shape as shp


def integer(api, name, value, minimum=None):
    """``value`` as a Python int (see the module docstring), at least
    ``minimum`` if given."""
    if isinstance(value, Tensor):
        known = shp.static_int(value) if value.ndim == 0 and value.dtype.startswith(
            ("int", "uint")) else None
        if known is None:
            raise TypeError("%s: %s must be an int, got the tensor %r (its value is not known "
                            "while building)" % (api, name, value))
        value = known
    if isinstance(value, (bool, np.bool_)) or \
            not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError("%s: %s must be an int, got %r" % (api, name, value))
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError("%s: %s must be >= %d, got %d" % (api, name, minimum, value))
    if not -2 ** 63 <= value < 2 ** 63:
        # no size, count or axis of an array is that large
        raise ValueError("%s: %s %d is out of the range of 64-bit ints" % (api, name, value))
    return value
