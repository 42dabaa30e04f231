"""Where a compiled function's time goes: ``profile(function, inputs)`` runs the
function's plan one step at a time, timing each step's compute.

The steps are those of the plan a call runs (after folding, the optimizer and
frozen weights), run by an interpreter here instead of the plan's generated
code: each step costs the interpreter's bookkeeping too (a few microseconds),
so the steps' sum is a little above a real call, which the profile also
times. The interpreter's outputs are returned with the times, so a profile
can be checked against the function's own result.
"""
import time

import numpy as np

from cyback.graph.shapes import format_shape
from cyback.graph.tensor import Constant, Placeholder, Variable, weights_epoch


class StepTime(object):
    """One plan step: its index, what it computes (``label``: the op, or the ops
    of a fused step), the backend function that built it (``call``, or None),
    its input and output shapes and the median of its compute times."""

    __slots__ = ("index", "label", "call", "inputs", "outputs", "seconds")

    def __init__(self, index, label, call, inputs, outputs, seconds):
        self.index = index
        self.label = label
        self.call = call
        self.inputs = inputs
        self.outputs = outputs
        self.seconds = seconds

    def __repr__(self):
        return "StepTime(%d, %r, %.1f us)" % (self.index, self.label, self.seconds * 1e6)


class Profile(object):
    """``steps``: a StepTime per plan step, in order; ``call_seconds``: the
    median time of a real call of the function on the same inputs;
    ``outputs``: the interpreter's values of the function's outputs."""

    def __init__(self, steps, call_seconds, outputs):
        self.steps = steps
        self.call_seconds = call_seconds
        self.outputs = outputs

    @property
    def step_seconds(self):
        return sum(s.seconds for s in self.steps)

    def by_label(self):
        """[(label, number of steps, seconds)], the most time first."""
        totals = {}
        for s in self.steps:
            n, t = totals.get(s.label, (0, 0.0))
            totals[s.label] = (n + 1, t + s.seconds)
        return sorted(((k, n, t) for k, (n, t) in totals.items()), key=lambda r: -r[2])

    def table(self, top=15):
        """The profile as text: a call's time, the time per kind of step and the
        ``top`` slowest steps."""
        total = self.step_seconds or 1.0
        lines = ["a call: %.3f ms; its %d steps one by one: %.3f ms"
                 % (self.call_seconds * 1e3, len(self.steps), self.step_seconds * 1e3),
                 "", "%8s  %5s  %6s  %s" % ("ms", "steps", "share", "step")]
        for label, n, t in self.by_label():
            lines.append("%8.3f  %5d  %5.1f%%  %s" % (t * 1e3, n, 100.0 * t / total, label))
        if top:
            lines += ["", "the %d slowest steps:" % min(top, len(self.steps)),
                      "%8s  %5s  %s" % ("us", "step", "what (inputs -> output)")]
            for s in sorted(self.steps, key=lambda s: -s.seconds)[:top]:
                lines.append("%8.1f  %5d  %s%s %s -> %s" % (
                    s.seconds * 1e6, s.index, s.label,
                    " [%s]" % s.call if s.call and s.call not in s.label else "",
                    ", ".join(format_shape(x) for x in s.inputs),
                    ", ".join(format_shape(x) for x in s.outputs)))
        return "\n".join(lines)


def _label(op):
    describe = getattr(op, "describe", None)
    if describe is not None:
        return describe()
    return getattr(op, "api", None) or type(op).__name__


def profile(function, inputs, calls=10, learning_phase=0):
    """Time each step of ``function``'s plan (a ``K.function``) on ``inputs``
    (a list with a value per input placeholder): the median over ``calls``
    runs. Returns a ``Profile``."""
    if not isinstance(calls, int) or isinstance(calls, bool) or calls < 1:
        raise ValueError("profile: calls must be a positive int, got %r" % (calls,))
    if learning_phase not in (0, 1):
        raise ValueError("profile: learning_phase must be 0 or 1, got %r" % (learning_phase,))
    if function._assigns:
        raise ValueError("profile: the function assigns variables (updates); profile a "
                         "function of the same outputs without updates, so that timing "
                         "it does not change the variables")
    if not isinstance(inputs, (list, tuple)) or len(inputs) != len(function.inputs):
        raise ValueError("profile: expected a list of %d input value(s), got %r"
                         % (len(function.inputs), type(inputs).__name__))
    function(list(inputs))          # checks the inputs and refreshes frozen weights
    plan = function._plan(learning_phase)
    known = {}
    for slot in plan.feed_slots:
        ph = function.inputs[slot]
        known[ph.id] = np.asarray(inputs[slot], dtype=ph.dtype)
    frozen = plan.frozen
    if frozen is not None:
        if frozen.epoch[0] != weights_epoch():
            frozen.refresh()
        for t, v in zip(frozen.wanted, frozen.box[0]):
            known[t.id] = v

    def value_of(t, env):
        if type(t) is Constant:
            return t.value
        v = env.get(t.id)
        if v is not None:
            return v
        if isinstance(t, Variable):
            return t._value
        if isinstance(t, Placeholder) and t.default is not None:
            return np.asarray(t.default, dtype=t.dtype)
        raise ValueError("profile: no value for %r" % (t,))

    # A value goes once its last reader has run, as in the plan: kept, the
    # model's whole working set would be allocated afresh at every step.
    last_read = {}
    for i, (_, ins, _) in enumerate(plan.steps):
        for x in ins:
            last_read[x.id] = i
    for t in plan.targets:
        last_read[t.id] = len(plan.steps)
    shapes = {}
    times = np.zeros((calls, len(plan.steps)))
    env = None
    for c in range(calls):
        env = dict(known)
        for i, (op, ins, outs) in enumerate(plan.steps):
            args = [value_of(x, env) for x in ins]
            t0 = time.perf_counter()
            values = op.compute(*args)
            times[c, i] = time.perf_counter() - t0
            for o, v in zip(outs, values):
                env[o.id] = v
                shapes[o.id] = tuple(np.shape(v))
            del args, values
            for x in ins:
                if last_read.get(x.id) == i and x.id not in known:
                    env.pop(x.id, None)
    call_times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        function(list(inputs))
        call_times.append(time.perf_counter() - t0)
    steps = []
    for i, (op, ins, outs) in enumerate(plan.steps):
        node = outs[0].node
        steps.append(StepTime(i, _label(op), None if node is None else node.call,
                              [shapes[x.id] if x.id in shapes else
                               tuple(np.shape(value_of(x, env))) for x in ins],
                              [shapes[o.id] for o in outs if o.id in shapes],
                              float(np.median(times[:, i]))))
    outputs = [value_of(t, env) for t in plan.targets[:len(function.outputs)]]
    return Profile(steps, float(np.median(call_times)), outputs)
