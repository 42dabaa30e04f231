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
