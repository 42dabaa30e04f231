"""Each process's loaded models: a model is loaded once per process, on its
first task, and kept, keyed by the digest of its bytes (the last
``_CACHE_SIZE`` of them); with the counts ``cache_info()`` reports."""
import collections
import threading

from cyback.dask.model import _CACHE_SIZE
from cyback.dask.resources import _allocator

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

