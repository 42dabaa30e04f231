"""The BLAS thread-count contexts of cyback.kernels.blas_threads."""
import threading

import pytest

from cyback.kernels import blas_threads as bt

pytestmark = pytest.mark.skipif(not bt.blas_info(), reason="no OpenBLAS found to control")


@pytest.fixture
def blas_at_one():
    saved = bt.get_blas_threads()
    bt.set_blas_threads(1)
    try:
        yield
    finally:
        bt.set_blas_threads(saved)


def test_blas_threads_sets_and_restores_nested_and_on_error(blas_at_one):
    with bt.blas_threads(2) as outer:
        assert bt.get_blas_threads() == 2
        with bt.blas_threads(1):
            assert bt.get_blas_threads() == 1
        assert bt.get_blas_threads() == 2
        with bt.blas_threads(2):            # already there: nothing to restore
            assert bt.get_blas_threads() == 2
        assert bt.get_blas_threads() == 2
    assert isinstance(outer, bt.blas_threads) and bt.get_blas_threads() == 1
    with pytest.raises(KeyError):
        with bt.blas_threads(2):
            raise KeyError("inside")
    assert bt.get_blas_threads() == 1


def test_blas_threads_context_is_reusable(blas_at_one):
    ctx = bt.blas_threads(2)
    for _ in range(2):
        with ctx:
            assert bt.get_blas_threads() == 2
        assert bt.get_blas_threads() == 1


def test_blas_limit_is_shared_and_limits(blas_at_one):
    assert bt.blas_limit(1) is bt.blas_limit(1)
    with bt.blas_limit(1):
        assert bt.get_blas_threads() == 1
    bt.set_blas_threads(2)
    with bt.blas_limit(1):
        assert bt.get_blas_threads() == 1
        with bt.blas_limit(1):                  # re-entered on the same thread
            assert bt.get_blas_threads() == 1
        assert bt.get_blas_threads() == 1       # the outer hold still stands
    assert bt.get_blas_threads() == 2
    with pytest.raises(KeyError):
        with bt.blas_limit(1):
            raise KeyError("inside")
    assert bt.get_blas_threads() == 2


def test_blas_limit_holds_while_any_thread_is_inside(blas_at_one):
    # BLAS configured at 2 threads, kernels on 4 Python threads each holding
    # it at 1: no thread may see 2 while it is inside (a per-thread context
    # that restores what it found lets the first to leave put 2 back under
    # the others' GEMMs); after the last one leaves it is 2 again.
    bt.set_blas_threads(2)
    seen, errors = [], []
    start = threading.Barrier(4)

    def work():
        try:
            start.wait()
            for _ in range(300):
                with bt.blas_limit(1):
                    seen.append(bt.get_blas_threads())    # a ctypes call: lets others run
        except Exception as e:          # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(seen) == 1200 and set(seen) == {1}
    assert bt.get_blas_threads() == 2
