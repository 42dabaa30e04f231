"""How the C allocator treats the large arrays a plan allocates and frees.

A compiled function allocates its intermediate arrays afresh at every call
and frees them when their last reader is done. With glibc's defaults, blocks
of a few MB are mapped from the kernel and unmapped again on free (or the
heap top is trimmed), so every call page-faults its working set back in: the
kernel zeroes each page on first touch, a large share of a batch-32 call of a
convolutional network (docs/performance.md, "Memory").

``keep_freed_memory()`` sets glibc's mmap threshold to its maximum (32 MiB:
smaller blocks come from the heap) and its trim threshold to 256 MiB (up to
that much free memory stays mapped for the next call), which is what caching
allocators of other ML runtimes do. Blocks above 32 MiB, which glibc maps
afresh whatever its thresholds, are kept by ``kernels/large_blocks.pyx``
while a compiled function runs (``LARGE_BLOCK_BUDGET``, 512 MiB). The price
is memory: after a peak, up to 256 MiB plus that budget is kept rather than
returned. ``CYBACK_MALLOC=system`` keeps
glibc's defaults, and so does any glibc malloc setting of the user's own
(``GLIBC_TUNABLES`` with a ``glibc.malloc.`` tunable, ``MALLOC_*_``
variables). Other C libraries are left alone.

``set_thresholds(mmap_threshold, trim_threshold)`` is the one place that
calls ``mallopt``. Two policies use it:

- a plain process (``keep_freed_memory``, at ``import cyback``): 32 MiB and
  ``TRIM_THRESHOLD`` (256 MiB);
- a Dask worker (``cyback.dask``, on its first chunk): 32 MiB and
  ``WORKER_TRIM_THRESHOLD`` (64 MiB). Dask's nanny starts its workers with
  ``MALLOC_TRIM_THRESHOLD_=65536``, a malloc setting ``keep_freed_memory``
  leaves alone, which also pins the mmap threshold at 128 KiB, so every
  intermediate array is mapped afresh and page-faulted in again; the mmap
  threshold is raised for the same reason as in a plain process. The trim
  threshold stays lower because the nanny watches the worker's resident
  memory against its memory limit (pausing, spilling and restarting on it)
  and several workers share a host: free heap kept for reuse counts there
  as memory the worker holds.
"""
import ctypes
import os

from cyback.kernels import settings as _registry

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20       # glibc's largest accepted value on 64-bit
TRIM_THRESHOLD = 256 << 20
LARGE_BLOCK_BUDGET = 512 << 20  # blocks above MMAP_THRESHOLD kept by kernels/large_blocks.pyx
WORKER_TRIM_THRESHOLD = 64 << 20    # a Dask worker's (the docstring above says why)

_applied = None


def _glibc():
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError, AttributeError):
        return False


def _user_chose(environ):
    if _registry.get("CYBACK_MALLOC", environ) == "system":
        return True
    if "glibc.malloc." in (_registry.raw("GLIBC_TUNABLES", environ) or ""):
        return True
    return bool(_registry.matching("MALLOC_*_", environ))


def set_thresholds(mmap_threshold, trim_threshold):
    """Set glibc's mmap and trim thresholds (bytes) for this process; returns
    whether glibc took both (False off glibc). No check of the user's own
    settings: that is the caller's policy."""
    if not _glibc():
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and \
            bool(libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    except (OSError, AttributeError):
        return False


def keep_freed_memory(environ=os.environ):
    """Apply the plain process's settings above once per process; returns
    whether they are in force (False: not glibc, or the user chose
    otherwise)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if _glibc() and not _user_chose(environ):
        _applied = set_thresholds(MMAP_THRESHOLD, TRIM_THRESHOLD)
        if _applied:
            # what glibc maps afresh whatever its thresholds: kept by cyback instead
            from cyback.kernels import large_blocks
            large_blocks.configure(MMAP_THRESHOLD, LARGE_BLOCK_BUDGET)
    return _applied


def settings():
    """What this process runs with, for reports: 'kept' or 'system'."""
    return "kept" if _applied else "system"
