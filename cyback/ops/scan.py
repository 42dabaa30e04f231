"""Symbolic loops: the Scan op behind rnn, map_fn, foldl and foldr.

A step function is traced once on inner placeholders (one slice of each
sequence, the states). The traced sub-graph is then split:

- everything that does not depend on the inner placeholders is loop-invariant
  (weights, constants, dropout masks): it is computed once outside the loop and
  becomes an input of the Scan;
- nodes that depend only on the sequence slices and invariants, and that can
  be applied to all steps at once (element-wise ops, ``x_t @ W``), are hoisted:
  computed once on the whole (T, B, ...) sequence — the input projection of an
  RNN becomes one GEMM over all time steps — and fed to the loop as new
  sequences;
- what is left becomes the loop body: one generated Python function holds the
  whole loop, the body's ops inlined as direct NumPy calls where their
  generic ``compute`` would add nothing, so a step costs its NumPy calls and
  little else.

The gradient (backprop through time) is a reverse loop generated the same way
from the step's gradient graph. The forward loop records the intermediates
that graph reads (residuals), so the backward loop recomputes nothing; the
gradients of invariants that are products of per-step values (a recurrent
kernel's ``h_t^T dz_t``) or broadcast sums (a bias) are not accumulated step by
step but become one GEMM (one reduction) over all steps after the loop.
"""
import functools

import numpy as np

from cyback.graph.function import leaves_of, topo_nodes
from cyback.graph.op import Op
from cyback.graph.pickling import register_reducer
from cyback.graph.tensor import Constant, Placeholder, as_tensor, is_float_dtype
from cyback.kernels.blas_threads import numpy_local_threads
from cyback.ops.gradients import gradients_with_seeds


def _apply(op, inputs):
    out = op(*inputs)
    return list(out) if isinstance(out, tuple) else [out]


def clone(outputs, replace):
    """The graph of ``outputs`` rebuilt with ``replace`` (tensor → tensor) substituted."""
    memo = dict(replace)
    for node in topo_nodes(outputs, set(replace)):
        ins = [memo.get(x, x) for x in node.inputs]
        if all(a is b for a, b in zip(ins, node.inputs)):
            continue
        for old, new in zip(node.outputs, _apply(node.op, ins)):
            memo[old] = new
    return [memo.get(o, o) for o in outputs]


def _addends(op, ins):
    """The terms ``op`` adds up (its ``addends`` hook), or None."""
    hook = getattr(op, "addends", None)
    return hook(ins) if hook is not None else None


def _summed_over_steps(op, ins):
    """Which of ``ins`` to record per step so that the sum over all steps of
    ``op``'s output is one op on their (T, ...) stacks after the loop (the
    op's ``steps_summed`` hook), or None."""
    hook = getattr(op, "steps_summed", None)
    return hook(ins) if hook is not None else None


def _time_mapped(op, ins, variant):
    """The op that computes ``op`` for all steps at once on time-major stacks
    of its variant inputs (the op's ``time_mapped`` hook), or None."""
    hook = getattr(op, "time_mapped", None)
    return hook(ins, variant) if hook is not None else None


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
        return t.node is not None and _addends(t.node.op, t.node.inputs) is not None

    def terms(t, root):
        if is_add(t) and (t is root or uses.get(t) == 1) and t.dtype == root.dtype:
            return [p for x in _addends(t.node.op, t.node.inputs) for p in terms(x, root)]
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


def _variant_set(trace_targets, inner):
    variant = set(inner)
    for node in topo_nodes(trace_targets):
        if any(x in variant for x in node.inputs):
            variant.update(node.outputs)
    return variant


def build_scan(step, sequences, initial_states, name="scan"):
    """Trace ``step(seq_slices, states) -> (outputs, new_states)`` and return
    ``(output_sequences, final_states)``; sequences are time-major."""
    sequences = [as_tensor(s) for s in sequences]
    initial_states = [as_tensor(s) for s in initial_states]
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
            from cyback.ops.elementwise import cast
            new_states[i] = cast(s_new, s_in.dtype)
        if s_new.ndim != s_in.ndim:
            raise ValueError("%s: a state changed rank from %s to %s in the step function"
                             % (name, s_in.shape, s_new.shape))
        if any(a is not None and b is not None and a != b
               for a, b in zip(s_in.shape, s_new.shape)):
            raise ValueError("%s: a state changed shape from %s to %s in the step function"
                             % (name, s_in.shape, s_new.shape))
    targets = _regroup_sums(outputs + new_states, state_in)
    outputs, new_states = targets[:len(outputs)], targets[len(outputs):]
    inner = seq_in + state_in
    variant = _variant_set(targets, inner)

    # Hoist what depends only on sequence slices and invariants.
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

    # Frontier: invariant tensors read by variant nodes, and hoisted tensors
    # read by nodes that stay in the loop.
    invariants, new_seqs = [], []
    in_loop = []
    for node in topo_nodes(targets):
        if node in hoisted or not any(x in variant for x in node.inputs):
            continue
        in_loop.append(node)
    for node in in_loop:
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

    # Outer values of the hoisted sequences: the hoisted nodes applied to the
    # whole time-major sequences.
    outer_of = dict(zip(seq_in, sequences))
    for node in topo_nodes(new_seqs):
        if node not in hoisted:
            continue
        ins = [outer_of.get(x, x) for x in node.inputs]
        for old, new in zip(node.outputs, _apply(hoisted[node], ins)):
            outer_of[old] = new

    # The loop body: a sub-graph over fresh placeholders only.
    used_seqs = [(p, s) for p, s in zip(seq_in, sequences)]
    loop_seq_in = [p for p, _ in used_seqs] + \
        [Placeholder(t.shape, t.dtype, name="%s_h%d" % (name, i)) for i, t in enumerate(new_seqs)]
    loop_seq_outer = [s for _, s in used_seqs] + [outer_of[t] for t in new_seqs]
    inv_in = [Placeholder(t.shape, t.dtype, name="%s_c%d" % (name, i))
              for i, t in enumerate(invariants)]
    replace = dict(zip(new_seqs, loop_seq_in[len(used_seqs):]))
    replace.update(zip(invariants, inv_in))
    body = clone(targets, replace)
    body_outputs, body_states = body[:len(outputs)], body[len(outputs):]

    from cyback.ops.scan_cells import fuse_cell
    op = fuse_cell(loop_seq_in, state_in, inv_in, body_outputs, body_states, name) or \
        Scan(loop_seq_in, state_in, inv_in, body_outputs, body_states, name)
    outs = _apply(op, loop_seq_outer + initial_states + invariants)
    n_out = len(outputs)
    return outs[:n_out], outs[n_out:n_out + len(state_in)]


# ------------------------------------------------------------- loop programs

_set_local_threads = numpy_local_threads()

# The products inside a loop are small (batch x units x gates): waking BLAS's
# thread pool for each costs more than it saves, and on a busy machine a
# multi-threaded GEMM per step waits for descheduled threads (measured 25x
# slower). Below this many multiply-adds per step the loop runs its products
# on the calling thread only; larger steps keep BLAS's threads.
SINGLE_THREAD_MACS = 1 << 24


def _fast_call(op, ins, outs, ns, name_of):
    """``(source, multiply-adds, takes out=)`` calling ``op`` without its
    generic ``compute`` wrapper (the op's ``inline_src`` hook), or None.
    Never for 0-d results, which NumPy returns as scalars."""
    hook = getattr(op, "inline_src", None)
    if hook is None or len(outs) != 1 or outs[0].ndim == 0:
        return None
    return hook(ins, outs, ns, [name_of(x) for x in ins])


def _scatter_groups(steps, targets):
    """Sums of ScatterAdds into one shape (the gradient of several slices of
    one tensor, e.g. an RNN's gates): ``{root step: [(g, index), ...], like}``
    and the steps the roots absorb. One buffer then receives every slice
    instead of one zero array per slice and a sum of them."""
    uses = {}
    for _, ins, _ in steps:
        for x in ins:
            uses[x] = uses.get(x, 0) + 1
    for t in targets:
        uses[t] = uses.get(t, 0) + 2
    member = {}       # tensor -> (entries, like, step indices)
    roots = {}
    for i, (op, ins, outs) in enumerate(steps):
        scatter = getattr(op, "static_scatter", None)
        scattered = scatter(ins) if scatter is not None and outs[0].ndim else None
        if scattered is not None:
            g, like, index = scattered
            member[outs[0]] = ([(g, index)], like, [i])
        elif _addends(op, ins) is not None and len(ins) == 2 and ins[0] in member and \
                ins[1] in member and uses.get(ins[0]) == 1 and uses.get(ins[1]) == 1 and \
                ins[0] is not ins[1]:
            (ea, la, sa), (eb, lb, sb) = member[ins[0]], member[ins[1]]
            if la is lb and outs[0].shape == la.shape and outs[0].dtype == ins[0].dtype:
                member[outs[0]] = (ea + eb, la, sa + sb + [i])
                for x in ins:
                    roots.pop(x, None)
                roots[outs[0]] = i
    groups, absorbed = {}, set()
    for out, i in roots.items():
        entries, like, idx = member[out]
        groups[i] = (entries, like, out)
        absorbed.update(j for j in idx if j != i)
    return groups, absorbed


def compile_loop(name, slices, carries, consts, emits, accums, reverse, lasts=()):
    """Generate and compile one loop over time steps.

    slices: inner placeholders fed with ``S_k[t]`` from sequence arrays;
    carries: (placeholder, next tensor) pairs, the loop-carried values;
    consts: placeholders fed once (invariants);
    emits: tensors stored at ``[t]`` of a (T, ...) output array per step;
    accums: tensors summed over the steps;
    lasts: tensors whose value at the last step is returned.

    Returns ``(loop, steps)``: ``loop(T, *slice_arrays, *carry_inits, *consts)``
    returns ``(emitted, final_carries, sums, last_values)`` (lists; entries
    of ``emitted``, ``sums`` and ``last_values`` are None when T == 0), and
    ``steps`` the (op, inputs, outputs) the body runs each step.
    """
    from cyback.graph.function import rewritten_steps
    next_t = [n for _, n in carries]
    targets = list(next_t) + list(emits) + list(accums) + list(lasts)
    steps, targets = rewritten_steps(targets, {})
    nc = len(carries)
    ne, na = len(emits), len(accums)
    next_t, emits_r = targets[:nc], targets[nc:nc + ne]
    accums_r, lasts_r = targets[nc + ne:nc + ne + na], targets[nc + ne + na:]

    ns = {"__builtins__": __builtins__, "_empty": np.empty, "_copy": np.array,
          "_set_threads": _set_local_threads, "_LIMIT": SINGLE_THREAD_MACS}
    names = {}

    def name_of(t):
        n = names.get(t)
        if n is None:
            if type(t) is Constant:
                n = "k%d" % len(names)
                ns[n] = t.value
            else:
                n = "v%d" % len(names)
            names[t] = n
        return n

    s_args = ["S%d" % i for i in range(len(slices))]
    c_args = ["C%d" % i for i in range(nc)]
    k_args = ["K%d" % i for i in range(len(consts))]
    for ph, a in zip(consts, k_args):
        names[ph] = a
    for (ph, _), a in zip(carries, c_args):
        names[ph] = a
    # Every leaf of the body must be one of the loop's inputs.
    known = set(slices) | set(consts) | {ph for ph, _ in carries}
    for leaf in leaves_of(targets):
        if type(leaf) is not Constant and leaf not in known:
            raise ValueError("%s: the step function reads %r, which is neither a step input "
                             "nor a loop invariant" % (name, leaf))
    used = set(leaves_of(targets))

    body, macs = [], []
    for ph, a in zip(slices, s_args):
        if ph in used:
            body.append("%s = %s[t]" % (name_of(ph), a))
    groups, absorbed = _scatter_groups(steps, targets)
    first_emit, direct = {}, set()
    for k, t in enumerate(emits_r):
        if t.ndim and t not in first_emit:
            first_emit[t] = k
    ns["_zeros"] = np.zeros
    for i, (op, ins, outs) in enumerate(steps):
        if i in absorbed:
            continue
        if i in groups:
            entries, like, out = groups[i]
            v = name_of(out)
            body.append("%s = _zeros(%s.shape, %r)" % (v, name_of(like), out.dtype))
            for g, index in entries:
                idx = "ix%d" % len(ns)
                ns[idx] = index
                body.append("%s[%s] += %s" % (v, idx, name_of(g)))
            continue
        fast = _fast_call(op, ins, outs, ns, name_of)
        if fast is not None:
            src, m, outable = fast
            v = name_of(outs[0])
            k = first_emit.get(outs[0])
            if outable and k is not None:
                # A ufunc whose result is stored per step writes straight
                # into its slot of the (T, ...) array: no copy.
                e = "E%d" % k
                body.append("if %s is None:" % e)
                body.append("    %s = %s" % (v, src))
                body.append("    %s = _empty((T,) + %s.shape, %s.dtype)" % (e, v, v))
                body.append("    %s[t] = %s" % (e, v))
                body.append("else: %s = %s, out=%s[t])" % (v, src[:-1], e))
                direct.add(k)
            else:
                body.append("%s = %s" % (v, src))
            if m:
                macs.append(m)
            continue
        fname = "f%d" % i
        ns[fname] = op.compute
        body.append("%s, = %s(%s)" % (", ".join(name_of(o) for o in outs), fname,
                                      ", ".join(name_of(x) for x in ins)))
    e_names = ["E%d" % i for i in range(len(emits))]
    a_names = ["A%d" % i for i in range(len(accums))]
    for k, (e, t) in enumerate(zip(e_names, emits_r)):
        if k in direct:
            continue
        v = name_of(t)
        body.append("if %s is None: %s = _empty((T,) + _shape(%s), _dtype(%s, %r))"
                    % (e, e, v, v, t.dtype))
        body.append("%s[t] = %s" % (e, v))
    for a, t in zip(a_names, accums_r):
        v = name_of(t)
        body.append("if %s is None: %s = _copy(%s, dtype=%r)" % (a, a, v, t.dtype))
        body.append("else: %s += %s" % (a, v))
    if nc:
        body.append("%s, = %s" % (", ".join(c_args), ", ".join(name_of(t) for t in next_t)
                                   + ","))
    ns["_shape"], ns["_dtype"] = np.shape, _dtype_of
    if not body:
        body.append("pass")

    lines = ["def loop(%s):" % ", ".join(["T"] + s_args + c_args + k_args)]
    l_names = [name_of(t) for t in lasts_r]
    lines += ["    %s = None" % n for n in e_names + a_names]
    lines += ["    %s = None" % n for n in dict.fromkeys(l_names)
              if n[0] == "v"]
    lines.append("    _old = -1")
    lines.append("    try:")
    rng = "range(T - 1, -1, -1)" if reverse else "range(T)"
    first = "T - 1" if reverse else "0"
    lines.append("        for t in %s:" % rng)
    lines += ["            " + ln for ln in body]
    if macs and _set_local_threads is not None:
        # After the first step the sizes are known: small products run on
        # this thread only (thread-local setting: other threads unaffected).
        lines.append("            if t == %s and %s < _LIMIT:" % (first, " + ".join(macs)))
        lines.append("                _old = _set_threads(1)")
    lines.append("    finally:")
    lines.append("        if _old > 0: _set_threads(_old)")
    lines.append("    return [%s], [%s], [%s], [%s]" % (
        ", ".join(e_names), ", ".join(c_args), ", ".join(a_names), ", ".join(l_names)))
    src = "\n".join(lines)
    code = compile(src, "<cyback %s loop>" % name, "exec")
    exec(code, ns)
    loop = ns["loop"]
    loop.source = src
    return loop, steps


def _dtype_of(v, dtype):
    return getattr(v, "dtype", None) or np.dtype(dtype)


def _zero_seq(t_len, shape, dtype):
    return np.zeros((t_len,) + tuple(0 if d is None else d for d in shape), dtype=dtype)


def _seq_length(api, seqs):
    lengths = {a.shape[0] for a in seqs}
    if len(lengths) > 1:
        raise ValueError("%s: the sequences have different lengths %s (shapes %s)"
                         % (api, sorted(lengths), [a.shape for a in seqs]))
    return lengths.pop() if lengths else 0


# ----------------------------------------------------------------- the ops

class _Backward(object):
    """The gradient of one step, split for a reverse loop.

    ``residuals``: forward tensors the gradient reads (step intermediates and
    state values), recorded by the forward loop; the gradient graph reads them
    from placeholders, so the backward loop recomputes nothing.

    Invariant gradients are sums over steps. A term that is a product of two
    per-step values (``h_t^T @ dz_t`` for a recurrent kernel) or a broadcast
    reduction (a bias) is not summed in the loop: its per-step operands are
    stored and the sum becomes one product (one reduction) over all steps
    after the loop.
    """

    def __init__(self, scan):
        from cyback.ops import elementwise as ew
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
        for i, ph in enumerate(scan.seq_in):
            outer_seq[ph] = ("seq", i)
        for i, ph in enumerate(self.res_in):
            outer_seq[ph] = ("res", i)
        for i, ph in enumerate(self.g_out):
            outer_seq[ph] = ("gout", i)
        self.emits = []

        def emit(t):
            if t in outer_seq:
                return outer_seq[t]
            if t not in self.emits:
                self.emits.append(t)
            return ("emit", self.emits.index(t))

        per_step = set(outer_seq) | set(self.g_state)

        def varies(t):
            return any(x in per_step for x in leaves_of([t])) or t in per_step

        def terms(g):
            parts = _addends(g.node.op, g.node.inputs) if g.node is not None else None
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
                        plan.append(("steps", node.op, [emit(node.inputs[i]) for i in which]))
                    else:
                        self.accums.append(term)
                        plan.append(("acc", len(self.accums) - 1))
            self.inv_plan.append(plan)
        self.g_init = g_state_in
        carries = [(ph, g if g is not None else ew.zeros_like_tensor(ph))
                   for ph, g in zip(self.g_state, g_state_in)]
        self.loop, self.steps = compile_loop(
            api + " backward", scan.seq_in + self.res_in + self.g_out, carries,
            scan.inv_in + self.shape_in, self.emits, self.accums, reverse=True)


class Scan(Op):
    """Outputs: the per-step outputs (T, ...), the final states, then what
    its gradient reads: residuals recorded per step (T, ...) and the last
    step's value of the tensors it needs only the shape of."""

    def __init__(self, seq_in, state_in, inv_in, outputs, new_states, name):
        self.api = name
        self.seq_in, self.state_in, self.inv_in = seq_in, state_in, inv_in
        self.body_outputs, self.body_states = outputs, new_states
        self.pure = all(n.op.pure for n in topo_nodes(outputs + new_states))
        self.backward = None
        differentiable = any(is_float_dtype(x.dtype) for x in seq_in + state_in + inv_in) and \
            any(is_float_dtype(t.dtype) for t in outputs + new_states)
        self._backward_error = None
        if differentiable:
            try:
                self.backward = _Backward(self)
            except Exception as e:   # reported if a gradient is ever asked for
                self._backward_error = e
        bw = self.backward
        self.residuals = bw.residuals if bw else []
        self.shape_refs = bw.shape_refs if bw else []
        self.loop, self.steps = compile_loop(
            name, seq_in, list(zip(state_in, new_states)), inv_in, list(outputs), [],
            reverse=False)
        # The recording loop is compiled on first use: plans that do not
        # read the residuals (inference) run the plain loop (``compute_for``).
        self._loop_rec = None
        self.n_outputs = len(outputs) + len(new_states) + len(self.residuals) + \
            len(self.shape_refs)

    def key(self):
        return None

    def infer(self, *ins):
        ns, nst = len(self.seq_in), len(self.state_in)
        seqs = ins[:ns]
        lengths = {s.shape[0] for s in seqs if s.shape[0] is not None}
        if len(lengths) > 1:
            raise ValueError("%s: sequences have different lengths %s"
                             % (self.api, sorted(lengths)))
        t = lengths.pop() if lengths else None
        specs = [((t,) + o.shape, o.dtype) for o in self.body_outputs]
        specs += [(s.shape, s.dtype) for s in ins[ns:ns + nst]]
        specs += [((t,) + r.shape, r.dtype) for r in self.residuals]
        specs += [(r.shape, r.dtype) for r in self.shape_refs]
        return specs

    def compute(self, *arrays):
        return self._run(True, *arrays)

    def compute_for(self, needed):
        """Record the residuals only for plans whose gradient reads them."""
        record = any(needed[len(self.body_outputs) + len(self.state_in):])
        return functools.partial(self._run, record)

    def _run(self, record, *arrays):
        ns, nst = len(self.seq_in), len(self.state_in)
        length = _seq_length(self.api, arrays[:ns])
        if record:
            if self._loop_rec is None:
                self._loop_rec = compile_loop(
                    self.api, self.seq_in, list(zip(self.state_in, self.body_states)),
                    self.inv_in, list(self.body_outputs) + self.residuals, [], reverse=False,
                    lasts=self.shape_refs)[0]
            emitted, finals, _, lasts = self._loop_rec(length, *arrays)
        else:
            emitted, finals, _, _ = self.loop(length, *arrays)
            emitted += [np.empty((0,) * (r.ndim + 1), r.dtype) for r in self.residuals]
            lasts = [np.empty((0,) * r.ndim, r.dtype) for r in self.shape_refs]
        for init, final in zip(arrays[ns:ns + nst], finals):
            if np.shape(init) != np.shape(final):
                raise ValueError("%s: a state changed shape from %s to %s in the loop"
                                 % (self.api, np.shape(init), np.shape(final)))
        emitted = [e if e is not None else _zero_seq(length, t.shape, t.dtype)
                   for e, t in zip(emitted, self.body_outputs + self.residuals)]
        lasts = [v if v is not None else _zero_seq(0, t.shape, t.dtype)[0:0].reshape(
            tuple(0 if d is None else d for d in t.shape)) for v, t in zip(lasts, self.shape_refs)]
        finals = [np.asarray(f) for f in finals]
        no = len(self.body_outputs)
        return tuple(emitted[:no]) + tuple(finals) + tuple(emitted[no:]) + tuple(lasts)

    def grad(self, inputs, outputs, grads):
        from cyback.ops import elementwise as ew
        bw = self.backward
        if bw is None:
            if self._backward_error is not None:
                raise self._backward_error
            return [None] * len(inputs)
        ns, nst = len(self.seq_in), len(self.state_in)
        no, nr = len(self.body_outputs), len(self.residuals)
        if all(g is None for g in grads[:no + nst]):
            return [None] * len(inputs)
        seqs, inits, invs = inputs[:ns], inputs[ns:ns + nst], inputs[ns + nst:]
        g_outs = [g if g is not None else ew.zeros_like_tensor(o)
                  for g, o in zip(grads[:no], outputs[:no])]
        g_final = [g if g is not None else ew.zeros_like_tensor(s)
                   for g, s in zip(grads[no:no + nst], outputs[no:no + nst])]
        res_seqs = list(outputs[no + nst:no + nst + nr])
        shape_vals = list(outputs[no + nst + nr:])
        op = ScanGrad(self)
        res = _apply(op, list(seqs) + res_seqs + g_outs + g_final + list(invs) + shape_vals)
        g_init = res[:nst]
        accs = res[nst:nst + len(bw.accums)]
        emitted = res[nst + len(bw.accums):]

        def outer(ref):
            kind, i = ref
            return {"seq": seqs, "res": res_seqs, "gout": g_outs, "emit": emitted}[kind][i]

        out = []
        for x, ref in zip(seqs, bw.g_seq):
            out.append(outer(ref) if ref is not None and is_float_dtype(x.dtype) else None)
        for x, g in zip(inits, g_init):
            out.append(g if is_float_dtype(x.dtype) else None)
        for x, plan in zip(invs, bw.inv_plan):
            total = None
            for item in plan:
                if item[0] == "steps":
                    part = item[1].sum_over_steps([outer(r) for r in item[2]], x)
                else:
                    part = accs[item[1]]
                total = part if total is None else ew.add(total, part)
            if total is not None and total.dtype != x.dtype:
                total = ew.cast(total, x.dtype)
            out.append(total if is_float_dtype(x.dtype) else None)
        return out


class ScanGrad(Op):
    """Backprop through time: a reverse loop over the recorded residuals.
    Outputs: the initial-state gradients, the invariant gradients summed in
    the loop, and the per-step values (T, ...) kept for the products and
    reductions that are done once after the loop."""

    pure = True

    def __init__(self, scan):
        self.scan = scan
        self.api = scan.api
        bw = scan.backward
        self.n_outputs = len(scan.state_in) + len(bw.accums) + len(bw.emits)

    def key(self):
        return None

    def infer(self, *ins):
        scan, bw = self.scan, self.scan.backward
        n_slices = len(scan.seq_in) + len(bw.res_in) + len(bw.g_out)
        lengths = {s.shape[0] for s in ins[:n_slices] if s.shape[0] is not None}
        t = lengths.pop() if len(lengths) == 1 else None
        finals = ins[n_slices:n_slices + len(scan.state_in)]
        specs = [(s.shape, s.dtype) for s in finals]
        specs += [(a.shape, a.dtype) for a in bw.accums]
        specs += [((t,) + e.shape, e.dtype) for e in bw.emits]
        return specs

    def grad(self, inputs, outputs, grads):
        raise NotImplementedError("%s: second derivatives through a symbolic loop are not "
                                  "supported; use unroll=True" % self.api)

    def compute(self, *arrays):
        scan, bw = self.scan, self.scan.backward
        n_slices = len(scan.seq_in) + len(bw.res_in) + len(bw.g_out)
        length = _seq_length(self.api, arrays[:n_slices])
        emitted, g_init, sums, _ = bw.loop(length, *arrays)
        sums = [s if s is not None else np.zeros(tuple(0 if d is None else d for d in a.shape),
                                                   a.dtype)
                for s, a in zip(sums, bw.accums)]
        emitted = [e if e is not None else _zero_seq(length, t.shape, t.dtype)
                   for e, t in zip(emitted, bw.emits)]
        return tuple(np.asarray(g) for g in g_init) + tuple(sums) + tuple(emitted)


# Pickling: a Scan is rebuilt from its step graph (the node list comes first so
# that the graph is restored before the placeholders that refer to it), a
# ScanGrad from its Scan.
def _make_scan(nodes, seq_in, state_in, inv_in, outputs, new_states, name):
    return Scan(seq_in, state_in, inv_in, outputs, new_states, name)


def _reduce_scan(op):
    body = list(op.body_outputs) + list(op.body_states)
    return _make_scan, (topo_nodes(body), op.seq_in, op.state_in, op.inv_in,
                        op.body_outputs, op.body_states, op.api)


def _make_scan_grad(scan):
    return ScanGrad(scan)


def _reduce_scan_grad(op):
    return _make_scan_grad, (op.scan,)


register_reducer(Scan, _reduce_scan)
register_reducer(ScanGrad, _reduce_scan_grad)
