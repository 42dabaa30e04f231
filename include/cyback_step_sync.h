/* Threads that share the steps of one sequence meet after each step (the
 * units split of cyback/kernels/rnn_cell.pyx). An OpenMP barrier there costs
 * a large part of a batch-1 LSTM step; instead each thread publishes the
 * count of steps it has done on a cache line of its own and waits until
 * every other thread's count has caught up, one line written and one read
 * per thread and step.
 *
 * The wait spins with a pause and yields the core after CB_STEP_SPINS rounds:
 * a thread of the team that lost its core gets it back sooner. The split is
 * not chosen on a host whose cores other processes take. */
#ifndef CYBACK_STEP_SYNC_H
#define CYBACK_STEP_SYNC_H

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define CB_STEP_SPINS 4000

typedef struct {
    long done;
    char pad[64 - sizeof(long)];
} cb_step_count;

/* n zeroed counts on cache lines of their own, or NULL; cb_step_counts_free. */
static inline cb_step_count *cb_step_counts_new(int n) {
    void *p = NULL;
    if (n < 1 || posix_memalign(&p, 64, (size_t)n * sizeof(cb_step_count)) != 0) return NULL;
    memset(p, 0, (size_t)n * sizeof(cb_step_count));
    return (cb_step_count *)p;
}

static inline void cb_step_counts_free(cb_step_count *c) { free(c); }

static inline void cb_step_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Thread `me` of `nth` has done `steps` steps; returns once every thread has. */
static inline void cb_step_sync(cb_step_count *counts, int me, int nth, long steps) {
    int i;
    long spins = 0;
    __atomic_store_n(&counts[me].done, steps, __ATOMIC_RELEASE);
    for (i = 0; i < nth; i++) {
        while (__atomic_load_n(&counts[i].done, __ATOMIC_ACQUIRE) < steps) {
            if (++spins < CB_STEP_SPINS)
                cb_step_pause();
            else
                sched_yield();
        }
    }
}

/* Threads joining a sequence already under way: the calling thread (0)
 * does not wait for the others, which a sleeping team takes many steps'
 * time to wake (on a VM especially), but runs the steps alone (all units)
 * until every other thread has arrived and packed its part, then opens the
 * split at its next step; a thread that arrives after the last step finds
 * the split opened at T and leaves. */
typedef struct {
    long ready;     /* threads other than 0 that have arrived */
    long start;     /* the first step of the split, -1 until thread 0 opens it */
} cb_step_join;

static inline void cb_join_init(cb_step_join *j) { j->ready = 0; j->start = -1; }

static inline void cb_join_arrive(cb_step_join *j) {
    __atomic_fetch_add(&j->ready, 1, __ATOMIC_ACQ_REL);
}

static inline int cb_join_all_here(cb_step_join *j, int nth) {
    return __atomic_load_n(&j->ready, __ATOMIC_ACQUIRE) >= nth - 1;
}

/* Until every other thread has arrived (a split opened at a set step). */
static inline void cb_join_wait_all(cb_step_join *j, int nth) {
    long spins = 0;
    while (!cb_join_all_here(j, nth)) {
        if (++spins < CB_STEP_SPINS)
            cb_step_pause();
        else
            sched_yield();
    }
}

static inline void cb_join_open(cb_step_join *j, long t) {
    __atomic_store_n(&j->start, t, __ATOMIC_RELEASE);
}

/* The split's first step, once thread 0 has opened it. */
static inline long cb_join_wait(cb_step_join *j) {
    long t, spins = 0;
    while ((t = __atomic_load_n(&j->start, __ATOMIC_ACQUIRE)) < 0) {
        if (++spins < CB_STEP_SPINS)
            cb_step_pause();
        else
            sched_yield();
    }
    return t;
}

#endif
