"""int8 inference kernels: the u8 x s8 -> s32 matrix product with a fused
requantizing epilogue, activation quantization, and the uint8 patch matrix
of a channels_last convolution.

    packed = pack_weights(w_int8)                     # once per weight matrix
    q = quantize(x, scale_x, zero_x)                  # float32 -> uint8
    y = gemm(q, packed, scale_x, zero_x, scale_w, bias, activation="relu")

``gemm`` computes, per output (m, n), with acc the exact int32 sum of
q[m, k] * w[k, n] (include/cyback_qgemm.h has the layout and the sets):

    y = act(float32(acc - zero_x * colsum(w)[n]) * s[n] + bias[n]),
    s = float32(scale_x) * scale_w                    (in float32)

as float32, or with ``out_scale``/``out_zero_point`` the uint8 codes
``clip(rint(y / out_scale), -zo, 255 - zo) + zo`` (NaN -> 0). Every
instruction set (AVX-512 VNNI, AVX-VNNI, AVX2, scalar) gives the same bits,
at any thread count and whatever the thread team's state: the sums are exact
and the epilogue runs the same float32 operations in the same order.
"""
import math
import weakref

import numpy as np
cimport cython
cimport numpy as cnp

from cyback.kernels import settings as _settings
from cython.parallel cimport prange
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from libc.string cimport memset

from cyback.kernels._arrays cimport fits
from cyback.kernels.runtime cimport team_done, team_parts, threads_for

cnp.import_array()

cdef extern from "cyback_qgemm.h" nogil:
    ctypedef struct cb_q_header:
        int32_t magic
        int32_t version
        int64_t k
        int64_t n
        int32_t narrow
    ctypedef struct cb_q_epilogue:
        const float* scale
        const float* bias
        const float* res
        Py_ssize_t ldr
        const uint8_t* res_q
        Py_ssize_t ldrq
        float res_scale
        int32_t res_zero
        int32_t za
        int act
        float* out_f
        Py_ssize_t ldf
        uint8_t* out_q
        Py_ssize_t ldq
        float q_scale
        float q_lo
        float q_hi
        int32_t q_zero
        int32_t* ext_hi
        int32_t* ext_lo
    int CB_Q_NR
    int CB_Q_HEADER
    int CB_Q_MAGIC
    int CB_Q_VERSION
    int CB_Q_MAX_K
    Py_ssize_t cb_q_packed_bytes(Py_ssize_t k, Py_ssize_t n)
    Py_ssize_t cb_q_panels(Py_ssize_t n)
    void cb_q_pack(const int8_t* b, Py_ssize_t rs, Py_ssize_t cs, Py_ssize_t k, Py_ssize_t n,
                   uint8_t* out)
    cb_q_header cb_q_read_header(const uint8_t* packed)
    void cb_q_gemm_part(int level, const uint8_t* a, Py_ssize_t lda, Py_ssize_t m0,
                        Py_ssize_t m1, Py_ssize_t k, const uint8_t* packed, Py_ssize_t p0,
                        Py_ssize_t p1, Py_ssize_t n, const cb_q_epilogue* e)
    void cb_q_quantize(int level, const float* x, Py_ssize_t count, float scale, int32_t zero,
                       uint8_t* out)
    ctypedef struct cb_q_patches:
        const uint8_t* x
        Py_ssize_t h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow
        uint8_t pad
    Py_ssize_t cb_q_conv_block_rows(Py_ssize_t k)
    void cb_q_conv_part(int level, const cb_q_patches* g, Py_ssize_t m0, Py_ssize_t m1,
                        Py_ssize_t k, const uint8_t* packed, Py_ssize_t n,
                        const cb_q_epilogue* e, uint8_t* buf)
    void cb_q_im2col(const uint8_t* x, Py_ssize_t h, Py_ssize_t w, Py_ssize_t c, Py_ssize_t kh,
                     Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dh, Py_ssize_t dw,
                     Py_ssize_t pt, Py_ssize_t pl, Py_ssize_t oh, Py_ssize_t ow, uint8_t pad,
                     uint8_t* out, Py_ssize_t r0, Py_ssize_t r1)
    void cb_q_extremes_part(int level, const uint8_t* a, Py_ssize_t lda, Py_ssize_t seg,
                            Py_ssize_t s0, Py_ssize_t s1, Py_ssize_t r0, Py_ssize_t r1,
                            Py_ssize_t k, const uint8_t* packed, Py_ssize_t n,
                            const cb_q_epilogue* e, int32_t* ext)
    void cb_q_extremes_finish(const int32_t* ext, Py_ssize_t parts, Py_ssize_t part_stride,
                              int take_max, const uint8_t* packed, Py_ssize_t k, Py_ssize_t n,
                              Py_ssize_t row, const cb_q_epilogue* e)
    int cb_q_cpu()
    int cb_q_sets()
    int cb_q_level()
    int cb_q_set_cap(int cap)
    void cb_q_set_default_cap(int avx512)

# CYBACK_AVX512=0 caps the products at AVX-VNNI (the settings registry reads it).
cb_q_set_default_cap(1 if _settings.get("CYBACK_AVX512") else 0)

#: The instruction sets, lowest first; their index is the header's level.
INSTRUCTION_SETS = ("scalar", "avx2", "avx_vnni", "avx512_vnni")
#: The longest product (K) whose int32 sums cannot overflow.
MAX_K = CB_Q_MAX_K
#: Columns per packed panel.
PANEL_COLUMNS = CB_Q_NR
ACTIVATIONS = {None: 0, "linear": 0, "relu": 1, "relu6": 2}
FLOAT32_MAX = float(np.finfo(np.float32).max)


# ---------------------------------------------------------------- instruction sets

def cpu_instruction_set():
    """The widest set this CPU (and this build's compiler) can run."""
    return INSTRUCTION_SETS[cb_q_cpu()]


def instruction_set():
    """The set the kernels run now (the CPU's widest, unless capped by
    CYBACK_AVX512=0, which stops at avx_vnni, or by a test)."""
    return INSTRUCTION_SETS[cb_q_level()]


def instruction_sets():
    """Every set this CPU can run, lowest first (tests run each). They do not
    nest: CPUs with AVX-512 VNNI may lack AVX-VNNI."""
    cdef int sets = cb_q_sets()
    return tuple(name for i, name in enumerate(INSTRUCTION_SETS) if sets & (1 << i))


def _use_instruction_set(name):
    """Tests: run at most the set ``name`` (None: back to the default).
    Returns the set that now runs; a set the CPU lacks is a ValueError."""
    if name is None:
        return INSTRUCTION_SETS[cb_q_set_cap(-1)]
    if name not in INSTRUCTION_SETS:
        raise ValueError("qgemm: unknown instruction set %r; expected one of %s"
                         % (name, INSTRUCTION_SETS))
    level = INSTRUCTION_SETS.index(name)
    if not cb_q_sets() & (1 << level):
        raise ValueError("qgemm: this CPU cannot run %r (it runs %s)"
                         % (name, ", ".join(instruction_sets())))
    return INSTRUCTION_SETS[cb_q_set_cap(level)]


# ---------------------------------------------------------------- packing

def packed_size(k, n):
    """Bytes of the packed form of a (k, n) weight matrix."""
    k, n = _dim("packed_size", "k", k), _dim("packed_size", "n", n)
    return int(cb_q_packed_bytes(k, n))


def _aligned_bytes(size):
    """A uint8 array of ``size`` bytes starting on a 64-byte boundary (one
    packed group per cache line)."""
    buf = np.empty(size + 64, dtype=np.uint8)
    off = (-buf.ctypes.data) % 64
    return buf[off:off + size]


def pack_weights(w):
    """The packed form of an int8 (K, N) weight matrix (any strides), for
    ``gemm``: a 1-D uint8 array the caller keeps (see cyback_qgemm.h)."""
    if not isinstance(w, np.ndarray):
        raise TypeError("pack_weights: expected an int8 NumPy array, got %s" % type(w).__name__)
    if w.dtype != np.int8:
        raise TypeError("pack_weights: expected an int8 array, got %s" % w.dtype)
    if w.ndim != 2:
        raise ValueError("pack_weights: expected a 2-D (K, N) array, got shape %s" % (w.shape,))
    cdef Py_ssize_t k = w.shape[0], n = w.shape[1]
    if k > CB_Q_MAX_K:
        raise ValueError("pack_weights: K = %d is above %d, where int32 sums may overflow"
                         % (k, CB_Q_MAX_K))
    if any(s % w.itemsize for s in w.strides):
        w = np.ascontiguousarray(w)
    cdef Py_ssize_t rs = w.strides[0], cs = w.strides[1]
    out = _aligned_bytes(cb_q_packed_bytes(k, n))
    cdef const int8_t* src = <const int8_t*>cnp.PyArray_DATA(w)
    cdef uint8_t* dst = <uint8_t*>cnp.PyArray_DATA(out)
    with nogil:
        cb_q_pack(src, rs, cs, k, n, dst)
    return out


def packed_shape(packed):
    """(K, N) of a packed weight array; ValueError if it is not one."""
    _check_packed("packed_shape", packed)
    cdef cb_q_header h = cb_q_read_header(<const uint8_t*>cnp.PyArray_DATA(packed))
    return int(h.k), int(h.n)


def _check_packed(fname, packed):
    if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8 or packed.ndim != 1 \
            or not packed.flags.c_contiguous:
        raise TypeError("%s: expected the 1-D uint8 array pack_weights returns, got %s"
                        % (fname, _describe(packed)))
    if packed.shape[0] < CB_Q_HEADER:
        raise ValueError("%s: %d bytes are too short for packed weights"
                         % (fname, packed.shape[0]))
    cdef cb_q_header h = cb_q_read_header(<const uint8_t*>cnp.PyArray_DATA(packed))
    if h.magic != CB_Q_MAGIC or h.version != CB_Q_VERSION or h.k < 0 or h.n < 0 \
            or h.k > CB_Q_MAX_K or h.n > packed.shape[0] \
            or cb_q_packed_bytes(h.k, h.n) != packed.shape[0]:
        raise ValueError("%s: the array is not weights packed by pack_weights (bad header or "
                         "size)" % fname)


# ---------------------------------------------------------------- quantize

def quantize(x, scale, zero_point):
    """uint8 codes of a float32 array: clip(rint(x / scale), -zero_point,
    255 - zero_point) + zero_point, NaN -> 0; same shape as x."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise TypeError("quantize: expected a float32 NumPy array, got %s" % _describe(x))
    cdef float s = _scale("quantize", "scale", scale)
    cdef int32_t z = _zero("quantize", "zero_point", zero_point)
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, dtype=np.uint8)
    cdef Py_ssize_t count = x.size
    if count == 0:
        return out
    cdef const float* src = <const float*>cnp.PyArray_DATA(x)
    cdef uint8_t* dst = <uint8_t*>cnp.PyArray_DATA(out)
    cdef int level = cb_q_level()
    cdef double work = 5.0 * count
    cdef int parts = team_parts(work), nt = threads_for(work), t
    if parts <= 1:
        with nogil:
            cb_q_quantize(level, src, count, s, z, dst)
    else:
        with nogil:
            for t in prange(parts, schedule='static', num_threads=nt):
                _quantize_part(level, src, count, s, z, dst, t, parts)
    team_done(nt)
    return out


cdef void _quantize_part(int level, const float* x, Py_ssize_t count, float s, int32_t z,
                         uint8_t* out, int t, int parts) noexcept nogil:
    # parts start on multiples of 64 values (whole vectors, whole lines)
    cdef Py_ssize_t blocks = (count + 63) // 64
    cdef Py_ssize_t lo = (blocks * t) // parts * 64, hi = (blocks * (t + 1)) // parts * 64
    if hi > count:
        hi = count
    if hi > lo:
        cb_q_quantize(level, x + lo, hi - lo, s, z, out + lo)


# ---------------------------------------------------------------- product

cdef inline double _gemm_work(double m, double n, double k) noexcept nogil:
    # An int8 multiply-add costs about an eighth of a float32 one's byte
    # equivalent (4 per lane); a product of a few rows streams B once.
    return 0.125 * m * n * k if m > 4 else 0.25 * n * k


def epilogue_vectors(scale_a, scale_b, bias=None):
    """What ``gemm``'s epilogue reads per output column, padded to whole
    panels: a float32 array (1 or 2, 16 * panels) holding
    s = float32(scale_a) * scale_b and then the bias, if any. Fixed scales
    (a layer's) compute it once; ``gemm_prepared`` takes it."""
    cdef float sa = _scale("gemm", "scale_a", scale_a)
    sb = np.asarray(scale_b, dtype=np.float32)
    if sb.ndim != 1:
        raise ValueError("gemm: scale_b must be a vector of N scales, got shape %s"
                         % (sb.shape,))
    # any sign: a BatchNorm folded into an int8 layer scales its columns by
    # its own, possibly negative, factors
    if not np.all(np.isfinite(sb)):
        raise ValueError("gemm: scale_b must be finite")
    n = sb.shape[0]
    out = np.zeros((1 if bias is None else 2, cb_q_panels(n) * CB_Q_NR), dtype=np.float32)
    out[0, :n] = np.float32(sa) * sb
    if bias is not None:
        bv = np.asarray(bias)
        if bv.shape != (n,) or bv.dtype.kind != 'f':
            raise ValueError("gemm: bias must be N = %d floats like scale_b, got %s %s"
                             % (n, bv.dtype, bv.shape))
        out[1, :n] = bv
    return out


def gemm(a, packed, scale_a, zero_a, scale_b, bias=None, activation=None, out_scale=None,
         out_zero_point=None):
    """The requantized product of uint8 activations a (M, K) and packed int8
    weights (K, N): float32 (M, N), or uint8 codes with ``out_scale`` and
    ``out_zero_point`` (see the module's docstring). ``scale_b``: N positive
    weight scales; ``bias``: N float32 values or None; ``activation``: None,
    'linear', 'relu' or 'relu6'."""
    _check_packed("gemm", packed)
    n = cb_q_read_header(<const uint8_t*>cnp.PyArray_DATA(packed)).n
    if np.shape(scale_b) != (n,):
        raise ValueError("gemm: scale_b must hold N = %d scales, got shape %s"
                         % (n, np.shape(scale_b)))
    vectors = epilogue_vectors(scale_a, scale_b, bias)
    return gemm_prepared(a, packed, vectors, zero_a, activation, out_scale, out_zero_point)


def gemm_prepared(a, packed, vectors, zero_a, activation=None, out_scale=None,
                  out_zero_point=None, residual=None, keep_float=False):
    """``gemm`` with the per-column vectors ``epilogue_vectors`` made; with
    ``residual`` (float32 (M, N), rows of unit stride) added after the bias,
    before the activation. ``keep_float`` with ``out_scale``: both outputs,
    (float32, uint8 codes), from one pass."""
    if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or a.ndim != 2:
        raise TypeError("gemm: expected a 2-D uint8 array of activations, got %s"
                        % _describe(a))
    _check_packed("gemm", packed)
    cdef cb_q_header h = cb_q_read_header(<const uint8_t*>cnp.PyArray_DATA(packed))
    cdef Py_ssize_t m = a.shape[0], k = a.shape[1], n = h.n
    if h.k != k:
        raise ValueError("gemm: the activations have K = %d columns, the packed weights %d rows"
                         % (k, h.k))
    cdef cb_q_epilogue e
    out = _epilogue("gemm", &e, vectors, n, zero_a, activation, out_scale, out_zero_point,
                    (m, n), keep_float)
    residual = _residual("gemm", &e, residual, m, n)
    if m == 0 or n == 0:
        return out
    _run_product(&e, a, m, k, <const uint8_t*>cnp.PyArray_DATA(packed), n)
    return out


cdef int _run_product(cb_q_epilogue* e, a, Py_ssize_t m, Py_ssize_t k, const uint8_t* bp,
                      Py_ssize_t n) except -1:
    """The product of uint8 a (m, k), of unit column stride, with the packed
    weights at bp into e's outputs, split over the team."""
    cdef Py_ssize_t npan = cb_q_panels(n)
    # rows may overlap (a 1-D convolution's windows, k bytes every C)
    if a.strides[1] != 1 or a.strides[0] < 1:
        a = np.ascontiguousarray(a)
    cdef const uint8_t* ap = <const uint8_t*>cnp.PyArray_DATA(a)
    cdef Py_ssize_t lda = a.strides[0] if m > 1 else k
    cdef int level = cb_q_level()
    cdef double work = _gemm_work(m, n, k)
    cdef int parts = team_parts(work), nt = threads_for(work), t
    # Whole row tiles to each part where there are enough rows, else panels
    # (a batch-1 Dense layer); the sums are exact, so the cut changes no bit.
    cdef bint by_rows = (m >= 16 * parts and not _split_panels(m, k, n)) or npan < parts
    with nogil:
        if parts <= 1:
            cb_q_gemm_part(level, ap, lda, 0, m, k, bp, 0, npan, n, e)
        elif nt <= 1:
            for t in range(parts):
                _gemm_part(level, ap, lda, m, k, bp, npan, n, e, t, parts, by_rows)
        else:
            for t in prange(parts, schedule='static', num_threads=nt):
                _gemm_part(level, ap, lda, m, k, bp, npan, n, e, t, parts, by_rows)
    team_done(nt)
    return 0


@cython.final
cdef class ProductCall:
    """``gemm_prepared`` for one packed kernel, its epilogue vectors and
    epilogue settings, checked once: ``call(a, residual)`` returns what
    ``gemm_prepared(a, packed, vectors, zero_a, activation, out_scale,
    out_zero_point, residual, keep_float)`` returns, the same bits, with
    only a's and the residual's checks per call (a batch-1 int8 step spent
    about as long in those checks as in its product).

    It holds no reference to packed or vectors, only where their data are:
    ``matches(packed, vectors)`` says whether it was made for these very
    arrays (alive: the caller holds them), which the caller checks before
    each use (quantized ops keep their calls keyed by the arrays)."""
    cdef cb_q_epilogue e
    cdef Py_ssize_t k, n
    cdef const uint8_t* bp
    cdef bint quantized, keep_float
    cdef object packed_ref, vectors_ref

    def __init__(self, packed, vectors, zero_a, activation=None, out_scale=None,
                 out_zero_point=None, keep_float=False):
        _check_packed("gemm", packed)
        cdef cb_q_header h = cb_q_read_header(<const uint8_t*>cnp.PyArray_DATA(packed))
        self.k, self.n = h.k, h.n
        _epilogue("gemm", &self.e, vectors, self.n, zero_a, activation, out_scale,
                  out_zero_point, (0, self.n), keep_float)
        self.quantized = self.e.out_q != NULL
        self.keep_float = bool(keep_float)
        self.e.out_f = NULL
        self.e.out_q = NULL
        self.bp = <const uint8_t*>cnp.PyArray_DATA(packed)
        self.packed_ref = weakref.ref(packed)
        self.vectors_ref = weakref.ref(vectors)

    def matches(self, packed, vectors):
        """Whether this call was made for these arrays (the same objects)."""
        return self.packed_ref() is packed and self.vectors_ref() is vectors

    def __call__(self, a, residual=None):
        if not cnp.PyArray_Check(a) or cnp.PyArray_TYPE(<cnp.ndarray>a) != cnp.NPY_UINT8 or \
                cnp.PyArray_NDIM(<cnp.ndarray>a) != 2:
            raise TypeError("gemm: expected a 2-D uint8 array of activations, got %s"
                            % _describe(a))
        cdef Py_ssize_t m = a.shape[0]
        if a.shape[1] != self.k:
            raise ValueError("gemm: the activations have K = %d columns, the packed weights "
                             "%d rows" % (a.shape[1], self.k))
        cdef cb_q_epilogue e = self.e
        cdef cnp.npy_intp dims[2]
        dims[0], dims[1] = m, self.n
        if self.quantized:
            out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_UINT8, 0)
            e.out_q = <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>out)
            if self.keep_float:
                y = cnp.PyArray_EMPTY(2, dims, cnp.NPY_FLOAT32, 0)
                e.out_f = <float*>cnp.PyArray_DATA(<cnp.ndarray>y)
                out = (y, out)
        else:
            out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_FLOAT32, 0)
            e.out_f = <float*>cnp.PyArray_DATA(<cnp.ndarray>out)
        held = _residual("gemm", &e, residual, m, self.n)
        if m == 0 or self.n == 0:
            return out
        _run_product(&e, a, m, self.k, self.bp, self.n)
        return out


cdef object _epilogue(str fname, cb_q_epilogue* e, vectors, Py_ssize_t n, zero_a, activation,
                      out_scale, out_zero_point, shape, bint keep_float=False):
    """Fill ``e`` for N = n output columns (rows n apart in the output) and
    return the output array of ``shape``: float32, or uint8 with
    ``out_scale`` and ``out_zero_point`` (with ``keep_float``, both:
    (float32, uint8))."""
    if activation not in ACTIVATIONS:
        raise ValueError("%s: activation must be None, 'linear', 'relu' or 'relu6', got %r"
                         % (fname, activation))
    cdef int32_t za = _zero(fname, "zero_a", zero_a)
    cdef Py_ssize_t npan = cb_q_panels(n)
    if not isinstance(vectors, np.ndarray) or vectors.dtype != np.float32 or \
            vectors.ndim != 2 or vectors.shape[0] not in (1, 2) or \
            vectors.shape[1] != npan * CB_Q_NR or not vectors.flags.c_contiguous:
        raise ValueError("%s: the epilogue vectors must be epilogue_vectors' float32 "
                         "(1 or 2, %d) array for N = %d, got %s"
                         % (fname, npan * CB_Q_NR, n, _describe(vectors)))
    cdef bint quantized = out_scale is not None or out_zero_point is not None
    cdef const float* padded = <const float*>cnp.PyArray_DATA(vectors)
    e.scale = padded
    e.bias = NULL
    e.res = NULL
    e.res_q = NULL
    e.ldr = 0
    if vectors.shape[0] == 2:
        e.bias = padded + npan * CB_Q_NR
    e.za = za
    e.act = ACTIVATIONS[activation]
    e.out_f = NULL
    e.out_q = NULL
    e.ext_hi = NULL
    e.ext_lo = NULL
    e.ldf = e.ldq = n
    if quantized:
        if out_scale is None or out_zero_point is None:
            raise ValueError("%s: a uint8 output needs both out_scale and out_zero_point"
                             % fname)
        e.q_scale = _scale(fname, "out_scale", out_scale)
        e.q_zero = _zero(fname, "out_zero_point", out_zero_point)
        e.q_lo = <float>(-e.q_zero)
        e.q_hi = <float>(255 - e.q_zero)
        out = np.empty(shape, dtype=np.uint8)
        e.out_q = <uint8_t*>cnp.PyArray_DATA(out)
        if keep_float:
            y = np.empty(shape, dtype=np.float32)
            e.out_f = <float*>cnp.PyArray_DATA(y)
            out = (y, out)
    elif keep_float:
        raise ValueError("%s: keep_float goes with a uint8 output (out_scale)" % fname)
    else:
        out = np.empty(shape, dtype=np.float32)
        e.out_f = <float*>cnp.PyArray_DATA(out)
    if quantized and not keep_float and _fold_activations and e.q_zero == 0 and \
            (e.act == 1 or (e.act == 2 and (<float>6.0) / e.q_scale >= <float>255.0)):
        # Codes only, of zero point 0: the codes' clamp to [0, 255] does the
        # activation's work, to the bit. Below 0 (and NaN) both give code 0;
        # past 6, relu6 gives 6 and 6 / out_scale already reaches 255 (the
        # division rounds monotonically), so the code is 255 either way. The
        # epilogue is bound by its float operations: two fewer of about eight.
        e.act = 0
    return out


# Whether _epilogue drops an activation the codes' clamp does (above); off,
# to compare, in tests.
cdef bint _fold_activations = True


def _fold_activation(on=None):
    """Set (True / False) or read (None) whether uint8 epilogues of zero
    point 0 leave relu / relu6 to the codes' clamp; returns the setting."""
    global _fold_activations
    if on is not None:
        _fold_activations = bool(on)
    return bool(_fold_activations)


cdef object _residual(str fname, cb_q_epilogue* e, residual, Py_ssize_t m, Py_ssize_t n):
    """Point ``e`` at ``residual``: float32 (m, n), or ``(codes, scale,
    zero_point)`` with uint8 codes (m, n) standing for (codes - zero_point) *
    scale. Returns the array read (a copy when its rows are not of unit
    stride), to be kept alive."""
    if residual is None:
        return None
    if isinstance(residual, tuple):
        if len(residual) != 3:
            raise ValueError("%s: a residual of codes is (codes, scale, zero_point), got %d "
                             "items" % (fname, len(residual)))
        codes, scale, zero = residual
        if not isinstance(codes, np.ndarray) or codes.dtype != np.uint8 or \
                codes.shape != (m, n):
            raise ValueError("%s: the residual codes must be a uint8 array of the output's "
                             "shape %s, got %s" % (fname, (m, n), _describe(codes)))
        scale = float(scale)
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError("%s: the residual's scale must be positive and finite, got %r"
                             % (fname, scale))
        e.res_zero = _zero(fname, "the residual's zero_point", zero)
        if n > 0 and (codes.strides[1] != 1 or codes.strides[0] < n):
            codes = np.ascontiguousarray(codes)
        e.res_q = <const uint8_t*>cnp.PyArray_DATA(codes)
        e.ldrq = codes.strides[0] if m > 1 else n
        e.res_scale = scale
        return codes
    if not isinstance(residual, np.ndarray) or residual.dtype != np.float32 or \
            residual.shape != (m, n):
        raise ValueError("%s: the residual must be a float32 array of the output's shape %s, "
                         "got %s" % (fname, (m, n), _describe(residual)))
    if n > 0 and (residual.strides[1] != 4 or residual.strides[0] % 4 != 0 or
                  residual.strides[0] < 4 * n):
        residual = np.ascontiguousarray(residual)
    e.res = <const float*>cnp.PyArray_DATA(residual)
    e.ldr = residual.strides[0] // 4 if m > 1 else n
    return residual


# Products of at most this many rows whose packed weights take
# _PANEL_SPLIT_BYTES or more split their panels between the threads, not
# their rows: each thread then streams half the weights from memory instead
# of all of them (ResNet-50's last stage at batch 1: 49 rows, 2.4 MB of
# weights a layer). 0: never.
cdef Py_ssize_t _panel_split_rows = 64
cdef Py_ssize_t _PANEL_SPLIT_BYTES = 1 << 19


cdef inline bint _split_panels(Py_ssize_t m, Py_ssize_t k, Py_ssize_t n) noexcept nogil:
    return m <= _panel_split_rows and cb_q_packed_bytes(k, n) >= _PANEL_SPLIT_BYTES


def _panel_split(rows=None):
    """Set (for tests and benchmarks) the most rows of a product whose
    large weights split by panels (0: never); returns the previous value."""
    global _panel_split_rows
    old = _panel_split_rows
    if rows is not None:
        _panel_split_rows = rows
    return old


cdef void _gemm_part(int level, const uint8_t* a, Py_ssize_t lda, Py_ssize_t m, Py_ssize_t k,
                     const uint8_t* packed, Py_ssize_t npan, Py_ssize_t n,
                     const cb_q_epilogue* e, int t, int parts, bint by_rows) noexcept nogil:
    cdef Py_ssize_t lo, hi
    if by_rows:
        lo = (m * t) // parts
        hi = (m * (t + 1)) // parts
        cb_q_gemm_part(level, a, lda, lo, hi, k, packed, 0, npan, n, e)
    else:
        lo = (npan * t) // parts
        hi = (npan * (t + 1)) // parts
        cb_q_gemm_part(level, a, lda, 0, m, k, packed, lo, hi, n, e)


# ---------------------------------------------------------------- patches

def _window(fname, x, kernel_size, strides, dilation, pads):
    """The checked geometry of a window over uint8 x (N, H, W, C):
    (kh, kw, sh, sw, dh, dw, pt, pb, pl, pr, oh, ow)."""
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4:
        raise TypeError("%s: expected a 4-D uint8 array (N, H, W, C), got %s"
                        % (fname, _describe(x)))
    kh, kw = _pair(fname, "kernel_size", kernel_size, 1)
    sh, sw = _pair(fname, "strides", strides, 1)
    dh, dw = _pair(fname, "dilation", dilation, 1)
    try:
        (pt, pb), (pl, pr) = [[_index(v) for v in p] for p in pads]
    except (TypeError, ValueError):
        raise ValueError("%s: pads must be ((top, bottom), (left, right)), got %r"
                         % (fname, pads)) from None
    if min(pt, pb, pl, pr) < 0:
        raise ValueError("%s: pads must be >= 0, got %r" % (fname, pads))
    h, w = x.shape[1], x.shape[2]
    eh, ew = h + pt + pb - (kh - 1) * dh, w + pl + pr - (kw - 1) * dw
    if eh < 1 or ew < 1:
        raise ValueError("%s: the %dx%d window (dilation %s) does not fit the padded "
                         "input %s" % (fname, kh, kw, (dh, dw), (h + pt + pb, w + pl + pr)))
    return kh, kw, sh, sw, dh, dw, pt, pb, pl, pr, (eh - 1) // sh + 1, (ew - 1) // sw + 1


def im2col(x, kernel_size, strides=(1, 1), dilation=(1, 1), pads=((0, 0), (0, 0)),
           pad_value=0):
    """The uint8 patch matrix of a channels_last 2-D convolution of x
    (N, H, W, C): one row per output pixel (n, oy, ox), its window's taps in
    (ky, kx, c) order, which is the row order of a Keras kernel (kh, kw, C, F)
    reshaped to (kh * kw * C, F). Taps in the padding are ``pad_value`` (the
    zero point: the code of 0.0). ``pads``: ((top, bottom), (left, right)).
    A 1-D convolution is one of height 1. Returns (N * OH * OW, kh * kw * C)."""
    cdef Py_ssize_t kh, kw, sh, sw, dh, dw, pt, pl, oh, ow
    kh, kw, sh, sw, dh, dw, pt, _, pl, _, oh, ow = _window("im2col", x, kernel_size, strides,
                                                           dilation, pads)
    cdef int pv = _zero("im2col", "pad_value", pad_value)
    cdef Py_ssize_t b = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    out = np.empty((b * oh * ow, kh * kw * c), dtype=np.uint8)
    if out.size == 0:
        return out
    x = np.ascontiguousarray(x)
    cdef const uint8_t* src = <const uint8_t*>cnp.PyArray_DATA(x)
    cdef uint8_t* dst = <uint8_t*>cnp.PyArray_DATA(out)
    cdef Py_ssize_t lines = b * oh
    cdef double work = <double>out.size
    cdef int parts = team_parts(work), nt = threads_for(work), t
    if parts > lines:
        parts = <int>lines
    with nogil:
        if parts <= 1:
            cb_q_im2col(src, h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, <uint8_t>pv, dst,
                        0, lines)
        else:
            for t in prange(parts, schedule='static', num_threads=nt):
                cb_q_im2col(src, h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, <uint8_t>pv,
                            dst, (lines * t) // parts, (lines * (t + 1)) // parts)
    team_done(nt)
    return out


def conv(x, packed, vectors, kernel_size, strides=(1, 1), dilation=(1, 1),
         pads=((0, 0), (0, 0)), zero_a=0, activation=None, out_scale=None,
         out_zero_point=None, residual=None, keep_float=False):
    """The int8 convolution of uint8 codes x (N, H, W, C) with packed weights
    (kh * kw * C, F): ``gemm_prepared(im2col(x, ..., pad_value=zero_a),
    packed, vectors, zero_a, ...)``, the same bits, with the patch rows formed
    a block at a time (about 96 kB) and multiplied while in cache instead of
    the whole patch matrix first. Returns (N * OH * OW, F), float32 or uint8
    codes; ``residual`` and ``keep_float`` as ``gemm_prepared``'s."""
    cdef cb_q_patches g
    cdef Py_ssize_t kh, kw, sh, sw, dh, dw, pt, pl, oh, ow
    kh, kw, sh, sw, dh, dw, pt, _, pl, _, oh, ow = _window("conv", x, kernel_size, strides,
                                                           dilation, pads)
    _check_packed("conv", packed)
    cdef Py_ssize_t b = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef cb_q_header hd = cb_q_read_header(<const uint8_t*>cnp.PyArray_DATA(packed))
    cdef Py_ssize_t k = kh * kw * c, n = hd.n
    if hd.k != k:
        raise ValueError("conv: a %dx%d window over %d channels makes K = %d, the packed "
                         "weights have %d rows" % (kh, kw, c, k, hd.k))
    cdef Py_ssize_t m = b * oh * ow
    cdef cb_q_epilogue e
    out = _epilogue("conv", &e, vectors, n, zero_a, activation, out_scale, out_zero_point,
                    (m, n), keep_float)
    held = _residual("conv", &e, residual, m, n)
    if m == 0 or n == 0:
        return out
    cdef double work = _gemm_work(m, n, k)
    cdef int parts = team_parts(work), nt = threads_for(work), t
    cdef Py_ssize_t mc = cb_q_conv_block_rows(k)
    if m < 16 * parts or m <= mc or _split_panels(m, k, n):
        # a few rows: the product splits its panels between the threads
        patches = im2col(x, (kh, kw), (sh, sw), (dh, dw), pads, e.za)
        return gemm_prepared(patches, packed, vectors, e.za, activation, out_scale,
                             out_zero_point, residual, keep_float)
    x = np.ascontiguousarray(x)
    g.x = <const uint8_t*>cnp.PyArray_DATA(x)
    g.h, g.w, g.c, g.kh, g.kw, g.sh, g.sw = h, w, c, kh, kw, sh, sw
    g.dh, g.dw, g.pt, g.pl, g.oh, g.ow = dh, dw, pt, pl, oh, ow
    g.pad = <uint8_t>e.za
    buffers = np.empty((parts, mc * k), dtype=np.uint8)
    cdef uint8_t* bufs = <uint8_t*>cnp.PyArray_DATA(buffers)
    cdef const uint8_t* bp = <const uint8_t*>cnp.PyArray_DATA(packed)
    cdef int level = cb_q_level()
    with nogil:
        if parts <= 1:
            cb_q_conv_part(level, &g, 0, m, k, bp, n, &e, bufs)
        else:
            for t in prange(parts, schedule='static', num_threads=nt):
                cb_q_conv_part(level, &g, (m * t) // parts, (m * (t + 1)) // parts, k, bp, n,
                               &e, bufs + t * mc * k)
    team_done(nt)
    return out


# ---------------------------------------------------------------- window extremes

@cython.final
cdef class BoundRun:
    """``run(codes, packed, vectors, residual=None)``: a quantized op's
    remembered run (ops/quantized.py) as a bound plan step calls it
    (graph/binding.py): the prepared ``call`` on the codes seen as its
    ``rows``, the result seen as the op's output shape. None when the arrays
    do not fit what was bound (other shapes, layouts or dtypes, or weights
    the call was not made for): the step then runs its op."""
    cdef object call
    cdef tuple in_shape, rows, out_shape, res_rows, res_codes
    cdef int res_type
    cdef bint has_res

    def __call__(self, codes, packed, vectors, residual=None):
        if not fits(codes, cnp.NPY_UINT8, self.in_shape) or \
                (residual is None) == self.has_res or not self.call.matches(packed, vectors):
            return None
        if residual is None:
            return self.call(codes.reshape(self.rows)).reshape(self.out_shape)
        if not fits(residual, self.res_type, self.out_shape):
            return None
        r = residual.reshape(self.res_rows)
        if self.res_codes is not None:
            r = (r,) + self.res_codes
        return self.call(codes.reshape(self.rows), r).reshape(self.out_shape)


def bound_run(call, in_shape, rows, out_shape, residual=None, residual_codes=None):
    """A BoundRun of ``call`` for uint8 codes of ``in_shape``, which it
    takes as ``rows`` (a shape), giving ``out_shape``; ``residual``: None,
    'float32' or 'uint8' (then ``residual_codes`` is its (scale, zero
    point)), a residual of the output's shape the call adds."""
    cdef BoundRun run = BoundRun()
    if residual not in (None, "float32", "uint8") or \
            (residual == "uint8") != (residual_codes is not None):
        raise ValueError("bound_run: residual must be None, 'float32' or 'uint8' with its "
                         "codes' (scale, zero point), got %r %r" % (residual, residual_codes))
    run.call = call
    run.in_shape = tuple([int(d) for d in in_shape])
    run.rows = tuple([int(d) for d in rows])
    run.out_shape = tuple([int(d) for d in out_shape])
    if not run.out_shape:
        raise ValueError("bound_run: the output needs an axis")
    run.has_res = residual is not None
    run.res_type = cnp.NPY_UINT8 if residual == "uint8" else cnp.NPY_FLOAT
    run.res_rows = (-1, run.out_shape[len(run.out_shape) - 1])
    run.res_codes = None if residual_codes is None else tuple(residual_codes)
    return run


include "qconv_extreme.pxi"


# ---------------------------------------------------------------- depthwise

include "qconv_depthwise.pxi"


# ---------------------------------------------------------------- pooling

include "qpool.pxi"


# ---------------------------------------------------------------- arguments

def _describe(x):
    if isinstance(x, np.ndarray):
        return "a %s array of shape %s" % (x.dtype, x.shape)
    return type(x).__name__


def _dim(fname, what, v):
    if isinstance(v, bool) or not hasattr(v, "__index__") or v.__index__() < 0:
        raise ValueError("%s: %s must be an integer >= 0, got %r" % (fname, what, v))
    return v.__index__()


def _scale(fname, what, v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError("%s: %s must be a number, got %r" % (fname, what, v)) from None
    # positive, and neither overflowing nor vanishing in float32
    if not (0 < f <= FLOAT32_MAX) or np.float32(f) == 0:
        raise ValueError("%s: %s must be finite and positive in float32, got %r"
                         % (fname, what, v))
    return float(np.float32(f))


def _zero(fname, what, v):
    if isinstance(v, bool) or not hasattr(v, "__index__") or not 0 <= v.__index__() <= 255:
        raise ValueError("%s: %s must be an integer from 0 to 255, got %r" % (fname, what, v))
    return v.__index__()


def _index(v):
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError
    return v.__index__()


def _pair(fname, what, v, low):
    try:
        p = (_index(v),) * 2 if hasattr(v, "__index__") else tuple(_index(i) for i in v)
    except TypeError:
        p = ()
    if len(p) != 2 or min(p) < low:
        raise ValueError("%s: %s must be an integer or two integers >= %d, got %r"
                         % (fname, what, low, v))
    return p
