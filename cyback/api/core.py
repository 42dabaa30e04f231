"""Tensors, variables, placeholders, values, functions, gradients and the
session helpers of the Keras backend API."""
import numpy as np

from cyback import config
from cyback.api._args import integer
from cyback.graph import calls as _calls
from cyback.graph import function as _function
from cyback.graph import limits
from cyback.graph.op import pop_after_updates, push_after_updates
from cyback.graph.tensor import (
    Constant,
    Placeholder,
    Tensor,
    Variable,
    as_tensor,
    assign_all,
    dtype_name,
)
from cyback.ops import elementwise as ew
from cyback.ops import shape as shp
from cyback.ops import state
from cyback.ops.gradients import gradients as _gradients
from cyback.ops.identity import Identity, PrintTensor, StopGradient
from cyback.ops.reduction import reduce
from cyback.ops.sparse import ToDense

__all__ = [
    "variable", "constant", "placeholder", "is_variable", "is_tensor", "is_keras_tensor",
    "is_placeholder", "is_sparse", "to_dense", "shape", "int_shape", "get_variable_shape",
    "ndim", "size", "dtype",
    "eval", "zeros", "ones", "eye", "zeros_like", "ones_like", "identity", "count_params",
    "cast", "get_value", "batch_get_value", "set_value", "batch_set_value", "print_tensor",
    "update", "update_add", "update_sub", "moving_average_update", "function", "gradients",
    "stop_gradient", "clear_session", "manual_variable_initialization", "get_session",
    "set_session", "symbolic", "eager", "is_symbolic", "get_graph", "control_dependencies",
    "Function",
]

Function = _function.Function


def _dtype(dtype):
    return config.floatx() if dtype is None else dtype_name(dtype)


def _set_keras_meta(x, shape=None):
    x._keras_shape = tuple(x.shape if shape is None else shape)
    x._uses_learning_phase = False
    return x


# ------------------------------------------------------------------ leaves

def variable(value, dtype=None, name=None, constraint=None):
    """A Variable holding a copy of ``value`` (array, list, number, sparse matrix or
    tensor, which is evaluated)."""
    if isinstance(value, Tensor):
        if dtype is None:
            dtype = value.dtype
        value = _function.eval_tensor(value)
    sparse = hasattr(value, "toarray") and hasattr(value, "tocsr")
    if sparse:
        value = value.toarray()
    dtype = _dtype(dtype)
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise TypeError("variable: cannot make a %s variable from %r: %s"
                        % (dtype, type(value).__name__, e)) from None
    v = Variable(arr, dtype, name=name, constraint=constraint)
    if sparse:
        # A variable made from a scipy.sparse matrix is sparse for is_sparse,
        # dot and concatenate, as in TensorFlow (a SparseTensor, which gets no
        # gradient) and Theano; cyback stores its value densely.
        v.sparse = True
    return _set_keras_meta(v)


def constant(value, dtype=None, shape=None, name=None):
    dtype = _dtype(dtype)
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise TypeError("constant: cannot make a %s constant from %r: %s"
                        % (dtype, type(value).__name__, e)) from None
    if shape is not None:
        shape, _ = shp.shape_arg("constant", shape)
        if None in shape:
            raise ValueError("constant: shape must be fully known, got %s" % (shape,))
        shp.check_static_shape("constant", shape)
        if arr.size == 1:
            # a large fill is made when the function runs (graph/limits.py)
            filled = shp.fill("constant", shape, arr.reshape(()).item(), dtype)
            if type(filled) is not Constant:
                return _set_keras_meta(filled)
            arr = filled.value
        elif arr.size == limits.elements(shape):
            arr = arr.reshape(shape)
        else:
            raise ValueError("constant: a value of %d elements cannot fill shape %s"
                             % (arr.size, shape))
    return _set_keras_meta(Constant(arr, name=name))


def placeholder(shape=None, ndim=None, dtype=None, sparse=False, name=None):
    dtype = _dtype(dtype)
    if shape is None:
        if ndim is None:
            raise ValueError("placeholder: give a shape or an ndim")
        ndim = integer("placeholder", "ndim", ndim, 0)
        if ndim > limits.MAX_RANK:
            raise ValueError("placeholder: ndim %d is more than the %d axes an array can have"
                             % (ndim, limits.MAX_RANK))
        shape = (None,) * ndim
    if not isinstance(shape, (list, tuple)):
        raise TypeError("placeholder: shape must be a tuple of ints and None, got %r" % (shape,))
    shape = tuple(None if d is None else integer("placeholder", "shape entries", d)
                  for d in shape)
    if any(d is not None and d < 0 for d in shape):
        raise ValueError("placeholder: negative dimension in shape %s" % (shape,))
    limits.check_shape("placeholder", shape, dtype, "a value fed to it")
    if sparse and len(shape) != 2:
        raise ValueError("placeholder: sparse placeholders must be 2-D, got shape %s" % (shape,))
    return _set_keras_meta(Placeholder(shape, dtype, name=name, sparse=bool(sparse)))


def is_variable(x):
    return isinstance(x, Variable)


def is_tensor(x):
    return isinstance(x, Tensor)


def is_placeholder(x):
    return isinstance(x, Placeholder)


def is_keras_tensor(x):
    if not isinstance(x, Tensor):
        raise ValueError("Unexpectedly found an instance of type `%s`. Expected a symbolic "
                         "tensor instance." % type(x))
    return hasattr(x, "_keras_history")


def is_symbolic(x):
    return isinstance(x, Tensor) and not isinstance(x, Constant)


def is_sparse(tensor):
    return bool(getattr(tensor, "sparse", False)) or hasattr(tensor, "tocsr")


def to_dense(tensor):
    if hasattr(tensor, "toarray"):
        return tensor.toarray()
    if is_sparse(tensor):
        return ToDense()(tensor)
    return tensor


# ------------------------------------------------------------------ shapes

def shape(x):
    """The run-time shape of ``x`` as a symbolic 1-D int32 tensor."""
    return shp.shape_of(x)


def int_shape(x):
    """The static shape as a tuple of ints and None."""
    if hasattr(x, "_keras_shape"):
        return tuple(x._keras_shape)
    if isinstance(x, Tensor):
        return x.shape
    try:
        return tuple(np.shape(x))
    except Exception:
        return None


def get_variable_shape(x):
    """The static shape of a variable (Keras 2.3.1 keeps this older name of
    ``int_shape`` in every backend)."""
    return int_shape(x)


def ndim(x):
    if isinstance(x, Tensor):
        return x.ndim
    return np.ndim(x)


def size(x, name=None):
    x = as_tensor(x)
    if all(d is not None for d in x.shape):
        return Constant(np.asarray(int(np.prod(x.shape)), dtype="int32"))
    return reduce(shp.shape_of(x), "prod")


def dtype(x):
    if isinstance(x, Tensor):
        return x.dtype
    return np.asarray(x).dtype.name


def count_params(x):
    shape_ = int_shape(x)
    if shape_ is None or any(d is None for d in shape_):
        raise ValueError("count_params: the shape %s of %r is not fully known" % (shape_, x))
    return int(np.prod(shape_, dtype=np.int64))


# ------------------------------------------------------------------ values

def eval(x):
    """The value of a tensor or variable, as a NumPy array (dense for a sparse
    tensor, as Theano's eval gives it)."""
    value = _function.eval_tensor(x)
    return value.toarray() if hasattr(value, "toarray") else value


def get_value(x):
    if isinstance(x, Variable):
        return np.array(x._value)
    if isinstance(x, np.ndarray):
        return x
    return _function.eval_tensor(x)


def batch_get_value(ops):
    return [get_value(x) for x in ops]


def set_value(x, value):
    assign_all([(x, value)], "set_value")


def batch_set_value(tuples):
    assign_all(tuples, "batch_set_value")


def zeros(shape, dtype=None, name=None):
    return _filled(shape, 0, dtype, name, "zeros")


def ones(shape, dtype=None, name=None):
    return _filled(shape, 1, dtype, name, "ones")


def _filled(shape_, value, dtype, name, api):
    dtype = _dtype(dtype)
    static, tensor = shp.shape_arg(api, shape_)
    if tensor is None:
        # Static shapes give variables, as in Keras's TensorFlow backend
        # (optimizers keep their accumulators in K.zeros).
        shp.check_static_shape(api, static)
        limits.check_shape(api, static, dtype, "the array")
        return variable(np.full(static, value, dtype=dtype), dtype=dtype, name=name)
    return shp.fill(api, shape_, value, dtype)


def eye(size, dtype=None, name=None):
    dtype = _dtype(dtype)
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError("eye: size must be an int or a pair (rows, cols), got %r" % (size,))
        n, m = (integer("eye", "size", d) for d in size)
    else:
        n = m = integer("eye", "size", size)
    if n < 0 or m < 0:
        raise ValueError("eye: negative size %r" % (size,))
    limits.check_shape("eye", (n, m), dtype, "the matrix")
    return variable(np.eye(n, m, dtype=dtype), dtype=dtype, name=name)


def zeros_like(x, dtype=None, name=None):
    return ew.zeros_like_tensor(x, dtype)


def ones_like(x, dtype=None, name=None):
    return ew.ones_like(x, dtype)


def identity(x, name=None):
    x = as_tensor(x)
    return Identity()(x, name=name)


def cast(x, dtype):
    return ew.cast(x, dtype)


def print_tensor(x, message=""):
    """``x`` unchanged; prints ``message`` and the value each time it is computed."""
    return PrintTensor(str(message))(as_tensor(x))


update = state.update
update_add = state.update_add
update_sub = state.update_sub
moving_average_update = state.moving_average_update


# ------------------------------------------------------------------ functions

def function(inputs, outputs, updates=None, **kwargs):
    """Compile ``outputs`` (and ``updates``) of ``inputs`` into a callable."""
    return Function(inputs, outputs, updates=_update_tensors(updates or []), **kwargs)


def _update_tensors(updates):
    """Updates as tensors: a (variable, new_value) pair becomes K.update's."""
    if isinstance(updates, dict):
        updates = list(updates.items())
    out = []
    for u in updates:
        if isinstance(u, (list, tuple)):
            if len(u) != 2:
                raise ValueError("function: an update must be a (variable, new_value) pair, "
                                 "got %r" % (u,))
            out.append(state.update(u[0], u[1]))
        else:
            out.append(u)  # Function checks that it is a tensor
    return out


def gradients(loss, variables):
    return _gradients(loss, variables)


def stop_gradient(variables):
    if isinstance(variables, (list, tuple)):
        return [StopGradient()(as_tensor(v)) for v in variables]
    return StopGradient()(as_tensor(variables))


# ------------------------------------------------------------------ session

def clear_session():
    """Forget uids, name scopes, cached functions and the learning phase."""
    config.reset_uids()
    config.reset_learning_phase()
    _function.clear_caches()
    import gc
    gc.collect()


def manual_variable_initialization(value):
    """Kept for Keras: cyback variables always hold their value from creation."""
    _session_state["manual_init"] = bool(value)


_session_state = {"manual_init": False, "session": None}


class Session(object):
    """What ``get_session()`` returns: ``run(fetches, feed_dict)`` evaluates tensors."""

    graph = None

    def run(self, fetches, feed_dict=None, **kwargs):
        feed_dict = dict(feed_dict or {})
        single = not isinstance(fetches, (list, tuple))
        fetch_list = [fetches] if single else list(fetches)
        values = []
        tensors, slots = [], []
        for i, f in enumerate(fetch_list):
            if isinstance(f, Tensor):
                tensors.append(f)
                slots.append(i)
            values.append(f)
        if tensors:
            placeholders = list(feed_dict)
            fn = Function(placeholders, tensors)
            for i, v in zip(slots, fn([feed_dict[p] for p in placeholders])):
                values[i] = v
        return values[0] if single else values

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def as_default(self):
        return self


def get_session():
    if _session_state["session"] is None:
        _session_state["session"] = Session()
    return _session_state["session"]


def set_session(session):
    if not hasattr(session, "run"):
        raise TypeError("set_session: expected an object with a run(fetches, feed_dict) "
                        "method, got %r" % (session,))
    _session_state["session"] = session


class _Graph(object):
    """The default graph: cyback has one implicit graph; this stands for it."""

    def as_default(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def get_collection(self, name):
        return []


_GRAPH = _Graph()


def get_graph():
    return _GRAPH


def symbolic(func):
    """Decorator kept for Keras API compatibility: cyback is always symbolic."""
    return func


def eager(func):
    """Decorator kept for Keras API compatibility: cyback is always symbolic."""
    return func


class control_dependencies(object):
    """Inside the block, ops that read a variable updated by one of
    ``control_inputs`` (results of K.update/update_add/...) read its new value,
    as TensorFlow's control dependencies order them. Keras's stateful metrics
    rely on this: their result is total / count after this batch's update."""

    def __init__(self, control_inputs):
        if control_inputs is None:
            control_inputs = []
        elif not isinstance(control_inputs, (list, tuple)):
            control_inputs = [control_inputs]
        self.control_inputs = list(control_inputs)

    def __enter__(self):
        assigned = {}
        for t in self.control_inputs:
            node = getattr(t, "node", None)
            if node is not None and isinstance(node.op, _function.Assign):
                assigned[node.inputs[0]] = t
        push_after_updates(assigned)
        return self

    def __exit__(self, *exc):
        pop_after_updates()
        return False


# errors escaping each function name it; nodes remember it (graph/calls.py)
# (not ``function``: its errors name it already, and an error folding a
# constant while it compiles names the function that built the op)
_calls.name_functions(globals(), [n for n in __all__ if n != "function"])
