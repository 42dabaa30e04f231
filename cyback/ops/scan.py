"""Symbolic loops: the Scan op behind rnn, map_fn, foldl and foldr.

``build_scan`` traces a step function once and splits its graph
(``scan_trace``: loop invariants computed once outside the loop, the input
projection hoisted and computed on all steps at once, the rest the loop
body); a recognised recurrent cell becomes a fused kernel op
(``scan_cells``), any other body a Scan. A Scan runs one generated Python
function holding the whole loop (``scan_program``), and its gradient is a
reverse loop generated the same way from the step's gradient graph
(``scan_backward``), run by a ScanGrad.

Pickles of saved functions refer to ``cyback.ops.scan.Scan`` and to the
rebuilding functions at the end of this module: they stay here.
"""
import functools

import numpy as np

from cyback.graph.function import topo_nodes
from cyback.graph.op import Op
from cyback.graph.pickling import register_reducer
from cyback.graph.tensor import is_float_dtype
from cyback.ops import elementwise as ew
from cyback.ops.scan_backward import EMITTED, OUTPUT_GRAD, RESIDUAL, SEQUENCE, BackwardLoop
from cyback.ops.scan_cells import fuse_cell
from cyback.ops.scan_program import compile_loop, seq_length, zero_seq
from cyback.ops.scan_trace import apply_op, trace_step


def build_scan(step, sequences, initial_states, name="scan"):
    """Trace ``step(seq_slices, states) -> (outputs, new_states)`` and return
    ``(output_sequences, final_states)``; sequences are time-major."""
    traced = trace_step(step, sequences, initial_states, name)
    loop_seq_in, state_in, inv_in = traced.seq_in, traced.state_in, traced.inv_in
    body_outputs, body_states = traced.outputs, traced.new_states
    op = fuse_cell(loop_seq_in, state_in, inv_in, body_outputs, body_states, name) or \
        Scan(loop_seq_in, state_in, inv_in, body_outputs, body_states, name)
    outs = apply_op(op, traced.outer_inputs)
    n_out = len(body_outputs)
    return outs[:n_out], outs[n_out:n_out + len(state_in)]


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
                self.backward = BackwardLoop(self)
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
        length = seq_length(self.api, arrays[:ns])
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
        emitted = [e if e is not None else zero_seq(length, t.shape, t.dtype)
                   for e, t in zip(emitted, self.body_outputs + self.residuals)]
        lasts = [v if v is not None else zero_seq(0, t.shape, t.dtype)[0:0].reshape(
            tuple(0 if d is None else d for d in t.shape)) for v, t in zip(lasts, self.shape_refs)]
        finals = [np.asarray(f) for f in finals]
        no = len(self.body_outputs)
        return tuple(emitted[:no]) + tuple(finals) + tuple(emitted[no:]) + tuple(lasts)

    def grad(self, inputs, outputs, grads):
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
        res = apply_op(op, list(seqs) + res_seqs + g_outs + g_final + list(invs) + shape_vals)
        g_init = res[:nst]
        accs = res[nst:nst + len(bw.accums)]
        emitted = res[nst + len(bw.accums):]

        stacks = {SEQUENCE: seqs, RESIDUAL: res_seqs, OUTPUT_GRAD: g_outs, EMITTED: emitted}
        out = []
        for x, ref in zip(seqs, bw.g_seq):
            out.append(ref.of(stacks) if ref is not None and is_float_dtype(x.dtype) else None)
        for x, g in zip(inits, g_init):
            out.append(g if is_float_dtype(x.dtype) else None)
        for x, plan in zip(invs, bw.inv_plan):
            total = None
            for term in plan:
                part = term.total(stacks, accs, x)
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
        length = seq_length(self.api, arrays[:n_slices])
        emitted, g_init, sums, _ = bw.loop(length, *arrays)
        sums = [s if s is not None else np.zeros(tuple(0 if d is None else d for d in a.shape),
                                                   a.dtype)
                for s, a in zip(sums, bw.accums)]
        emitted = [e if e is not None else zero_seq(length, t.shape, t.dtype)
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
