/* A region's tiles handed out one at a time, and the join at its end.
 *
 * A region's threads meet at its end in libgomp's barrier, which spins
 * GOMP_SPINCOUNT rounds (tens of microseconds, cyback/kernels/cpu_budget.py)
 * and then sleeps. When the tiles are coarse (a few GEMM calls of a hundred
 * microseconds or more each) the thread that finishes first often waits
 * longer than that, falls asleep, and its core idles. On a VM an idle core
 * halts: the wake-up is a futex plus a VM entry, slowest after a pause of
 * the whole process (the host's halt polling shrinks while the guest idles).
 * The woken thread is then late for the next region too, so it finishes
 * early again and sleeps again, call after call, until the host's polling
 * has grown back (docs/performance.md, "How idle threads wait").
 *
 * cb_tiles_join ends the region with a spin of its own, bounded in time
 * rather than rounds: a thread that is done waits for the others while they
 * still have tiles in hand, which is work in progress, not idle time, so
 * the longer spin does not take a core from a busy neighbour between calls
 * the way a longer GOMP_SPINCOUNT would. Past the bound the thread goes on
 * into libgomp's barrier and sleeps there. A team larger than the CPUs the
 * process may run on does not spin at all: the thread it waits for may be
 * waiting for its core. Kernels take the bound from runtime's join_seconds
 * (CYBACK_JOIN_US), which is 0 while other processes take our cores. */
#ifndef CYBACK_TILES_H
#define CYBACK_TILES_H

#include <sched.h>
#include <time.h>
#include <unistd.h>

/* The bound (seconds) of the join's spin. A join waits about as long as the
 * threads' imbalance, at most a tile or two (the GEMM tiles of a batch-1 1x1
 * convolution are the coarsest); longer waits are a thread that lost its
 * core, for which libgomp's sleep is the better wait. */
#define CB_TILES_JOIN_SECONDS 300e-6

typedef struct {
    long next;                    /* the next tile to hand out */
    char pad0[64 - sizeof(long)];
    long arrived;                 /* threads done with their tiles */
    char pad1[64 - sizeof(long)];
    long done;                    /* tiles done */
    char pad2[64 - sizeof(long)];
} cb_tiles;

static inline void cb_tiles_init(cb_tiles *t) {
    t->next = 0;
    t->arrived = 0;
    t->done = 0;
}

/* The next tile's number (from 0; past the last one when none is left). */
static inline long cb_tiles_take(cb_tiles *t) {
    return __atomic_fetch_add(&t->next, 1, __ATOMIC_RELAXED);
}

static inline double cb_tiles_clock(void) {
    struct timespec s;
    clock_gettime(CLOCK_MONOTONIC, &s);
    return (double)s.tv_sec + 1.0e-9 * (double)s.tv_nsec;
}

static inline void cb_tiles_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int cb_tiles_cpus_cache = 0;

/* CPUs in the affinity mask, read once. */
static inline int cb_tiles_cpus(void) {
    int n = __atomic_load_n(&cb_tiles_cpus_cache, __ATOMIC_RELAXED);
    if (n > 0) return n;
#ifdef __linux__
    {
        cpu_set_t set;
        CPU_ZERO(&set);
        if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
    }
#endif
    if (n < 1) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    __atomic_store_n(&cb_tiles_cpus_cache, n, __ATOMIC_RELAXED);
    return n;
}

/* This thread is done; wait up to `seconds` for the other threads of the
 * `nth` to be. */
static inline void cb_tiles_join(cb_tiles *t, int nth, double seconds) {
    double end;
    int i;
    if (__atomic_add_fetch(&t->arrived, 1, __ATOMIC_ACQ_REL) >= nth || seconds <= 0.0 ||
            nth > cb_tiles_cpus())
        return;
    end = cb_tiles_clock() + seconds;
    for (;;) {
        for (i = 0; i < 32; i++) {
            if (__atomic_load_n(&t->arrived, __ATOMIC_ACQUIRE) >= nth)
                return;
            cb_tiles_pause();
        }
        if (cb_tiles_clock() > end)
            return;
    }
}

/* A tile is done: its writes are seen by whoever cb_tiles_wait_done sees it. */
static inline void cb_tiles_finish(cb_tiles *t) {
    __atomic_add_fetch(&t->done, 1, __ATOMIC_ACQ_REL);
}

/* Until *count reaches n: a spin, then yields (the thread waited for may
 * be waiting for this one's core). */
static inline void cb_tiles_wait_for(long *count, long n) {
    long spins = 0;
    while (__atomic_load_n(count, __ATOMIC_ACQUIRE) < n) {
        if (++spins < 4000)
            cb_tiles_pause();
        else
            sched_yield();
    }
}

/* Until `total` tiles are done. Waits for the work, not for the threads: a
 * thread that joins the region late and finds every tile done (or taken
 * and finished by the others) goes straight on. */
static inline void cb_tiles_wait_done(cb_tiles *t, long total) {
    cb_tiles_wait_for(&t->done, total);
}

/* Until every thread of the `nth` has joined (after cb_tiles_join): a
 * barrier, for a region that goes on to read what the others wrote. */
static inline void cb_tiles_wait_all(cb_tiles *t, int nth) {
    cb_tiles_wait_for(&t->arrived, nth);
}

#endif
