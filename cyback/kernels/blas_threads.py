"""Control of the BLAS thread pools, and which BLAS the kernels' float32
GEMMs call.

Two OpenBLAS libraries do cyback's matrix products: SciPy's (the kernels call
it through ``scipy.linalg.cython_blas``) and NumPy's (``np.dot`` in the ops).
``set_blas_threads`` sets both, so ``K.set_num_threads(1)`` really means one
thread.

The kernels' float32 GEMMs go to NumPy's OpenBLAS instead when it is the
newer of the two (``CYBACK_SGEMM``: ``auto``, ``scipy`` or ``numpy``): NumPy
and SciPy wheels ship different OpenBLAS releases, and newer ones are faster
on products with few rows (batch-1 1x1 convolutions, Dense layers), while
large products and float64 gain nothing, so float64 stays on SciPy's
(docs/performance.md, "The BLAS").

The kernels either run one large GEMM on BLAS's threads or many small GEMMs on
OpenMP threads; running both pools at once oversubscribes the cores, so the
OpenMP-over-batch paths hold BLAS at one thread while they run.
"""
import contextlib
import ctypes
import glob
import os
import re
import threading

from cyback.kernels import settings

_lock = threading.Lock()
_libs = None          # [(path, set, get, config)] for every OpenBLAS found
_set_local = None     # NumPy's per-thread setter: set(n) -> previous n
_held = []            # [(set, get)] of the libraries the kernels call (SciPy's first)
_sgemm_path = None    # the library of the kernels' float32 GEMMs when not SciPy's
_sgemm64 = {}         # {path: address} of the CBLAS 64-bit sgemm of each NumPy OpenBLAS

# CBLAS sgemm with 64-bit integers (runtime.cblas_sgemm64_t): NumPy's build
# and a plain 64-bit-integer OpenBLAS.
_SGEMM64_NAMES = ("scipy_cblas_sgemm64_", "cblas_sgemm64_")

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
        root = os.path.normpath(os.path.join(os.path.dirname(package.__file__), os.pardir, sub))
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
            if package is numpy:
                for name in _SGEMM64_NAMES:
                    if hasattr(lib, name):
                        _sgemm64[path] = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                        break
    _libs = found
    _route_sgemm(found, _sgemm64, sgemm_choice())


def sgemm_choice(environ=os.environ):
    """CYBACK_SGEMM: ``auto`` (the default), ``scipy`` or ``numpy``."""
    return settings.get("CYBACK_SGEMM", environ)


def _config_text(config):
    return config().decode() if config is not None else ""


def openblas_version(config):
    """(0, 3, 31, ...) from an OpenBLAS config string, () if it has none."""
    m = re.search(r"OpenBLAS (\d+(?:\.\d+)*)", config or "")
    return tuple(int(v) for v in m.group(1).split(".")) if m else ()


def _route_sgemm(found, sgemm64, choice):
    # SciPy's library comes first in `found` when there is one; NumPy's
    # takes the float32 GEMMs when asked for, or in `auto` when newer.
    global _sgemm_path
    from cyback.kernels import runtime

    scipy_lib = found[0] if found and found[0][0] not in sgemm64 else None
    numpy_lib = next((lib for lib in found if lib[0] in sgemm64), None)
    use = numpy_lib is not None and choice != "scipy"
    if use and choice == "auto" and scipy_lib is not None:
        versions = [openblas_version(_config_text(lib[3])) for lib in (scipy_lib, numpy_lib)]
        use = bool(versions[0]) and versions[1] > versions[0]
    _held[:] = [(lib[1], lib[2]) for lib in (scipy_lib, numpy_lib if use else None)
                if lib is not None]
    _sgemm_path = numpy_lib[0] if use else None
    runtime.set_kernel_sgemm64(sgemm64[numpy_lib[0]] if use else 0)


def sgemm_library():
    """The file of the OpenBLAS the kernels' float32 GEMMs call, or None
    for SciPy's (through scipy.linalg.cython_blas)."""
    _load()
    return _sgemm_path


def blas_info():
    """Which BLAS libraries do the products, as a short string."""
    _load()
    if not _libs:
        return "scipy.linalg.cython_blas and numpy (thread control unavailable)"
    parts = []
    for path, _, _, config in _libs:
        parts.append("%s %s" % (os.path.basename(path), _config_text(config)))
    where = "SciPy's" if _sgemm_path is None else os.path.basename(_sgemm_path)
    return "; ".join(parts) + "; the kernels' float32 GEMMs: %s" % where


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


def _hold(n):
    """Set the libraries the kernels call to ``n`` threads; what each had,
    None where it was at ``n`` already."""
    saved = []
    for setter, getter in _held:
        was = getter()
        saved.append(None if was == n else was)
        if was != n:
            setter(n)
    return saved


def _restore(saved):
    for (setter, _), was in zip(_held, saved):
        if was is not None:
            setter(was)


class blas_threads:
    """Run the block with the kernels' BLAS limited to ``n`` threads.

    A class rather than a generator context, whose machinery costs more
    per call; the kernels use blas_limit."""

    __slots__ = ("n", "saved")

    def __init__(self, n):
        self.n = n
        self.saved = None

    def __enter__(self):
        if _libs is None:
            _load()
        with _lock:
            self.saved = _hold(self.n)
        return self

    def __exit__(self, *exc):
        saved, self.saved = self.saved, None
        if saved is not None:
            with _lock:
                _restore(saved)
        return False


class _SharedLimit:
    """BLAS held at ``n`` threads while any thread is inside: the first to
    enter saves the counts and sets them, the last to leave puts them back
    (one context per thread, each restoring what it found, would let a
    thread that leaves first restore a count under another one's GEMMs)."""

    __slots__ = ("n", "inside", "saved")

    def __init__(self, n):
        self.n, self.inside, self.saved = n, 0, []

    def __enter__(self):
        with _lock:
            if self.inside == 0:
                self.saved = _hold(self.n)
            self.inside += 1
        return self

    def __exit__(self, *exc):
        with _lock:
            self.inside -= 1
            if self.inside == 0:
                _restore(self.saved)
        return False


_NO_BLAS = contextlib.nullcontext()
_shared = {}


def blas_limit(n):
    """The kernels' context holding their BLAS at ``n`` threads, shared by
    all threads that use it. Every convolution above the team's cutoff
    enters it, so it is kept cheap (a ctypes call reads each library's
    count; no generator context): the Python between two kernel regions
    must stay shorter than libgomp's spin, or the team falls asleep between
    them (docs/performance.md, "How idle threads wait")."""
    if _libs is None:
        _load()
    if not _libs:
        return _NO_BLAS
    limit = _shared.get(n)
    # setdefault is atomic: threads that race here get one shared context
    return limit if limit is not None else _shared.setdefault(n, _SharedLimit(n))
