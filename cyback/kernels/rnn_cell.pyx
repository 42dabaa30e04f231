"""Fused recurrent cells: a whole LSTM, GRU or SimpleRNN sequence in one call.

Per step, the recurrent product ``h @ R`` goes to BLAS (added onto the step's
input projection, computed beforehand for all steps at once), then one pass
over the batch rows applies the gate non-linearities and the state update.
The forward records what backprop through time reads; the backward produces
the per-step pre-activation gradients ``dz`` (which are the gradients of the
input projection), the initial-state gradients and the recurrent kernel's
gradient as one GEMM over all steps after the loop.

Threads: the batch rows of a recurrent layer are independent sequences, so
each OpenMP thread runs every step for its own block of rows (its own GEMMs
included) and the threads meet once, at the end, not at every step. Thread 0
polls for Ctrl-C at every step. A forward pass of a few rows splits the units
over the threads instead, which then meet after every step (below).

Without ``keep`` (an inference plan: no gradient will read the records) the
states live in a ring of two steps and the gates in one step's rows, so a
call writes only the outputs it returns.

Layouts (time-major, C-contiguous):
    zx      (T, B, G*u)  input projection (+ bias); G = 4 for LSTM (gates
                         i, f, c, o as in Keras), 3 for GRU (z, r, h), 1 for
                         SimpleRNN
    R       (u, G*u)     recurrent kernel
    rmask   (B, u)       recurrent dropout mask applied to h before ``@ R``
    mask    (T, B) uint8 Keras mask: a masked step keeps the states and
                         repeats the previous output
    hs, cs  (T, B, u)    states after each step (after masking)
    ys      (T, B, u)    outputs (differ from hs only under a mask)
    gates   (T, B, G*u)  activated gates (LSTM; the GRU's below) / new h
                         before masking (RNN)

Activation codes: 0 tanh, 1 sigmoid, 2 hard_sigmoid, 3 linear.
"""
from cyback.kernels import settings as _settings
import numpy as np
cimport cython
cimport numpy as cnp
from cython.parallel cimport parallel, prange
from libc.string cimport memcpy, memset

from scipy.linalg.cython_blas cimport sgemv, dgemv

from cyback.kernels._blas cimport floating, gemm
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt
from cyback.kernels._omp cimport cb_get_num_threads, cb_get_thread_num
from cyback.kernels.runtime cimport join_seconds, threads_for
from cyback.kernels._tiles cimport cb_tiles, cb_tiles_init, cb_tiles_join
from cyback.kernels.runtime import host_busy

cnp.import_array()

ACTIVATIONS = {"tanh": 0, "sigmoid": 1, "hard_sigmoid": 2, "linear": 3}


# Through BLAS, batches up to this size multiply by R one row at a time
# (GEMV): a GEMM call packs all of R first, which at batch 1 costs ten times
# the product itself.
DEF GEMV_ROWS = 4


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


cdef extern from "cyback_rnn_product.h" nogil:
    Py_ssize_t cb_rp_block(int dbl, Py_ssize_t N)
    void cb_rp_pack_f(const float* w, Py_ssize_t K, Py_ssize_t N, Py_ssize_t FB, float* wp)
    void cb_rp_pack_d(const double* w, Py_ssize_t K, Py_ssize_t N, Py_ssize_t FB, double* wp)
    void cb_rp_product_f(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const float* h,
                         const float* wp, Py_ssize_t FB, const float* base, float* out)
    void cb_rp_product_d(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const double* h,
                         const double* wp, Py_ssize_t FB, const double* base, double* out)
    void cb_rp_pack_ld_f(const float* w, Py_ssize_t K, Py_ssize_t N, Py_ssize_t ldw,
                         Py_ssize_t FB, float* wp)
    void cb_rp_pack_ld_d(const double* w, Py_ssize_t K, Py_ssize_t N, Py_ssize_t ldw,
                         Py_ssize_t FB, double* wp)
    void cb_rp_product_ld_f(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const float* h,
                            const float* wp, Py_ssize_t FB, const float* base, float* out,
                            Py_ssize_t ld)
    void cb_rp_product_ld_d(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const double* h,
                            const double* wp, Py_ssize_t FB, const double* base, double* out,
                            Py_ssize_t ld)


def _pack_product(W, Py_ssize_t FB=0):
    """W (K, N) packed for the recurrent product (include/cyback_rnn_product.h)
    as ``(packed, FB)``: packed once per sequence, the recurrent kernel is not
    re-packed by BLAS at every step."""
    W = np.ascontiguousarray(W)
    cdef bint dbl = W.dtype == np.float64
    cdef Py_ssize_t K = W.shape[0], N = W.shape[1]
    if FB == 0:
        FB = cb_rp_block(dbl, N)
    packed = np.empty(max(1, (N + FB - 1) // FB * FB * K), W.dtype)
    cdef float[::1] wf, pf
    cdef double[::1] wd, pd
    if W.size:
        if dbl:
            wd, pd = W.reshape(-1), packed
            cb_rp_pack_d(&wd[0], K, N, FB, &pd[0])
        else:
            wf, pf = W.reshape(-1), packed
            cb_rp_pack_f(&wf[0], K, N, FB, &pf[0])
    return packed, FB


def _packed_rows(const floating[:, ::1] h, W, base):
    """``h @ W (+ base)`` through the packed product (for tests)."""
    dt = np.float32 if floating is float else np.float64
    cdef Py_ssize_t FB
    packed, FB = _pack_product(np.asarray(W, dtype=dt))
    cdef Py_ssize_t B = h.shape[0], K = h.shape[1], N = W.shape[1]
    if W.shape[0] != K:
        raise ValueError("_packed_rows: shapes h %s, W %s do not agree"
                         % (np.shape(h), np.shape(W)))
    out = np.empty((B, N), dt)
    cdef floating[:, ::1] o = out
    cdef const floating[:, ::1] b_
    cdef const floating *bp = NULL
    if base is not None:
        b_ = np.ascontiguousarray(np.broadcast_to(base, (B, N)), dtype=dt)
        if B and N:
            bp = &b_[0, 0]
    cdef const floating *wp = <const floating*>_address(packed)
    cdef const floating *hp = NULL
    if B and N:
        hp = &o[0, 0]               # K = 0: no value of h is read
        if K:
            hp = &h[0, 0]
        _packed_product(B, K, N, hp, wp, FB, bp, &o[0, 0])
    return out


# The recurrent product on R packed once per sequence (the kernels of
# include/cyback_rnn_product.h) rather than BLAS, which packs R at every step
# of every thread; off for tests of the BLAS path.
# gemv_max_rows: batches up to this size take BLAS's GEMV per row rather than
# the packed product (R packed at every call): for one or two rows packing R
# costs more than it saves, from three rows on the packed product wins
# (benchmarks/bench_rnn.py).
_TUNE = {"packed": True, "gemv_max_rows": 2, "split_max_rows": 6,
         "split_min_bytes": 1 << 17, "split_stream_per_work": 16.0, "split_lead_steps": 0}
# split_lead_steps (tests): thread 0 runs this many steps alone, then waits
# for the others and opens the split there (0: alone only until they arrive).


cpdef tuple _recurrent_operand(R, Py_ssize_t B, bint trans, Py_ssize_t FB=0):
    """(packed R, or R^T with ``trans``, and its block width) for a batch of
    B rows, or (None, 0) where the rows go to GEMV or BLAS. FB: the block
    width to pack in (0: the kernel set's width for R's columns)."""
    if B <= _TUNE["gemv_max_rows"] or not _TUNE["packed"]:
        return None, 0
    R = np.asarray(R)
    return _pack_product(R.T if trans else R, FB)


cdef const void* _address(arr):
    # the data of a C-contiguous ndarray the caller keeps alive, or NULL for
    # None (not arr.ctypes: a microsecond per call at batch 1)
    return NULL if arr is None else cnp.PyArray_DATA(<cnp.ndarray?>arr)


cdef inline void _packed_product(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const floating *h,
                                 const floating *Wp, Py_ssize_t FB, const floating *base,
                                 floating *out) noexcept nogil:
    """out = h @ W (+ base, shaped like out, unless NULL; it may be out): h
    (B, K), out (B, N), W packed by _pack_product."""
    if floating is float:
        cb_rp_product_f(B, K, N, h, Wp, FB, base, out)
    else:
        cb_rp_product_d(B, K, N, h, Wp, FB, base, out)


cdef inline void _rec_product_onto(Py_ssize_t B, Py_ssize_t u, Py_ssize_t G, const floating *h,
                                   const floating *R, const floating *Wp, Py_ssize_t FB,
                                   const floating *base, floating *out) noexcept nogil:
    """out = base + h @ R (see _rec_product): the packed kernel reads base as
    it writes out, the other paths copy it first."""
    if Wp != NULL:
        _packed_product(B, u, G, h, Wp, FB, base, out)
        return
    memcpy(out, base, B * G * sizeof(floating))
    _rec_product(False, B, u, G, h, R, Wp, FB, 1, out)


cdef inline void _rec_product(bint trans, Py_ssize_t B, Py_ssize_t u, Py_ssize_t G,
                              const floating *h, const floating *R, const floating *Wp,
                              Py_ssize_t FB, floating beta, floating *out) noexcept nogil:
    """out = h @ R + beta * out (h: (B, u), out: (B, G)), or with ``trans``
    out = h @ R^T + beta * out (h: (B, G), out: (B, u)); all row-major; beta
    is 0 or 1. Wp: the product's right operand (R, or R^T with ``trans``)
    packed by _pack_product, or NULL for BLAS."""
    cdef int m = <int>G, n = <int>u, one = 1, b
    cdef char op = b'T' if trans else b'N'
    cdef floating alpha = 1
    if Wp != NULL:
        if trans:
            _packed_product(B, G, u, h, Wp, FB, out if beta != 0 else NULL, out)
        else:
            _packed_product(B, u, G, h, Wp, FB, out if beta != 0 else NULL, out)
        return
    if B > GEMV_ROWS:
        if trans:
            gemm(False, True, <int>B, <int>u, <int>G, alpha, h, <int>G, R, <int>G, beta,
                 out, <int>u)
        else:
            gemm(False, False, <int>B, <int>G, <int>u, alpha, h, <int>u, R, <int>G, beta,
                 out, <int>G)
        return
    # Row-major R (u, G) is column-major R^T (G, u): 'N' gives R^T h_b, 'T' gives R x_b.
    for b in range(B):
        if floating is float:
            sgemv(&op, &m, &n, &alpha, <float*>R, &m,
                  <float*>(h + b * (G if trans else u)), &one, &beta,
                  out + b * (u if trans else G), &one)
        else:
            dgemv(&op, &m, &n, &alpha, <double*>R, &m,
                  <double*>(h + b * (G if trans else u)), &one, &beta,
                  out + b * (u if trans else G), &one)


cdef extern from "cyback_act.h" nogil:
    void cb_act_row_f(float *p, Py_ssize_t n, int kind)
    void cb_act_row_d(double *p, Py_ssize_t n, int kind)
    void cb_act_lanes_f(float *p, Py_ssize_t rows, Py_ssize_t w, Py_ssize_t ld,
                        const float *lanes)
    int cb_simd_use_avx2(int on)
    void cb_simd_set_default_cap(int cap)
    int cb_simd_use_avx512(int on)

# CYBACK_AVX512=0 caps this module's vector kernels at AVX2 (the registry reads it).
cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)


def _use_avx2(bint on):
    """Run the AVX2 + FMA gate activations and products when the CPU has them
    (the default), or the baseline ones (for tests). Returns whether AVX2
    now runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let the recurrent product's AVX-512 set run when the CPU has it (the
    default), or cap it at AVX2 (for tests). Returns whether AVX-512 now runs."""
    return bool(cb_simd_use_avx512(on))


cdef inline void _act_row(floating *p, Py_ssize_t n, int kind) noexcept nogil:
    """p[:n] = act(p[:n]) (vectorised loops in cyback_act.h)."""
    if floating is float:
        cb_act_row_f(p, n, kind)
    else:
        cb_act_row_d(p, n, kind)


cdef inline floating _dact(floating y, int kind) noexcept nogil:
    """Derivative of the activation, from its output ``y``."""
    if kind == 0:
        return 1 - y * y
    if kind == 1:
        return y * (1 - y)
    if kind == 2:
        return 0.2 if (y > 0 and y < 1) else 0
    return 1


cdef inline Py_ssize_t _row_blocks(double flops, Py_ssize_t B) noexcept nogil:
    """Blocks of batch rows (one per thread) for a sequence of ``flops``."""
    cdef Py_ssize_t n = threads_for(flops)
    if n > B:
        n = B if B > 0 else 1
    return n


cdef inline void _ring(bint keep, Py_ssize_t t, Py_ssize_t *ti, Py_ssize_t *tp,
                       Py_ssize_t *tg) noexcept nogil:
    """Where step t writes its states (ti), reads the previous ones (tp) and
    writes its gates (tg): the step itself, or without records (keep off) a
    ring of two steps for the states and one for the gates."""
    if keep:
        ti[0], tp[0], tg[0] = t, t - 1, t
    else:
        ti[0], tp[0], tg[0] = t & 1, (t - 1) & 1, 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline const floating *_recurrent_input(Py_ssize_t t, Py_ssize_t tp, Py_ssize_t b0,
                                             Py_ssize_t b1, const floating[:, ::1] h0,
                                             floating[:, :, ::1] hs,
                                             const floating[:, ::1] rmask, bint use_rmask,
                                             floating *hm) noexcept nogil:
    """Rows b0..b1 of the recurrent product's left operand: h_{t-1} (h0 at
    step 0, else the states' row tp), times the recurrent dropout mask (then
    written into hm, b1 - b0 rows of u)."""
    cdef Py_ssize_t u = h0.shape[1], b, j
    cdef const floating *hp = &h0[b0, 0] if t == 0 else &hs[tp, b0, 0]
    if not use_rmask:
        return hp
    for b in range(b0, b1):
        for j in range(u):
            hm[(b - b0) * u + j] = hp[(b - b0) * u + j] * rmask[b, j]
    return hm


# ------------------------------------------------------------------ units split over threads
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


# ------------------------------------------------------------------ projection inside the steps
#
# An LSTM's or GRU's input projection zx = x @ W + b is a product over all
# steps before the loop; on the row blocks each thread then reads its rows
# of zx from wherever the product's threads wrote them, often another
# core's cache, which is much slower than reading its own.
# With a Proj, each thread projects its own rows at the start of each step
# into a one-step ring of zx instead (lstm_forward_projected,
# gru_forward_projected): x, W and the ring stay in its cache, and zx over
# all steps is never written.


cdef struct Proj:
    const void *x           # x[t, b, :] at x + t * st + b * sb (elements), rows contiguous
    Py_ssize_t st, sb, width, T  # width: I, the input's last axis
    const void *W           # W (I, G) packed by _pack_product with block width FB
    Py_ssize_t FB
    const void *b           # the bias (G,), or NULL
    void *scratch           # per thread: rows x I for the rows of x (B * I values)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline void _project(const Proj *pj, Py_ssize_t t, Py_ssize_t b0, Py_ssize_t b1,
                          Py_ssize_t G, floating *xs, floating *out) noexcept nogil:
    """out (b1 - b0 rows of G) = x[t, b0:b1] @ W + b: the sum over k in
    order, then the bias, as the separate product's. xs: scratch for the
    rows of x (b1 - b0 rows of I), which the product reads I apart."""
    cdef const floating *x = <const floating*>pj.x
    cdef const floating *bias = <const floating*>pj.b
    cdef Py_ssize_t I = pj.width, b
    for b in range(b0, b1):
        memcpy(xs + (b - b0) * I, x + t * pj.st + b * pj.sb, I * sizeof(floating))
        if bias != NULL:
            memcpy(out + (b - b0) * G, bias, G * sizeof(floating))
    _packed_product(b1 - b0, I, G, xs, <const floating*>pj.W, pj.FB,
                    out if bias != NULL else NULL, out)


cdef inline Py_ssize_t _unit_start(Py_ssize_t i, Py_ssize_t nth, Py_ssize_t u) noexcept nogil:
    """The first unit of thread i of nth (u for i = nth): even shares in
    multiples of 8 (whole vectors of the activations)."""
    if i >= nth:
        return u
    return min(u, (i * u // nth + 7) // 8 * 8)


cdef inline void _pack_ld(const floating *w, Py_ssize_t K, Py_ssize_t N, Py_ssize_t ldw,
                          Py_ssize_t FB, floating *wp) noexcept nogil:
    if floating is float:
        cb_rp_pack_ld_f(w, K, N, ldw, FB, wp)
    else:
        cb_rp_pack_ld_d(w, K, N, ldw, FB, wp)


cdef inline void _product_ld(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, const floating *h,
                             const floating *Wp, Py_ssize_t FB, const floating *base,
                             floating *out, Py_ssize_t ld) noexcept nogil:
    if floating is float:
        cb_rp_product_ld_f(B, K, N, h, Wp, FB, base, out, ld)
    else:
        cb_rp_product_ld_d(B, K, N, h, Wp, FB, base, out, ld)


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


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline void _lstm_step_lanes(Py_ssize_t b0, Py_ssize_t b1, Py_ssize_t t, Py_ssize_t ti,
                                  Py_ssize_t tp, Py_ssize_t tg, const float[:, ::1] h0,
                                  const float[:, ::1] c0, const float[:, ::1] y0,
                                  const unsigned char[:, ::1] mask, bint use_mask, int act,
                                  float[:, :, ::1] hs, float[:, :, ::1] cs, float[:, :, ::1] ys,
                                  float[:, :, ::1] gates, float *tc,
                                  const float *lanes) noexcept nogil:
    """The rest of an LSTM step for rows b0..b1 once the product is in the
    gates: each pass over all the rows (the gates' activations, the cells, c's
    activation in tc, b1 - b0 rows of u, then h), the same operations per
    value as the per-row loop of _lstm_fwd_rows."""
    cdef Py_ssize_t u = hs.shape[2], b, j
    cdef const float *hp
    cdef const float *cp
    cdef const float *yp
    cdef float *z
    cdef float *tr
    cdef float c, h
    cb_act_lanes_f(&gates[tg, b0, 0], b1 - b0, 4 * u, 4 * u, lanes)
    for b in range(b0, b1):
        cp = &c0[b, 0] if t == 0 else &cs[tp, b, 0]
        z = &gates[tg, b, 0]
        tr = tc + (b - b0) * u
        if use_mask and not mask[t, b]:
            hp = &h0[b, 0] if t == 0 else &hs[tp, b, 0]
            yp = &y0[b, 0] if t == 0 else &ys[t - 1, b, 0]
            for j in range(u):
                hs[ti, b, j] = hp[j]
                cs[ti, b, j] = cp[j]
                ys[t, b, j] = yp[j]
                tr[j] = 0
            continue
        for j in range(u):
            c = z[u + j] * cp[j] + z[j] * z[2 * u + j]
            cs[ti, b, j] = c
            tr[j] = c
    cb_act_row_f(tc, (b1 - b0) * u, act)
    for b in range(b0, b1):
        if use_mask and not mask[t, b]:
            continue
        z = &gates[tg, b, 0]
        tr = tc + (b - b0) * u
        for j in range(u):
            h = z[3 * u + j] * tr[j]
            hs[ti, b, j] = h
            ys[t, b, j] = h


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _lstm_fwd_rows(Py_ssize_t b0, Py_ssize_t b1, Py_ssize_t j0, Py_ssize_t j1,
                         Py_ssize_t t0, Py_ssize_t t1, const floating[:, :, ::1] zx,
                         const floating[:, ::1] h0, const floating[:, ::1] c0,
                         const floating[:, ::1] y0, const floating[:, ::1] R,
                         const floating *Wp, Py_ssize_t FB, Py_ssize_t ps,
                         const floating[:, ::1] rmask, const unsigned char[:, ::1] mask,
                         bint use_rmask, bint use_mask, int act, int ract, floating[:, :, ::1] hs,
                         floating[:, :, ::1] cs, floating[:, :, ::1] ys, floating[:, :, ::1] gates,
                         floating *hm, bint keep, cb_intr* intr, Split *sp,
                         const float *lanes, const Proj *pj) noexcept nogil:
    """Steps t0..t1 for rows b0..b1 and units j0..j1. Row blocks (sp NULL)
    take all units and Wp is R packed whole (or NULL: BLAS); in a units split
    Wp holds the four gates' columns of this thread's units, packed ps values
    apart, and the threads meet after each step. hm: b1 - b0 rows of u for
    the masked h. lanes (float32 row blocks only, else NULL): the gates' kinds
    for cb_act_lanes_f (_gate_lanes), which then activates a step's rows in
    one pass. pj (row blocks only, else NULL): zx is a one-step ring that
    each step first fills with its rows' projection."""
    cdef Py_ssize_t u = R.shape[0]
    cdef Py_ssize_t ti, tp, tg, tz = 0
    cdef Py_ssize_t t, b, j, q, G = 4 * u, n = j1 - j0
    cdef const floating *hp
    cdef const floating *cp
    cdef const floating *yp
    cdef floating *z
    cdef floating *tc
    cdef floating c, h
    if b1 <= b0:
        return
    for t in range(t0, t1):
        if sp == NULL and cb_intr_poll(intr):
            return
        _ring(keep, t, &ti, &tp, &tg)
        hp = _recurrent_input(t, tp, b0, b1, h0, hs, rmask, use_rmask, hm)
        if pj != NULL:
            # zx is then the ring the caller made for it, writable
            _project(pj, t, b0, b1, G, <floating*>pj.scratch + b0 * pj.width,
                     <floating*>&zx[0, b0, 0])
        else:
            tz = t
        if sp == NULL:
            _rec_product_onto(b1 - b0, u, G, hp, &R[0, 0], Wp, FB, &zx[tz, b0, 0],
                              &gates[tg, b0, 0])
        else:
            for q in range(4):
                _product_ld(b1 - b0, u, n, hp, Wp + q * ps, FB, &zx[t, b0, q * u + j0],
                            &gates[tg, b0, q * u + j0], G)
        if floating is float:
            if lanes != NULL:
                _lstm_step_lanes(b0, b1, t, ti, tp, tg, h0, c0, y0, mask, use_mask, act, hs, cs,
                                 ys, gates, hm, lanes)
                continue
        for b in range(b0, b1):
            hp = &h0[b, 0] if t == 0 else &hs[tp, b, 0]
            cp = &c0[b, 0] if t == 0 else &cs[tp, b, 0]
            yp = &y0[b, 0] if t == 0 else &ys[t - 1, b, 0]
            z = &gates[tg, b, 0]
            # Masked rows too (the backward pass skips them): their records
            # are those of every path (_lstm_step_lanes activates whole rows).
            _act_row(z + j0, n, ract)
            _act_row(z + u + j0, n, ract)
            _act_row(z + 2 * u + j0, n, act)
            _act_row(z + 3 * u + j0, n, ract)
            if use_mask and not mask[t, b]:
                for j in range(j0, j1):
                    hs[ti, b, j] = hp[j]
                    cs[ti, b, j] = cp[j]
                    ys[t, b, j] = yp[j]
                continue
            for j in range(j0, j1):
                c = z[u + j] * cp[j] + z[j] * z[2 * u + j]
                cs[ti, b, j] = c
                hs[ti, b, j] = c
            _act_row(&hs[ti, b, j0], n, act)
            for j in range(j0, j1):
                h = z[3 * u + j] * hs[ti, b, j]
                hs[ti, b, j] = h
                ys[t, b, j] = h
        if sp != NULL and _step_end(sp, t, intr):
            return


cdef void _lstm_fwd(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                    const floating[:, ::1] c0, const floating[:, ::1] y0, const floating[:, ::1] R,
                    const floating *Wp, Py_ssize_t FB,
                    const floating[:, ::1] rmask, const unsigned char[:, ::1] mask, bint use_rmask,
                    bint use_mask, int act, int ract, floating[:, :, ::1] hs,
                    floating[:, :, ::1] cs, floating[:, :, ::1] ys, floating[:, :, ::1] gates,
                    floating[:, ::1] hm, bint keep, const float *lanes, const Proj *pj,
                    cb_intr* intr) noexcept nogil:
    # Batch rows are independent sequences: each thread runs all steps of its
    # own rows, with no barrier between steps (a descheduled thread delays
    # only its rows, not every step of the others).
    cdef Py_ssize_t T = pj.T if pj != NULL else zx.shape[0]
    cdef Py_ssize_t B = zx.shape[1], u = R.shape[0], G = R.shape[1]
    cdef Py_ssize_t ci, nchunk = _row_blocks(2.0 * T * B * G * u, B)
    cdef cb_tiles joined
    cdef double join = join_seconds()
    if nchunk <= 1:
        _lstm_fwd_rows(0, B, 0, u, 0, T, zx, h0, c0, y0, R, Wp, FB, 0, rmask, mask, use_rmask,
                       use_mask, act, ract, hs, cs, ys, gates, &hm[0, 0], keep, intr, NULL, lanes,
                       pj)
        return
    # The thread done first with its rows spins for the others before the
    # region ends (include/cyback_tiles.h).
    cb_tiles_init(&joined)
    with parallel(num_threads=nchunk):
        for ci in prange(nchunk, schedule='static'):
            _lstm_fwd_rows(ci * B // nchunk, (ci + 1) * B // nchunk, 0, u, 0, T, zx, h0, c0, y0,
                           R, Wp, FB, 0, rmask, mask, use_rmask, use_mask, act, ract, hs, cs, ys,
                           gates, &hm[ci * B // nchunk, 0], keep, intr, NULL, lanes, pj)
        cb_tiles_join(&joined, cb_get_num_threads(), join)


cdef void _lstm_fwd_split(int nsplit, const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                          const floating[:, ::1] c0, const floating[:, ::1] y0,
                          const floating[:, ::1] R, const floating *Wfull, Py_ssize_t FBfull,
                          floating *Wp, Py_ssize_t FB, Py_ssize_t ps,
                          const floating[:, ::1] rmask, const unsigned char[:, ::1] mask,
                          bint use_rmask, bint use_mask, int act, int ract,
                          floating[:, :, ::1] hs, floating[:, :, ::1] cs, floating[:, :, ::1] ys,
                          floating[:, :, ::1] gates, floating *hm, bint keep,
                          Py_ssize_t lead, const float *lanes, cb_intr* intr) noexcept nogil:
    # The units split (see _split_threads), joined late (cb_step_join): thread
    # 0 runs whole steps (Wfull, FBfull: the row path's operand) until the
    # others are there. Wp: 4 * ps values per thread, hm B * u per thread.
    cdef Py_ssize_t T = zx.shape[0], B = zx.shape[1], u = R.shape[0]
    cdef Py_ssize_t j0 = 0, j1 = 0, q = 0, t = 0     # firstprivate in the block
    cdef int stops[2]
    cdef int tid = 0, nth = 0
    cdef Split sp
    cdef cb_step_join join
    cdef cb_step_count *counts = cb_step_counts_new(nsplit)
    if counts == NULL:
        # no memory for the counts: one thread takes every unit
        _lstm_fwd_rows(0, B, 0, u, 0, T, zx, h0, c0, y0, R, Wfull, FBfull, 0, rmask, mask,
                       use_rmask, use_mask, act, ract, hs, cs, ys, gates, hm, keep, intr, NULL,
                       lanes, NULL)
        return
    stops[0] = stops[1] = 0
    cb_join_init(&join)
    with parallel(num_threads=nsplit):
        # assigned whole, sp is private to each thread (a field assignment
        # would leave it shared)
        tid = cb_get_thread_num()
        nth = cb_get_num_threads()
        sp = Split(tid=tid, nth=nth, meets=1, stops=&stops[0], counts=counts)
        j0 = _unit_start(tid, nth, u)
        j1 = _unit_start(tid + 1, nth, u)
        t = 0
        if tid == 0:
            while _alone(&join, nth, lead, t, T):
                _lstm_fwd_rows(0, B, 0, u, t, t + 1, zx, h0, c0, y0, R, Wfull, FBfull, 0,
                               rmask, mask, use_rmask, use_mask, act, ract, hs, cs, ys, gates,
                               hm, keep, intr, NULL, lanes, NULL)
                t = T if intr.stop else t + 1
        if tid != 0 or t < T:
            for q in range(4):
                _pack_ld(&R[0, 0] + q * u + j0, u, j1 - j0, 4 * u, FB, Wp + (4 * tid + q) * ps)
        t = _join_split(&join, tid, nth, lead, t, T)
        if t < T:
            _lstm_fwd_rows(0, B, j0, j1, t, T, zx, h0, c0, y0, R, Wp + 4 * tid * ps, FB, ps,
                           rmask, mask, use_rmask, use_mask, act, ract, hs, cs, ys, gates,
                           hm + tid * B * u, keep, intr, &sp, NULL, NULL)
    cb_step_counts_free(counts)


# The lanes of cb_act_lanes_f (or None) by (dtype, units, gate kinds), built once.
_LANES = {}


cpdef _gate_lanes(dt, Py_ssize_t u, tuple kinds):
    """For float32 gates whose activations are all tanh or sigmoid, the per-lane
    factors of cb_act_lanes_f (include/cyback_act.h) for gates of u units
    with these activation codes (a tuple), in order; None otherwise (the
    per-gate loops). Cached: a batch-1 call is a few dozen microseconds."""
    key = (dt, u, kinds)
    try:
        return _LANES[key]
    except KeyError:
        pass
    return _new_gate_lanes(key, dt, u, kinds)


def _new_gate_lanes(key, dt, Py_ssize_t u, kinds):
    lanes = None
    if dt == np.float32 and all(k in (0, 1) for k in kinds):
        tanh = np.repeat(np.array([k == 0 for k in kinds]), u)
        lanes = np.concatenate([np.where(tanh, -2.0, -1.0), np.where(tanh, 2.0, 1.0),
                                np.where(tanh, 1.0, 0.0)]).astype(np.float32)
    if len(_LANES) >= 64:
        _LANES.clear()
    _LANES[key] = lanes
    return lanes


def _split_operand(Py_ssize_t nsplit, Py_ssize_t u, Py_ssize_t G, Py_ssize_t B, dt):
    """(scratch for the packed columns, values per gate part, block width,
    scratch for the masked h) of a units split on nsplit threads."""
    cdef Py_ssize_t most = 0, i, FB
    for i in range(nsplit):
        most = max(most, _unit_start(i + 1, nsplit, u) - _unit_start(i, nsplit, u))
    FB = cb_rp_block(dt == np.float64, most)
    ps = (most + FB - 1) // FB * FB * u
    return np.empty(max(1, nsplit * G * ps), dt), ps, FB, np.empty(max(1, nsplit * B * u), dt)


def lstm_forward(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                 const floating[:, ::1] c0, const floating[:, ::1] y0, const floating[:, ::1] R,
                 rmask, mask, int act, int ract, bint keep=True):
    """Run the sequence; returns ``(hs, cs, ys, gates)`` (see the module doc).
    With ``keep`` off (no gradient to come) nothing is recorded: hs and cs
    hold two steps, step t in row ``t % 2``, and gates one."""
    return _lstm_run(zx, h0, c0, y0, R, rmask, mask, act, ract, keep, NULL, "lstm_forward")


def lstm_forward_projected(x, W, xb, const floating[:, ::1] h0, const floating[:, ::1] c0,
                           const floating[:, ::1] y0, const floating[:, ::1] R, rmask, mask,
                           int act, int ract, bint keep=True):
    """lstm_forward of zx = x @ W (+ xb), x (T, B, I) with its last axis
    contiguous (a transposed view of a batch-major input is read as it is),
    W (I, 4u), xb (4u,) or None: each thread projects its own rows at the
    start of each step (see Proj). The sums are those of the product
    followed by the bias."""
    fname = "lstm_forward_projected"
    dt = np.float32 if floating is float else np.float64
    cdef Proj pj
    keep_alive = _proj_setup(&pj, x, W, xb, h0.shape[0], 4 * R.shape[0], dt, fname)
    cdef floating[:, :, ::1] ring = np.empty((1, h0.shape[0], 4 * R.shape[0]), dt)
    return _lstm_run(ring, h0, c0, y0, R, rmask, mask, act, ract, keep, &pj, fname)


cdef tuple _proj_setup(Proj *pj, x, W, xb, Py_ssize_t B, Py_ssize_t G, dt, fname):
    """Fill pj for zx = x @ W (+ xb) of G columns, checking the arguments;
    returns the arrays pj points into (the caller keeps them alive)."""
    cdef Py_ssize_t isz = np.dtype(dt).itemsize
    x = np.asarray(x)
    if x.ndim != 3 or x.shape[1] != B or x.dtype != dt or x.size and (
            (x.shape[2] > 1 and x.strides[2] != isz) or any(st % isz for st in x.strides)):
        raise ValueError("%s: x must be a (T, %d, I) %s array with its last axis contiguous, "
                         "got %s %s with strides %s" % (fname, B, np.dtype(dt).name,
                                                        x.shape, x.dtype, x.strides))
    W = np.ascontiguousarray(W, dt)
    if W.ndim != 2 or W.shape[0] != x.shape[2] or W.shape[1] != G:
        raise ValueError("%s: W must be (%d, %d), got %s" % (fname, x.shape[2], G, W.shape))
    if xb is not None:
        xb = np.ascontiguousarray(xb, dt)
        if xb.shape != (G,):
            raise ValueError("%s: xb must be (%d,), got %s" % (fname, G, xb.shape))
    packed, FB = _pack_product(W)
    scratch = np.empty(max(1, B * x.shape[2]), dt)
    pj.x = _address(x) if x.size else NULL
    pj.st, pj.sb = x.strides[0] // isz, x.strides[1] // isz
    pj.width, pj.T = x.shape[2], x.shape[0]
    pj.W, pj.FB, pj.b = _address(packed), FB, _address(xb)
    pj.scratch = cnp.PyArray_DATA(scratch)
    return x, packed, xb, scratch


cdef _projected_whole(const Proj *pj, const floating[:, :, ::1] ring):
    """The projection of every step and row, (T, B, G) for a ring of (1, B, G):
    the units split reads every row of zx at every step, so it projects
    first, by the same kernel."""
    cdef Py_ssize_t T = pj.T, B = ring.shape[1], G = ring.shape[2], t
    dt = np.float32 if floating is float else np.float64
    cdef floating[:, :, ::1] full = np.empty((T, B, G), dt)
    if T and B:
        with nogil:
            for t in range(T):
                _project(pj, t, 0, B, G, <floating*>pj.scratch, &full[t, 0, 0])
    return full


cdef tuple _lstm_run(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                     const floating[:, ::1] c0, const floating[:, ::1] y0,
                     const floating[:, ::1] R, rmask, mask, int act, int ract, bint keep,
                     Proj *pj, fname):
    # zx: the projection, or with pj the one-step ring the row blocks fill
    cdef Py_ssize_t T = pj.T if pj != NULL else zx.shape[0], B = zx.shape[1], u = R.shape[0]
    dt = np.float32 if floating is float else np.float64
    if R.shape[1] != 4 * u or zx.shape[2] != 4 * u or h0.shape[0] != B or h0.shape[1] != u \
            or c0.shape[0] != B or c0.shape[1] != u or y0.shape[0] != B or y0.shape[1] != u:
        raise ValueError("%s: shapes zx %s, h0 %s, c0 %s, y0 %s, R %s do not agree"
                         % (fname, np.shape(zx), np.shape(h0), np.shape(c0), np.shape(y0),
                            np.shape(R)))
    # the arrays returned, and their views for the kernels (np.asarray of a
    # view would build a new array through the buffer protocol)
    hs_a, cs_a = _steps(keep, 2, T, B, u, dt), _steps(keep, 2, T, B, u, dt)
    ys_a, gates_a = _empty3(T, B, u, dt), _steps(keep, 1, T, B, 4 * u, dt)
    cdef floating[:, :, ::1] hs = hs_a
    cdef floating[:, :, ::1] cs = cs_a
    cdef floating[:, :, ::1] ys = ys_a
    cdef floating[:, :, ::1] gates = gates_a
    cdef floating[:, ::1] hm
    cdef floating[::1] wsplit, hsplit
    cdef const floating[:, ::1] rm = _rmask(rmask, B, u, dt)
    cdef const unsigned char[:, ::1] mk = _mask(mask, T, B)
    cdef Py_ssize_t FB, ps
    cdef int nsplit = _split_threads(T, B, u, 4, sizeof(floating))
    cdef cb_intr intr
    cb_intr_init(&intr)
    cdef const floating *Wfull
    cdef Py_ssize_t FBfull, lead
    # One row whose gates are whole vectors gains nothing from the one pass
    # over the per-gate loops.
    lane_kinds = _gate_lanes(dt, u, (ract, ract, act, ract)) if B > 1 or u % 8 else None
    cdef const float *lanes = <const float*>_address(lane_kinds)
    if nsplit > 1:
        if pj != NULL:
            zx = _projected_whole(pj, zx)
        wsplit, ps, FB, hsplit = _split_operand(nsplit, u, 4, B, dt)
        packed_full, FBfull = _recurrent_operand(R, B, False)
        Wfull = <const floating*>_address(packed_full)
        lead = _TUNE["split_lead_steps"]
        with nogil:
            _lstm_fwd_split(nsplit, zx, h0, c0, y0, R, Wfull, FBfull, &wsplit[0], FB, ps, rm, mk,
                            rmask is not None, mask is not None, act, ract, hs, cs, ys, gates,
                            &hsplit[0], keep, lead, lanes, &intr)
        check_interrupt(&intr)
        return hs_a, cs_a, ys_a, gates_a
    hm = np.empty((max(1, B), u), dt)
    packed, FB = _recurrent_operand(R, B, False)
    cdef const floating *Wp = <const floating*>_address(packed)
    with nogil:
        _lstm_fwd(zx, h0, c0, y0, R, Wp, FB, rm, mk, rmask is not None, mask is not None, act, ract,
                  hs, cs, ys, gates, hm, keep, lanes, pj, &intr)
    check_interrupt(&intr)
    return hs_a, cs_a, ys_a, gates_a


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _lstm_bwd_rows(Py_ssize_t b0, Py_ssize_t b1, const floating[:, :, ::1] dys,
                         floating[:, ::1] dh, floating[:, ::1] dc, floating[:, ::1] dy,
                         const floating[:, ::1] h0, const floating[:, ::1] c0,
                         const floating[:, ::1] R,
                         const floating *Wp, Py_ssize_t FB, const floating[:, ::1] rmask,
                         const unsigned char[:, ::1] mask, bint use_rmask, bint use_mask, int act,
                         int ract, const floating[:, :, ::1] hs, const floating[:, :, ::1] cs,
                         const floating[:, :, ::1] gates, floating[:, :, ::1] dz,
                         floating[:, ::1] dhm, floating[:, ::1] tcs, cb_intr* intr) noexcept nogil:
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = R.shape[0]
    cdef Py_ssize_t t, b, j, G = 4 * u
    cdef const floating *cp
    cdef const floating *g
    cdef floating *d
    cdef floating ig, fg, gg, og, tc, dH, dC
    if b1 <= b0:
        return
    for t in range(T - 1, -1, -1):
        if cb_intr_poll(intr):
            return
        for b in range(b0, b1):
            d = &dz[t, b, 0]
            if use_mask and not mask[t, b]:
                # States pass through; the output's gradient goes to the
                # previous output.
                memset(d, 0, G * sizeof(floating))
                for j in range(u):
                    dy[b, j] = dy[b, j] + dys[t, b, j]
                continue
            cp = &c0[b, 0] if t == 0 else &cs[t - 1, b, 0]
            g = &gates[t, b, 0]
            memcpy(&tcs[b, 0], &cs[t, b, 0], u * sizeof(floating))
            _act_row(&tcs[b, 0], u, act)
            for j in range(u):
                ig = g[j]
                fg = g[u + j]
                gg = g[2 * u + j]
                og = g[3 * u + j]
                tc = tcs[b, j]
                dH = dh[b, j] + dys[t, b, j] + dy[b, j]
                dC = dc[b, j] + dH * og * _dact(tc, act)
                d[j] = dC * gg * _dact(ig, ract)
                d[u + j] = dC * cp[j] * _dact(fg, ract)
                d[2 * u + j] = dC * ig * _dact(gg, act)
                d[3 * u + j] = dH * tc * _dact(og, ract)
                dc[b, j] = dC * fg
                dh[b, j] = 0
                dy[b, j] = 0
        # dh_{t-1} += (dz_t @ R^T) * rmask
        if use_rmask:
            _rec_product(True, b1 - b0, u, G, &dz[t, b0, 0], &R[0, 0], Wp, FB, 0, &dhm[b0, 0])
            for b in range(b0, b1):
                for j in range(u):
                    dh[b, j] += dhm[b, j] * rmask[b, j]
        else:
            _rec_product(True, b1 - b0, u, G, &dz[t, b0, 0], &R[0, 0], Wp, FB, 1, &dh[b0, 0])


cdef void _lstm_bwd(const floating[:, :, ::1] dys, floating[:, ::1] dh, floating[:, ::1] dc,
                    floating[:, ::1] dy, const floating[:, ::1] h0, const floating[:, ::1] c0,
                    const floating[:, ::1] R,
                    const floating *Wp, Py_ssize_t FB, const floating[:, ::1] rmask,
                    const unsigned char[:, ::1] mask, bint use_rmask, bint use_mask, int act,
                    int ract, const floating[:, :, ::1] hs, const floating[:, :, ::1] cs,
                    const floating[:, :, ::1] gates, floating[:, :, ::1] dz, floating[:, ::1] dhm,
                    floating[:, ::1] tcs, cb_intr* intr) noexcept nogil:
    # Batch rows are independent sequences: each thread runs all steps of its
    # own rows, with no barrier between steps (a descheduled thread delays
    # only its rows, not every step of the others).
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = R.shape[0], G = R.shape[1]
    cdef Py_ssize_t ci, nchunk = _row_blocks(2.0 * T * B * G * u, B)
    cdef cb_tiles joined
    cdef double join = join_seconds()
    if nchunk <= 1:
        _lstm_bwd_rows(0, B, dys, dh, dc, dy, h0, c0, R, Wp, FB, rmask, mask, use_rmask,
                       use_mask, act, ract, hs, cs, gates, dz, dhm, tcs, intr)
        return
    # The thread done first with its rows spins for the others before the
    # region ends (include/cyback_tiles.h).
    cb_tiles_init(&joined)
    with parallel(num_threads=nchunk):
        for ci in prange(nchunk, schedule='static'):
            _lstm_bwd_rows(ci * B // nchunk, (ci + 1) * B // nchunk, dys, dh, dc, dy, h0, c0, R,
                           Wp, FB, rmask, mask, use_rmask, use_mask, act, ract, hs, cs, gates, dz,
                           dhm, tcs, intr)
        cb_tiles_join(&joined, cb_get_num_threads(), join)

def lstm_backward(const floating[:, :, ::1] dys, dhT, dcT, dyT, const floating[:, ::1] h0,
                  const floating[:, ::1] c0, const floating[:, ::1] R, rmask, mask, int act,
                  int ract, const floating[:, :, ::1] hs, const floating[:, :, ::1] cs,
                  const floating[:, :, ::1] gates):
    """Backprop through time: ``(dz, dh0, dc0, dy0, dR)`` from the gradients of
    the outputs ``dys`` and of the final states (h, c, and the last output,
    which only a mask makes different from h)."""
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = R.shape[0]
    dt = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] dh = np.array(dhT, dtype=dt, order="C", copy=True)
    cdef floating[:, ::1] dc = np.array(dcT, dtype=dt, order="C", copy=True)
    cdef floating[:, ::1] dy = np.array(dyT, dtype=dt, order="C", copy=True)
    cdef floating[:, :, ::1] dz = np.empty((T, B, 4 * u), dt)
    cdef floating[:, ::1] dhm = np.empty((B, u), dt)
    cdef floating[:, ::1] tcs = np.empty((B, u), dt)
    cdef const floating[:, ::1] rm = _rmask(rmask, B, u, dt)
    cdef const unsigned char[:, ::1] mk = _mask(mask, T, B)
    cdef Py_ssize_t FB
    packed, FB = _recurrent_operand(R, B, True)
    cdef const floating *Wp = <const floating*>_address(packed)
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        _lstm_bwd(dys, dh, dc, dy, h0, c0, R, Wp, FB, rm, mk, rmask is not None, mask is not None,
                  act, ract, hs, cs, gates, dz, dhm, tcs, &intr)
    check_interrupt(&intr)
    dR = _recurrent_grad(np.asarray(hs), np.asarray(h0), rmask, np.asarray(dz), dt)
    return np.asarray(dz), np.asarray(dh), np.asarray(dc), np.asarray(dy), dR


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _simple_fwd_rows(Py_ssize_t b0, Py_ssize_t b1, const floating[:, :, ::1] zx,
                           const floating[:, ::1] h0, const floating[:, ::1] y0,
                           const floating[:, ::1] R,
                           const floating *Wp, Py_ssize_t FB, const floating[:, ::1] rmask,
                           const unsigned char[:, ::1] mask, bint use_rmask, bint use_mask,
                           int act, floating[:, :, ::1] hs, floating[:, :, ::1] ys,
                           floating[:, :, ::1] pre, floating[:, ::1] hm,
                           bint keep, cb_intr* intr) noexcept nogil:
    cdef Py_ssize_t T = zx.shape[0], B = zx.shape[1], u = R.shape[0]
    cdef Py_ssize_t ti, tp, tg
    cdef Py_ssize_t t, b, j
    cdef const floating *hp
    cdef const floating *yp
    cdef floating h
    if b1 <= b0:
        return
    for t in range(T):
        if cb_intr_poll(intr):
            return
        _ring(keep, t, &ti, &tp, &tg)
        hp = _recurrent_input(t, tp, b0, b1, h0, hs, rmask, use_rmask, &hm[b0, 0])
        _rec_product_onto(b1 - b0, u, u, hp, &R[0, 0], Wp, FB, &zx[t, b0, 0], &pre[tg, b0, 0])
        for b in range(b0, b1):
            hp = &h0[b, 0] if t == 0 else &hs[tp, b, 0]
            yp = &y0[b, 0] if t == 0 else &ys[t - 1, b, 0]
            if use_mask and not mask[t, b]:
                for j in range(u):
                    hs[ti, b, j] = hp[j]
                    ys[t, b, j] = yp[j]
                continue
            _act_row(&pre[tg, b, 0], u, act)
            for j in range(u):
                hs[ti, b, j] = pre[tg, b, j]
                ys[t, b, j] = pre[tg, b, j]


cdef void _simple_fwd(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                      const floating[:, ::1] y0, const floating[:, ::1] R,
                      const floating *Wp, Py_ssize_t FB,
                      const floating[:, ::1] rmask, const unsigned char[:, ::1] mask,
                      bint use_rmask, bint use_mask, int act, floating[:, :, ::1] hs,
                      floating[:, :, ::1] ys, floating[:, :, ::1] pre,
                      floating[:, ::1] hm, bint keep, cb_intr* intr) noexcept nogil:
    # Batch rows are independent sequences: each thread runs all steps of its
    # own rows, with no barrier between steps (a descheduled thread delays
    # only its rows, not every step of the others).
    cdef Py_ssize_t T = zx.shape[0], B = zx.shape[1], u = R.shape[0], G = R.shape[1]
    cdef Py_ssize_t ci, nchunk = _row_blocks(2.0 * T * B * G * u, B)
    cdef cb_tiles joined
    cdef double join = join_seconds()
    if nchunk <= 1:
        _simple_fwd_rows(0, B, zx, h0, y0, R, Wp, FB, rmask, mask, use_rmask, use_mask, act, hs,
                         ys, pre, hm, keep, intr)
        return
    # The thread done first with its rows spins for the others before the
    # region ends (include/cyback_tiles.h).
    cb_tiles_init(&joined)
    with parallel(num_threads=nchunk):
        for ci in prange(nchunk, schedule='static'):
            _simple_fwd_rows(ci * B // nchunk, (ci + 1) * B // nchunk, zx, h0, y0, R, Wp, FB,
                             rmask, mask, use_rmask, use_mask, act, hs, ys, pre, hm, keep, intr)
        cb_tiles_join(&joined, cb_get_num_threads(), join)

def simple_forward(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                   const floating[:, ::1] y0, const floating[:, ::1] R, rmask, mask, int act,
                   bint keep=True):
    """SimpleRNN: ``h = act(zx_t + (h * rmask) @ R)``; returns ``(hs, ys, acts)``
    (``keep``: see lstm_forward)."""
    cdef Py_ssize_t T = zx.shape[0], B = zx.shape[1], u = R.shape[0]
    dt = np.float32 if floating is float else np.float64
    if R.shape[1] != u or zx.shape[2] != u or h0.shape[0] != B or h0.shape[1] != u \
            or y0.shape[0] != B or y0.shape[1] != u:
        raise ValueError("simple_forward: shapes zx %s, h0 %s, y0 %s, R %s do not agree"
                         % (np.shape(zx), np.shape(h0), np.shape(y0), np.shape(R)))
    hs_a, ys_a, pre_a = _steps(keep, 2, T, B, u, dt), _empty3(T, B, u, dt), \
        _steps(keep, 1, T, B, u, dt)
    cdef floating[:, :, ::1] hs = hs_a
    cdef floating[:, :, ::1] ys = ys_a
    cdef floating[:, :, ::1] pre = pre_a
    cdef floating[:, ::1] hm = np.empty((B, u), dt)
    cdef const floating[:, ::1] rm = _rmask(rmask, B, u, dt)
    cdef const unsigned char[:, ::1] mk = _mask(mask, T, B)
    cdef Py_ssize_t FB
    packed, FB = _recurrent_operand(R, B, False)
    cdef const floating *Wp = <const floating*>_address(packed)
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        _simple_fwd(zx, h0, y0, R, Wp, FB, rm, mk, rmask is not None, mask is not None, act,
                    hs, ys, pre, hm, keep, &intr)
    check_interrupt(&intr)
    return hs_a, ys_a, pre_a


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _simple_bwd_rows(Py_ssize_t b0, Py_ssize_t b1, const floating[:, :, ::1] dys,
                           floating[:, ::1] dh, floating[:, ::1] dy, const floating[:, ::1] R,
                           const floating *Wp, Py_ssize_t FB,
                           const floating[:, ::1] rmask, const unsigned char[:, ::1] mask,
                           bint use_rmask, bint use_mask, int act, const floating[:, :, ::1] acts,
                           floating[:, :, ::1] dz, floating[:, ::1] dhm,
                           cb_intr* intr) noexcept nogil:
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = R.shape[0]
    cdef Py_ssize_t t, b, j
    if b1 <= b0:
        return
    for t in range(T - 1, -1, -1):
        if cb_intr_poll(intr):
            return
        for b in range(b0, b1):
            if use_mask and not mask[t, b]:
                for j in range(u):
                    dz[t, b, j] = 0
                    dy[b, j] = dy[b, j] + dys[t, b, j]
                continue
            for j in range(u):
                dz[t, b, j] = (dh[b, j] + dys[t, b, j] + dy[b, j]) * _dact(acts[t, b, j], act)
                dh[b, j] = 0
                dy[b, j] = 0
        if use_rmask:
            _rec_product(True, b1 - b0, u, u, &dz[t, b0, 0], &R[0, 0], Wp, FB, 0, &dhm[b0, 0])
            for b in range(b0, b1):
                for j in range(u):
                    dh[b, j] += dhm[b, j] * rmask[b, j]
        else:
            _rec_product(True, b1 - b0, u, u, &dz[t, b0, 0], &R[0, 0], Wp, FB, 1, &dh[b0, 0])


cdef void _simple_bwd(const floating[:, :, ::1] dys, floating[:, ::1] dh, floating[:, ::1] dy,
                      const floating[:, ::1] R,
                      const floating *Wp, Py_ssize_t FB, const floating[:, ::1] rmask,
                      const unsigned char[:, ::1] mask, bint use_rmask, bint use_mask, int act,
                      const floating[:, :, ::1] acts, floating[:, :, ::1] dz,
                      floating[:, ::1] dhm, cb_intr* intr) noexcept nogil:
    # Batch rows are independent sequences: each thread runs all steps of its
    # own rows, with no barrier between steps (a descheduled thread delays
    # only its rows, not every step of the others).
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = R.shape[0], G = R.shape[1]
    cdef Py_ssize_t ci, nchunk = _row_blocks(2.0 * T * B * G * u, B)
    cdef cb_tiles joined
    cdef double join = join_seconds()
    if nchunk <= 1:
        _simple_bwd_rows(0, B, dys, dh, dy, R, Wp, FB, rmask, mask, use_rmask, use_mask, act,
                         acts, dz, dhm, intr)
        return
    # The thread done first with its rows spins for the others before the
    # region ends (include/cyback_tiles.h).
    cb_tiles_init(&joined)
    with parallel(num_threads=nchunk):
        for ci in prange(nchunk, schedule='static'):
            _simple_bwd_rows(ci * B // nchunk, (ci + 1) * B // nchunk, dys, dh, dy, R, Wp, FB,
                             rmask, mask, use_rmask, use_mask, act, acts, dz, dhm, intr)
        cb_tiles_join(&joined, cb_get_num_threads(), join)

def simple_backward(const floating[:, :, ::1] dys, dhT, dyT, const floating[:, ::1] h0,
                    const floating[:, ::1] R, rmask, mask, int act, const floating[:, :, ::1] hs,
                    const floating[:, :, ::1] acts):
    """Backprop through time of ``simple_forward``: ``(dz, dh0, dy0, dR)``."""
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = R.shape[0]
    dt = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] dh = np.array(dhT, dtype=dt, order="C", copy=True)
    cdef floating[:, ::1] dy = np.array(dyT, dtype=dt, order="C", copy=True)
    cdef floating[:, :, ::1] dz = np.empty((T, B, u), dt)
    cdef floating[:, ::1] dhm = np.empty((B, u), dt)
    cdef const floating[:, ::1] rm = _rmask(rmask, B, u, dt)
    cdef const unsigned char[:, ::1] mk = _mask(mask, T, B)
    cdef Py_ssize_t FB
    packed, FB = _recurrent_operand(R, B, True)
    cdef const floating *Wp = <const floating*>_address(packed)
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        _simple_bwd(dys, dh, dy, R, Wp, FB, rm, mk, rmask is not None, mask is not None, act,
                    acts, dz, dhm, &intr)
    check_interrupt(&intr)
    dR = _recurrent_grad(np.asarray(hs), np.asarray(h0), rmask, np.asarray(dz), dt)
    return np.asarray(dz), np.asarray(dh), np.asarray(dy), dR


def _recurrent_grad(hs, h0, rmask, dz, dt):
    """``sum_t (h_{t-1} * rmask)^T dz_t``: one GEMM over all steps."""
    return _stacked_tn(_previous_states(hs, h0, rmask, dt), dz, dt)


def _previous_states(hs, h0, rmask, dt):
    """(T, B, u) stack of each step's ``h_{t-1} * rmask``."""
    T = hs.shape[0]
    prev = np.empty(hs.shape, dt)
    if T:
        prev[0] = h0
        prev[1:] = hs[:T - 1]
    if rmask is not None:
        prev *= rmask
    return prev


def _stacked_tn(a, b, dt):
    """``sum_t a_t^T b_t`` over (T, B, .) stacks as one GEMM."""
    T, B, u = a.shape
    out = np.zeros((u, b.shape[2]), dt)
    if T * B and u:
        _gemm_tn(a.reshape(T * B, u), np.ascontiguousarray(b).reshape(T * B, b.shape[2]), out)
    return out


# Column blocks of the recurrent kernel's gradient, one GEMM each, spread over
# the OpenMP threads; fixed, so the result does not depend on the thread count.
DEF DR_BLOCKS = 4


def _gemm_tn(const floating[:, ::1] a, const floating[:, ::1] b, floating[:, ::1] out):
    """``out = a^T @ b`` through BLAS (one thread each), column blocks in parallel."""
    cdef Py_ssize_t n = b.shape[1], blk, c0, c1
    cdef Py_ssize_t width = (n + DR_BLOCKS - 1) // DR_BLOCKS
    cdef int nt = threads_for(2.0 * a.shape[0] * a.shape[1] * n)
    for blk in prange(DR_BLOCKS, nogil=True, schedule='static', num_threads=nt):
        c0 = blk * width
        c1 = c0 + width if c0 + width < n else n
        if c1 > c0:
            gemm(True, False, <int>a.shape[1], <int>(c1 - c0), <int>a.shape[0], <floating>1,
                 &a[0, 0], <int>a.shape[1], &b[0, c0], <int>n, <floating>0, &out[0, c0],
                 <int>n)


cdef cnp.ndarray _steps(bint keep, Py_ssize_t ring, Py_ssize_t T, Py_ssize_t B,
                       Py_ssize_t width, dt):
    """A (T, B, width) record of every step, or with ``keep`` off a ring of
    ``ring`` steps."""
    return _empty3(T if keep else ring, B, width, dt)


cdef inline cnp.ndarray _empty3(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c, dt):
    # np.empty((a, b, c), dt) without its argument parsing (0.4 of the
    # microseconds a batch-1 call spends around its kernel)
    cdef cnp.npy_intp dims[3]
    dims[0], dims[1], dims[2] = a, b, c
    return cnp.PyArray_EMPTY(3, dims, cnp.NPY_FLOAT if dt is np.float32 else cnp.NPY_DOUBLE, 0)


def _absent(dt, _made={}):
    """A read-only (1, 1) array of zeros standing for an absent mask (the
    kernels read it only where the flag says it is there), made once per
    dtype: a batch-1 call spends its time on such bookkeeping."""
    a = _made.get(dt)
    if a is None:
        a = _made[dt] = np.zeros((1, 1), dt)
        a.flags.writeable = False
    return a


cpdef _rmask(rmask, B, u, dt):
    if rmask is None:
        return _absent(dt)
    return np.array(np.broadcast_to(rmask, (B, u)), dtype=dt, order="C")


cpdef _mask(mask, T, B):
    if mask is None:
        return _absent(np.uint8)
    return np.ascontiguousarray(np.broadcast_to(mask, (T, B)), dtype=np.uint8)


# ------------------------------------------------------------------ GRU
#
# Keras's GRUCell (implementation 2). With ``reset_after`` the reset gate
# multiplies the recurrent product: one product per step, ``P = hm @ R + rb``
# (R: (u, 3u), rb: the recurrent bias), and
#     z = ract(xz + P_z), r = ract(xr + P_r), hh = act(xh + r * P_h).
# Without, it multiplies h before a second product: ``P = hm @ R`` (R: (u, 2u))
# gives z and r, then hh = act(xh + (r * hm) @ Rh).
# The new state is ``z * hx + (1 - z) * hh``, hx being hm (Keras mixes the
# dropped-out h when recurrent dropout is on) or h with ``mix_masked`` off.
# Records: gates (T, B, 3u) = z, r, hh; ph (T, B, u) = P_h (reset_after).
# Masked rows record zeros there, so that products over all rows stay finite.


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _gru_fwd_rows(Py_ssize_t b0, Py_ssize_t b1, Py_ssize_t j0, Py_ssize_t j1,
                        Py_ssize_t t0, Py_ssize_t t1, const floating[:, :, ::1] zx,
                        const floating[:, ::1] h0, const floating[:, ::1] y0,
                        const floating[:, ::1] R, const floating *Wp,
                        const floating[:, ::1] Rh, const floating *Whp, Py_ssize_t FB,
                        Py_ssize_t ps, const floating[::1] rb, const floating[:, ::1] rmask,
                        const unsigned char[:, ::1] mask, bint use_rb, bint use_rmask,
                        bint use_mask, bint reset_after, bint mix_masked, int act, int ract,
                        floating[:, :, ::1] hs, floating[:, :, ::1] ys,
                        floating[:, :, ::1] gates, floating[:, :, ::1] ph, floating *hm,
                        floating[:, ::1] P, floating[:, ::1] Q, bint keep,
                        cb_intr* intr, Split *sp, const Proj *pj) noexcept nogil:
    """Steps t0..t1 for rows b0..b1 and units j0..j1, as _lstm_fwd_rows. In a
    units split Wp holds this thread's columns of the gates' products: of R
    for z, r and h with reset_after, else of R for z and r and of Rh, whose
    product reads r * h of every unit: the threads also meet before it.
    hm: b1 - b0 rows of u for the masked h. pj: as _lstm_fwd_rows."""
    cdef Py_ssize_t u = h0.shape[1], NR = R.shape[1]
    cdef Py_ssize_t ti, tp, tg, tz = 0
    cdef Py_ssize_t t, b, j, q, n = b1 - b0, nu = j1 - j0
    cdef const floating *hp
    cdef const floating *hmp
    cdef const floating *hx
    cdef const floating *x
    cdef floating *g
    cdef floating zz, h
    if n <= 0:
        return
    for t in range(t0, t1):
        if sp == NULL and cb_intr_poll(intr):
            return
        _ring(keep, t, &ti, &tp, &tg)
        if pj != NULL:
            _project(pj, t, b0, b1, 3 * u, <floating*>pj.scratch + b0 * pj.width,
                     <floating*>&zx[0, b0, 0])
        else:
            tz = t
        hmp = _recurrent_input(t, tp, b0, b1, h0, hs, rmask, use_rmask, hm)
        if sp == NULL:
            if use_rb:
                for b in range(b0, b1):
                    memcpy(&P[b, 0], &rb[0], NR * sizeof(floating))
            _rec_product(False, n, u, NR, hmp, &R[0, 0], Wp, FB, 1 if use_rb else 0, &P[b0, 0])
        else:
            for q in range(3 if reset_after else 2):
                if use_rb:
                    for b in range(b0, b1):
                        memcpy(&P[b, q * u + j0], &rb[q * u + j0], nu * sizeof(floating))
                _product_ld(n, u, nu, hmp, Wp + q * ps, FB, &P[b0, q * u + j0] if use_rb else NULL,
                            &P[b0, q * u + j0], NR)
        for b in range(b0, b1):
            g = &gates[tg, b, 0]
            x = &zx[tz, b, 0]
            if use_mask and not mask[t, b]:
                for q in range(3):
                    memset(g + q * u + j0, 0, nu * sizeof(floating))
                memset(&Q[b, j0], 0, nu * sizeof(floating))
                if reset_after:
                    memset(&ph[tg, b, j0], 0, nu * sizeof(floating))
                continue
            for j in range(j0, j1):
                g[j] = x[j] + P[b, j]
                g[u + j] = x[u + j] + P[b, u + j]
            _act_row(g + j0, nu, ract)
            _act_row(g + u + j0, nu, ract)
            if reset_after:
                for j in range(j0, j1):
                    ph[tg, b, j] = P[b, 2 * u + j]
                    g[2 * u + j] = x[2 * u + j] + g[u + j] * P[b, 2 * u + j]
            else:
                for j in range(j0, j1):
                    Q[b, j] = g[u + j] * hmp[(b - b0) * u + j]
        if not reset_after and sp == NULL:
            # The candidate's product reads r * hm: a second GEMM per step.
            _rec_product(False, n, u, u, &Q[b0, 0], &Rh[0, 0], Whp, FB, 0, &P[b0, 0])
        elif not reset_after:
            # every unit's r * hm is in Q: the candidate's pre-activation
            # goes straight into the gates, zx's part added after the sum as
            # in the row path; masked rows keep zeros there
            _step_meet(sp, t)
            for b in range(b0, b1):
                memcpy(&gates[tg, b, 2 * u + j0], &zx[tz, b, 2 * u + j0], nu * sizeof(floating))
            _product_ld(n, u, nu, &Q[b0, 0], Wp + 2 * ps, FB, &gates[tg, b0, 2 * u + j0],
                        &gates[tg, b0, 2 * u + j0], 3 * u)
            if use_mask:
                for b in range(b0, b1):
                    if not mask[t, b]:
                        memset(&gates[tg, b, 2 * u + j0], 0, nu * sizeof(floating))
        for b in range(b0, b1):
            if use_mask and not mask[t, b]:
                hp = &h0[b, 0] if t == 0 else &hs[tp, b, 0]
                x = &y0[b, 0] if t == 0 else &ys[t - 1, b, 0]
                memcpy(&hs[ti, b, j0], hp + j0, nu * sizeof(floating))
                memcpy(&ys[t, b, j0], x + j0, nu * sizeof(floating))
                continue
            g = &gates[tg, b, 0]
            if not reset_after and sp == NULL:
                # P is (n, u) here: the product above wrote rows of width u.
                for j in range(u):
                    g[2 * u + j] = zx[tz, b, 2 * u + j] + (&P[b0, 0])[(b - b0) * u + j]
            _act_row(g + 2 * u + j0, nu, act)
            hp = &h0[b, 0] if t == 0 else &hs[tp, b, 0]
            hx = hm + (b - b0) * u if (mix_masked and use_rmask) else hp
            for j in range(j0, j1):
                zz = g[j]
                h = zz * hx[j] + (1 - zz) * g[2 * u + j]
                hs[ti, b, j] = h
                ys[t, b, j] = h
        if sp != NULL and _step_end(sp, t, intr):
            return


cdef void _gru_fwd(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                   const floating[:, ::1] y0, const floating[:, ::1] R, const floating *Wp,
                   const floating[:, ::1] Rh, const floating *Whp, Py_ssize_t FB,
                   const floating[::1] rb, const floating[:, ::1] rmask,
                   const unsigned char[:, ::1] mask, bint use_rb, bint use_rmask, bint use_mask,
                   bint reset_after, bint mix_masked, int act, int ract, floating[:, :, ::1] hs,
                   floating[:, :, ::1] ys, floating[:, :, ::1] gates, floating[:, :, ::1] ph,
                   floating[:, ::1] hm, floating[:, ::1] P, floating[:, ::1] Q,
                   bint keep, const Proj *pj, cb_intr* intr) noexcept nogil:
    # One block of batch rows per thread, all steps (see _lstm_fwd).
    cdef Py_ssize_t T = pj.T if pj != NULL else zx.shape[0], B = zx.shape[1], u = h0.shape[1]
    cdef Py_ssize_t ci, nchunk = _row_blocks(2.0 * T * B * 3 * u * u, B)
    cdef cb_tiles joined
    cdef double join = join_seconds()
    if nchunk <= 1:
        _gru_fwd_rows(0, B, 0, u, 0, T, zx, h0, y0, R, Wp, Rh, Whp, FB, 0, rb, rmask, mask,
                      use_rb, use_rmask, use_mask, reset_after, mix_masked, act, ract, hs, ys,
                      gates, ph, &hm[0, 0], P, Q, keep, intr, NULL, pj)
        return
    # The thread done first with its rows spins for the others before the
    # region ends (include/cyback_tiles.h).
    cb_tiles_init(&joined)
    with parallel(num_threads=nchunk):
        for ci in prange(nchunk, schedule='static'):
            _gru_fwd_rows(ci * B // nchunk, (ci + 1) * B // nchunk, 0, u, 0, T, zx, h0, y0, R, Wp,
                          Rh, Whp, FB, 0, rb, rmask, mask, use_rb, use_rmask, use_mask, reset_after,
                          mix_masked, act, ract, hs, ys, gates, ph, &hm[ci * B // nchunk, 0], P, Q,
                          keep, intr, NULL, pj)
        cb_tiles_join(&joined, cb_get_num_threads(), join)


cdef void _gru_fwd_split(int nsplit, const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                         const floating[:, ::1] y0, const floating[:, ::1] R,
                         const floating *Wfull, Py_ssize_t FBfull, floating *Wp,
                         const floating[:, ::1] Rh, const floating *Whfull, Py_ssize_t FB,
                         Py_ssize_t ps, const floating[::1] rb, const floating[:, ::1] rmask,
                         const unsigned char[:, ::1] mask, bint use_rb, bint use_rmask,
                         bint use_mask, bint reset_after, bint mix_masked, int act, int ract,
                         floating[:, :, ::1] hs, floating[:, :, ::1] ys,
                         floating[:, :, ::1] gates, floating[:, :, ::1] ph, floating *hm,
                         floating[:, ::1] P, floating[:, ::1] Q, bint keep,
                         Py_ssize_t lead, cb_intr* intr) noexcept nogil:
    # The units split of a GRU, joined late (see _lstm_fwd_split); Wfull,
    # Whfull: the row path's operands for the steps thread 0 runs alone.
    cdef Py_ssize_t T = zx.shape[0], B = zx.shape[1], u = h0.shape[1], NR = R.shape[1]
    cdef Py_ssize_t j0 = 0, j1 = 0, q = 0, t = 0     # firstprivate in the block
    cdef int stops[2]
    cdef int tid = 0, nth = 0
    cdef Split sp
    cdef cb_step_join join
    cdef cb_step_count *counts = cb_step_counts_new(nsplit)
    if counts == NULL:
        _gru_fwd_rows(0, B, 0, u, 0, T, zx, h0, y0, R, Wfull, Rh, Whfull, FBfull, 0, rb, rmask,
                      mask, use_rb, use_rmask, use_mask, reset_after, mix_masked, act, ract, hs,
                      ys, gates, ph, hm, P, Q, keep, intr, NULL, NULL)
        return
    stops[0] = stops[1] = 0
    cb_join_init(&join)
    with parallel(num_threads=nsplit):
        tid = cb_get_thread_num()
        nth = cb_get_num_threads()
        sp = Split(tid=tid, nth=nth, meets=1 if reset_after else 2, stops=&stops[0],
                   counts=counts)
        j0 = _unit_start(tid, nth, u)
        j1 = _unit_start(tid + 1, nth, u)
        t = 0
        if tid == 0:
            while _alone(&join, nth, lead, t, T):
                _gru_fwd_rows(0, B, 0, u, t, t + 1, zx, h0, y0, R, Wfull, Rh, Whfull, FBfull, 0,
                              rb, rmask, mask, use_rb, use_rmask, use_mask, reset_after,
                              mix_masked, act, ract, hs, ys, gates, ph, hm, P, Q, keep, intr,
                              NULL, NULL)
                t = T if intr.stop else t + 1
        if tid != 0 or t < T:
            for q in range(3 if reset_after else 2):
                _pack_ld(&R[0, 0] + q * u + j0, u, j1 - j0, NR, FB, Wp + (3 * tid + q) * ps)
            if not reset_after:
                _pack_ld(&Rh[0, 0] + j0, u, j1 - j0, u, FB, Wp + (3 * tid + 2) * ps)
        t = _join_split(&join, tid, nth, lead, t, T)
        if t < T:
            _gru_fwd_rows(0, B, j0, j1, t, T, zx, h0, y0, R, Wp + 3 * tid * ps, Rh, NULL, FB, ps,
                          rb, rmask, mask, use_rb, use_rmask, use_mask, reset_after, mix_masked,
                          act, ract, hs, ys, gates, ph, hm + tid * B * u, P, Q, keep, intr, &sp,
                          NULL)
    cb_step_counts_free(counts)


def _gru_check(name, zx, h0, y0, R, Rh, rb, bint reset_after):
    T, B, u = zx.shape[0], zx.shape[1], h0.shape[1]
    ok = zx.shape[2] == 3 * u and tuple(h0.shape) == (B, u) and tuple(y0.shape) == (B, u) \
        and tuple(R.shape) == (u, (3 if reset_after else 2) * u) \
        and (reset_after or (Rh is not None and tuple(Rh.shape) == (u, u))) \
        and (rb is None or (reset_after and tuple(rb.shape) == (3 * u,)))
    if not ok:
        raise ValueError("%s: shapes zx %s, h0 %s, y0 %s, R %s, Rh %s, rb %s do not agree "
                         "(reset_after=%s)" % (name, np.shape(zx), np.shape(h0), np.shape(y0),
                                               np.shape(R), np.shape(Rh), np.shape(rb),
                                               reset_after))


cpdef tuple _candidate_operand(Rh, Py_ssize_t B, bint trans, dt, Py_ssize_t FB):
    """The GRU's candidate kernel Rh as a contiguous array (a 1x1 stand-in
    with ``reset_after``, which has none) and its packed form for the
    per-step product, or None (see _recurrent_operand), in R's block width FB:
    the kernels take one width for both."""
    rh = np.ascontiguousarray(Rh if Rh is not None else np.zeros((1, 1)), dtype=dt)
    return rh, (_recurrent_operand(rh, B, trans, FB)[0] if Rh is not None else None)


def _gru_forward_split(int nsplit, const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                       const floating[:, ::1] y0, const floating[:, ::1] R, Rh, rb, rmask, mask,
                       bint reset_after, bint mix_masked, int act, int ract, bint keep,
                       floating[:, :, ::1] hs, floating[:, :, ::1] ys,
                       floating[:, :, ::1] gates, floating[:, :, ::1] ph, floating[:, ::1] P,
                       floating[:, ::1] Q):
    """gru_forward's units split, into hs, ys, gates and ph."""
    dt = np.float32 if floating is float else np.float64
    cdef Py_ssize_t T = zx.shape[0], B = zx.shape[1], u = h0.shape[1]
    cdef floating[::1] wsplit, hsplit
    cdef Py_ssize_t FB, ps, FBfull
    wsplit, ps, FB, hsplit = _split_operand(nsplit, u, 3, B, dt)
    full, FBfull = _recurrent_operand(R, B, False)
    rh_arr, full_h = _candidate_operand(Rh, B, False, dt, FBfull)
    cdef const floating[:, ::1] rh = rh_arr
    cdef const floating *Wfull = <const floating*>_address(full)
    cdef const floating *Whfull = <const floating*>_address(full_h)
    cdef Py_ssize_t lead = _TUNE["split_lead_steps"]
    cdef const floating[::1] b_ = np.ascontiguousarray(rb if rb is not None else
                                                       np.zeros(1), dtype=dt)
    cdef const floating[:, ::1] rm = _rmask(rmask, B, u, dt)
    cdef const unsigned char[:, ::1] mk = _mask(mask, T, B)
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        _gru_fwd_split(nsplit, zx, h0, y0, R, Wfull, FBfull, &wsplit[0], rh, Whfull, FB, ps, b_,
                       rm, mk, rb is not None, rmask is not None, mask is not None, reset_after,
                       mix_masked, act, ract, hs, ys, gates, ph, &hsplit[0], P, Q, keep, lead,
                       &intr)
    check_interrupt(&intr)


def gru_forward(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                const floating[:, ::1] y0, const floating[:, ::1] R, Rh, rb, rmask, mask,
                bint reset_after, bint mix_masked, int act, int ract, bint keep=True):
    """Run a GRU sequence (see above); returns ``(hs, ys, gates, ph)``. ``Rh``
    is None with ``reset_after``; ``rb`` is None without a recurrent bias;
    ``keep``: see lstm_forward."""
    return _gru_run(zx, h0, y0, R, Rh, rb, rmask, mask, reset_after, mix_masked, act, ract,
                    keep, NULL, "gru_forward")


def gru_forward_projected(x, W, xb, const floating[:, ::1] h0, const floating[:, ::1] y0,
                          const floating[:, ::1] R, Rh, rb, rmask, mask, bint reset_after,
                          bint mix_masked, int act, int ract, bint keep=True):
    """gru_forward of zx = x @ W (+ xb), W (I, 3u): as lstm_forward_projected."""
    fname = "gru_forward_projected"
    dt = np.float32 if floating is float else np.float64
    cdef Proj pj
    keep_alive = _proj_setup(&pj, x, W, xb, h0.shape[0], 3 * h0.shape[1], dt, fname)
    cdef floating[:, :, ::1] ring = np.empty((1, h0.shape[0], 3 * h0.shape[1]), dt)
    return _gru_run(ring, h0, y0, R, Rh, rb, rmask, mask, reset_after, mix_masked, act, ract,
                    keep, &pj, fname)


cdef tuple _gru_run(const floating[:, :, ::1] zx, const floating[:, ::1] h0,
                    const floating[:, ::1] y0, const floating[:, ::1] R, Rh, rb, rmask, mask,
                    bint reset_after, bint mix_masked, int act, int ract, bint keep, Proj *pj,
                    fname):
    # zx: the projection, or with pj the one-step ring the row blocks fill
    dt = np.float32 if floating is float else np.float64
    _gru_check(fname, zx, h0, y0, R, Rh, rb, reset_after)
    cdef Py_ssize_t T = pj.T if pj != NULL else zx.shape[0], B = zx.shape[1], u = h0.shape[1]
    hs_a, ys_a, gates_a = _steps(keep, 2, T, B, u, dt), _empty3(T, B, u, dt), \
        _steps(keep, 1, T, B, 3 * u, dt)
    ph_a = _steps(keep, 1, T, B, u, dt) if reset_after else np.zeros((1, 1, 1), dt)
    cdef floating[:, :, ::1] hs = hs_a
    cdef floating[:, :, ::1] ys = ys_a
    cdef floating[:, :, ::1] gates = gates_a
    cdef floating[:, :, ::1] ph = ph_a
    cdef floating[:, ::1] hm
    cdef floating[:, ::1] P = np.empty((B, R.shape[1]), dt)
    cdef floating[:, ::1] Q = np.empty((B, u), dt)
    cdef Py_ssize_t FB
    cdef int nsplit = _split_threads(T, B, u, 3, sizeof(floating))
    if nsplit > 1:
        if pj != NULL:
            zx = _projected_whole(pj, zx)
        _gru_forward_split(nsplit, zx, h0, y0, R, Rh, rb, rmask, mask, reset_after,
                           mix_masked, act, ract, keep, hs, ys, gates, ph, P, Q)
        return hs_a, ys_a, gates_a, ph_a
    hm = np.empty((max(1, B), u), dt)
    packed, FB = _recurrent_operand(R, B, False)
    rh_arr, packed_h = _candidate_operand(Rh, B, False, dt, FB)
    cdef const floating[:, ::1] rh = rh_arr
    cdef const floating[::1] b_ = np.ascontiguousarray(rb if rb is not None else
                                                       np.zeros(1), dtype=dt)
    cdef const floating[:, ::1] rm = _rmask(rmask, B, u, dt)
    cdef const unsigned char[:, ::1] mk = _mask(mask, T, B)
    cdef const floating *Wp = <const floating*>_address(packed)
    cdef const floating *Whp = <const floating*>_address(packed_h)
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        _gru_fwd(zx, h0, y0, R, Wp, rh, Whp, FB, b_, rm, mk, rb is not None, rmask is not None,
                 mask is not None, reset_after, mix_masked, act, ract, hs, ys, gates, ph, hm, P,
                 Q, keep, pj, &intr)
    check_interrupt(&intr)
    return hs_a, ys_a, gates_a, ph_a


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _gru_bwd_rows(Py_ssize_t b0, Py_ssize_t b1, const floating[:, :, ::1] dys,
                        floating[:, ::1] dh, floating[:, ::1] dy, const floating[:, ::1] h0,
                        const floating[:, ::1] R, const floating *Wp,
                        const floating[:, ::1] Rh, const floating *Whp, Py_ssize_t FB,
                        const floating[:, ::1] rmask, const unsigned char[:, ::1] mask,
                        bint use_rmask, bint use_mask, bint reset_after, bint mix_masked,
                        int act, int ract, const floating[:, :, ::1] hs,
                        const floating[:, :, ::1] gates, const floating[:, :, ::1] ph,
                        floating[:, :, ::1] D, floating[:, :, ::1] Dh, floating[:, ::1] dhm,
                        floating[:, ::1] dq, floating[:, ::1] dx, cb_intr* intr) noexcept nogil:
    cdef Py_ssize_t T = dys.shape[0], u = h0.shape[1], NR = R.shape[1]
    cdef Py_ssize_t t, b, j, n = b1 - b0
    cdef const floating *hp
    cdef const floating *g
    cdef floating *d
    cdef floating dH, zz, rr, hh, hmj, hx, dah
    if n <= 0:
        return
    for t in range(T - 1, -1, -1):
        if cb_intr_poll(intr):
            return
        for b in range(b0, b1):
            d = &D[t, b, 0]
            if use_mask and not mask[t, b]:
                # States pass through; the output's gradient goes to the
                # previous output.
                memset(d, 0, NR * sizeof(floating))
                memset(&Dh[t, b, 0], 0, u * sizeof(floating))
                memset(&dhm[b, 0], 0, u * sizeof(floating))
                memset(&dx[b, 0], 0, u * sizeof(floating))
                for j in range(u):
                    dy[b, j] = dy[b, j] + dys[t, b, j]
                continue
            hp = &h0[b, 0] if t == 0 else &hs[t - 1, b, 0]
            g = &gates[t, b, 0]
            for j in range(u):
                zz = g[j]
                rr = g[u + j]
                hh = g[2 * u + j]
                hmj = hp[j] * rmask[b, j] if use_rmask else hp[j]
                hx = hmj if mix_masked else hp[j]
                dH = dh[b, j] + dys[t, b, j] + dy[b, j]
                d[j] = dH * (hx - hh) * _dact(zz, ract)
                dah = dH * (1 - zz) * _dact(hh, act)
                Dh[t, b, j] = dah
                if reset_after:
                    d[u + j] = dah * ph[t, b, j] * _dact(rr, ract)
                    d[2 * u + j] = dah * rr
                if mix_masked:
                    dhm[b, j] = dH * zz
                    dx[b, j] = 0
                else:
                    dhm[b, j] = 0
                    dx[b, j] = dH * zz
                dh[b, j] = 0
                dy[b, j] = 0
        if not reset_after:
            # r multiplied hm before the candidate's product: its gradient
            # needs dah @ Rh^T first.
            _rec_product(True, n, u, u, &Dh[t, b0, 0], &Rh[0, 0], Whp, FB, 0, &dq[b0, 0])
            for b in range(b0, b1):
                if use_mask and not mask[t, b]:
                    continue
                hp = &h0[b, 0] if t == 0 else &hs[t - 1, b, 0]
                g = &gates[t, b, 0]
                d = &D[t, b, 0]
                for j in range(u):
                    rr = g[u + j]
                    hmj = hp[j] * rmask[b, j] if use_rmask else hp[j]
                    d[u + j] = dq[b, j] * hmj * _dact(rr, ract)
                    dhm[b, j] += dq[b, j] * rr
        _rec_product(True, n, u, NR, &D[t, b0, 0], &R[0, 0], Wp, FB, 1, &dhm[b0, 0])
        for b in range(b0, b1):
            for j in range(u):
                dh[b, j] += (dhm[b, j] * rmask[b, j] if use_rmask else dhm[b, j]) + dx[b, j]


cdef void _gru_bwd(const floating[:, :, ::1] dys, floating[:, ::1] dh, floating[:, ::1] dy,
                   const floating[:, ::1] h0, const floating[:, ::1] R, const floating *Wp,
                   const floating[:, ::1] Rh, const floating *Whp, Py_ssize_t FB,
                   const floating[:, ::1] rmask, const unsigned char[:, ::1] mask,
                   bint use_rmask, bint use_mask, bint reset_after, bint mix_masked, int act,
                   int ract, const floating[:, :, ::1] hs, const floating[:, :, ::1] gates,
                   const floating[:, :, ::1] ph, floating[:, :, ::1] D, floating[:, :, ::1] Dh,
                   floating[:, ::1] dhm, floating[:, ::1] dq, floating[:, ::1] dx,
                   cb_intr* intr) noexcept nogil:
    # One block of batch rows per thread, all steps (see _lstm_fwd).
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = h0.shape[1]
    cdef Py_ssize_t ci, nchunk = _row_blocks(2.0 * T * B * 3 * u * u, B)
    cdef cb_tiles joined
    cdef double join = join_seconds()
    if nchunk <= 1:
        _gru_bwd_rows(0, B, dys, dh, dy, h0, R, Wp, Rh, Whp, FB, rmask, mask, use_rmask,
                      use_mask, reset_after, mix_masked, act, ract, hs, gates, ph, D, Dh, dhm,
                      dq, dx, intr)
        return
    # The thread done first with its rows spins for the others before the
    # region ends (include/cyback_tiles.h).
    cb_tiles_init(&joined)
    with parallel(num_threads=nchunk):
        for ci in prange(nchunk, schedule='static'):
            _gru_bwd_rows(ci * B // nchunk, (ci + 1) * B // nchunk, dys, dh, dy, h0, R, Wp, Rh, Whp,
                          FB, rmask, mask, use_rmask, use_mask, reset_after, mix_masked, act, ract,
                          hs, gates, ph, D, Dh, dhm, dq, dx, intr)
        cb_tiles_join(&joined, cb_get_num_threads(), join)


def gru_backward(const floating[:, :, ::1] dys, dhT, dyT, const floating[:, ::1] h0,
                 const floating[:, ::1] R, Rh, rb, rmask, mask, bint reset_after,
                 bint mix_masked, int act, int ract, const floating[:, :, ::1] hs,
                 const floating[:, :, ::1] gates, ph):
    """Backprop through time of ``gru_forward``: ``(dxz, dxr, dxh, dh0, dy0, dR,
    dRh, drb)``, the first three being the gradients of the three slices of the
    input projection; dRh is None with ``reset_after``, drb None without rb."""
    cdef Py_ssize_t T = dys.shape[0], B = dys.shape[1], u = h0.shape[1]
    dt = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] dh = np.array(dhT, dtype=dt, order="C", copy=True)
    cdef floating[:, ::1] dy = np.array(dyT, dtype=dt, order="C", copy=True)
    cdef floating[:, :, ::1] D = np.empty((T, B, R.shape[1]), dt)
    cdef floating[:, :, ::1] Dh = np.empty((T, B, u), dt)
    cdef floating[:, ::1] dhm = np.empty((B, u), dt)
    cdef floating[:, ::1] dq = np.empty((B, u), dt)
    cdef floating[:, ::1] dx = np.empty((B, u), dt)
    cdef Py_ssize_t FB
    packed, FB = _recurrent_operand(R, B, True)
    rh_arr, packed_h = _candidate_operand(Rh, B, True, dt, FB)
    cdef const floating[:, ::1] rh = rh_arr
    cdef const floating[:, :, ::1] ph_ = np.ascontiguousarray(ph, dtype=dt)
    cdef const floating[:, ::1] rm = _rmask(rmask, B, u, dt)
    cdef const unsigned char[:, ::1] mk = _mask(mask, T, B)
    cdef const floating *Wp = <const floating*>_address(packed)
    cdef const floating *Whp = <const floating*>_address(packed_h)
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        _gru_bwd(dys, dh, dy, h0, R, Wp, rh, Whp, FB, rm, mk, rmask is not None,
                 mask is not None, reset_after, mix_masked, act, ract, hs, gates, ph_, D, Dh,
                 dhm, dq, dx, &intr)
    check_interrupt(&intr)
    hs_a, D_a, Dh_a = np.asarray(hs), np.asarray(D), np.asarray(Dh)
    prev = _previous_states(hs_a, np.asarray(h0), rmask, dt)
    dR = _stacked_tn(prev, D_a, dt)
    dRh = None
    if not reset_after:
        # The candidate's product read r * hm.
        prev *= np.asarray(gates)[:, :, u:2 * u]
        dRh = _stacked_tn(prev, Dh_a, dt)
    drb = D_a.sum(axis=(0, 1)) if rb is not None else None
    return D_a[:, :, :u], D_a[:, :, u:2 * u], Dh_a, np.asarray(dh), np.asarray(dy), dR, dRh, drb
