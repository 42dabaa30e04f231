"""graph/concurrent.py: independent steps whose ops run side by side (a
bidirectional RNN's directions) as one Concurrent step of an inference plan."""
import gc
import os
import threading

import numpy as np
import pytest

import cyback as K
from cyback.graph import concurrent
from cyback.graph.op import Op
from cyback.kernels import runtime


class Side(Op):
    """A stand-in for a recurrent layer: x * factor, recording the thread and
    the thread count it ran with."""

    api = "side"
    runs_side_by_side = True
    seen = []

    def __init__(self, factor, fail=False):
        self.factor = factor
        self.fail = fail

    def infer(self, x):
        return [(x.shape, x.dtype)]

    def compute(self, x):
        Side.seen.append((self.factor, threading.get_ident(), runtime.get_max_threads()))
        if self.fail:
            raise ValueError("side: failed on purpose")
        return (x * self.factor,)


@pytest.fixture(autouse=True)
def _threads():
    before = runtime.get_max_threads()
    Side.seen = []
    yield
    runtime.set_num_threads(before)
    runtime.set_thread_local_threads(None)


def _concurrent_steps(f):
    return [op for op in f.plan_ops() if isinstance(op, concurrent.Concurrent)]


def test_independent_steps_run_side_by_side_with_half_the_team():
    runtime.set_num_threads(4)
    x = K.placeholder((None, 3))
    a = Side(2.0)(x)
    b = Side(3.0)(K.exp(x))
    y = K.concatenate([a + 1, b])
    f = K.function([x], [y])
    v = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_allclose(f([v])[0], np.concatenate([v * 2 + 1, np.exp(v) * 3], 1),
                               rtol=1e-6)
    (op,) = _concurrent_steps(f)
    assert op.describe() == "side | side"
    runs = {factor: (thread, threads) for factor, thread, threads in Side.seen}
    assert runs[2.0][0] != runs[3.0][0]                  # two threads
    assert runs[2.0][1] == runs[3.0][1] == 2             # half the team each
    assert runtime.get_max_threads() == 4                # the caller's count is back
    assert runtime.get_thread_local_threads() is None


def test_a_team_of_one_runs_them_in_turn():
    runtime.set_num_threads(1)
    x = K.placeholder((None, 3))
    f = K.function([x], [Side(2.0)(x) + Side(5.0)(x)])
    v = np.ones((2, 3), "float32")
    np.testing.assert_allclose(f([v])[0], v * 7)
    assert _concurrent_steps(f)
    assert len({thread for _, thread, _ in Side.seen}) == 1


def test_dependent_steps_stay_apart():
    x = K.placeholder((None, 3))
    y = Side(3.0)(K.tanh(Side(2.0)(x)))
    f = K.function([x], [y])
    v = np.ones((1, 3), "float32")
    np.testing.assert_allclose(f([v])[0], np.tanh(v * 2) * 3, rtol=1e-6)
    assert not _concurrent_steps(f)


def test_three_side_ops_pair_two():
    x = K.placeholder((None, 2))
    y = Side(2.0)(x) + Side(3.0)(x) + Side(5.0)(x)
    f = K.function([x], [y])
    np.testing.assert_allclose(f([np.ones((1, 2), "float32")])[0], np.full((1, 2), 10.0))
    assert len(_concurrent_steps(f)) == 1


def test_an_error_on_either_side_reaches_the_caller():
    runtime.set_num_threads(2)
    x = K.placeholder((None, 3))
    for first_fails in (True, False):
        f = K.function([x], [Side(2.0, fail=first_fails)(x) + Side(3.0, fail=not first_fails)(x)])
        with pytest.raises(ValueError, match="failed on purpose"):
            f([np.ones((1, 3), "float32")])
        assert runtime.get_thread_local_threads() is None
    # the helper still serves the next call
    g = K.function([x], [Side(2.0)(x) - Side(3.0)(x)])
    np.testing.assert_allclose(g([np.ones((1, 3), "float32")])[0], -np.ones((1, 3)))


def test_callers_on_several_threads_each_get_their_own_helper():
    runtime.set_num_threads(2)
    x = K.placeholder((None, 3))
    f = K.function([x], [Side(2.0)(x) + Side(3.0)(K.sin(x))])
    results, errors = {}, []

    def call(i):
        try:
            v = np.full((2, 3), i, "float32")
            for _ in range(20):
                out = f([v])[0]
                np.testing.assert_allclose(out, v * 2 + np.sin(v) * 3, rtol=1e-6)
            results[i] = True
        except Exception as e:      # reported below
            errors.append(e)
    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 4


def test_a_helper_ends_with_its_caller():
    runtime.set_num_threads(2)
    x = K.placeholder((None, 3))
    f = K.function([x], [Side(2.0)(x) + Side(3.0)(x)])
    before = {t for t in threading.enumerate() if t.name == "cyback-side-by-side"}

    during = []

    def call():
        f([np.ones((1, 3), "float32")])
        during.append({t for t in threading.enumerate() if t.name == "cyback-side-by-side"})
    t = threading.Thread(target=call)
    t.start()
    t.join()
    assert during[0] - before         # the caller had a helper of its own
    gc.collect()
    for _ in range(200):
        helpers = {t for t in threading.enumerate() if t.name == "cyback-side-by-side"}
        if helpers <= before:
            break
        threading.Event().wait(0.01)
    assert helpers <= before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_helper():
    runtime.set_num_threads(2)
    x = K.placeholder((None, 3))
    f = K.function([x], [Side(2.0)(x) + Side(3.0)(x)])
    v = np.ones((1, 3), "float32")
    f([v])                              # the parent's helper exists now
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = np.array_equal(f([v])[0], v * 5)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_training_plans_keep_their_steps():
    x = K.placeholder((None, 3))
    w = K.variable(np.ones(3, "float32"))
    y = K.sum(Side(2.0)(x * w) + Side(3.0)(x))
    f = K.function([x], [y], updates=[K.update_add(w, K.ones_like(w))])
    f([np.ones((1, 3), "float32")])
    assert not _concurrent_steps(f)


def test_order_and_cycle_rules():
    # two pairs that would each wait for the other keep their steps as they are
    class Plain(Op):
        def infer(self, x):
            return [(x.shape, x.dtype)]

        def compute(self, x):
            return (x,)
    x = K.placeholder((2,))
    a = Side(1.0)(x)
    b = Side(2.0)(x)
    steps = [(a.node.op, [x], [a]), (b.node.op, [x], [b])]
    out = concurrent.run_side_by_side(steps)
    assert len(out) == 1 and isinstance(out[0][0], concurrent.Concurrent)
    assert concurrent._in_order([(0, (Plain(), [b], [a])), (1, (Plain(), [a], [b]))]) is None
