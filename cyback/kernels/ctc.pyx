# distutils: language = c++
"""Connectionist temporal classification: loss with gradient, greedy and beam decoding.

All three entries take batch-major ``(B, T, K)`` float32/float64 score arrays and
per-sequence lengths; frames at or after ``input_lengths[b]`` are ignored. The
blank class defaults to ``K - 1`` (Keras/TensorFlow convention); ``blank=-1``
means exactly that, and any other index in ``[-K, K)`` is accepted.

Everything probabilistic is done in log space in float64, whatever the input
dtype: float32 inputs cost one conversion per element and make losses of
sequences thousands of frames long exact to float32 rounding.
"""
import numpy as np
from cython.parallel cimport prange
from libc.math cimport exp, log, log1p, INFINITY
from libc.stdlib cimport calloc, malloc, free
from libcpp.utility cimport pair

from cyback.kernels._blas cimport floating
from cyback.kernels._omp cimport cb_get_thread_num
from cyback.kernels.runtime cimport team_size, threads_for
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt

cdef extern from "cyback_math.h" nogil:
    double cb_log_add_exp(double a, double b)

# Declared without ``except +``: on raw pointers of pairs these cannot throw,
# and the kernels that call them run without the GIL.
cdef extern from "<algorithm>" namespace "std" nogil:
    void std_nth_element "std::nth_element"[Iter](Iter first, Iter nth, Iter last)
    void std_sort "std::sort"[Iter](Iter first, Iter last)

ctypedef long long i64
ctypedef pair[double, i64] cand_t

cdef double NEG_INF = -INFINITY
# Trellis cells (frames x (states + classes)) below which ctc_loss runs on one
# thread; see ctc_loss.
PAR_CELLS = 1 << 16


cdef inline double _lse3(double a, double b, double c) noexcept nogil:
    # The largest term contributes exp(0) = 1: two exps and a log1p, not three
    # exps and a log.
    cdef double m, r
    if a >= b and a >= c:
        m = a
        r = exp(b - m) + exp(c - m)
    elif b >= c:
        m = b
        r = exp(a - m) + exp(c - m)
    else:
        m = c
        r = exp(a - m) + exp(b - m)
    if m == NEG_INF:
        return NEG_INF
    return m + log1p(r)


cdef inline void _log_softmax_row(const floating* x, int K, double* out) noexcept nogil:
    cdef int k
    cdef double m = <double>x[0], s = 0.0
    for k in range(1, K):
        if x[k] > m:
            m = <double>x[k]
    for k in range(K):
        s += exp(<double>x[k] - m)
    s = m + log(s)
    for k in range(K):
        out[k] = <double>x[k] - s


# ---------------------------------------------------------------------------
# Loss and gradient
# ---------------------------------------------------------------------------

# The states live at frame t: reachable from the first two states and still
# able to reach the last two in the frames left.
cdef inline int _lowest_live(int S, int T, int t) noexcept nogil:
    return S - 2 * (T - t) if S - 2 * (T - t) > 0 else 0


cdef inline int _highest_live(int S, int t) noexcept nogil:
    return 2 * t + 1 if 2 * t + 1 < S - 1 else S - 1


cdef void _ctc_one(const floating* x, int T, int Tmax, int K, const i64* lab, int L,
                   int blank, double* dscr, int* iscr, floating* grad,
                   floating* loss, cb_intr* intr) noexcept nogil:
    """Loss and d loss / d logits for one sequence.

    States s = 0..S-1 (S = 2L+1) alternate blank / label; alpha rows carry two
    leading -inf pads so s-1 and s-2 never need a bounds test, beta rows two
    trailing pads for s+1, s+2. Only states that are both reachable from the
    start and can still reach the end in the frames left are computed.
    """
    cdef int S = 2 * L + 1, W = S + 2
    cdef int t, s, k, lo, hi, need, nrep
    cdef double logp, v
    cdef double* lsm = dscr                   # (T, K) log-softmax
    cdef double* alpha = lsm + <i64>T * K     # (T, W), state s at column s + 2
    cdef double* bcur = alpha + <i64>T * W    # (W) beta_t, state s at column s
    cdef double* bnext = bcur + W             # (W) beta_{t+1} + emission at t+1
    cdef double* occ = bnext + W              # (K)
    cdef double* tmp
    cdef int* ext = iscr                      # (W) class of state s
    cdef int* skip = ext + W                  # (W) may enter s from s-2
    cdef double* arow
    cdef double* aprev
    cdef double* lrow

    for t in range(T, Tmax):
        for k in range(K):
            grad[<i64>t * K + k] = 0
    nrep = 0
    for s in range(1, L):
        if lab[s] == lab[s - 1]:
            nrep += 1
    need = L + nrep
    if T < need or T == 0:
        # No alignment exists (TensorFlow raises "Not enough time for target
        # transition sequence" here); report an infinite loss and no gradient
        # so one bad sample cannot poison a batch with NaN.
        loss[0] = 0 if (T == 0 and L == 0) else INFINITY
        for t in range(T):
            for k in range(K):
                grad[<i64>t * K + k] = 0
        return

    for s in range(W):
        ext[s] = blank
        skip[s] = 0
    for s in range(L):
        ext[2 * s + 1] = <int>lab[s]
        # TensorFlow's rule: a label state is entered from two states back only
        # when it is no repeat and no blank (a label may equal the blank index).
        if s > 0 and lab[s] != lab[s - 1] and lab[s] != blank:
            skip[2 * s + 1] = 1

    for t in range(T):
        _log_softmax_row(x + <i64>t * K, K, lsm + <i64>t * K)

    # Forward.
    for t in range(T):
        if cb_intr_poll(intr):
            return
        arow = alpha + <i64>t * W
        lrow = lsm + <i64>t * K
        lo = _lowest_live(S, T, t)
        hi = _highest_live(S, t)
        for s in range(W):
            arow[s] = NEG_INF
        if t == 0:
            arow[2] = lrow[ext[0]]
            if S > 1:
                arow[3] = lrow[ext[1]]
            continue
        aprev = arow - W
        for s in range(lo, hi + 1):
            if skip[s]:
                v = _lse3(aprev[s + 2], aprev[s + 1], aprev[s])
            else:
                v = cb_log_add_exp(aprev[s + 2], aprev[s + 1])
            arow[s + 2] = v + lrow[ext[s]]
    arow = alpha + <i64>(T - 1) * W
    logp = arow[S + 1]
    if S > 1:
        logp = cb_log_add_exp(logp, arow[S])
    if logp == NEG_INF:
        loss[0] = INFINITY
        for t in range(T):
            for k in range(K):
                grad[<i64>t * K + k] = 0
        return
    loss[0] = <floating>(-logp)

    # Backward, turning each frame's occupancy into its gradient row at once.
    for s in range(W):
        bcur[s] = NEG_INF
        bnext[s] = NEG_INF
    bcur[S - 1] = 0.0
    if S > 1:
        bcur[S - 2] = 0.0
    t = T - 1
    while t >= 0:
        if cb_intr_poll(intr):
            return
        lo = _lowest_live(S, T, t)
        hi = _highest_live(S, t)
        lrow = lsm + <i64>t * K
        arow = alpha + <i64>t * W
        if t < T - 1:
            for s in range(lo, hi + 1):
                if skip[s + 2]:
                    bcur[s] = _lse3(bnext[s], bnext[s + 1], bnext[s + 2])
                else:
                    bcur[s] = cb_log_add_exp(bnext[s], bnext[s + 1])
        for k in range(K):
            occ[k] = 0.0
        for s in range(lo, hi + 1):
            v = arow[s + 2] + bcur[s] - logp
            if v > NEG_INF:
                occ[ext[s]] += exp(v)
        for k in range(K):
            grad[<i64>t * K + k] = <floating>(exp(lrow[k]) - occ[k])
        # bnext <- beta_t + emission at t, for the step to t-1; states outside
        # [lo, hi] stay -inf because this frame never computed them.
        for s in range(W):
            bnext[s] = NEG_INF
        for s in range(lo, hi + 1):
            bnext[s] = bcur[s] + lrow[ext[s]]
        for s in range(W):
            bcur[s] = NEG_INF
        t -= 1


# The batch loops are typed with the fused float type: Cython picks the float
# or double specialisation from the score array it is given.

def _ctc_batch(floating[:, :, ::1] x, i64[:, ::1] labels, i64[::1] in_len, i64[::1] lab_len,
               int blank, double[:, ::1] dscr, int[:, ::1] iscr, floating[:, :, ::1] grad,
               floating[::1] loss, bint par):
    cdef Py_ssize_t b, nb = x.shape[0]
    cdef int Tmax = x.shape[1], K = x.shape[2]
    cdef int tid
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        for b in prange(nb, schedule='static', use_threads_if=par,
                        num_threads=dscr.shape[0]):
            tid = cb_get_thread_num()
            _ctc_one(&x[b, 0, 0], <int>in_len[b], Tmax, K, &labels[b, 0], <int>lab_len[b],
                     blank, &dscr[tid, 0], &iscr[tid, 0], &grad[b, 0, 0], &loss[b], &intr)
    check_interrupt(&intr)


# ---------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------

def _check_scores(name, x):
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError("%s: expected scores of shape (batch, time, classes), got shape %s"
                         % (name, x.shape))
    if x.dtype not in (np.float32, np.float64):
        if x.dtype == np.float16:
            x = x.astype(np.float32)
        else:
            raise TypeError("%s: expected float32 or float64 scores, got %s" % (name, x.dtype))
    if x.shape[2] < 1:
        raise ValueError("%s: need at least one class (the blank), got shape %s"
                         % (name, x.shape))
    return np.ascontiguousarray(x)


def _check_lengths(name, what, n, nb, upper, upper_name):
    a = np.asarray(n)
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.ndim != 1 or a.shape[0] != nb:
        raise ValueError("%s: %s must have shape (%d,) or (%d, 1), got %s"
                         % (name, what, nb, nb, a.shape))
    if a.dtype.kind == "f":
        # Keras models often carry lengths as floats; whole numbers are fine.
        if not np.all(np.isfinite(a)) or np.any(a != np.floor(a)):
            raise ValueError("%s: %s must hold whole numbers" % (name, what))
    elif a.dtype.kind not in "iub" and a.size:
        raise TypeError("%s: %s must be integers, got %s" % (name, what, a.dtype))
    a = np.ascontiguousarray(a, dtype=np.int64)
    if a.size and (a.min() < 0 or a.max() > upper):
        raise ValueError("%s: %s must lie in [0, %d] (%s), got values in [%d, %d]"
                         % (name, what, upper, upper_name, a.min(), a.max()))
    return a


def _check_blank(name, blank, K):
    blank = int(blank)
    if not -K <= blank < K:
        raise ValueError("%s: blank=%d out of range for %d classes" % (name, blank, K))
    return blank % K


# ---------------------------------------------------------------------------
# Python entries
# ---------------------------------------------------------------------------

def ctc_loss(logits, labels, input_lengths, label_lengths, blank=-1):
    """CTC negative log-likelihood and its gradient with respect to the logits.

    logits: (B, T, K) float32/float64, unnormalised scores; a log-softmax over K
        is applied here (so log-probabilities pass through unchanged).
    labels: (B, Lmax) integers, padded; only labels[b, :label_lengths[b]] are read
        and they must lie in [0, K). A label equal to the blank is accepted, as
        TensorFlow accepts it (Keras's OCR example labels blank images so): it is
        an ordinary state of the extended label that emits the blank class.
    input_lengths: (B,) or (B, 1) integers in [0, T]; label_lengths likewise in [0, Lmax].

    Returns ``(loss, grad)``: loss (B,) = -log p(labels[b] | logits[b]), grad
    (B, T, K) = softmax - posterior occupancy per class, zero for t >= input_lengths[b].
    A label that needs more frames than input_lengths[b] provides (its length plus
    one blank between each pair of equal neighbours) gets loss +inf and a zero
    gradient instead of TensorFlow's error.
    """
    name = "ctc_loss"
    x = _check_scores(name, logits)
    out_dtype = np.asarray(logits).dtype if np.asarray(logits).dtype == np.float16 else x.dtype
    nb, T, K = x.shape
    blank = _check_blank(name, blank, K)
    lab = np.asarray(labels)
    if lab.ndim == 1 and nb == 0:
        lab = lab.reshape(0, 0)
    if lab.ndim != 2 or lab.shape[0] != nb:
        raise ValueError("%s: labels must have shape (%d, max_label_length), got %s"
                         % (name, nb, lab.shape))
    if lab.dtype.kind not in "iuf" and lab.size:
        raise TypeError("%s: labels must be integers, got %s" % (name, lab.dtype))
    Lmax = lab.shape[1]
    in_len = _check_lengths(name, "input_lengths", input_lengths, nb, T, "time steps")
    lab_len = _check_lengths(name, "label_lengths", label_lengths, nb, Lmax, "label columns")
    used = np.arange(Lmax)[None, :] < lab_len[:, None]
    if lab.dtype.kind == "f":
        # Keras's y_true is usually float; only the labels in use must be whole.
        vals = lab[used]
        if vals.size and (not np.all(np.isfinite(vals)) or np.any(vals != np.floor(vals))):
            raise ValueError("%s: label values must be whole numbers" % name)
        lab = np.where(used, lab, 0)
    lab = np.ascontiguousarray(lab, dtype=np.int64)
    if nb and Lmax:
        vals = lab[used]
        if vals.size and (vals.min() < 0 or vals.max() >= K):
            raise ValueError("%s: label values must lie in [0, %d); got values in [%d, %d]"
                             % (name, K, vals.min(), vals.max()))
    if lab.shape[1] == 0:
        lab = np.zeros((nb, 1), dtype=np.int64)   # keeps &labels[b, 0] addressable
    loss = np.empty(nb, dtype=x.dtype)
    grad = np.empty((nb, T, K), dtype=x.dtype)   # the kernel writes every element
    if nb == 0:
        return loss.astype(out_dtype), grad.astype(out_dtype)
    if T == 0:
        loss[:] = np.where(lab_len == 0, 0.0, np.inf)
        return loss.astype(out_dtype), grad.astype(out_dtype)
    # Scratch sized for the longest sequence, one slab per thread, so the
    # parallel loop never allocates.
    S = 2 * int(lab_len.max()) + 1
    Tm = int(in_len.max())
    nthreads = max(1, team_size())
    dscr = np.empty((nthreads, Tm * K + Tm * (S + 2) + 2 * (S + 2) + K + 1), dtype=np.float64)
    iscr = np.empty((nthreads, 2 * (S + 2)), dtype=np.intc)
    # Below PAR_CELLS trellis cells (a few ms of work) one thread wins, since
    # waking the team costs little on an idle machine but whole scheduler
    # slices on a busy one (benchmarks/bench_ctc.py).
    cells = int(np.sum(in_len * (2 * lab_len + 1 + K)))
    par = nb > 1 and cells > PAR_CELLS
    _ctc_batch(x, lab, in_len, lab_len, blank, dscr, iscr, grad, loss, par)
    if out_dtype != x.dtype:
        return loss.astype(out_dtype), grad.astype(out_dtype)
    return loss, grad


# ---------------------------------------------------------------------------
# Greedy (best path) decoding
# ---------------------------------------------------------------------------

def _greedy_batch(floating[:, :, ::1] x, i64[::1] in_len, int blank, bint merge,
                  i64[:, ::1] out, i64[::1] count, double[::1] score):
    cdef Py_ssize_t b, nb = x.shape[0]
    cdef int K = x.shape[2]
    cdef int t, k, best, prev, n
    cdef double s
    cdef const floating* row
    # An argmax pass is memory-bound and quick: below ~1M scores waking a
    # thread team costs more than it saves.
    cdef bint par = nb > 1 and <i64>nb * x.shape[1] * K > (1 << 20)
    cdef int nt = team_size()
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        for b in prange(nb, schedule='static', use_threads_if=par, num_threads=nt):
            if cb_intr_poll(&intr):
                continue
            prev = -1
            n = 0
            s = 0.0
            for t in range(<int>in_len[b]):
                row = &x[b, t, 0]
                best = 0
                for k in range(1, K):
                    if row[k] > row[best]:
                        best = k
                s = s - <double>row[best]
                if best != blank and not (merge and best == prev):
                    out[b, n] = best
                    n = n + 1
                prev = best
            count[b] = n
            score[b] = s
    check_interrupt(&intr)


def ctc_greedy_decode(logits_or_logprobs, input_lengths, merge_repeated=True, blank=-1):
    """Best-path decoding: per-frame argmax, merge repeats, drop blanks.

    Takes (B, T, K) float32/float64 scores (logits or log-probabilities: argmax
    is the same). Repeats are merged before blanks are dropped, so
    ``a _ a`` decodes to ``a a``; ties go to the lowest class index.

    Returns ``(decoded, log_prob)``: decoded (B, max_len) int64 padded with -1,
    max_len the longest decoded sequence in the batch (0 when all are empty);
    log_prob (B, 1) in the input dtype, TensorFlow's convention: minus the sum
    over frames t < input_lengths[b] of the per-frame maximum score.
    """
    name = "ctc_greedy_decode"
    x = _check_scores(name, logits_or_logprobs)
    out_dtype = np.asarray(logits_or_logprobs).dtype \
        if np.asarray(logits_or_logprobs).dtype == np.float16 else x.dtype
    nb, T, K = x.shape
    blank = _check_blank(name, blank, K)
    in_len = _check_lengths(name, "input_lengths", input_lengths, nb, T, "time steps")
    out = np.full((nb, max(T, 1)), -1, dtype=np.int64)
    count = np.zeros(nb, dtype=np.int64)
    score = np.zeros(nb, dtype=np.float64)
    if nb and T:
        _greedy_batch(x, in_len, blank, bool(merge_repeated), out, count, score)
    n = int(count.max()) if nb else 0
    return np.ascontiguousarray(out[:, :n]), score.reshape(nb, 1).astype(out_dtype)


# ---------------------------------------------------------------------------
# Prefix beam search
# ---------------------------------------------------------------------------

cdef struct BeamState:
    # Prefix trie: one node per distinct prefix that ever entered the beam, so
    # two beam entries can never stand for the same label sequence.
    int* parent
    int* label
    int* first_child
    int* next_sibling
    int* beam_pos        # index in the current beam, -1 when not in it
    int nnodes


cdef int _child(BeamState* st, int node, int c) noexcept nogil:
    cdef int n = st.first_child[node]
    while n >= 0:
        if st.label[n] == c:
            return n
        n = st.next_sibling[n]
    n = st.nnodes
    st.nnodes += 1
    st.parent[n] = node
    st.label[n] = c
    st.first_child[n] = -1
    st.next_sibling[n] = st.first_child[node]
    st.first_child[node] = n
    st.beam_pos[n] = -1
    return n


cdef int _beam_one(const floating* x, int T, int K, int blank, int width, int top,
                   bint merge, i64* out_lab, i64* out_len, double* out_lp,
                   int Tmax, cb_intr* intr) noexcept nogil:
    """Beam search for one sequence; returns 0, or -1 when out of memory.

    Every beam entry keeps log P(prefix, path ends in blank) and log P(prefix,
    path ends in its last label). A step scores each entry's own continuation
    and each one-label extension, folds an extension that equals an entry
    already in the beam into that entry, and keeps the `width` best totals.
    Writes `top` paths: out_lab (top, Tmax) labels, out_len (top), out_lp (top).
    """
    cdef int maxnodes = 1 + width * T
    cdef i64 ncand_max = <i64>width * K + width
    cdef BeamState st
    cdef int* ibuf = <int*>malloc(sizeof(int) * (5 * <i64>maxnodes + 2 * <i64>width))
    cdef double* dbuf = <double*>malloc(sizeof(double) * (<i64>K + 7 * <i64>width))
    cdef cand_t* cand = <cand_t*>malloc(sizeof(cand_t) * ncand_max)
    cdef cand_t* order = <cand_t*>malloc(sizeof(cand_t) * K)
    cdef unsigned char* used = <unsigned char*>calloc(<i64>width * K, 1)
    cdef int* node
    cdef int* nnode
    cdef int* itmp
    cdef double* lp
    cdef double* pb
    cdef double* pnb
    cdef double* npb
    cdef double* npnb
    cdef double* qb
    cdef double* qnb
    cdef double* tot
    cdef double* dtmp
    cdef int t, i, j, c, n, r, nbeam, nnew, p, last, m, nlab
    cdef i64 nc, id_
    cdef double thr, v, src
    if ibuf == NULL or dbuf == NULL or cand == NULL or order == NULL or used == NULL:
        free(ibuf)
        free(dbuf)
        free(cand)
        free(order)
        free(used)
        return -1
    st.parent = ibuf
    st.label = st.parent + maxnodes
    st.first_child = st.label + maxnodes
    st.next_sibling = st.first_child + maxnodes
    st.beam_pos = st.next_sibling + maxnodes
    node = st.beam_pos + maxnodes
    nnode = node + width
    lp = dbuf
    pb = lp + K
    pnb = pb + width
    npb = pnb + width
    npnb = npb + width
    qb = npnb + width
    qnb = qb + width
    tot = qnb + width

    st.nnodes = 1
    st.parent[0] = -1
    st.label[0] = -1
    st.first_child[0] = -1
    st.next_sibling[0] = -1
    st.beam_pos[0] = 0
    node[0] = 0
    pb[0] = 0.0
    pnb[0] = NEG_INF
    nbeam = 1

    for t in range(T):
        if cb_intr_poll(intr):
            break
        _log_softmax_row(x + <i64>t * K, K, lp)
        for c in range(K):
            if lp[c] != lp[c]:
                # NaN would break the strict ordering std::sort relies on.
                lp[c] = NEG_INF
        # Labels by falling probability, so each entry's extensions can stop
        # at the first one that cannot beat the threshold.
        nlab = 0
        for c in range(K):
            if c != blank:
                order[nlab].first = -lp[c]
                order[nlab].second = c
                nlab += 1
        std_sort(order, order + nlab)
        for i in range(nbeam):
            tot[i] = cb_log_add_exp(pb[i], pnb[i])
            npb[i] = tot[i] + lp[blank]
            last = st.label[node[i]]
            npnb[i] = pnb[i] + lp[last] if last >= 0 else NEG_INF
        # An extension of entry j that is itself entry i goes into i's score,
        # and is not offered again as a new candidate.
        for i in range(nbeam):
            n = node[i]
            if n == 0:
                continue
            j = st.beam_pos[st.parent[n]]
            if j >= 0:
                c = st.label[n]
                # A repeated label is a new symbol only after a blank.
                src = pb[j] if c == st.label[node[j]] else tot[j]
                npnb[i] = cb_log_add_exp(npnb[i], src + lp[c])
                used[<i64>j * K + c] = 1
        # Candidates order ascending on (-score, id): best first, ties to the
        # lower id (existing entries before extensions). Once `width` of them
        # are known, the worst of those is a bar any newcomer must clear; the
        # list is cut back to `width` whenever it doubles, raising the bar.
        nc = 0
        thr = NEG_INF
        for i in range(nbeam):
            v = cb_log_add_exp(npb[i], npnb[i])
            cand[nc].first = -v
            cand[nc].second = i
            nc += 1
            if i == 0 or v < thr:
                thr = v
        if nbeam < width:
            thr = NEG_INF
        # Entries come sorted by their previous total, so once the best label
        # cannot lift an entry over the bar, no later entry can either.
        for i in range(nbeam):
            if nlab == 0 or tot[i] + lp[<int>order[0].second] <= thr:
                break
            last = st.label[node[i]]
            for r in range(nlab):
                c = <int>order[r].second
                if tot[i] + lp[c] <= thr:
                    break
                if used[<i64>i * K + c]:
                    continue
                v = (pb[i] if c == last else tot[i]) + lp[c]
                if v <= thr:
                    continue
                cand[nc].first = -v
                cand[nc].second = width + <i64>i * K + c
                nc += 1
                if nc >= 2 * width:
                    std_nth_element(cand, cand + width - 1, cand + nc)
                    nc = width
                    thr = -cand[width - 1].first
        for i in range(nbeam):
            n = node[i]
            if n != 0:
                j = st.beam_pos[st.parent[n]]
                if j >= 0:
                    used[<i64>j * K + st.label[n]] = 0
        if nc > width:
            std_nth_element(cand, cand + width - 1, cand + nc)
            nc = width
        std_sort(cand, cand + nc)
        for i in range(nbeam):
            st.beam_pos[node[i]] = -1
        nnew = 0
        for m in range(<int>nc):
            if cand[m].first == INFINITY:
                continue     # probability zero: not a real hypothesis
            id_ = cand[m].second
            if id_ < width:
                i = <int>id_
                nnode[nnew] = node[i]
                qb[nnew] = npb[i]
                qnb[nnew] = npnb[i]
            else:
                id_ -= width
                i = <int>(id_ // K)
                c = <int>(id_ - <i64>i * K)
                nnode[nnew] = _child(&st, node[i], c)
                qb[nnew] = NEG_INF
                qnb[nnew] = -cand[m].first
            nnew += 1
        for i in range(nnew):
            st.beam_pos[nnode[i]] = i
        itmp = node
        node = nnode
        nnode = itmp
        dtmp = pb
        pb = qb
        qb = dtmp
        dtmp = pnb
        pnb = qnb
        qnb = dtmp
        nbeam = nnew

    nc = 0
    for i in range(nbeam):
        cand[nc].first = -cb_log_add_exp(pb[i], pnb[i])
        cand[nc].second = i
        nc += 1
    std_sort(cand, cand + nc)
    for m in range(top):
        if m >= nc:
            out_len[m] = 0
            out_lp[m] = NEG_INF
            continue
        n = node[<int>cand[m].second]
        out_lp[m] = -cand[m].first
        j = 0
        p = n
        while p > 0:
            j += 1
            p = st.parent[p]
        out_len[m] = j
        p = n
        while p > 0:
            j -= 1
            out_lab[<i64>m * Tmax + j] = st.label[p]
            p = st.parent[p]
        if merge and out_len[m] > 1:
            # TensorFlow's merge_repeated on beams: collapse equal neighbours
            # of the finished label sequence.
            j = 1
            for i in range(1, <int>out_len[m]):
                if out_lab[<i64>m * Tmax + i] != out_lab[<i64>m * Tmax + j - 1]:
                    out_lab[<i64>m * Tmax + j] = out_lab[<i64>m * Tmax + i]
                    j += 1
            for i in range(j, <int>out_len[m]):
                out_lab[<i64>m * Tmax + i] = -1
            out_len[m] = j
    free(ibuf)
    free(dbuf)
    free(cand)
    free(order)
    free(used)
    return 0


def _beam_batch(floating[:, :, ::1] x, i64[::1] in_len, int blank, int width, int top,
                bint merge, i64[:, :, ::1] out, i64[:, ::1] lens, double[:, ::1] lps,
                int[::1] status, int nt):
    cdef Py_ssize_t b, nb = x.shape[0]
    cdef int Tmax = x.shape[1], K = x.shape[2]
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        for b in prange(nb, schedule='static', num_threads=nt):
            status[b] = _beam_one(&x[b, 0, 0], <int>in_len[b], K, blank, width, top, merge,
                                  &out[b, 0, 0], &lens[b, 0], &lps[b, 0], Tmax, &intr)
    check_interrupt(&intr)


def ctc_beam_decode(logprobs, input_lengths, beam_width=100, top_paths=1, blank=-1,
                    merge_repeated=False):
    """CTC prefix beam search, parallel over the batch.

    logprobs: (B, T, K) float32/float64 logits or log-probabilities; each frame
        is log-softmax normalised first, as TensorFlow's decoder does.
    Keeps the `beam_width` most probable label prefixes per frame, each scored
    by the total probability of all its alignments so far, and returns the
    `top_paths` best after frame input_lengths[b] - 1.

    Returns ``(decoded, log_probs)``: decoded is a list of `top_paths` int64
    arrays (B, max_len_i) padded with -1 (max_len_i the longest i-th path in the
    batch); log_probs (B, top_paths) in the input dtype, the log-probability of
    each decoded sequence. When fewer than `top_paths` distinct prefixes exist
    (very short inputs) the missing paths are empty with log-probability -inf.
    merge_repeated=True collapses equal neighbours in each returned path
    (TensorFlow v1's default, which Keras's ctc_decode does not override).
    """
    name = "ctc_beam_decode"
    x = _check_scores(name, logprobs)
    out_dtype = np.asarray(logprobs).dtype if np.asarray(logprobs).dtype == np.float16 \
        else x.dtype
    nb, T, K = x.shape
    blank = _check_blank(name, blank, K)
    in_len = _check_lengths(name, "input_lengths", input_lengths, nb, T, "time steps")
    try:
        beam_width = int(beam_width)
        top_paths = int(top_paths)
    except (TypeError, ValueError):
        raise TypeError("%s: beam_width and top_paths must be integers" % name)
    if beam_width < 1:
        raise ValueError("%s: beam_width must be >= 1, got %d" % (name, beam_width))
    if not 1 <= top_paths <= beam_width:
        raise ValueError("%s: top_paths must lie in [1, beam_width=%d], got %d"
                         % (name, beam_width, top_paths))
    Tb = max(T, 1)
    out = np.full((nb, top_paths, Tb), -1, dtype=np.int64)
    lens = np.zeros((nb, top_paths), dtype=np.int64)
    lps = np.zeros((nb, top_paths), dtype=np.float64)
    status = np.zeros(nb, dtype=np.intc)
    if nb:
        # Work: every frame scores about width * (K + 1) candidates, each a
        # log-add-exp (counted as 20 flops); small batches stay on this thread.
        nt = threads_for(20.0 * float(in_len.sum()) * beam_width * (K + 1))
        if T == 0:
            lps[:, 1:] = -np.inf
        else:
            _beam_batch(x, in_len, blank, beam_width, top_paths, bool(merge_repeated), out, lens,
                        lps, status, nt)
    if np.any(status != 0):
        raise MemoryError("%s: out of memory for beam_width=%d, T=%d, K=%d"
                          % (name, beam_width, T, K))
    decoded = []
    for p in range(top_paths):
        n = int(lens[:, p].max()) if nb else 0
        decoded.append(np.ascontiguousarray(out[:, p, :n]))
    return decoded, lps.astype(out_dtype)
