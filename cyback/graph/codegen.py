"""What the two code generators share: a compiled function's plan
(``graph/function.py``) and a loop program (``ops/scan_program.py``) are each
the source of one Python function, in which every tensor has a name and an
op may be called as the NumPy expression it stands for."""
from cyback.graph.tensor import Constant


class Namer(object):
    """The names of the tensors in one generated function: a Constant is bound
    to its value in the namespace ``ns`` the source runs in, as
    ``<constant_prefix><n>``; any other tensor is a local, ``<local_prefix><n>``.
    ``n`` counts the names given so far, so that no two tensors share one."""

    def __init__(self, ns, constant_prefix, local_prefix):
        self.ns = ns
        self._names = {}        # tensor id -> name
        self._constant = constant_prefix
        self._local = local_prefix

    def __call__(self, t):
        n = self._names.get(t.id)
        if n is None:
            if type(t) is Constant:
                n = "%s%d" % (self._constant, len(self._names))
                self.ns[n] = t.value
            else:
                n = "%s%d" % (self._local, len(self._names))
            self._names[t.id] = n
        return n

    def bind(self, t, name):
        """Name ``t`` ``name`` (an argument of the generated function, or the
        name of the value that stands in for it)."""
        self._names[t.id] = name


def inline_call(op, ins, outs, ns, name_of):
    """``(source, multiply-adds, takes out=)`` computing the op's one output as
    a direct NumPy call (the op's ``inline_src`` hook, see ``graph/op.py``), or
    None. Never for a 0-d result, which NumPy returns as a scalar."""
    hook = getattr(op, "inline_src", None)
    if hook is None or len(outs) != 1 or outs[0].ndim == 0:
        return None
    return hook(ins, outs, ns, [name_of(x) for x in ins])
