"""Bound plans: an inference plan called again and again on feeds of the
same shapes runs its steps' kernels directly (graph/plan_source.py).

A plan whose steps can bind (``Op.bind``) starts on its plain ``run``. When
two calls in a row bring feeds of the same shapes, the second runs the plan's
record variant, which computes as the plain run does and collects each
step's direct call; the bound variant made from them serves the calls after
it. A call on feeds of other shapes takes the plain run from the bound one's
guard; two such calls in a row with the same shapes record again, for them
(a plan keeps the bound variants of its last few feed shapes).

``set_enabled(False)`` makes every plan run plain (the A/B of
benchmarks/bench_plan_overhead.py, and a way out should a bound step ever
misbehave); ``CYBACK_BIND_STEPS=0`` in the environment does the same from the
start.
"""
import threading

from cyback.graph import plan_source
from cyback.kernels import settings as _settings

# CYBACK_BIND_STEPS=0 starts with bound plans off (a bad value warns, through
# the settings registry, and leaves them on).
_state = {"enabled": bool(_settings.get("CYBACK_BIND_STEPS"))}


def set_enabled(on):
    """Turn bound plans on or off for every function; returns the previous
    setting."""
    previous = _state["enabled"]
    _state["enabled"] = bool(on)
    return previous


def enabled():
    return _state["enabled"]


#: The feed shapes a plan keeps bound variants for.
BOUND_SHAPES = 4


def _feed_shapes(feeds):
    return tuple(getattr(f, "shape", None) for f in feeds)


class Binding(object):
    """The bound variants of one plan: ``run`` is what the plan's calls run
    while bound plans are enabled (the learning wrapper until a record run
    has bound the steps, then the bound function)."""

    def __init__(self, plan, ns, args, prologue, steps, epilogue, filename):
        self.plan = plan
        self.plain = plan.run
        self._ns = ns
        self._args = list(args)
        self._prologue = list(prologue)
        self._steps = steps
        self._epilogue = epilogue
        self._filename = filename
        self._lock = threading.Lock()
        self._seen = None           # feed shapes of the last plain call
        self._record_run = None
        self._bound = {}            # feed shapes -> bound run
        self.run = self._learn

    def _learn(self, *feeds):
        # also the bound functions' way out: their guard sends feeds of other
        # shapes than they were recorded for here
        shapes = _feed_shapes(feeds)
        run = self._bound.get(shapes)
        if run is not None:
            self.run = run
            return run(*feeds)
        if shapes != self._seen or None in shapes:
            self._seen = shapes
            return self.plain(*feeds)
        return self._record(feeds)

    def _record(self, feeds):
        if self._record_run is None:
            with self._lock:
                if self._record_run is None:
                    self._record_run = self._compile(
                        "record", plan_source.record_names(self._steps), prologue_extra=[
                            "    _binds[-1] = (%s)" % "".join(
                                a + ".shape, " for a in self._args)])
        binds = {}
        result = self._record_run(*feeds, binds)
        shapes = binds.pop(-1)
        binds = {i: b for i, b in binds.items() if b is not None}
        if binds:
            names = {"S%d" % j: s for j, s in enumerate(shapes)}
            guard = " or ".join("%s.shape != S%d" % (a, j)
                                for j, a in enumerate(self._args)) or "False"
            names.update(plan_source.bound_names(binds))
            names["_plain"] = self._learn
            run = self._compile("bound", names, binds=binds, guard=guard)
            if len(self._bound) >= BOUND_SHAPES:
                self._bound.clear()
            self._bound[shapes] = self.run = run
        self._seen = None
        return result

    def _compile(self, mode, names, binds=None, guard=None, prologue_extra=()):
        src, step_lines = plan_source.source(self._args, self._prologue + list(prologue_extra),
                                             self._steps, self._epilogue, mode, binds, guard)
        ns = dict(self._ns)
        ns.update(names)
        filename = "%s %s>" % (self._filename[:-1], mode)
        exec(compile(src, filename, "exec"), ns)
        self.plan.sources[filename] = (src, step_lines)
        return ns["run"]
