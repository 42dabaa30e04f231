/* OpenMP shims: the kernels call these so that a build without OpenMP still
 * compiles and runs single-threaded, instead of failing to link omp_*. */
#ifndef CYBACK_OMP_H
#define CYBACK_OMP_H

#ifdef _OPENMP
#include <omp.h>
static inline int cb_openmp_enabled(void) { return 1; }
static inline int cb_get_max_threads(void) { return omp_get_max_threads(); }
static inline void cb_set_num_threads(int n) { omp_set_num_threads(n > 0 ? n : 1); }
static inline int cb_get_thread_num(void) { return omp_get_thread_num(); }
static inline int cb_get_num_threads(void) { return omp_get_num_threads(); }
#else
static inline int cb_openmp_enabled(void) { return 0; }
static inline int cb_get_max_threads(void) { return 1; }
static inline void cb_set_num_threads(int n) { (void)n; }
static inline int cb_get_thread_num(void) { return 0; }
static inline int cb_get_num_threads(void) { return 1; }
#endif

/* The cutoff below which kernels keep a problem on the calling thread (the
 * policy around it is include/cyback_team.h): waking a thread team costs
 * microseconds on an idle machine and up to a scheduler time slice on a busy
 * one. CYBACK_PARALLEL_MIN_WORK overrides it (the tests set 0 so that every
 * parallel path runs); it is read once per kernel module. */
#include <stdlib.h>

static double cb_parallel_min_work_cache = -1.0;

static inline double cb_parallel_min_work(void) {
    if (cb_parallel_min_work_cache < 0.0) {
        const char *env = getenv("CYBACK_PARALLEL_MIN_WORK");
        cb_parallel_min_work_cache = env ? atof(env) : 1.0e6;
    }
    return cb_parallel_min_work_cache;
}

#endif
