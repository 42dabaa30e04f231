"""The gradient of a loop: backprop through time as a reverse loop.

``BackwardLoop`` differentiates one step of a Scan and generates the reverse
loop (``scan_program.compile_loop``) that runs that gradient from the last step
to the first. The forward loop records the intermediates the gradient reads
(residuals), so the reverse loop recomputes nothing. The gradients of
invariants are sums over steps; a term that is a product of per-step values (a
recurrent kernel's ``h_t^T dz_t``) or a broadcast sum (a bias) is not
accumulated step by step but becomes one GEMM (one reduction) over all steps
after the loop (the op's ``steps_summed`` and ``sum_over_steps`` hooks).
"""
from collections import namedtuple

from cyback.graph.function import leaves_of, topo_nodes
from cyback.graph.tensor import Constant, Placeholder, is_float_dtype
from cyback.ops import elementwise as ew
from cyback.ops.gradients import gradients_with_seeds
from cyback.ops.reduction import reduce_sum
from cyback.ops.scan_program import compile_loop
from cyback.ops.scan_trace import addends, clone

# The (T, ...) stacks outside the reverse loop that its per-step values come
# from or go to: the forward sequences, the recorded residuals, the gradients
# of the forward outputs, and the values the reverse loop itself emits.
SEQUENCE, RESIDUAL, OUTPUT_GRAD, EMITTED = "sequence", "residual", "output grad", "emitted"


class StackRef(namedtuple("StackRef", "kind index")):
    """A per-step value of the reverse loop as found outside it: the
    ``index``-th stack of ``kind`` (one of SEQUENCE, RESIDUAL, OUTPUT_GRAD,
    EMITTED)."""
    __slots__ = ()

    def of(self, stacks):
        """The tensor in ``stacks`` (``{kind: [tensor, ...]}``)."""
        return stacks[self.kind][self.index]


class SummedInLoop(namedtuple("SummedInLoop", "index")):
    """A term of an invariant's gradient that the reverse loop sums step by
    step: its ``index``-th sum."""
    __slots__ = ()

    def total(self, stacks, sums, like):
        return sums[self.index]


class SummedAfterLoop(namedtuple("SummedAfterLoop", "op refs")):
    """A term of an invariant's gradient summed over all steps by one op after
    the loop (``op.sum_over_steps``) from the stacks of its per-step operands
    (``refs``, StackRefs)."""
    __slots__ = ()

    def total(self, stacks, sums, like):
        return self.op.sum_over_steps([r.of(stacks) for r in self.refs], like, _sum_steps)


def _sum_steps(stack):
    """A (T, ...) stack summed over its steps (the tool ``sum_over_steps``
    hooks are given)."""
    return reduce_sum(stack, 0, False)


def _summed_over_steps(op, ins):
    """Which of ``ins`` to record per step so that the sum over all steps of
    ``op``'s output is one op on their (T, ...) stacks after the loop (the
    op's ``steps_summed`` hook), or None."""
    hook = getattr(op, "steps_summed", None)
    return hook(ins) if hook is not None else None


class BackwardLoop(object):
    """The gradient of one step of ``scan`` (a Scan), split for a reverse loop.

    ``residuals``: forward tensors the gradient reads per step (step
    intermediates and state values), recorded by the forward loop and read by
    the gradient graph from placeholders; ``shape_refs``: forward tensors it
    reads only for their shape (the last step's value serves every step).
    ``loop`` (from ``compile_loop``) runs over the sequences, the residuals and
    the output gradients, carrying the state gradients; it emits ``emits`` per
    step and sums ``accums`` over the steps. ``g_seq``: for each sequence, the
    StackRef of its gradient (None: no gradient); ``inv_plan``: for each
    invariant, the terms of its gradient (SummedInLoop, SummedAfterLoop).
    """

    def __init__(self, scan):
        api = scan.api
        fwd_targets = scan.body_outputs + scan.body_states
        self.g_out = [Placeholder(o.shape, o.dtype, name="%s_gy%d" % (api, i))
                      for i, o in enumerate(scan.body_outputs)]
        self.g_state = [Placeholder(s.shape, s.dtype, name="%s_gs%d" % (api, i))
                        for i, s in enumerate(scan.body_states)]
        inner = scan.seq_in + scan.state_in + scan.inv_in
        reached = set(leaves_of(fwd_targets))
        wrt = [x for x in inner if is_float_dtype(x.dtype) and x in reached]
        grads = gradients_with_seeds(fwd_targets, self.g_out + self.g_state, wrt) if wrt else []
        by_input = dict(zip(wrt, grads))
        grads = [by_input.get(x) for x in inner]

        fwd_nodes = {id(n) for n in topo_nodes(fwd_targets)}
        avail = set(scan.seq_in) | set(scan.inv_in) | set(self.g_out) | set(self.g_state)
        live = [g for g in grads if g is not None]
        # Forward tensors the gradient reads: by value (recorded every step)
        # or only for their shape (a step's shapes do not change from step
        # to step, so the last step's value serves every step).
        residuals, shape_refs = [], []

        def need(x, shape_only):
            if x in avail or type(x) is Constant:
                return
            if x in scan.state_in or (x.node is not None and id(x.node) in fwd_nodes):
                if shape_only:
                    if x not in shape_refs and x not in residuals:
                        shape_refs.append(x)
                elif x not in residuals:
                    if x in shape_refs:
                        shape_refs.remove(x)
                    residuals.append(x)
        for node in topo_nodes(live):
            if id(node) in fwd_nodes:
                continue
            only = getattr(node.op, "shape_only_inputs", ())
            for i, x in enumerate(node.inputs):
                need(x, i in only)
        for g in live:
            need(g, False)
        self.residuals, self.shape_refs = residuals, shape_refs
        self.res_in = [Placeholder(r.shape, r.dtype, name="%s_r%d" % (api, i))
                       for i, r in enumerate(residuals)]
        self.shape_in = [Placeholder(r.shape, r.dtype, name="%s_l%d" % (api, i))
                         for i, r in enumerate(shape_refs)]
        replace = dict(zip(residuals, self.res_in))
        replace.update(zip(shape_refs, self.shape_in))
        body = clone(live, replace)
        it = iter(body)
        grads = [next(it) if g is not None else None for g in grads]
        ns, nst = len(scan.seq_in), len(scan.state_in)
        g_seq, g_state_in, g_inv = grads[:ns], grads[ns:ns + nst], grads[ns + nst:]

        # Where each per-step value comes from outside the backward loop.
        outer_seq = {}
        for kind, phs in ((SEQUENCE, scan.seq_in), (RESIDUAL, self.res_in),
                          (OUTPUT_GRAD, self.g_out)):
            for i, ph in enumerate(phs):
                outer_seq[ph] = StackRef(kind, i)
        self.emits = []

        def emit(t):
            if t in outer_seq:
                return outer_seq[t]
            if t not in self.emits:
                self.emits.append(t)
            return StackRef(EMITTED, self.emits.index(t))

        per_step = set(outer_seq) | set(self.g_state)

        def varies(t):
            return any(x in per_step for x in leaves_of([t])) or t in per_step

        def terms(g):
            parts = addends(g.node.op, g.node.inputs) if g.node is not None else None
            if parts is not None and all(x.shape == g.shape for x in parts):
                return [p for x in parts for p in terms(x)]
            return [g]

        # g_seq first, so that a hoisted projection's gradient and a sunk
        # product that reads it share one stored sequence.
        self.g_seq = [emit(g) if g is not None else None for g in g_seq]
        self.accums, self.inv_plan = [], []
        for x, g in zip(scan.inv_in, g_inv):
            plan = []
            if g is not None:
                for term in terms(g):
                    node = term.node
                    same = term.shape == x.shape and term.dtype == x.dtype
                    which = _summed_over_steps(node.op, node.inputs) \
                        if same and node is not None else None
                    if which and all(varies(node.inputs[i]) for i in which):
                        plan.append(SummedAfterLoop(node.op, [emit(node.inputs[i])
                                                              for i in which]))
                    else:
                        self.accums.append(term)
                        plan.append(SummedInLoop(len(self.accums) - 1))
            self.inv_plan.append(plan)
        self.g_init = g_state_in
        carries = [(ph, g if g is not None else ew.zeros_like_tensor(ph))
                   for ph, g in zip(self.g_state, g_state_in)]
        self.loop, self.steps = compile_loop(
            api + " backward", scan.seq_in + self.res_in + self.g_out, carries,
            scan.inv_in + self.shape_in, self.emits, self.accums, reverse=True)
