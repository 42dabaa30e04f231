"""Symbolic values: Tensor and its leaves Variable, Placeholder and Constant.

A Tensor is the output of a Node (an Op applied to input Tensors). Leaves have
no node. Every tensor knows its dtype (a NumPy dtype name) and its static shape
(a tuple with None where the size is only known at run time).
"""
import itertools
import threading

import numpy as np

from cyback import config
from cyback.graph import calls as _calls

_counter = itertools.count()
# Versions of variable values and the epoch of the last assignment come from
# one counter: next() on it is atomic under the GIL, so no two assignments
# share a number and a plan that saw one epoch can tell any later one.
_assignments = itertools.count(1)
_epoch = [0]


def weights_epoch():
    """A number that changes whenever any variable is assigned."""
    return _epoch[0]


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
    """One application of an op: ``outputs = op(*inputs)``. ``call``: the
    backend function that built it (``graph/calls.py``), or None."""

    __slots__ = ("op", "inputs", "outputs", "call", "__weakref__")

    def __init__(self, op, inputs):
        self.op = op
        self.inputs = inputs
        self.outputs = []
        self.call = _calls.current()


class Tensor(object):
    """A symbolic value.

    Keras attaches ``_keras_shape``, ``_keras_history`` and ``_uses_learning_phase``
    to tensors; they are plain attributes here.
    """

    # Make NumPy defer to our reflected operators (np_array * tensor).
    __array_priority__ = 100
    __array_ufunc__ = None

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
            raise TypeError("cannot iterate over a tensor of unknown leading size %s"
                            % (self.shape,))
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self):
        raise TypeError("the truth value of a symbolic tensor is unknown until it is run; "
                        "use K.switch or K.eval")

    # Attached by the modules above this one that define them: ``eval`` by
    # graph/function.py (it compiles a function), ``__reduce__`` by
    # graph/pickling.py, the operators by ops/operators.py (they are ops).


class _StaticShape(tuple):
    """What ``x.get_shape()`` returns: a tuple with ``as_list()``."""

    def as_list(self):
        return list(self)

    @property
    def ndims(self):
        return len(self)


class Constant(Tensor):
    """A fixed value known when the graph is built."""

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

    def __init__(self, shape, dtype, name=None, sparse=False, default=None):
        super().__init__(None, 0, shape, dtype, name)
        self.sparse = sparse
        self.default = default


def _make_learning_phase():
    return Placeholder((), "bool", name="keras_learning_phase", default=False)


config.register_learning_phase_factory(_make_learning_phase)


class Variable(Tensor):
    """A mutable value held between calls; updated by set_value and updates.

    ``_version`` changes with every assignment (a number from one global
    counter, so it never repeats); the value is stored before the version, so
    a reader that takes the version first and the value second never pairs a
    new version with an old value. ``_group`` is the variable's lock group
    (see ``LockGroup``).
    """

    def __init__(self, value, dtype, name=None, constraint=None):
        value = np.array(value, dtype=dtype, copy=True)
        super().__init__(None, 0, value.shape, dtype, name)
        self._value = value
        self._version = next(_assignments)
        self.constraint = constraint
        self._group = LockGroup()
        self._keras_initialized = False

    @property
    def value(self):
        return self._value

    def __str__(self):
        # print(K.variable(..., name='example_var')) shows the name, as in the seeds.
        return self.name


# ------------------------------------------------------------------ locking
#
# A Function with updates reads its variables at the start of a call and
# assigns them at the end; two such calls touching a common variable must not
# overlap, or one of them loses the other's update. Rather than one lock per
# variable (a Keras training step would take and release a hundred of them),
# variables live in lock groups, merged (union-find) whenever a function with
# updates is built over variables of several groups. Any two updating
# functions that share a variable then share a group, and a call holds exactly
# one lock, the group's root's, so there is no lock order and no deadlock. The
# price: functions whose variable sets are linked only through a third
# updating function also serialise. Inference-only functions take no lock.

class LockGroup(object):
    __slots__ = ("parent", "lock")

    def __init__(self):
        self.parent = None
        # Re-entrant: a thread holding the group (an op of an updating call)
        # may still set_value the same variables without deadlocking.
        self.lock = threading.RLock()


def acquire_group(group):
    """Lock the root of ``group``'s tree and return it (release its ``lock``)."""
    while True:
        while group.parent is not None:
            group = group.parent
        group.lock.acquire()
        if group.parent is None:
            return group
        # Merged into another group while this thread waited: lock the new root.
        group.lock.release()


def join_groups(variables):
    """Merge the lock groups of ``variables`` into one; returns it (or None
    when there are no variables)."""
    root = None
    for var in variables:
        if root is None:
            root = var._group
            continue
        while True:
            a, b = _root(root), _root(var._group)
            if a is b:
                break
            # Merging waits for calls running under either root to finish.
            first, second = (a, b) if id(a) < id(b) else (b, a)
            with first.lock, second.lock:
                if a.parent is None and b.parent is None:
                    b.parent = a
                    break
        root = a
    return root


def _root(group):
    while group.parent is not None:
        group = group.parent
    return group


class locked_variables(object):
    """``with locked_variables(vars):`` holds the roots of their lock groups
    (several roots are taken in one fixed order, and re-taken if a merge moved
    one while waiting)."""

    __slots__ = ("variables", "held")

    def __init__(self, variables):
        self.variables = variables
        self.held = ()

    def __enter__(self):
        while True:
            roots = sorted({id(r): r for r in (_root(v._group) for v in self.variables)}.items())
            held = []
            for _, r in roots:
                r.lock.acquire()
                held.append(r)
            if all(r.parent is None for r in held):
                self.held = held
                return self
            for r in reversed(held):
                r.lock.release()

    def __exit__(self, *exc):
        for r in reversed(self.held):
            r.lock.release()
        self.held = ()


def assign_all(pairs, what, lock=True):
    """Assign ``(variable, value)`` pairs all or nothing: every value is
    converted and checked before any variable changes. ``what`` names the
    caller in errors (or is a list with a name per pair). ``lock=False`` when
    the caller already holds the variables' lock groups (a Function applying
    its updates)."""
    checked = []
    names = what if isinstance(what, list) else None
    for i, pair in enumerate(pairs):
        if names is not None:
            what = names[i]
        try:
            var, value = pair
        except (TypeError, ValueError):
            raise TypeError("%s: expected (variable, value) pairs, got %r" % (what, pair)) from None
        if not isinstance(var, Variable):
            raise TypeError("%s: expected variables, got %r" % (what, var))
        checked.append((var, _converted(var, value, what)))
    if lock:
        with locked_variables([var for var, _ in checked]):
            _store(checked)
    else:
        _store(checked)


def _store(checked):
    for var, value in checked:
        var._value = value
        var._version = next(_assignments)
    _epoch[0] = next(_assignments)


def _converted(var, value, what):
    """``value`` as a new array of ``var``'s dtype and shape, or an error
    naming the variable."""
    want = np.dtype(var.dtype)
    if type(value) is np.ndarray and value.dtype is want and value.shape == var.shape:
        # A copy: the value may alias another array of the graph or the
        # caller's, and a variable must own its storage.
        return value.copy()
    where = "%s: variable '%s'" % (what, var.name)
    if value is None:
        raise TypeError("%s: the new value is None" % where)
    if isinstance(value, Tensor):
        raise TypeError("%s: the new value must be a NumPy array or number, got the symbolic "
                        "tensor %r (evaluate it first)" % (where, value))
    try:
        arr = np.asarray(value)
    except Exception as e:
        raise TypeError("%s: cannot convert the new value to an array: %s" % (where, e)) from None
    kind = arr.dtype.kind
    if kind not in "biufc" or (kind == "c" and want.kind != "c"):
        raise TypeError("%s has dtype %s; cannot assign a value of dtype %s"
                        % (where, var.dtype, arr.dtype))
    if arr.shape != var.shape:
        raise ValueError("%s has shape %s, the new value has shape %s"
                         % (where, var.shape, arr.shape))
    if want.kind == "b" and kind != "b" and arr.size and not np.all((arr == 0) | (arr == 1)):
        raise ValueError("%s has dtype bool; the new value holds numbers other than 0 and 1"
                         % where)
    problem = integer_problem(arr, want)
    if problem:
        raise ValueError("%s has dtype %s; the new value holds %s" % (where, var.dtype, problem))
    with np.errstate(over="ignore"):
        out = np.array(arr, dtype=want, copy=True)
    if want.kind == "f" and arr.size and kind in "iuf" and want.itemsize < 8:
        lost = np.isfinite(arr) & ~np.isfinite(out)
        if lost.any():
            raise ValueError("%s has dtype %s; the new value holds %r, beyond its largest "
                             "number %r" % (where, var.dtype, arr[lost].ravel()[0].item(),
                                            float(np.finfo(want).max)))
    return out


def integer_problem(arr, want):
    """Why the array ``arr`` cannot become integer dtype ``want`` without
    changing a value (wrapping around, truncating), or None."""
    if want.kind not in "iu" or arr.dtype.kind == "b" or not arr.size:
        return None
    kind = arr.dtype.kind
    if kind == "f":
        if not np.all(np.isfinite(arr)):
            return "infinite or NaN numbers"
        if not np.all(np.mod(arr, 1) == 0):
            return "non-integral numbers"
    elif kind not in "iu" or can_hold(want, arr.dtype):
        return None
    info = np.iinfo(want)
    low, high = arr.min(), arr.max()
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        return "%s, outside [%d, %d]" % (_number_str(bad), info.min, info.max)
    return None


def _number_str(x):
    x = x.item()
    return "%d" % x if isinstance(x, int) or float(x).is_integer() and abs(x) < 1e18 \
        else repr(x)


def can_hold(want, have):
    """Whether every value of dtype ``have`` fits in the integer dtype ``want``."""
    if have.kind == "b":
        return True
    if have.kind not in "iu":
        return False
    return np.can_cast(have, want, casting="safe")


#: The function that stacks a list of tensors into one (K.stack). Stacking is an
#: op, defined above this layer, which registers it (register_list_stacker).
_list_stacker = [None]


def register_list_stacker(stack):
    """Make ``as_tensor`` convert a list holding tensors with ``stack(tensors)``."""
    _list_stacker[0] = stack


def as_tensor(value, dtype=None):
    """A Tensor for ``value``; NumPy arrays and Python numbers become Constants."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (list, tuple)) and _holds_tensor(value):
        # A list mixing tensors and numbers (K.prod([K.shape(x)[0], 3])) is
        # stacked, as TensorFlow converts it.
        return _list_stacker[0]([as_tensor(v, dtype) for v in value])
    if dtype is None:
        arr = np.asarray(value)
        if arr.dtype == np.float64 and not isinstance(value, np.ndarray) \
                and not isinstance(value, np.generic):
            # Python floats and lists of them take floatx, as in Keras.
            arr = arr.astype(config.floatx())
        elif arr.dtype == np.int64 and not isinstance(value, (np.ndarray, np.generic)) \
                and (not arr.size or -2 ** 31 <= arr.min() and arr.max() < 2 ** 31):
            # Python ints take int32 when they fit (as TensorFlow converts them).
            arr = arr.astype("int32")
        return Constant(arr)
    return Constant(np.asarray(value, dtype=dtype))


def _holds_tensor(seq):
    return any(isinstance(v, Tensor) or (isinstance(v, (list, tuple)) and _holds_tensor(v))
               for v in seq)
