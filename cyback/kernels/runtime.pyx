"""Thread control for the OpenMP kernels."""
from cyback.kernels._omp cimport (cb_get_max_threads, cb_openmp_enabled, cb_parallel_min_work,
                                  cb_set_num_threads)


def openmp_enabled():
    """True when the kernels were built with OpenMP."""
    return bool(cb_openmp_enabled())


def get_max_threads():
    return cb_get_max_threads()


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
    cb_set_num_threads(n)


def parallel_min_work():
    """Work (flops) below which kernels stay on the calling thread."""
    return cb_parallel_min_work()
