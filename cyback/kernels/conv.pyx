"""Convolution kernels for 1-D, 2-D and 3-D convolutions: the forward pass,
the input gradient (also the transposed convolution) and the kernel gradient.

Every rank runs through one 3-D code path (1-D is D = H = 1, 2-D is D = 1).

Layouts (the same as Keras):
    x       (N, *spatial, C) when channels_last, else (N, C, *spatial)
    kernel  (*k, C, F)
    y       (N, *out, F) when channels_last, else (N, F, *out)
Padding is explicit: ``pads`` holds one (before, after) pair per spatial axis
(see ``conv_utils.conv_pads``). A transposed convolution is
``conv_backward_input`` with the transposed kernel and the wanted output shape.

This module holds the entry points (conv_forward, forward_call and its
ForwardCall, conv_backward_input, conv_backward_kernel) and the forward
dispatcher (_run_forward); each strategy is in an included part, picked per
geometry by the rule named after it:

- conv_geometry.pxi: argument checks, the geometry (Geom), thread counts;
- conv_tuning.pxi: _TUNE, the knobs of the rules below;
- conv_winograd.pxi: Winograd F(2x2, 3x3) (float32, 3x3 or (KD, 3, 3),
  stride 1, 12-24+ channels; cyback/kernels/winograd.pyx), channels_first
  through channels_last copies (_use_winograd);
- conv_pointwise.pxi: 1x1, stride-1, unpadded channels_last convolutions with
  a wide kernel or many pixels as fixed tiles of the (N*P, C) @ (C, F)
  product, one single-threaded GEMM and the epilogue each
  (_use_pointwise_gemm);
- conv_direct.pxi: the register-tiled direct kernels of
  include/cyback_conv_direct.h (channels_last forward, few input channels
  and short patches; reads the input in place and applies the bias /
  residual / relu epilogue itself: _use_direct) and
  include/cyback_conv_wgrad.h (channels_last kernel gradient: _use_direct_wgrad);
- conv_taps.pxi: stride-1 taps (forward and kernel gradient, C >= 32): each
  kernel tap reads a zero-padded copy of the input at a constant offset, so
  one K = C GEMM per tap runs straight on its rows (_tap_rows);
- conv_im2col.pxi: the general path. Blocks of output positions, each
  im2col'ed into a per-thread buffer small enough to stay in L2 and
  multiplied with a single-threaded GEMM, with OpenMP over the blocks
  (materialising the whole patch matrix would cost hundreds of MB on
  ordinary ResNet shapes); few output positions (channels_last, one block,
  up to 4 MB of patches) build the whole patch matrix and multiply it in
  the pointwise tiles, so that its columns split over the team
  (_use_short_im2col); a strided input gradient is GEMM + col2im over slabs
  of output rows that never touch the same input element at the same time;
- conv_packed.pxi: channels_last float32 forward convolutions of few output
  positions whose kernel an inference plan packed once, as the patch matrix
  times the packed panels of include/cyback_packed_gemm.h
  (packed_forward_call; _use_packed);
- conv_phases.pxi: a strided input gradient (a transposed convolution's
  forward pass) with few enough channels, as one stride-1 convolution per
  phase of the strides that the direct kernel writes straight into its
  interleaved places (_use_phases; channels_first through channels_last
  copies);
- conv_blocks.pxi: a depthwise block (1x1 expansion, depthwise convolution,
  1x1 projection: MobileNetV2's inverted residual) run row by row with the
  direct kernel and the depthwise row kernel, its intermediate tensors
  never written out (block_forward; ops/depthwise_block.py joins the steps).

A stride-1 input gradient is a forward convolution with the flipped kernel
(no scatter-add). Block sizes and the order of every sum are fixed by the
shapes alone, never by the thread count, so results are bit-identical for any
number of threads.
"""
import functools
from math import gcd

from cyback.kernels import settings as _settings
import numpy as np
cimport cython
cimport numpy as cnp
from cython.parallel cimport prange, parallel, threadid
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from cyback.kernels._blas cimport floating, gemm
from contextlib import nullcontext
from cyback.kernels._omp cimport cb_get_num_threads
from cyback.kernels.runtime cimport (join_seconds, team_done, team_min_work, team_size,
                                     threads_for)
from cyback.kernels._arrays cimport fits
from cyback.kernels._interrupt cimport cb_intr, cb_intr_init, cb_intr_poll, check_interrupt
from cyback.kernels._tiles cimport (cb_tiles, cb_tiles_finish, cb_tiles_init, cb_tiles_join,
                                   cb_tiles_take, cb_tiles_wait_done)
from cyback.kernels._checks import check_float, float_dtype, int_tuple, pad_pairs, remembered
from cyback.kernels.blas_threads import blas_limit
from cyback.kernels import winograd


cnp.import_array()

include "conv_geometry.pxi"
include "conv_tuning.pxi"
include "conv_direct.pxi"
include "conv_winograd.pxi"
include "conv_pointwise.pxi"
include "conv_im2col.pxi"
include "conv_taps.pxi"
include "conv_phases.pxi"
include "conv_packed.pxi"
include "conv_blocks.pxi"


_ACTIVATIONS = {None: 0, "linear": 0, "relu": 1, "relu6": 2}


@cython.wraparound(True)
@cython.boundscheck(True)
def conv_forward(x, kernel, strides, dilation, pads, channels_last=True, out=None, bias=None,
                 residual=None, activation=None):
    """N-D convolution (cross-correlation, as in Keras), 1 to 3 spatial axes.

    x: (N, *spatial, C) if channels_last else (N, C, *spatial); kernel (*k, C, F);
    strides, dilation: one int per spatial axis; pads: one (before, after) pair
    per spatial axis. Returns y: (N, *out, F) or (N, F, *out), with
    out = (size + before + after - (k - 1) * dilation - 1) // stride + 1.
    Optional epilogue: bias, (F,) of x's dtype, added per output channel after
    the sum; residual, an array of y's shape and x's dtype, added next; then
    activation None, 'linear', 'relu' or 'relu6'. The direct kernel applies
    it in registers, the other paths in one pass over y.
    """
    fname = "conv_forward"
    x = np.asarray(x)
    kernel = np.asarray(kernel)
    dt = check_float(fname, x, kernel, half=True)
    g, osp, pointwise = _geometry(x.shape, kernel.shape, strides, dilation, pads,
                                  channels_last, fname)
    if activation not in _ACTIVATIONS:
        raise ValueError("%s: activation must be one of None, 'linear', 'relu', 'relu6', got %r"
                         % (fname, activation))
    act = _ACTIVATIONS[activation]
    yshape = _y_shape(g, osp, channels_last)
    cdt = np.float32 if dt == np.float16 else dt
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != dt or bias.shape != (g["F"],):
            raise ValueError("%s: bias must be a %s array of shape (%d,), got %s %s"
                             % (fname, dt, g["F"], bias.dtype, bias.shape))
        bias = np.ascontiguousarray(bias, dtype=cdt)
    if residual is not None:
        residual = np.asarray(residual)
        if residual.dtype != dt or residual.shape != yshape:
            raise ValueError("%s: residual must be a %s array of shape %s, got %s %s"
                             % (fname, dt, yshape, residual.dtype, residual.shape))
        residual = np.ascontiguousarray(residual, dtype=cdt)
    if out is not None:
        if (not isinstance(out, np.ndarray) or out.shape != yshape or out.dtype != dt
                or not out.flags.c_contiguous):
            raise ValueError("%s: out must be a C-contiguous %s array of shape %s"
                             % (fname, dt, yshape))
    y = out if (out is not None and cdt == dt) else np.empty(yshape, dtype=cdt)
    if y.size == 0:
        return out if out is not None else y
    done = False
    if g["K"] == 0:
        y[...] = 0
    else:
        done = _run_forward(_writable(np.ascontiguousarray(x, dtype=cdt)),
                            _writable(np.ascontiguousarray(kernel, dtype=cdt)), y, g,
                            channels_last, pointwise, bias, residual, act)
    if not done:
        _epilogue(y, bias, residual, act, channels_last)
    if y is not out and out is not None:
        out[...] = y
        return out
    return y.astype(dt, copy=False)


def _epilogue(y, bias, residual, int act, bint channels_last):
    if bias is not None:
        y += bias if channels_last else bias.reshape((-1,) + (1,) * (y.ndim - 2))
    if residual is not None:
        y += residual
    if act:
        np.maximum(y, 0, out=y)
        if act == 2:
            np.minimum(y, 6, out=y)


cdef class ForwardCall:
    """``conv_forward`` for one geometry, dtype (float32 or float64) and
    epilogue, validated once by ``forward_call``.

    A batch-1 convolution's kernel runs for microseconds, about as long as
    conv_forward's checks and set-up take, so a compiled plan calls this
    instead: it checks only what memory safety needs (each array's type,
    dtype, shape and contiguity) and, on the direct kernel's path, packs
    the kernel into a scratch block and runs the kernel on raw pointers. An
    array that does not fit, or tuning changed since (``_TUNE``), takes
    conv_forward with the same arguments, which converts or raises."""
    cdef tuple x_shape, k_shape, b_shape, y_shape, args
    cdef object g, activation, dtype
    cdef int typenum, act, itemsize, version, y_ndim
    cdef cnp.npy_intp y_dims[5]
    cdef bint has_bias, has_res, last, pointwise, direct
    cdef double work
    cdef _DirectGeom d
    cdef object wino, wino_cache

    def __call__(self, x, kernel, bias=None, residual=None):
        cdef int nt
        if self.version != _TUNE.version or not fits(x, self.typenum, self.x_shape) or \
                not fits(kernel, self.typenum, self.k_shape) or \
                (bias is not None) != self.has_bias or (residual is not None) != self.has_res \
                or (self.has_bias and not fits(bias, self.typenum, self.b_shape)) or \
                (self.has_res and not fits(residual, self.typenum, self.y_shape)):
            return conv_forward(x, kernel, *self.args, bias=bias, residual=residual,
                                activation=self.activation)
        y = cnp.PyArray_EMPTY(self.y_ndim, self.y_dims, self.typenum, 0)
        if self.wino is not None:
            nt = threads_for(self.work)
            if not _run_winograd(self.wino, x, kernel, y, bias, residual, self.act, nt,
                                 self.wino_cache, self.last):
                _epilogue(y, bias, residual, self.act, self.last)
            team_done(nt)
        elif self.direct:
            self._direct(x, kernel, bias, residual, y)
        elif not _run_forward(_writable(x), _writable(kernel), y, self.g, self.last,
                              self.pointwise, bias, residual, self.act):
            _epilogue(y, bias, residual, self.act, self.last)
        return y

    cdef _direct(self, cnp.ndarray x, cnp.ndarray k, object bias, object res, cnp.ndarray y):
        cdef cb_intr intr
        cdef _DirectGeom d = self.d
        cdef int nt = threads_for(self.work)
        cdef char* scratch
        cdef char* wp
        cdef char* bp
        cdef char* xp
        cdef const void* b = cnp.PyArray_DATA(<cnp.ndarray> bias) if self.has_bias else NULL
        cdef const void* r = cnp.PyArray_DATA(<cnp.ndarray> res) if self.has_res else NULL
        cdef double join = join_seconds()
        # one block for the packed kernel, the packed bias and the padded input
        scratch = <char*> malloc((d.wp_size + d.bp_size + (d.xp_size if d.copy else 0))
                                 * self.itemsize)
        if scratch == NULL:
            raise MemoryError("conv_forward: no memory for the packed kernel")
        wp = scratch
        bp = wp + d.wp_size * self.itemsize
        xp = bp + d.bp_size * self.itemsize
        cb_intr_init(&intr)
        if self.itemsize == 4:
            _forward_direct[float](<const float*> cnp.PyArray_DATA(x), <float*> xp, d.copy,
                                   <const float*> cnp.PyArray_DATA(k), <const float*> b,
                                   <float*> wp, <float*> bp if b != NULL else NULL,
                                   <const float*> r, self.act, <float*> cnp.PyArray_DATA(y),
                                   d.g, nt, &intr, join)
        else:
            _forward_direct[double](<const double*> cnp.PyArray_DATA(x), <double*> xp, d.copy,
                                    <const double*> cnp.PyArray_DATA(k), <const double*> b,
                                    <double*> wp, <double*> bp if b != NULL else NULL,
                                    <const double*> r, self.act,
                                    <double*> cnp.PyArray_DATA(y), d.g, nt, &intr, join)
        team_done(nt)
        free(scratch)
        check_interrupt(&intr)


@cython.wraparound(True)
@cython.boundscheck(True)
def forward_call(x_shape, k_shape, strides, dilation, pads, channels_last, dtype,
                 bint has_bias=False, bint has_residual=False, activation=None):
    """A ``ForwardCall``: ``call(x, kernel, bias, residual)`` computes
    ``conv_forward(x, kernel, strides, dilation, pads, channels_last,
    bias=bias, residual=residual, activation=activation)`` for arrays of
    these shapes and ``dtype`` (float32 or float64), with the checks of
    conv_forward (the same errors) made here, once."""
    fname = "conv_forward"
    cdef ForwardCall call = ForwardCall()
    dtype = float_dtype(fname, dtype)
    x_shape = tuple(int(d) for d in x_shape)
    k_shape = tuple(int(d) for d in k_shape)
    g, osp, pointwise = _geometry(x_shape, k_shape, strides, dilation, pads, channels_last,
                                  fname)
    if activation not in _ACTIVATIONS:
        raise ValueError("%s: activation must be one of None, 'linear', 'relu', 'relu6', got %r"
                         % (fname, activation))
    call.x_shape, call.k_shape, call.b_shape = x_shape, k_shape, (g["F"],)
    call.y_shape = _y_shape(g, osp, channels_last)
    call.y_ndim = len(call.y_shape)
    for i in range(call.y_ndim):
        call.y_dims[i] = call.y_shape[i]
    call.args = (strides, dilation, pads, channels_last)
    call.g, call.activation, call.dtype = g, activation, dtype
    call.typenum, call.itemsize = dtype.num, dtype.itemsize
    call.act = _ACTIVATIONS[activation]
    call.has_bias, call.has_res = has_bias, has_residual
    call.last, call.pointwise = bool(channels_last), pointwise
    call.version = _TUNE.version
    # empty outputs and empty patches take conv_forward's own branches
    empty = g["K"] == 0 or 0 in call.y_shape
    call.work = 2.0 * g["N"] * g["P"] * g["K"] * g["F"] / _TUNE["flops_per_byte"]
    if not empty and _use_winograd(g, channels_last, dtype):
        call.wino = _winograd(g)
        call.wino_cache = winograd.KernelCache()
        return call
    call.direct = not empty and \
        not _use_pointwise_gemm(g, channels_last, pointwise) and \
        _use_direct(g, channels_last, dtype == np.float64)
    if call.direct:
        call.d = _direct_geom(g, cb_cd_block_for(dtype == np.float64, g["F"]))
    elif empty:
        call.version = -1
    return call


@cython.wraparound(True)
@cython.boundscheck(True)
def _run_forward(x, kernel, y, g, bint last, bint pointwise, bias=None, residual=None,
                 int act=0):
    """y = conv(x, kernel) by the first strategy whose rule takes the
    geometry, in this order: Winograd (conv_winograd.pxi), the 1x1 GEMM tiles
    (conv_pointwise.pxi), the direct kernel (conv_direct.pxi), the stride-1
    taps (conv_taps.pxi), then im2col, whole (few output positions) or in
    row blocks (conv_im2col.pxi). True when the epilogue (bias, residual,
    activation) went in too."""
    nt, limit = _threads(g)
    if _use_winograd(g, last, x.dtype):
        return _run_winograd(_winograd(g), x, kernel, y, bias, residual, act, nt, None, last)
    if _use_pointwise_gemm(g, last, pointwise):
        with limit:
            _run_pointwise(x, kernel, y, g, bias, residual, act, nt)
        return True
    if _use_direct(g, last, x.dtype == np.float64):
        _run_direct(x, kernel, y, g, bias, residual, act, nt)
        return True
    B = _tap_rows(g, pointwise, last)
    if B > 0:
        with limit:
            _run_forward_taps(x, kernel, y, g, last, B, nt)
        return False
    B = _block_rows(g, x.itemsize)
    if _use_short_im2col(g, last, pointwise, B, x.itemsize):
        with limit:
            _run_short_im2col(x, kernel, y, g, bias, residual, act, nt)
        return True
    with limit:
        _run_forward_im2col(x, kernel, y, g, last, pointwise, B, nt)
    return False


@cython.wraparound(True)
@cython.boundscheck(True)
def conv_backward_input(dy, kernel, x_shape, strides, dilation, pads, channels_last=True):
    """Gradient of conv_forward with respect to x, shape ``x_shape``.

    Also the transposed convolution: with a Keras conv_transpose kernel
    (*k, out_channels, in_channels) and x_shape = the wanted output shape, this
    is ``conv2d_transpose``/``conv3d_transpose`` (dy is then that op's input).
    dy must have exactly the shape conv_forward would give for x_shape.
    """
    fname = "conv_backward_input"
    dy = np.asarray(dy)
    kernel = np.asarray(kernel)
    dt = check_float(fname, dy, kernel, half=True)
    try:
        x_shape = tuple(int(s) for s in x_shape)
    except TypeError:
        raise TypeError("%s: x_shape must be a sequence of ints, got %r" % (fname, x_shape))
    g, osp, pointwise = _geometry(x_shape, kernel.shape, strides, dilation, pads,
                                  channels_last, fname)
    _check_dy(fname, dy, _y_shape(g, osp, channels_last), x_shape, kernel.shape, strides,
              dilation, pads)
    cdt = np.float32 if dt == np.float16 else dt
    if dy.size == 0 or g["K"] == 0 or int(np.prod(x_shape)) == 0:
        return np.zeros(x_shape, dtype=dt)
    rank = len(x_shape) - 2
    spans = [(k - 1) * d for k, d in zip(kernel.shape[:rank], dilation)]
    if (all(int(s) == 1 for s in strides)
            and all(a <= e and b <= e for (a, b), e in zip(pads, spans))):
        # With stride 1 the input gradient is itself a convolution: of dy with
        # the spatially flipped kernel, channels swapped, padded by what the
        # forward pass cut off. That runs at forward speed and needs no
        # scatter-add.
        flipped = np.flip(kernel, axis=tuple(range(rank))).swapaxes(-1, -2)
        fpads = [(e - int(a), e - int(b)) for (a, b), e in zip(pads, spans)]
        dx = conv_forward(dy.astype(cdt, copy=False), np.ascontiguousarray(flipped, dtype=cdt),
                          (1,) * rank, dilation,
                          fpads, channels_last=channels_last)
        return dx.astype(dt, copy=False)
    dy = np.ascontiguousarray(dy, dtype=cdt)
    kernel = np.ascontiguousarray(kernel, dtype=cdt)
    cdef bint last = channels_last
    nt, limit = _threads(g)
    plan = _use_phases(g, last, cdt == np.float64)
    if plan is not None:
        if last:
            return _backward_input_phases(plan, dy, kernel, x_shape, nt).astype(dt, copy=False)
        # channels_first through channels_last copies (see _use_phases)
        dx = _backward_input_phases(plan, np.ascontiguousarray(np.moveaxis(dy, 1, -1)), kernel,
                                    (x_shape[0],) + x_shape[2:] + (x_shape[1],), nt)
        return np.ascontiguousarray(np.moveaxis(dx, -1, 1), dtype=dt)
    with limit:
        dx = _run_backward_input_col2im(dy, kernel, x_shape, g, last, nt)
    return dx.astype(dt, copy=False)


@cython.wraparound(True)
@cython.boundscheck(True)
def conv_backward_kernel(x, dy, kernel_shape, strides, dilation, pads, channels_last=True):
    """Gradient of conv_forward with respect to the kernel, shape ``kernel_shape``.

    For a transposed convolution's kernel gradient, pass its output gradient as
    x and its input as dy.
    """
    fname = "conv_backward_kernel"
    x = np.asarray(x)
    dy = np.asarray(dy)
    dt = check_float(fname, x, dy, half=True)
    try:
        kernel_shape = tuple(int(s) for s in kernel_shape)
    except TypeError:
        raise TypeError("%s: kernel_shape must be a sequence of ints, got %r"
                        % (fname, kernel_shape))
    g, osp, pointwise = _geometry(x.shape, kernel_shape, strides, dilation, pads,
                                  channels_last, fname)
    _check_dy(fname, dy, _y_shape(g, osp, channels_last), x.shape, kernel_shape, strides,
              dilation, pads)
    cdt = np.float32 if dt == np.float16 else dt
    if dy.size == 0 or g["K"] == 0 or int(np.prod(kernel_shape)) == 0:
        return np.zeros(kernel_shape, dtype=dt)
    x = _writable(np.ascontiguousarray(x, dtype=cdt))
    dy = _writable(np.ascontiguousarray(dy, dtype=cdt))
    dk = np.empty(kernel_shape, dtype=cdt)
    cdef bint last = channels_last
    nt, limit = _threads(g)
    if _use_direct_wgrad(g, last, cdt == np.float64):
        with limit:
            _run_backward_kernel_direct(x, dy, dk, g, nt)
        return dk.astype(dt, copy=False)
    B = _tap_rows(g, pointwise, last)
    with limit:
        if B > 0:
            _run_backward_kernel_taps(x, dy, dk, g, last, B, nt)
        else:
            _run_backward_kernel_im2col(x, dy, dk, g, last, pointwise, nt)
    return dk.astype(dt, copy=False)
