/* When the thread team is worth waking: included by kernels/runtime.pyx only,
 * so that there is one copy of the state, which the other kernel modules reach
 * through runtime's cimported functions.
 *
 * A parallel region costs what waking the team's idle threads costs. Right
 * after a region they still spin (GOMP_SPINCOUNT rounds) and a fork/join takes
 * under a microsecond; once they sleep it takes tens of microseconds, more on
 * a VM. So the cutoff depends on the team's state: a cold team is woken only
 * for `min_work`, a warm one for a fraction of it. Between the ops of one
 * compiled call the gaps are a few microseconds, so once one op has woken the
 * team the ops after it find it warm; a batch-1 model whose layers are each
 * below the cold cutoff then runs them all on the team.
 *
 * A cold team is also woken for a dense run of medium ops that together make
 * min_work: the ops of a batch-1 call, each below the cutoff, come a few
 * microseconds apart, so the first of them that wakes the team pays the
 * wake-up for all the ones after it, which find it spinning. A run is dense
 * while each op starts within the warm window of the previous op's end; a
 * longer gap (a batch-1 LSTM's projection comes once per call, after its
 * single-threaded steps) starts a new run, since the team would be asleep
 * again by the next op.
 *
 * Both rules are off while other processes take our cores, and the cutoff
 * rises (cb_team_busy_factor): a team thread then waits for a time slice,
 * and the more regions a call has the more such waits
 * (benchmarks/bench_contention.py). What tells is the CPUs of the affinity
 * mask that were idle or ran this process over the last window (/proc/stat's
 * idle times and getrusage); where there is no /proc/stat, the process's
 * involuntary context switches. Why not the switch count everywhere, or the
 * caller's run delay: docs/performance.md, "Telling a busy host". Sampled
 * every 100 ms, two windows in a row short of the team by more than
 * cb_team_busy_margin CPUs make the host busy, for half a second. Another
 * library's threads in the process still spinning after its last call (ONNX
 * Runtime's, PyTorch's) count as this process; under the switch count they
 * show as a burst in the first window of cyback's next calls, and one window
 * above the bound is taken for such a burst, not a neighbour (holding it for
 * half a second would run those calls single-threaded).
 *
 * Warmth is per calling thread (each one has its own OpenMP team) and is a
 * guess on the safe side: it counts from the end of the last region when the
 * caller says (cb_team_done), else from its start. */
#ifndef CYBACK_TEAM_H
#define CYBACK_TEAM_H

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#ifdef __linux__
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>
#endif
#include "cyback_omp.h"

/* A warm team takes work from min_work / CB_TEAM_WARM_DIVISOR: 250 kB moved
 * with the default cutoff, about 2 MFLOP of convolution. A larger divisor
 * would put the per-step products of a batch-1 LSTM and the 32-row products
 * of a small MLP on the team, where the split costs more than it saves
 * (benchmarks/bench_models.py). */
#define CB_TEAM_WARM_DIVISOR 4.0

/* The thread count set for the whole process (0: OpenMP's own default).
 * OpenMP keeps the count per calling thread, so a setting made in one Python
 * thread would not reach the others: each thread applies the process's
 * count at its next kernel call, when the generation it last saw is old. A
 * thread may instead hold a count of its own (cb_team_set_local: a Dask task
 * sized to its worker's share of the cores). */
static int cb_team_setting = 0;
static int cb_team_generation = 0;
static __thread int cb_team_seen = 0;
static __thread int cb_team_local = 0;

static inline void cb_team_set_size(int n) {
    cb_team_setting = n;
    __atomic_add_fetch(&cb_team_generation, 1, __ATOMIC_RELEASE);
}

/* The calling thread's team size: its own count, else the process's.
 * Kernels split their work into this many parts whatever number of threads
 * then runs them, so that a result depends on the setting, never on the
 * team's state. */
static inline int cb_team_size(void) {
    int gen = __atomic_load_n(&cb_team_generation, __ATOMIC_ACQUIRE);
    if (cb_team_seen != gen) {
        cb_team_seen = gen;
        if (cb_team_local <= 0 && cb_team_setting > 0) cb_set_num_threads(cb_team_setting);
    }
    return cb_get_max_threads();
}

/* The calling thread's own count (n > 0), or back to the process's (0). */
static inline void cb_team_set_local(int n) {
    cb_team_local = n > 0 ? n : 0;
    if (n > 0) {
        cb_set_num_threads(n);
    } else {
        cb_team_seen = __atomic_load_n(&cb_team_generation, __ATOMIC_ACQUIRE) - 1;
    }
}

static inline int cb_team_get_local(void) { return cb_team_local; }

/* Tests: when positive, every region runs on at most this many threads, as if
 * the team were asleep (1) or always awake. */
static int cb_team_forced = 0;

/* The work below which kernels keep a call on the calling thread (see above):
 * CYBACK_PARALLEL_MIN_WORK, which cyback.config passes on through runtime's
 * set_parallel_min_work (the tests set 0 so that every parallel path runs). */
static double cb_team_min_work = 1.0e6;

static double cb_team_warm_seconds = 0.0;
/* When the team last ran; when the last op ended (or, from a kernel that
 * does not say, began); the work of the current dense run of ops. */
static __thread double cb_team_last = -1.0e30, cb_team_op_end = -1.0e30;
static __thread double cb_team_demand = 0.0;

static inline double cb_team_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1.0e-9 * (double)t.tv_nsec;
}

#define CB_TEAM_SAMPLE_SECONDS 0.1
/* A busy sample holds for this long: a busy neighbour's preemptions come in
 * bursts with quiet windows between them, so one busy sample must outlast
 * several windows. */
#define CB_TEAM_BUSY_HOLD_SECONDS 0.5
/* A window is above the bound when the CPUs of the affinity mask that were
 * idle or ran this process fall short of the team by more than
 * cb_team_busy_margin; without /proc/stat, when the process was preempted
 * more than cb_team_busy_switches times a second (a rate well between an
 * idle host's and one with a busy loop on one core;
 * benchmarks/bench_contention.py). */
static double cb_team_busy_margin = 0.5;
static double cb_team_busy_switches = 150.0;
static __thread double cb_team_sampled_at = -1.0e30, cb_team_busy_until = -1.0e30;
static __thread double cb_team_free = 0.0, cb_team_own = 0.0;
static __thread long cb_team_switches = 0;
/* Whether the last sample window was above the bound. */
static __thread int cb_team_hot = 0;

/* Idle seconds of the CPUs in this process's affinity mask since boot
 * (/proc/stat: idle and iowait, in USER_HZ ticks), or -1 where unknown. The
 * cpu lines come first; the rest of the file (the interrupt counts, long on
 * a large host) is not parsed. A sample costs microseconds, once per
 * 100 ms of a calling thread's kernel calls; the kernel builds the
 * whole file for it, which takes longer on a host with hundreds of CPUs. A
 * file that does not list every CPU of the mask (a container's renumbered
 * view, as lxcfs gives) leaves the test to the switch count. */
#ifdef __linux__
static inline double cb_team_idle_seconds(void) {
    char buf[4096];
    cpu_set_t mask;
    size_t have = 0;
    ssize_t got;
    long hz = sysconf(_SC_CLK_TCK);
    double idle = 0.0;
    int fd, lines = 0, all = sched_getaffinity(0, sizeof mask, &mask) != 0;
    if (hz <= 0) return -1.0;
    fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1.0;
    for (;;) {
        char *line = buf, *nl;
        got = read(fd, buf + have, sizeof buf - 1 - have);
        if (got <= 0) break;
        have += (size_t)got;
        buf[have] = 0;
        while ((nl = strchr(line, '\n')) != NULL) {
            unsigned long long v[5];
            char *p;
            long cpu;
            int i;
            if (strncmp(line, "cpu", 3) != 0) goto done;
            if (line[3] >= '0' && line[3] <= '9') {
                cpu = strtol(line + 3, &p, 10);
                for (i = 0; i < 5; i++) v[i] = strtoull(p, &p, 10);
                if (all || (cpu < CPU_SETSIZE && CPU_ISSET((int)cpu, &mask))) {
                    idle += (double)(v[3] + v[4]);
                    lines++;
                }
            }
            line = nl + 1;
        }
        have -= (size_t)(line - buf);
        memmove(buf, line, have);
        if (have >= sizeof buf - 1) break;      /* a line longer than the buffer */
    }
done:
    close(fd);
    if (lines == 0 || (!all && lines < CPU_COUNT(&mask))) return -1.0;
    return idle / (double)hz;
}
#else
static inline double cb_team_idle_seconds(void) { return -1.0; }
#endif

/* Whether other processes take our cores: two sample periods in a row above
 * the bound (a first or stale sample says no; see above). */
static inline int cb_team_host_busy(double now) {
    struct rusage u;
    double dt = now - cb_team_sampled_at, idle, own;
    int hot, fresh;
    if (dt < CB_TEAM_SAMPLE_SECONDS) return now < cb_team_busy_until;
    if (getrusage(RUSAGE_SELF, &u) != 0) return now < cb_team_busy_until;
    fresh = dt < 10.0 * CB_TEAM_SAMPLE_SECONDS;
    idle = cb_team_idle_seconds();
    if (idle >= 0.0) {
        own = (double)u.ru_utime.tv_sec + (double)u.ru_stime.tv_sec +
            1.0e-6 * ((double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_usec);
        hot = fresh && (idle - cb_team_free) + (own - cb_team_own) <
            ((double)cb_team_size() - cb_team_busy_margin) * dt;
        cb_team_free = idle;
        cb_team_own = own;
    } else {
        hot = fresh && (double)(u.ru_nivcsw - cb_team_switches) > cb_team_busy_switches * dt;
    }
    cb_team_switches = u.ru_nivcsw;
    if (hot && cb_team_hot)
        cb_team_busy_until = now + CB_TEAM_BUSY_HOLD_SECONDS;
    cb_team_hot = hot;
    cb_team_sampled_at = now;
    return now < cb_team_busy_until;
}

/* While the host is busy, only work from this many times the cutoff takes the
 * team: each region waits for the thread that shares its core with another
 * process, up to a time slice, so medium ops run faster alone, while large
 * ops still gain from the team (benchmarks/bench_contention.py). */
static double cb_team_busy_factor = 16.0;

static inline int cb_team_threads_for(double work) {
    int n = cb_team_size();
    double cutoff = cb_team_min_work, now;
    int dense;
    if (n <= 1) return 1;
    if (cb_team_forced > 0) return cb_team_forced < n ? cb_team_forced : n;
    if (work < cutoff / CB_TEAM_WARM_DIVISOR) return work >= cutoff ? n : 1;
    now = cb_team_now();
    dense = now - cb_team_op_end < cb_team_warm_seconds;
    cb_team_demand = (dense ? cb_team_demand : 0.0) + work;
    cb_team_op_end = now;
    if (cb_team_host_busy(now)) {
        if (work < cb_team_busy_factor * cutoff) return 1;
        cb_team_last = now;
        return n;
    }
    /* With no spin (OMP_WAIT_POLICY=PASSIVE alone) the warm window is 0 and
     * every region wakes a sleeping team: only work above the cutoff pays. */
    if (work >= cutoff || cb_team_demand >= cutoff ||
            (dense && now - cb_team_last < cb_team_warm_seconds)) {
        cb_team_last = now;
        return n;
    }
    return 1;
}

/* The parts a kernel splits `work` into: one where threads_for never gives
 * such work the team (below the warm cutoff), else the team size. This is a
 * function of the shapes and the settings alone; threads_for then decides how
 * many threads run the parts. */
static inline int cb_team_parts(double work) {
    int n = cb_team_size();
    double cutoff = cb_team_min_work;
    if (n <= 1 || (work < cutoff / CB_TEAM_WARM_DIVISOR && work < cutoff)) return 1;
    return n;
}

/* A kernel's region on `threads` threads ended now. */
static inline void cb_team_done(int threads) {
    double now = cb_team_now();
    cb_team_op_end = now;
    if (threads > 1) cb_team_last = now;
}

static inline int cb_team_host_busy_now(void) { return cb_team_host_busy(cb_team_now()); }

static inline void cb_team_forget(void) {
    cb_team_last = cb_team_op_end = cb_team_sampled_at = cb_team_busy_until = -1.0e30;
    cb_team_demand = 0.0;
    cb_team_hot = 0;
}

#endif
