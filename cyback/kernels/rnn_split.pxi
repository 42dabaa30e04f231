# The units split of a forward pass (included by rnn_cell.pyx): the meeting
# points and the choice of thread count; the LSTM's and GRU's split passes
# are in rnn_lstm.pxi and rnn_gru.pxi.
#
# A few batch rows leave the row blocks below one thread each (or none): at
# batch 1 a step is a GEMV of h with all of R, which runs at the speed R
# streams from the core's L2.
# There the threads split the units instead: each packs the gate columns of
# its units (R[:, q * u + j0:q * u + j1] for each gate q) and runs every step
# for them, reading half of R from its own cache, and the threads meet
# after each step (include/cyback_step_sync.h), since the next one reads all
# of h. Thread 0 starts alone and the split opens once the others have
# arrived (cb_step_join). Thread 0 polls for Ctrl-C before it says its step
# is done and leaves the answer in a slot per step parity, which every
# thread reads after the meeting: all leave at the same step.


cdef extern from "cyback_step_sync.h" nogil:
    ctypedef struct cb_step_count:
        long done
    cb_step_count *cb_step_counts_new(int n)
    void cb_step_counts_free(cb_step_count *c)
    void cb_step_sync(cb_step_count *counts, int me, int nth, long steps)
    ctypedef struct cb_step_join:
        long ready, start
    void cb_join_init(cb_step_join *j)
    void cb_join_arrive(cb_step_join *j)
    int cb_join_all_here(cb_step_join *j, int nth)
    void cb_join_open(cb_step_join *j, long t)
    void cb_join_wait_all(cb_step_join *j, int nth)
    long cb_join_wait(cb_step_join *j)



# The step at which the last split's threads met (thread 0 ran the steps
# before it alone), for tests and benchmarks; -1 before any split.
cdef long _joined_at = -1


def _last_join():
    return _joined_at


cdef inline void _note_join(long t) noexcept nogil:
    global _joined_at
    _joined_at = t


cdef struct Split:
    int tid, nth            # this thread, of nth
    int meets               # meetings per step (2: a GRU without reset_after)
    int *stops              # 2 slots, shared
    cb_step_count *counts   # nth, shared


cdef inline Py_ssize_t _unit_start(Py_ssize_t i, Py_ssize_t nth, Py_ssize_t u) noexcept nogil:
    """The first unit of thread i of nth (u for i = nth): even shares in
    multiples of 8 (whole vectors of the activations)."""
    if i >= nth:
        return u
    return min(u, (i * u // nth + 7) // 8 * 8)


cdef inline bint _alone(cb_step_join *join, int nth, Py_ssize_t lead, Py_ssize_t t,
                        Py_ssize_t T) noexcept nogil:
    """Whether thread 0 runs step t alone (all units): until the others have
    arrived, or for a test's lead of steps."""
    return t < T and (t < lead or (lead == 0 and not cb_join_all_here(join, nth)))


cdef inline Py_ssize_t _join_split(cb_step_join *join, int tid, int nth, Py_ssize_t lead,
                                  Py_ssize_t t, Py_ssize_t T) noexcept nogil:
    """The split's first step: thread 0 opens it at its step t (a test's
    lead: after waiting there for the others), the others, their parts
    packed, arrive and wait for it."""
    if tid == 0:
        if lead > 0 and t < T:
            cb_join_wait_all(join, nth)
        cb_join_open(join, t)
        _note_join(t)
        return t
    cb_join_arrive(join)
    return cb_join_wait(join)


cdef inline bint _step_end(Split *sp, Py_ssize_t t, cb_intr* intr) noexcept nogil:
    """The end of step t in a units split: True when every thread stops."""
    if sp.tid == 0:
        sp.stops[t & 1] = cb_intr_poll(intr)
    cb_step_sync(sp.counts, sp.tid, sp.nth, (t + 1) * sp.meets)
    return sp.stops[t & 1] != 0


cdef inline void _step_meet(Split *sp, Py_ssize_t t) noexcept nogil:
    """The middle of step t (sp.meets = 2): every thread's part of it so far
    is done."""
    cb_step_sync(sp.counts, sp.tid, sp.nth, 2 * t + 1)


cpdef int _split_threads(Py_ssize_t T, Py_ssize_t B, Py_ssize_t u, Py_ssize_t G,
                         Py_ssize_t itemsize) except -1:
    """Threads for a units split of a forward sequence, or 1 (row blocks):
    a few rows (_TUNE["split_max_rows"]), a recurrent kernel too large for
    a core's L1 cache (_TUNE["split_min_bytes"]), at least 16 units per
    thread, and a host where no other process takes our cores (a thread
    waiting for its time slice would hold every step of the others).

    The team must also be worth waking for it: the split saves part of
    each step's time (R's bytes streamed from L2), but waking a sleeping
    team takes many steps' worth. Thread 0 does not wait for it: it runs
    whole steps alone until the others have arrived, so a late team costs
    the steps it missed, not a stall. The sequence counts as T * (R's
    bytes) / _TUNE["split_stream_per_work"] of the team's work
    (include/cyback_team.h): with the default cutoff a cold team from 16 MB
    streamed (LSTM(128) at batch 1 from 63 steps, LSTM(256) from 16), a warm
    one from 4 MB. Short sequences of small layers stay on row blocks
    (benchmarks/bench_rnn.py, the units split rows)."""
    if not _TUNE["packed"] or T < 2 or B < 1 or B > _TUNE["split_max_rows"] or \
            u * G * u * itemsize < _TUNE["split_min_bytes"]:
        return 1
    n = min(threads_for(<double>T * u * G * u * itemsize / _TUNE["split_stream_per_work"]),
            u // 16)
    if n > 1 and host_busy():
        return 1
    return max(1, n)


def _split_operand(Py_ssize_t nsplit, Py_ssize_t u, Py_ssize_t G, Py_ssize_t B, dt):
    """(scratch for the packed columns, values per gate part, block width,
    scratch for the masked h) of a units split on nsplit threads."""
    cdef Py_ssize_t most = 0, i, FB
    for i in range(nsplit):
        most = max(most, _unit_start(i + 1, nsplit, u) - _unit_start(i, nsplit, u))
    FB = cb_rp_block(dt == np.float64, most)
    ps = (most + FB - 1) // FB * FB * u
    return np.empty(max(1, nsplit * G * ps), dt), ps, FB, np.empty(max(1, nsplit * B * u), dt)
