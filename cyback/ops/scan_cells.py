"""Recognise standard recurrent cells in a Scan's loop body.

After ``build_scan`` has hoisted the input projection, the body of Keras's
LSTMCell and GRUCell (implementation 2, the default) and SimpleRNNCell steps
is a small graph: the recurrent product ``(h * rmask) @ R`` added to the
projection, sliced gates, their non-linearities and the state update (the GRU
with its reset gate before or after its second product, ``reset_after``);
under a Keras mask, ``rnn`` wraps
each new state in ``where(mask_t, new, old)`` and carries the previous output
as one more state. ``fuse_cell`` matches exactly these graphs and returns a
``FusedRecurrent`` op taking the Scan's inputs, or None: anything else (other
cells, other activations, extra terms, a zero output for masked steps) keeps
the general Scan.
"""
import numpy as np

from cyback.graph.tensor import Constant
from cyback.ops import elementwise as ew
from cyback.ops.linalg import TensorDot
from cyback.ops.shape import ExpandTo, GetItem

#: set to False to keep every loop on the general Scan (tests compare both)
ENABLED = True

_ACTS = {"tanh": 0, "sigmoid": 1}


class _NoMatch(Exception):
    pass


def _need(cond):
    if not cond:
        raise _NoMatch()


def _op(t, cls, name=None):
    """The inputs of ``t``'s node when it is a ``cls`` op (named ``name``)."""
    n = t.node
    _need(n is not None and type(n.op) is cls and len(n.outputs) == 1)
    if name is not None:
        _need(getattr(n.op, "name", None) == name)
    return n.inputs


def _pair(t, name):
    """Operands of the commutative ``name`` op at ``t``, both orders."""
    a, b = _op(t, ew.Binary, name)
    return [(a, b), (b, a)]


def _activation(t):
    """``(code, x)`` for ``t = act(x)``."""
    n = t.node
    _need(n is not None and type(n.op) is ew.Unary and n.op.name in _ACTS)
    return _ACTS[n.op.name], n.inputs[0]


class _Body(object):
    def __init__(self, seq_in, state_in, inv_in):
        self.seq, self.state, self.inv = seq_in, state_in, inv_in
        self.n_seq, self.n_state = len(seq_in), len(state_in)
        self.consts = {}

    def invariant(self, t, role, roles):
        """Record invariant ``t`` (a Scan input, or a Constant the trace kept
        in the body) under ``role``."""
        if type(t) is Constant:
            self.consts[role] = t.value
        else:
            roles[role] = self.pos(t, "inv")

    def pos(self, t, group):
        """Input position of placeholder ``t`` in the Scan's inputs."""
        lst = {"seq": self.seq, "state": self.state, "inv": self.inv}[group]
        _need(any(t is x for x in lst))
        i = next(i for i, x in enumerate(lst) if x is t)
        return i + {"seq": 0, "state": self.n_seq, "inv": self.n_seq + self.n_state}[group]

    def projection(self, z, h_prev, width):
        """Roles of ``z = zx_t + (h_prev [* rmask]) @ R``."""
        for a, d in _pair(z, "add"):
            try:
                roles = {"zx": self.pos(a, "seq")}
                _need(a.shape[-1] == width)
                self.recurrent_product(d, h_prev, width, "R", roles)
                return roles
            except _NoMatch:
                continue
        raise _NoMatch()

    def recurrent_product(self, d, h_prev, width, role, roles):
        """Record ``d = (h_prev [* rmask]) @ R`` (R: (u, width)) in ``roles``;
        returns the left operand ``hm``."""
        hm, R = _op(d, TensorDot)
        _need(d.node.op.ax == (1,) and d.node.op.ay == (0,))
        self.invariant(R, role, roles)
        _need(R.ndim == 2 and R.shape[1] == width)
        if hm is not h_prev:
            for h, m in _pair(hm, "multiply"):
                if h is h_prev and (type(m) is Constant or any(m is x for x in self.inv)) \
                        and m.ndim == 2 and m.shape[-1] == h_prev.shape[-1]:
                    _need("rmask" not in roles or roles.get("rmask") == self._where(m))
                    self.invariant(m, "rmask", roles)
                    break
            else:
                raise _NoMatch()
        return hm

    def _where(self, t):
        return None if type(t) is Constant else self.pos(t, "inv")

    def masked(self, new_states, outputs):
        """Strip ``where(mask_t, new, old)`` from every state: ``(news, mask
        position)``; the mask position is None when there is no mask."""
        news, mask = [], None
        for k, s in enumerate(new_states):
            n = s.node
            if n is None or type(n.op) is not ew.Where:
                return None
            keep, new, old = n.inputs
            _need(old is self.state[k])
            m = _op(keep, ExpandTo)[0]
            _need(keep.node.op.pattern == (("old", 0), ("new",)) and m.dtype == "bool")
            p = self.pos(m, "seq")
            _need(mask is None or mask == p)
            mask = p
            news.append(new)
        _need(outputs[0] is new_states[-1])
        return news, mask


def _slice_gate(t, z, k, u, n=4):
    """``t`` is ``z[:, k*u:(k+1)*u]`` (z: n*u columns)."""
    (src,) = _op(t, GetItem)
    _need(src is z)
    spec = t.node.op.spec
    _need(len(spec) == 2 and spec[0] == ("slice", None, None, None))
    kind, start, stop, step = spec[1]
    _need(kind == "slice" and step in (None, 1))
    _need((start or 0) == k * u and (stop if stop is not None else n * u) == (k + 1) * u)


def _is_one_minus(t, x):
    """Whether ``t = 1 - x``."""
    n = t.node
    if n is None or type(n.op) is not ew.Binary or n.op.name != "subtract":
        return False
    one, y = n.inputs
    return y is x and type(one) is Constant and np.ndim(one.value) == 0 and one.value == 1




def _lstm(body, outputs, new_states):
    n_st = len(new_states)
    _need(n_st in (2, 3) and len(outputs) == 1)
    mask = None
    if n_st == 3:
        stripped = body.masked(new_states, outputs)
        _need(stripped is not None)
        (H, C, Hy), mask = stripped
        _need(Hy is H)
    else:
        H, C = new_states
        _need(outputs[0] is H)
    h_prev, c_prev = body.state[0], body.state[1]
    u = h_prev.shape[-1]
    _need(u is not None and h_prev.ndim == 2 and c_prev.shape == h_prev.shape)
    for o, tc in _pair(H, "multiply"):
        try:
            act, c_new = _activation(tc)
            _need(c_new is C)
            ract, zo = _activation(o)
            break
        except _NoMatch:
            continue
    else:
        raise _NoMatch()
    z = zo.node.inputs[0] if zo.node is not None else None
    _need(z is not None)
    _slice_gate(zo, z, 3, u)
    for fc, ig in _pair(C, "add"):
        try:
            f = next(f for f, c in _pair(fc, "multiply") if c is c_prev)
            i, g = next((i, g) for i, g in _pair(ig, "multiply")
                        if g.node is not None and type(g.node.op) is ew.Unary
                        and g.node.op.name in _ACTS and _ACTS[g.node.op.name] == act
                        and i.node is not None and type(i.node.op) is ew.Unary
                        and i.node.op.name in _ACTS and _ACTS[i.node.op.name] == ract)
            break
        except (_NoMatch, StopIteration):
            continue
    else:
        raise _NoMatch()
    for gate, k, code in ((i, 0, ract), (f, 1, ract), (g, 2, act)):
        a, zk = _activation(gate)
        _need(a == code)
        _slice_gate(zk, z, k, u)
    roles = body.projection(z, h_prev, 4 * u)
    roles["h0"], roles["c0"] = body.pos(h_prev, "state"), body.pos(c_prev, "state")
    states = ("h", "c")
    if mask is not None:
        roles["mask"], roles["y0"] = mask, body.pos(body.state[2], "state")
        states = ("h", "c", "y")
    return "lstm", roles, states, act, ract, ()


def _seq_plus(body, t):
    """``(x position, y)`` for ``t = x_t + y``, x_t a sequence slice."""
    for x, y in _pair(t, "add"):
        try:
            return body.pos(x, "seq"), y
        except _NoMatch:
            continue
    raise _NoMatch()


def _mix(H):
    """``(z, hx, hh)`` for ``H = z * hx + (1 - z) * hh``."""
    for keep, new in _pair(H, "add"):
        try:
            pairs = [(zz, hx, hh) for oz, hh in _pair(new, "multiply")
                     for zz, hx in _pair(keep, "multiply") if _is_one_minus(oz, zz)]
        except _NoMatch:
            continue
        if pairs:
            return pairs[0]
    raise _NoMatch()


def _gru(body, outputs, new_states):
    n_st = len(new_states)
    _need(n_st in (1, 2) and len(outputs) == 1)
    mask = None
    if n_st == 2:
        stripped = body.masked(new_states, outputs)
        _need(stripped is not None)
        (H, Hy), mask = stripped
        _need(Hy is H)
    else:
        (H,) = new_states
        _need(outputs[0] is H)
    h_prev = body.state[0]
    u = h_prev.shape[-1]
    _need(u is not None and h_prev.ndim == 2)
    z, hx, hh = _mix(H)
    ract, zpre = _activation(z)
    act, hpre = _activation(hh)
    roles = {}
    # z = ract(xz + P[:, :u]), r = ract(xr + P[:, u:2u]); P = hm @ R (+ rb)
    roles["xz"], pz = _seq_plus(body, zpre)
    (P,) = _op(pz, GetItem)
    reset_after = P.shape[-1] == 3 * u
    n = 3 if reset_after else 2
    _slice_gate(pz, P, 0, u, n)
    roles["xh"], ph = _seq_plus(body, hpre)
    if reset_after:
        # hh = act(xh + r * P[:, 2u:])
        r, pr = next(((r, p) for r, p in _pair(ph, "multiply") if p.node is not None
                      and type(p.node.op) is GetItem), (None, None))
        _need(r is not None)
        _slice_gate(pr, P, 2, u, n)
        prod = P
        if type(P.node.op) is ew.Binary:
            for d, rb in _pair(P, "add"):
                if d.node is not None and type(d.node.op) is TensorDot and rb.ndim == 1 \
                        and (type(rb) is Constant or any(rb is x for x in body.inv)):
                    body.invariant(rb, "rb", roles)
                    prod = d
                    break
            else:
                raise _NoMatch()
        hm = body.recurrent_product(prod, h_prev, 3 * u, "R", roles)
    else:
        # hh = act(xh + (r * hm) @ Rh)
        hm = body.recurrent_product(P, h_prev, 2 * u, "R", roles)
        (q, Rh) = _op(ph, TensorDot)
        _need(ph.node.op.ax == (1,) and ph.node.op.ay == (0,))
        body.invariant(Rh, "Rh", roles)
        _need(Rh.ndim == 2 and Rh.shape == (u, u))
        r = next((r for r, m in _pair(q, "multiply") if m is hm), None)
        _need(r is not None)
    a, rpre = _activation(r)
    _need(a == ract)
    roles["xr"], pr2 = _seq_plus(body, rpre)
    _slice_gate(pr2, P, 1, u, n)
    _need(hx is h_prev or hx is hm)
    flags = ("reset_after",) if reset_after else ()
    if hx is hm and hm is not h_prev:
        flags += ("mix_masked",)
    for role in ("xz", "xr", "xh"):
        _need(body.seq[roles[role]].shape[-1] == u)
    roles["h0"] = body.pos(h_prev, "state")
    states = ("h",)
    if mask is not None:
        roles["mask"], roles["y0"] = mask, body.pos(body.state[1], "state")
        states = ("h", "y")
    return "gru", roles, states, act, ract, flags


def _simple(body, outputs, new_states):
    n_st = len(new_states)
    _need(n_st in (1, 2) and len(outputs) == 1)
    mask = None
    if n_st == 2:
        stripped = body.masked(new_states, outputs)
        _need(stripped is not None)
        (H, Hy), mask = stripped
        _need(Hy is H)
    else:
        (H,) = new_states
        _need(outputs[0] is H)
    h_prev = body.state[0]
    u = h_prev.shape[-1]
    _need(u is not None and h_prev.ndim == 2)
    act, z = _activation(H)
    roles = body.projection(z, h_prev, u)
    roles["h0"] = body.pos(h_prev, "state")
    states = ("h",)
    if mask is not None:
        roles["mask"], roles["y0"] = mask, body.pos(body.state[1], "state")
        states = ("h", "y")
    return "simple", roles, states, act, 0, ()


def fuse_cell(seq_in, state_in, inv_in, outputs, new_states, name):
    """A ``FusedRecurrent`` op computing this Scan body, or None."""
    from cyback.ops.rnn_cell import FusedRecurrent
    if not ENABLED or not state_in:
        return None
    dt = state_in[0].dtype
    if dt not in ("float32", "float64") or any(s.dtype != dt for s in state_in) or \
            any(t.dtype != dt for t in list(outputs) + list(new_states)):
        return None
    for matcher in (_lstm, _gru, _simple):
        body = _Body(seq_in, state_in, inv_in)
        try:
            cell, roles, states, act, ract, flags = matcher(body, outputs, new_states)
        except _NoMatch:
            continue
        ins = seq_in + state_in + inv_in
        operands = [ins[roles[r]] for r in ("zx", "xz", "xr", "xh") if r in roles]
        operands += [ins[roles[r]] if r in roles else body.consts[r]
                     for r in ("R", "Rh", "rb") if r in roles or r in body.consts]
        if any(t.dtype != dt for t in operands):
            return None
        return FusedRecurrent(cell, roles, states, act, ract, len(ins), name, body.consts,
                              flags)
    return None
