"""The cores and memory a task runs with: the process's CPUs, the cluster's
Dask threads per host, each task thread's cyback thread count, the glibc
allocator setting of a distributed worker, and ``SCORING_CONFIG`` (the Dask
settings that keep Dask's own monitoring off the workers' cores)."""
import threading

from cyback.kernels import memory, settings

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


_allocator = {"tuned": False}


def _tune_allocator():
    """Let glibc keep freed memory for reuse in this worker process.

    Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which
    also fixes glibc's mmap threshold at 128 KiB: every array above that is
    mapped fresh and unmapped when freed, so each batch page-faults all its
    intermediates in again, and a small CNN's predict costs far more CPU
    time than in a plain process (docs/dask.md). Buffers up to
    32 MiB are served from the heap again and up to 64 MiB of free heap is
    kept: the worker's policy of cyback/kernels/memory.py, which says why it
    keeps less than a plain process. Once per process, on distributed
    workers on glibc only.
    """
    if _allocator["tuned"]:
        return
    _allocator["tuned"] = True
    memory.set_thresholds(memory.MMAP_THRESHOLD, memory.WORKER_TRIM_THRESHOLD)


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
