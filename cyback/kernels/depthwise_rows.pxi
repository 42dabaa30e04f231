# channels_last input rows (included by depthwise.pyx).
#
# How the channels_last passes hand input rows to the row kernels of
# include/cyback_depthwise_last.h: read in place, or staged per thread (a
# depth multiplier expanded, a pixel stride off a multiple of 1 kB, zero
# columns around padded rows) in a ring that keeps the rows the next output
# row shares; and the prefetch of the next output row's rows.


# The vectorised row kernels; these pick the float or double one.

cdef inline void _cl_row(const floating** xr, const floating* k, floating* y, Py_ssize_t C,
                         Py_ssize_t xs, Py_ssize_t W, Py_ssize_t KH, Py_ssize_t KW,
                         Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dil_w, Py_ssize_t pw,
                         const floating* bias=NULL, int act=0, const void* pf=NULL,
                         Py_ssize_t pfb=0) noexcept nogil:
    # Input pixels are xs values apart (C when read in place). pf: pfb bytes
    # the next row will read, prefetched while this one computes.
    if floating is float:
        cb_depthwise_fwd_cl_row_f(xr, k, y, C, xs, W, KH, KW, OW, sw, dil_w, pw, bias, act, pf,
                                  pfb)
    else:
        cb_depthwise_fwd_cl_row_d(xr, k, y, C, xs, W, KH, KW, OW, sw, dil_w, pw, bias, act, pf,
                                  pfb)


cdef inline void _kg_row(const floating** xr, const floating* dy, floating* part, Py_ssize_t C,
                         Py_ssize_t xs, Py_ssize_t ys, Py_ssize_t W, Py_ssize_t KH,
                         Py_ssize_t KW, Py_ssize_t OW, Py_ssize_t sw, Py_ssize_t dil_w,
                         Py_ssize_t pw, const void* pf=NULL, Py_ssize_t pfb=0,
                         const void* pf2=NULL, Py_ssize_t pf2b=0) noexcept nogil:
    # Pixels of the input rows are xs values apart, of dy ys. pf, pf2: pfb
    # and pf2b bytes the next row will read, prefetched meanwhile.
    if floating is float:
        cb_depthwise_kgrad_cl_row_f(xr, dy, part, C, xs, ys, W, KH, KW, OW, sw, dil_w, pw, pf,
                                    pfb, pf2, pf2b)
    else:
        cb_depthwise_kgrad_cl_row_d(xr, dy, part, C, xs, ys, W, KH, KW, OW, sw, dil_w, pw, pf,
                                    pfb, pf2, pf2b)


cdef inline void _cl_rows(const floating** xr, const floating[:, :, :, ::1] x, Py_ssize_t n,
                          Py_ssize_t ih0, Py_ssize_t dil_h, Py_ssize_t KH) noexcept nogil:
    # xr[ky] = row ih0 + ky*dil_h of sample n, read in place, or NULL where that
    # row is padding.
    cdef Py_ssize_t H = x.shape[1], ky, ih
    for ky in range(KH):
        ih = ih0 + ky * dil_h
        xr[ky] = NULL if ih < 0 or ih >= H else &x[n, ih, 0, 0]


cdef inline Py_ssize_t _pixel_stride(Py_ssize_t CM, Py_ssize_t itemsize) noexcept nogil:
    # Values between the staged pixels of a row of CM channels. Pixels a
    # multiple of 1 kB apart put one channel of every pixel in 4 or fewer
    # sets of an 8-way L1; a row kernel that reads 30 of them per channel
    # block then thrashes (512 or 1024 channels run several times slower
    # than 528 or 1040). One more cache line per pixel spreads them over
    # all sets.
    if CM > 0 and (CM * itemsize) % 1024 == 0:
        return CM + 64 // itemsize
    return CM


cdef inline bint _row_needed(Py_ssize_t tag, Py_ssize_t n, Py_ssize_t H, Py_ssize_t ih0,
                             Py_ssize_t dil_h, Py_ssize_t KH) noexcept nogil:
    # Whether row tag (n*H + ih) is one of rows ih0 + ky*dil_h of sample n.
    cdef Py_ssize_t d = tag - (n * H + ih0)
    return d >= 0 and d % dil_h == 0 and d // dil_h < KH and 0 <= ih0 + d < H


cdef inline void _stage(const floating* src, floating* dst, Py_ssize_t W, Py_ssize_t C,
                        Py_ssize_t M, Py_ssize_t xs) noexcept nogil:
    # dst[w*xs + c*M + m] = src[w*C + c]: an input row with pixels xs apart
    # and every channel repeated M times, so that a depth multiplier M runs
    # as M == 1 over C*M channels with the kernel (KH, KW, C, M) read as
    # (KH, KW, C*M).
    cdef Py_ssize_t w, c, m, n = C
    cdef floating v
    cdef floating* d
    if xs == C * M:  # one run of W*C values
        n = W * C
        W = 1
    for w in range(W):
        d = dst + w * xs
        if M == 1:
            memcpy(d, src + w * C, n * sizeof(floating))
        elif M == 2:  # the common multiplier, in a loop the compiler vectorises
            for c in range(n):
                v = src[w * C + c]
                d[2 * c] = v
                d[2 * c + 1] = v
        else:
            for c in range(n):
                v = src[w * C + c]
                for m in range(M):
                    d[c * M + m] = v


cdef inline void _staged_rows(const floating** xr, const floating[:, :, :, ::1] x,
                              floating* ring, Py_ssize_t* tags, Py_ssize_t n, Py_ssize_t ih0,
                              Py_ssize_t dil_h, Py_ssize_t KH, Py_ssize_t M, Py_ssize_t xs,
                              Py_ssize_t Ws, Py_ssize_t pl) noexcept nogil:
    # xr[ky] = row ih0 + ky*dil_h of sample n staged (_stage) in one of the KH
    # slots of ring, or NULL where that row is padding. A slot holds Ws
    # pixels xs apart: pl zeros, the row's W pixels, zeros (written when the
    # ring was allocated). tags[s] = n*H + ih of the row slot s holds (-1:
    # none): the next output row of the same thread finds the KH - sh rows
    # it shares already there.
    cdef Py_ssize_t H = x.shape[1], W = x.shape[2], C = x.shape[3]
    cdef Py_ssize_t ky, s, ih
    for ky in range(KH):
        xr[ky] = NULL
        ih = ih0 + ky * dil_h
        if 0 <= ih < H:
            for s in range(KH):
                if tags[s] == n * H + ih:
                    xr[ky] = ring + s * Ws * xs
    for ky in range(KH):
        ih = ih0 + ky * dil_h
        if xr[ky] != NULL or ih < 0 or ih >= H:
            continue
        # A row is missing, so fewer than KH slots hold needed rows.
        s = 0
        while s < KH - 1 and _row_needed(tags[s], n, H, ih0, dil_h, KH):
            s += 1
        _stage(&x[n, ih, 0, 0], ring + (s * Ws + pl) * xs, W, C, M, xs)
        tags[s] = n * H + ih
        xr[ky] = ring + s * Ws * xs


# Stage channels_last input rows as _row_plan says; tests turn it off to
# compare with rows read in place (staged only to expand a depth multiplier).
cdef bint _staging = True


# How the row kernel reads the input rows of a channels_last correlation.
ctypedef struct _Rows:
    bint staged       # copied per thread (_staged_rows), else read in place
    Py_ssize_t xs     # values between pixels
    Py_ssize_t pl     # zero pixels staged before each row
    Py_ssize_t Ws     # pixels per staged row


# Most bytes of a thread's staged rows (KH of them) for the staging that
# only speeds a call up: longer rows (long 1-D sequences) are read in place.
cdef Py_ssize_t STAGE_MAX_BYTES = 4 << 20


cdef _Rows _row_plan(Py_ssize_t W, Py_ssize_t CM, Py_ssize_t M, Py_ssize_t OW, Py_ssize_t KH,
                     Py_ssize_t KW, Py_ssize_t sw, Py_ssize_t dil_w, Py_ssize_t pw,
                     Py_ssize_t itemsize, bint columns=True) noexcept nogil:
    # Rows of W pixels (CM values each after a depth multiplier M expands
    # them) read by OW outputs. They are staged when M > 1, when their
    # pixel stride is a multiple of 1 kB (_pixel_stride), and (if columns)
    # with their zero columns when they are padded and hold 256 bytes a
    # pixel or more: the row kernel then runs every pixel in its register
    # blocks, with no edge pixels, and the copy streams the input once, in
    # order. Narrower rows are faster read in place; the row kernel handles
    # their edges. Past STAGE_MAX_BYTES only M > 1 stages, as it must.
    cdef _Rows rp
    # Zero pixels after the row: as many as the last output's taps reach.
    cdef Py_ssize_t pr = _imax(0, (OW - 1) * sw + (KW - 1) * dil_w - pw - (W - 1))
    cdef bint faster = _staging and KH * (W + pw + pr) * (CM + 64) * itemsize <= STAGE_MAX_BYTES
    cdef bint padded = columns and faster and (pw > 0 or pr > 0) and CM * itemsize >= 256
    rp.xs = _pixel_stride(CM, itemsize) if faster else CM
    rp.staged = M > 1 or rp.xs != CM or padded
    rp.pl = pw if padded else 0
    rp.Ws = W + (pw + pr if padded else 0)
    return rp


# A thread's input rows (each thread assigns its own, inside the parallel
# block): the KH row pointers the row kernel reads and, when the plan stages
# rows, the ring of KH staged rows, zeroed (their padding columns stay zero),
# with the tags of the rows it holds (_staged_rows).
ctypedef struct _Ring:
    void** xr
    void* rows
    Py_ssize_t* tags


cdef inline _Ring _ring_new(Py_ssize_t KH, _Rows rp, Py_ssize_t itemsize) noexcept nogil:
    cdef _Ring ring
    cdef Py_ssize_t s
    ring.xr = <void**>malloc(KH * sizeof(void*))
    ring.rows = NULL
    ring.tags = NULL
    if rp.staged:
        ring.rows = calloc(KH * rp.Ws * rp.xs, itemsize)
        ring.tags = <Py_ssize_t*>malloc(KH * sizeof(Py_ssize_t))
        for s in range(KH):
            ring.tags[s] = -1   # none yet
    return ring


cdef inline void _ring_free(_Ring ring) noexcept nogil:
    free(ring.tags)
    free(ring.rows)
    free(ring.xr)


cdef inline const floating** _rows_of(_Ring ring, const floating[:, :, :, ::1] x, _Rows rp,
                                      Py_ssize_t n, Py_ssize_t ih0, Py_ssize_t dil_h,
                                      Py_ssize_t KH, Py_ssize_t M) noexcept nogil:
    # The row pointers of ring, xr[ky] = row ih0 + ky*dil_h of sample n as rp
    # says (NULL where padding).
    cdef const floating** xr = <const floating**>ring.xr
    if rp.staged:
        _staged_rows(xr, x, <floating*>ring.rows, ring.tags, n, ih0, dil_h, KH, M, rp.xs, rp.Ws,
                     rp.pl)
    else:
        _cl_rows(xr, x, n, ih0, dil_h, KH)
    return xr


# From PREFETCH_MIN_BYTES of input and output on, and input rows of
# PREFETCH_MIN_ROW_BYTES or more, the channels_last row passes (the forward,
# the stride-1 input gradient through the same row kernel, and the kernel
# gradient, which also asks for the next output-gradient row) ask for the
# rows of a thread's next output row while the row kernel runs, a few lines
# per vector of channels (tests turn it off to compare). The hardware's
# prefetchers follow each row's stream but not the jump to the next one, so
# without this a call from DRAM runs far below its speed from cache. The
# prefetches are spread over the row: a burst before it saves nothing (the
# requests queue behind each other, as the row's copy does). The size
# bounds exist because calls whose data stay in the caches run slower with
# it, and short rows (the next one as near as the stream's own prefetch
# reaches) gain nothing (benchmarks/bench_pool.py --only depthwise).
cdef bint _prefetch_rows = True
cdef Py_ssize_t PREFETCH_MIN_BYTES = 16 << 20, PREFETCH_MIN_ROW_BYTES = 8 << 10


def _use_prefetch(bint on, min_bytes=None, min_row_bytes=None):
    """Whether the channels_last row passes prefetch the next row's rows
    (tests, benchmarks), and from which sizes; returns the old setting."""
    global _prefetch_rows, PREFETCH_MIN_BYTES, PREFETCH_MIN_ROW_BYTES
    old = (_prefetch_rows, PREFETCH_MIN_BYTES, PREFETCH_MIN_ROW_BYTES)
    _prefetch_rows = on
    if min_bytes is not None:
        PREFETCH_MIN_BYTES = min_bytes
    if min_row_bytes is not None:
        PREFETCH_MIN_ROW_BYTES = min_row_bytes
    return old


cdef inline bint _prefetch_big(const floating[:, :, :, ::1] x,
                               const floating[:, :, :, ::1] y) noexcept nogil:
    # Whether a channels_last pass from rows of x to rows of y prefetches.
    return _prefetch_rows and x.shape[2] * x.shape[3] * sizeof(floating) >= \
        PREFETCH_MIN_ROW_BYTES and (x.shape[0] * x.shape[1] * x.shape[2] * x.shape[3] +
                                    y.shape[0] * y.shape[1] * y.shape[2] * y.shape[3]) * \
        sizeof(floating) >= PREFETCH_MIN_BYTES


cdef inline const void* _next_rows(const floating[:, :, :, ::1] x, Py_ssize_t r, Py_ssize_t OH,
                                   _Geom g, Py_ssize_t KH, Py_ssize_t* nbytes) noexcept nogil:
    # The input rows output row r (n * OH + oh) reads that row r - 1 did not
    # (one at stride 1), as one contiguous range: its start, and its length
    # in *nbytes; NULL when there are none.
    cdef Py_ssize_t H = x.shape[1], n = r // OH, oh = r % OH
    cdef Py_ssize_t lo = oh * g.sh - g.ph + max(0, KH - g.sh) * g.dil_h
    cdef Py_ssize_t hi = oh * g.sh - g.ph + (KH - 1) * g.dil_h
    if n >= x.shape[0]:
        return NULL
    lo = max(lo, 0)
    hi = min(hi, H - 1)
    if hi < lo:
        return NULL
    nbytes[0] = (hi - lo + 1) * x.shape[2] * x.shape[3] * sizeof(floating)
    return &x[n, lo, 0, 0]
