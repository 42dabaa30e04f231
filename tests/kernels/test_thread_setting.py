"""The thread count is the process's: set_num_threads and CYBACK_NUM_THREADS
hold in every Python thread, those running and those started later; a thread
may hold a count of its own (set_thread_local_threads, for cyback.dask)."""
import concurrent.futures
import os
import subprocess
import sys
import threading

import pytest

import cyback as K
from cyback.kernels import runtime

needs_openmp = pytest.mark.skipif(not runtime.openmp_enabled(),
                                  reason="needs openmp: built without OpenMP")


@pytest.fixture
def restore_threads():
    saved = K.get_num_threads()
    yield
    K.set_num_threads(saved)
    runtime.set_thread_local_threads(None)


def _in_new_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:      # pragma: no cover - reported below
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    assert "error" not in out, out.get("error")
    return out["value"]


def _seen():
    return K.get_num_threads(), runtime.region_threads()


@needs_openmp
def test_a_thread_started_after_the_setting_uses_it(restore_threads):
    K.set_num_threads(1)
    assert _in_new_thread(_seen) == (1, 1)
    K.set_num_threads(2)
    assert _in_new_thread(_seen) == (2, 2)


@needs_openmp
def test_a_thread_already_running_takes_the_new_setting(restore_threads):
    K.set_num_threads(2)
    go, done = threading.Event(), threading.Event()
    seen = []

    def worker():
        seen.append(_seen())
        go.wait(30)
        seen.append(_seen())
        done.set()
    t = threading.Thread(target=worker)
    t.start()
    while not seen:
        threading.Event().wait(0.001)
    K.set_num_threads(1)
    go.set()
    assert done.wait(30)
    t.join()
    assert seen == [(2, 2), (1, 1)]


@needs_openmp
def test_thread_pool_workers_use_the_setting(restore_threads):
    K.set_num_threads(1)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        assert list(pool.map(lambda _: _seen(), range(6))) == [(1, 1)] * 6


@needs_openmp
def test_a_thread_local_count_leaves_other_threads_alone(restore_threads):
    K.set_num_threads(2)

    def local():
        runtime.set_thread_local_threads(1)
        mine = _seen()
        other = _in_new_thread(_seen)
        runtime.set_thread_local_threads(None)
        return mine, other, _seen()
    assert _in_new_thread(local) == ((1, 1), (2, 2), (2, 2))
    assert runtime.get_thread_local_threads() is None


def test_thread_local_count_checks_its_argument():
    for bad in (0, -2, 2.5, True, "1", runtime.MAX_THREADS + 1):
        with pytest.raises(ValueError, match="set_thread_local_threads"):
            runtime.set_thread_local_threads(bad)


@needs_openmp
def test_environment_setting_holds_in_new_threads():
    code = ("import threading, cyback as K\n"
            "from cyback.kernels import runtime\n"
            "out = []\n"
            "t = threading.Thread(target=lambda: out.append((K.get_num_threads(), "
            "runtime.region_threads())))\n"
            "t.start(); t.join(); print(out[0])\n")
    env = dict(os.environ, CYBACK_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(1, 1)"
