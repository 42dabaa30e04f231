"""Tracing a step function and splitting its graph for a loop.

``trace_step`` calls the step once on inner placeholders (one slice of each
sequence, the states) and splits the traced sub-graph three ways:

- what does not depend on the inner placeholders is loop-invariant (weights,
  constants, dropout masks): computed once outside the loop, it becomes an
  input of the loop;
- nodes that depend only on the sequence slices and invariants, and whose op
  can be applied to all steps at once (its ``time_mapped`` hook: element-wise
  ops, ``x_t @ W``), are hoisted: computed once on the whole (T, B, ...)
  sequences — an RNN's input projection becomes one GEMM over all time steps
  — and fed to the loop as new sequences;
- the rest is the loop body, a sub-graph over fresh placeholders only.

Sums are regrouped first (``_regroup_sums``) so that their terms free of the
states are hoisted along with the projection.
"""
from collections import namedtuple

from cyback.graph.function import topo_nodes
from cyback.graph.tensor import Constant, Placeholder, as_tensor
from cyback.ops.elementwise import cast


def apply_op(op, inputs):
    """``op`` applied to ``inputs``: its outputs as a list."""
    out = op(*inputs)
    return list(out) if isinstance(out, tuple) else [out]


def clone(outputs, replace):
    """The graph of ``outputs`` rebuilt with ``replace`` (tensor → tensor) substituted."""
    memo = dict(replace)
    for node in topo_nodes(outputs, set(replace)):
        ins = [memo.get(x, x) for x in node.inputs]
        if all(a is b for a, b in zip(ins, node.inputs)):
            continue
        for old, new in zip(node.outputs, apply_op(node.op, ins)):
            memo[old] = new
    return [memo.get(o, o) for o in outputs]


def addends(op, ins):
    """The terms ``op`` adds up (its ``addends`` hook), or None."""
    hook = getattr(op, "addends", None)
    return hook(ins) if hook is not None else None


def _time_mapped(op, ins, variant):
    """The op that computes ``op`` for all steps at once on time-major stacks
    of its variant inputs (the op's ``time_mapped`` hook), or None."""
    hook = getattr(op, "time_mapped", None)
    return hook(ins, variant) if hook is not None else None


def _variant_set(targets, inner):
    """The tensors of the graph of ``targets`` that depend on ``inner``."""
    variant = set(inner)
    for node in topo_nodes(targets):
        if any(x in variant for x in node.inputs):
            variant.update(node.outputs)
    return variant


def _regroup_sums(targets, state_in):
    """Reorder sums so that their terms free of the states come first:
    ``(x_t @ W + h @ R) + b`` becomes ``(x_t @ W + b) + h @ R``, whose first
    part is then hoisted out of the loop with the projection."""
    nodes = topo_nodes(targets)
    uses = {}
    for node in nodes:
        for x in node.inputs:
            uses[x] = uses.get(x, 0) + 1
    for t in targets:
        uses[t] = uses.get(t, 0) + 1
    stateful = _variant_set(targets, state_in)

    def is_add(t):
        return t.node is not None and addends(t.node.op, t.node.inputs) is not None

    def terms(t, root):
        if is_add(t) and (t is root or uses.get(t) == 1) and t.dtype == root.dtype:
            return [p for x in addends(t.node.op, t.node.inputs) for p in terms(x, root)]
        return [t]

    replace = {}
    for node in nodes:
        out = node.outputs[0]
        if not is_add(out) or out not in stateful:
            continue
        parts = terms(out, out)
        free = [t for t in parts if t not in stateful]
        dep = [t for t in parts if t in stateful]
        if len(parts) < 3 or not free or not dep or \
                any(t.dtype != out.dtype for t in parts):
            continue
        # Already grouped (free terms first)? Then nothing to gain.
        if parts[:len(free)] == free and len(free) == 1:
            continue
        add, acc = out.node.op, None      # the root's own add, applied again
        for t in free + dep:
            acc = t if acc is None else add(acc, t)
        if acc.shape != out.shape:
            continue
        replace[out] = acc
    if not replace:
        return list(targets)
    return clone(targets, replace)


#: A traced step, split for a loop. The loop's inner placeholders: ``seq_in``
#: (the slices of the given sequences, then of the hoisted ones), ``state_in``,
#: ``inv_in`` (the invariants); the body's per-step ``outputs`` and
#: ``new_states`` over them; ``outer_inputs``: what to feed the loop op
#: (whole sequences, initial states, invariant tensors, in that order).
Traced = namedtuple("Traced", "seq_in state_in inv_in outputs new_states outer_inputs")


def _call_step(step, sequences, initial_states, name):
    """Placeholders for one step's slices and states, and what ``step``
    returns on them (states cast back to their initial dtype)."""
    seq_in = [Placeholder(s.shape[1:], s.dtype, name="%s_x%d" % (name, i))
              for i, s in enumerate(sequences)]
    state_in = [Placeholder(s.shape, s.dtype, name="%s_s%d" % (name, i))
                for i, s in enumerate(initial_states)]
    outputs, new_states = step(seq_in, state_in)
    outputs = [as_tensor(o) for o in outputs]
    new_states = [as_tensor(s) for s in new_states]
    if len(new_states) != len(state_in):
        raise ValueError("%s: the step function returned %d states for %d initial states"
                         % (name, len(new_states), len(state_in)))
    for i, (s_in, s_new) in enumerate(zip(state_in, new_states)):
        if s_new.dtype != s_in.dtype:
            new_states[i] = cast(s_new, s_in.dtype)
        if s_new.ndim != s_in.ndim:
            raise ValueError("%s: a state changed rank from %s to %s in the step function"
                             % (name, s_in.shape, s_new.shape))
        if any(a is not None and b is not None and a != b
               for a, b in zip(s_in.shape, s_new.shape)):
            raise ValueError("%s: a state changed shape from %s to %s in the step function"
                             % (name, s_in.shape, s_new.shape))
    return seq_in, state_in, outputs, new_states


def _hoistable(targets, seq_in, variant):
    """``{node: op over all steps}`` for the nodes that depend only on the
    sequence slices and invariants and that have a time-mapped form, and the
    tensors that depend only on the slices and invariants."""
    seq_only = set(seq_in)
    hoisted = {}
    for node in topo_nodes(targets):
        ins_v = [x in variant for x in node.inputs]
        if not any(ins_v) or not all(x in seq_only or x not in variant for x in node.inputs):
            continue
        mapped = _time_mapped(node.op, node.inputs, ins_v)
        if mapped is None:
            continue
        seq_only.update(node.outputs)
        hoisted[node] = mapped
    return hoisted, seq_only


def _frontier(targets, variant, hoisted, seq_only):
    """The loop's new inputs: invariant tensors read by variant nodes (or
    returned), and hoisted tensors read by nodes that stay in the loop (or
    returned)."""
    invariants, new_seqs = [], []
    for node in topo_nodes(targets):
        if node in hoisted or not any(x in variant for x in node.inputs):
            continue
        for x in node.inputs:
            if x in variant:
                if x in seq_only and x.node in hoisted and x not in new_seqs:
                    new_seqs.append(x)
            elif not isinstance(x, Constant) and x not in invariants:
                invariants.append(x)
    for t in targets:
        if t in seq_only and t.node in hoisted and t not in new_seqs:
            new_seqs.append(t)
        elif t not in variant and not isinstance(t, Constant) and t not in invariants:
            invariants.append(t)
    return invariants, new_seqs


def trace_step(step, sequences, initial_states, name):
    """Trace ``step(seq_slices, states) -> (outputs, new_states)`` on
    time-major ``sequences`` and split it for a loop (a ``Traced``)."""
    sequences = [as_tensor(s) for s in sequences]
    initial_states = [as_tensor(s) for s in initial_states]
    seq_in, state_in, outputs, new_states = _call_step(step, sequences, initial_states, name)
    targets = _regroup_sums(outputs + new_states, state_in)
    n_out = len(outputs)
    variant = _variant_set(targets, seq_in + state_in)
    hoisted, seq_only = _hoistable(targets, seq_in, variant)
    invariants, new_seqs = _frontier(targets, variant, hoisted, seq_only)

    # Outer values of the hoisted sequences: the hoisted nodes applied to the
    # whole time-major sequences.
    outer_of = dict(zip(seq_in, sequences))
    for node in topo_nodes(new_seqs):
        if node not in hoisted:
            continue
        ins = [outer_of.get(x, x) for x in node.inputs]
        for old, new in zip(node.outputs, apply_op(hoisted[node], ins)):
            outer_of[old] = new

    # The loop body: a sub-graph over fresh placeholders only.
    hoisted_in = [Placeholder(t.shape, t.dtype, name="%s_h%d" % (name, i))
                  for i, t in enumerate(new_seqs)]
    inv_in = [Placeholder(t.shape, t.dtype, name="%s_c%d" % (name, i))
              for i, t in enumerate(invariants)]
    replace = dict(zip(new_seqs, hoisted_in))
    replace.update(zip(invariants, inv_in))
    body = clone(targets, replace)
    outer = list(sequences) + [outer_of[t] for t in new_seqs] + initial_states + invariants
    return Traced(seq_in + hoisted_in, state_in, inv_in, body[:n_out], body[n_out:], outer)
