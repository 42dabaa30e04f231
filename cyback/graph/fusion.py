"""Element-wise fusion: chains of element-wise ops become one pass over memory.

Ops say what they compute element by element through their ``ewise`` hook
(see ``graph/op.py``): it emits instructions into a ``ProgramBuilder`` and
returns the register holding the result. The fusion pass groups connected
element-wise steps whose intermediate results have no other reader and
replaces each group with one ``Fused`` step that runs the program through the
``ewise`` kernel, block by block, OpenMP across blocks.

A group may also take the op that produces one of its full-size inputs (a
conv or a dense product, ops that declare ``fresh_output``): the fused step
then runs that op and applies the program in place on its output while the
plan still holds it — the epilogue of the producer. Without such a producer,
a group writes into a full-size input whose buffer dies at that step.

Operands of a group are full-size arrays, vectors along one channel axis, or
scalars; any other broadcast ends the group. Sizes unknown while building are
checked when the step runs: on a mismatch the step computes its ops one by one
as written, so fusion never changes what a plan accepts.
"""
import collections

import numpy as np

from cyback.graph.op import Op
from cyback.graph.tensor import Constant
from cyback.kernels import ewise as _kernel

FULL, CHAN, SCALAR = _kernel.KIND_FULL, _kernel.KIND_CHAN, _kernel.KIND_SCALAR
_FLOATS = ("float32", "float64")


class Unfusable(Exception):
    """Raised by a ProgramBuilder when an op cannot be expressed."""


def classify(shape, out_shape):
    """(kind, channel axis) of an operand of static ``shape`` in a group whose
    result has static ``out_shape``; axis counts from the end (-1 = last).
    Raises Unfusable for other broadcasts."""
    shape, out_shape = tuple(shape), tuple(out_shape)
    if shape == out_shape:
        return FULL, None
    if len(shape) > len(out_shape):
        raise Unfusable()
    if all(d == 1 for d in shape):
        return SCALAR, None
    axis = None
    for i in range(1, len(shape) + 1):
        d, o = shape[-i], out_shape[-i]
        if d == 1:
            continue
        if d is None or o is None or d != o or axis is not None:
            raise Unfusable()
        axis = -i
    return CHAN, axis


class ProgramBuilder(object):
    """Collects a program's operands and instructions.

    ``operand(t)`` registers a tensor input; ``const(v)`` a scalar baked into
    the program; ``emit(name, *srcs)`` appends an instruction (names from
    ``cyback.kernels.ewise.OPCODES``) and returns its result register.
    """

    def __init__(self, out_shape, dtype, exact):
        self.out_shape = tuple(out_shape)
        self.dtype = dtype
        self.exact = exact
        self.operands = []      # tensors (inputs of the fused step)
        self.kinds = []
        self.axis = None        # the channel axis of CHAN operands
        self.consts = []        # baked scalars, as operands after the tensors
        self.code = []          # (name, dst, srcs)
        self._tmp = 0
        # where each operand (by tensor id) and constant is: a group may have
        # many
        self.operand_index = {}
        self._const_index = {}

    def operand(self, t):
        i = self.operand_index.get(t.id)
        if i is not None:
            return ("in", i)
        if t.dtype != self.dtype:
            raise Unfusable()
        if type(t) is Constant and t.value.size == 1:
            return self.const(t.value.reshape(()).item())
        kind, axis = classify(t.shape, self.out_shape)
        if kind == CHAN:
            if self.axis is not None and self.axis != axis:
                raise Unfusable()
            self.axis = axis
        self.operand_index[t.id] = len(self.operands)
        self.operands.append(t)
        self.kinds.append(kind)
        return ("in", len(self.operands) - 1)

    def const(self, value):
        value = np.asarray(value, dtype=self.dtype)
        key = value.tobytes()
        i = self._const_index.get(key)
        if i is None:
            i = self._const_index[key] = len(self.consts)
            self.consts.append(value)
        return ("const", i)

    def emit(self, name, *srcs):
        n_src = _kernel.OPCODES[name][1]
        if len(srcs) != n_src:
            raise ValueError("ewise %s takes %d sources, got %d" % (name, n_src, len(srcs)))
        if self.exact and name not in _kernel.EXACT:
            raise Unfusable()
        dst = ("tmp", self._tmp)
        self._tmp += 1
        self.code.append((name, dst, srcs))
        return dst

    def assemble(self, result):
        """(code array, n_regs): registers numbered operands, consts, then
        scratch reused once dead; ``result`` goes to the output (-1)."""
        n_in = len(self.operands) + len(self.consts)
        last = {}
        for k, (_, _, srcs) in enumerate(self.code):
            for s in srcs:
                last[s] = k
        free, where, rows, n_regs = [], {}, [], n_in

        def reg(s):
            if s[0] == "in":
                return s[1]
            if s[0] == "const":
                return len(self.operands) + s[1]
            return where[s]

        for k, (name, dst, srcs) in enumerate(self.code):
            src_regs = [reg(s) for s in srcs]
            for s in dict.fromkeys(srcs):     # a register read twice is freed once
                if s[0] == "tmp" and last.get(s) == k and s != result:
                    free.append(where[s])
            if dst == result and k == len(self.code) - 1:
                d = -1
            else:
                if free:
                    d = free.pop()
                else:
                    d, n_regs = n_regs, n_regs + 1
                where[dst] = d
            rows.append([_kernel.OPCODES[name][0], d] + (src_regs + [0, 0, 0, 0])[:4])
        if n_regs > _kernel.MAX_REGISTERS:
            raise Unfusable()
        return np.array(rows, dtype=np.int32).reshape(-1, 6), max(n_regs, 1)


def _name(op):
    describe = getattr(op, "describe", None)
    if describe is not None:
        return describe()
    return getattr(op, "api", None) or type(op).__name__


class Fused(Op):
    """One step for a group of element-wise ops, and optionally ``base``, the
    op that produces their full-size operand ``inplace``: the step's inputs
    are the base op's inputs, then the other operands.

    ``members``: the group's ops in order as ``(op, refs)``, refs naming
    operands (``("in", i)``) or earlier members (``("m", j)``), used when the
    run-time shapes do not fit the program and for reading the plan.
    """

    api = "fused"
    pure = True
    fresh_output = True

    def __init__(self, base, n_base, code, n_regs, kinds, consts, axis, inplace, members,
                 out_spec):
        self.base = base
        self.n_base = n_base
        # the checked program with its operand kinds (baked constants last),
        # channel axis and in-place operand
        self.program = _kernel.Program(code, n_regs, kinds + [SCALAR] * len(consts), consts,
                                       axis, inplace, out_spec[1])
        self.inplace = inplace      # operand index whose buffer may take the result
        self.members = members
        self.out_spec = out_spec

    def key(self):
        return None

    def describe(self):
        """The step's ops in order, for a profile or a plan listing:
        'conv2d + add + relu'."""
        names = [] if self.base is None else [_name(self.base)]
        return " + ".join(names + [_name(op) for op, _ in self.members])

    def infer(self, *inputs):
        return [self.out_spec]

    _in_kernel = None
    # the same with the operands as positions among the step's inputs
    _kernel_args = None

    @property
    def in_kernel(self):
        """(bias operand, residual operand, activation) the base op's kernel
        applies itself, or None."""
        return self._in_kernel

    @in_kernel.setter
    def in_kernel(self, spec):
        self._in_kernel = spec
        self._kernel_args = None if spec is None else \
            (self._position(spec[0]), self._position(spec[1]), spec[2])

    def compute(self, *arrays):
        spec = self._kernel_args
        if spec is not None:
            bias, res, act = spec
            y = self.base.compute_epilogue(arrays[:self.n_base],
                                           None if bias is None else arrays[bias], act,
                                           None if res is None else arrays[res])
            if y is not None:
                return (y,)
        if self.base is not None:
            # the base op's output is operand ``inplace``
            y = self.base.compute(*arrays[:self.n_base])[0]
            arrays = list(arrays[self.n_base:])
            arrays.insert(self.inplace, y)
        else:
            arrays = list(arrays)
        out = self.program(arrays)
        if out is None:
            out = self._run_members(arrays)
        return (out,)

    def bind(self, inputs):
        """The step's direct call (Op.bind): the base op's kernel with the
        epilogue it applies itself (``bind_epilogue``), or the element-wise
        program of a step without a base op (called with its operands as a
        list); None otherwise."""
        spec = self._kernel_args
        if spec is None:
            if self.base is None:
                return self.program, tuple(range(len(inputs))), True
            return None
        hook = getattr(self.base, "bind_epilogue", None)
        if hook is None:
            return None
        bias, res, act = spec
        made = hook(inputs[:self.n_base], None if bias is None else inputs[bias], act,
                    None if res is None else inputs[res])
        if made is None:
            return None
        call, positions, _ = made
        # positions past the base op's inputs are its bias and residual
        step = [p if p is None or p < self.n_base else (bias, res)[p - self.n_base]
                for p in positions]
        return call, tuple(step), False

    def block_stage(self, inputs):
        """The base op's stage of a depthwise block (its ``block_stage`` hook,
        ops/depthwise_block.py) with the epilogue its kernel applies, given
        the step's ``inputs``; None without both."""
        hook = getattr(self.base, "block_stage", None)
        spec = self._kernel_args
        if hook is None or spec is None:
            return None
        bias, res, act = spec
        return hook(inputs[:self.n_base], None if bias is None else inputs[bias],
                    None if res is None else inputs[res], act)

    def _position(self, i):
        # program operand i among the step's inputs (the base op's output,
        # operand ``inplace``, is not one of them)
        return None if i is None else self.n_base + i - (i > self.inplace)

    def _run_members(self, arrays):
        results = []
        for op, refs in self.members:
            args = [arrays[i] if kind == "in" else results[i] if kind == "m" else i
                    for kind, i in refs]
            results.append(op.compute(*args)[0])
        return results[-1]

    def __repr__(self):
        names = [type(op).__name__ + ("(%s)" % op.name if hasattr(op, "name") else "")
                 for op, _ in self.members]
        base = "%s + " % type(self.base).__name__ if self.base is not None else ""
        return "Fused(%s%s)" % (base, ", ".join(names))


# ------------------------------------------------------------------ the pass

def _ewise_ok(op, ins, outs):
    return (hasattr(op, "ewise") and len(outs) == 1 and outs[0].dtype in _FLOATS
            and all(x.dtype == outs[0].dtype for x in ins))


def _probe(op, ins, out, exact):
    """Whether ``op`` can join a group whose result has ``out``'s shape."""
    b = ProgramBuilder(out.shape, out.dtype, exact)
    try:
        return op.ewise(b, *[b.operand(x) for x in ins]) is not None
    except Unfusable:
        return False


#: The smallest output (its known dimensions' product) a lone element-wise
#: op runs on the fused kernel for: there its threads pay for the call, below
#: it NumPy's loop is as quick (a relu of a batch of feature maps read by
#: several branches, in NASNet, runs on both cores).
SINGLE_OP_MIN_SIZE = 32768
#: The same for a lone maximum or minimum (a relu, a clip): NumPy's float32
#: maximum with a scalar is about five times slower than its add, and the
#: kernel's vector loop is quicker from a few thousand elements on
#: (benchmarks/bench_ewise.py, its relu programs).
SINGLE_MAX_MIN_SIZE = 8192


_MAX_MIN = (_kernel.OPCODES["maximum"][0], _kernel.OPCODES["minimum"][0])


def _known_size(shape):
    size = 1
    for d in shape:
        size *= 1 if d is None else d
    return size


def fuse(steps, targets, exact, skip=()):
    """The steps with element-wise groups fused. ``exact``: only opcodes whose
    results are identical to NumPy's (training plans). ``skip``: tensors
    whose producing steps stay as they are (weights folded once per plan).

    A group is grown from its root (the last step of it) back through
    producers whose one output has this one reader. Every step has at most
    one such reader, so the steps that may join form a forest, and a root's
    group is its subtree. Roots are tried last step first; a root whose
    group cannot be built (too many operands for the program's registers,
    say) leaves its subtree for the roots below it, so a chain of n steps
    may be tried n times: what a group needs is therefore worked out once,
    bottom-up, and a root whose operands alone exceed the registers is
    passed over without walking its subtree.
    """
    # keyed by tensor id: a tensor's own hash is a Python call
    producer, users = {}, {}
    for i, (op, ins, outs) in enumerate(steps):
        for o in outs:
            producer[o.id] = i
        for x in ins:
            users[x.id] = users.get(x.id, 0) + 1
    keep = {t.id for t in targets}
    skip = {t.id for t in skip}
    # Whether a step may join a group depends on its op and its operands'
    # shapes and kinds, not on their values: probed once per such signature
    # (an op object is shared by many steps: one Binary('add') for all adds).
    probed = {}
    joinable = []
    for op, ins, outs in steps:
        ok = _ewise_ok(op, ins, outs)
        if ok:
            key = (id(op), outs[0].shape, outs[0].dtype,
                   tuple((x.shape, type(x) is Constant and x.value.size == 1) for x in ins))
            ok = probed.get(key)
            if ok is None:
                ok = probed[key] = _probe(op, ins, outs[0], exact)
        joinable.append(ok)
    children, n_operands = _forest(steps, joinable, producer, users, keep)
    taken = set()
    replaced = {}
    # a step taken as a group's base that could also be a group member makes
    # the operand counts (taken over whole subtrees) unreliable
    counts_valid = True
    for i in range(len(steps) - 1, -1, -1):
        op, ins, outs = steps[i]
        if i in taken or outs[0].id in skip or not joinable[i]:
            continue
        if counts_valid and n_operands[i] > _kernel.MAX_REGISTERS:
            continue
        members, stack = [i], [i]
        while stack:
            for k in children[stack.pop()]:
                if k not in taken:
                    members.append(k)
                    stack.append(k)
        members.sort()
        group = _build(steps, members, outs[0], exact, producer, users, keep, taken)
        if group is None:
            continue
        fused_step, base_k = group
        taken.update(members)
        if base_k is not None:
            taken.add(base_k)
            if joinable[base_k]:
                counts_valid = False
        replaced[i] = fused_step
    return [replaced.get(i, s) for i, s in enumerate(steps) if i not in taken or i in replaced]


def _forest(steps, joinable, producer, users, keep):
    """``children[j]``: the steps that may join a group through their output
    read by step ``j``; ``n_operands[j]``: how many operands (distinct
    tensors, distinct scalar constants) the group of ``j``'s subtree has,
    which no register allocation can go below.

    The operand sets are merged into the largest child's set, so each
    tensor is moved O(log n) times whatever the forest's shape."""
    children = [()] * len(steps)
    n_operands = [0] * len(steps)
    tensors_of, consts_of = {}, {}
    for j, (op, ins, outs) in enumerate(steps):
        if not joinable[j]:
            continue
        shape, dtype = outs[0].shape, outs[0].dtype
        kids, inner = [], []
        for x in ins:
            k = producer.get(x.id)
            if k is None or not joinable[k] or users[x.id] != 1 or x.id in keep or \
                    x.shape != shape or k in kids:
                continue
            kids.append(k)
            inner.append(x.id)
        children[j] = kids
        if not kids:
            tensors, consts = set(), set()
        elif len(kids) == 1:
            tensors, consts = tensors_of.pop(kids[0]), consts_of.pop(kids[0])
        else:
            sets = [(tensors_of.pop(k), consts_of.pop(k)) for k in kids]
            tensors = max((t for t, _ in sets), key=len)
            consts = max((c for _, c in sets), key=len)
            for t, c in sets:
                if t is not tensors:
                    tensors |= t
                if c is not consts:
                    consts |= c
        for x in ins:
            if x.id in inner:
                continue
            if type(x) is Constant and x.value.size == 1:
                # as ProgramBuilder.const tells constants apart
                consts.add(np.asarray(x.value.reshape(()).item(), dtype=dtype).tobytes())
            else:
                tensors.add(x.id)
        tensors_of[j], consts_of[j] = tensors, consts
        n_operands[j] = len(tensors) + len(consts)
    return children, n_operands


def _build(steps, members, root, exact, producer, users, keep, taken):
    """``(fused step, index of the step it runs as its base or None)`` for
    the group ``members`` (step indices in order), or None."""
    b = ProgramBuilder(root.shape, root.dtype, exact)
    reg_of, refs_of = {}, []
    member_out = {}
    try:
        for k in members:
            op, ins, outs = steps[k]
            srcs = [reg_of[x.id] if x.id in reg_of else b.operand(x) for x in ins]
            r = op.ewise(b, *srcs)
            if r is None:
                return None
            reg_of[outs[0].id] = r
            member_out[outs[0].id] = len(refs_of)
            refs_of.append((op, ins))
        code, n_regs = b.assemble(reg_of[root.id])
    except Unfusable:
        return None
    # The producer of a full-size operand that dies here: its op runs inside
    # the fused step (an epilogue), or its buffer takes the result.
    base, base_k, inplace = None, None, None
    for j, (t, kind) in enumerate(zip(b.operands, b.kinds)):
        k = producer.get(t.id)
        if kind != FULL or k is None or k in taken or users.get(t.id) != 1 or t.id in keep:
            continue
        if not getattr(steps[k][0], "fresh_output", False) or steps[k][2][0] is not t:
            continue
        if len(steps[k][2]) == 1 and getattr(steps[k][0], "epilogue_host", False):
            base, base_k, inplace = steps[k][0], k, j
            break
        if inplace is None:
            inplace = j
    n_instr = len(code)
    if base is None and len(members) == 1 and n_instr == 1 and inplace is None and \
            _known_size(root.shape) < (SINGLE_MAX_MIN_SIZE if code[0][0] in _MAX_MIN
                                       else SINGLE_OP_MIN_SIZE):
        return None
    operands = list(b.operands)
    members_refs = []
    for op, ins in refs_of:
        members_refs.append((op, [_ref(x, member_out, b.operand_index) for x in ins]))
    n_base, ins = 0, operands
    if base is not None:
        n_base = len(steps[base_k][1])
        ins = list(steps[base_k][1]) + [t for j, t in enumerate(operands) if j != inplace]
    op = Fused(base, n_base, code, n_regs, list(b.kinds), list(b.consts), b.axis, inplace,
               members_refs, (root.shape, root.dtype))
    if base is not None:
        op.in_kernel = _in_kernel_epilogue(b, base, inplace, root)
    return (op, ins, [root]), base_k


def _in_kernel_epilogue(b, base, slot, out):
    """``(bias operand or None, residual operand or None, activation)`` when
    the program is, on the base op's output, a per-channel bias add, then an
    add of a full-size operand, then relu / relu6 (each optional) that the
    base op can apply inside its kernel (its ``kernel_epilogue`` hook), else
    None."""
    hook = getattr(base, "kernel_epilogue", None)
    if hook is None:
        return None
    # taken from the front one instruction at a time (a long chain of relus
    # must not be copied once per instruction)
    code, cur = collections.deque(b.code), ("in", slot)

    def add_of(kind):
        # the other operand of an add of ``cur`` and an input of this kind
        if not code or code[0][0] != "add":
            return None
        srcs = code[0][2]
        other = srcs[1] if srcs[0] == cur else srcs[0] if srcs[1] == cur else None
        if other is None or other[0] != "in" or other[1] == slot or b.kinds[other[1]] != kind:
            return None
        return other[1]

    bias = add_of(CHAN)
    if bias is not None:
        cur = code.popleft()[1]
    res = add_of(FULL)
    if res is not None:
        cur = code.popleft()[1]
    act = None
    consts = [float(c) for c in b.consts]

    def is_max0(row):
        return row[0] == "maximum" and row[2][0] == cur and row[2][1][0] == "const" and \
            consts[row[2][1][1]] == 0

    while code and is_max0(code[0]):    # Relu(max_value) clamps at 0 twice
        act, cur = "relu", code.popleft()[1]
    if act == "relu":
        if code and code[0][0] == "minimum" and code[0][2][0] == cur and \
                code[0][2][1][0] == "const" and consts[code[0][2][1][1]] == 6:
            act = "relu6"
            code.popleft()
    if code or (bias is None and res is None and act is None):
        return None
    if not hook(b.axis if bias is not None else None, act, out, residual=res is not None,
                exact=b.exact):
        return None
    return bias, res, act


def _ref(x, member_out, operand_index):
    if x.id in member_out:
        return ("m", member_out[x.id])
    i = operand_index.get(x.id)
    if i is not None:
        return ("in", i)
    return ("v", x.value)       # a scalar Constant baked into the program
