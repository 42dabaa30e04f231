"""What runs in the tasks, on the workers: each task checks its input
blocks against the model, sets its thread's cyback thread count (and a
distributed worker's allocator, once), takes the model from this process's
cache and predicts its rows. ``_task_one``, ``_task_all`` and
``_frame_partition`` are the functions the graph names; ``_Settings`` is
what every task of one predict call shares."""
import time

import numpy as np

from cyback.dask.common import _API, _Opaque, _shape_str
from cyback.dask.data import _Rows
from cyback.dask.model_cache import _cache_lock, _runner, _stats
from cyback.dask.resources import (
    _allocator,
    _on_worker,
    _set_threads,
    _tune_allocator,
    _worker_threads,
)


class _Settings(_Opaque):
    """How every task of one predict call runs."""

    __slots__ = ("batch_size", "nan_policy", "threads", "host_threads", "tune", "in_tail",
                 "in_dtype", "out_specs")

    def __init__(self, **values):
        for k in self.__slots__:
            setattr(self, k, values[k])



def _where(chunk, rows):
    """'chunk 3 (rows 300 to 399)': ``chunk`` is a label ('chunk 3', 'partition 3')."""
    if rows is None:
        return chunk
    return "%s (rows %d to %d)" % (chunk, rows[0], rows[1] - 1)


def _checked(x, settings, chunk, rows):
    """One input block, checked against the model and cast to its dtype."""
    in_tail, in_dtype = settings.in_tail, settings.in_dtype
    if x.ndim != len(in_tail) + 1 or any(
            d is not None and d != s for d, s in zip(in_tail, x.shape[1:])):
        raise ValueError("%s: %s has shape %s; the model takes samples of shape %s"
                         % (_API, _where(chunk, rows), x.shape, _shape_str(in_tail)))
    if x.dtype != in_dtype:
        if x.dtype.kind not in "biuf":
            raise TypeError("%s: %s has dtype %s; the model takes %s"
                            % (_API, _where(chunk, rows), x.dtype, in_dtype))
        x = x.astype(in_dtype)
    if settings.nan_policy == "raise" and x.dtype.kind == "f":
        _check_finite(x, chunk, rows, "input")
    return x


def _run_chunk(parts, model, settings, chunk, part_rows):
    """Predict one task's rows, every output as a list. ``parts`` are the
    task's input blocks in order (arrays, or ``_Rows`` to read), ``part_rows``
    their (start, stop) rows in the data (None where unknown)."""
    blocks = [_checked(p.read() if isinstance(p, _Rows) else np.asarray(p), settings, chunk, r)
              for p, r in zip(parts, part_rows)]
    known = all(r is not None for r in part_rows)
    rows = (part_rows[0][0], part_rows[-1][1]) if known and part_rows else None
    total = sum(len(b) for b in blocks)
    seconds = 0.0
    if total == 0:
        outs = [np.empty((0,) + tuple(tail), dtype) for tail, dtype in settings.out_specs]
    else:
        _set_threads(_worker_threads(settings.threads, settings.host_threads))
        if settings.tune and not _allocator["tuned"] and _on_worker():
            _tune_allocator()
        runner = _runner(model)
        start = time.perf_counter()
        outs = runner.predict(blocks, settings.batch_size, settings.out_specs,
                              _where(chunk, rows))
        seconds = time.perf_counter() - start
    if settings.nan_policy == "raise":
        for o in outs:
            if o.dtype.kind == "f":
                _check_finite(o, chunk, rows, "prediction")
    from cyback import config
    with _cache_lock:
        _stats["chunks"] += 1
        _stats["rows"] += total
        _stats["seconds"] += seconds
        _stats["threads"] = config.get_num_threads()
    return outs


def _check_finite(a, chunk, rows, what):
    bad = np.isnan(a.reshape(len(a), -1)).any(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        at = "row %d" % (rows[0] + i) if rows else "its row %d" % i
        raise ValueError("%s: %s has NaN in its %s (first at %s); pass nan_policy='allow' to "
                         "predict anyway" % (_API, _where(chunk, rows), what, at))


def _task_one(parts, model, settings, chunk, part_rows):
    return _run_chunk(parts, model, settings, chunk, part_rows)[0]


def _task_all(parts, model, settings, chunk, part_rows):
    return tuple(_run_chunk(parts, model, settings, chunk, part_rows))


def _frame_partition(frame, model, settings, names, partition_info=None):
    import pandas as pd
    chunk = "partition %d" % partition_info["number"] if partition_info else "a partition"
    out = _run_chunk([frame.to_numpy()], model, settings, chunk, [None])[0]
    return pd.DataFrame(out.reshape(len(out), -1), index=frame.index, columns=names)

