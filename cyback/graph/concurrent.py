"""Independent steps of an inference plan run side by side, each on its share
of the thread team: a bidirectional RNN's two directions.

A recurrent layer at batch 1 is a chain of small steps: on two threads each
step's product is split and the threads meet a hundred times a sequence,
which costs more than it saves (a batch-1 BiLSTM ran faster on one thread
than on two). Its two directions depend on nothing of each other, so each
can run on a thread of its own, start to end, with no meeting between.

An op declares that it suits this with ``runs_side_by_side = True``: its
compute spends its time in a kernel that releases the GIL, and its result
does not depend on the thread count. ``run_side_by_side`` (an inference-plan
pass, ``graph/optimize.py``) pairs such steps when neither reads what the
other makes, as one ``Concurrent`` step; it runs the first op on a helper
thread of the calling thread and the second on the calling thread, each with
half the team (``runtime.set_thread_local_threads``). With a team of one
thread the two run one after the other.
"""
import heapq
import os
import queue
import threading
import weakref

from cyback.graph.op import Op
from cyback.kernels import runtime


class _Helper(object):
    """A daemon thread that runs the jobs one calling thread hands it; it ends
    when that thread does (its thread-local helper is then collected)."""

    def __init__(self):
        # a forked child has the parent's helper object but not its thread
        self.pid = os.getpid()
        self.jobs = queue.SimpleQueue()
        self.done = queue.SimpleQueue()
        thread = threading.Thread(target=_serve, args=(self.jobs, self.done),
                                  name="cyback-side-by-side", daemon=True)
        thread.start()
        weakref.finalize(self, self.jobs.put, None)


def _serve(jobs, done):
    threads = None
    while True:
        job = jobs.get()
        if job is None:
            return
        fn, args, want = job
        try:
            if want != threads:
                runtime.set_thread_local_threads(want)
                threads = want
            done.put((True, fn(*args)))
        except BaseException as e:      # handed to the caller, which raises it
            done.put((False, e))


_helpers = threading.local()


def _helper():
    helper = getattr(_helpers, "helper", None)
    if helper is None or helper.pid != os.getpid():
        helper = _helpers.helper = _Helper()
    return helper


class Concurrent(Op):
    """``ops[0]`` and ``ops[1]`` as one step: inputs and outputs are the two
    ops' own, one after the other (``n_in[0]`` inputs are the first op's)."""

    api = "concurrent"

    def __init__(self, ops, n_in):
        self.ops = tuple(ops)
        self.n_in = tuple(n_in)
        self.n_outputs = sum(op.n_outputs for op in self.ops)

    def key(self):
        return None

    def describe(self):
        names = [op.describe() if hasattr(op, "describe") else op.api or type(op).__name__
                 for op in self.ops]
        return " | ".join(names)

    def infer(self, *inputs):
        a = self.n_in[0]
        return list(self.ops[0].infer(*inputs[:a])) + list(self.ops[1].infer(*inputs[a:]))

    def compute(self, *arrays):
        return self._run([op.compute for op in self.ops], arrays)

    def compute_for(self, needed):
        first = self.ops[0].n_outputs
        fns = []
        for op, part in zip(self.ops, (needed[:first], needed[first:])):
            fns.append(op.compute_for(part) if hasattr(op, "compute_for") else op.compute)
        return lambda *arrays: self._run(fns, arrays)

    def _run(self, fns, arrays):
        a = self.n_in[0]
        team = runtime.get_max_threads()
        if team < 2:
            return tuple(fns[0](*arrays[:a])) + tuple(fns[1](*arrays[a:]))
        share = team // 2
        helper = _helper()
        helper.jobs.put((fns[0], arrays[:a], share))
        own = runtime.get_thread_local_threads()
        runtime.set_thread_local_threads(share)
        try:
            second = fns[1](*arrays[a:])
        finally:
            runtime.set_thread_local_threads(own)
            ok, first = helper.done.get()
        if not ok:
            raise first
        return tuple(first) + tuple(second)


def _depends(steps, i, j, producer):
    """Whether step j reads, through any chain of steps, an output of step i."""
    outs = set(steps[i][2])
    seen, stack = set(), [j]
    while stack:
        k = stack.pop()
        for x in steps[k][1]:
            if x in outs:
                return True
            p = producer.get(x)
            if p is not None and p > i and p not in seen:
                seen.add(p)
                stack.append(p)
    return False


def run_side_by_side(steps):
    """Pairs of steps whose ops run side by side (``runs_side_by_side``) and
    neither of which reads the other's outputs, each pair as one
    ``Concurrent`` step; the steps re-ordered so that each comes after the
    steps it reads (in their order otherwise)."""
    candidates = [i for i, (op, _, _) in enumerate(steps)
                  if getattr(op, "runs_side_by_side", False)]
    if len(candidates) < 2:
        return steps
    producer = {o: i for i, (_, _, outs) in enumerate(steps) for o in outs}
    paired, joined = set(), {}
    for n, i in enumerate(candidates):
        if i in paired:
            continue
        for j in candidates[n + 1:]:
            if j not in paired and not _depends(steps, i, j, producer):
                paired.update((i, j))
                (op_i, ins_i, outs_i), (op_j, ins_j, outs_j) = steps[i], steps[j]
                joined[i] = (Concurrent((op_i, op_j), (len(ins_i), len(ins_j))),
                             list(ins_i) + list(ins_j), list(outs_i) + list(outs_j))
                break
    if not joined:
        return steps
    nodes = [(i, joined.get(i, s)) for i, s in enumerate(steps)
             if i in joined or i not in paired]
    ordered = _in_order(nodes)
    return steps if ordered is None else ordered


def _in_order(nodes):
    """The steps of ``nodes`` ((original index, step)) with every step after
    those that make its inputs, in original order where that allows; None
    when no order does (two pairs each waiting for the other)."""
    made_by = {o: k for k, (_, (_, _, outs)) in enumerate(nodes) for o in outs}
    waiting = [0] * len(nodes)
    readers = [[] for _ in nodes]
    for k, (_, (_, ins, _)) in enumerate(nodes):
        deps = {made_by[x] for x in ins if x in made_by and made_by[x] != k}
        waiting[k] = len(deps)
        for d in deps:
            readers[d].append(k)
    ready = [(nodes[k][0], k) for k in range(len(nodes)) if not waiting[k]]
    heapq.heapify(ready)
    out = []
    while ready:
        _, k = heapq.heappop(ready)
        out.append(nodes[k][1])
        for r in readers[k]:
            waiting[r] -= 1
            if not waiting[r]:
                heapq.heappush(ready, (nodes[r][0], r))
    return out if len(out) == len(nodes) else None
