# Depthwise arguments and geometry (included by depthwise.pyx).
#
# The checks every entry makes before it picks a path: ranks, channels,
# strides, dilation and pads (through cyback/kernels/_checks.py), and the
# output size they give, remembered per argument tuple; the geometry of one
# call as a _Geom; the 4-D views every path works on (1-D data as images of
# height 1) and the output shape.


# Strides, dilations and leading pads (rows, columns) of one call.
ctypedef struct _Geom:
    Py_ssize_t sh, sw, dil_h, dil_w, ph, pw


cdef _Geom _geom(tuple t):
    # (sh, sw, dil_h, dil_w, ph, pw) as a _Geom
    cdef _Geom g
    g.sh, g.sw, g.dil_h, g.dil_w, g.ph, g.pw = t
    return g


_PARAMS = {}


def _params(name, x_shape, k_shape, strides, dilation, pads, channels_last):
    """_compute_params, remembered per argument tuple."""
    return remembered(_PARAMS, (tuple(x_shape), tuple(k_shape), strides, dilation, pads,
                                bool(channels_last)),
                      _compute_params, name, x_shape, k_shape, strides, dilation, pads,
                      channels_last)


@cython.wraparound(True)
def _compute_params(name, x_shape, k_shape, strides, dilation, pads, channels_last):
    """Validate and return 2-D params plus out spatial shape."""
    nd = len(x_shape) - 2
    if nd not in (1, 2):
        raise ValueError("%s: expected a 3-D (1 spatial dim) or 4-D input, got shape %s"
                         % (name, tuple(x_shape)))
    if len(k_shape) != nd + 2:
        raise ValueError("%s: kernel must be %d-D (%s, C, M) for input %s, got %s"
                         % (name, nd + 2, "kh, kw" if nd == 2 else "kw", tuple(x_shape),
                            tuple(k_shape)))
    c = x_shape[-1] if channels_last else x_shape[1]
    if k_shape[nd] != c:
        raise ValueError("%s: kernel %s has %d input channels, input %s has %d"
                         % (name, tuple(k_shape), k_shape[nd], tuple(x_shape), c))
    ss = int_tuple(name, "strides", strides, nd)
    ds = int_tuple(name, "dilation", dilation, nd)
    ps = pad_pairs(name, pads, nd)
    spatial = tuple(x_shape[1:-1] if channels_last else x_shape[2:])
    out = []
    for d in range(nd):
        span = (k_shape[d] - 1) * ds[d] + 1
        o = (spatial[d] + ps[d][0] + ps[d][1] - span) // ss[d] + 1
        if k_shape[d] < 1 or o < 1:
            raise ValueError("%s: dilated kernel %s larger than padded input %s (pads %r)"
                             % (name, tuple(k_shape[:nd]), spatial, ps))
        out.append(o)
    if nd == 1:
        ss, ds, ps, spatial, out = (1,) + ss, (1,) + ds, ((0, 0),) + ps, (1,) + spatial, [1] + out
    return nd, ss, ds, ps, spatial, tuple(out)


def _cl_shape(shape):
    return (shape[0], shape[2], shape[3], shape[1])


@cython.wraparound(True)
def _img(a, nd, channels_last):
    """C-contiguous 4-D view; 1-D data gets height 1."""
    a = np.ascontiguousarray(a)
    if nd == 1:
        return a[:, None] if channels_last else a[:, :, None]
    return a


def _ker(k, nd):
    k = np.ascontiguousarray(k)
    return k[None] if nd == 1 else k


@cython.wraparound(True)
def _out_shape(n, ch, out, nd, channels_last):
    sp = out[1:] if nd == 1 else out
    return (n,) + sp + (ch,) if channels_last else (n, ch) + sp


_ACTIVATIONS = {None: 0, "linear": 0, "relu": 1, "relu6": 2}
