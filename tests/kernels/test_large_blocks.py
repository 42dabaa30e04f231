"""kernels/large_blocks.pyx: NumPy's allocator while a plan runs, which keeps
freed blocks above glibc's mmap threshold mapped for the next call."""
import threading

import numpy as np
import pytest
from numpy._core.multiarray import get_handler_name

import cyback as K
from cyback.kernels import large_blocks, memory

MIB = 1 << 20


@pytest.fixture
def small_blocks():
    """The cache taking blocks from 1 MiB, 8 MiB of them at most; restored."""
    before = large_blocks.stats()
    large_blocks.configure(MIB, 8 * MIB)
    large_blocks.clear()
    yield
    large_blocks.configure(before["min_bytes"], before["budget_bytes"])


def _allocating(fn):
    previous = large_blocks.enter()
    try:
        return fn()
    finally:
        large_blocks.leave(previous)


def test_on_by_default_with_glibc_above_its_mmap_threshold():
    stats = large_blocks.stats()
    if memory.settings() == "kept":
        assert stats["min_bytes"] == memory.MMAP_THRESHOLD
        assert stats["budget_bytes"] == memory.LARGE_BLOCK_BUDGET
    else:
        assert large_blocks.min_bytes() is None


def test_a_freed_block_is_handed_out_again(small_blocks):
    def run():
        a = np.empty(2 * MIB, np.uint8)
        address = a.ctypes.data
        assert get_handler_name(a) == "cyback_large_blocks"
        del a
        b = np.empty(2 * MIB - 1000, np.uint8)          # a little smaller fits too
        return address, b.ctypes.data
    hits = large_blocks.stats()["hits"]
    first, second = _allocating(run)
    assert first == second and large_blocks.stats()["hits"] == hits + 1
    assert get_handler_name() == "default_allocator"   # leave() restored NumPy's


def test_a_much_smaller_request_does_not_take_a_large_block(small_blocks):
    def run():
        a = np.empty(4 * MIB, np.uint8)
        address = a.ctypes.data
        del a
        b = np.empty(2 * MIB, np.uint8)
        return address, b.ctypes.data, large_blocks.stats()["cached_bytes"]
    first, second, cached = _allocating(run)
    assert first != second and cached == 4 * MIB


def test_zeros_from_a_reused_block_are_zeros(small_blocks):
    def run():
        a = np.empty(MIB, np.float32)
        a[...] = 7
        del a
        return np.zeros(MIB, np.float32)
    assert not _allocating(run).any()


def test_growing_an_array_keeps_its_values(small_blocks):
    def run():
        a = np.arange(300000, dtype=np.float64)          # 2.4 MB
        a.resize(600000, refcheck=False)
        return a
    a = _allocating(run)
    np.testing.assert_array_equal(a[:300000], np.arange(300000))
    assert not a[300000:].any()


def test_the_budget_bounds_what_is_kept(small_blocks):
    def run():
        for n in range(1, 12):
            a = np.empty(n * MIB, np.uint8)
            a[::4096] = 1
            del a
            assert large_blocks.stats()["cached_bytes"] <= 8 * MIB
        big = np.empty(9 * MIB, np.uint8)                # more than the budget: not kept
        del big
        return large_blocks.stats()["cached_bytes"]
    assert _allocating(run) <= 8 * MIB
    large_blocks.clear()
    assert large_blocks.stats()["cached_bytes"] == 0


def test_arrays_outlive_the_handler_and_threads_share_it(small_blocks):
    kept = _allocating(lambda: [np.full(300000, i, np.float64) for i in range(4)])
    for i, a in enumerate(kept):
        assert (a == i).all()
    del kept                                    # freed by the handler that made them
    errors = []

    def work(k):
        try:
            for _ in range(50):
                a = _allocating(lambda: np.full(MIB // 4 + k, k, np.float32))
                if not (a == k).all():
                    errors.append(k)
        except Exception as e:          # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_plan_with_large_arrays_reuses_their_blocks(small_blocks, rng):
    x = K.placeholder((None, 512))
    w = K.constant(rng.normal(size=(512, 2048)).astype(np.float32))
    y = K.sum(K.relu(K.dot(x, w)) * 2.0, axis=1)
    f = K.function([x], [y])
    xv = rng.normal(size=(300, 512)).astype(np.float32)   # a (300, 2048) float32: 2.4 MB
    first = f([xv])[0]
    hits = large_blocks.stats()["hits"]
    again = f([xv])[0]
    assert large_blocks.stats()["hits"] > hits
    assert first.tobytes() == again.tobytes()
    assert get_handler_name() == "default_allocator"
    # one row is far below the cache's size: NumPy's allocator is not swapped
    before = large_blocks.stats()
    f([xv[:1]])
    after = large_blocks.stats()
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])
