"""Pickling of graphs and compiled functions built on cyback.

What travels is the graph and the variables' current values; what is rebuilt
on the other side is everything derived from them:

- a Variable, Constant or Placeholder pickles an explicit state (value, dtype,
  name, ...) and is rebuilt through its constructor, so its lock and any
  attribute added later are made fresh there;
- a node output pickles its node, index, shape, dtype and name, and gets a new
  ``id`` from the receiving process's counter (ids are hashes and CSE keys:
  they must not collide with the tensors already there); Keras's
  ``_keras_history`` (which points at layers) is left behind;
- the learning-phase placeholder is a per-process singleton and is pickled
  as a reference to it;
- an op pickles its attributes with any lock left out and made anew; a Scan
  is rebuilt from its step graph through its constructor, which compiles
  its loops again (ops like it register their reducer with
  ``register_reducer``: this module imports no ops);
- a Function is rebuilt through its constructor from its inputs, outputs,
  updates and options: plans are compiled there, never pickled.

Pickling follows references recursively, so a deep graph would exceed the
recursion limit. A function (and a Scan's step graph) therefore pickles its
nodes first as a flat list in topological order: when a node is written, its
inputs have already been written, and each entry adds a constant depth.

Tensors and functions get their ``__reduce__`` from this module, which sits
above tensor.py and function.py. Keras models are pickled by
cyback/_keras_compat.py (the graph knows no Keras); pickles made before that
code moved there name ``cyback.graph.pickling._load_pickled_keras_model``,
which that module registers here (``register_moved``).
"""
import copyreg
import hashlib
import threading

from cyback import config
from cyback.graph import tensor as _tensor
from cyback.graph.function import Function, topo_nodes
from cyback.graph.op import Op
from cyback.graph.tensor import Constant, Node, Placeholder, Tensor, Variable

#: Keras attributes a tensor keeps across a pickle (``_keras_history`` is not
#: one: it references the layer that made the tensor).
_TENSOR_EXTRAS = ("_keras_shape", "_uses_learning_phase", "_keras_initialized")

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


class _Lock(object):
    """Stands for a lock in a pickled op; the op gets a new one."""

    def __init__(self, reentrant):
        self.reentrant = reentrant


# ------------------------------------------------------------------ tensors

def _extras(t):
    d = t.__dict__
    return {k: d[k] for k in _TENSOR_EXTRAS if k in d}


def _restore(obj, name, extras):
    obj.name = name     # as it was: not re-prefixed by the current name scope
    obj.__dict__.update(extras)
    return obj


def _make_variable(value, dtype, name, constraint, extras):
    return _restore(Variable(value, dtype, name, constraint), name, extras)


def _make_constant(value, name, extras):
    return _restore(Constant(value), name, extras)


def _make_placeholder(shape, dtype, name, sparse, default, extras):
    return _restore(Placeholder(shape, dtype, None, sparse, default), name, extras)


def _learning_phase():
    return config.learning_phase_placeholder()


def _new_tensor(cls):
    t = cls.__new__(cls)
    t.id = next(_tensor._counter)
    return t


def _set_tensor_state(t, state):
    t.__dict__.update(state)


def reduce_tensor(t):
    """``__reduce__`` for every kind of Tensor (see the module docstring)."""
    _register_ops()
    cls = type(t)
    if isinstance(t, Variable):
        return _make_variable, (t._value, t.dtype, t.name, t.constraint, _extras(t))
    if isinstance(t, Placeholder):
        if t is config.learning_phase_placeholder(create=False):
            return _learning_phase, ()
        return _make_placeholder, (t.shape, t.dtype, t.name, t.sparse, t.default, _extras(t))
    if isinstance(t, Constant):
        return _make_constant, (t.value, t.name, _extras(t))
    if t.node is None:
        raise TypeError("cannot pickle %r: a leaf tensor of unknown kind %s"
                        % (t, cls.__name__))
    state = {"node": t.node, "index": t.index, "shape": t.shape, "dtype": t.dtype,
             "name": t.name}
    state.update(_extras(t))
    # The state (which holds the node, whose outputs hold this tensor) is
    # written after the tensor is memoized, which closes the cycle.
    return _new_tensor, (cls,), state, None, None, _set_tensor_state


def _make_node(op, inputs):
    return Node(op, inputs)


def _set_node_outputs(node, outputs):
    node.outputs = outputs


def _reduce_node(node):
    return _make_node, (node.op, list(node.inputs)), node.outputs, None, None, \
        _set_node_outputs


# ---------------------------------------------------------------------- ops

def _new_op(cls):
    return cls.__new__(cls)


def _set_op_state(op, state):
    for k, v in state.items():
        if isinstance(v, _Lock):
            state[k] = threading.RLock() if v.reentrant else threading.Lock()
    op.__dict__.update(state)


def _reduce_op(op):
    # an op class may leave run-time caches out of its state (__getstate__)
    own = type(op).__getstate__ is not object.__getstate__
    state = {}
    for k, v in (op.__getstate__() if own else op.__dict__).items():
        if isinstance(v, _LOCK_TYPES):
            v = _Lock(isinstance(v, _LOCK_TYPES[1]))
        state[k] = v
    return _new_op, (type(op),), state, None, None, _set_op_state


#: {Op subclass: reducer} for ops whose constructor does not take their
#: attributes (the loop ops, which hold a step graph). The module defining such
#: an op registers it (register_reducer), so this layer imports no ops.
_reducers = {}


def register_reducer(cls, reducer):
    """Pickle instances of ``cls`` (an Op subclass) with ``reducer(op)``, which
    returns ``(callable, args)`` as ``__reduce__`` does."""
    with _register_lock:
        _reducers[cls] = reducer
        if cls in _registered:
            copyreg.pickle(cls, reducer)


_registered = set()
_register_lock = threading.Lock()


def _register_ops():
    """Put every Op subclass defined so far in copyreg's dispatch table.

    Runs whenever a tensor or function is pickled, so ops defined after
    cyback was imported (a user's own) are covered as well. copyreg's table
    is consulted by pickle and by cloudpickle alike.
    """
    stack = [Op]
    with _register_lock:
        while stack:
            cls = stack.pop()
            stack.extend(cls.__subclasses__())
            if cls in _registered:
                continue
            _registered.add(cls)
            if cls is not Op and cls not in copyreg.dispatch_table:
                copyreg.pickle(cls, _reducers.get(cls, _reduce_op))
        if Node not in copyreg.dispatch_table:
            copyreg.pickle(Node, _reduce_node)


# ---------------------------------------------------------------- functions

def _make_function(nodes, inputs, outputs, updates, name, options):
    return Function(inputs, outputs, updates=updates, name=name, **options)


def reduce_function(f):
    """``__reduce__`` of Function: its graph as a flat node list, then what
    its constructor takes."""
    _register_ops()
    targets = list(f.outputs) + list(f._fetches) + list(f._updates)
    outputs = f.outputs[0] if f._single else list(f.outputs)
    options = {}
    if f._fetches:
        options["fetches"] = list(f._fetches)
    if f._feed_dict:
        options["feed_dict"] = dict(f._feed_dict)
    return _make_function, (topo_nodes(targets), list(f.inputs), outputs, list(f._updates),
                            f.name, options)


# --------------------------------------------------------------------- misc

def token(data):
    """A short stable digest of bytes (the key of per-process model caches)."""
    return hashlib.sha1(data).hexdigest()


#: Functions that pickles made by earlier releases name in this module, defined
#: now by a layer above it (the Keras model loader): {name: function}.
_moved = {}


def register_moved(name, function):
    """Let a pickle that names ``cyback.graph.pickling.<name>`` load with
    ``function``."""
    _moved[name] = function


def __getattr__(name):
    # pickle finds a pickled function's name with getattr on this module
    try:
        return _moved[name]
    except KeyError:
        raise AttributeError("module %r has no attribute %r" % (__name__, name)) from None


Tensor.__reduce__ = reduce_tensor
Function.__reduce__ = reduce_function

__all__ = ["reduce_tensor", "reduce_function", "register_reducer", "register_moved", "token"]
