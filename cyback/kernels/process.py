"""What ``import cyback`` changes in the process outside cyback itself, in
one place.

``apply_process_settings()`` runs once, first thing in
``cyback/__init__.py``: before any kernel module loads libgomp, which reads
its environment once, when it is loaded. Its effects, and how to opt out:

1. **OpenMP's wait policy.** When neither ``OMP_WAIT_POLICY`` nor
   ``GOMP_SPINCOUNT`` is set, it sets ``OMP_WAIT_POLICY=PASSIVE`` and
   ``GOMP_SPINCOUNT=2000`` in ``os.environ``: idle team threads spin briefly
   and then sleep instead of taking a core from other work
   (``cpu_budget.set_openmp_environment`` says why). Child processes
   inherit the two variables. Opt out: set either variable yourself (any
   value) before importing cyback.
2. **Bad kernel settings removed.** A bad value of a setting the compiled
   kernels read themselves (``KERNEL_READ``: they ``getenv`` it, or Cython
   reads it at the module's import) is a ``ConfigWarning`` and is deleted
   from ``os.environ``, so that the kernels take their default instead of
   reading it in their own way (``atof`` takes 'abc' for 0). Good values
   are left as they are: give a good value to keep the variable.
3. **The allocator.** With glibc, the mmap threshold goes to 32 MiB and the
   trim threshold to 256 MiB (``mallopt``), so that the large arrays a
   compiled function frees stay in the process for its next call
   (``memory`` says why). Opt out: ``CYBACK_MALLOC=system``, or any glibc
   malloc setting of your own (``GLIBC_TUNABLES`` with a ``glibc.malloc.``
   tunable, a ``MALLOC_*_`` variable).

Later in the same import, not here because they need the compiled runtime,
``cyback.config._init_threads`` sets cyback's thread count and the BLAS
libraries' (NumPy's and SciPy's OpenBLAS, held at one thread unless
``CYBACK_BLAS_THREADS`` says otherwise) through those libraries' own
setters, not through the environment; and ``cyback._keras_compat.install``
restores the names old Keras releases use and puts its import hook on
``sys.meta_path`` (that module's docstring lists them). ``cyback.dask``
changes a Dask worker's allocator and a task thread's thread count when its
tasks run there (``cyback/dask/resources.py``). docs/threads.md, "What
importing cyback changes", says the same for users.
"""
import os

from cyback.kernels import cpu_budget, memory, settings

#: The settings the compiled kernels read themselves (getenv in the C
#: headers, or Cython at the module's import).
KERNEL_READ = ("CYBACK_PARALLEL_MIN_WORK", "CYBACK_TEAM_WARM_US", "CYBACK_JOIN_US",
               "CYBACK_WINOGRAD", "CYBACK_AVX512")

_applied = []


def remove_bad_kernel_settings(environ=None):
    """Effect 2 above; returns the names removed."""
    return settings.remove_bad(KERNEL_READ, environ)


def apply_process_settings(environ=None):
    """Apply the three effects above, once per process (later calls do
    nothing); ``environ`` is ``os.environ`` unless given."""
    if _applied:
        return
    _applied.append(True)
    environ = os.environ if environ is None else environ
    cpu_budget.set_openmp_environment(environ)
    remove_bad_kernel_settings(environ)
    memory.keep_freed_memory(environ)
