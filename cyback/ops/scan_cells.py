"""Recognise standard recurrent cells in a Scan's loop body.

After ``build_scan`` has hoisted the input projection, the body of Keras's
LSTMCell (implementation 2) and SimpleRNNCell steps is a small graph: the
recurrent product ``(h * rmask) @ R`` added to the projection, sliced gates,
their non-linearities and the state update; under a Keras mask, ``rnn`` wraps
each new state in ``where(mask_t, new, old)`` and carries the previous output
as one more state. ``fuse_cell`` matches exactly these graphs and returns a
``FusedRecurrent`` op taking the Scan's inputs, or None: anything else (other
cells, other activations, extra terms, a zero output for masked steps) keeps
the general Scan.
"""
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
                hm, R = _op(d, TensorDot)
                _need(d.node.op.ax == (1,) and d.node.op.ay == (0,))
                self.invariant(R, "R", roles)
                _need(R.ndim == 2 and R.shape[1] == width and a.shape[-1] == width)
                if hm is not h_prev:
                    for h, m in _pair(hm, "multiply"):
                        if h is h_prev and (type(m) is Constant or any(m is x for x in self.inv)) \
                                and m.ndim == 2 and m.shape[-1] == h_prev.shape[-1]:
                            self.invariant(m, "rmask", roles)
                            break
                    else:
                        raise _NoMatch()
                return roles
            except _NoMatch:
                continue
        raise _NoMatch()

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


def _slice_gate(t, z, k, u):
    """``t`` is ``z[:, k*u:(k+1)*u]``."""
    (src,) = _op(t, GetItem)
    _need(src is z)
    spec = t.node.op.spec
    _need(len(spec) == 2 and spec[0] == ("slice", None, None, None))
    kind, start, stop, step = spec[1]
    _need(kind == "slice" and step in (None, 1))
    _need((start or 0) == k * u and (stop if stop is not None else 4 * u) == (k + 1) * u)


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
    return "lstm", roles, states, act, ract


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
    return "simple", roles, states, act, 0


def fuse_cell(seq_in, state_in, inv_in, outputs, new_states, name):
    """A ``FusedRecurrent`` op computing this Scan body, or None."""
    from cyback.ops.rnn_cell import FusedRecurrent
    if not ENABLED or not state_in:
        return None
    dt = state_in[0].dtype
    if dt not in ("float32", "float64") or any(s.dtype != dt for s in state_in) or \
            any(t.dtype != dt for t in list(outputs) + list(new_states)):
        return None
    body = _Body(seq_in, state_in, inv_in)
    for matcher in (_lstm, _simple):
        try:
            cell, roles, states, act, ract = matcher(body, outputs, new_states)
        except _NoMatch:
            continue
        ins = seq_in + state_in + inv_in
        R = ins[roles["R"]] if "R" in roles else body.consts["R"]
        if ins[roles["zx"]].dtype != dt or R.dtype != dt:
            return None
        return FusedRecurrent(cell, roles, states, act, ract, len(ins), name, body.consts)
    return None
