"""Compile a graph into a plan and run it: ``function(inputs, outputs, updates)``.

Compilation:
1. collect the nodes the outputs and updates need (topological order);
2. rewrite: substitute known placeholders (the learning phase), fold ops whose
   inputs are all known and whose results are not large (``graph/limits.py``),
   let ops simplify themselves (``Op.simplify``: a switch
   on a known condition forwards one branch), merge equal pure ops (CSE);
3. keep only the steps the targets still need and generate one Python function
   that calls each op's ``compute`` in order, deleting every intermediate after
   its last use so peak memory stays near the live set.

Calling checks each feed against its placeholder, runs the plan with a
snapshot of the variables' values, then assigns every update at once (Theano
semantics: all updates see pre-update values; nothing is assigned if any
update is invalid). A Function keeps no per-call state, so threads may call it
at once. A Function with updates holds its variables' lock group (see
graph/tensor.py) from the read to the assignment, so concurrent calls of
updating functions that share a variable run one after the other and lose no
update; a Function without updates takes no lock.
"""
import collections
import itertools
import linecache
import threading

import numpy as np

from cyback import config
from cyback.graph import binding, calls, collector, limits, optimize, plan_source
from cyback.graph import profile as _profile
from cyback.graph import tensor as tensor_mod
from cyback.graph.codegen import Namer, inline_call
from cyback.graph.frozen import Frozen
from cyback.graph.plan_source import StepSource
from cyback.graph.shapes import format_shape
from cyback.graph.tensor import (
    Constant,
    Placeholder,
    Tensor,
    Variable,
    acquire_group,
    as_tensor,
    assign_all,
    integer_problem,
    join_groups,
)
from cyback.kernels import datastack, large_blocks


class Assign(object):
    """Marker base class for ops whose output is the new value of input 0 (a Variable)."""


def topo_nodes(targets, stop=()):
    """Nodes needed by ``targets``, inputs before users (a depth-first walk
    taking inputs in order, iterative), not walking past the tensors in
    ``stop``."""
    order, seen = [], set()
    for t in targets:
        node = t.node
        if node is None or node in seen or t in stop:
            continue
        seen.add(node)
        # each entry: a node and the inputs of it still to look at
        stack = [(node, iter(node.inputs))]
        while stack:
            node, pending = stack[-1]
            for x in pending:
                xn = x.node
                if xn is not None and xn not in seen and x not in stop:
                    seen.add(xn)
                    stack.append((xn, iter(xn.inputs)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def leaves_of(targets):
    """Variables and placeholders the targets depend on."""
    return _leaves(topo_nodes(targets), targets)


def _leaves(nodes, targets):
    """``leaves_of(targets)`` from ``topo_nodes(targets)``."""
    found, seen = [], set()
    for node in nodes:
        for x in node.inputs:
            if x.node is None and id(x) not in seen:
                seen.add(id(x))
                found.append(x)
    for t in targets:
        if t.node is None and id(t) not in seen:
            seen.add(id(t))
            found.append(t)
    return found


class _Plan(object):
    """One compiled program: ``run(*feeds, *variable_values)`` → target values."""

    def __init__(self, run, feed_slots, variables, step_lines, steps, src, frozen=None,
                 targets=()):
        self.run = run
        self.targets = list(targets)      # what run returns, in order
        self.frozen = frozen              # the weight-only prelude (graph/frozen.py) or None
        self.src = src                    # the generated source of run
        self.feed_slots = feed_slots      # index in Function.inputs, in run's arg order
        self.variables = variables        # Variables read, in run's arg order
        # source line → (op, the backend function that built it), for errors
        self.step_lines = step_lines
        self.steps = steps
        self.large_rows = _rows_for_large_blocks(steps)
        # generated file name -> (source, step_lines), for every variant
        self.sources = {}
        # the bound variants (graph/binding.py), for a plan whose steps bind
        self.binding = None

    def takes_large_blocks(self, feeds):
        """Whether a call on ``feeds`` may allocate an array large enough for
        the cache of large blocks (swapping NumPy's allocator in and out
        costs about half a microsecond, which a small plan need not pay)."""
        rows = self.large_rows
        if rows is None:
            return False
        if rows == 0:
            return True
        for f in feeds:
            try:
                if len(f) >= rows:
                    return True
            except TypeError:       # a scalar or an object: cannot tell
                return True
        return False


def _rows_for_large_blocks(steps):
    """The fewest rows (the length of the longest feed) at which some array
    of the plan reaches the large-block cache's size: 0 when one may at any
    size (a static one that large, or a shape unknown past its first axis),
    None when the cache is off or no array can."""
    least = large_blocks.min_bytes()
    if least is None:
        return None
    rows = None
    for _, _, outs in steps:
        for t in outs:
            shape = t.shape
            if not shape:
                continue
            if None in shape[1:]:
                return 0
            try:
                itemsize = np.dtype(t.dtype).itemsize
            except TypeError:       # not a NumPy dtype: assume the widest
                itemsize = 16
            size = int(np.prod(shape[1:], dtype=np.int64)) * itemsize
            if shape[0] is not None:
                if size * shape[0] >= least:
                    return 0
            elif size > 0:
                need = -(-least // size)
                rows = need if rows is None else min(rows, need)
    return rows


def _rewrite(targets, givens):
    """Fold, simplify and merge. Returns (steps, resolve) where steps are
    (op, resolved_inputs, outputs) and resolve maps a tensor to its replacement."""
    # Tensors are keyed by id here and in the passes below: a tensor's own
    # hash is a Python call, and a plan looks tensors up several times each.
    repl = {}
    for ph, value in givens.items():
        repl[ph.id] = Constant(np.asarray(value, dtype=ph.dtype))

    def resolve(t):
        r = repl.get(t.id)
        while r is not None and r is not t:
            t, r = r, repl.get(r.id)
        return t

    steps, seen = [], {}
    keys = {}       # id(op) -> op.key(): an op object serves many nodes
    for node in topo_nodes(targets):
        op = node.op
        ins = [resolve(x) for x in node.inputs]
        if op.pure and not isinstance(op, Assign) and all(type(x) is Constant for x in ins) \
                and all(limits.foldable(o.shape, o.dtype) for o in node.outputs):
            try:
                values = op.compute(*[x.value for x in ins])
            except (ValueError, TypeError) as e:
                if node.call is not None:
                    calls.name_error(e, node.call)
                raise
            for out, v in zip(node.outputs, values):
                repl[out.id] = Constant(np.asarray(v, dtype=out.dtype))
            continue
        forward = op.simplify(ins) if hasattr(op, "simplify") else None
        if forward is not None:
            for out, f in zip(node.outputs, forward):
                repl[out.id] = resolve(f)
            continue
        key = keys.get(id(op), keys)
        if key is keys:
            key = keys[id(op)] = op.key()
        if key is not None:
            key = (key, tuple(x.id for x in ins))
            prev = seen.get(key)
            if prev is not None:
                for out, p in zip(node.outputs, prev):
                    repl[out.id] = p
                continue
            seen[key] = node.outputs
        steps.append((op, ins, node.outputs))
    return steps, resolve


def rewritten_steps(targets, givens):
    """The rewritten steps (see ``_rewrite``) that ``targets`` still need, in
    order, and the targets after rewriting."""
    steps, resolve = _rewrite(targets, givens)
    targets = [resolve(t) for t in targets]
    producer = {}
    for i, (op, ins, outs) in enumerate(steps):
        for o in outs:
            producer[o.id] = i
    needed, stack = set(), [producer[t.id] for t in targets if t.id in producer]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        for x in steps[i][1]:
            k = producer.get(x.id)
            if k is not None and k not in needed:
                stack.append(k)
    return [s for i, s in enumerate(steps) if i in needed], targets


def _build_plan(inputs, targets, givens, name, n_outputs=None):
    """Compile ``targets`` into a ``_Plan``.

    ``run(*feeds)`` takes the values of the needed ``inputs`` (in
    ``feed_slots`` order) and returns a tuple with the targets' values.

    With ``n_outputs`` (a Function's plan), ``run`` also checks every feed
    against its placeholder (a fast inline test of class, dtype and known
    sizes, the full ``_check_feed`` otherwise) and returns ``(outputs, rest)``:
    a list of the first ``n_outputs`` targets ready for the caller (0-d
    arrays as NumPy scalars, leaves copied so that the caller cannot change a
    variable or constant through them) and a tuple of the remaining targets.
    """
    steps, targets = rewritten_steps(targets, givens)
    frozen = None
    if n_outputs is not None and optimize.graph_optimizer():
        inference = not any(isinstance(op, Assign) for op, _, _ in steps)
        # Re-walking a rewritten graph must substitute the same givens: the
        # steps' outputs are the graph's own tensors, whose nodes still read
        # the placeholders (the learning phase) the first walk replaced.
        steps, targets = optimize.optimize(steps, targets, inference,
                                           lambda t: rewritten_steps(t, givens))
        if inference:
            steps, frozen = _freeze(steps, targets)

    ns = {"__builtins__": __builtins__, "ndarray": np.ndarray}
    name_of = Namer(ns, "c", "t")

    feed_index = {ph: i for i, ph in enumerate(inputs)}
    args, feed_slots, variables, prologue = [], [], [], []
    frozen_set = set(frozen.wanted) if frozen is not None else set()
    for leaf in leaves_of(targets):
        if isinstance(leaf, Constant) or leaf in frozen_set:
            continue
        if isinstance(leaf, Variable):
            if frozen is None:
                variables.append(leaf)
            continue
        if leaf in givens:
            continue
        if leaf not in feed_index:
            if isinstance(leaf, Placeholder) and leaf.default is not None:
                givens_value = Constant(np.asarray(leaf.default, dtype=leaf.dtype))
                name_of.bind(leaf, name_of(givens_value))
                continue
            raise _missing_placeholder(name, leaf)
        feed_slots.append(feed_index[leaf])
        arg = name_of(leaf)
        args.append(arg)
        if n_outputs is not None:
            prologue.extend(_feed_check_src(leaf, arg, ns, name).split("\n"))
    if frozen is not None and frozen.wanted:
        # The weight-only values, refolded first if any variable changed.
        ns.update(_EP=tensor_mod._epoch, _FE=frozen.epoch, _FZ=frozen.box,
                  _refresh=frozen.refresh)
        prologue.append("    if _EP[0] != _FE[0]:")
        prologue.append("        _refresh()")
        prologue.append("    %s, = _FZ[0]" % ", ".join(name_of(t) for t in frozen.wanted))
    # Variables are read once, at the start of the run: every step and every
    # update sees the same (pre-update) values.
    for v in variables:
        var_name = "V%d" % len(prologue)
        ns[var_name] = v
        prologue.append("    %s = %s._value" % (name_of(v), var_name))

    last_use = {}
    for i, (op, ins, outs) in enumerate(steps):
        for x in ins:
            last_use[x.id] = i
    keep = {t.id for t in targets}

    body = []
    may_bind = n_outputs is not None and not any(isinstance(op, Assign) for op, _, _ in steps)
    for i, (op, ins, outs) in enumerate(steps):
        fname = "f%d" % i
        needed = tuple(o.id in last_use or o.id in keep for o in outs)
        node = outs[0].node
        where = (op, node.call if node is not None else None)
        args_src = [name_of(x) for x in ins]
        dead = []
        for x in ins:
            if last_use.get(x.id) == i and x.id not in keep and type(x) is not Constant:
                x_name = name_of(x)
                if x_name not in dead:     # an input read twice is deleted once
                    dead.append(x_name)
        inline = _inline_step(op, ins, outs, ns, name_of)
        # The comment names the op in tracebacks (see _annotate).
        if inline is not None:
            body.append(StepSource("%s = %s" % (name_of(outs[0]), inline), dead,
                                   _op_label(op), where))
            continue
        ns[fname] = op.compute_for(needed) if hasattr(op, "compute_for") else op.compute
        outs_src = ", ".join(name_of(o) if n else "_" for o, n in zip(outs, needed))
        bind = getattr(op, "bind", None) if may_bind and len(outs) == 1 and needed[0] \
            else None
        body.append(StepSource("%s, = %s(%s)" % (outs_src, fname, ", ".join(args_src)), dead,
                               _op_label(op), where, bind, fname, name_of(outs[0]),
                               args_src))
    if n_outputs is None:
        epilogue = ["    return (%s)" % "".join(name_of(t) + ", " for t in targets)]
    else:
        ns["_out"], ns["_copy"] = _to_output, _copy_value
        outs_src = []
        for t in targets[:n_outputs]:
            src = name_of(t)
            if t.node is None or t in frozen_set:
                src = "_copy(%s)" % src
            if t.ndim == 0:
                src = "_out(%s)" % src
            outs_src.append(src)
        epilogue = ["    return [%s], (%s)" % (", ".join(outs_src), "".join(
            name_of(t) + ", " for t in targets[n_outputs:]))]
    src, step_lines = plan_source.source(args, prologue, body, epilogue)
    filename = "<cyback function %s #%d>" % (name or "", next(_plan_ids))
    exec(compile(src, filename, "exec"), ns)
    plan = _Plan(ns["run"], feed_slots, variables, step_lines, steps, src, frozen, targets)
    plan.sources[filename] = (src, step_lines)
    if any(s.bind is not None for s in body):
        plan.binding = binding.Binding(plan, ns, args, prologue, body, epilogue, filename)
    return plan


def _inline_step(op, ins, outs, ns, name_of):
    """The source computing the step's one output in the plan itself, for ops
    whose ``inline_src`` is exactly their compute (``inline_in_plan``; see
    graph/op.py), or None."""
    if not getattr(op, "inline_in_plan", False):
        return None
    made = inline_call(op, ins, outs, ns, name_of)
    return None if made is None else made[0]


def _freeze(steps, targets):
    """Split an inference plan's steps into the per-call steps and the
    ``Frozen`` prelude of its weight-only steps."""
    weight, per_call = set(), []
    frozen_steps = []
    for step in steps:
        op, ins, outs = step
        if op.pure and all(type(x) is Constant or isinstance(x, Variable) or x in weight
                           for x in ins):
            frozen_steps.append(step)
            weight.update(outs)
        else:
            per_call.append(step)
    wanted = []
    seen = set()
    for x in [x for _, ins, _ in per_call for x in ins] + list(targets):
        if (x in weight or isinstance(x, Variable)) and x not in seen:
            seen.add(x)
            wanted.append(x)
    if not wanted:
        return per_call, None
    return per_call, Frozen(frozen_steps, wanted)


def _missing_placeholder(fname, leaf):
    return ValueError("%s: the outputs need placeholder '%s' %s, which is not among the inputs"
                      % (_fn_label(fname), leaf.name, format_shape(leaf.shape)))


def _fn_label(name):
    return "function '%s'" % name if name else "function"


def _feed_check_src(ph, arg, ns, fname):
    """Source of the inline feed test for placeholder ``ph`` (argument ``arg``):
    anything unusual goes to ``_check_feed``, which converts or raises."""
    check = "chk_" + arg
    ns[check] = lambda value, ph=ph: _check_feed(ph, value, fname)
    if ph.sparse:
        return "    %s = %s(%s)" % (arg, check, arg)
    dtype = "dt_" + arg
    ns[dtype] = np.dtype(ph.dtype)
    tests = ["%s.__class__ is not ndarray" % arg, "%s.dtype is not %s" % (arg, dtype),
             "len(%s.shape) != %d" % (arg, len(ph.shape))]
    tests += ["%s.shape[%d] != %d" % (arg, i, d) for i, d in enumerate(ph.shape) if d is not None]
    return "    if %s:\n        %s = %s(%s)" % (" or ".join(tests), arg, check, arg)


def _check_feed(ph, value, fname):
    """``value`` as the array (or CSR matrix) fed to placeholder ``ph``, or an
    error naming the placeholder."""
    where = _fn_label(fname)
    if ph.sparse and _is_scipy_sparse(value):
        import scipy.sparse as sp
        value = sp.csr_matrix(value, dtype=ph.dtype)
        arr_shape = value.shape
    else:
        try:
            arr = np.asarray(value)
        except Exception as e:
            raise TypeError("%s: cannot convert the value fed to placeholder '%s' to an array: "
                            "%s" % (where, ph.name, e)) from None
        want = np.dtype(ph.dtype)
        if arr.dtype != want:
            kind = arr.dtype.kind
            ok = kind in "biuf" and not (kind == "f" and want.kind != "f")
            if not ok and kind == "f" and want.kind in "biu" and arr.size and \
                    np.all(np.isfinite(arr)) and np.all(np.mod(arr, 1) == 0):
                ok = True   # whole-valued floats fed to an int placeholder
            if not ok and kind == "f" and not arr.size:
                ok = True
            if not ok:
                raise TypeError("%s: placeholder '%s' has dtype %s; cannot feed a value of dtype "
                                "%s" % (where, ph.name, ph.dtype, arr.dtype))
            problem = integer_problem(arr, want)
            if problem:
                # A cast would wrap around (2**40 + 7 → 7) or truncate.
                raise ValueError("%s: placeholder '%s' has dtype %s; the value fed holds %s"
                                 % (where, ph.name, ph.dtype, problem))
            arr = arr.astype(want)
        value, arr_shape = arr, arr.shape
    shape = ph.shape
    if len(arr_shape) != len(shape) or any(
            d is not None and d != a for d, a in zip(shape, arr_shape)):
        raise ValueError("%s: placeholder '%s' expects shape %s, got a value of shape %s"
                         % (where, ph.name, format_shape(shape), format_shape(arr_shape)))
    return value


def _is_scipy_sparse(value):
    return hasattr(value, "tocsr") and hasattr(value, "nnz")


class Function(object):
    """A compiled graph: ``f(list_of_input_values)`` → list of output values.

    It pickles as its graph and its constructor's arguments, never its plans
    (``__reduce__``, from graph/pickling.py)."""

    def __init__(self, inputs, outputs, updates=None, name=None, **kwargs):
        unknown = set(kwargs) - {"fetches", "feed_dict", "session_kwargs", "options",
                                 "run_metadata"}
        if unknown:
            raise ValueError("function: invalid keyword argument(s) %s" % sorted(unknown))
        if isinstance(inputs, dict):
            inputs = list(inputs.values())
        self.inputs = list(inputs or [])
        self._single = isinstance(outputs, Tensor) or not isinstance(outputs, (list, tuple))
        outputs = [outputs] if self._single else list(outputs)
        fetches = kwargs.get("fetches") or []
        if not isinstance(fetches, (list, tuple)):
            fetches = [fetches]
        self.name = name
        for i, x in enumerate(self.inputs):
            if not isinstance(x, Placeholder):
                raise TypeError("function: input %d must be a placeholder, got %r" % (i, x))
        self.outputs = [as_tensor(o) for o in outputs]
        self._fetches = [as_tensor(f) for f in fetches if isinstance(f, Tensor)]
        self._feed_dict = dict(kwargs.get("feed_dict") or {})
        self._updates = self._check_updates(updates or [])
        nodes = topo_nodes(self.outputs + self._fetches + self._updates)
        assigns = [node.outputs[0] for node in nodes if isinstance(node.op, Assign)]
        self._assigns = assigns
        # update, update_add, ...: the function each update came from, for errors.
        self._assign_names = [a.node.op.api or "update" for a in assigns]
        self._targets = self.outputs + self._fetches + [a for a in assigns]
        for ph in self._feed_dict:
            if not isinstance(ph, Placeholder):
                raise TypeError("function: feed_dict keys must be placeholders, got %r" % (ph,))
        self._lp = config.learning_phase_placeholder()
        self._lp_index = next((i for i, x in enumerate(self.inputs) if x is self._lp), None)
        self._plans = {}
        self._lock = threading.Lock()
        self._n_out = len(self.outputs)
        self._n_fetch = len(self._fetches)
        # A graph that does not read the learning phase needs one plan only:
        # build it now, so that a missing input is reported here.
        if all(u.node is not None and isinstance(u.node.op, Assign) for u in self._updates):
            # the targets' graph is the one just walked
            leaves = _leaves(nodes, self._targets)
        else:
            leaves = leaves_of(self._targets)
        # Every variable an updating function reads or writes joins one lock
        # group; calls hold it from the variables' read to the assignment.
        self._group = None
        if assigns:
            self._group = join_groups([x for x in leaves if isinstance(x, Variable)])
        self._only_plan = None
        if not any(x is self._lp for x in leaves):
            self._only_plan = self._plan(0)
            self._only_optimized = optimize.graph_optimizer()

    @staticmethod
    def _check_updates(updates):
        # K.function (api/core.py) has made (variable, new_value) pairs update tensors.
        for u in updates:
            if not isinstance(u, Tensor):
                raise TypeError("function: an update must be a (variable, new_value) pair or "
                                "the result of K.update/update_add/update_sub, got %r" % (u,))
        return list(updates)

    def profile(self, inputs, calls=10, learning_phase=0):
        """The time of each step of the plan a call on ``inputs`` runs
        (``cyback.graph.profile``): which ops a call spends its time in."""
        return _profile.profile(self, inputs, calls, learning_phase)

    def plan_ops(self, learning_phase=0):
        """The ops a call with this learning phase runs, in order: what folding,
        common subexpressions and the plan optimizer left of the graph (with the
        optimizer setting in force now)."""
        return [op for op, _, _ in self._plan(learning_phase).steps]

    def _plan(self, lp_value):
        key = (lp_value, optimize.graph_optimizer())
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans.get(key)
                if plan is None:
                    # Specializing on the learning phase lets constant folding
                    # drop the branch of every in_train_phase that is not taken.
                    givens = dict(self._feed_dict)
                    givens[self._lp] = lp_value
                    with collector.paused():
                        plan = _build_plan(self.inputs, self._targets, givens, self.name,
                                           n_outputs=self._n_out)
                    self._plans[key] = plan
        return plan

    def __call__(self, inputs=None, *more):
        if type(inputs) is not list:
            if more:
                inputs = [inputs] + list(more)
            elif inputs is None:
                inputs = []
            elif isinstance(inputs, dict):
                inputs = [self._dict_feed(inputs, x) for x in self.inputs]
            elif not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
        elif more:
            inputs = [inputs] + list(more)
        if len(inputs) != len(self.inputs):
            raise ValueError("%s: expected %d input value(s) for placeholders %s, got %d"
                             % (_fn_label(self.name), len(self.inputs),
                                [x.name for x in self.inputs], len(inputs)))
        plan = self._only_plan
        if plan is None or self._only_optimized is not optimize._state["enabled"]:
            if self._lp_index is not None:
                lp_value = int(np.asarray(inputs[self._lp_index]).item() != 0)
            else:
                lp_value = config.fixed_learning_phase() or 0
            plan = self._plan(lp_value)
        feeds = [inputs[i] for i in plan.feed_slots]
        if self._group is None:
            outs, rest = _run_plan(plan, feeds)
            if self._assigns:   # only with the lock disabled (benchmarks)
                self._apply(rest[self._n_fetch:])
        else:
            group = self._group = acquire_group(self._group)   # start at the root next time
            try:
                outs, rest = _run_plan(plan, feeds)
                self._apply(rest[self._n_fetch:])
            finally:
                group.lock.release()
        return outs[0] if self._single else outs

    def _dict_feed(self, feeds, ph):
        if ph in feeds:
            return feeds[ph]
        if ph.name in feeds:
            return feeds[ph.name]
        raise ValueError("%s: the feed dict has no value for placeholder '%s' %s"
                         % (_fn_label(self.name), ph.name, format_shape(ph.shape)))

    def _apply(self, values):
        assign_all([(t.node.inputs[0], v) for t, v in zip(self._assigns, values)],
                   self._assign_names, lock=False)


def _run_plan(plan, feeds):
    # arrays above glibc's mmap threshold come from a cache of blocks kept
    # mapped between calls (kernels/large_blocks.pyx)
    previous = large_blocks.enter() if plan.takes_large_blocks(feeds) else None
    try:
        # on a frame stack chunk of the thread's own: a plan's hundreds of
        # Python calls otherwise cost an mmap each when the caller stands near
        # the end of one of CPython's (kernels/datastack.pyx)
        bound = plan.binding
        run = bound.run if bound is not None and binding._state["enabled"] else plan.run
        return datastack.call(run, tuple(feeds))
    except Exception as e:
        new = _annotate(e, plan)
        if new is e:
            raise
        raise new from e    # the chain keeps the traceback into the op
    finally:
        large_blocks.leave(previous)


def _copy_value(x):
    """A copy the caller may modify: of an array, or of a sparse matrix as such."""
    return x.copy() if hasattr(x, "tocsr") else np.array(x)


def _to_output(x):
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return x[()]
    return x


_plan_ids = itertools.count()


def _op_label(op):
    api = getattr(op, "api", None)
    name = type(op).__name__
    return name if not api or api == name else "%s (%s)" % (api, name)


def _annotate(e, plan):
    """An exception raised while running ``plan``, for re-raising ``from e``:
    the same type with the op's name added to the message, and before it the
    backend function that built the op when the message does not name it
    (``e`` itself when the type cannot be rebuilt). The plan's source goes into linecache, so the
    chained traceback shows the plan line that called the op, and below it the
    op's compute and the kernel."""
    tb = e.__traceback__
    step, filename = None, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "run" and code.co_filename in plan.sources:
            filename = code.co_filename
            step = plan.sources[filename][1].get(tb.tb_lineno)
        tb = tb.tb_next
    if filename is not None and filename not in linecache.cache:
        # Only failing plans are registered: linecache never drops such
        # entries, and most plans never fail.
        src = plan.sources[filename][0]
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    if step is None:
        return e
    op, call = step
    message = "%s (while running %s)" % (e, op.api or type(op).__name__)
    if call is not None and not calls.mentions(message, call):
        message = "%s: %s" % (call, message)
    try:
        new = type(e)(message)
    except Exception:
        return e
    if str(new) == str(e):      # a type whose message is not its first argument
        return e
    return new


# ------------------------------------------------------------------- eval

_eval_cache = collections.OrderedDict()
_eval_lock = threading.Lock()
_EVAL_CACHE_SIZE = 256


def eval_tensor(x):
    """The value of ``x`` as a NumPy array (no placeholders allowed, but the
    learning phase, which takes its default)."""
    x = as_tensor(x)
    if type(x) is Constant:
        return np.array(x.value)
    if isinstance(x, Variable):
        return np.array(x._value)
    with _eval_lock:
        entry = _eval_cache.get(x.id)
        if entry is not None:
            _eval_cache.move_to_end(x.id)
    if entry is None:
        entry = (x, Function([], [x], name="eval"))
        with _eval_lock:
            _eval_cache[x.id] = entry
            while len(_eval_cache) > _EVAL_CACHE_SIZE:
                _eval_cache.popitem(last=False)
    out = entry[1]([])[0]
    return np.asarray(out) if not hasattr(out, "toarray") else out


Tensor.eval = eval_tensor


def clear_caches():
    with _eval_lock:
        _eval_cache.clear()
