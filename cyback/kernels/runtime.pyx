"""Thread control for the OpenMP kernels, and the team policy they share
(``threads_for``, see include/cyback_team.h)."""
import os

from cython.parallel cimport parallel

from cyback.kernels._omp cimport (cb_get_num_threads, cb_get_thread_num, cb_openmp_enabled,
                                  cb_set_num_threads)


cdef extern from "cyback_tiles.h" nogil:
    double CB_TILES_JOIN_SECONDS


cdef extern from "cyback_team.h" nogil:
    double cb_team_warm_seconds
    double cb_team_min_work
    double cb_team_busy_margin
    double cb_team_busy_switches
    double cb_team_busy_factor
    int cb_team_host_busy_now()
    double cb_team_idle_seconds()
    int cb_team_forced
    int cb_team_size()
    void cb_team_set_size(int n)
    void cb_team_set_local(int n)
    int cb_team_get_local()
    int cb_team_threads_for(double work)
    int cb_team_parts(double work)
    void cb_team_done(int threads)
    void cb_team_forget()


cdef extern from "cyback_handoff.h" nogil:
    double cb_handoff_ns(long rounds)


cdef int threads_for(double work) noexcept nogil:
    """Threads for a parallel loop of about ``work`` work units
    (docs/configuration.md, CYBACK_PARALLEL_MIN_WORK): the whole team above the cutoff, or above a
    quarter of it while the team is still awake from its last region or in a
    dense run of such ops (include/cyback_team.h)."""
    return cb_team_threads_for(work)


cdef int team_size() noexcept nogil:
    """The process's thread count, applied to the calling thread: the number
    of parts a kernel splits its work into, whatever threads_for then gives
    it to run them, so that results never depend on the team's state."""
    return cb_team_size()


cdef int team_parts(double work) noexcept nogil:
    """The parts a kernel of about ``work`` splits into: 1 where the team is
    never taken for such work, else team_size(). Kernels whose result depends
    on how the work is split split it into team_parts pieces and run them on
    threads_for threads."""
    return cb_team_parts(work)


cdef void team_done(int threads) noexcept nogil:
    """A region on ``threads`` threads ended now (its team is awake)."""
    cb_team_done(threads)


cdef double _join_window = CB_TILES_JOIN_SECONDS


cdef double join_seconds() noexcept nogil:
    """The bound of the spin that ends a region starting now
    (include/cyback_tiles.h): the join window, or none while other processes
    take our cores, where the spinning thread would take time from the one
    it waits for."""
    return 0.0 if cb_team_host_busy_now() else _join_window


def openmp_enabled():
    """True when the kernels were built with OpenMP."""
    return bool(cb_openmp_enabled())


def get_max_threads():
    """The process's thread count (set_num_threads), as the calling thread
    sees it."""
    return cb_team_size()


# More threads than this is a mistake on any machine (and OpenMP would try to
# start them all at the next parallel region).
MAX_THREADS = 4096


def set_num_threads(n):
    """Threads for the OpenMP kernels: an integer from 1 to MAX_THREADS."""
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise ValueError("set_num_threads: expected an integer number of threads, got %r" % (n,))
    n = n.__index__()
    if not 1 <= n <= MAX_THREADS:
        raise ValueError("set_num_threads: expected an integer from 1 to %d, got %r"
                         % (MAX_THREADS, n))
    # for every Python thread, existing and new (include/cyback_team.h)
    cb_team_set_size(n)
    cb_set_num_threads(n)


def region_threads():
    """The threads a parallel region of the team's size runs on when the
    calling thread starts it (tests: the setting reaches every thread)."""
    cdef int got[1]
    cdef int nt = cb_team_size()
    got[0] = 1
    with nogil, parallel(num_threads=nt):
        if cb_get_thread_num() == 0:
            got[0] = cb_get_num_threads()
    return got[0]


def set_thread_local_threads(n):
    """Give the calling thread a thread count of its own (``n``), or put it
    back on the process's setting (None). For integrations that size each
    worker thread's share of the cores (cyback.dask); users set the
    process's count with set_num_threads."""
    if n is None:
        cb_team_set_local(0)
        return
    if isinstance(n, bool) or not hasattr(n, "__index__") or not 1 <= n <= MAX_THREADS:
        raise ValueError("set_thread_local_threads: expected None or an integer from 1 to %d, "
                         "got %r" % (MAX_THREADS, n))
    cb_team_set_local(n.__index__())


def get_thread_local_threads():
    """The calling thread's own count, or None when it follows the process's."""
    cdef int n = cb_team_get_local()
    return n if n > 0 else None


cdef double team_min_work() noexcept nogil:
    """The team's cutoff, in work units (docs/configuration.md)."""
    return cb_team_min_work


def parallel_min_work():
    """Work (in the kernels' work units, docs/configuration.md) below which
    kernels stay on the calling thread."""
    return cb_team_min_work


def set_parallel_min_work(work):
    """Set the cutoff (cyback.config passes CYBACK_PARALLEL_MIN_WORK on at
    import; tests set 0 so that every parallel path runs)."""
    if isinstance(work, bool) or not isinstance(work, (int, float)) or \
            not (0 <= work < float("inf")):
        raise ValueError("set_parallel_min_work: expected a finite non-negative number, got %r"
                         % (work,))
    global cb_team_min_work
    cb_team_min_work = float(work)


def team_threads(work):
    """The threads a kernel would use now for ``work`` (and, like a kernel,
    count a team it chooses as awake)."""
    return threads_for(float(work))


def force_team_threads(threads):
    """Tests: run every region on at most ``threads`` threads (1: as if the
    team were always asleep), or leave it to the policy (None). Results must
    not change: kernels split their work by team_size, not by this."""
    global cb_team_forced
    if threads is None:
        cb_team_forced = 0
    elif isinstance(threads, bool) or not hasattr(threads, "__index__") or threads < 1:
        raise ValueError("force_team_threads: expected None or a positive integer, got %r"
                         % (threads,))
    else:
        cb_team_forced = threads.__index__()


def team_rest():
    """Forget that this thread's team ran and what the host looked like (tests:
    the next call sees the team cold and samples the host afresh)."""
    cb_team_forget()


def host_busy():
    """Whether other processes take this one's cores: over the last two
    sample windows the CPUs of the affinity mask that were idle or ran this
    process fell short of the team by more than set_busy_margin (without
    /proc/stat: the process was preempted more often than set_busy_rate).
    The team then takes only work from set_busy_work_factor times the
    cutoff."""
    return bool(cb_team_host_busy_now())


def idle_cpu_seconds():
    """Idle seconds since boot of the CPUs in the calling thread's affinity
    mask (what host_busy samples), or None where /proc/stat does not say."""
    cdef double d = cb_team_idle_seconds()
    return None if d < 0 else d


def set_busy_work_factor(factor):
    """While the host is busy only work from ``factor`` times the cutoff takes
    the team (tests and benchmarks; the default is 16, 1 gives the cutoff)."""
    global cb_team_busy_factor
    cb_team_busy_factor = max(0.0, float(factor))


def set_busy_margin(cpus):
    """How many CPUs short of the team the idle and own CPUs of a sample
    window may fall before the host counts as busy (tests; the default is
    0.5; a large negative margin makes every window busy, a large one
    none)."""
    global cb_team_busy_margin
    cb_team_busy_margin = float(cpus)


def set_busy_rate(switches_per_second):
    """The preemption rate above which the host counts as busy where there
    is no /proc/stat (tests; the default is 150 a second)."""
    global cb_team_busy_switches
    cb_team_busy_switches = float(switches_per_second)


def force_host_busy(state):
    """Tests and benchmarks: every sample window from now on counts as busy
    (True), none does (False), or the default bounds judge (None)."""
    if state is None:
        set_busy_margin(0.5)
        set_busy_rate(150.0)
    else:
        set_busy_margin(-1e12 if state else 1e12)
        set_busy_rate(-1.0 if state else 1e12)


#: Seconds one round of libgomp's idle spin takes at the least (a pause
#: instruction, tens of nanoseconds on x86 CPUs; this is below them all): the
#: warm window errs short, where a cold team is taken for cold.
SPIN_ROUND_SECONDS = 15e-9
_SUFFIXES = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def spin_rounds(environ=os.environ):
    """Rounds libgomp's idle threads spin before they sleep, from the same
    settings libgomp reads (GOMP_SPINCOUNT over OMP_WAIT_POLICY); None for
    'forever'."""
    count = environ.get("GOMP_SPINCOUNT", "").strip().lower()
    if count:
        if count in ("infinite", "infinity"):
            return None
        scale = _SUFFIXES.get(count[-1])
        try:
            return max(0.0, float(count[:-1]) * scale if scale else float(count))
        except ValueError:
            pass        # libgomp ignores a malformed value too
    policy = environ.get("OMP_WAIT_POLICY", "").strip().lower()
    if policy == "active":
        return None
    if policy == "passive":
        return 0.0
    return 3e5


def _env_window(environ, name):
    """Seconds (0 to 1) from the microseconds in environment variable
    `name`, or None when it is unset or malformed (config raises on a bad
    value)."""
    try:
        return min(1.0, max(0.0, float(environ[name]) * 1e-6))
    except (KeyError, ValueError):
        return None


def warm_window(environ=os.environ):
    """Seconds after a region during which the team counts as awake (at most
    1): CYBACK_TEAM_WARM_US when set (0 turns the warm and dense-run rules
    off: only work above the cutoff takes the team), else libgomp's spin."""
    seconds = _env_window(environ, "CYBACK_TEAM_WARM_US")
    if seconds is not None:
        return seconds
    rounds = spin_rounds(environ)
    return 1.0 if rounds is None else min(1.0, rounds * SPIN_ROUND_SECONDS)


def set_warm_window(seconds):
    """Set the warm window (tests; 0 turns the warm cutoff off)."""
    global cb_team_warm_seconds
    cb_team_warm_seconds = max(0.0, float(seconds))


def get_warm_window():
    return cb_team_warm_seconds


set_warm_window(warm_window())


def join_window(environ=os.environ):
    """Seconds a thread done with its part of a region spins for the others
    before libgomp's barrier takes over (include/cyback_tiles.h; at most 1):
    CYBACK_JOIN_US when set (0 leaves every wait to libgomp), else 300 us."""
    seconds = _env_window(environ, "CYBACK_JOIN_US")
    return CB_TILES_JOIN_SECONDS if seconds is None else seconds


def set_join_window(seconds):
    """Set the join window (tests and benchmarks; 0 turns the spin off)."""
    global _join_window
    _join_window = min(1.0, max(0.0, float(seconds)))


def get_join_window():
    return _join_window


set_join_window(join_window())


# ---------------------------------------------------------------- the kernels' sgemm

cdef cblas_sgemm64_t _sgemm64 = NULL


cdef cblas_sgemm64_t kernel_sgemm64() noexcept nogil:
    """The CBLAS sgemm the kernels' float32 products go to, or NULL for
    SciPy's Fortran one (kernels/blas_threads.py chooses)."""
    return _sgemm64


def set_kernel_sgemm64(size_t address):
    """Send the kernels' float32 GEMMs to the CBLAS row-major sgemm with
    64-bit integers at ``address`` (0: back to SciPy's). Only
    kernels/blas_threads.py calls this, with a function it found by name in
    an OpenBLAS whose thread count it also holds."""
    global _sgemm64
    _sgemm64 = <cblas_sgemm64_t><void*>address


def kernel_sgemm64_address():
    """The address set_kernel_sgemm64 installed (0: SciPy's sgemm)."""
    return <size_t><void*>_sgemm64


def handoff_ns(rounds=2000):
    """The mean time, in nanoseconds, a cache line takes to go from one
    thread of a two-thread region to the other and back, over ``rounds``
    exchanges (about 0.2-1 ms): how far apart the CPUs the team runs on are
    (include/cyback_handoff.h). None with OpenMP off, fewer than two
    threads allowed, or when the other thread did not run beside the first
    (a busy host). Benchmarks record it beside their figures."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= 10 ** 7:
        raise ValueError("handoff_ns: rounds must be an integer from 1 to 10**7, got %r"
                         % (rounds,))
    if not cb_openmp_enabled() or cb_team_size() < 2:
        return None
    cdef long n = rounds
    cdef double ns
    with nogil:
        ns = cb_handoff_ns(n)
    return None if ns < 0 else ns
