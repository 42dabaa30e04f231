"""Loop programs: one generated Python function runs a whole loop.

``compile_loop`` turns a loop body (a sub-graph over the loop's inner
placeholders) into the source of one function whose ``for`` statement holds
the body's ops, each inlined as a direct NumPy call where its generic
``compute`` would add nothing (the op's ``inline_src`` hook), so a step costs
its NumPy calls and little else. Per-step values are stored into (T, ...)
arrays allocated at the first step, sums are accumulated in place, and
gradients of several static slices of one tensor (the op's ``static_scatter``
hook) are added into one buffer.
"""
import numpy as np

from cyback.graph.codegen import Namer, inline_call
from cyback.graph.function import leaves_of, rewritten_steps
from cyback.graph.tensor import Constant
from cyback.kernels.blas_threads import numpy_local_threads
from cyback.ops.scan_trace import addends

_set_local_threads = numpy_local_threads()

# The products inside a loop are small (batch x units x gates): waking BLAS's
# thread pool for each costs more than it saves, and on a busy machine a
# multi-threaded GEMM per step waits for descheduled threads, many times
# slower (benchmarks/bench_rnn.py). Below this many multiply-adds per step
# the loop runs its products on the calling thread only; larger steps keep
# BLAS's threads.
SINGLE_THREAD_MACS = 1 << 24


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
        elif addends(op, ins) is not None and len(ins) == 2 and ins[0] in member and \
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
    next_t = [n for _, n in carries]
    targets = list(next_t) + list(emits) + list(accums) + list(lasts)
    steps, targets = rewritten_steps(targets, {})
    nc = len(carries)
    ne, na = len(emits), len(accums)
    next_t, emits_r = targets[:nc], targets[nc:nc + ne]
    accums_r, lasts_r = targets[nc + ne:nc + ne + na], targets[nc + ne + na:]

    ns = {"__builtins__": __builtins__, "_empty": np.empty, "_copy": np.array,
          "_set_threads": _set_local_threads, "_LIMIT": SINGLE_THREAD_MACS}
    name_of = Namer(ns, "k", "v")

    s_args = ["S%d" % i for i in range(len(slices))]
    c_args = ["C%d" % i for i in range(nc)]
    k_args = ["K%d" % i for i in range(len(consts))]
    for ph, a in zip(consts, k_args):
        name_of.bind(ph, a)
    for (ph, _), a in zip(carries, c_args):
        name_of.bind(ph, a)
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
        fast = inline_call(op, ins, outs, ns, name_of)
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


def zero_seq(t_len, shape, dtype):
    """A (t_len, ...) zero array for a loop value of static ``shape`` (unknown
    dimensions 0): what a loop that ran no step returns."""
    return np.zeros((t_len,) + tuple(0 if d is None else d for d in shape), dtype=dtype)


def seq_length(api, seqs):
    """The common length of the sequence arrays ``seqs`` (0 without any)."""
    lengths = {a.shape[0] for a in seqs}
    if len(lengths) > 1:
        raise ValueError("%s: the sequences have different lengths %s (shapes %s)"
                         % (api, sorted(lengths), [a.shape for a in seqs]))
    return lengths.pop() if lengths else 0
