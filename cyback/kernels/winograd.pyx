"""Winograd F(2x2, 3x3) forward convolution: float32, 3x3 kernel (2-D) or
(KD, 3, 3) kernel (3-D: the depth taps join the channels of the products),
stride 1, no dilation, channels_last (channels_first through copies);
include/cyback_conv_wino.h holds the kernel and its algebra.

A 3x3 convolution spends 2.25x fewer multiplies this way than summing its
taps directly; the register tile is the direct kernel's, so the saving is
most of the gain (benchmarks/bench_conv.py, "Winograd" rows). conv.pyx
decides when it runs (_use_winograd); this module only runs it.
"""
cimport cython
cimport numpy as cnp
from cython.parallel cimport parallel
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memset

from cyback.kernels import settings as _settings
import numpy as np

from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt
from cyback.kernels._omp cimport cb_get_num_threads
from cyback.kernels._tiles cimport (CB_TILES_JOIN_SECONDS, cb_tiles, cb_tiles_finish, cb_tiles_init,
                                   cb_tiles_join, cb_tiles_take, cb_tiles_wait_all,
                                   cb_tiles_wait_done)

cnp.import_array()


cdef extern from "cyback_conv_wino.h" nogil:
    ctypedef struct cb_wg_geom:
        Py_ssize_t N, H, W, C, F, OH, OW, ph, pw, D, OD, KD, pd, K, TH, TW, TG, items, FB, nfb
    enum: CB_WG_MAX_C
    int cb_simd_use_avx2(int on)
    void cb_simd_set_default_cap(int cap)
    int cb_simd_use_avx512(int on)
    int cb_wg_available()
    Py_ssize_t cb_wg_block(Py_ssize_t F)
    Py_ssize_t cb_wg_scratch(const cb_wg_geom* g)
    Py_ssize_t cb_wg_kernel_size(const cb_wg_geom* g)
    void cb_wg_kernel_part(const float* k, float* u, const cb_wg_geom* g, Py_ssize_t it)
    void cb_wg_item(const float* x, const float* u, const float* bp, const float* res, int act,
                    float* y, const cb_wg_geom* g, Py_ssize_t it, float* scratch)
    enum: CB_WG_COPY_PIXELS
    int cb_wg_use_wide_tiles(int w)
    Py_ssize_t cb_wg_tile_rows(int VL)
    void cb_wg_relayout(const float* src, float* dst, Py_ssize_t C, Py_ssize_t P, Py_ssize_t it,
                        int to_last)

# CYBACK_AVX512=0 caps this module's vector kernels at AVX2 (the registry reads it).
cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)


# Tiles per work item: one register tile of 12, or two of 6. Their
# transformed inputs (16 x 12 x C floats, 48 KB at 64 channels) stay in L1/L2
# while every block of the transformed kernel passes over them; larger items
# leave those caches. From WIDE_ITEM_K products' inner length on, an item
# takes twice as many: the transformed kernel (16 x K x F floats, 4 MB at
# 256 x 256) then no longer fits in L2 and is read once per item, which
# costs more than V's leaving L1 (at 192 and 256 channels; at 64 and 128
# the smaller items are faster).
DEF TILES_PER_ITEM = 12
DEF WIDE_ITEM_K = 192

MAX_CHANNELS = CB_WG_MAX_C

# Largest kernel a KernelCache keeps with its transform (kernel copy and
# transform: 2.8x its size per prepared call). Every 3x3 layer of the Keras
# applications fits (3x3 x 512 x 512 is 9.4 MB): transforming a 256 -> 256
# kernel takes as long as a batch-8 14x14 layer's products, so a limit that
# left it out made ResNet-50 4-5% slower at batch 1 and 8.
cdef Py_ssize_t max_cached_kernel_bytes = 16 << 20


def _max_cached_kernel_bytes(n=None):
    """The largest kernel a KernelCache keeps (set to n when given; for
    tests and benchmarks). Returns the value in force."""
    global max_cached_kernel_bytes
    if n is not None:
        max_cached_kernel_bytes = n
    return max_cached_kernel_bytes


def available():
    """Whether this build has the Winograd kernels (GCC vector extensions)."""
    return bool(cb_wg_available())


def _use_avx2(bint on):
    """Run the AVX2 + FMA kernel set when the CPU has it (the default), or
    the baseline one (for tests). Returns whether AVX2 now runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let the AVX-512 kernel set run when the CPU has it (the default), or
    cap the kernels at AVX2 (for tests). Returns whether AVX-512 now runs."""
    return bool(cb_simd_use_avx512(on))


def _use_wide_tiles(wide=None):
    """Run the AVX-512 products in groups of 12 tiles (True), of 6 (False) or
    as the CPU suits (None, the default: 6 where 512-bit FMAs run at half
    rate, include/cyback_conv_wino.h). The same sums either way; for tests
    and benchmarks. Returns how many tiles a group of the AVX-512 set now
    takes."""
    cb_wg_use_wide_tiles(-1 if wide is None else int(bool(wide)))
    return int(cb_wg_tile_rows(16))


def tiles(Py_ssize_t N, Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t OD=1):
    """Number of 2 x 2 output tiles of a convolution's output (of OD planes
    in 3-D)."""
    return N * OD * ((OH + 1) // 2) * ((OW + 1) // 2)


@cython.final
cdef class KernelCache:
    """The last kernel one prepared call ran with, and its transform.

    A batch-1 call spends a noticeable part of its time transforming the
    kernel, which in inference is the same every call. A call whose
    kernel holds the same values (a byte comparison, a few microseconds)
    reuses the transform; any change, in place or a new array, is seen.
    Entries are replaced whole, never changed, so concurrent calls may
    share one cache."""
    cdef object entry    # None or (kernel copy, transform, block width)


@cython.final
cdef class Winograd:
    """One convolution geometry's Winograd set-up: ``run`` computes
    y = conv(x, kernel) + bias + residual, then the activation, into y."""
    cdef cb_wg_geom g

    def __init__(self, Py_ssize_t N, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C, Py_ssize_t F,
                 Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t D=1,
                 Py_ssize_t OD=1, Py_ssize_t KD=1, Py_ssize_t pd=0):
        """A 2-D geometry, or with D, OD, KD and pd a 3-D one: D input and OD
        output planes, a (KD, 3, 3) kernel, pd zero planes before the input."""
        if not cb_wg_available():
            raise RuntimeError("winograd: this build has no vector kernels")
        # Inputs outside the image read zeros, so any extents and paddings
        # are safe: these are the ones a caller could not mean.
        if C < 1 or C > CB_WG_MAX_C or F < 1 or min(N, H, W, OH, OW, D, OD, KD) < 1 \
                or min(ph, pw, pd) < 0:
            raise ValueError("winograd: unsupported geometry N=%d D=%d H=%d W=%d C=%d F=%d "
                             "KD=%d OD=%d" % (N, D, H, W, C, F, KD, OD))
        g = &self.g
        g.N, g.H, g.W, g.C, g.F, g.OH, g.OW, g.ph, g.pw = N, H, W, C, F, OH, OW, ph, pw
        g.D, g.OD, g.KD, g.pd, g.K = D, OD, KD, pd, KD * C
        g.TH, g.TW = (OH + 1) // 2, (OW + 1) // 2

    def run(self, cnp.ndarray x, cnp.ndarray kernel, cnp.ndarray y, object bias, object residual,
            int act, int nt, KernelCache cache=None, bint channels_last=True,
            double join=CB_TILES_JOIN_SECONDS):
        """x (N, H, W, C), kernel (3, 3, C, F), y (N, OH, OW, F) (in 3-D x
        (N, D, H, W, C), kernel (KD, 3, 3, C, F), y (N, OD, OH, OW, F)), bias
        (F,) or None, residual like y or None: C-contiguous float32 arrays the
        caller has checked (shapes, dtype, layout; y writable); nt threads.
        ``cache``: the caller's KernelCache, or None to transform the kernel
        anew. With channels_last off, x is (N, C, H, W), y (N, F, OH, OW) and
        residual None: x goes through a channels_last copy, and so does y
        (the layout copies run on the team in the same parallel region:
        NumPy's moveaxis copies, on one thread, would take a large share of
        the convolution's time).
        ``join`` (seconds) bounds the spin at the end of the items
        (include/cyback_tiles.h; 0 leaves the wait to libgomp)."""
        cdef cb_intr intr
        cdef cb_tiles prepared, joined, copied
        # A copy: the block width follows the kernel set that runs now (tests
        # switch sets) and the work items the thread count, per call.
        cdef cb_wg_geom g = self.g
        cdef Py_ssize_t tiles = g.N * g.OD * g.TH * g.TW, parts, u_size, scratch_size
        cdef Py_ssize_t it = 0, nprep, ncopies   # it: firstprivate in the block
        cdef Py_ssize_t kbytes = g.KD * 9 * g.C * g.F * sizeof(float)
        cdef int failed = 0
        cdef int* no_scratch = &failed    # shared: written through a pointer in the block
        cdef float* u
        cdef float* own = NULL
        cdef cnp.ndarray kept = None
        cdef bint fresh = True
        cdef float* bp = NULL
        cdef float* scratch = NULL
        cdef const float* xs = <const float*> cnp.PyArray_DATA(x)
        cdef const float* ks = <const float*> cnp.PyArray_DATA(kernel)
        cdef const float* rs = NULL
        cdef float* ys = <float*> cnp.PyArray_DATA(y)
        cdef float* yfirst = NULL
        cdef const float* xfirst = NULL
        cdef float* xlast = NULL
        cdef float* ylast = NULL
        cdef Py_ssize_t P = g.D * g.H * g.W, OP = g.OD * g.OH * g.OW
        cdef Py_ssize_t xcopies = g.N * ((P + CB_WG_COPY_PIXELS - 1) // CB_WG_COPY_PIXELS)
        cdef Py_ssize_t ycopies = g.N * ((OP + CB_WG_COPY_PIXELS - 1) // CB_WG_COPY_PIXELS)
        if not channels_last:
            if residual is not None:
                raise ValueError("winograd: a channels_first residual is added by the caller")
            # Two blocks, not one: each stays under the mmap threshold that
            # importing cyback sets (32 MiB), so that a call reuses freed heap
            # rather than page-faulting fresh memory (a 50 MB block did, a
            # third of the copies' time at (32, 64, 56, 56)).
            xfirst, yfirst = xs, ys
            xlast = <float*> malloc(g.N * P * g.C * sizeof(float))
            ylast = <float*> malloc(g.N * OP * g.F * sizeof(float))
            if xlast == NULL or ylast == NULL:
                free(xlast)
                free(ylast)
                raise MemoryError("conv_forward: no memory for the channels_last copies")
            xs, ys = xlast, ylast
        nt = max(nt, 1)
        g.FB = cb_wg_block(g.F)
        g.nfb = (g.F + g.FB - 1) // g.FB
        # Items of at most per_item tiles, as many as make equal rounds
        # of the team (threads of equal speed then take the same number of
        # tiles, within one): a (1, 14, 14) layer has 49 tiles, and 5 items
        # of 12 would give one thread 36 tiles and the other 13. Each
        # tile's sums are the same whatever item holds it, so results do
        # not depend on the thread count.
        cdef Py_ssize_t per_item = TILES_PER_ITEM * (2 if g.K >= WIDE_ITEM_K else 1)
        g.items = nt * ((tiles + per_item * nt - 1) // (per_item * nt))
        g.TG = (tiles + g.items - 1) // g.items
        g.items = (tiles + g.TG - 1) // g.TG
        u_size, scratch_size = cb_wg_kernel_size(&g), cb_wg_scratch(&g)
        parts = g.nfb * g.K
        if residual is not None:
            rs = <const float*> cnp.PyArray_DATA(<cnp.ndarray> residual)
        if cache is not None and kbytes <= max_cached_kernel_bytes:
            entry = cache.entry
            if entry is not None and entry[2] == g.FB and \
                    memcmp(cnp.PyArray_DATA(<cnp.ndarray> entry[0]), ks, kbytes) == 0:
                kept, fresh = entry[1], False
            else:
                kept = np.empty(u_size, dtype=np.float32)
        # one block for the transformed kernel (unless kept) and the padded bias
        own = <float*> malloc(((0 if kept is not None else u_size) + g.nfb * g.FB)
                              * sizeof(float))
        if own == NULL:
            free(xlast)
            free(ylast)
            raise MemoryError("conv_forward: no memory for the transformed kernel")
        u = <float*> cnp.PyArray_DATA(kept) if kept is not None else own
        if bias is not None:
            bp = own + (0 if kept is not None else u_size)
            memset(bp, 0, g.nfb * g.FB * sizeof(float))
            memcpy(bp, cnp.PyArray_DATA(<cnp.ndarray> bias), g.F * sizeof(float))
        cb_intr_init(&intr)
        cb_tiles_init(&prepared)
        cb_tiles_init(&joined)
        cb_tiles_init(&copied)
        nprep = (xcopies if xfirst != NULL else 0) + (parts if fresh else 0)
        ncopies = xcopies if xfirst != NULL else 0
        # One parallel region: the kernel transform (a visible part of a
        # batch-1 layer) and the tiles share one wake-up.
        # Every phase hands its pieces out as threads come free (no barrier
        # at a phase's start, and a thread the host slows down takes fewer
        # of them); each piece writes its own outputs, so the bits do not
        # depend on which thread ran it.
        with nogil, parallel(num_threads=nt):
            it = cb_tiles_take(&prepared)
            while it < nprep:
                if it < ncopies:
                    cb_wg_relayout(xfirst, xlast, g.C, P, it, 1)
                else:
                    cb_wg_kernel_part(ks, u, &g, it - ncopies)
                cb_tiles_finish(&prepared)
                it = cb_tiles_take(&prepared)
            # the items read the copies and the transform: wait for them by count
            cb_tiles_wait_done(&prepared, nprep)
            scratch = <float*> malloc(scratch_size * sizeof(float))
            if scratch == NULL:
                no_scratch[0] = 1     # the others take the items; the call then raises
            else:
                it = cb_tiles_take(&joined)
                while it < g.items:
                    if not cb_intr_poll(&intr):
                        cb_wg_item(xs, u, bp, rs, act, ys, &g, it, scratch)
                    it = cb_tiles_take(&joined)
                free(scratch)
            # A bounded spin before the region's end (include/cyback_tiles.h):
            # the thread done first does not fall asleep while the other
            # finishes its items, and is awake for the next region.
            cb_tiles_join(&joined, cb_get_num_threads(), join)
            if yfirst != NULL:
                cb_tiles_wait_all(&joined, cb_get_num_threads())
                it = cb_tiles_take(&copied)
                while it < ycopies:
                    cb_wg_relayout(ys, yfirst, g.F, OP, it, 0)
                    it = cb_tiles_take(&copied)
        free(own)
        free(xlast)
        free(ylast)
        if fresh and kept is not None:
            cache.entry = (kernel.copy(), kept, g.FB)
        check_interrupt(&intr)
        if failed:
            raise MemoryError("conv_forward: no memory for the Winograd scratch")
