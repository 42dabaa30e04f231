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

#endif
