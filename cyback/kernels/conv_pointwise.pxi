# 1x1 (pointwise) convolutions as GEMM tiles (included by conv.pyx).
#
# A channels_last 1x1, stride-1, unpadded convolution is the product
# (N*P, C) @ (C, F). The dispatcher runs it as fixed tiles of that product,
# one single-threaded GEMM and the epilogue each, when the kernel is wide or
# the call large (_use_pointwise_gemm); the short-im2col path
# (conv_im2col.pxi) multiplies its patch matrix through the same tiles.


@functools.lru_cache(maxsize=512)
@cython.wraparound(True)
@cython.boundscheck(True)
def _pointwise_tiles(Py_ssize_t M, Py_ssize_t K, Py_ssize_t F):
    """The output tiles of a 1x1 channels_last convolution run as
    single-threaded GEMMs on the (M, K) view of x: an (n, 4) array of
    (first row, rows, first column, columns), largest first, in the order
    the threads take them.

    OpenBLAS's result for one element depends on the shape of the call that
    computes it (threaded calls and every split tested differ in the last
    bits), so the tiles come from the shape alone, never from the thread
    count. Each GEMM call packs its rows of x (nf times over all: M K
    values each) and its columns of the kernel (nr times: K F), so tiles are
    as large as they can be: rows (times K) within 512 KB, and at least 4
    tiles (else 2), each of 64 rows and columns or more, the split that packs the
    fewest values (a batch-1 call with few rows splits its columns, a call
    with many rows its rows): more, smaller tiles lose to NumPy's threaded
    sgemm of the same shape (benchmarks/bench_conv.py --pointwise).

    An axis cut in 2-4 parts is cut unevenly, its first half of the parts
    twice the size of the others (4 tiles: 1/3, 1/3, 1/6, 1/6): on equal
    threads the halves end together, as with even tiles, but when one
    thread runs at half speed (a virtualised host may slow one virtual CPU
    for spells of a few hundred milliseconds) the fast one takes both small
    tiles and the call ends with the slow one's large tile, at the best
    split of the work between the two, instead of waiting for whichever
    thread took the last even tile (benchmarks/bench_conv.py --pointwise
    compares the tiles with NumPy's sgemm)."""
    cdef Py_ssize_t most_rows = max(64, min(2048, (1 << 17) // max(1, K)))
    cdef Py_ssize_t nr0 = _ceil_div(M, most_rows)
    cdef Py_ssize_t nr = nr0, nf = 1, r, f, want
    cdef double cost, best = -1
    if nr0 < 4:
        # 4 tiles where each keeps 64 rows or columns, else 2 (a 1x1 of 196
        # or 49 rows onto 96-160 columns, MobileNetV2's projections, then
        # still gives a second thread its half), else one.
        for want in (4, 2):
            for f in (1, 2, 4):
                if f > want:
                    continue
                r = max(nr0, _ceil_div(want, f))
                if (f > 1 and _ceil_div(F, f) < 64) or (r > nr0 and _ceil_div(M, r) < 64):
                    continue
                cost = <double>f * M + <double>r * F
                if best < 0 or cost < best:
                    best, nr, nf = cost, r, f
            if best >= 0:
                break
    # uneven cuts pay off with 4 tiles or more (see above); 2 are halves
    rows = _tile_edges(M, nr, nr >= nf and nr * nf >= 4, most_rows)
    cols = _tile_edges(F, nf, nf > nr and nr * nf >= 4, F)
    tiles = np.array([(r0, r1 - r0, f0, f1 - f0)
                      for f0, f1 in zip(cols[:-1], cols[1:])
                      for r0, r1 in zip(rows[:-1], rows[1:])], dtype=np.intp)
    tiles = np.ascontiguousarray(tiles[np.argsort(-tiles[:, 1] * tiles[:, 3], kind="stable")])
    tiles.flags.writeable = False       # remembered for the shape's next call
    return tiles


@cython.wraparound(True)
@cython.boundscheck(True)
def _tile_edges(Py_ssize_t n, Py_ssize_t parts, bint uneven, Py_ssize_t most):
    """Where an axis of n is cut into `parts` (at multiples of 16): evenly,
    or, `uneven` and 2-4 parts, the first half of the parts twice as large
    as the others if those stay within `most` (rounded up to 16)."""
    weights = [1] * parts
    if uneven and 2 <= parts <= 4:
        weights = [2] * ((parts + 1) // 2) + [1] * (parts // 2)
        if _round16(_ceil_div(2 * n, sum(weights))) > _round16(most):
            weights = [1] * parts
    cdef double total = sum(weights), acc = 0
    edges = [0]
    for wgt in weights[:-1]:
        acc += wgt
        cut = _round16(<Py_ssize_t>(n * acc / total + 0.5))
        if edges[-1] < cut < n:
            edges.append(cut)
    edges.append(n)
    return edges


cdef inline Py_ssize_t _round16(Py_ssize_t n) noexcept nogil:
    return n if n < 16 else (n + 15) // 16 * 16


cdef inline Py_ssize_t _ceil_div(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return (a + b - 1) // b


cdef void _tile_epilogue(floating* y, Py_ssize_t m, Py_ssize_t n, Py_ssize_t ld,
                         const floating* bias, const floating* res, int act) noexcept nogil:
    # In conv_forward's order (bias, then residual, then the activation) and
    # with np.maximum's NaN rule, while the tile is still in cache.
    cdef Py_ssize_t i, j
    cdef floating* row
    cdef floating v
    for i in range(m):
        row = y + i * ld
        for j in range(n):
            v = row[j]
            if bias != NULL:
                v = v + bias[j]
            if res != NULL:
                v = v + res[i * ld + j]
            if act != 0:
                if v < 0:
                    v = 0
                if act == 2 and v > 6:
                    v = 6
            row[j] = v


def _forward_pointwise(floating[::1] x, floating[::1] w, floating[::1] y,
                       floating[::1] bias, bint has_bias, floating[::1] res, bint has_res,
                       int act, const Py_ssize_t[:, ::1] tiles, Py_ssize_t K, Py_ssize_t F,
                       int nt, double join):
    """y (M, F) = x (M, K) @ w (K, F) in `tiles` (_pointwise_tiles), one
    single-threaded GEMM each, with the epilogue per tile; the threads meet
    at the end with a bounded spin (include/cyback_tiles.h)."""
    cdef Py_ssize_t total = tiles.shape[0]
    cdef Py_ssize_t it = 0, r0 = 0, f0 = 0, m = 0, n = 0     # firstprivate in the block
    cdef const floating* b = &bias[0] if has_bias else NULL
    cdef const floating* r = &res[0] if has_res else NULL
    cdef cb_intr intr
    cdef cb_tiles tiles_left
    cb_intr_init(&intr)
    cb_tiles_init(&tiles_left)
    with nogil, parallel(num_threads=nt):
        it = cb_tiles_take(&tiles_left)
        while it < total:
            if not cb_intr_poll(&intr):
                r0, m, f0, n = tiles[it, 0], tiles[it, 1], tiles[it, 2], tiles[it, 3]
                gemm(False, False, <int>m, <int>n, <int>K, <floating>1, &x[r0 * K], <int>K,
                     &w[f0], <int>F, <floating>0, &y[r0 * F + f0], <int>F)
                if b != NULL or r != NULL or act != 0:
                    _tile_epilogue(&y[r0 * F + f0], m, n, F, b + f0 if b != NULL else NULL,
                                   r + r0 * F + f0 if r != NULL else NULL, act)
            it = cb_tiles_take(&tiles_left)
        cb_tiles_join(&tiles_left, cb_get_num_threads(), join)
    check_interrupt(&intr)


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_pointwise_gemm(g, bint last, bint pointwise):
    """Whether a channels_last 1x1 convolution runs as GEMM tiles
    (_forward_pointwise) rather than the direct kernel or the row blocks of
    _forward; _TUNE["pointwise_gemm"] True or False forces either.

    The direct kernel streams a block of the kernel (C x 16 values) per tile
    of pixels and wins while C x F is small; BLAS's packed GEMM wins once
    the kernel is wide (pointwise_gemm_min_cf), or the call is large
    (pointwise_gemm_min_macs). Narrow layers stay on the direct kernel: a
    tile's GEMM costs microseconds to set up.

    Where the direct kernel runs AVX-512 tiles (6 pixels where 512-bit FMAs
    run at half rate, 12 where they run at full rate: cyback_conv_direct.h)
    it also wins on wide kernels once a call has a few hundred pixels, so
    there the tiles keep only calls of fewer rows than
    _TUNE["pointwise_gemm_short_tiles_max_rows"] and those the direct kernel
    does not take (over 1024 channels). Except for few input channels and a
    large output, where the direct kernel does little work per output it
    writes: from _TUNE["pointwise_gemm_stream_outputs"] outputs (8M, 32 MB
    in float32) and up to _TUNE["pointwise_gemm_stream_max_c"] channels (64)
    the tiles run. benchmarks/bench_conv.py --pointwise measures both
    sides."""
    if not (pointwise and last):
        return False
    force = _TUNE["pointwise_gemm"]
    if force is not None:
        return bool(force)
    cf = g["C"] * g["F"]
    rows = g["N"] * g["P"]
    if rows >= _TUNE["pointwise_gemm_short_tiles_max_rows"] and cb_simd_has_avx512() and \
            _use_direct(g, last):
        return g["C"] <= _TUNE["pointwise_gemm_stream_max_c"] and \
            rows * g["F"] >= _TUNE["pointwise_gemm_stream_outputs"]
    return cf > _TUNE["pointwise_gemm_min_cf"] or \
        rows * cf >= _TUNE["pointwise_gemm_min_macs"]


def _run_pointwise(x, kernel, y, g, bias, residual, int act, int nt):
    M, K, F = g["N"] * g["P"], g["C"], g["F"]
    tiles = _pointwise_tiles(M, K, F)
    if residual is not None and np.may_share_memory(residual, y):
        # the GEMMs write y before the epilogue reads the residual
        residual = residual.copy()
    dummy = _flat(y)[:1]
    _forward_pointwise(_flat(x), _flat(kernel), _flat(y),
                       dummy if bias is None else bias, bias is not None,
                       dummy if residual is None else _flat(residual), residual is not None,
                       act, tiles, K, F, nt, join_seconds())
    team_done(nt)
