"""Batch inference on a Dask cluster: ``predict(model, data)`` → lazy predictions.

::

    from dask.distributed import Client
    import cyback.dask

    client = Client()                                  # or Client("tcp://scheduler:8786")
    pred = cyback.dask.predict("model.h5", x, batch_size=64)   # x: a dask array
    cyback.dask.save(pred, "predictions/")             # one .npy per chunk

``model`` is a Keras model on cyback, the path of a Keras ``.h5`` file, or a
compiled cyback function (``K.function``) of one input. ``data`` is a dask
array, a dask (or pandas) DataFrame (``columns`` selects the features), a
NumPy array or a list of ``.npy`` files. Rows are samples: each task predicts
a run of rows (one chunk of the result) in batches of ``batch_size``.

How it runs (see docs/dask.md):

- tasks are sized by ``chunk_rows``: by default 0.15-0.3 s of the model on
  one core (the CPU time of two batches of zeros here), no fewer than the cluster
  has threads; a dask array's smaller chunks are joined, its bigger ones
  kept; NumPy slices ride inside their tasks, and ``.npy`` rows are read by
  the task that predicts them (also through ``from_npy_files``);
- the model travels with the tasks: its bytes (an in-memory HDF5 save, or
  the pickled function) ride inside each task when at most 1 MiB, else they
  are one key of the graph, which each worker fetches once;
- each process loads it once, on its first task, and keeps it in a cache
  keyed by a digest of those bytes (``cache_info()`` counts the loads);
- on a distributed worker, cyback's kernels run on the worker's share of the
  host's cores (cores // the host's total Dask threads), and in dask's local
  thread pool on cores // its size, so that tasks never oversubscribe the
  machine;
- ``SCORING_CONFIG`` holds Dask settings that keep Dask's own monitoring
  (profiler, event-loop ticks, memory polls) from taking the workers' cores;
  apply them where the cluster starts;
- a chunk whose shape does not fit the model, or that holds NaN under
  ``nan_policy="raise"``, fails with an error naming the chunk and its rows.
  A worker that dies is Dask's business: its tasks are recomputed elsewhere,
  and since prediction is deterministic the result is the same.

This module imports dask only when called: ``import cyback.dask`` works
without it, and the functions say how to install it.
"""
import collections
import math
import os
import threading
import time
import weakref

import numpy as np

from cyback.kernels import settings

__all__ = ["predict", "save", "from_npy_files", "cache_info", "clear_cache", "SCORING_CONFIG"]

_API = "cyback.dask.predict"
_NAN_POLICIES = ("allow", "raise")
_CACHE_SIZE = 4
#: a model of at most this many bytes rides inside each task; a bigger one is
#: a key of its own, fetched once by each worker (a dependency costs the job a
#: round of scheduling and a transfer to each worker, more than shipping a
#: small model with every task)
_INLINE_BYTES = 1 << 20

#: Dask settings for a cluster that does batch scoring. By default every
#: Dask server (scheduler, nanny, worker) wakes up to check its event loop
#: every 20 ms, each worker samples the stack of its running task every 10 ms
#: for Dask's profiler, and nannies and workers read their memory use every
#: 100 ms. On a host whose cores the workers fill, that is CPU taken from the
#: model, a sizeable part of a core on a small host (benchmarks/bench_dask.py
#: --dask-config compares). These settings turn the profiler off and check
#: the rest at a human pace (the dashboard works but for its
#: profile page; memory limits are enforced within half a second). Apply
#: them where the processes start: ``with dask.config.set(SCORING_CONFIG):
#: LocalCluster(...)`` (the nannies pass the config to their workers), or in
#: the environment of ``dask scheduler`` / ``dask worker`` (docs/dask.md).
SCORING_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.memory.monitor-interval": "500ms",
    "distributed.admin.system-monitor.interval": "2s",
}


def _dask():
    try:
        import dask
        import dask.array  # noqa: F401
    except ImportError as e:
        raise ImportError("cyback.dask needs dask; install it with "
                          "pip install 'cyback[dask]' (%s)" % e) from None
    return dask


# -------------------------------------------------------------- the model

class _Model(object):
    """What travels to the workers: the model's bytes, how to load them, and a
    digest of them (the cache key)."""

    __slots__ = ("kind", "data", "custom_objects", "token")

    def __init__(self, kind, data, custom_objects=None):
        from cyback.graph.pickling import token
        self.kind = kind                # "keras" (HDF5 bytes) or "function" (a pickle)
        self.data = data
        self.custom_objects = custom_objects or {}
        self.token = token(data)

    def __getstate__(self):
        return self.kind, self.data, self.custom_objects, self.token

    def __dask_tokenize__(self):
        return ("cyback-model", self.token)

    def __setstate__(self, state):
        self.kind, self.data, self.custom_objects, self.token = state

    def load(self):
        if self.kind == "keras":
            from cyback._keras_compat import load_keras_model
            return _Runner(load_keras_model(self.data, self.custom_objects or None,
                                            compile=False))
        import cloudpickle
        return _Runner(cloudpickle.loads(self.data))


class _Runner(object):
    """A loaded model, run batch by batch through its compiled function.

    Keras models are run through their predict function directly, not
    ``model.predict``: batches are views of the chunk (Keras' loop copies each
    one through a fancy index) and land in preallocated outputs."""

    def __init__(self, model):
        from cyback import config
        from cyback.graph.function import Function
        self.model = model
        self.is_function = isinstance(model, Function)
        if self.is_function:
            fn = model
        else:
            # Built here, once, not by the first of several threads at once.
            model._make_predict_function()
            fn = model.predict_function
        lp = config.learning_phase_placeholder()
        self.fn = fn
        self.outputs = list(fn.outputs)
        self.feeds = [x for x in fn.inputs if x is not lp]
        self.lp_index = next((i for i, x in enumerate(fn.inputs) if x is lp), None)
        self.input_shape = tuple(self.feeds[0].shape) if len(self.feeds) == 1 else None
        self.input_dtype = self.feeds[0].dtype if self.feeds else None

    def check(self, what):
        if len(self.feeds) != 1:
            raise ValueError("%s: the %s has %d inputs; predict takes models of one input"
                             % (_API, what, len(self.feeds)))
        scalars = [i for i, o in enumerate(self.outputs) if len(o.shape) == 0]
        if scalars:
            raise ValueError("%s: output %d of the %s is a scalar; predict needs one row of "
                             "output per row of input" % (_API, scalars[0], what))
        if self.is_function and self.model._updates:
            raise ValueError("%s: the function has updates, which would change its variables "
                             "on each worker apart; compile one without updates" % _API)

    def run_batch(self, batch):
        """One array per output for one batch (in the test phase)."""
        feeds = [batch]
        if self.lp_index is not None:
            feeds.insert(self.lp_index, np.zeros((), bool))
        out = self.fn(feeds)
        return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]

    def predict(self, blocks, batch_size, out_specs, where):
        """The rows of ``blocks`` (arrays, in order) predicted in batches of
        ``batch_size``, one array per output of ``out_specs``' shapes."""
        total = sum(len(b) for b in blocks)
        outs = [np.empty((total,) + tuple(tail), dtype) for tail, dtype in out_specs]
        done = 0
        for batch in _batches(blocks, batch_size):
            n = len(batch)
            for i, (out, got) in enumerate(zip(outs, self.run_batch(batch))):
                if got.shape[:1] != (n,):
                    raise ValueError("%s: for %s the model's output %d has %d rows for a batch "
                                     "of %d, not one per input row"
                                     % (_API, where, i, len(got) if got.ndim else 0, n))
                if got.shape[1:] != out.shape[1:]:
                    raise ValueError("%s: for %s the model's output %d has samples of shape "
                                     "%s, not %s as on the first row"
                                     % (_API, where, i, got.shape[1:], out.shape[1:]))
                out[done:done + n] = got
            done += n
        return outs


def _batches(blocks, batch_size):
    """Batches of ``batch_size`` rows across ``blocks``: views of a block where
    a batch lies within one, joined only where a batch spans two."""
    pending, missing = [], batch_size
    for block in blocks:
        start = 0
        while start < len(block):
            if not pending and len(block) - start >= batch_size:
                yield block[start:start + batch_size]
                start += batch_size
                continue
            take = min(missing, len(block) - start)
            pending.append(block[start:start + take])
            start += take
            missing -= take
            if not missing:
                yield np.concatenate(pending)
                pending, missing = [], batch_size
    if pending:
        yield pending[0] if len(pending) == 1 else np.concatenate(pending)


_cache = collections.OrderedDict()
_cache_lock = threading.Lock()
_stats = {"loads": 0, "chunks": 0, "rows": 0, "seconds": 0.0, "threads": None}


def _runner(model):
    with _cache_lock:
        runner = _cache.get(model.token)
        if runner is None:
            runner = _cache[model.token] = model.load()
            _stats["loads"] += 1
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        else:
            _cache.move_to_end(model.token)
        return runner


def cache_info():
    """This process's model cache: the tokens of the models held, how many
    loads there were, the chunks and rows predicted, the seconds spent in
    the model (loading excluded), the cyback thread count the last chunk
    ran with, and whether the allocator was tuned. On a cluster:
    ``client.run(cyback.dask.cache_info)`` asks every worker."""
    with _cache_lock:
        return dict(_stats, models=list(_cache), allocator_tuned=_allocator["tuned"])


def clear_cache():
    """Forget the models loaded in this process and reset the counts."""
    with _cache_lock:
        _cache.clear()
        _stats.update(loads=0, chunks=0, rows=0, seconds=0.0, threads=None)


#: what predict shipped for a Keras model object, with the fingerprint it
#: was saved at, and for a model file, by (path, modification time, size):
#: saving a model to HDF5 takes longer than the rest of building a job
_saved_models = weakref.WeakKeyDictionary()
_read_files = collections.OrderedDict()


def _fingerprint(model):
    """A digest of a Keras model's layers, configuration and weights."""
    import hashlib
    h = hashlib.sha1(repr([id(layer) for layer in model.layers]).encode())
    h.update(repr(model.get_config()).encode())
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).data)
    return h.hexdigest()


def _model_source(model):
    """(a _Model to ship, a runner loaded here to read shapes from)."""
    from cyback.graph.function import Function
    if isinstance(model, Function):
        import cloudpickle
        return _Model("function", cloudpickle.dumps(model)), _Runner(model), "function"
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                key = (os.path.abspath(path), stat.st_mtime_ns, stat.st_size)
                found = _read_files.get(key)
                if found is not None:
                    return found
                data = f.read()
        except OSError as e:
            raise ValueError("%s: cannot read the model file %r: %s" % (_API, path, e)) from None
        from cyback._keras_compat import load_keras_model
        try:
            local = load_keras_model(data, compile=False)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError("%s: %r is not a Keras HDF5 model file: %s"
                             % (_API, path, e)) from None
        _read_files[key] = found = _Model("keras", data), _Runner(local), "model in %s" % path
        while len(_read_files) > _CACHE_SIZE:
            _read_files.popitem(last=False)
        return found
    if hasattr(model, "predict") and hasattr(model, "outputs") and hasattr(model, "layers"):
        from cyback._keras_compat import custom_objects_of, keras_model_bytes
        fingerprint = _fingerprint(model)
        try:
            saved = _saved_models.get(model)
        except TypeError:       # not weakly referenceable: save it each time
            saved = None
        if saved is None or saved[0] != fingerprint:
            data = keras_model_bytes(model, include_optimizer=False)
            saved = fingerprint, _Model("keras", data, custom_objects_of(model))
            try:
                _saved_models[model] = saved
            except TypeError:
                pass
        return saved[1], _Runner(model), "model"
    raise TypeError("%s: model must be a Keras model on cyback, the path of a Keras .h5 file "
                    "or a cyback function (K.function), got %r" % (_API, type(model).__name__))


# ------------------------------------------------------------- threads

def _cores():
    # the process's CPUs: its affinity mask, capped by a container's CPU quota
    from cyback.kernels.cpu_budget import default_threads
    return default_threads()


def _host_threads():
    """{host: Dask threads of all workers on it} from the current client, or {}."""
    try:
        from distributed import get_client
        client = get_client()
    except (ImportError, ValueError):
        return {}
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:       # distributed before n_workers (it listed all then)
        info = client.scheduler_info()
    totals = {}
    for info in info.get("workers", {}).values():
        host = info.get("host")
        totals[host] = totals.get(host, 0) + int(info.get("nthreads", 1))
    return totals


def _worker_threads(threads, host_threads):
    """The cyback thread count for a task running here, or None to leave it."""
    if threads != "auto":
        return threads
    if settings.is_set("CYBACK_NUM_THREADS"):
        return None         # the worker's environment decides
    try:
        from distributed import get_worker
        worker = get_worker()
    except (ImportError, ValueError):
        worker = None
    if worker is None:
        if threading.current_thread() is threading.main_thread():
            return None     # the synchronous scheduler: this process's setting stands
        # A thread of dask's local pool, which runs num_workers tasks at once.
        import dask
        pool = dask.config.get("num_workers", None) or _cores()
        return max(1, _cores() // int(pool))
    from distributed.comm import get_address_host
    total = host_threads.get(get_address_host(worker.address)) or worker.state.nthreads
    return max(1, _cores() // max(1, total))


#: glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_allocator = {"tuned": False}


def _tune_allocator():
    """Let glibc keep freed memory for reuse in this worker process.

    Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which
    also fixes glibc's mmap threshold at 128 KiB: every array above that is
    mapped fresh and unmapped when freed, so each batch page-faults all its
    intermediates in again, and a small CNN's predict costs far more CPU
    time than in a plain process (docs/dask.md). Buffers up to
    32 MiB are served from the heap again and up to 64 MiB of free heap is
    kept. Once per process, on distributed workers on glibc only.
    """
    if _allocator["tuned"]:
        return
    _allocator["tuned"] = True
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20)
    except (OSError, AttributeError):
        pass        # not glibc: nothing to undo


def _on_worker():
    try:
        from distributed import get_worker
        get_worker()
    except (ImportError, ValueError):
        return False
    return True


def _set_threads(n):
    # The task's thread only: other task threads (and the user's) keep theirs.
    if n is not None:
        from cyback.kernels import runtime
        if runtime.get_thread_local_threads() != n:
            runtime.set_thread_local_threads(n)


# --------------------------------------------------------------- chunks

class _Opaque(object):
    """A value dask's graph walk must not look into (its tuples could pass for
    tasks or keys): the settings of one predict call, or rows of a file."""

    __slots__ = ()

    def __getstate__(self):
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state):
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)

    def __dask_tokenize__(self):
        return (type(self).__name__,) + self.__getstate__()


class _Settings(_Opaque):
    """How every task of one predict call runs."""

    __slots__ = ("batch_size", "nan_policy", "threads", "host_threads", "tune", "in_tail",
                 "in_dtype", "out_specs")

    def __init__(self, **values):
        for k in self.__slots__:
            setattr(self, k, values[k])


class _Rows(_Opaque):
    """Rows ``start:stop`` of a ``.npy`` file, read (memory-mapped, copy on
    write: the pages come from the page cache and the array is writable) by
    the task that predicts them."""

    __slots__ = ("path", "start", "stop")

    def __init__(self, path, start, stop):
        self.path, self.start, self.stop = path, start, stop

    def read(self):
        return np.asarray(np.load(self.path, mmap_mode="c")[self.start:self.stop])


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


def _shape_str(tail):
    return "(%s)" % ", ".join(["n"] + ["None" if d is None else str(d) for d in tail])


def _task_one(parts, model, settings, chunk, part_rows):
    return _run_chunk(parts, model, settings, chunk, part_rows)[0]


def _task_all(parts, model, settings, chunk, part_rows):
    return tuple(_run_chunk(parts, model, settings, chunk, part_rows))


def _frame_partition(frame, model, settings, names, partition_info=None):
    import pandas as pd
    chunk = "partition %d" % partition_info["number"] if partition_info else "a partition"
    out = _run_chunk([frame.to_numpy()], model, settings, chunk, [None])[0]
    return pd.DataFrame(out.reshape(len(out), -1), index=frame.index, columns=names)


# ------------------------------------------------------------ task size

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


# ---------------------------------------------------------------- data

def _npy_header(path):
    """(shape, dtype) of a ``.npy`` file, from its header alone."""
    from numpy.lib import format as npy
    with open(path, "rb") as f:
        version = npy.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = npy.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = npy.read_array_header_2_0(f)
        else:
            head = np.load(path, mmap_mode="r")
            shape, dtype = head.shape, head.dtype
    return shape, dtype


def _npy_headers(paths, api):
    """[(path, rows)], the sample shape and the dtype of ``.npy`` files,
    from their headers."""
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("%s: no files given" % api)
    files, tail, dtype = [], None, None
    for p in paths:
        try:
            shape, kind = _npy_header(p)
        except (OSError, ValueError) as e:
            raise ValueError("%s: cannot read %r: %s" % (api, p, e)) from None
        if not shape:
            raise ValueError("%s: %r holds a scalar, not rows of samples" % (api, p))
        if tail is None:
            tail, dtype = shape[1:], kind
        elif shape[1:] != tail or kind != dtype:
            raise ValueError("%s: %r holds %s rows of dtype %s; %r holds %s of %s"
                             % (api, p, shape[1:], kind, paths[0], tail, dtype))
        files.append((p, shape[0]))
    return files, tuple(tail), dtype


#: {name of a dask array made by from_npy_files: (its files, its
#: chunk_rows)}, so that predict over such an array reads the rows in its own
#: tasks (bounded; the names are tokens of the files and chunk_rows)
_npy_arrays = collections.OrderedDict()


def _read_rows(rows):
    return rows.read()


def from_npy_files(paths, chunk_rows=None):
    """A dask array over ``.npy`` files (stacked along the first axis), read
    lazily, memory-mapped, by the workers (which must see the same paths).
    Each file is a chunk, or chunks are ``chunk_rows`` rows across files.

    ``predict`` over this array (not a slice of it or other array made from
    it) reads the rows in the tasks that predict them, cut to its own
    ``chunk_rows``: a file is never read on one worker to be moved to
    another."""
    _dask()
    import dask.array as da
    from dask.base import tokenize
    files, tail, dtype = _npy_headers(paths, "from_npy_files")
    rows = None if chunk_rows is None else int(chunk_rows)
    tasks = _file_tasks(files, rows)
    name = "npy-files-" + tokenize(files, rows)
    zeros = (0,) * len(tail)
    layer = {}
    lengths = []
    for i, (parts, part_rows) in enumerate(tasks):
        reads = [(_read_rows, p) for p in parts]
        layer[(name, i) + zeros] = reads[0] if len(reads) == 1 else \
            (np.concatenate, reads)
        lengths.append(sum(b - a for a, b in part_rows))
    _npy_arrays[name] = files, rows
    while len(_npy_arrays) > 64:
        _npy_arrays.popitem(last=False)
    return da.Array(layer, name, (tuple(lengths),) + tuple((d,) for d in tail), dtype=dtype,
                    meta=np.empty((0,) * (1 + len(tail)), dtype))


def _is_dask_frame(data):
    try:
        import dask.dataframe as dd
    except ImportError:
        return False
    return isinstance(data, dd.DataFrame)


class _Data(object):
    """What predict reads: ``kind`` is "frame" (a dask DataFrame), "pandas",
    "numpy", "files" (``obj`` lists (path, rows)) or "array" (a dask array,
    one chunk across the axes past the first); ``tail`` is a sample's shape;
    ``n_rows`` is None where unknown."""

    def __init__(self, kind, obj, n_rows, tail, dtype):
        self.kind, self.obj, self.n_rows, self.tail = kind, obj, n_rows, tuple(tail)
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.tail, dtype=np.int64))
        self.keep_rows = None       # rows per chunk of from_npy_files' array (None: files)


def _data_source(data, columns):
    import dask.array as da
    is_pandas = type(data).__module__.startswith("pandas") and hasattr(data, "columns")
    if _is_dask_frame(data) or is_pandas:
        if columns is not None:
            missing = [c for c in columns if c not in data.columns]
            if missing:
                raise ValueError("%s: columns %s are not in the data (it has %s)"
                                 % (_API, missing, list(data.columns)))
            data = data[list(columns)]
        dtypes = list(data.dtypes)
        dtype = np.result_type(*dtypes) if dtypes else np.float64
        if is_pandas:
            return _Data("pandas", data, len(data), (len(data.columns),), dtype)
        return _Data("frame", data, None, (len(data.columns),), dtype)
    if columns is not None:
        raise ValueError("%s: columns selects DataFrame columns; the data is a %s"
                         % (_API, type(data).__name__))
    if isinstance(data, (list, tuple)) and data and all(
            isinstance(p, (str, os.PathLike)) for p in data):
        files, tail, dtype = _npy_headers(data, _API)
        return _Data("files", files, sum(n for _, n in files), tail, dtype)
    if isinstance(data, da.Array) and data.name in _npy_arrays:
        files, rows = _npy_arrays[data.name]
        src = _Data("files", files, sum(n for _, n in files), data.shape[1:], data.dtype)
        src.keep_rows = rows
        return src
    if isinstance(data, np.ndarray):
        kind = "numpy"
    elif isinstance(data, da.Array):
        kind = "array"
    else:
        raise TypeError("%s: data must be a dask array, a dask or pandas DataFrame, a NumPy "
                        "array or a list of .npy paths, got %r" % (_API, type(data).__name__))
    if data.ndim == 0:
        raise ValueError("%s: data is a scalar; expected rows of samples" % _API)
    if kind == "array" and any(len(c) > 1 for c in data.chunks[1:]):
        data = data.rechunk({i: -1 for i in range(1, data.ndim)})
    n_rows = data.shape[0]
    return _Data(kind, data, None if n_rows != n_rows else int(n_rows), data.shape[1:],
                 data.dtype)


# -------------------------------------------------------------- predict

def predict(model, data, batch_size=32, columns=None, nan_policy="allow", threads="auto",
            chunk_rows="auto", output_columns=None, tune_allocator=True):
    """Lazy predictions of ``model`` over ``data`` (see the module docstring).

    batch_size: rows per call of the model within a task.
    columns: the DataFrame columns that are the model's features, in order.
    nan_policy: "allow" (NaN flows through, as in ``model.predict``) or
        "raise" (a chunk with NaN in its input or its predictions fails,
        naming the chunk and the first bad row).
    threads: cyback threads per task: "auto" (on a distributed worker, its
        share of the host's cores; in dask's local thread pool, cores //
        its size; on the synchronous scheduler left as set), or an int.
    chunk_rows: rows per task, i.e. per chunk of the result:
        "auto" (or None): 0.15 to 0.3 s of the model on one core (the
        CPU time of two batches of zeros here, once per model), fewer where that
        leaves some of the cluster's threads idle; a dask array's chunks
        smaller than that are joined with their neighbours (on the same
        worker, for a persisted array), larger ones are kept;
        an int: exactly that many (a dask array is rechunked to it);
        "keep": one task per chunk of a dask array, as it is.
        A dask DataFrame's partitions are always kept.
    output_columns: names of the result's columns for DataFrame data.
    tune_allocator: on distributed workers, undo the malloc setting Dask's
        nanny imposes, which makes every large intermediate page-fault
        afresh (see ``_tune_allocator``); False leaves the worker as it is.

    Returns a dask array with one row chunk per task (a list of them for a
    model of several outputs), or for DataFrame data a dask DataFrame with
    the index and partitions of the data. Nothing runs until it is computed
    or saved.
    """
    dask = _dask()
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or \
            batch_size < 1:
        raise ValueError("%s: batch_size must be a positive integer, got %r" % (_API, batch_size))
    if nan_policy not in _NAN_POLICIES:
        raise ValueError("%s: nan_policy must be one of %s, got %r"
                         % (_API, _NAN_POLICIES, nan_policy))
    if threads != "auto" and (isinstance(threads, bool) or
                              not isinstance(threads, (int, np.integer)) or threads < 1):
        raise ValueError("%s: threads must be 'auto' or a positive integer, got %r"
                         % (_API, threads))
    if chunk_rows is None:
        chunk_rows = "auto"
    if chunk_rows not in ("auto", "keep") and (
            isinstance(chunk_rows, bool) or not isinstance(chunk_rows, (int, np.integer)) or
            chunk_rows < 1):
        raise ValueError("%s: chunk_rows must be 'auto', 'keep' or a positive integer, got %r"
                         % (_API, chunk_rows))
    if columns is not None:
        columns = [columns] if isinstance(columns, str) else list(columns)
    batch_size = int(batch_size)
    source, runner, what = _model_source(model)
    runner.check(what)
    src = _data_source(data, columns)
    if chunk_rows == "keep" and src.kind in ("numpy", "pandas"):
        raise ValueError("%s: chunk_rows='keep' keeps a dask collection's chunks; the data is a "
                         "%s (give chunk_rows='auto' or a number)" % (_API, type(data).__name__))
    in_tail, in_dtype = _input_spec(runner, src, what)
    out_specs = _output_specs(runner, in_tail, in_dtype, src, batch_size)
    cluster = _host_threads()
    settings = _Settings(batch_size=batch_size, nan_policy=nan_policy,
                         threads=threads if threads == "auto" else int(threads),
                         host_threads=cluster if threads == "auto" else {},
                         tune=bool(tune_allocator), in_tail=in_tail, in_dtype=in_dtype,
                         out_specs=out_specs)
    shipped = source if len(source.data) <= _INLINE_BYTES else \
        dask.delayed(source, pure=True, traverse=False)
    if src.kind == "frame":
        return _predict_frame(src.obj, shipped, settings, output_columns)
    rows = None
    if chunk_rows == "auto" and src.n_rows is not None:
        sample = np.zeros(tuple(g if d is None else d for d, g in zip(in_tail, src.tail)),
                          in_dtype)
        per_row = _seconds_per_row(runner, source.token, sample, batch_size)
        rows = _auto_rows(per_row, src.n_rows, src.row_bytes, batch_size, _slots(cluster))
    elif chunk_rows not in ("auto", "keep"):
        rows = int(chunk_rows)
    if src.kind == "pandas":
        import dask.dataframe as dd
        return _predict_frame(dd.from_pandas(src.obj, chunksize=rows), shipped, settings,
                              output_columns)
    tasks, deps, identity = _tasks(src, rows, chunk_rows == "auto")
    return _predict_tasks(tasks, deps, identity, shipped, settings)


def _tasks(src, rows, merge):
    """The tasks over ``src``: [(parts, part_rows)], the collections they
    read, and what identifies the data (for the graph's name)."""
    if src.kind == "numpy":
        # Copied, as dask.array.from_array does: the job must see the data as
        # it was when predict was called, not as it is when the job runs.
        x = src.obj.copy()
        return ([([x[a:b]], [(a, b)]) for a, b in _ranges(src.n_rows, rows)], [],
                ("numpy", x))
    if src.kind == "files":
        return (_file_tasks(src.obj, src.keep_rows if rows is None else rows), [],
                ("files", src.obj))
    x = src.obj
    if rows is not None and not merge:
        x = x.rechunk({0: rows})
    sizes = x.chunks[0]
    if rows is None or any(s != s for s in sizes):
        groups = [[i] for i in range(len(sizes))]
    else:
        groups = _merged(sizes, rows, _holders(x))
    known = not any(s != s for s in sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)]) if known else None
    zeros = (0,) * (x.ndim - 1)
    tasks = [([(x.name, i) + zeros for i in g],
              [(int(starts[i]), int(starts[i + 1])) if known else None for i in g])
             for g in groups]
    return tasks, [x], ("array", x.name)


def _holders(x):
    """The worker holding each chunk of ``x`` when it is persisted on the
    current distributed client (so that joining chunks moves none), else
    None."""
    try:
        from distributed import futures_of, get_client
    except ImportError:
        return None
    from dask.core import flatten
    futures = futures_of(x)
    keys = list(flatten(x.__dask_keys__()))
    if not futures or not set(keys) <= {f.key for f in futures}:
        return None
    try:
        who = get_client().who_has(futures)
    except (ValueError, OSError):
        return None
    return [tuple(sorted(who.get(k) or ()))[:1] for k in keys]


def _file_tasks(files, rows):
    """Tasks reading ``rows`` rows each across ``files`` (one per file for None)."""
    if rows is None:
        tasks, start = [], 0
        for p, n in files:
            tasks.append(([_Rows(p, 0, n)], [(start, start + n)]))
            start += n
        return tasks
    total = sum(n for _, n in files)
    offsets = np.concatenate([[0], np.cumsum([n for _, n in files])])
    tasks = []
    for a, b in _ranges(total, rows):
        parts, part_rows = [], []
        for (p, n), lo in zip(files, offsets[:-1]):
            s, e = max(a, int(lo)), min(b, int(lo) + n)
            if s < e or (a == b == 0 and not parts):
                parts.append(_Rows(p, s - int(lo), e - int(lo)))
                part_rows.append((s, e))
        tasks.append((parts, part_rows))
    return tasks


def _predict_tasks(tasks, deps, identity, shipped, settings):
    """A dask array per output over ``tasks``: each task gets its input blocks,
    the model's key and the settings, and returns its rows' predictions."""
    import operator

    import dask.array as da
    from dask.base import tokenize
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph
    out_specs = settings.out_specs
    keyed = isinstance(shipped, Delayed)
    model = shipped.key if keyed else shipped
    name = "cyback-predict-" + tokenize(identity, [r for _, r in tasks], model, settings)
    single = len(out_specs) == 1
    fn = _task_one if single else _task_all
    tail0 = (0,) * len(out_specs[0][0]) if single else ()
    layer = {}
    lengths = []
    for g, (parts, part_rows) in enumerate(tasks):
        layer[(name, g) + tail0] = (fn, parts, model, settings, "chunk %d" % g, part_rows)
        known = all(r is not None for r in part_rows)
        lengths.append(sum(b - a for a, b in part_rows) if known else np.nan)
    graph = HighLevelGraph.from_collections(name, layer,
                                            dependencies=([shipped] if keyed else []) + list(deps))
    arrays = []
    for j, (tail, dtype) in enumerate(out_specs):
        chunks = (tuple(lengths),) + tuple((d,) for d in tail)
        meta = np.empty((0,) * (1 + len(tail)), dtype)
        if single:
            return da.Array(graph, name, chunks, dtype=dtype, meta=meta)
        out = "%s-%d" % (name, j)
        zeros = (0,) * len(tail)
        layers = dict(graph.layers)
        layers[out] = {(out, g) + zeros: (operator.getitem, (name, g), j)
                       for g in range(len(tasks))}
        dependencies = dict(graph.dependencies)
        dependencies[out] = {name}
        arrays.append(da.Array(HighLevelGraph(layers, dependencies), out, chunks, dtype=dtype,
                               meta=meta))
    return arrays


def _input_spec(runner, src, what):
    tail = runner.input_shape[1:]
    dtype = np.dtype(runner.input_dtype)
    got = src.tail
    if len(got) != len(tail) or any(d is not None and d != g for d, g in zip(tail, got)):
        kind = "%d columns per row" % got[0] if src.kind in ("frame", "pandas") else \
            "samples of shape %s" % (got,)
        raise ValueError("%s: the %s takes samples of shape %s; the data has %s"
                         % (_API, what, _shape_str(tail), kind))
    return tuple(tail), dtype


def _output_specs(runner, in_tail, in_dtype, src, batch_size):
    """(shape past the batch axis, dtype) of each output; a model whose static
    shapes leave sizes open is run on one row of zeros here to learn them."""
    specs = [(tuple(o.shape[1:]), np.dtype(o.dtype)) for o in runner.outputs]
    if all(d is not None for tail, _ in specs for d in tail):
        return specs
    probe = np.zeros((1,) + tuple(g if d is None else d for d, g in zip(in_tail, src.tail)),
                     in_dtype)
    values = runner.run_batch(probe)
    return [(v.shape[1:], np.dtype(d)) for v, (_, d) in zip(values, specs)]


def _predict_frame(frame, shipped, settings, output_columns):
    import pandas as pd
    out_specs = settings.out_specs
    if len(out_specs) != 1 or len(out_specs[0][0]) > 1:
        raise ValueError("%s: DataFrame data gives a DataFrame of predictions, which needs one "
                         "output of at most one axis per row; the model's outputs have shapes "
                         "%s (pass frame.to_dask_array(lengths=True) instead)"
                         % (_API, [_shape_str(t) for t, _ in out_specs]))
    tail, dtype = out_specs[0]
    width = tail[0] if tail else 1
    names = list(output_columns) if output_columns is not None else list(range(width))
    if len(names) != width:
        raise ValueError("%s: output_columns names %d columns; the model predicts %d per row"
                         % (_API, len(names), width))
    meta = pd.DataFrame({n: np.empty(0, dtype) for n in names})
    return frame.map_partitions(_frame_partition, shipped, settings, names, meta=meta)


# ----------------------------------------------------------------- save

def _write_npy(block, path):
    np.save(path, np.asarray(block))
    return path


def save(predictions, directory, compute=True):
    """Write a dask array of predictions as one ``part-NNNNN.npy`` per chunk
    in ``directory`` (on a cluster: storage every worker sees), each written
    by the worker that computed it. Returns the paths (sorted, so that
    ``from_npy_files(paths)`` reads the rows back in order), or with
    ``compute=False`` a dask Delayed of them."""
    dask = _dask()
    import dask.array as da
    if isinstance(predictions, (list, tuple)):
        raise TypeError("cyback.dask.save: give one array (for a model of several outputs, "
                        "save each in its own directory)")
    if not isinstance(predictions, da.Array):
        raise TypeError("cyback.dask.save: expected a dask array, got %r (a dask DataFrame "
                        "has to_parquet/to_csv)" % type(predictions).__name__)
    if predictions.ndim == 0:
        raise ValueError("cyback.dask.save: expected rows of predictions, got a scalar")
    if any(len(c) > 1 for c in predictions.chunks[1:]):
        predictions = predictions.rechunk({i: -1 for i in range(1, predictions.ndim)})
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    blocks = predictions.to_delayed().ravel()
    writes = [dask.delayed(_write_npy, pure=True)(b, os.path.join(directory, "part-%05d.npy" % i))
              for i, b in enumerate(blocks)]
    paths = dask.delayed(list, pure=True)(writes)
    return paths.compute() if compute else paths
