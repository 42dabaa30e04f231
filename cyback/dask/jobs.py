"""The entry points that build a job: ``predict`` (arguments checked, the
model and data sources made, the task size chosen, the graph built) and
``save`` (one ``.npy`` per chunk, written by the worker that computed
it)."""
import os

import numpy as np

from cyback.dask.common import _API, _dask, _shape_str
from cyback.dask.data import _data_source
from cyback.dask.model import _model_source
from cyback.dask.resources import _host_threads
from cyback.dask.task_graph import _predict_frame, _predict_tasks, _tasks
from cyback.dask.task_size import _auto_rows, _seconds_per_row, _slots
from cyback.dask.worker_tasks import _Settings

_NAN_POLICIES = ("allow", "raise")
#: a model of at most this many bytes rides inside each task; a bigger one is
#: a key of its own, fetched once by each worker (a dependency costs the job a
#: round of scheduling and a transfer to each worker, more than shipping a
#: small model with every task)
_INLINE_BYTES = 1 << 20


def predict(model, data, batch_size=32, columns=None, nan_policy="allow", threads="auto",
            chunk_rows="auto", output_columns=None, tune_allocator=True):
    """Lazy predictions of ``model`` over ``data`` (see the docstring of cyback.dask).

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
