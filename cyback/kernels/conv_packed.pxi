# Convolutions of few output positions through a kernel packed once
# (included by conv.pyx): the patch matrix (N * P, K) times the kernel seen
# as a (K, F) matrix in the panels of include/cyback_packed_gemm.h, which an
# inference plan's frozen prelude packs (ops/conv.py, PackedConv).
#
# A stage-4 ResNet-50 layer at batch 1 (49 positions, K = 4608, F = 512) is
# too small a product for BLAS to split well over threads and too short in
# rows to amortise its packing of the kernel on every call; the packed
# kernel splits its columns over the team and reads the panels as they are
# (benchmarks/bench_conv.py, "packed" rows). Winograd keeps the layers it
# takes; larger products keep the strategies of _run_forward.

from cyback.kernels._packed cimport (CB_PG_MAX_ROWS, CB_PG_NR, cb_pg_args, cb_pg_available,
                                     cb_pg_item, cb_pg_items, cb_pg_plan, cb_pg_plan_for)


@cython.wraparound(True)
@cython.boundscheck(True)
def _use_packed(g, bint last, dtype, bint pointwise):
    """Whether a forward convolution whose kernel is packed runs as the packed
    product: channels_last float32 with 1 to CB_PG_MAX_ROWS output positions
    in all, that neither Winograd nor, unless it is 1x1, the direct kernel
    takes (both beat an im2col product where they do: a text CNN's 3-tap
    Conv1D on 50 channels, 1x3 taps on 512 positions), with a patch matrix
    of at most _TUNE["packed_im2col_bytes"] (a 1x1, stride-1 unpadded layer
    multiplies its input rows in place). Of more positions, only 1x1
    layers that narrow many input channels (a bottleneck's projection: at
    least packed_pointwise_min_c and twice the outputs) on up to
    packed_pointwise_max_rows positions: the direct kernel and the GEMM
    tiles are faster on the others. Winograd's layers with at most
    packed_over_winograd_rows positions, packed_over_winograd_min_c input
    and packed_over_winograd_min_f output channels run packed too: on a
    14x14 map (ResNet-50's 3x3 256 -> 256 at batch 1) its tiles are too few
    for the transforms to pay (benchmarks/bench_conv.py --packed; with few
    outputs, as DenseNet's 128 -> 32, Winograd stays faster). So do those
    channels on up to CB_PG_MAX_ROWS positions whose maps Winograd's 2x2
    tiles cover with a quarter more outputs than there are
    (packed_over_winograd_waste: a 7x7 map takes 4x4 tiles, 64 outputs for
    49; ResNet-50's 3x3 512 -> 512 at batch 8 runs 1.19x faster packed, where
    17x17 and 19x19 maps, 1.1x covered, stay faster on Winograd)."""
    if not (_TUNE["packed"] and last and dtype == np.float32 and cb_pg_available()):
        return False
    rows = g["N"] * g["P"]
    if rows < 1 or g["K"] < 1 or g["F"] < 1:
        return False
    if rows > CB_PG_MAX_ROWS and not (
            pointwise and rows <= _TUNE["packed_pointwise_max_rows"] and
            g["K"] >= _TUNE["packed_pointwise_min_c"] and g["K"] >= 2 * g["F"]):
        return False
    if not pointwise and (rows * g["K"] * 4 > _TUNE["packed_im2col_bytes"] or
                          _use_direct(g, last, False)):
        return False
    if rows <= _TUNE["packed_over_winograd_rows"] and \
            g["C"] >= _TUNE["packed_over_winograd_min_c"] and \
            g["F"] >= _TUNE["packed_over_winograd_min_f"]:
        return True
    if rows <= CB_PG_MAX_ROWS and g["KD"] == 1 and \
            g["C"] >= _TUNE["packed_over_winograd_min_c"] and \
            g["F"] >= _TUNE["packed_over_winograd_min_f"] and \
            4.0 * ((g["OH"] + 1) // 2) * ((g["OW"] + 1) // 2) >= \
            _TUNE["packed_over_winograd_waste"] * g["OH"] * g["OW"]:
        return True
    return not _use_winograd(g, last, dtype)


@cython.final
cdef class PackedForwardCall:
    """``call(x, packed, bias, residual)``: act(conv(x, kernel) + bias +
    residual) for one geometry, with the kernel given as
    ``linalg.pack_panels(kernel.reshape(K, F))``; None when the arrays do not
    fit the prepared shapes (the caller takes conv_forward)."""
    cdef Geom g
    cdef tuple x_shape, p_shape, y_shape
    cdef cnp.npy_intp y_dims[5]
    cdef int y_ndim, act
    cdef bint pointwise, has_bias, has_res
    cdef double work

    def __call__(self, x, packed, bias=None, residual=None):
        if not fits(x, cnp.NPY_FLOAT, self.x_shape) or \
                not fits(packed, cnp.NPY_FLOAT, self.p_shape) or \
                (bias is None) == self.has_bias or (residual is None) == self.has_res or \
                (bias is not None and not fits(bias, cnp.NPY_FLOAT, (self.g.F,))) or \
                (residual is not None and not fits(residual, cnp.NPY_FLOAT, self.y_shape)):
            return None
        cdef Py_ssize_t rows = self.g.N * self.g.P, K = self.g.K, it, r0, i
        cdef Py_ssize_t nblk = (rows + IM2COL_ROWS - 1) // IM2COL_ROWS
        cdef cnp.ndarray y = cnp.PyArray_EMPTY(self.y_ndim, self.y_dims, cnp.NPY_FLOAT, 0)
        cdef cnp.ndarray cols
        cdef const float* xp = <const float*> cnp.PyArray_DATA(<cnp.ndarray> x)
        cdef float* cp
        cdef cb_pg_args a
        cdef int nt = threads_for(self.work)
        if self.pointwise:
            a.x = xp
        else:
            cols = np.empty(rows * K, dtype=np.float32)
            cp = <float*> cnp.PyArray_DATA(cols)
            with nogil:
                for it in prange(nblk, num_threads=nt, schedule='static'):
                    r0 = it * IM2COL_ROWS
                    _im2col_last(xp, cp + r0 * K, &self.g, r0, min(IM2COL_ROWS, rows - r0))
            a.x = cp
        a.ldx, a.k, a.n = K, K, self.g.F
        a.packed = <const float*> cnp.PyArray_DATA(<cnp.ndarray> packed)
        a.P = (self.g.F + CB_PG_NR - 1) // CB_PG_NR
        a.b = NULL
        a.res = NULL
        if bias is not None:
            a.b = <const float*> cnp.PyArray_DATA(<cnp.ndarray> bias)
        if residual is not None:
            a.res = <const float*> cnp.PyArray_DATA(<cnp.ndarray> residual)
        a.ldr, a.y, a.ldy, a.act = self.g.F, <float*> cnp.PyArray_DATA(y), self.g.F, self.act
        cdef cb_pg_plan q = cb_pg_plan_for(rows, a.P)
        cdef Py_ssize_t items = cb_pg_items(&q)
        with nogil:
            if nt > 1 and items > 1:
                for i in prange(items, num_threads=nt, schedule='static'):
                    cb_pg_item(&a, &q, i)
            else:
                for i in range(items):
                    cb_pg_item(&a, &q, i)
        team_done(nt)
        return y


def packed_forward_call(x_shape, k_shape, strides, dilation, pads, channels_last, dtype,
                        bint has_bias=False, bint has_residual=False, activation=None):
    """A ``PackedForwardCall`` for arrays of these shapes (the checks and
    errors of conv_forward), or None when _use_packed does not take the
    geometry (the caller then runs forward_call's strategies)."""
    fname = "conv_forward"
    dtype = float_dtype(fname, dtype)
    x_shape = tuple(int(d) for d in x_shape)
    k_shape = tuple(int(d) for d in k_shape)
    g, osp, pointwise = _geometry(x_shape, k_shape, strides, dilation, pads, channels_last,
                                  fname)
    if activation not in _ACTIVATIONS:
        raise ValueError("%s: activation must be one of None, 'linear', 'relu', 'relu6', got %r"
                         % (fname, activation))
    if not _use_packed(g, bool(channels_last), dtype, pointwise):
        return None
    cdef PackedForwardCall call = PackedForwardCall()
    call.g = g
    call.x_shape = x_shape
    call.p_shape = ((g["F"] + CB_PG_NR - 1) // CB_PG_NR, g["K"], CB_PG_NR)
    call.y_shape = _y_shape(g, osp, True)
    call.y_ndim = len(call.y_shape)
    for i in range(call.y_ndim):
        call.y_dims[i] = call.y_shape[i]
    call.act = _ACTIVATIONS[activation]
    call.pointwise = pointwise
    call.has_bias, call.has_res = has_bias, has_residual
    call.work = 2.0 * g["N"] * g["P"] * g["K"] * g["F"] / _TUNE["flops_per_byte"]
    return call
