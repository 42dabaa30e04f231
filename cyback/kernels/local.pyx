"""Locally connected convolution (Keras ``local_conv1d`` / ``local_conv2d``).

Unshared weights: every output position p has its own (K, F) matrix, with
K = prod(kernel_size) * C. Padding is always 'valid' and dilation 1, so
out = (size - k) // stride + 1 per spatial dim.

Kernel layout, as in Keras 2.3.1's TensorFlow backend: (P, K, F) with output
positions p in row-major order (p = oh * OW + ow; 1-D: p = ow). Row j of
kernel[p] multiplies the j-th element of the patch flattened the way Keras
slices and reshapes it, which depends on the data format:
  channels_last : patch x[n, rows, cols, :]  -> order (ky, kx, c),
                  j = (ky * kw + kx) * C + c
  channels_first: patch x[n, :, rows, cols]  -> order (c, ky, kx),
                  j = (c * kh + ky) * kw + kx
(1-D is the same with kh = 1.)

Computation: gather patches (P, N, K), one GEMM per position, (P, N, K) x
(P, K, F) -> (P, N, F). For channels_last the GEMM writes straight into the
(N, P, F) output through its leading dimension, so no transpose is needed;
channels_first output (N, F, P) is a transpose of the (P, N, F) result.
"""
import numpy as np
cimport cython
from cython.parallel cimport prange

from cyback.kernels._blas cimport floating, gemm
from cyback.kernels._checks import check_float, int_tuple
from cyback.kernels.runtime cimport team_min_work, threads_for
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt
from cyback.kernels.blas_threads import blas_limit


cdef struct Runs:
    # A patch, within one sample of x, is ``groups`` groups ``plane`` elements
    # apart, each of kh rows ``row`` apart, each row a run of L contiguous
    # elements; position p's patch starts at (p // OW) * step_h + (p % OW) *
    # step_w. In that order the runs are the Keras patch order of the module
    # docstring. channels_last: one group, rows of kw * C elements;
    # channels_first: one group per channel plane, rows of kw elements.
    Py_ssize_t groups, plane, row, L, step_h, step_w, OW


cdef inline Runs _runs(const Py_ssize_t* shape, Py_ssize_t kw, Py_ssize_t sh,
                       Py_ssize_t sw, Py_ssize_t OW, bint last) noexcept nogil:
    """The runs of a 4-D x of ``shape``, (N, H, W, C) when ``last``, else
    (N, C, H, W)."""
    cdef Runs r
    cdef Py_ssize_t C = shape[3] if last else shape[1]
    cdef Py_ssize_t H = shape[1] if last else shape[2]
    cdef Py_ssize_t W = shape[2] if last else shape[3]
    cdef Py_ssize_t cs = C if last else 1
    r.OW = OW
    if last:
        r.groups, r.plane, r.row, r.L = 1, 0, W * C, kw * C
    else:
        r.groups, r.plane, r.row, r.L = C, H * W, W, kw
    r.step_h, r.step_w = sh * W * cs, sw * cs
    return r


cdef inline Py_ssize_t _start(const Runs* r, Py_ssize_t p) noexcept nogil:
    return (p // r.OW) * r.step_h + (p % r.OW) * r.step_w


def _im2col(const floating[:, :, :, ::1] x, floating[:, :, ::1] pt, Py_ssize_t kh,
            Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t OW, bint last):
    """pt[p, n] = the patch of output position p in sample n of x."""
    cdef Py_ssize_t P = pt.shape[0], N = pt.shape[1]
    cdef Py_ssize_t p, n, a, ky, j, base
    cdef Runs r = _runs(x.shape, kw, sh, sw, OW, last)
    cdef Py_ssize_t L = r.L, groups = r.groups, plane = r.plane, row = r.row
    cdef const floating* src
    cdef floating* dst
    # Work: bytes copied (read and written).
    cdef int nt = threads_for(2.0 * P * N * pt.shape[2] * sizeof(floating))
    cdef cb_intr intr
    cb_intr_init(&intr)
    # Polled per position and sample: a large batch's patches take longer to
    # copy than a Ctrl-C should wait.
    with nogil:
        for p in prange(P, schedule='static', num_threads=nt):
            base = _start(&r, p)
            for n in range(N):
                if cb_intr_poll(&intr):
                    break
                src = &x[n, 0, 0, 0] + base
                dst = &pt[p, n, 0]
                for a in range(groups):
                    for ky in range(kh):
                        for j in range(L):
                            dst[j] = src[a * plane + ky * row + j]
                        dst = dst + L
    check_interrupt(&intr)


def _col2im(const floating[:, :, ::1] pt, floating[:, :, :, ::1] dx, Py_ssize_t kh,
            Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t OW, bint last):
    """dx = the patch gradients pt[p, n] summed at their patches in sample n.

    Overlapping windows add into the same cells: one task per sample, which
    walks positions in order, so there is no race and the summation order
    is fixed."""
    cdef Py_ssize_t P = pt.shape[0], N = pt.shape[1]
    cdef Py_ssize_t S = dx.shape[1] * dx.shape[2] * dx.shape[3]
    cdef Py_ssize_t p, n, a, ky, j, i, base
    cdef Runs r = _runs(dx.shape, kw, sh, sw, OW, last)
    cdef Py_ssize_t L = r.L, groups = r.groups, plane = r.plane, row = r.row
    cdef const floating* src
    cdef floating* dst
    # Work: bytes moved zeroing dx, then reading pt and updating dx.
    cdef int nt = threads_for((<double>N * S + 3.0 * P * N * pt.shape[2]) * sizeof(floating))
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        for n in prange(N, schedule='static', num_threads=nt):
            dst = &dx[n, 0, 0, 0]
            for i in range(S):
                dst[i] = 0
            for p in range(P):
                if cb_intr_poll(&intr):
                    break
                base = _start(&r, p)
                src = &pt[p, n, 0]
                for a in range(groups):
                    for ky in range(kh):
                        dst = &dx[n, 0, 0, 0] + base + a * plane + ky * row
                        for j in range(L):
                            dst[j] = dst[j] + src[j]
                        src = src + L
    check_interrupt(&intr)


cdef void _gemms(int which, floating[:, :, ::1] a, floating[:, :, ::1] b,
                 floating* g, Py_ssize_t g_pstride, int g_ld, int nt,
                 cb_intr* intr) noexcept nogil:
    """Per-position products; ``g`` is the (N, F) matrix of position p at
    g + p * g_pstride with leading dimension g_ld (the output or dy).
    nt > 0: OpenMP over positions on nt threads; 0: a plain loop on the
    calling thread (BLAS may use its own threads).

    which 0: g[p] = a[p] @ b[p]            (a: patches, b: kernel)
    which 1: a[p] = g[p] @ b[p].T          (a: patch grads, b: kernel)
    which 2: b[p] = a[p].T @ g[p]          (a: patches, b: kernel grad)
    """
    cdef Py_ssize_t p, P = a.shape[0]
    cdef int N = a.shape[1], K = a.shape[2], F = b.shape[2]
    if nt > 0:
        for p in prange(P, schedule='static', num_threads=nt):
            if cb_intr_poll(intr):
                continue
            _one(which, a, b, g, p, g_pstride, g_ld, N, K, F)
    else:
        for p in range(P):
            if cb_intr_poll(intr):
                break
            _one(which, a, b, g, p, g_pstride, g_ld, N, K, F)


cdef inline void _one(int which, floating[:, :, ::1] a, floating[:, :, ::1] b,
                      floating* g, Py_ssize_t p, Py_ssize_t g_pstride, int g_ld,
                      int N, int K, int F) noexcept nogil:
    if which == 0:
        gemm(False, False, N, F, K, <floating>1, &a[p, 0, 0], K, &b[p, 0, 0], F,
             <floating>0, g + p * g_pstride, g_ld)
    elif which == 1:
        gemm(False, True, N, K, F, <floating>1, g + p * g_pstride, g_ld, &b[p, 0, 0], F,
             <floating>0, &a[p, 0, 0], K)
    else:
        gemm(True, False, K, F, N, <floating>1, &a[p, 0, 0], K, g + p * g_pstride, g_ld,
             <floating>0, &b[p, 0, 0], F)


def _gemm_positions(int which, floating[:, :, ::1] a, floating[:, :, ::1] b,
                    floating[::1] g, Py_ssize_t g_pstride, int g_ld, int nt):
    """_gemms on typed views (see there); raises KeyboardInterrupt if
    interrupted."""
    cdef cb_intr intr
    cb_intr_init(&intr)
    with nogil:
        _gemms[floating](which, a, b, &g[0], g_pstride, g_ld, nt, &intr)
    check_interrupt(&intr)


cdef int _run_gemms(int which, a, b, g, Py_ssize_t g_pstride, int g_ld) except -1:
    """_gemms with OpenMP over positions unless the work is small."""
    cdef long work = <long>a.shape[1] * a.shape[2] * b.shape[2]
    # BLAS runs single-threaded (one thread pool: OpenMP), so every
    # parallel case goes over positions.
    over_p = a.shape[0] > 1
    # Small problems run every GEMM on the calling thread with a plain loop.
    # BLAS needs no limit there (OpenBLAS keeps GEMMs this small on one
    # thread), and switching it costs locked ctypes calls on every op.
    cdef double total = 2.0 * a.shape[0] * work
    if total < team_min_work():
        over_p = False
    # The typed views are writable; a read-only input needs a copy.
    if not a.flags.writeable:
        a = a.copy()
    if not b.flags.writeable:
        b = b.copy()
    if not g.flags.writeable:
        g = g.copy()
    if over_p:
        with blas_limit(1):
            _gemm_positions(which, a, b, g.reshape(-1), g_pstride, g_ld, threads_for(total))
    else:
        _gemm_positions(which, a, b, g.reshape(-1), g_pstride, g_ld, 0)
    return 0


# ---------------------------------------------------------------- Python API

@cython.wraparound(True)
def _geometry(name, x_shape, kernel_size, strides, channels_last):
    """Return (nd, (kh, kw), (sh, sw), (OH, OW), C, x4 shape) for a valid conv."""
    nd = len(x_shape) - 2
    if nd not in (1, 2):
        raise ValueError("%s: expected a 3-D (1-D conv) or 4-D (2-D conv) input, got shape %s"
                         % (name, tuple(x_shape)))
    ks = int_tuple(name, "kernel_size", kernel_size, nd)
    ss = int_tuple(name, "strides", strides, nd)
    if channels_last:
        spatial, C = tuple(x_shape[1:-1]), x_shape[-1]
    else:
        spatial, C = tuple(x_shape[2:]), x_shape[1]
    out = []
    for d in range(nd):
        if spatial[d] < ks[d]:
            raise ValueError("%s: kernel_size %s larger than input spatial shape %s"
                             % (name, ks, spatial))
        out.append((spatial[d] - ks[d]) // ss[d] + 1)
    if nd == 1:
        ks, ss, out, spatial = (1,) + ks, (1,) + ss, [1] + out, (1,) + spatial
    n = x_shape[0]
    x4 = (n,) + spatial + (C,) if channels_last else (n, C) + spatial
    return nd, ks, ss, tuple(out), C, x4


@cython.wraparound(True)
def _shapes(name, x_shape, kshape, kernel_size, strides, channels_last, dy=None):
    """Validated sizes ((kh, kw), (sh, sw), (OH, OW), 4-D x shape, P, K, N, F,
    output shape); checks the kernel's shape and, when given, dy's."""
    nd, ks, ss, out, C, x4s = _geometry(name, x_shape, kernel_size, strides, channels_last)
    P, K = out[0] * out[1], ks[0] * ks[1] * C
    if len(kshape) != 3 or kshape[0] != P or kshape[1] != K:
        raise ValueError("%s: kernel must have shape (%d, %d, filters) for input %s, got %s"
                         % (name, P, K, tuple(x_shape), tuple(kshape)))
    N, F = x_shape[0], kshape[2]
    y_shape = _out_shape(N, F, out, nd, channels_last)
    if dy is not None and dy.shape != y_shape:
        raise ValueError("%s: dy has shape %s, expected %s" % (name, dy.shape, y_shape))
    return ks, ss, out, x4s, P, K, N, F, y_shape


@cython.wraparound(True)
def _out_shape(n, F, out, nd, channels_last):
    sp = out[1:] if nd == 1 else out
    return (n,) + sp + (F,) if channels_last else (n, F) + sp


def _patches(x4, ks, ss, OW, P, K, channels_last):
    pt = np.empty((P, x4.shape[0], K), dtype=x4.dtype)
    _im2col(x4, pt, ks[0], ks[1], ss[0], ss[1], OW, channels_last)
    return pt


def _dy_positions(dy, N, P, F, channels_last):
    """dy as a flat buffer plus (stride between positions, leading dim)."""
    if channels_last:
        return np.ascontiguousarray(dy).reshape(N, P, F), F, P * F
    # (N, F, P) -> (P, N, F)
    return np.ascontiguousarray(dy.reshape(N, F, P).transpose(2, 0, 1)), N * F, F


@cython.wraparound(True)
def local_forward(x, kernel, kernel_size, strides, channels_last=True):
    """Locally connected convolution, 'valid' padding.

    x: (N, W, C) / (N, C, W) for 1-D or (N, H, W, C) / (N, C, H, W) for 2-D.
    kernel: (P, K, F), P = number of output positions, K = prod(kernel_size)*C,
    rows in the Keras patch order described in the module docstring.
    Returns (N, [OH,] OW, F) if channels_last else (N, F, [OH,] OW).
    """
    name = "local_forward"
    x = np.asarray(x)
    kernel = np.asarray(kernel)
    check_float(name, x, kernel)
    ks, ss, out, x4s, P, K, N, F, y_shape = _shapes(name, x.shape, kernel.shape, kernel_size,
                                                    strides, channels_last)
    y = np.empty(y_shape, dtype=x.dtype)
    if y.size == 0:
        return y
    if K == 0:
        y[...] = 0
        return y
    x4 = np.ascontiguousarray(x).reshape(x4s)
    kernel = np.ascontiguousarray(kernel)
    pt = _patches(x4, ks, ss, out[1], P, K, channels_last)
    if channels_last:
        # y viewed as (N, P, F): position p's (N, F) block starts at p*F, rows P*F apart
        _run_gemms(0, pt, kernel, y, F, P * F)
        return y
    tmp = np.empty((P, N, F), dtype=x.dtype)
    _run_gemms(0, pt, kernel, tmp, N * F, F)
    y.reshape(N, F, P)[...] = tmp.transpose(1, 2, 0)
    return y


@cython.wraparound(True)
def local_backward_input(dy, kernel, x_shape, kernel_size, strides, channels_last=True):
    """Gradient of local_forward with respect to x; returns an array of x_shape."""
    name = "local_backward_input"
    dy = np.asarray(dy)
    kernel = np.asarray(kernel)
    check_float(name, dy, kernel)
    x_shape = tuple(int(s) for s in x_shape)
    ks, ss, out, x4s, P, K, N, F, _ = _shapes(name, x_shape, kernel.shape, kernel_size, strides,
                                              channels_last, dy)
    dx = np.empty(x_shape, dtype=dy.dtype)
    if dx.size == 0:
        return dx
    if F == 0:
        dx[...] = 0
        return dx
    g, pstride, ld = _dy_positions(dy, N, P, F, channels_last)
    dpt = np.empty((P, N, K), dtype=dy.dtype)
    _run_gemms(1, dpt, np.ascontiguousarray(kernel), g, pstride, ld)
    _col2im(dpt, dx.reshape(x4s), ks[0], ks[1], ss[0], ss[1], out[1], channels_last)
    return dx


@cython.wraparound(True)
def local_backward_kernel(x, dy, kernel_shape, kernel_size, strides, channels_last=True):
    """Gradient of local_forward with respect to the kernel (kernel_shape)."""
    name = "local_backward_kernel"
    x = np.asarray(x)
    dy = np.asarray(dy)
    check_float(name, x, dy)
    kernel_shape = tuple(int(s) for s in kernel_shape)
    ks, ss, out, x4s, P, K, N, F, _ = _shapes(name, x.shape, kernel_shape, kernel_size, strides,
                                              channels_last, dy)
    dk = np.empty(kernel_shape, dtype=x.dtype)
    if dk.size == 0:
        return dk
    if N == 0:
        dk[...] = 0
        return dk
    x4 = np.ascontiguousarray(x).reshape(x4s)
    pt = _patches(x4, ks, ss, out[1], P, K, channels_last)
    g, pstride, ld = _dy_positions(dy, N, P, F, channels_last)
    _run_gemms(2, pt, dk, g, pstride, ld)
    return dk
