"""Control of the BLAS thread pools.

Two OpenBLAS libraries do cyback's matrix products: SciPy's (the kernels call
it through ``scipy.linalg.cython_blas``) and NumPy's (``np.dot`` in the ops).
``set_blas_threads`` sets both, so ``K.set_num_threads(1)`` really means one
thread.

The kernels either run one large GEMM on BLAS's threads or many small GEMMs on
OpenMP threads; running both pools at once oversubscribes the cores, so the
OpenMP-over-batch paths hold BLAS at one thread while they run.
"""
import contextlib
import ctypes
import glob
import os
import threading

_lock = threading.Lock()
_libs = None          # [(path, set, get, config)] for every OpenBLAS found
_set_local = None     # NumPy's per-thread setter: set(n) -> previous n

# (set, get, config) symbol names across OpenBLAS builds: SciPy's own, the
# 64-bit-integer build NumPy ships, and a plain OpenBLAS.
_NAMES = [("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads",
           "scipy_openblas_get_config"),
          ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_",
           "scipy_openblas_get_config64_"),
          ("openblas_set_num_threads", "openblas_get_num_threads", "openblas_get_config")]


def _open(path):
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for set_name, get_name, cfg_name in _NAMES:
        if hasattr(lib, set_name) and hasattr(lib, get_name):
            setter, getter = getattr(lib, set_name), getattr(lib, get_name)
            setter.argtypes, setter.restype = [ctypes.c_int], None
            getter.argtypes, getter.restype = [], ctypes.c_int
            config = getattr(lib, cfg_name, None)
            if config is not None:
                config.restype = ctypes.c_char_p
            return lib, setter, getter, config
    return None


def _load():
    global _libs, _set_local
    if _libs is not None:
        return
    import numpy
    import scipy
    import scipy.linalg  # noqa: F401  (loads SciPy's BLAS)

    found = []
    for package, sub in ((scipy, "scipy.libs"), (numpy, "numpy.libs")):
        root = os.path.join(os.path.dirname(package.__file__), os.pardir, sub)
        for path in sorted(glob.glob(os.path.join(root, "*openblas*"))):
            opened = _open(path)
            if opened is None:
                continue
            lib, setter, getter, config = opened
            found.append((path, setter, getter, config))
            if package is numpy and hasattr(lib, "openblas_set_num_threads_local"):
                local = lib.openblas_set_num_threads_local
                local.argtypes, local.restype = [ctypes.c_int], ctypes.c_int
                _set_local = local
    _libs = found


def blas_info():
    """Which BLAS libraries do the products, as a short string."""
    _load()
    if not _libs:
        return "scipy.linalg.cython_blas and numpy (thread control unavailable)"
    parts = []
    for path, _, _, config in _libs:
        cfg = config().decode() if config is not None else ""
        parts.append("%s %s" % (os.path.basename(path), cfg))
    return "; ".join(parts)


def get_blas_threads():
    """Threads of the kernels' BLAS (SciPy's OpenBLAS)."""
    _load()
    return _libs[0][2]() if _libs else 1


def set_blas_threads(n):
    """Set the thread count of every BLAS cyback uses."""
    _load()
    for _, setter, _, _ in _libs:
        setter(max(1, int(n)))


def numpy_local_threads():
    """NumPy's per-thread BLAS setter (``set(n) -> previous``), or None."""
    _load()
    return _set_local


class blas_threads:
    """Run the block with the kernels' BLAS limited to ``n`` threads.

    A class rather than a generator context, whose machinery took 1.7 us
    a call against 1.3 for this (2-core EPYC VM, BLAS already at ``n``);
    the kernels use blas_limit."""

    __slots__ = ("n", "old", "changed")

    def __init__(self, n):
        self.n = n
        self.changed = False

    def __enter__(self):
        if _libs is None:
            _load()
        if _libs:
            lib = _libs[0]
            with _lock:
                self.old = old = lib[2]()
                if old != self.n:
                    lib[1](self.n)
                    self.changed = True
        return self

    def __exit__(self, *exc):
        if self.changed:
            _libs[0][1](self.old)
            self.changed = False
        return False


class _SharedLimit:
    """BLAS held at ``n`` threads while any thread is inside: the first to
    enter saves the count and sets it, the last to leave puts it back (one
    context per thread, each restoring what it found, would let a thread
    that leaves first restore the count under another one's GEMMs)."""

    __slots__ = ("n", "inside", "saved")

    def __init__(self, n):
        self.n, self.inside, self.saved = n, 0, n

    def __enter__(self):
        with _lock:
            if self.inside == 0:
                self.saved = _libs[0][2]()
                if self.saved != self.n:
                    _libs[0][1](self.n)
            self.inside += 1
        return self

    def __exit__(self, *exc):
        with _lock:
            self.inside -= 1
            if self.inside == 0 and self.saved != self.n:
                _libs[0][1](self.saved)
        return False


_NO_BLAS = contextlib.nullcontext()
_shared = {}


def blas_limit(n):
    """The kernels' context holding their BLAS at ``n`` threads, shared by
    all threads that use it. Every convolution above the team's cutoff
    enters it: 0.9 us a call where a generator context took 1.7, and
    after a long kernel call (the interpreter's caches cold) the Python
    between two 1x1 regions went from 35-47 us to 13-17 us, back inside
    libgomp's spin (2-core EPYC VM)."""
    if _libs is None:
        _load()
    if not _libs:
        return _NO_BLAS
    limit = _shared.get(n)
    # setdefault is atomic: threads that race here get one shared context
    return limit if limit is not None else _shared.setdefault(n, _SharedLimit(n))
