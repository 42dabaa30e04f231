"""Compiling grows linearly with the graph, in every pass.

Work is counted, not timed: a trace function counts the Python lines run in
cyback's own files, each charged to the pass running it (gradients, fold and
CSE, the walk for the needed steps, local rewrites, the rest of the
optimizer, fusion, frozen weights, the planner and code generator, and the
graph walks they share), for a graph at n and at 2n. A pass whose count more
than about doubles (ratio 2.5 allowed for fixed costs) does work that grows
faster than the graph: on the unrolled RNN below, a fusion that walked a
chain too long for its registers again from each of its roots is caught.
Work done inside one C call (a list scan written as ``x in list``) is not
seen this way; the passes key their lookups by tensor id instead.
"""
import functools
import gc
import os
import sys
import threading

import numpy as np
import pytest

import cyback as K
from cyback.graph import collector, fusion, optimize
from cyback.graph import function as function_mod
from cyback.ops import gradients as gradients_mod

_PACKAGE = os.path.dirname(os.path.abspath(K.__file__)) + os.sep

# (module, attribute, pass): work done while the attribute's function runs is
# charged to the pass, the innermost one when they nest
_PASSES = [
    (gradients_mod, "gradients_with_seeds", "gradients"),
    (function_mod, "_rewrite", "fold and CSE"),
    (function_mod, "rewritten_steps", "needed steps"),
    (optimize, "_local_rewrites", "local rewrites"),
    (optimize, "optimize", "optimizer"),
    (fusion, "fuse", "fusion"),
    (function_mod, "_freeze", "frozen weights"),
    (function_mod, "_build_plan", "planner"),
    (function_mod, "leaves_of", "leaves"),
    (function_mod, "topo_nodes", "graph walk"),
]
_MAX_RATIO = 2.5


class _WorkCounter(object):
    """Lines run in cyback's files, by pass."""

    def __init__(self):
        self.counts = {}
        self.current = ["graph building"]

    def _count_lines(self, frame, event, arg):
        if event == "line":
            name = self.current[0]
            self.counts[name] = self.counts.get(name, 0) + 1
        return self._count_lines

    def _trace(self, frame, event, arg):
        if frame.f_code.co_filename.startswith(_PACKAGE):
            return self._count_lines
        return None

    def charged_to(self, name, f):
        current = self.current

        @functools.wraps(f)
        def run(*args, **kwargs):
            outer = current[0]
            current[0] = name
            try:
                return f(*args, **kwargs)
            finally:
                current[0] = outer
        return run

    def run(self, build):
        previous = sys.gettrace()
        sys.settrace(self._trace)
        try:
            build(self)
        finally:
            sys.settrace(previous)
        return self.counts


@pytest.fixture
def count_work(monkeypatch):
    """``count_work(build, n)``: lines run by pass while ``build(n, counter)``
    builds and compiles a graph."""
    def count(build, n):
        counter = _WorkCounter()
        with monkeypatch.context() as patch:
            for module, attr, name in _PASSES:
                patch.setattr(module, attr, counter.charged_to(name, getattr(module, attr)))
            return counter.run(lambda c: build(n, c))
    return count


def _compile(counter, *args, **kwargs):
    counter.current[0] = "function"
    try:
        return K.function(*args, **kwargs)
    finally:
        counter.current[0] = "graph building"


def _assert_linear(small, large, passes):
    assert set(passes) <= set(small), "passes that did no work: %s" % sorted(
        set(passes) - set(small))
    ratios = {name: large[name] / float(small[name]) for name in small}
    slow = {name: "%d -> %d lines (x%.2f)" % (small[name], large[name], r)
            for name, r in ratios.items() if r > _MAX_RATIO}
    assert not slow, "work grows faster than the graph: %s" % slow


def _lstm(n, counter, units=4, features=3, batch=2):
    """An LSTM-like step unrolled over n steps with gradients, compiled for
    inference and for training."""
    # rnn looks for the learning phase among its leaves once the phase
    # exists: have it exist for both sizes alike
    K.learning_phase()
    rs = np.random.RandomState(0)
    x = K.placeholder((batch, n, features))
    W = K.variable(rs.randn(features, 4 * units).astype("float32") * 0.1)
    U = K.variable(rs.randn(units, 4 * units).astype("float32") * 0.1)
    b = K.variable(np.zeros(4 * units, "float32"))

    def step(x_t, states):
        h, c = states
        z = K.dot(x_t, W) + K.dot(h, U) + b
        i = K.sigmoid(z[:, :units])
        f = K.sigmoid(z[:, units:2 * units])
        g = K.tanh(z[:, 2 * units:3 * units])
        o = K.sigmoid(z[:, 3 * units:])
        c = f * c + i * g
        h = o * K.tanh(c)
        return h, [h, c]

    zeros = K.zeros((batch, units))
    last, _, _ = K.rnn(step, x, [zeros, zeros], unroll=True)
    loss = K.mean(K.square(last))
    grads = K.gradients(loss, [W, U, b])
    _compile(counter, [x], [loss] + grads)
    _compile(counter, [x], [loss], updates=[K.update_sub(w, 0.01 * g)
                                            for w, g in zip([W, U, b], grads)])


def _dense_stack(n, counter):
    """n Dense + BatchNorm + relu layers: at inference, BatchNorm folds into
    the weights (local rewrites) and the folded weights are frozen; with an
    L2 penalty summing every weight and its gradients for training."""
    rs = np.random.RandomState(1)
    x = K.placeholder((None, 5))
    h, weights = x, []
    for _ in range(n):
        W = K.variable(rs.randn(5, 5) * 0.3)
        b = K.variable(np.zeros(5))
        gamma, beta = K.variable(np.ones(5)), K.variable(np.zeros(5))
        mean, var = K.variable(np.zeros(5)), K.variable(np.ones(5))
        h = K.bias_add(K.dot(h, W), b)
        h = K.relu(K.batch_normalization(h, mean, var, beta, gamma, epsilon=1e-3))
        weights += [W, b, gamma, beta]
    penalty = weights[0] * 0.0
    for w in weights[::4]:
        penalty = penalty + K.sum(K.square(w))
    loss = K.mean(K.square(h)) + 1e-4 * K.sum(penalty)
    grads = K.gradients(loss, weights)
    _compile(counter, [x], [h, loss])
    _compile(counter, [x], [loss], updates=[K.update_sub(w, 0.01 * g)
                                            for w, g in zip(weights, grads)])


def test_unrolled_rnn_with_gradients_compiles_in_linear_work(count_work):
    # past about 60 steps a chain of the gradient has more operands than a
    # program's registers, which is where fusion's quadratic walk showed
    small, large = count_work(_lstm, 70), count_work(_lstm, 140)
    _assert_linear(small, large, ["gradients", "fold and CSE", "needed steps", "local rewrites",
                                  "optimizer", "fusion", "frozen weights", "planner",
                                  "graph walk", "leaves", "graph building"])


def test_dense_stack_with_batchnorm_compiles_in_linear_work(count_work):
    small, large = count_work(_dense_stack, 40), count_work(_dense_stack, 80)
    _assert_linear(small, large, ["gradients", "fold and CSE", "local rewrites", "fusion",
                                  "frozen weights", "planner"])


# ------------------------------------------------------------ fusion groups

def test_a_chain_longer_than_the_registers_fuses_its_first_links_with_the_same_values():
    # Each link multiplies by its own array, so a group's operands grow with
    # its length. Roots are tried from the last step: the groups of the
    # later links have too many operands and are passed over (without
    # walking the chain again), and the first links, which fit, make one
    # fused step; the rest run one by one.
    n = 150
    rs = np.random.RandomState(2)
    x = K.placeholder((3, 4))
    vs = [K.variable(rs.uniform(0.5, 1.5, (3, 4)).astype("float32")) for _ in range(n)]
    y = x
    for v in vs:
        y = y * v + 0.25
    # an update makes it a training plan: exact opcodes, no frozen weights
    f = K.function([x], [y], updates=[K.update(vs[0], vs[0])])
    ops = f.plan_ops(0)
    fused = [op for op in ops if isinstance(op, fusion.Fused)]
    assert len(fused) == 1
    links = len(fused[0].members) // 2
    assert 40 <= links < n
    assert [type(op).__name__ for op in ops].count("Binary") == 2 * (n - links)
    xv = rs.randn(3, 4).astype("float32")
    want = xv
    for v in vs:
        want = want * K.get_value(v) + np.float32(0.25)
    np.testing.assert_array_equal(f([xv])[0], want)


# ------------------------------------------------------- the cycle collector

@pytest.fixture
def collector_state():
    enabled = gc.isenabled()
    yield
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_off_while_a_plan_compiles_and_on_after(collector_state):
    gc.enable()
    seen = []
    real = function_mod._build_plan

    def build(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    x = K.placeholder((2,))
    function_mod._build_plan = build
    try:
        K.function([x], [x * 2.0])
    finally:
        function_mod._build_plan = real
    assert seen == [False] and gc.isenabled()


def test_a_collector_switched_off_stays_off(collector_state):
    gc.disable()
    x = K.placeholder((2,))
    K.gradients(K.sum(x * x), [x])
    K.function([x], [x + 1.0])
    assert not gc.isenabled()


def test_nested_and_concurrent_pauses_restore_the_collector_once(collector_state):
    gc.enable()
    inside, release = threading.Event(), threading.Event()
    states = []

    def other():
        with collector.paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with collector.paused():
        t.start()
        assert inside.wait(10)
        with collector.paused():
            states.append(gc.isenabled())
        states.append(gc.isenabled())
    states.append(gc.isenabled())      # the other thread still compiles
    release.set()
    t.join(10)
    assert states == [False, False, False] and gc.isenabled()


def test_an_error_inside_a_pause_restores_the_collector(collector_state):
    gc.enable()
    with pytest.raises(ZeroDivisionError):
        with collector.paused():
            1 / 0
    assert gc.isenabled()
