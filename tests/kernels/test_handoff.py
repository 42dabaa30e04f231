"""runtime.handoff_ns, the round trip of a cache line between two threads of
the team: a positive time with two threads, None with one, clear errors for
bad arguments. (No bound on the time itself: the placement of a VM's CPUs
decides it.)"""
import pytest

from cyback.kernels import runtime


def test_two_threads_give_a_round_trip():
    if not runtime.openmp_enabled() or runtime.get_max_threads() < 2:
        pytest.skip("needs OpenMP and two threads")
    saved = runtime.get_max_threads()
    try:
        runtime.set_num_threads(2)
        ns = runtime.handoff_ns(200)
        # None only when the other thread never ran beside the first
        assert ns is None or ns > 0
        assert runtime.handoff_ns(1) is None or runtime.handoff_ns(1) > 0
    finally:
        runtime.set_num_threads(saved)


def test_one_thread_has_no_round_trip():
    saved = runtime.get_max_threads()
    try:
        runtime.set_num_threads(1)
        assert runtime.handoff_ns() is None
    finally:
        runtime.set_num_threads(saved)


@pytest.mark.parametrize("rounds", [0, -3, 10 ** 8, 2.5, True, "100", None])
def test_bad_rounds(rounds):
    with pytest.raises(ValueError, match="handoff_ns: rounds"):
        runtime.handoff_ns(rounds)


def test_calls_from_two_threads_at_once_each_get_an_answer():
    # each call exchanges its own cache line: a None or a time from each
    import threading
    if not runtime.openmp_enabled() or runtime.get_max_threads() < 2:
        pytest.skip("needs OpenMP and two threads")
    out = []
    threads = [threading.Thread(target=lambda: out.append(runtime.handoff_ns(100)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 2 and all(ns is None or ns > 0 for ns in out)
