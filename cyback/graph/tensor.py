"""Symbolic values: Tensor and its leaves Variable, Placeholder and Constant.

A Tensor is the output of a Node (an Op applied to input Tensors). Leaves have
no node. Every tensor knows its dtype (a NumPy dtype name) and its static shape
(a tuple with None where the size is only known at run time).
"""
import itertools
import threading

import numpy as np

from cyback import config

_counter = itertools.count()


def dtype_name(dtype):
    """A NumPy dtype name ('float32', 'int64', 'bool', ...) for anything dtype-like."""
    if isinstance(dtype, str) and dtype in _DTYPE_CACHE:
        return _DTYPE_CACHE[dtype]
    try:
        name = np.dtype(getattr(dtype, "name", dtype) if not isinstance(dtype, str) else dtype).name
    except TypeError:
        raise TypeError("unknown dtype %r" % (dtype,)) from None
    return name


_DTYPE_CACHE = {n: n for n in ("float16", "float32", "float64", "int8", "int16", "int32",
                               "int64", "uint8", "uint16", "uint32", "uint64", "bool",
                               "complex64", "complex128")}


_NP_NAMES = {}


def np_dtype_name(dtype):
    """``dtype.name`` for a NumPy dtype object, cached (NumPy computes it in Python)."""
    name = _NP_NAMES.get(dtype)
    if name is None:
        name = _NP_NAMES[dtype] = dtype.name
    return name


def is_float_dtype(dtype):
    return dtype in ("float16", "float32", "float64")


def is_int_dtype(dtype):
    return dtype.startswith("int") or dtype.startswith("uint")


class Node(object):
    """One application of an op: ``outputs = op(*inputs)``."""

    __slots__ = ("op", "inputs", "outputs", "__weakref__")

    def __init__(self, op, inputs):
        self.op = op
        self.inputs = inputs
        self.outputs = []


class Tensor(object):
    """A symbolic value.

    Keras attaches ``_keras_shape``, ``_keras_history`` and ``_uses_learning_phase``
    to tensors; they are plain attributes here.
    """

    # Make NumPy defer to our reflected operators (np_array * tensor).
    __array_priority__ = 100
    __array_ufunc__ = None

    is_leaf = False

    def __init__(self, node, index, shape, dtype, name=None):
        self.node = node
        self.index = index
        self.shape = tuple(shape)
        self.dtype = dtype
        self.id = next(_counter)
        self.name = config.scoped_name(name) if name else "%s_%d" % (
            type(node.op).__name__ if node is not None else type(self).__name__, self.id)
        self._uses_learning_phase = False

    # Theano/TF style attributes used by some Keras code.
    @property
    def ndim(self):
        return len(self.shape)

    def get_shape(self):
        return _StaticShape(self.shape)

    def __repr__(self):
        return "<cyback.%s '%s' shape=%s dtype=%s>" % (
            type(self).__name__, self.name, self.shape, self.dtype)

    def __hash__(self):
        return self.id

    def __len__(self):
        if not self.shape or self.shape[0] is None:
            raise TypeError("len() of a tensor with unknown leading size; use K.shape(x)[0]")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        if self.shape[0] is None:
            raise TypeError("cannot iterate over a tensor of unknown leading size %s" % (self.shape,))
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self):
        raise TypeError("the truth value of a symbolic tensor is unknown until it is run; "
                        "use K.switch or K.eval")

    def eval(self):
        from cyback.graph.function import eval_tensor
        return eval_tensor(self)

    def __reduce__(self):
        # An explicit state, rebuilt on the other side (cyback/graph/pickling.py).
        from cyback.graph.pickling import reduce_tensor
        return reduce_tensor(self)

    # Operators are attached in cyback.ops.operators to keep this module free of ops.


class _StaticShape(tuple):
    """What ``x.get_shape()`` returns: a tuple with ``as_list()``."""

    def as_list(self):
        return list(self)

    @property
    def ndims(self):
        return len(self)


class Constant(Tensor):
    """A fixed value known when the graph is built."""

    is_leaf = True

    def __init__(self, value, name=None):
        value = np.asarray(value)
        value.setflags(write=False)
        self.value = value
        super().__init__(None, 0, value.shape, np_dtype_name(value.dtype), name)


class Placeholder(Tensor):
    """A value fed when a function is called.

    ``default``: used when the placeholder is not fed (the learning phase).
    ``sparse``: fed with a scipy.sparse matrix (or a dense array), kept as CSR.
    """

    is_leaf = True

    def __init__(self, shape, dtype, name=None, sparse=False, default=None):
        super().__init__(None, 0, shape, dtype, name)
        self.sparse = sparse
        self.default = default


class Variable(Tensor):
    """A mutable value held between calls; updated by set_value and updates."""

    is_leaf = True

    def __init__(self, value, dtype, name=None, constraint=None):
        value = np.array(value, dtype=dtype, copy=True)
        super().__init__(None, 0, value.shape, dtype, name)
        self._value = value
        self.constraint = constraint
        self._lock = threading.Lock()
        self._keras_initialized = False

    @property
    def value(self):
        return self._value

    def __str__(self):
        # print(K.variable(..., name='example_var')) shows the name, as in the seeds.
        return self.name

def assign_all(pairs, what):
    """Assign ``(variable, value)`` pairs all or nothing: every shape is checked
    before any variable changes. ``what`` names the caller in errors."""
    checked = []
    for var, value in pairs:
        if not isinstance(var, Variable):
            raise TypeError("%s: expected variables, got %r" % (what, var))
        value = np.asarray(value)
        if value.shape != var.shape:
            raise ValueError("%s: variable '%s' has shape %s, the new value has shape %s"
                             % (what, var.name, var.shape, value.shape))
        checked.append((var, value))
    for var, value in checked:
        # A copy: the value may alias another array of the graph or the
        # caller's, and a variable must own its storage.
        var._value = np.array(value, dtype=var.dtype, copy=True)


def as_tensor(value, dtype=None):
    """A Tensor for ``value``; NumPy arrays and Python numbers become Constants."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (list, tuple)) and _holds_tensor(value):
        # A list mixing tensors and numbers (K.prod([K.shape(x)[0], 3])) is
        # stacked, as TensorFlow converts it.
        from cyback.api.manip import stack
        return stack([as_tensor(v, dtype) for v in value])
    if dtype is None:
        arr = np.asarray(value)
        if arr.dtype == np.float64 and not isinstance(value, np.ndarray) \
                and not isinstance(value, np.generic):
            # Python floats and lists of them take floatx, as in Keras.
            arr = arr.astype(config.floatx())
        elif arr.dtype == np.int64 and not isinstance(value, (np.ndarray, np.generic)):
            arr = arr.astype("int32")
        return Constant(arr)
    return Constant(np.asarray(value, dtype=dtype))


def _holds_tensor(seq):
    return any(isinstance(v, Tensor) or (isinstance(v, (list, tuple)) and _holds_tensor(v))
               for v in seq)
