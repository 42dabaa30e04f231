"""Fused recurrent cells: the op that replaces a Scan whose step is a standard
LSTM, GRU or SimpleRNN cell (recognised by ``cyback.ops.scan_cells``).

The op takes the Scan's inputs unchanged (sequences, initial states,
invariants) and gives the Scan's outputs (the per-step output, the final
states) followed by the records its gradient reads; only the inputs the cell
uses are read (``roles``). The per-step work is one recurrent product (two for
a GRU whose reset gate comes before its candidate's product) and one pass of
gate arithmetic in ``cyback.kernels.rnn_cell``.
"""
import functools

import numpy as np

from cyback.graph.op import Op
from cyback.graph.tensor import Constant
from cyback.kernels import rnn_cell as _k
from cyback.ops import elementwise as ew
from cyback.ops.elementwise import Binary
from cyback.ops.linalg import TensorDot, contract
from cyback.ops.shape import Concatenate, GetItem

#: gate count per cell type
GATES = {"lstm": 4, "gru": 3, "simple": 1}

#: Batches from this size on project x inside the LSTM or GRU kernel's
#: steps, each thread its own rows (kernels.rnn_cell.lstm_forward_projected,
#: gru_forward_projected); smaller ones take the separate product first,
#: which is faster for them (benchmarks/bench_rnn.py).
_PROJECT_MIN_ROWS = 8
_PRODUCT = TensorDot((2,), (0,))

#: roles that may come split per gate ("zx.0", "zx.1", ...: Keras's
#: implementation 1, and the GRU's projection), and the axis the parts join on
_SPLIT_AXIS = {"zx": 2, "R": 1, "rb": 0}


class FusedRecurrent(Op):
    """``cell`` is "lstm", "gru" or "simple"; ``roles`` maps "zx" (the input
    projection sequence), "h0", "c0" (LSTM), "y0" (the previous output, a
    state only under a mask), "R" (the recurrent kernel), "Rh" (the GRU's
    candidate kernel without ``reset_after``), "rb" (the GRU's recurrent bias
    with ``reset_after``), "rmask" (recurrent dropout) and "mask" (Keras mask
    sequence) to input positions (absent: unused). "zx", "R" and "rb" may be
    given per gate instead, as "zx.0", "zx.1", ... (joined along the gates).
    ``state_roles`` names the Scan's states in order (e.g. ("h", "c", "y"));
    ``n_inputs`` is the Scan's input count; ``flags`` holds the GRU's
    "reset_after" and "mix_masked" (the new state mixes the dropped-out h)."""

    # the sequence runs in a kernel without the GIL, to the same bits on any
    # thread count: a bidirectional layer's two directions run side by side
    # (graph/concurrent.py)
    runs_side_by_side = True

    def __init__(self, cell, roles, state_roles, act, ract, n_inputs, api, consts=None,
                 flags=()):
        self.cell, self.roles, self.state_roles = cell, dict(roles), tuple(state_roles)
        # roles held by the body as constants rather than inputs
        self.consts = dict(consts or {})
        self.act, self.ract = act, ract
        self.n_in, self.api = n_inputs, api
        self.flags = frozenset(flags)
        self.n_outputs = 1 + len(self.state_roles) + len(self._record_names())

    def key(self):
        return None

    def _record_names(self):
        if self.cell == "lstm":
            return ("hs", "cs", "gates")
        if self.cell == "gru":
            return ("hs", "gates", "ph") if "reset_after" in self.flags else ("hs", "gates")
        return ("hs", "acts")

    def _parts(self, name):
        """The per-gate roles of ``name`` ("zx.0", "zx.1", ...), in order."""
        # Looked up at every call of a batch-1 inference plan, where the
        # op's Python time is a large part of the layer's: found once.
        cache = self.__dict__.setdefault("_parts_found", {})
        if name not in cache:
            prefix = name + "."
            found = [r for r in list(self.roles) + list(self.consts) if r.startswith(prefix)]
            cache[name] = tuple(sorted(found, key=lambda r: int(r[len(prefix):])))
        return cache[name]

    def _has(self, name):
        return name in self.roles or name in self.consts or bool(self._parts(name))

    def _grad_names(self):
        """The inputs FusedRecurrentGrad gives gradients for, in order."""
        names = {"lstm": ("zx", "h0", "c0", "y0", "R"), "simple": ("zx", "h0", "y0", "R"),
                 "gru": ("zx", "h0", "y0", "R")}[self.cell]
        if self.cell == "gru" and "reset_after" not in self.flags:
            names += ("Rh",)
        if self._has("rb"):
            names += ("rb",)
        out = ()
        for name in names:
            parts = self._parts(name) if name in _SPLIT_AXIS else ()
            out += tuple(parts) if parts else (name,)
        return out

    def _value(self, role, arrays):
        return arrays[self.roles[role]] if role in self.roles else self.consts.get(role)

    def _first_projection(self, ins):
        # x when the op projects it itself: the same steps and dtype as zx
        for name in ("zx", "x"):
            if name in self.roles:
                return ins[self.roles[name]]
        return ins[self.roles[self._parts("zx")[0]]]

    def infer(self, *ins):
        if len(ins) != self.n_in:
            raise ValueError("%s: expected %d inputs, got %d" % (self.api, self.n_in, len(ins)))
        zx, h0 = self._first_projection(ins), ins[self.roles["h0"]]
        t, dt = zx.shape[0], zx.dtype
        specs = [((t,) + h0.shape, dt)]
        specs += [(ins[self.roles[r + "0"]].shape, dt) for r in self.state_roles]
        u = h0.shape[-1]
        for name in self._record_names():
            width = u * GATES[self.cell] if name == "gates" else u
            specs.append(((t,) + h0.shape[:-1] + (width,), dt))
        return specs

    def _gather(self, name, arrays, dt):
        """The array of role ``name``, its parts joined; None when unused."""
        value = self._value(name, arrays)
        if value is not None:
            if name == "x":
                # read as it is (a transposed view of the batch-major input)
                # unless its last axis is strided
                value = np.asarray(value, dtype=dt)
                return value if value.ndim != 3 or value.shape[2] < 2 or \
                    value.strides[2] == value.itemsize else np.ascontiguousarray(value)
            return np.ascontiguousarray(value, dtype=dt)
        names = self._parts(name)
        if not names:
            return None
        if name == "zx":
            return _joined([np.asarray(self._value(p, arrays)) for p in names], dt)
        if name == "rb":
            # A gate without a recurrent bias of its own adds zeros.
            u = np.shape(arrays[self.roles["h0"]])[-1]
            return np.concatenate([np.asarray(self._value("rb.%d" % k, arrays), dtype=dt)
                                   if "rb.%d" % k in names else np.zeros(u, dt)
                                   for k in range(GATES[self.cell])])
        parts = [np.asarray(self._value(p, arrays)) for p in names]
        return np.ascontiguousarray(np.concatenate(parts, axis=_SPLIT_AXIS[name]), dtype=dt)

    def _arrays(self, arrays):
        dt = self._first_projection(arrays).dtype
        get = {}
        plan = self.__dict__.get("_gather_plan")
        if plan is None:
            plan = self._gather_plan = self._plan_gather()
        direct, joined = plan
        # Inputs that are already C-contiguous arrays of the dtype go as
        # they are: at batch 1 a small layer's bookkeeping costs about as
        # much as its steps.
        for name, i in direct:
            value = arrays[i] if i >= 0 else self.consts[name]
            if type(value) is not np.ndarray or value.dtype != dt or \
                    not value.flags.c_contiguous:
                value = self._gather(name, arrays, dt)
            get[name] = value
        for name in joined:
            value = self._gather(name, arrays, dt)
            if value is not None:
                get[name] = value
        if "y0" not in get:
            get["y0"] = get["h0"]
        get["rmask"] = self._value("rmask", arrays)
        get["mask"] = arrays[self.roles["mask"]] if "mask" in self.roles else None
        return get

    def _plan_gather(self):
        """(roles given whole: (name, input position or -1 for a constant),
        roles given per gate or absent), over the roles _arrays reads."""
        direct, joined = [], []
        for name in ("zx", "x", "W", "xb", "h0", "c0", "y0", "R", "Rh", "rb"):
            if name in self.roles:
                direct.append((name, self.roles[name]))
            elif name in self.consts:
                direct.append((name, -1))
            elif self._parts(name):
                joined.append(name)
        return tuple(direct), tuple(joined)

    def compute(self, *arrays):
        return self._run(True, *arrays)

    def compute_for(self, needed):
        """Record what the gradient reads only in plans that read it: an
        inference plan runs the kernel with no records (the states in a ring
        of two steps), which spares it writing gates and states per step."""
        keep = any(needed[1 + len(self.state_roles):])
        return functools.partial(self._run, keep)

    def _run(self, keep, *arrays):
        a = self._arrays(arrays)
        if self.cell == "lstm":
            rest = (a["h0"], a["c0"], a["y0"], a["R"], a["rmask"], a["mask"], self.act, self.ract)
            hs, cs, ys, gates = _forward(_k.lstm_forward, _k.lstm_forward_projected, a, rest,
                                         keep)
            records = (hs, cs, gates)
            states = {"h": hs, "c": cs, "y": ys}
        elif self.cell == "gru":
            ra = "reset_after" in self.flags
            rest = (a["h0"], a["y0"], a["R"], a.get("Rh"), a.get("rb"), a["rmask"], a["mask"], ra,
                    "mix_masked" in self.flags, self.act, self.ract)
            hs, ys, gates, ph = _forward(_k.gru_forward, _k.gru_forward_projected, a, rest, keep)
            records = (hs, gates, ph) if ra else (hs, gates)
            states = {"h": hs, "y": ys}
        else:
            hs, ys, acts = _k.simple_forward(a["zx"], a["h0"], a["y0"], a["R"], a["rmask"],
                                             a["mask"], self.act, keep=keep)
            records = (hs, acts)
            states = {"h": hs, "y": ys}
        T = len(ys)
        finals = []
        for s in self.state_roles:
            if not T:
                finals.append(a[s + "0"])
            elif s == "y" or keep:
                finals.append(states[s][T - 1])
            else:
                finals.append(states[s][(T - 1) % 2])     # the ring's last step
        if not keep:
            records = tuple(_no_record(r.ndim, r.dtype) for r in records)
        return (ys,) + tuple(finals) + records

    def rewrite(self, inputs, ctx):
        """Inference: a role given per gate reaches the op whole, so that the
        op no longer joins its parts at every call (at batch 1 the slicing
        steps and the join are a noticeable part of the layer):

        - parts that are consecutive slices of one array along their gate
          axis (the hoisted projection cut back into gates) read that array;
        - per-gate projections of one input (Keras's implementation 1, the
          default of Keras 2.2's LSTM and GRU) become one product with the
          kernels and biases joined;
        - per-gate recurrent kernels and biases that are weights are joined
          (zeros for a gate without a bias).

        Joined weights are computed once by the plan (frozen weights)."""
        roles, changed = {}, False
        for name in ("zx", "R"):
            parts = self._parts(name)
            if len(parts) < 2 or any(p not in self.roles for p in parts):
                continue
            tensors = [inputs[self.roles[p]] for p in parts]
            whole = _sliced_from(tensors, _SPLIT_AXIS[name], ctx)
            if whole is None and name == "zx":
                whole = _one_projection(tensors, ctx)
            if whole is None and name == "R" and all(ctx.is_weight(t) for t in tensors):
                whole = _whole(tensors, _SPLIT_AXIS[name], ctx)
            if whole is not None:
                roles[name] = whole
                changed = True
        absorbed = False
        if self.cell in ("lstm", "gru"):
            zx = roles.get("zx", inputs[self.roles["zx"]] if "zx" in self.roles else None)
            projection = None if zx is None else _projection_of(zx, ctx, "zx" in roles)
            if projection is not None:
                roles.pop("zx", None)
                roles.update(projection)
                absorbed = changed = True
        rb = self._parts("rb")
        u = inputs[self.roles["h0"]].shape[-1]
        if rb and all(p in self.roles and ctx.is_weight(inputs[self.roles[p]]) for p in rb) \
                and u is not None:
            # the recurrent biases, zeros for a gate without one (as _gather)
            given = {p: inputs[self.roles[p]] for p in rb}
            dt = given[rb[0]].dtype
            roles["rb"] = _whole([given.get("rb.%d" % k, Constant(np.zeros(u, dt)))
                                  for k in range(GATES[self.cell])], 0, ctx)
            changed = True
        if not changed:
            return None
        # the roles replaced: joined ones' parts, and zx (whole or in parts)
        # when the projection went in
        replaced = list(roles) + (["zx"] if absorbed else [])
        parts = {p for name in replaced for p in self._parts(name)}
        parts.update(name for name in replaced if name in self.roles)
        drop = {self.roles[p] for p in parts}
        if any(k in drop for r, k in self.roles.items() if r not in parts):
            return None     # an input read as a part and as something else
        keep = [k for k in range(len(inputs)) if k not in drop]
        at = {k: i for i, k in enumerate(keep)}
        ins = [inputs[k] for k in keep]
        kept = {r: at[k] for r, k in self.roles.items() if r not in parts}
        for name, t in roles.items():
            kept[name] = len(ins)
            ins.append(t)
        op = FusedRecurrent(self.cell, kept, self.state_roles, self.act, self.ract, len(ins),
                            self.api, self.consts, self.flags)
        out = op(*ins)
        return list(out) if isinstance(out, tuple) else [out]

    def grad(self, inputs, outputs, grads):
        if all(g is None for g in grads[:1 + len(self.state_roles)]):
            return [None] * len(inputs)
        n_st = len(self.state_roles)
        g = [x if x is not None else ew.zeros_like_tensor(o)
             for x, o in zip(grads[:1 + n_st], outputs[:1 + n_st])]
        d_final = dict(zip(self.state_roles, g[1:]))
        records = list(outputs[1 + n_st:])
        ins = [g[0]] + [d_final.get(s, g[0]) for s in ("h", "c", "y")] + list(inputs) + records
        res = FusedRecurrentGrad(self)(*ins)
        out = [None] * len(inputs)
        for name, value in zip(self._grad_names(), res):
            if name in self.roles and (name != "y0" or "y" in self.state_roles):
                out[self.roles[name]] = value if out[self.roles[name]] is None else \
                    ew.add(out[self.roles[name]], value)
        return out


class FusedRecurrentGrad(Op):
    """Backprop through time of a FusedRecurrent. Inputs: the gradient of the
    output sequence, of the final h, c and last output (placeholders where the
    cell has none of these), the forward op's inputs, then its records.
    Outputs: the gradients of the forward's ``_grad_names()`` (e.g. ``dzx,
    dh0, dc0, dy0, dR`` for the LSTM)."""

    def __init__(self, fwd):
        self.fwd = fwd
        self.api = fwd.api
        self.names = fwd._grad_names()
        self.n_outputs = len(self.names)

    def key(self):
        return None

    def infer(self, *ins):
        f = self.fwd
        fwd_ins = ins[4:4 + f.n_in]
        dt = f._first_projection(fwd_ins).dtype
        specs = []
        for name in self.names:
            if name in f.roles:
                shape = fwd_ins[f.roles[name]].shape
            elif name in f.consts:
                shape = np.shape(f.consts[name])
            else:       # y0 without a mask: h0's shape
                shape = fwd_ins[f.roles["h0"]].shape
            specs.append((shape, dt))
        return specs

    def grad(self, inputs, outputs, grads):
        raise NotImplementedError("%s: second derivatives through a fused recurrent cell are "
                                  "not supported; use unroll=True" % self.api)

    def compute(self, *arrays):
        f = self.fwd
        dys, dhT, dcT, dyT = arrays[:4]
        a = f._arrays(arrays[4:4 + f.n_in])
        rec = [np.ascontiguousarray(r) for r in arrays[4 + f.n_in:]]
        dt = a["zx"].dtype
        dys = np.ascontiguousarray(dys, dtype=dt)
        if "y" not in f.state_roles:
            dyT = np.zeros_like(a["h0"])
        u = a["h0"].shape[-1]
        if f.cell == "lstm":
            dz, dh0, dc0, dy0, dR = _k.lstm_backward(dys, dhT, dcT, dyT, a["h0"], a["c0"],
                                                     a["R"], a["rmask"], a["mask"], f.act,
                                                     f.ract, *rec)
            got = {"zx": dz, "h0": dh0, "c0": dc0, "y0": dy0, "R": dR}
        elif f.cell == "simple":
            dz, dh0, dy0, dR = _k.simple_backward(dys, dhT, dyT, a["h0"], a["R"], a["rmask"],
                                                  a["mask"], f.act, *rec)
            got = {"zx": dz, "h0": dh0, "y0": dy0, "R": dR}
        else:
            ra = "reset_after" in f.flags
            hs, gates = rec[:2]
            ph = rec[2] if ra else np.zeros((1, 1, 1), dt)
            dxz, dxr, dxh, dh0, dy0, dR, dRh, drb = _k.gru_backward(
                dys, dhT, dyT, a["h0"], a["R"], a.get("Rh"), a.get("rb"), a["rmask"],
                a["mask"], ra, "mix_masked" in f.flags, f.act, f.ract, hs, gates, ph)
            got = {"zx.0": dxz, "zx.1": dxr, "zx.2": dxh, "h0": dh0, "y0": dy0, "R": dR,
                   "Rh": dRh, "rb": drb}
        out = []
        for name in self.names:
            if name not in got:
                # a per-gate part: a block of u columns of the whole gradient
                base, k = name.split(".")
                index = [slice(None)] * got[base].ndim
                index[_SPLIT_AXIS[base]] = \
                    slice(int(k) * u, (int(k) + 1) * u)
                got[name] = got[base][tuple(index)]
            out.append(got[name])
        return tuple(out)


def _sliced_from(tensors, axis, ctx):
    """The tensor whose consecutive slices along ``axis`` (from 0 to its end,
    in order, every other axis whole) the ``tensors`` are, or None."""
    base, at = None, 0
    for k, t in enumerate(tensors):
        made = ctx.producer(t)
        if made is None or type(made[0]) is not GetItem or len(made[1]) != 1:
            return None
        spec, src = made[0].spec, made[1][0]
        if base is None:
            base = src
        if src is not base or len(spec) != axis + 1 or src.ndim != axis + 1 or \
                any(sp != ("slice", None, None, None) for sp in spec[:axis]):
            return None
        kind, start, stop, step = spec[axis]
        width = t.shape[axis]
        if kind != "slice" or step not in (None, 1) or width is None or (start or 0) != at or \
                (stop is None and k != len(tensors) - 1) or \
                (stop is not None and stop != at + width):
            return None
        at += width
    if base.shape[axis] != at:
        return None
    return base


def _one_projection(tensors, ctx):
    """``(x @ W + b_1) + ... + b_n`` with W and each b_i the kernels and
    biases of the per-gate projections ``tensors`` (each ``(x @ W_k + b_1k)
    + ... + b_nk``: the same x, weights W_k and b_ik) joined along the gates,
    or None. A GRU with reset_after adds its input and then its recurrent
    bias to the update and reset gates, its candidate only the input bias:
    the candidate's missing outer bias is zeros. The adds keep their order
    and adding zero changes no value, so every value is the same."""
    x, dot, adds, ws, biases = None, None, None, [], []
    for t in tensors:
        made, chain = ctx.producer(t), []
        while made is not None and type(made[0]) is Binary and made[0].name == "add" and \
                ctx.is_weight(made[1][1]):
            chain.append((made[0], made[1][1]))
            made = ctx.producer(made[1][0])
        if made is None or type(made[0]) is not TensorDot or len(made[1]) != 2:
            return None
        if x is None:
            x, dot, adds = made[1][0], made[0], [op for op, _ in chain]
        if len(chain) > len(adds):
            adds = [op for op, _ in chain]
        if made[1][0] is not x or (made[0].ax, made[0].ay) != (dot.ax, dot.ay):
            return None
        ws.append(made[1][1])
        biases.append([b for _, b in chain])
    if any(w.ndim != 2 or w.shape[1] is None for w in ws) or \
            any(b.ndim != 1 for bs in biases for b in bs) or \
            not all(ctx.is_weight(w) for w in ws) or x.ndim != 3 or \
            (tuple(dot.ax), tuple(dot.ay)) != ((2,), (0,)):
        return None
    # outermost first, each part's missing outer adds as zeros
    biases = [[Constant(np.zeros(w.shape[1], w.dtype))] * (len(adds) - len(bs)) + bs
              for w, bs in zip(ws, biases)]
    out = dot(x, _whole(ws, 1, ctx))
    for i in reversed(range(len(adds))):       # innermost add first
        out = adds[i](out, _whole([bs[i] for bs in biases], 0, ctx))
    return out


def _forward(plain, projected, a, rest, keep):
    """The cell's kernel on a's zx, or on x, W and xb when the op projects x
    itself: inside the steps from _PROJECT_MIN_ROWS rows on, else first."""
    if "x" not in a:
        return plain(a["zx"], *rest, keep=keep)
    if a["x"].shape[1] >= _PROJECT_MIN_ROWS:
        return projected(a["x"], a["W"], a.get("xb"), *rest, keep=keep)
    return plain(_projection(a["x"], a["W"], a.get("xb")), *rest, keep=keep)


#: Read-only empty records of an inference call, by (ndim, dtype).
_NO_RECORDS = {}


def _no_record(ndim, dtype):
    """The empty record an inference call returns where a training call
    returns what the gradient reads (one shared read-only array)."""
    key = (ndim, dtype)
    a = _NO_RECORDS.get(key)
    if a is None:
        a = np.empty((0,) * ndim, dtype)
        a.flags.writeable = False
        _NO_RECORDS[key] = a
    return a


def _projection(x, w, b):
    """x @ w (+ b) as the plan's product step computed it before the rewrite
    (a batch-1 x goes to the calling thread's dense kernel)."""
    if b is not None:
        out = _PRODUCT.compute_epilogue((x, w), b, None)
        if out is not None:
            return out
    return contract(x, w, (2,), (0,), b)


def _projection_of(zx, ctx, made_here):
    """{"x": x, "W": W, "xb": b} when ``zx`` is ``x @ W + b`` (or ``x @ W``)
    of a (T, B, I) sequence x with weights W (I, G) and b (G,), read by
    the recurrent op only (``made_here``: zx is the join the rewrite just
    made), so that an LSTM or GRU projects x itself (_PROJECT_MIN_ROWS); else
    None.
    The kernel adds the bias after the product, as the add does."""
    if not made_here and ctx.users(zx) != 1:
        return None
    made, roles = ctx.producer(zx), {}
    if made is not None and type(made[0]) is Binary and made[0].name == "add" and \
            len(made[1]) == 2:
        dot, b = made[1]
        if b.ndim != 1 or b.dtype != zx.dtype or not ctx.is_weight(b) or ctx.users(dot) != 1:
            return None
        roles["xb"] = b
        made = ctx.producer(dot)
    if made is None or type(made[0]) is not TensorDot or len(made[1]) != 2 or \
            (tuple(made[0].ax), tuple(made[0].ay)) != ((2,), (0,)):
        return None
    x, w = made[1]
    if x.ndim != 3 or w.ndim != 2 or x.dtype != zx.dtype or w.dtype != zx.dtype or \
            not ctx.is_weight(w):
        return None
    roles["x"], roles["W"] = x, w
    return roles


def _whole(tensors, axis, ctx):
    """The array ``tensors`` are consecutive slices of, else their join."""
    whole = _sliced_from(tensors, axis, ctx)
    return whole if whole is not None else Concatenate(axis)(*tensors)


def _joined(parts, dt):
    """The (T, B, sum of widths) concatenation of (T, B, w) arrays along the
    last axis, as a view when they are adjacent slices of one C-contiguous
    array (the hoisted projection sliced per gate), else as a copy."""
    first = parts[0]
    width = sum(p.shape[-1] for p in parts)
    item = first.itemsize
    adjacent = first.ndim == 3 and all(
        p.dtype == dt and p.ndim == 3 and p.shape[:2] == first.shape[:2]
        and p.strides == (first.shape[1] * width * item, width * item, item) for p in parts)
    if adjacent:
        at = first.__array_interface__["data"][0]
        for p in parts:
            adjacent = adjacent and p.__array_interface__["data"][0] == at
            at += p.shape[-1] * item
    if adjacent and first.base is not None:
        return np.lib.stride_tricks.as_strided(first, first.shape[:2] + (width,),
                                               first.strides)
    return np.ascontiguousarray(np.concatenate(parts, axis=2), dtype=dt)
