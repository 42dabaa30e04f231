"""The Dask graph of a predict job: the tasks over the data (``_tasks``:
slices of a NumPy array, rows of files, a dask array's chunks, joined where
they are small), and the dask array (``_predict_tasks``) or DataFrame
(``_predict_frame``) of predictions whose tasks run them."""
import numpy as np

from cyback.dask.common import _API, _shape_str
from cyback.dask.data import _file_tasks
from cyback.dask.task_size import _merged, _ranges
from cyback.dask.worker_tasks import _frame_partition, _task_all, _task_one


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
