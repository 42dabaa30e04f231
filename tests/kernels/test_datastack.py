"""kernels/datastack.pyx: a plan's Python frames on a frame stack chunk of the
thread's own, so that where the caller stands on CPython's stack cannot make
every call inside the plan allocate and free a chunk."""
import resource
import sys
import threading

import numpy as np
import pytest

import cyback as K
from cyback.kernels import datastack

needs_rusage_thread = pytest.mark.skipif(not hasattr(resource, "RUSAGE_THREAD"),
                                         reason="per-thread page fault counts are Linux's")


def _step(i):
    return i + 1


def _many_calls(n):
    total = 0
    for i in range(n):
        total = _step(total)
    return total


def _caller_with_locals(n_locals):
    """A function whose frame holds ``n_locals`` locals and calls its argument:
    a caller standing at a chosen depth of CPython's frame stack."""
    names = ["v%d" % i for i in range(n_locals)]
    src = "def caller(f):\n"
    src += "".join("    %s = None\n" % v for v in names) if names else ""
    src += "    return f()\n"
    ns = {}
    exec(compile(src, "<caller %d>" % n_locals, "exec"), ns)
    return ns["caller"]


def _worst_faults(run, calls=300):
    """The most minor page faults ``calls`` small Python calls cost, over
    callers whose frames end at every 8th slot of a 16 kB stack chunk."""
    worst = 0
    for n in range(0, 2100, 8):
        caller = _caller_with_locals(n)
        caller(lambda: run(_many_calls, (8,)))         # warm: the same code paths
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        assert caller(lambda: run(_many_calls, (calls,))) == calls
        worst = max(worst, resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    return worst


def _plain(fn, args):
    return fn(*args)


@needs_rusage_thread
def test_calls_cost_no_chunk_allocations_wherever_the_caller_stands():
    assert _worst_faults(datastack.call) < 30


@needs_rusage_thread
@pytest.mark.skipif(not datastack.OWN_STACK, reason="this interpreter keeps a spare chunk")
def test_the_sweep_reaches_the_chunk_edge_where_a_plain_call_allocates():
    # the control for the test above: without the own chunk some caller
    # position makes every one of the 300 calls allocate a chunk
    assert _worst_faults(_plain) >= 300


def test_returns_the_result_and_takes_the_arguments():
    assert datastack.call(lambda a, b: (a, b), (1, "x")) == (1, "x")
    assert datastack.call(max, (3, 9, 4)) == 9
    with pytest.raises(TypeError):
        datastack.call(max, [3, 4])                      # the arguments are a tuple


def test_an_exception_propagates_and_the_stack_is_restored():
    def fails():
        _many_calls(10)
        raise KeyError("inside")
    for _ in range(3):
        with pytest.raises(KeyError, match="inside") as info:
            datastack.call(fails, ())
        assert info.traceback[-1].name == "fails"
    # frames pushed after the switch back land where they belong
    assert _many_calls(1000) == 1000
    assert datastack.call(_many_calls, (50,)) == 50


def test_nested_calls_and_recursion_deeper_than_the_chunk():
    def recurse(n):
        return 0 if n == 0 else 1 + recurse(n - 1)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 30000))
    try:
        # tens of thousands of frames outgrow the thread's chunk: CPython
        # chains chunks of its own on top and pops back into it
        assert datastack.call(recurse, (20000,)) == 20000
    finally:
        sys.setrecursionlimit(limit)
    assert datastack.call(datastack.call, (_many_calls, (7,))) == 7
    assert datastack.call(lambda: datastack.call(recurse, (300,)) + recurse(300), ()) == 600


def test_a_generator_made_inside_resumes_outside():
    def make():
        def gen():
            for i in range(3):
                yield _step(i)
        return gen()
    g = datastack.call(make, ())
    assert list(g) == [1, 2, 3]


def test_each_thread_uses_its_own_chunk():
    results, errors = {}, []

    def work(k):
        try:
            for _ in range(200):
                results[k] = datastack.call(_many_calls, (k + 100,))
        except Exception as e:       # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {k: k + 100 for k in range(6)}


def test_a_compiled_function_gives_the_same_bits_from_any_caller_depth():
    x = K.placeholder((None, 5))
    y = K.softmax(K.dot(K.relu(x), K.constant(np.arange(15.0, dtype="float32").reshape(5, 3))))
    f = K.function([x], [y])
    v = np.random.default_rng(0).normal(size=(4, 5)).astype("float32")
    ref = f([v])[0]
    for n in (0, 500, 1300, 2040):
        out = _caller_with_locals(n)(lambda: f([v])[0])
        assert out.tobytes() == ref.tobytes()
