# Convolution arguments and geometry (included by conv.pyx).
#
# The checks every entry makes before it picks a strategy: dtypes, strides,
# dilation and pads (through cyback/kernels/_checks.py), shapes, and the
# geometry they give as a dict of Geom fields (every rank as 3-D: 1-D is
# D = H = 1, 2-D is D = 1), remembered per argument tuple. Also the helpers
# every strategy uses: the output shape, the thread count and BLAS limit of a
# geometry, flat and writable views.


cdef struct Geom:
    Py_ssize_t N, C, F
    Py_ssize_t D, H, W
    Py_ssize_t OD, OH, OW
    Py_ssize_t KD, KH, KW
    Py_ssize_t sd, sh, sw
    Py_ssize_t dil_d, dil_h, dil_w
    Py_ssize_t pd, ph, pw
    Py_ssize_t K       # KD * KH * KW * C: one patch, ordered like the kernel
    Py_ssize_t P       # OD * OH * OW: output positions per sample


_GEOMETRIES = {}


def _geometry(x_shape, k_shape, strides, dilation, pads, channels_last, fname):
    """Validated Geom fields as a dict (shared: read it, never write it), the
    output spatial shape and whether the convolution is pointwise;
    remembered per argument tuple."""
    return remembered(_GEOMETRIES, (x_shape, k_shape, strides, dilation, _pads_key(pads),
                                    bool(channels_last)),
                      _compute_geometry, x_shape, k_shape, strides, dilation, pads,
                      channels_last, fname)


def _pads_key(pads):
    """pads as a hashable key: Keras and the benchmarks pass a list of
    (before, after) pairs, which _geometry would otherwise validate anew at
    every call, a visible share of a batch-1 layer's time outside its
    kernel."""
    if isinstance(pads, list):
        try:
            return tuple([tuple(p) if isinstance(p, (list, tuple)) else p for p in pads])
        except TypeError:
            return pads
    return pads


@cython.wraparound(True)
@cython.boundscheck(True)
def _compute_geometry(x_shape, k_shape, strides, dilation, pads, channels_last, fname):
    x_shape = tuple(int(s) for s in x_shape)
    k_shape = tuple(int(s) for s in k_shape)
    rank = len(x_shape) - 2
    if len(k_shape) == len(x_shape) + 1 and 3 <= len(k_shape) <= 5:
        # the kernel's rank says what the input lacks: its batch axis
        raise ValueError("%s: the input %s has no batch axis: a %d-D kernel %s takes %d-D "
                         "input (batch, %d spatial axes, channels); add one (x[None])"
                         % (fname, x_shape, len(k_shape), k_shape, len(k_shape),
                            len(k_shape) - 2))
    if rank not in (1, 2, 3):
        raise ValueError("%s: input must have 1 to 3 spatial axes, got shape %s"
                         % (fname, x_shape))
    if len(k_shape) != rank + 2:
        raise ValueError("%s: kernel shape %s does not match input shape %s (need %d-D kernel)"
                         % (fname, k_shape, x_shape, rank + 2))
    if any(s < 0 for s in x_shape) or any(s < 1 for s in k_shape[:rank]) or min(k_shape) < 0:
        raise ValueError("%s: invalid shapes %s, kernel %s" % (fname, x_shape, k_shape))
    strides = int_tuple(fname, "strides", strides, rank, scalar=False)
    dilation = int_tuple(fname, "dilation", dilation, rank, scalar=False)
    pads = pad_pairs(fname, pads, rank)
    if channels_last:
        n, spatial, c = x_shape[0], x_shape[1:-1], x_shape[-1]
    else:
        n, c, spatial = x_shape[0], x_shape[1], x_shape[2:]
    if k_shape[-2] != c:
        raise ValueError("%s: kernel %s expects %d input channels but the input %s has %d (%s)"
                         % (fname, k_shape, k_shape[-2], x_shape, c,
                            "channels_last" if channels_last else "channels_first"))
    out = []
    for i in range(rank):
        span = (k_shape[i] - 1) * dilation[i] + 1
        ext = spatial[i] + pads[i][0] + pads[i][1] - span
        out.append(ext // strides[i] + 1 if ext >= 0 else 0)
    # Per axis (size, kernel, stride, dilation, pad before, pad after, out),
    # as three axes D, H, W: 1-D is W, 2-D is H, W.
    axes = [(1, 1, 1, 1, 0, 0, 1)] * (3 - rank) + \
        [(spatial[i], k_shape[i], strides[i], dilation[i], pads[i][0], pads[i][1], out[i])
         for i in range(rank)]
    # A trailing axis of size 1 with a 1-tap kernel and no padding, such as
    # the W of a (k, 1) kernel on (N, H, 1, C), leaves the memory of x, the
    # kernel and y as they would be without it: drop it, so that the axis
    # before becomes W, along which the kernels tile their rows (rows of
    # one pixel would leave the tiles nearly empty).
    for _ in range(2):
        if axes[2][:2] == (1, 1) and axes[2][4:6] == (0, 0) and \
                any(a[:2] != (1, 1) or a[4:6] != (0, 0) for a in axes[:2]):
            axes = [(1, 1, 1, 1, 0, 0, 1)] + axes[:2]
    sp, ks, ss, ds, ps, _, os = zip(*axes)
    g = dict(N=n, C=c, F=k_shape[-1], D=sp[0], H=sp[1], W=sp[2], OD=os[0], OH=os[1], OW=os[2],
             KD=ks[0], KH=ks[1], KW=ks[2], sd=ss[0], sh=ss[1], sw=ss[2],
             dil_d=ds[0], dil_h=ds[1], dil_w=ds[2], pd=ps[0], ph=ps[1], pw=ps[2],
             K=ks[0] * ks[1] * ks[2] * c, P=os[0] * os[1] * os[2])
    pointwise = (all(k == 1 for k in ks) and all(s == 1 for s in ss)
                 and all(a == 0 and b == 0 for a, b in pads))
    return g, tuple(out), pointwise


@cython.wraparound(True)
@cython.boundscheck(True)
def _y_shape(g, out, channels_last):
    return ((g["N"],) + out + (g["F"],)) if channels_last else ((g["N"], g["F"]) + out)


def _check_dy(fname, dy, yshape, x_shape, k_shape, strides, dilation, pads):
    """A gradient's check that dy has yshape, the shape of the forward
    pass's output."""
    if dy.shape != yshape:
        raise ValueError("%s: dy has shape %s but a convolution of input %s with kernel %s, "
                         "strides %s, dilation %s, pads %s gives %s"
                         % (fname, dy.shape, x_shape, k_shape, tuple(strides),
                            tuple(dilation), tuple(pads), yshape))


@cython.wraparound(True)
@cython.boundscheck(True)
def _threads(g):
    """(OpenMP threads, BLAS-limit context) for a convolution of this geometry.

    Work is the GEMM flops; small problems stay on the calling thread, and then
    BLAS needs no limit either (OpenBLAS runs GEMMs that small on one thread),
    which saves the locked ctypes calls of switching it. A large problem on
    one OpenMP thread still holds BLAS at one thread, so that its GEMMs run
    exactly as they do on more threads.
    """
    cdef double work = 2.0 * g["N"] * g["P"] * g["K"] * g["F"]
    # The team's cutoff is counted in bytes moved, and a convolution's flop
    # costs about an eighth of a byte (_TUNE["flops_per_byte"]): waking a
    # sleeping team outweighs a small batch-1 convolution's work
    # (benchmarks/bench_conv.py compares 1 and 2 threads at batch 1).
    return (threads_for(work / _TUNE["flops_per_byte"]),
            nullcontext() if work < team_min_work() else blas_limit(1))


def _flat(a):
    return a.reshape(-1)


cdef inline object _writable(cnp.ndarray a):
    # the memoryviews of the GEMM paths refuse read-only buffers (constants)
    return a if cnp.PyArray_ISWRITEABLE(a) else a.copy()
