/* Ctrl-C inside long kernel calls.
 *
 * A kernel runs without the GIL, so Python's SIGINT handler (which raises
 * KeyboardInterrupt) cannot run until the call returns. Kernels therefore
 * poll between tiles: the calling thread (OpenMP thread 0) looks at the clock
 * and, at most every CB_INTR_PERIOD seconds, takes the GIL for
 * PyErr_CheckSignals(). When a handler raised, `stop` is set: every thread
 * skips its remaining tiles, and the Python entry re-raises the pending
 * exception (check_interrupt in _interrupt.pxd). Outputs are fresh arrays,
 * so an interrupted call leaves no caller-visible state half-written.
 *
 * Cost: a few nanoseconds per tile on one thread (kernels with sub-
 * microsecond tiles poll every few tiles), and a GIL round trip every 50 ms
 * (microseconds, unless another Python thread holds the GIL). Signals are
 * handled only in Python's main thread; elsewhere the poll finds nothing.
 */
#ifndef CYBACK_INTERRUPT_H
#define CYBACK_INTERRUPT_H

#include <Python.h>
#include "cyback_omp.h"

#define CB_INTR_PERIOD 0.05

typedef struct {
    volatile int stop;
    double next;
} cb_intr;

#if defined(__linux__)
#include <time.h>
/* The coarse clock (a few ms resolution) is enough for a 50 ms period and
 * costs a few nanoseconds: a plain memory read in the vDSO. */
static inline double cb_intr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#elif defined(_OPENMP)
static inline double cb_intr_now(void) { return omp_get_wtime(); }
#else
#include <time.h>
static inline double cb_intr_now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

static inline void cb_intr_init(cb_intr *s) {
    s->stop = 0;
    s->next = cb_intr_now() + CB_INTR_PERIOD;
}

/* 1 when the call should stop; any thread, with or without OpenMP. */
static inline int cb_intr_poll(cb_intr *s) {
    double t;
    if (s == NULL) return 0;
    if (s->stop) return 1;
    if (cb_get_thread_num() != 0) return 0;
    t = cb_intr_now();
    if (t < s->next) return 0;
    s->next = t + CB_INTR_PERIOD;
    {
        PyGILState_STATE g = PyGILState_Ensure();
        /* On failure the handler's exception (KeyboardInterrupt) stays set
         * for the Python entry to raise. */
        if (PyErr_CheckSignals() < 0) s->stop = 1;
        PyGILState_Release(g);
    }
    return s->stop;
}

#endif
