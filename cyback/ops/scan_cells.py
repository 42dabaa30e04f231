"""Recognise standard recurrent cells in a Scan's loop body.

After ``build_scan`` has hoisted the input projection, the body of Keras's
LSTMCell, GRUCell and SimpleRNNCell steps is a small graph: each gate's
pre-activation is its input projection plus a recurrent product of
``hm = h * rmask`` (rmask: the recurrent dropout mask, if any), then the gate
non-linearities and the state update (the GRU with its reset gate before or
after its candidate's product, ``reset_after``). Implementation 2 (Keras
2.3's default) slices the gates out of one product ``hm @ R``; implementation
1 (Keras 2.2's default) has one product per gate, whose kernels the fused op
concatenates. Under a Keras mask, ``rnn`` wraps each new state in
``where(mask_t, new, old)`` and carries the previous output as one more
state. ``fuse_cell`` matches exactly these graphs and returns a
``FusedRecurrent`` op taking the Scan's inputs, or None: anything else (other
cells or activations, extra terms, per-gate dropout masks, a zero output for
masked steps) keeps the general Scan.

Roles (see ``FusedRecurrent``) name the inputs the op reads; a role split
over the gates is named per gate, ``"zx.0"``, ``"R.1"``, ...
"""
import numpy as np

from cyback.graph.tensor import Constant
from cyback.ops import elementwise as ew
from cyback.ops.linalg import TensorDot
from cyback.ops.rnn_cell import FusedRecurrent
from cyback.ops.shape import ExpandTo, GetItem

#: set to False to keep every loop on the general Scan (tests compare both)
ENABLED = True

_ACTS = {"tanh": 0, "sigmoid": 1}
_HARD_SIGMOID = 2


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


def _scalar(t, value):
    return type(t) is Constant and np.ndim(t.value) == 0 and \
        bool(np.isclose(float(t.value), value, rtol=1e-6, atol=0))


def _activation(t):
    """``(code, x)`` for ``t = act(x)``: tanh, sigmoid, or hard_sigmoid as
    cyback builds it, ``clip(x * 0.2 + 0.5, 0, 1)``."""
    n = t.node
    _need(n is not None)
    if type(n.op) is ew.Unary and n.op.name in _ACTS:
        return _ACTS[n.op.name], n.inputs[0]
    y, lo, hi = _op(t, ew.Clip)
    _need(_scalar(lo, 0) and _scalar(hi, 1))
    for ax, half in _pair(y, "add"):
        if _scalar(half, 0.5):
            for x, fifth in _pair(ax, "multiply"):
                if _scalar(fifth, 0.2):
                    return _HARD_SIGMOID, x
    raise _NoMatch()


def _is_act(t, code):
    try:
        return _activation(t)[0] == code
    except _NoMatch:
        return False


def _is_one_minus(t, x):
    """Whether ``t = 1 - x``."""
    n = t.node
    if n is None or type(n.op) is not ew.Binary or n.op.name != "subtract":
        return False
    one, y = n.inputs
    return y is x and _scalar(one, 1)


def _slice_gate(t, z, k, u, n):
    """``t`` is ``z[:, k*u:(k+1)*u]`` (z: n*u columns)."""
    (src,) = _op(t, GetItem)
    _need(src is z)
    spec = t.node.op.spec
    _need(len(spec) == 2 and spec[0] == ("slice", None, None, None))
    kind, start, stop, step = spec[1]
    _need(kind == "slice" and step in (None, 1))
    _need((start or 0) == k * u and (stop if stop is not None else n * u) == (k + 1) * u)


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

    def is_invariant(self, t):
        return type(t) is Constant or any(t is x for x in self.inv)

    def pos(self, t, group):
        """Input position of placeholder ``t`` in the Scan's inputs."""
        lst = {"seq": self.seq, "state": self.state, "inv": self.inv}[group]
        _need(any(t is x for x in lst))
        i = next(i for i, x in enumerate(lst) if x is t)
        return i + {"seq": 0, "state": self.n_seq, "inv": self.n_seq + self.n_state}[group]

    def seq_plus(self, t):
        """``(x position, y)`` for ``t = x_t + y``, x_t a sequence slice."""
        for x, y in _pair(t, "add"):
            if any(x is s for s in self.seq):
                return self.pos(x, "seq"), y
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

    def new_states(self, outputs, new_states, n_states):
        """The cell's new states and the Keras mask's position (or None):
        ``n_states`` states, plus the carried output under a mask."""
        _need(len(outputs) == 1)
        if len(new_states) == n_states + 1:
            stripped = self.masked(new_states, outputs)
            _need(stripped is not None)
            news, mask = stripped
            _need(news[-1] is news[0])
            return news[:n_states], mask
        _need(len(new_states) == n_states and outputs[0] is new_states[0])
        return list(new_states), None

    def state_roles(self, roles, names, mask):
        """Record the initial states (and the mask); returns the state roles."""
        for k, name in enumerate(names):
            roles[name + "0"] = self.pos(self.state[k], "state")
        if mask is None:
            return tuple(names)
        roles["mask"], roles["y0"] = mask, self.pos(self.state[len(names)], "state")
        return tuple(names) + ("y",)


class _Gates(object):
    """The gate pre-activations of one cell, ``x_k + (hm @ R)_k [+ rb_k]``:
    slices of one projection sequence and of one product ``hm @ R``
    (implementation 2), or one sequence and one product per gate
    (implementation 1), all of the same ``hm = h_prev [* rmask]``.

    ``n`` gates of width ``u`` take part in the product (the GRU's candidate
    without ``reset_after`` has its own, ``Rh``); ``bias``: whether a
    recurrent bias may be added to the product (the GRU with ``reset_after``;
    per gate, the scan has moved it into the projection where it could).
    """

    def __init__(self, body, h_prev, n, roles, bias=False):
        self.body, self.h_prev, self.n, self.roles = body, h_prev, n, roles
        self.u = h_prev.shape[-1]
        self.bias_ok = bias
        self.whole = None       # the shared pre-activation z = zx + hm @ R
        self.product = None     # the shared product (+ rb), sliced per gate
        self.split = None       # True: one product per gate
        self.hm = None

    def pre(self, t, k):
        """Record ``t`` as gate k's pre-activation."""
        u, n = self.u, self.n
        if t.node is not None and type(t.node.op) is GetItem:
            (z,) = t.node.inputs
            _slice_gate(t, z, k, u, n)
            if self.whole is None:
                x, d = self.body.seq_plus(z)
                _need(self.body.seq[x].shape[-1] == n * u)
                self.roles["zx"] = x
                self._product(d, n * u, "R", "rb")
                self.split = False
                self.whole = z
            _need(z is self.whole)
            return
        x, d = self.body.seq_plus(t)
        _need(self.whole is None and self.body.seq[x].shape[-1] == u)
        self.roles["zx.%d" % k] = x
        self.term(d, k)

    def term(self, t, k):
        """Record ``t`` as gate k's recurrent term."""
        if t.node is not None and type(t.node.op) is GetItem:
            _need(self.split is not True)
            self.split = False
            (P,) = t.node.inputs
            _slice_gate(t, P, k, self.u, self.n)
            if self.product is None:
                self._product(P, self.n * self.u, "R", "rb")
                self.product = P
            _need(P is self.product)
        else:
            _need(self.split is not False)
            self.split = True
            self._product(t, self.u, "R.%d" % k, "rb.%d" % k)

    def _product(self, t, width, r_role, b_role):
        """``t = hm @ R [+ rb]`` (R: (u, width)); records R, rb and hm."""
        _need(t.node is not None)
        bias = type(t.node.op) is ew.Binary
        if bias:
            for d, rb in _pair(t, "add"):
                if d.node is not None and type(d.node.op) is TensorDot and rb.ndim == 1 \
                        and rb.shape[0] == width and self.body.is_invariant(rb):
                    self.body.invariant(rb, b_role, self.roles)
                    t = d
                    break
            else:
                raise _NoMatch()
        _need(self.bias_ok or not bias)
        hm, R = _op(t, TensorDot)
        _need(t.node.op.ax == (1,) and t.node.op.ay == (0,))
        self.body.invariant(R, r_role, self.roles)
        _need(R.ndim == 2 and R.shape == (self.u, width))
        if self.hm is None:
            self._recurrent_input(hm)
        _need(hm is self.hm)

    def _recurrent_input(self, hm):
        """``hm`` is h_prev or ``h_prev * rmask`` (an invariant mask)."""
        h_prev = self.h_prev
        if hm is not h_prev:
            for h, m in _pair(hm, "multiply"):
                if h is h_prev and self.body.is_invariant(m) and m.ndim == 2 \
                        and m.shape[-1] == h_prev.shape[-1]:
                    self.body.invariant(m, "rmask", self.roles)
                    break
            else:
                raise _NoMatch()
        self.hm = hm


def _lstm(body, outputs, new_states):
    (H, C), mask = body.new_states(outputs, new_states, 2)
    h_prev, c_prev = body.state[0], body.state[1]
    u = h_prev.shape[-1]
    _need(u is not None and h_prev.ndim == 2 and c_prev.shape == h_prev.shape)
    # H = o * act(C), C = f * c_prev + i * g
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
    for fc, ig in _pair(C, "add"):
        try:
            f = next(f for f, c in _pair(fc, "multiply") if c is c_prev)
            i, g = next((i, g) for i, g in _pair(ig, "multiply")
                        if _is_act(g, act) and _is_act(i, ract))
            break
        except (_NoMatch, StopIteration):
            continue
    else:
        raise _NoMatch()
    roles = {}
    gates = _Gates(body, h_prev, 4, roles)
    for gate, k, code in ((i, 0, ract), (f, 1, ract), (g, 2, act), (o, 3, ract)):
        a, pre = _activation(gate)
        _need(a == code)
        gates.pre(pre, k)
    states = body.state_roles(roles, ("h", "c"), mask)
    return "lstm", roles, states, act, ract, ()


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
    (H,), mask = body.new_states(outputs, new_states, 1)
    h_prev = body.state[0]
    u = h_prev.shape[-1]
    _need(u is not None and h_prev.ndim == 2)
    z, hx, hh = _mix(H)
    ract, zpre = _activation(z)
    act, hpre = _activation(hh)
    roles = {}
    x_h, cand = body.seq_plus(hpre)
    _need(body.seq[x_h].shape[-1] == u)
    roles["zx.2"] = x_h
    # reset_after: hh = act(xh + r * (hm @ R + rb)_h); before: act(xh + (r * hm) @ Rh)
    reset_after = cand.node is not None and type(cand.node.op) is ew.Binary
    gates = _Gates(body, h_prev, 3 if reset_after else 2, roles, bias=reset_after)
    gates.pre(zpre, 0)
    _need(gates.whole is None)
    if reset_after:
        r, rec_h = next(((r, p) for r, p in _pair(cand, "multiply") if _is_act(r, ract)),
                        (None, None))
        _need(r is not None)
        a, rpre = _activation(r)
        gates.pre(rpre, 1)
        gates.term(rec_h, 2)
    else:
        q, Rh = _op(cand, TensorDot)
        _need(cand.node.op.ax == (1,) and cand.node.op.ay == (0,))
        body.invariant(Rh, "Rh", roles)
        _need(Rh.ndim == 2 and Rh.shape == (u, u))
        r = next((r for r, m in _pair(q, "multiply") if _is_act(r, ract)), None)
        _need(r is not None)
        a, rpre = _activation(r)
        gates.pre(rpre, 1)
        _need(any(m is gates.hm for rr, m in _pair(q, "multiply") if rr is r))
    _need(hx is h_prev or hx is gates.hm)
    flags = ("reset_after",) if reset_after else ()
    if hx is gates.hm and hx is not h_prev:
        # Keras (implementation 2) mixes the dropped-out h into the new state.
        flags += ("mix_masked",)
    states = body.state_roles(roles, ("h",), mask)
    return "gru", roles, states, act, ract, flags


def _simple(body, outputs, new_states):
    (H,), mask = body.new_states(outputs, new_states, 1)
    h_prev = body.state[0]
    _need(h_prev.shape[-1] is not None and h_prev.ndim == 2)
    act, z = _activation(H)
    roles = {}
    _Gates(body, h_prev, 1, roles).pre(z, 0)
    for name in ("zx", "R"):
        if name + ".0" in roles:
            roles[name] = roles.pop(name + ".0")
    if "R.0" in body.consts:
        body.consts["R"] = body.consts.pop("R.0")
    states = body.state_roles(roles, ("h",), mask)
    return "simple", roles, states, act, 0, ()


def fuse_cell(seq_in, state_in, inv_in, outputs, new_states, name):
    """A ``FusedRecurrent`` op computing this Scan body, or None."""
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
        operands = [ins[p] for r, p in roles.items() if r.split(".")[0] in ("zx", "R", "Rh", "rb")]
        operands += [v for r, v in body.consts.items() if r != "rmask"]
        if any(np.dtype(t.dtype) != np.dtype(dt) for t in operands):
            return None
        return FusedRecurrent(cell, roles, states, act, ract, len(ins), name, body.consts,
                              flags)
    return None
