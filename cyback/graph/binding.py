"""Bound plans: an inference plan called again and again on feeds of the
same shapes runs its steps' kernels directly (graph/plan_source.py).

A plan whose steps can bind (``Op.bind``) starts on its plain ``run``. When
two calls in a row bring feeds of the same shapes, the second runs the plan's
record variant, which computes as the plain run does and collects each
step's direct call; the bound variant made from them serves the calls after
it. A call on feeds of other shapes takes the plain run from the bound one's
guard; two such calls in a row with the same shapes record again, for them
(a plan keeps the bound variants of its last few feed shapes). New frozen
weights record again too.

``set_enabled(False)`` makes every plan run plain (the A/B of
benchmarks/bench_plan_binding.py, and a way out should a bound step ever
misbehave); ``CYBACK_BIND_STEPS=0`` in the environment does the same from the
start.
"""
import threading
import weakref

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
    has bound the steps, then the bound function).

    A variant is kept per feed shapes and frozen weights' epoch: a quantized
    step's call is made for one set of weight arrays and declines others, so
    new weights (``K.set_value``) record the steps again. Nothing here points
    back at the plan, and the variants reach this object only through a weak
    reference: a plan and its weights go as soon as their function does."""

    def __init__(self, plan, ns, args, prologue, steps, epilogue, filename):
        self.plain = plan.run
        self._sources = plan.sources
        self._ns = ns
        self._epoch = ns.get("_FE")     # the frozen weights' epoch box, if any
        self._args = list(args)
        self._prologue = list(prologue)
        self._steps = steps
        self._epilogue = epilogue
        self._filename = filename
        self._lock = threading.Lock()
        self._seen = None           # key of the last plain call
        self._record_run = None
        self._bound = {}            # key -> bound run, or the plain run: nothing binds
        self._compiled = 0
        self.run = self._learn

    def source(self):
        """The source of the bound variant calls run now, or None (still
        learning, or bound plans keep these feeds on the plain run)."""
        code = getattr(self.run, "__code__", None)
        entry = None if code is None else self._sources.get(code.co_filename)
        return None if entry is None else entry[0]

    def _key(self, feeds):
        return (_feed_shapes(feeds), None if self._epoch is None else self._epoch[0])

    def _learn(self, *feeds):
        # also the bound functions' way out: their guard sends feeds of other
        # shapes (or a refreshed plan's) here
        key = self._key(feeds)
        run = self._bound.get(key)
        if run is self.plain:
            return run(*feeds)
        if run is not None:
            self.run = run
            return run(*feeds)
        if key != self._seen or None in key[0]:
            self._seen = key
            return self.plain(*feeds)
        return self._record(feeds, key)

    def _record(self, feeds, key):
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
        if len(self._bound) >= BOUND_SHAPES:
            self._bound.clear()
        if binds:
            names = {"S%d" % j: s for j, s in enumerate(shapes)}
            tests = ["%s.shape != S%d" % (a, j) for j, a in enumerate(self._args)]
            if self._epoch is not None:
                names["E0"] = self._epoch[0]
                tests.append("_FE[0] != E0")
            names.update(plan_source.bound_names(binds))
            names["_plain"] = _weak_learn(self)
            run = self._compile("bound", names, binds=binds,
                                guard=" or ".join(tests) or "False")
            self._bound[(shapes, key[1])] = self.run = run
        else:
            self._bound[key] = self.plain
        self._seen = None
        return result

    def _compile(self, mode, names, binds=None, guard=None, prologue_extra=()):
        src, step_lines = plan_source.source(self._args, self._prologue + list(prologue_extra),
                                             self._steps, self._epilogue, mode, binds, guard)
        ns = dict(self._ns)
        ns.update(names)
        self._compiled += 1
        # a name per variant: errors are traced to their own variant's lines
        filename = "%s %s %d>" % (self._filename[:-1], mode, self._compiled)
        exec(compile(src, filename, "exec"), ns)
        self._sources[filename] = (src, step_lines)
        return ns["run"]


def _weak_learn(binding):
    """A bound function's way back to ``binding._learn`` that does not keep
    the binding alive (the plain run once it is gone)."""
    ref = weakref.ref(binding)
    plain = binding.plain

    def learn(*feeds):
        b = ref()
        return plain(*feeds) if b is None else b._learn(*feeds)
    return learn
