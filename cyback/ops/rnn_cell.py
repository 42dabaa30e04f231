"""Fused recurrent cells: the op that replaces a Scan whose step is a standard
LSTM, GRU or SimpleRNN cell (recognised by ``cyback.ops.scan_cells``).

The op takes the Scan's inputs unchanged (sequences, initial states,
invariants) and gives the Scan's outputs (the per-step output, the final
states) followed by the records its gradient reads; only the inputs the cell
uses are read (``roles``). The per-step work is one BLAS product and one pass
of gate arithmetic in ``cyback.kernels.rnn_cell``.
"""
import numpy as np

from cyback.graph.op import Op
from cyback.kernels import rnn_cell as _k

#: gate count per cell type
GATES = {"lstm": 4, "gru": 3, "simple": 1}

#: the input projection's roles per cell type: one sequence, or the GRU's
#: three (its gates are sliced before the recurrent product is added)
PROJECTION = {"lstm": ("zx",), "gru": ("xz", "xr", "xh"), "simple": ("zx",)}


class FusedRecurrent(Op):
    """``cell`` is "lstm", "gru" or "simple"; ``roles`` maps "zx" (the input
    projection sequence; for the GRU "xz", "xr", "xh", one per gate), "h0",
    "c0" (LSTM), "y0" (the previous output, a state only under a mask), "R",
    "Rh" (the GRU's candidate kernel without ``reset_after``), "rb" (the GRU's
    recurrent bias with ``reset_after``), "rmask" (recurrent dropout) and
    "mask" (Keras mask sequence) to input positions (absent: unused).
    ``state_roles`` names the Scan's states in order (e.g. ("h", "c", "y"));
    ``n_inputs`` is the Scan's input count; ``flags`` holds the GRU's
    "reset_after" and "mix_masked" (the new state mixes the dropped-out h)."""

    def __init__(self, cell, roles, state_roles, act, ract, n_inputs, api, consts=None,
                 flags=()):
        self.cell, self.roles, self.state_roles = cell, dict(roles), tuple(state_roles)
        # "R", "Rh", "rb" or "rmask" held by the body as constants, not inputs
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

    def _grad_names(self):
        """The inputs FusedRecurrentGrad gives gradients for, in order."""
        if self.cell == "lstm":
            return ("zx", "h0", "c0", "y0", "R")
        if self.cell == "simple":
            return ("zx", "h0", "y0", "R")
        names = ("xz", "xr", "xh", "h0", "y0", "R")
        if "reset_after" not in self.flags:
            names += ("Rh",)
        if "rb" in self.roles or "rb" in self.consts:
            names += ("rb",)
        return names

    def infer(self, *ins):
        if len(ins) != self.n_in:
            raise ValueError("%s: expected %d inputs, got %d" % (self.api, self.n_in, len(ins)))
        zx, h0 = ins[self.roles[PROJECTION[self.cell][0]]], ins[self.roles["h0"]]
        t, dt = zx.shape[0], zx.dtype
        specs = [((t,) + h0.shape, dt)]
        specs += [(ins[self.roles[r + "0"]].shape, dt) for r in self.state_roles]
        u = h0.shape[-1]
        for name in self._record_names():
            width = u * GATES[self.cell] if name == "gates" else u
            specs.append(((t,) + h0.shape[:-1] + (width,), dt))
        return specs

    def _arrays(self, arrays):
        r = self.roles
        dt = arrays[r[PROJECTION[self.cell][0]]].dtype
        get = {}
        for name in ("zx", "h0", "c0", "y0", "R", "Rh", "rb"):
            if name in r:
                get[name] = np.ascontiguousarray(arrays[r[name]], dtype=dt)
            elif name in self.consts:
                get[name] = np.ascontiguousarray(self.consts[name], dtype=dt)
        if self.cell == "gru":
            get["zx"] = _joined([arrays[r[n]] for n in PROJECTION["gru"]], dt)
        if "y0" not in get:
            get["y0"] = get["h0"]
        get["rmask"] = arrays[r["rmask"]] if "rmask" in r else self.consts.get("rmask")
        get["mask"] = arrays[r["mask"]] if "mask" in r else None
        return get

    def compute(self, *arrays):
        a = self._arrays(arrays)
        if self.cell == "lstm":
            hs, cs, ys, gates = _k.lstm_forward(a["zx"], a["h0"], a["c0"], a["y0"], a["R"],
                                                a["rmask"], a["mask"], self.act, self.ract)
            records = (hs, cs, gates)
            last = {"h": hs, "c": cs, "y": ys}
        elif self.cell == "gru":
            ra = "reset_after" in self.flags
            hs, ys, gates, ph = _k.gru_forward(a["zx"], a["h0"], a["y0"], a["R"], a.get("Rh"),
                                               a.get("rb"), a["rmask"], a["mask"], ra,
                                               "mix_masked" in self.flags, self.act, self.ract)
            records = (hs, gates, ph) if ra else (hs, gates)
            last = {"h": hs, "y": ys}
        else:
            hs, ys, acts = _k.simple_forward(a["zx"], a["h0"], a["y0"], a["R"], a["rmask"],
                                             a["mask"], self.act)
            records = (hs, acts)
            last = {"h": hs, "y": ys}
        finals = tuple(last[s][-1] if len(last[s]) else a[s + "0"] for s in self.state_roles)
        return (ys,) + finals + records

    def grad(self, inputs, outputs, grads):
        from cyback.ops import elementwise as ew
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
        dt = fwd_ins[f.roles[PROJECTION[f.cell][0]]].dtype
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
        if f.cell == "lstm":
            return _k.lstm_backward(dys, dhT, dcT, dyT, a["h0"], a["c0"], a["R"], a["rmask"],
                                    a["mask"], f.act, f.ract, *rec)
        if f.cell == "simple":
            return _k.simple_backward(dys, dhT, dyT, a["h0"], a["R"], a["rmask"], a["mask"],
                                      f.act, *rec)
        ra = "reset_after" in f.flags
        hs, gates = rec[:2]
        ph = rec[2] if ra else np.zeros((1, 1, 1), dt)
        dxz, dxr, dxh, dh0, dy0, dR, dRh, drb = _k.gru_backward(
            dys, dhT, dyT, a["h0"], a["R"], a.get("Rh"), a.get("rb"), a["rmask"], a["mask"], ra,
            "mix_masked" in f.flags, f.act, f.ract, hs, gates, ph)
        got = {"xz": dxz, "xr": dxr, "xh": dxh, "h0": dh0, "y0": dy0, "R": dR, "Rh": dRh,
               "rb": drb}
        return tuple(got[n] for n in self.names)


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
