"""What ``predict`` reads: dask arrays, dask and pandas DataFrames, NumPy
arrays and ``.npy`` files (``_Data``, ``_data_source``); rows of ``.npy``
files read by the task that predicts them (``_Rows``, ``_file_tasks``);
and ``from_npy_files``, a dask array over such files."""
import collections
import os

import numpy as np

from cyback.dask.common import _API, _dask, _Opaque
from cyback.dask.task_size import _ranges


class _Rows(_Opaque):
    """Rows ``start:stop`` of a ``.npy`` file, read (memory-mapped, copy on
    write: the pages come from the page cache and the array is writable) by
    the task that predicts them."""

    __slots__ = ("path", "start", "stop")

    def __init__(self, path, start, stop):
        self.path, self.start, self.stop = path, start, stop

    def read(self):
        return np.asarray(np.load(self.path, mmap_mode="c")[self.start:self.stop])



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
