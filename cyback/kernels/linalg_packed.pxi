# Products with a weight packed once (included by linalg.pyx): the Dense and
# 1x1 products of inference plans, whose weights are frozen
# (include/cyback_packed_gemm.h says how the panels and tiles work).


from cyback.kernels._packed cimport (CB_PG_MAX_ROWS, CB_PG_NR, cb_pg_args, cb_pg_available,
                                     cb_pg_item, cb_pg_items, cb_pg_pack, cb_pg_plan,
                                     cb_pg_plan_for, cb_pg_use_balanced_blocks)


# Panel width: the columns of w in one panel of the packed layout.
PANEL = CB_PG_NR
# The most rows a plan sends to packed_product (PackedProduct.MAX_ROWS).
PACKED_MAX_ROWS = CB_PG_MAX_ROWS


def packed_available():
    """Whether packed_product runs here (a CPU with AVX2 + FMA, or AVX-512;
    tests lower the set with _use_avx2 / _use_avx512). Where it does not, the
    caller multiplies by its BLAS path."""
    return bool(cb_pg_available())


def _use_balanced_blocks(bint on=True):
    """Let packed products split their rows into blocks of nearly equal
    sizes where those share a tile's panel count (True, the default), or
    into full blocks and a remainder (False): the same sums either way; for
    tests and benchmarks. Returns ``on``."""
    return bool(cb_pg_use_balanced_blocks(on))


def pack_panels(w):
    """The packed layout of a float32 weight w (k, n): an array (P, k, 16),
    P = ceil(n / 16), holding w's columns 16 at a time with zeros past
    column n, its rows starting on 64-byte boundaries (a panel row is one
    AVX-512 load that never straddles two cache lines)."""
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype != np.float32:
        raise ValueError("pack_panels: expected a 2-D float32 weight, got %s %s"
                         % (w.dtype, w.shape))
    cdef Py_ssize_t k = w.shape[0], n = w.shape[1]
    cdef Py_ssize_t P = (n + PANEL - 1) // PANEL
    raw = np.empty(P * k * PANEL + PANEL, dtype=np.float32)
    start = (-raw.ctypes.data % 64) // 4
    packed = raw[start:start + P * k * PANEL].reshape(P, k, PANEL)
    cdef cnp.ndarray wc = np.ascontiguousarray(w)
    cdef const float* wp = <const float*> cnp.PyArray_DATA(wc)
    cdef float* pp = <float*> cnp.PyArray_DATA(<cnp.ndarray> packed)
    if k and n:
        with nogil:
            cb_pg_pack(wp, k, n, pp)
    return packed


cdef inline bint _rows_fit(object a, Py_ssize_t cols):
    # 2-D float32 rows of `cols` values, unit column stride, aligned
    cdef cnp.ndarray arr
    if not isinstance(a, cnp.ndarray):
        return False
    arr = <cnp.ndarray> a
    return cnp.PyArray_TYPE(arr) == cnp.NPY_FLOAT and cnp.PyArray_NDIM(arr) == 2 and \
        cnp.PyArray_DIM(arr, 1) == cols and cnp.PyArray_ISALIGNED(arr) and \
        cnp.PyArray_ISNOTSWAPPED(arr) and \
        (cols <= 1 or cnp.PyArray_STRIDE(arr, 1) == 4) and \
        (cnp.PyArray_DIM(arr, 0) <= 1 or cnp.PyArray_STRIDE(arr, 0) % 4 == 0)


def packed_product(x, packed, Py_ssize_t n, bias=None, residual=None, int act=0):
    """act(x @ w + bias + residual) for x (m, k) and w (k, n) given as
    ``pack_panels(w)``; bias (n,) and residual (m, n) optional; act 0 (none),
    1 (relu) or 2 (relu6). x and residual may have any row stride (a view of
    rows); all float32. The sums run over k in order for each output on one
    thread, so results do not depend on the thread count. Returns None when
    the kernel does not run here (packed_available) or the arrays are not of
    that kind: the caller then takes its BLAS path."""
    if not cb_pg_available() or act < 0 or act > 2 or \
            not isinstance(packed, cnp.ndarray) or packed.dtype != np.float32 or \
            packed.ndim != 3 or packed.shape[2] != PANEL or not packed.flags.c_contiguous:
        return None
    cdef Py_ssize_t P = packed.shape[0], k = packed.shape[1]
    if n < 1 or (n + PANEL - 1) // PANEL != P or not isinstance(x, np.ndarray) or \
            x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != k:
        return None
    cdef Py_ssize_t m = x.shape[0]
    if m and not _rows_fit(x, k):
        return None
    if bias is not None and not (_rows_fit(bias.reshape(1, -1), n) and bias.ndim == 1):
        return None
    if residual is not None and not (_rows_fit(residual, n) and residual.shape[0] == m):
        return None
    cdef cnp.npy_intp dims[2]
    dims[0], dims[1] = m, n
    cdef cnp.ndarray y = cnp.PyArray_EMPTY(2, dims, cnp.NPY_FLOAT, 0)
    if m == 0:
        return y
    if k == 0:
        y[...] = 0
        if bias is not None:
            y += bias
        if residual is not None:
            y += residual
        if act:
            np.maximum(y, 0, out=y)
            if act == 2:
                np.minimum(y, 6, out=y)
        return y
    _packed_run(<const float*> cnp.PyArray_DATA(<cnp.ndarray> x),
                x.strides[0] // 4 if m > 1 else k, m, k, n, P,
                <const float*> cnp.PyArray_DATA(<cnp.ndarray> packed),
                NULL if bias is None else <const float*> cnp.PyArray_DATA(<cnp.ndarray> bias),
                NULL if residual is None else
                <const float*> cnp.PyArray_DATA(<cnp.ndarray> residual),
                0 if residual is None else (residual.strides[0] // 4 if m > 1 else n),
                act, <float*> cnp.PyArray_DATA(y))
    return y


cdef void _packed_run(const float* x, Py_ssize_t ldx, Py_ssize_t m, Py_ssize_t k,
                      Py_ssize_t n, Py_ssize_t P, const float* packed, const float* b,
                      const float* res, Py_ssize_t ldr, int act, float* y):
    # y (m, n), rows n apart, = act(x @ w + b + res) for m, k > 0
    cdef cb_pg_args g
    g.x, g.ldx, g.k, g.n, g.P = x, ldx, k, n, P
    g.packed, g.b, g.res, g.ldr = packed, b, res, ldr
    g.y, g.ldy, g.act = y, n, act
    cdef cb_pg_plan q = cb_pg_plan_for(m, P)
    cdef Py_ssize_t items = cb_pg_items(&q), i
    cdef int nt = threads_for(_matmul_work(m, n, k))
    if nt > items:
        nt = <int> items
    with nogil:
        if nt > 1:
            for i in prange(items, num_threads=nt, schedule="static"):
                cb_pg_item(&g, &q, i)
        else:
            for i in range(items):
                cb_pg_item(&g, &q, i)
    team_done(nt)


@cython.final
cdef class PackedProductCall:
    """``call(x, packed, bias=None, residual=None)``: packed_product for
    one shape of x (its leading axes the rows, its last ``nk`` the inner
    axis) and one epilogue, C-contiguous arrays throughout (a bias of n
    values, a residual shaped like the output); None when the arrays do
    not fit, the caller then takes its own path. A plan's bound step
    (graph/binding.py) calls it without the op's reshapes and checks."""
    cdef tuple x_shape, p_shape
    cdef cnp.npy_intp y_dims[32]
    cdef int y_ndim, act
    cdef Py_ssize_t m, k, n
    cdef bint has_bias, has_res

    def __call__(self, x, packed, bias=None, residual=None):
        if not cb_pg_available() or not fits(x, cnp.NPY_FLOAT, self.x_shape) or \
                not fits(packed, cnp.NPY_FLOAT, self.p_shape) or \
                (bias is None) == self.has_bias or (residual is None) == self.has_res:
            return None
        if bias is not None and not (fits_layout(bias, cnp.NPY_FLOAT) and
                                     cnp.PyArray_SIZE(<cnp.ndarray> bias) == self.n):
            return None
        cdef cnp.ndarray y = cnp.PyArray_EMPTY(self.y_ndim, self.y_dims, cnp.NPY_FLOAT, 0)
        if residual is not None and not (fits_layout(residual, cnp.NPY_FLOAT) and
                                         _same_shape(<cnp.ndarray> residual, y)):
            return None
        _packed_run(<const float*> cnp.PyArray_DATA(<cnp.ndarray> x), self.k, self.m, self.k,
                    self.n, self.p_shape[0],
                    <const float*> cnp.PyArray_DATA(<cnp.ndarray> packed),
                    NULL if bias is None else <const float*> cnp.PyArray_DATA(<cnp.ndarray> bias),
                    NULL if residual is None else
                    <const float*> cnp.PyArray_DATA(<cnp.ndarray> residual),
                    self.n, self.act, <float*> cnp.PyArray_DATA(y))
        return y


def packed_product_call(x_shape, Py_ssize_t k, Py_ssize_t n, y_shape, bint has_bias,
                        bint has_res, int act):
    """A PackedProductCall for x of ``x_shape`` (rows of ``k``) giving an
    output of ``y_shape`` (rows of ``n``), with or without a bias and a
    residual, and activation ``act`` (0, 1 relu, 2 relu6)."""
    cdef PackedProductCall call = PackedProductCall()
    cdef int i
    x_shape = tuple(int(d) for d in x_shape)
    y_shape = tuple(int(d) for d in y_shape)
    if not 1 <= len(y_shape) <= 32 or act < 0 or act > 2 or k < 1 or n < 1:
        raise ValueError("packed_product_call: output %s, k %d, n %d, act %d not supported"
                         % (y_shape, k, n, act))
    call.x_shape = x_shape
    call.y_ndim = len(y_shape)
    for i in range(call.y_ndim):
        call.y_dims[i] = y_shape[i]
    call.k, call.n = k, n
    call.m = _prod(y_shape) // n
    if call.m < 1 or call.m * n != _prod(y_shape) or call.m * k != _prod(x_shape):
        raise ValueError("packed_product_call: x %s and output %s are not rows of %d and %d"
                         % (x_shape, y_shape, k, n))
    call.p_shape = ((call.n + PANEL - 1) // PANEL, k, PANEL)
    call.has_bias, call.has_res, call.act = has_bias, has_res, act
    return call


cdef Py_ssize_t _prod(tuple shape) except -1:
    cdef Py_ssize_t p = 1, d
    for d in shape:
        p *= d
    return p


cdef bint _same_shape(cnp.ndarray a, cnp.ndarray b):
    cdef int i
    if cnp.PyArray_NDIM(a) != cnp.PyArray_NDIM(b):
        return False
    for i in range(cnp.PyArray_NDIM(a)):
        if cnp.PyArray_DIM(a, i) != cnp.PyArray_DIM(b, i):
            return False
    return True
