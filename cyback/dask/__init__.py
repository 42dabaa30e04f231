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

Where things live (each module's docstring says more):

- ``jobs``: ``predict`` and ``save``, the entry points that build a job;
- ``model``: what travels to the workers (``_Model``) and runs a task's
  rows (``_Runner``); ``model_cache``: each process's loaded models and the
  counts of ``cache_info()``;
- ``resources``: the process's cores, each task's cyback thread count, a
  worker's allocator setting (cyback/kernels/memory.py's worker policy),
  and ``SCORING_CONFIG``;
- ``data``: the data sources, and ``from_npy_files``;
- ``task_size``: rows per task (``chunk_rows="auto"``);
- ``task_graph``: the Dask graph of a job; ``worker_tasks``: the functions
  its tasks run;
- ``common``: the error prefix, importing dask, shapes in messages.

This package imports dask only when called: ``import cyback.dask`` works
without it, and the functions say how to install it.
"""
from cyback.dask.data import _read_rows, _Rows, from_npy_files
from cyback.dask.jobs import _write_npy, predict, save
from cyback.dask.model import _Model
from cyback.dask.model_cache import cache_info, clear_cache
from cyback.dask.resources import (
    SCORING_CONFIG,
    _cores,  # noqa: F401  (benchmarks/bench_dask.py)
)
from cyback.dask.worker_tasks import _frame_partition, _Settings, _task_all, _task_one

__all__ = ["predict", "save", "from_npy_files", "cache_info", "clear_cache", "SCORING_CONFIG"]

# What a Dask graph of this package carries, which Dask pickles by name to
# ship it to the workers: the functions its tasks call and the objects they
# take. Their names stay cyback.dask.<name> whatever module defines them, so
# that pickles naming them there load, and new pickles name them there too.
_PICKLED = (_Model, _Settings, _Rows, _task_one, _task_all, _frame_partition, _read_rows,
            _write_npy)
for _obj in _PICKLED:
    _obj.__module__ = __name__
del _obj
