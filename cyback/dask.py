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
NumPy array or a list of ``.npy`` files. Rows are samples: the result is split
into the chunks of ``data`` along its first axis and each chunk into batches
of ``batch_size``.

How it runs (see docs/dask.md):

- the model travels once: its bytes (an in-memory HDF5 save, or the pickled
  function) are one key of the task graph, which each worker fetches once;
- each process loads it once, on its first chunk, and keeps it in a cache
  keyed by a digest of those bytes (``cache_info()`` counts the loads);
- on a distributed worker, cyback's kernels run on the worker's share of the
  host's cores (cores // the host's total Dask threads), and in dask's local
  thread pool on cores // its size, so that tasks never oversubscribe the
  machine;
- a chunk whose shape does not fit the model, or that holds NaN under
  ``nan_policy="raise"``, fails with an error naming the chunk and its rows.
  A worker that dies is Dask's business: its tasks are recomputed elsewhere,
  and since prediction is deterministic the result is the same.

This module imports dask only when called: ``import cyback.dask`` works
without it, and the functions say how to install it.
"""
import collections
import os
import threading
import time

import numpy as np

__all__ = ["predict", "save", "from_npy_files", "cache_info", "clear_cache"]

_API = "cyback.dask.predict"
_NAN_POLICIES = ("allow", "raise")
_CACHE_SIZE = 4


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
            from cyback.graph.pickling import load_keras_model
            return _Runner(load_keras_model(self.data, self.custom_objects or None,
                                            compile=False))
        import cloudpickle
        return _Runner(cloudpickle.loads(self.data))


class _Runner(object):
    """A loaded model: ``runner(x, batch_size)`` → one array per output."""

    def __init__(self, model):
        from cyback import config
        from cyback.graph.function import Function
        self.model = model
        self.is_function = isinstance(model, Function)
        if self.is_function:
            lp = config.learning_phase_placeholder()
            self.feeds = [x for x in model.inputs if x is not lp]
            self.lp_index = next((i for i, x in enumerate(model.inputs) if x is lp), None)
            self.input_shape = tuple(self.feeds[0].shape) if len(self.feeds) == 1 else None
            self.input_dtype = self.feeds[0].dtype if self.feeds else None
            self.n_outputs = len(model.outputs)
        else:
            # Built here, once, not by the first of several threads at once.
            model._make_predict_function()
            inputs = model.inputs
            self.feeds = list(inputs)
            self.input_shape = tuple(model.input_shape) if len(inputs) == 1 else None
            self.input_dtype = inputs[0].dtype if len(inputs) == 1 else None
            self.n_outputs = len(model.outputs)

    def check(self, what):
        if len(self.feeds) != 1:
            raise ValueError("%s: the %s has %d inputs; predict takes models of one input"
                             % (_API, what, len(self.feeds)))
        scalars = [i for i, o in enumerate(self.model.outputs) if len(o.shape) == 0]
        if scalars:
            raise ValueError("%s: output %d of the %s is a scalar; predict needs one row of "
                             "output per row of input" % (_API, scalars[0], what))
        if self.is_function and self.model._updates:
            raise ValueError("%s: the function has updates, which would change its variables "
                             "on each worker apart; compile one without updates" % _API)

    def __call__(self, x, batch_size):
        if not self.is_function:
            out = self.model.predict(x, batch_size=batch_size)
            return list(out) if isinstance(out, list) else [out]
        parts = []
        for start in range(0, len(x), batch_size):
            feeds = [x[start:start + batch_size]]
            if self.lp_index is not None:
                feeds.insert(self.lp_index, np.zeros((), bool))
            out = self.model(feeds)
            parts.append(out if isinstance(out, list) else [out])
        return [np.concatenate([np.asarray(p[i]) for p in parts]) for i in range(self.n_outputs)]


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
                data = f.read()
        except OSError as e:
            raise ValueError("%s: cannot read the model file %r: %s" % (_API, path, e)) from None
        from cyback.graph.pickling import load_keras_model
        try:
            local = load_keras_model(data, compile=False)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError("%s: %r is not a Keras HDF5 model file: %s"
                             % (_API, path, e)) from None
        return _Model("keras", data), _Runner(local), "model in %s" % path
    if hasattr(model, "predict") and hasattr(model, "outputs") and hasattr(model, "layers"):
        from cyback.graph.pickling import custom_objects_of, keras_model_bytes
        data = keras_model_bytes(model, include_optimizer=False)
        return _Model("keras", data, custom_objects_of(model)), _Runner(model), "model"
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
    if os.environ.get("CYBACK_NUM_THREADS"):
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
    intermediates in again. For a small CNN that is 2.6x the page faults and
    1.7x the CPU time of the same predict in a plain process. Buffers up to
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
    # OpenMP's thread count is per calling thread: set it in the task's.
    if n is not None:
        from cyback import config
        if config.get_num_threads() != n:
            config.set_num_threads(n)


# --------------------------------------------------------------- chunks

def _where(chunk, rows):
    """'chunk 3 (rows 300 to 399)': ``chunk`` is a label ('chunk 3', 'partition 3')."""
    if rows is None:
        return chunk
    return "%s (rows %d to %d)" % (chunk, rows[0], rows[1] - 1)


def _run_chunk(x, model, settings, chunk, rows):
    """Predict one chunk: every output, as a list."""
    batch_size, nan_policy, threads, host_threads, tune, in_tail, in_dtype, out_specs = settings
    x = np.asarray(x)
    if x.ndim != len(in_tail) + 1 or any(
            d is not None and d != s for d, s in zip(in_tail, x.shape[1:])):
        raise ValueError("%s: %s has shape %s; the model takes samples of shape %s"
                         % (_API, _where(chunk, rows), x.shape, _shape_str(in_tail)))
    if x.dtype != in_dtype:
        if x.dtype.kind not in "biuf":
            raise TypeError("%s: %s has dtype %s; the model takes %s"
                            % (_API, _where(chunk, rows), x.dtype, in_dtype))
        x = x.astype(in_dtype)
    if nan_policy == "raise" and x.dtype.kind == "f":
        _check_finite(x, chunk, rows, "input")
    seconds = 0.0
    if len(x) == 0:
        outs = [np.empty((0,) + tail, dtype) for tail, dtype in out_specs]
    else:
        _set_threads(_worker_threads(threads, host_threads))
        if tune and not _allocator["tuned"] and _on_worker():
            _tune_allocator()
        runner = _runner(model)
        start = time.perf_counter()
        outs = runner(x, batch_size)
        seconds = time.perf_counter() - start
        for i, o in enumerate(outs):
            if len(o) != len(x):
                raise ValueError("%s: for %s the model's output %d has %d rows, not one per "
                                 "input row (%d)" % (_API, _where(chunk, rows), i, len(o), len(x)))
    if nan_policy == "raise":
        for o in outs:
            if o.dtype.kind == "f":
                _check_finite(o, chunk, rows, "prediction")
    from cyback import config
    with _cache_lock:
        _stats["chunks"] += 1
        _stats["rows"] += len(x)
        _stats["seconds"] += seconds
        _stats["threads"] = config.get_num_threads()
    return [np.asarray(o, dtype) for o, (_, dtype) in zip(outs, out_specs)]


def _check_finite(a, chunk, rows, what):
    bad = np.isnan(a.reshape(len(a), -1)).any(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        at = "row %d" % (rows[0] + i) if rows else "its row %d" % i
        raise ValueError("%s: %s has NaN in its %s (first at %s); pass nan_policy='allow' to "
                         "predict anyway" % (_API, _where(chunk, rows), what, at))


def _shape_str(tail):
    return "(%s)" % ", ".join(["n"] + ["None" if d is None else str(d) for d in tail])


def _array_block(block, model, settings, block_info=None):
    chunk, rows = "a chunk", None
    if block_info:
        info = block_info[0]
        chunk = "chunk %d" % info["chunk-location"][0]
        rows = info["array-location"][0]
        rows = None if any(r != r for r in rows) else tuple(int(r) for r in rows)
    return _run_chunk(block, model, settings, chunk, rows)[0]


def _array_block_all(block, model, settings, chunk, rows):
    return tuple(_run_chunk(block, model, settings, chunk, rows))


def _frame_partition(frame, model, settings, names, partition_info=None):
    import pandas as pd
    chunk = "partition %d" % partition_info["number"] if partition_info else "a partition"
    out = _run_chunk(frame.to_numpy(), model, settings, chunk, None)[0]
    return pd.DataFrame(out.reshape(len(out), -1), index=frame.index, columns=names)


# ---------------------------------------------------------------- data

def from_npy_files(paths, chunk_rows=None):
    """A dask array over ``.npy`` files (stacked along the first axis), read
    lazily by the workers (which must see the same paths). Each file is a
    chunk, split into ``chunk_rows`` rows when given."""
    dask = _dask()
    import dask.array as da
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("from_npy_files: no files given")
    parts, tail, dtype = [], None, None
    for p in paths:
        try:
            head = np.load(p, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise ValueError("from_npy_files: cannot read %r: %s" % (p, e)) from None
        if head.ndim == 0:
            raise ValueError("from_npy_files: %r holds a scalar, not rows of samples" % p)
        if tail is None:
            tail, dtype = head.shape[1:], head.dtype
        elif head.shape[1:] != tail or head.dtype != dtype:
            raise ValueError("from_npy_files: %r holds %s rows of dtype %s; %r holds %s of %s"
                             % (p, head.shape[1:], head.dtype, paths[0], tail, dtype))
        load = dask.delayed(np.load, pure=True)(p)
        parts.append(da.from_delayed(load, shape=head.shape, dtype=dtype))
        del head
    x = da.concatenate(parts, axis=0)
    if chunk_rows is not None:
        x = x.rechunk({0: int(chunk_rows)})
    return x


def _is_dask_frame(data):
    try:
        import dask.dataframe as dd
    except ImportError:
        return False
    return isinstance(data, dd.DataFrame)


def _as_collection(data, columns, chunk_rows):
    """A dask array (rows first, one chunk across the other axes) or a dask
    DataFrame of the selected columns."""
    import dask.array as da
    is_pandas = type(data).__module__.startswith("pandas") and hasattr(data, "columns")
    if _is_dask_frame(data) or is_pandas:
        if columns is not None:
            missing = [c for c in columns if c not in data.columns]
            if missing:
                raise ValueError("%s: columns %s are not in the data (it has %s)"
                                 % (_API, missing, list(data.columns)))
            data = data[list(columns)]
        if is_pandas:
            import dask.dataframe as dd
            data = dd.from_pandas(data, chunksize=chunk_rows)
        return data
    if columns is not None:
        raise ValueError("%s: columns selects DataFrame columns; the data is a %s"
                         % (_API, type(data).__name__))
    if isinstance(data, (list, tuple)) and data and all(
            isinstance(p, (str, os.PathLike)) for p in data):
        x = from_npy_files(data)
    elif isinstance(data, da.Array):
        x = data
    elif isinstance(data, np.ndarray):
        x = da.from_array(data, chunks=(chunk_rows,) + data.shape[1:])
    else:
        raise TypeError("%s: data must be a dask array, a dask or pandas DataFrame, a NumPy "
                        "array or a list of .npy paths, got %r" % (_API, type(data).__name__))
    if x.ndim == 0:
        raise ValueError("%s: data is a scalar; expected rows of samples" % _API)
    if any(len(c) > 1 for c in x.chunks[1:]):
        x = x.rechunk({i: -1 for i in range(1, x.ndim)})
    return x


# -------------------------------------------------------------- predict

def predict(model, data, batch_size=32, columns=None, nan_policy="allow", threads="auto",
            chunk_rows=None, output_columns=None, tune_allocator=True):
    """Lazy predictions of ``model`` over ``data`` (see the module docstring).

    batch_size: rows per call of the model within a chunk.
    columns: the DataFrame columns that are the model's features, in order.
    nan_policy: "allow" (NaN flows through, as in ``model.predict``) or
        "raise" (a chunk with NaN in its input or its predictions fails,
        naming the chunk and the first bad row).
    threads: cyback threads per task: "auto" (on a distributed worker, its
        share of the host's cores; in dask's local thread pool, cores //
        its size; on the synchronous scheduler left as set), or an int.
    chunk_rows: rows per chunk when ``data`` is a NumPy array or a pandas
        DataFrame (default: 16 batches).
    output_columns: names of the result's columns for DataFrame data.
    tune_allocator: on distributed workers, undo the malloc setting Dask's
        nanny imposes, which makes every large intermediate page-fault
        afresh (see ``_tune_allocator``); False leaves the worker as it is.

    Returns a dask array with ``data``'s row chunks (a list of them for a
    model of several outputs), or for DataFrame data a dask DataFrame with its
    index and partitions. Nothing runs until it is computed or saved.
    """
    _dask()
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
        chunk_rows = 16 * int(batch_size)
    elif isinstance(chunk_rows, bool) or not isinstance(chunk_rows, (int, np.integer)) or \
            chunk_rows < 1:
        raise ValueError("%s: chunk_rows must be a positive integer, got %r" % (_API, chunk_rows))
    if columns is not None:
        columns = [columns] if isinstance(columns, str) else list(columns)
    source, runner, what = _model_source(model)
    runner.check(what)
    data = _as_collection(data, columns, int(chunk_rows))
    frame = _is_dask_frame(data)
    n_features = len(data.columns) if frame else None
    in_tail, in_dtype = _input_spec(runner, data, frame, what)
    out_specs = _output_specs(runner, in_tail, in_dtype, data, frame, batch_size)
    settings = (int(batch_size), nan_policy, threads if threads == "auto" else int(threads),
                _host_threads() if threads == "auto" else {}, bool(tune_allocator), in_tail,
                in_dtype, out_specs)
    dask = _dask()
    shipped = dask.delayed(source, pure=True, traverse=False)
    if frame:
        return _predict_frame(data, shipped, settings, out_specs, output_columns, n_features)
    if len(out_specs) == 1:
        tail, dtype = out_specs[0]
        drop = tuple(range(1 + len(tail), data.ndim))
        new = tuple(range(data.ndim, 1 + len(tail)))
        return data.map_blocks(
            _array_block, shipped, settings, dtype=dtype, token="cyback-predict",
            chunks=(data.chunks[0],) + tail, drop_axis=drop, new_axis=new,
            meta=np.empty((0,) * (1 + len(tail)), dtype))
    return _predict_multi(data, shipped, settings, out_specs)


def _input_spec(runner, data, frame, what):
    tail = runner.input_shape[1:]
    dtype = np.dtype(runner.input_dtype)
    got = (len(data.columns),) if frame else tuple(data.shape[1:])
    if len(got) != len(tail) or any(d is not None and d != g for d, g in zip(tail, got)):
        kind = "%d columns per row" % got[0] if frame else "samples of shape %s" % (got,)
        raise ValueError("%s: the %s takes samples of shape %s; the data has %s"
                         % (_API, what, _shape_str(tail), kind))
    return tuple(tail), dtype


def _output_specs(runner, in_tail, in_dtype, data, frame, batch_size):
    """(shape past the batch axis, dtype) of each output; a model whose static
    shapes leave sizes open is run on one row of zeros here to learn them."""
    outs = runner.model.outputs
    specs = [(tuple(o.shape[1:]), np.dtype(o.dtype)) for o in outs]
    if all(d is not None for tail, _ in specs for d in tail):
        return specs
    got = (len(data.columns),) if frame else tuple(data.shape[1:])
    probe = np.zeros((1,) + tuple(g if d is None else d for d, g in zip(in_tail, got)), in_dtype)
    values = runner(probe, batch_size)
    return [(v.shape[1:], np.dtype(d)) for v, (_, d) in zip(values, specs)]


def _predict_multi(x, shipped, settings, out_specs):
    dask = _dask()
    import dask.array as da
    blocks = x.to_delayed().ravel()
    starts = np.concatenate([[0], np.cumsum(x.chunks[0])])
    per_output = [[] for _ in out_specs]
    for i, block in enumerate(blocks):
        n = x.chunks[0][i]
        rows = None if n != n else (int(starts[i]), int(starts[i + 1]))
        outs = dask.delayed(_array_block_all, pure=True, nout=len(out_specs))(
            block, shipped, settings, "chunk %d" % i, rows)
        for j, (tail, dtype) in enumerate(out_specs):
            per_output[j].append(da.from_delayed(outs[j], shape=(n,) + tail, dtype=dtype))
    return [da.concatenate(parts, axis=0) for parts in per_output]


def _predict_frame(frame, shipped, settings, out_specs, output_columns, n_features):
    import pandas as pd
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
