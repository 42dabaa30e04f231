"""Which function of the backend API the calling thread is in.

Each public function of ``cyback.api`` runs inside ``named`` (the api
modules wrap their ``__all__`` with ``name_functions``):

- a ValueError or TypeError escaping it names it: helpers shared by several
  functions (axis checks, shape arguments, an op's shape rule) word their
  messages after themselves (``K.var(x, 5)`` would say "mean: axis 5 ..."),
  so the function the caller wrote leads the message;
- every node built while it runs records the outermost such function
  (``Node.call``), so that an error raised while a compiled function runs
  names the backend function that built the failing op, not only the op.
"""
import functools
import re
import threading
import types

_local = threading.local()


def current():
    """The outermost backend function the calling thread is in, or None."""
    stack = getattr(_local, "stack", None)
    return stack[0] if stack else None


def mentions(message, name):
    """Whether ``message`` names the function ``name`` (as a word, or with
    spaces for underscores)."""
    return re.search(r"(?<![\w.])%s(?!\w)" % re.escape(name), message) is not None or \
        name.replace("_", " ") in message


def name_error(e, name):
    """Put ``name: `` before the message of a plain ValueError or TypeError
    that does not name ``name`` yet (in place: the traceback stays)."""
    if type(e) not in (ValueError, TypeError) or len(e.args) != 1 or \
            not isinstance(e.args[0], str) or mentions(e.args[0], name):
        return
    e.args = ("%s: %s" % (name, e.args[0]),)


def named(name, fn):
    """``fn`` running as the backend function ``name`` (see the module
    docstring)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            stack = _local.stack
        except AttributeError:
            stack = _local.stack = []
        stack.append(name)
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as e:
            name_error(e, name)
            raise
        finally:
            stack.pop()
    return call


def name_functions(namespace, names):
    """Wrap the plain functions among ``names`` in the module ``namespace``
    with ``named``."""
    for name in names:
        fn = namespace[name]
        if isinstance(fn, types.FunctionType):
            namespace[name] = named(name, fn)
