"""The plan optimizer: rewrites between the generic clean-up of a plan (fold,
simplify, CSE in ``function.rewritten_steps``) and its code generation.

What an op can do in a plan is declared on the op, as hooks (see
``graph/op.py``); the passes here only walk the graph and ask:

1. local rewrites, in topological order: ``op.rewrite(inputs, ctx)`` may
   return replacement outputs. ``Binary('multiply').rewrite`` folds a product
   with a per-channel weight vector into the weights of the op before it,
   through that op's ``scale_output`` hook: BatchNormalization at inference
   becomes the conv / dense before it with scaled weights and a bias;
   then, once every such rewrite has seen the graph, ``op.lower(inputs,
   ctx)`` in a second walk, which may replace an op by one that runs on a
   layout of its weights made once (a Dense or conv kernel packed into
   panels: ``PackedProduct``, ``PackedConv``), which no rewrite of the
   first walk need recognise; and ``op.share(inputs, ctx)`` in a third,
   which sees each step's readers (``ctx.readers``): an int8 layer whose
   output several int8 layers read makes their uint8 codes itself;
2. element-wise fusion (``graph/fusion.py``): element-wise chains, with the
   conv or dense product that feeds them, become one step.

An inference plan (one that assigns no variable) gets every pass, and its
weight-only sub-graphs are computed once and refolded only when a variable
changes (``graph/frozen.py``). A training plan keeps values bit-identical to
the graph as written: no local rewrites, fusion restricted to the exact
opcodes.

``CYBACK_OPTIMIZE=0`` in the environment or ``set_graph_optimizer(False)``
turns the optimizer off (plans built afterwards run the graph as written).
"""
from cyback.graph import concurrent, fusion
from cyback.graph.tensor import Constant, Placeholder, Variable
from cyback.kernels import settings as _settings

# CYBACK_OPTIMIZE=0 starts with the optimizer off (a bad value warns, through
# the settings registry, and leaves it on).
_state = {"enabled": bool(_settings.get("CYBACK_OPTIMIZE"))}


def set_graph_optimizer(enabled):
    """Turn the plan optimizer on or off for plans built from now on."""
    if not isinstance(enabled, bool):
        raise TypeError("set_graph_optimizer: expected True or False, got %r" % (enabled,))
    _state["enabled"] = enabled


def graph_optimizer():
    """Whether plans built now are optimized."""
    return _state["enabled"]


class Context(object):
    """What rewrite hooks may ask about the plan being optimized."""

    def __init__(self, steps, targets, inference):
        self.inference = inference
        self._users = {}
        self._producer = {}
        for op, ins, outs in steps:
            for x in ins:
                self._users[x] = self._users.get(x, 0) + 1
            for o in outs:
                self._producer[o] = (op, ins)
        for t in targets:
            self._users[t] = self._users.get(t, 0) + 1
        self._weight = {}
        self._steps = steps
        self._readers = None
        #: the outputs of the step whose hook runs (set by the pass)
        self.outputs = ()
        #: uint8 codes the ``share`` walk made: a float32 tensor (or the
        #: codes themselves) -> ((scale, zero point), codes)
        self.codes = {}

    #: what a reader that takes a residual as codes wants (``codes_wanted``):
    #: codes of any quantization, the one the other readers asked for
    ANY_CODES = ("any", "codes")

    #: the replacement of a tensor by the rewrites so far (set by the pass)
    resolve = staticmethod(lambda t: t)

    def producer(self, t):
        """``(op, inputs)`` of the step that makes ``t``, its inputs as the
        plan reads them (after the plan's substitutions, such as the learning
        phase, and the rewrites so far; a graph node's own inputs may still
        be the unsubstituted ones), or None for a leaf."""
        step = self._producer.get(t)
        if step is not None:
            return step[0], [self.resolve(x) for x in step[1]]
        if t.node is None:
            return None
        return t.node.op, list(t.node.inputs)     # made by a rewrite

    def users(self, t):
        """Readers of ``t`` in the plan as written (a tensor that replaces one
        of the plan has that one's readers; any other tensor made by a
        rewrite has its one reader)."""
        return self._users.get(t, 1)

    def readers(self, t):
        """``(op, position, outputs)`` of every step that reads ``t`` in the
        plan as written (a plan output is not a step: compare with
        ``users``)."""
        if self._readers is None:
            self._readers = {}
            for op, ins, outs in self._steps:
                for at, x in enumerate(ins):
                    self._readers.setdefault(x, []).append((op, at, outs))
        return self._readers.get(t, [])

    def codes_wanted(self, t):
        """Per reader of ``t``, the (scale, zero point) of the uint8 codes it
        would take in place of ``t`` (its ``codes_wanted`` hook), or None."""
        wants = []
        for op, at, outs in self.readers(t):
            hook = getattr(op, "codes_wanted", None)
            wants.append(hook(at, self, outs) if hook is not None else None)
        return wants

    def codes_all_want(self, t):
        """The one (scale, zero point) every reader of ``t`` takes it as codes
        of, or None (a plan output, a float32 reader, two quantizations)."""
        wants = self.codes_wanted(t)
        if not wants or None in wants or len(wants) != self.users(t):
            return None
        # a reader of a residual takes codes of any quantization
        concrete = [w for w in wants if w != self.ANY_CODES]
        if not concrete or any(w != concrete[0] for w in concrete):
            return None
        return concrete[0]

    def codes_through(self, op, inputs):
        """``op`` (one that commutes with quantizing its input: a max pool, a
        zero padding where the code of 0.0 is 0) applied to the uint8 codes
        the step before made of its input, when every reader of its output
        takes those codes; the output recorded as codes. Else None."""
        made = self.codes.get(inputs[0])
        if made is None or self.codes_all_want(self.outputs[0]) != made[0]:
            return None
        y = op(made[1], *inputs[1:])
        self.codes[y] = (made[0], y)
        return [y]

    def replaced(self, old, new):
        """The pass: ``new`` takes the place of ``old`` for the rewrites after."""
        if old in self._users:
            self._users[new] = self._users[old]

    def is_weight(self, t):
        """Whether ``t`` depends on no placeholder and no impure op: a value
        an inference plan computes once."""
        known = self._weight.get(t)
        if known is not None:
            return known
        stack = [t]
        while stack:
            x = stack[-1]
            if x in self._weight:
                stack.pop()
                continue
            if isinstance(x, (Constant, Variable)):
                self._weight[x] = True
            elif isinstance(x, Placeholder) or x.node is None or not x.node.op.pure:
                self._weight[x] = False
            else:
                pending = [y for y in x.node.inputs if y not in self._weight]
                if pending:
                    stack.extend(pending)
                    continue
                self._weight[x] = all(self._weight[y] for y in x.node.inputs)
            stack.pop()
        return self._weight[t]

    def scale(self, t, v):
        """``t * v`` computed by the op that makes ``t`` with scaled weights
        (its ``scale_output`` hook), or None. ``t`` must have no other reader."""
        node = t.node
        if node is None or self.users(t) != 1 or not self.is_weight(v):
            return None
        hook = getattr(node.op, "scale_output", None)
        if hook is None:
            return None
        return hook(node.inputs, t, v, self)

    @staticmethod
    def channel_vector(v, out, axis):
        """``v`` flattened to the size of ``out``'s ``axis`` when it broadcasts
        along that axis only, else None."""
        try:
            kind, ax = fusion.classify(v.shape, out.shape)
        except fusion.Unfusable:
            return None
        if kind != fusion.CHAN or len(out.shape) + ax != axis % len(out.shape):
            return None
        return v


def optimize(steps, targets, inference, resteps):
    """The steps and targets of an optimized plan. ``resteps(targets)``
    re-walks a rewritten graph into steps (fold, CSE)."""
    if inference:
        for hook in ("rewrite", "lower", "share"):
            targets, changed = _local_rewrites(steps, targets, hook)
            if changed:
                steps, targets = resteps(targets)
    skip = set()
    if inference:
        ctx = Context(steps, targets, inference)
        skip = {o for _, _, outs in steps for o in outs if ctx.is_weight(o)}
    steps = fusion.fuse(steps, targets, exact=not inference, skip=skip)
    if inference:
        steps = join_depthwise_blocks(steps, targets)
        steps = join_sole_readers(steps, targets)
        steps = concurrent.run_side_by_side(steps)
    return steps, targets


def join_depthwise_blocks(steps, targets):
    """Each depthwise convolution step with the 1x1 convolution step before
    it (whose output only it reads) and the one after it (the only reader of
    its output) as one step, where its stage joins them (the ``block_stage``
    hooks: ops/depthwise_block.py). The joined step takes the place of the
    last of its steps, where every input it reads is ready."""
    producer, readers = {}, {}
    for i, (op, ins, outs) in enumerate(steps):
        for o in outs:
            producer[o] = i
        for x in ins:
            readers.setdefault(x, []).append(i)
    for t in targets:
        readers.setdefault(t, []).append(None)

    def stage(i):
        if i is None or i in taken:
            return None
        op, ins, outs = steps[i]
        hook = getattr(op, "block_stage", None)
        return hook(ins) if hook is not None and len(outs) == 1 else None

    def sole_reader(t):
        found = readers.get(t, [])
        return found[0] if len(found) == 1 else None

    taken, placed = set(), {}
    for i in range(len(steps)):
        dw = stage(i)
        if dw is None or dw.kind != "depthwise":
            continue
        e = producer.get(dw.x)
        expand = stage(e) if e is not None and sole_reader(dw.x) == i else None
        p = sole_reader(steps[i][2][0])
        project = stage(p)
        if project is not None and project.x is not steps[i][2][0]:
            project = None
        joined = dw.join(expand, project)
        if joined is None:
            continue
        op, ins = joined
        members = [i] + ([e] if op.expand else []) + ([p] if op.project else [])
        last = max(members)
        taken.update(members)
        placed[last] = (op, ins, list(steps[last][2]))
    if not placed:
        return steps
    return [placed[i] if i in placed else s for i, s in enumerate(steps)
            if i in placed or i not in taken]


def join_sole_readers(steps, targets):
    """Each step whose one output one other step alone reads, with that
    reader, as one step where the maker's op takes the reader in (its
    ``join_reader`` hook: an int8 1-D convolution and a max over its
    positions, ops/quantized_extreme.py). The joined step takes the reader's
    place, where every input it reads is ready."""
    readers = {}
    for i, (op, ins, outs) in enumerate(steps):
        for x in ins:
            readers.setdefault(x, []).append(i)
    for t in targets:
        readers.setdefault(t, []).append(None)
    joined, taken = {}, set()
    for i, (op, ins, outs) in enumerate(steps):
        hook = getattr(op, "join_reader", None)
        if hook is None or len(outs) != 1 or i in taken:
            continue
        found = readers.get(outs[0], [])
        if len(found) != 1 or found[0] is None or found[0] in taken:
            continue
        j = found[0]
        made = hook(steps[j][0], ins, steps[j][1])
        if made is None:
            continue
        taken.update((i, j))
        joined[j] = (made[0], made[1], list(steps[j][2]))
    if not joined:
        return steps
    return [joined.get(i, s) for i, s in enumerate(steps) if i in joined or i not in taken]


def _local_rewrites(steps, targets, hook_name):
    ctx = Context(steps, targets, inference=True)
    repl = {}

    def resolve(t):
        return repl.get(t, t)

    ctx.resolve = resolve

    changed = False
    for op, ins, outs in steps:
        new_ins = [resolve(x) for x in ins]
        ctx.outputs = outs
        hook = getattr(op, hook_name, None)
        new = hook(new_ins, ctx) if hook is not None else None
        if new is None and any(a is not b for a, b in zip(new_ins, ins)):
            new = op(*new_ins)
            new = list(new) if isinstance(new, tuple) else [new]
        if new is not None:
            changed = True
            for o, n in zip(outs, new):
                if n is not o:
                    n.name = o.name
                    repl[o] = n
                    ctx.replaced(o, n)
    return [resolve(t) for t in targets], changed
