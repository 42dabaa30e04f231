"""How many rows a task predicts: the model's time per row, measured here
once per model and batch shape; the number of tasks that run at once where
the job will be computed; and the rule that turns both into rows per task
(``chunk_rows="auto"``), with the joining of a dask array's small chunks."""
import collections
import math
import time

import numpy as np

from cyback.dask.common import _dask
from cyback.dask.resources import _cores

#: the most model time a task aims at, on one core (it gets between half
#: that and that): long enough that Dask's cost per task (about a millisecond
#: of worker time and as much in the scheduler) is a few percent, short
#: enough to spread a job over a cluster's threads.
_TASK_SECONDS = 0.3
_probes = collections.OrderedDict()


def _seconds_per_row(runner, token, sample, batch_size):
    """The model's time per row on one thread, measured here on a batch of
    zeros (the second of two runs: the first builds the plans); remembered
    per model and batch shape. It is the CPU time of this thread, which runs
    the whole model at one thread: on a busy machine the wall time also
    counts the other processes' turns on the core, and the chunks would
    shrink with the load of the moment."""
    key = (token, batch_size, sample.shape, sample.dtype.str)
    known = _probes.get(key)
    if known is not None:
        return known
    from cyback.kernels import runtime
    batch = np.zeros((batch_size,) + sample.shape, sample.dtype)
    saved = runtime.get_thread_local_threads()
    runtime.set_thread_local_threads(1)
    try:
        times = []
        for _ in range(2):
            start = time.thread_time()
            runner.run_batch(batch)
            times.append(time.thread_time() - start)
            if times[0] > _TASK_SECONDS:
                break       # one batch is a task's worth already
    finally:
        runtime.set_thread_local_threads(saved)
    _probes[key] = per_row = min(times) / batch_size
    while len(_probes) > 16:
        _probes.popitem(last=False)
    return per_row


def _slots(cluster):
    """How many tasks run at once where this will be computed: the Dask
    threads of the current distributed client's workers (``cluster``, from
    ``_host_threads``), else dask's local pool (1 for the synchronous
    scheduler)."""
    dask = _dask()
    if cluster:
        return sum(cluster.values())
    if dask.config.get("scheduler", None) in ("sync", "synchronous", "single-threaded"):
        return 1
    return int(dask.config.get("num_workers", None) or _cores())


def _auto_rows(per_row, n_rows, row_bytes, batch_size, slots):
    """Rows per task: at most ``_TASK_SECONDS`` of one core, a power of two
    of batches (so that the probe's noise rarely changes the chunks: the
    task time is between half that and that), within dask's
    ``array.chunk-size`` of input; then no fewer tasks than ``slots`` (so
    every thread gets work) and a multiple of them (so the last wave of tasks
    keeps every thread busy too), but none under a batch or an eighth of that
    size (where Dask's cost per task would weigh again), cut evenly in whole
    batches."""
    dask = _dask()
    from dask.utils import parse_bytes
    rows = max(1, int(math.ceil(_TASK_SECONDS / max(per_row, 1e-9))))
    if rows >= batch_size:
        rows = batch_size << int(math.floor(math.log2(rows / batch_size)))
    cap = parse_bytes(dask.config.get("array.chunk-size", "128MiB")) // max(1, row_bytes)
    rows = max(1, min(rows, cap))
    tasks = int(math.ceil(n_rows / rows)) if n_rows else 1
    tasks = slots * int(math.ceil(tasks / slots))
    smallest = max(batch_size, rows // 8)
    tasks = max(1, min(tasks, int(math.ceil(n_rows / smallest))))
    rows = max(1, int(math.ceil(n_rows / tasks)))
    if rows > batch_size:
        rows = batch_size * int(math.ceil(rows / batch_size))
    return min(rows, max(1, n_rows))


def _merged(sizes, rows, holders=None):
    """Consecutive chunks joined into tasks of about ``rows`` rows: a chunk
    joins the task before it while that brings the task nearer to ``rows``
    (chunks of ``rows`` or more stay tasks of their own) and, given
    ``holders`` (the worker holding each chunk), while it is on the same
    worker. Lists of chunk indices."""
    groups, current, n = [], [], 0
    for i, s in enumerate(sizes):
        if current and (n + s / 2.0 > rows or
                        holders is not None and holders[i] != holders[current[-1]]):
            groups.append(current)
            current, n = [], 0
        current.append(i)
        n += s
    if current or not groups:
        groups.append(current)
    return groups


def _ranges(n_rows, rows):
    """[(start, stop)] cutting ``n_rows`` into runs of ``rows`` (one, empty, for no rows)."""
    return [(a, min(a + rows, n_rows)) for a in range(0, n_rows, rows)] or [(0, 0)]
