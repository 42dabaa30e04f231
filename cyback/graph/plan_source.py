"""The source of a plan's ``run`` function (graph/function.py), in its three
variants:

- ``plain``: each step calls its op's compute (or is the op's inline NumPy
  source) and deletes the values it read last;
- ``record``: the same, and each step that can bind (``Op.bind``) also hands
  its op's direct call for arrays like the ones it just read to the
  ``_binds`` dict the function takes as its last argument;
- ``bound``: each step bound by a record run calls that direct call (the
  prepared kernel call its compute would reach through a few layers of
  Python), and its compute only when the call returns None (arrays that do
  not fit); a guard first sends feeds of other shapes than the recorded ones
  to the plain run (``_plain``).

A bound step runs the kernel its compute runs on those arrays, so the
variants give the same bits; what they save is the Python between the plan
and the kernel: at batch 1 a convolution's kernel runs for a few
microseconds, about what its op's checks, cache lookups and dispatch cost.
"""


class StepSource(object):
    """One step as source: ``call`` is the step's line without its
    indentation (an assignment of the outputs), ``dead`` the names deleted
    after it, ``label`` the op's name for tracebacks, ``where`` (op, the
    backend function that built it) for errors; ``bind`` the op's bind hook
    (``Op.bind``) when the step may be bound, with ``fname`` its compute's
    name in the namespace, ``out`` its output's name and ``args`` its inputs'
    names."""

    __slots__ = ("call", "dead", "label", "where", "bind", "fname", "out", "args")

    def __init__(self, call, dead, label, where, bind=None, fname=None, out=None, args=()):
        self.call = call
        self.dead = dead
        self.label = label
        self.where = where
        self.bind = bind
        self.fname = fname
        self.out = out
        self.args = args


def source(args, prologue, steps, epilogue, mode="plain", binds=None, guard=None):
    """``(source, step_lines)``: the ``run`` function of ``args`` (names)
    with these ``prologue`` and ``epilogue`` lines around the ``steps``
    (StepSource) in ``mode``; ``step_lines`` maps a line number of the
    source to its step's ``where``.

    ``record`` adds the ``_binds`` argument and, for each step with a bind
    hook, a line storing the hook's answer under the step's index (the hook
    is ``B<i>`` in the namespace, where the caller puts it: see
    ``record_names``). ``bound`` takes ``binds`` ({index: (call, positions,
    listed)}, the call named ``K<i>``) and ``guard``, the source of a test
    that is true when the feeds are not the recorded ones."""
    head = list(args) + (["_binds"] if mode == "record" else [])
    lines = ["def run(%s):" % ", ".join(head)] + list(prologue)
    if mode == "bound":
        lines.append("    if %s:" % guard)
        lines.append("        return _plain(%s)" % ", ".join(args))
    step_lines = {}
    for i, s in enumerate(steps):
        bound = binds.get(i) if mode == "bound" and s.bind is not None else None
        step_lines[len(lines) + 1] = s.where
        if bound is not None:
            _, positions, listed = bound
            picked = ", ".join("None" if p is None else s.args[p] for p in positions)
            call = "K%d([%s])" % (i, picked) if listed else "K%d(%s)" % (i, picked)
            lines.append("    %s = %s  # %s" % (s.out, call, s.label))
            lines.append("    if %s is None:" % s.out)
            step_lines[len(lines) + 1] = s.where
            lines.append("        %s, = %s(%s)  # %s" % (s.out, s.fname, ", ".join(s.args),
                                                         s.label))
        else:
            lines.append("    %s  # %s" % (s.call, s.label))
            if mode == "record" and s.bind is not None:
                step_lines[len(lines) + 1] = s.where
                lines.append("    _binds[%d] = _bind(B%d, (%s))" % (
                    i, i, "".join(a + ", " for a in s.args)))
        if s.dead:
            lines.append("    del " + ", ".join(s.dead))
    lines.extend(epilogue)
    return "\n".join(lines) + "\n", step_lines


def record_names(steps):
    """{'B<i>': bind hook} for the steps that may bind, and ``_bind``: the
    names a record variant's source calls."""
    names = {"B%d" % i: s.bind for i, s in enumerate(steps) if s.bind is not None}
    names["_bind"] = _bind
    return names


def _bind(hook, arrays):
    # A hook that fails leaves its step unbound: the step then runs its
    # compute, as in the plain plan, and the call goes on.
    try:
        return hook(arrays)
    except Exception:
        return None


def bound_names(binds):
    """{'K<i>': call} for a bound variant's source."""
    return {"K%d" % i: b[0] for i, b in binds.items()}
