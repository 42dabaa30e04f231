/* How far apart two threads of the team are: the time a cache line takes to
 * go from one to the other and back (cyback/kernels/runtime.pyx,
 * handoff_ns). On a VM whose vCPUs the host moves between dies, this goes
 * from under 150 ns (cores sharing an L3) to about 400 ns (cores on two
 * dies) for minutes at a time, and every parallel region and every array one
 * thread writes and the other reads pays it: benchmarks record it beside
 * their figures (docs/performance.md, "Where the two CPUs are"). */
#ifndef CYBACK_HANDOFF_H
#define CYBACK_HANDOFF_H

#include <stdint.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* A spin this long (about tens of ms) means the other thread is not running
 * beside this one (a busy host): the probe gives up rather than measure the
 * scheduler. */
#define CB_HANDOFF_SPIN_LIMIT 20000000L

static double cb_handoff_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The mean round trip, in ns, of `rounds` exchanges of one cache line
 * between two threads of an OpenMP region; -1 when the region has fewer
 * than two threads (OpenMP off, one thread allowed) or a wait ran past the
 * spin limit. */
static double cb_handoff_ns(long rounds) {
#ifdef _OPENMP
    /* the call's own cache line (shared by the region's two threads), so
     * that calls from several threads at once do not meet */
    volatile int64_t line[16] __attribute__((aligned(64)));
    volatile int abort_flag = 0;
    double seconds = -1.0;
    int pair = 0;
    line[0] = 0;
#pragma omp parallel num_threads(2)
    {
        const int me = omp_get_thread_num();
        if (omp_get_num_threads() == 2) {
            long i, spin;
#pragma omp barrier
            if (me == 0) {
                const double t0 = cb_handoff_now();
                for (i = 0; i < rounds && !abort_flag; i++) {
                    __atomic_store_n(&line[0], 2 * i + 1, __ATOMIC_RELEASE);
                    for (spin = 0; __atomic_load_n(&line[0], __ATOMIC_ACQUIRE) != 2 * i + 2;
                         spin++)
                        if (spin > CB_HANDOFF_SPIN_LIMIT || abort_flag) {
                            abort_flag = 1;
                            break;
                        }
                }
                if (!abort_flag) seconds = cb_handoff_now() - t0;
                pair = 1;
            } else {
                for (i = 0; i < rounds && !abort_flag; i++) {
                    for (spin = 0; __atomic_load_n(&line[0], __ATOMIC_ACQUIRE) != 2 * i + 1;
                         spin++)
                        if (spin > CB_HANDOFF_SPIN_LIMIT || abort_flag) {
                            abort_flag = 1;
                            break;
                        }
                    if (abort_flag) break;
                    __atomic_store_n(&line[0], 2 * i + 2, __ATOMIC_RELEASE);
                }
            }
        }
    }
    if (!pair || seconds < 0.0 || rounds <= 0) return -1.0;
    return 1e9 * seconds / (double)rounds;
#else
    (void)rounds;
    return -1.0;
#endif
}

#endif
