# The prepared forward call (included by depthwise.pyx): depthwise_forward's
# checks made once for a geometry, dtype and epilogue (forward_call), then a
# call that only checks its arrays fit (ForwardCall).


cdef class ForwardCall:
    """``depthwise_forward`` for one 2-D channels_last geometry, dtype and
    epilogue, validated once by ``forward_call`` (see conv.ForwardCall: at
    batch 1 the checks take about as long as the kernel). A call checks each
    array's type, dtype, shape and contiguity and runs the row kernel;
    arrays that do not fit take depthwise_forward, which converts or raises."""
    cdef tuple x_shape, k_shape, b_shape, y_shape, args
    cdef object activation, dtype, no_bias
    cdef int typenum, act
    cdef bint has_bias
    cdef _Geom g
    cdef cnp.npy_intp y_dims[4]

    def __call__(self, x, kernel, bias=None):
        cdef cnp.ndarray y
        if not fits(x, self.typenum, self.x_shape) or \
                not fits(kernel, self.typenum, self.k_shape) or \
                (bias is not None) != self.has_bias or \
                (self.has_bias and not fits(bias, self.typenum, self.b_shape)):
            return depthwise_forward(x, kernel, *self.args, bias=bias,
                                     activation=self.activation)
        y = cnp.PyArray_EMPTY(4, self.y_dims, self.typenum, 0)
        if self.typenum == cnp.NPY_FLOAT:
            _forward_cl_call[float](x, kernel, y, self.g,
                                    bias if self.has_bias else self.no_bias, self.act)
        else:
            _forward_cl_call[double](x, kernel, y, self.g,
                                     bias if self.has_bias else self.no_bias, self.act)
        return y


cdef _forward_cl_call(const floating[:, :, :, ::1] x, const floating[:, :, :, ::1] k,
                      floating[:, :, :, ::1] y, _Geom g, const floating[::1] bias, int act):
    cdef cb_intr intr
    cb_intr_init(&intr)
    _fwd_cl(x, k, y, g, bias, act, &intr)
    check_interrupt(&intr)


@cython.wraparound(True)
def forward_call(x_shape, k_shape, strides, dilation, pads, channels_last, dtype,
                 bint has_bias=False, activation=None):
    """A prepared ``depthwise_forward(x, kernel, strides, dilation, pads,
    channels_last, bias, activation)`` for arrays of these shapes and dtype
    (float32 or float64): ``call(x, kernel, bias)``. The checks (and their
    errors) are depthwise_forward's, made here once. Only 2-D channels_last
    inputs with outputs take the row kernel directly; others always go
    through depthwise_forward."""
    name = "depthwise_forward"
    cdef ForwardCall call = ForwardCall()
    dtype = float_dtype(name, dtype)
    x_shape = tuple(int(d) for d in x_shape)
    k_shape = tuple(int(d) for d in k_shape)
    nd, ss, ds, ps, spatial, out = _params(name, x_shape, k_shape, strides, dilation, pads,
                                           channels_last)
    if activation not in _ACTIVATIONS:
        raise ValueError("%s: activation must be one of None, 'linear', 'relu', 'relu6', got %r"
                         % (name, activation))
    C, M = k_shape[-2], k_shape[-1]
    call.y_shape = _out_shape(x_shape[0], C * M, out, nd, channels_last)
    call.args = (strides, dilation, pads, channels_last)
    call.activation, call.dtype = activation, dtype
    call.no_bias = np.empty(0, dtype)
    call.act = _ACTIVATIONS[activation]
    call.has_bias = has_bias
    call.b_shape = (C * M,)
    call.k_shape = k_shape
    call.g = _geom(ss + ds + (ps[0][0], ps[1][0]))
    if nd == 2 and channels_last and 0 not in call.y_shape:
        call.x_shape, call.typenum = x_shape, dtype.num
        for i in range(4):
            call.y_dims[i] = call.y_shape[i]
    else:
        # no array fits: every call goes through depthwise_forward
        call.x_shape, call.typenum = (), -1
        return call
    if M == 1 and C < PAD_CHANNELS and dtype == np.float32 and cb_simd_has_avx2():
        return PaddedForwardCall(call, x_shape, k_shape, has_bias, strides, dilation, pads,
                                 activation)
    return call


# channels_last float32 rows of at least a vector of channels run all their
# channels in vectors (the last vector ends at the last channel, overlapping
# the one before: include/cyback_depthwise_last.h); a layer of fewer channels
# than a vector would run them one at a time, which is slower than copying it
# with zero channels up to a vector (tests/kernels/test_depthwise_prepared.py
# checks the values).
PAD_CHANNELS = 8


cdef class PaddedForwardCall:
    """A ForwardCall for channels_last float32 layers of fewer than
    PAD_CHANNELS channels, with a depth multiplier of 1: x, the kernel and
    the bias are copied with zero channels up to the next multiple, the
    padded layer runs in vectors only, and its first C channels are the
    result. Each channel's sum is the vector path's, whose taps add in the
    same order as the one-channel path's."""
    cdef ForwardCall inner
    cdef tuple x_shape, k_shape, b_shape, args
    cdef object activation
    cdef bint has_bias
    cdef Py_ssize_t C, Cp

    def __init__(self, ForwardCall plain, x_shape, k_shape, bint has_bias, strides, dilation,
                 pads, activation):
        # (the module runs without wraparound: no negative indices)
        self.C = k_shape[2]
        self.Cp = (self.C + PAD_CHANNELS - 1) // PAD_CHANNELS * PAD_CHANNELS
        self.x_shape, self.k_shape, self.b_shape = x_shape, k_shape, (self.C,)
        self.has_bias, self.activation = has_bias, activation
        self.args = (strides, dilation, pads, True)
        self.inner = forward_call(x_shape[:3] + (self.Cp,), k_shape[:2] + (self.Cp, 1),
                                  strides, dilation, pads, True, np.float32, has_bias,
                                  activation)

    def __call__(self, x, kernel, bias=None):
        if not fits(x, cnp.NPY_FLOAT, self.x_shape) or \
                not fits(kernel, cnp.NPY_FLOAT, self.k_shape) or \
                (bias is not None) != self.has_bias or \
                (self.has_bias and not fits(bias, cnp.NPY_FLOAT, self.b_shape)):
            return depthwise_forward(x, kernel, *self.args, bias=bias,
                                     activation=self.activation)
        cdef Py_ssize_t C = self.C
        xp = np.zeros(self.x_shape[:3] + (self.Cp,), np.float32)
        xp[:, :, :, :C] = x
        kp = np.zeros(self.k_shape[:2] + (self.Cp, 1), np.float32)
        kp[:, :, :C, :] = kernel
        bp = None
        if self.has_bias:
            bp = np.zeros(self.Cp, np.float32)
            bp[:C] = bias
        return np.ascontiguousarray(self.inner(xp, kp, bp)[:, :, :, :C])
