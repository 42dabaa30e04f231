"""Fused recurrent cells: the op that replaces a Scan whose step is a standard
LSTM or SimpleRNN cell (recognised by ``cyback.ops.scan_cells``).

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
GATES = {"lstm": 4, "simple": 1}


class FusedRecurrent(Op):
    """``cell`` is "lstm" or "simple"; ``roles`` maps "zx" (the input
    projection sequence), "h0", "c0" (LSTM), "y0" (the previous output, a
    state only under a mask), "R", "rmask" (recurrent dropout) and "mask"
    (Keras mask sequence) to input positions (absent: unused).
    ``state_roles`` names the Scan's states in order (e.g. ("h", "c", "y"));
    ``n_inputs`` is the Scan's input count."""

    def __init__(self, cell, roles, state_roles, act, ract, n_inputs, api, consts=None):
        self.cell, self.roles, self.state_roles = cell, dict(roles), tuple(state_roles)
        # "R" or "rmask" held by the body as constants rather than inputs
        self.consts = dict(consts or {})
        self.act, self.ract = act, ract
        self.n_in, self.api = n_inputs, api
        self.n_outputs = 1 + len(self.state_roles) + len(self._record_names())

    def key(self):
        return None

    def _record_names(self):
        return ("hs", "cs", "gates") if self.cell == "lstm" else ("hs", "acts")

    def infer(self, *ins):
        if len(ins) != self.n_in:
            raise ValueError("%s: expected %d inputs, got %d" % (self.api, self.n_in, len(ins)))
        zx, h0 = ins[self.roles["zx"]], ins[self.roles["h0"]]
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
        dt = arrays[r["zx"]].dtype
        get = {}
        for name in ("zx", "h0", "c0", "y0", "R"):
            if name in r:
                get[name] = np.ascontiguousarray(arrays[r[name]], dtype=dt)
        if "R" not in r:
            get["R"] = np.ascontiguousarray(self.consts["R"], dtype=dt)
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
        for name, value in zip(("zx", "h0", "c0", "y0", "R"), res):
            if name in self.roles and (name != "y0" or "y" in self.state_roles):
                out[self.roles[name]] = value if out[self.roles[name]] is None else \
                    ew.add(out[self.roles[name]], value)
        return out


class FusedRecurrentGrad(Op):
    """Backprop through time of a FusedRecurrent. Inputs: the gradient of the
    output sequence, of the final h, c and last output (placeholders where the
    cell has none of these), the forward op's inputs, then its records.
    Outputs: ``dzx, dh0, dc0, dy0, dR``."""

    n_outputs = 5

    def __init__(self, fwd):
        self.fwd = fwd
        self.api = fwd.api

    def key(self):
        return None

    def infer(self, *ins):
        f = self.fwd
        fwd_ins = ins[4:4 + f.n_in]
        specs = []
        for name in ("zx", "h0", "c0", "y0", "R"):
            if name == "R" and "R" not in f.roles:
                shape = f.consts["R"].shape
            else:
                shape = fwd_ins[f.roles.get(name, f.roles["h0"])].shape
            specs.append((shape, fwd_ins[f.roles["zx"]].dtype))
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
            dz, dh0, dc0, dy0, dR = _k.lstm_backward(dys, dhT, dcT, dyT, a["h0"], a["c0"], a["R"],
                                                     a["rmask"], a["mask"], f.act, f.ract, *rec)
        else:
            dz, dh0, dy0, dR = _k.simple_backward(dys, dhT, dyT, a["h0"], a["R"], a["rmask"],
                                                  a["mask"], f.act, *rec)
            dc0 = dh0
        return dz, dh0, dc0, dy0, dR
