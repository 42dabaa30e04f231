"""Element-wise programs: a chain of element-wise ops in one pass over memory.

A program is a list of instructions ``(opcode, dst, a, b, c, d)`` over
registers. Registers ``0 .. n_operands-1`` are the operands; the others are
scratch. ``dst = -1`` is the output array. The program runs block by block
(``BLOCK`` elements, so that every register of a block stays in L1), blocks
split across OpenMP threads; each instruction is one loop over a block: for
the exact opcodes, AVX-512 or AVX2 loops picked at run time
(include/cyback_ewise_step.h), for the others plain loops gcc vectorizes.

The output is viewed as ``(P, C, Q)`` and each operand is one of:

- FULL: an array of the output's size, C-contiguous, read in step;
- CHAN: a vector of C values broadcast along P and Q (a bias or a BatchNorm
  scale on the channels axis: axis -1 gives Q = 1, channels_first gives Q =
  the spatial size);
- SCALAR: one value.

The results match NumPy's element-wise ufuncs in the same precision for the
arithmetic, min/max (NaN propagates as in np.maximum) and select opcodes.
Transcendental opcodes may differ from NumPy in the last bits: float32 exp,
tanh, sigmoid and erf run through include/cyback_vmath.h (vectorised, AVX-512 /
AVX2 / baseline picked at run time, within a few units in the last place; the
same bits on AVX-512 and AVX2), the others and every float64 one through the C
library. ``exp_f32``, ``tanh_f32``, ``sigmoid_f32`` and ``erf_f32`` apply those
rows to a whole array.
"""
import numpy as np
cimport cython
cimport numpy as cnp
from cython.parallel cimport prange, parallel
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy
from libc.math cimport (sqrt, sqrtf, exp, expf, expm1, expm1f, log, logf, log1p, log1pf,
                        tanh, fabs, fabsf, erf)

from cyback.kernels._arrays cimport fits
from cyback.kernels._blas cimport floating
from cyback.kernels import settings as _settings
from cyback.kernels._omp cimport cb_get_thread_num
from cyback.kernels.runtime cimport team_done, threads_for

cnp.import_array()


cdef extern from "cyback_vmath.h" nogil:
    void cb_vm_exp_f(const float* x, float* y, Py_ssize_t n)
    void cb_vm_tanh_f(const float* x, float* y, Py_ssize_t n)
    void cb_vm_sigmoid_f(const float* x, float* y, Py_ssize_t n)
    void cb_vm_erf_f(const float* x, float* y, Py_ssize_t n)
    int cb_simd_use_avx2(int on)
    int cb_simd_use_avx512(int on)
    void cb_simd_set_default_cap(int cap)


cb_simd_set_default_cap(2 if _settings.get("CYBACK_AVX512") else 1)


def _use_avx2(bint on):
    """Run the float32 exp/tanh/sigmoid/erf rows' AVX2 + FMA set when the CPU
    has it (the default), or the baseline one (for tests). Returns whether
    AVX2 now runs."""
    return bool(cb_simd_use_avx2(on))


def _use_avx512(bint on):
    """Let the float32 rows' AVX-512 set run when the CPU has it (the
    default), or cap them at AVX2 (for tests). Returns whether AVX-512 now
    runs."""
    return bool(cb_simd_use_avx512(on))

cdef enum:
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN, OP_NEG, OP_ABS, OP_SQUARE, OP_SQRT,
    OP_EXP, OP_EXPM1, OP_LOG, OP_LOG1P, OP_TANH, OP_SIGMOID, OP_SOFTPLUS, OP_SOFTSIGN,
    OP_RECIP, OP_SELECT_GT, OP_SELECT_GE, OP_COPY, OP_ERF, N_OPS

cdef extern from "cyback_ewise_step.h" nogil:
    enum:
        CB_EW_ADD, CB_EW_MAX, CB_EW_SQRT, CB_EW_RECIP, CB_EW_SELECT_GT, CB_EW_COPY
    Py_ssize_t cb_ew_step_f(int op, float* d, const float* a, const float* b, const float* c,
                            const float* e, Py_ssize_t n)
    Py_ssize_t cb_ew_step_d(int op, double* d, const double* a, const double* b,
                            const double* c, const double* e, Py_ssize_t n)

# the header's wide loops take ewise's opcode numbers
if (CB_EW_ADD, CB_EW_MAX, CB_EW_SQRT, CB_EW_RECIP, CB_EW_SELECT_GT, CB_EW_COPY) != \
        (OP_ADD, OP_MAX, OP_SQRT, OP_RECIP, OP_SELECT_GT, OP_COPY):
    raise ImportError("ewise: cyback_ewise_step.h numbers its opcodes differently")

cdef enum:
    FULL = 0
    CHAN = 1
    SCALAR = 2

DEF BLOCK = 1024
DEF MAXREG = 64

#: opcode numbers by name, and how many source registers each reads
OPCODES = {
    "add": (OP_ADD, 2), "subtract": (OP_SUB, 2), "multiply": (OP_MUL, 2),
    "divide": (OP_DIV, 2), "maximum": (OP_MAX, 2), "minimum": (OP_MIN, 2),
    "negative": (OP_NEG, 1), "abs": (OP_ABS, 1), "square": (OP_SQUARE, 1),
    "sqrt": (OP_SQRT, 1), "exp": (OP_EXP, 1), "expm1": (OP_EXPM1, 1), "log": (OP_LOG, 1),
    "log1p": (OP_LOG1P, 1), "tanh": (OP_TANH, 1), "sigmoid": (OP_SIGMOID, 1),
    "softplus": (OP_SOFTPLUS, 1), "softsign": (OP_SOFTSIGN, 1), "reciprocal": (OP_RECIP, 1),
    "select_gt": (OP_SELECT_GT, 4), "select_ge": (OP_SELECT_GE, 4), "copy": (OP_COPY, 1),
    "erf": (OP_ERF, 1),
}
#: opcodes whose results are bit-identical to NumPy's ufuncs
EXACT = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "negative", "abs",
         "square", "sqrt", "reciprocal", "select_gt", "select_ge", "copy"}
KIND_FULL, KIND_CHAN, KIND_SCALAR = FULL, CHAN, SCALAR
MAX_REGISTERS = MAXREG


cdef inline floating _exp(floating x) noexcept nogil:
    if floating is float:
        return expf(x)
    else:
        return exp(x)


cdef inline floating _log1p(floating x) noexcept nogil:
    if floating is float:
        return log1pf(x)
    else:
        return log1p(x)


cdef void _step(int op, floating* d, const floating* a, const floating* b,
                const floating* c, const floating* e, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef floating u, v, one = 1, zero = 0
    if op == OP_ADD:
        for i in range(n):
            d[i] = a[i] + b[i]
    elif op == OP_SUB:
        for i in range(n):
            d[i] = a[i] - b[i]
    elif op == OP_MUL:
        for i in range(n):
            d[i] = a[i] * b[i]
    elif op == OP_DIV:
        for i in range(n):
            d[i] = a[i] / b[i]
    elif op == OP_MAX:
        # np.maximum: a NaN on either side wins
        for i in range(n):
            u = a[i]
            v = b[i]
            d[i] = u if (u >= v or u != u) else v
    elif op == OP_MIN:
        for i in range(n):
            u = a[i]
            v = b[i]
            d[i] = u if (u <= v or u != u) else v
    elif op == OP_NEG:
        for i in range(n):
            d[i] = -a[i]
    elif op == OP_ABS:
        if floating is float:
            for i in range(n):
                d[i] = fabsf(a[i])
        else:
            for i in range(n):
                d[i] = fabs(a[i])
    elif op == OP_SQUARE:
        for i in range(n):
            d[i] = a[i] * a[i]
    elif op == OP_SQRT:
        if floating is float:
            for i in range(n):
                d[i] = sqrtf(a[i])
        else:
            for i in range(n):
                d[i] = sqrt(a[i])
    elif op == OP_EXP:
        if floating is float:
            cb_vm_exp_f(a, d, n)
        else:
            for i in range(n):
                d[i] = exp(a[i])
    elif op == OP_EXPM1:
        if floating is float:
            for i in range(n):
                d[i] = expm1f(a[i])
        else:
            for i in range(n):
                d[i] = expm1(a[i])
    elif op == OP_LOG:
        if floating is float:
            for i in range(n):
                d[i] = logf(a[i])
        else:
            for i in range(n):
                d[i] = log(a[i])
    elif op == OP_LOG1P:
        for i in range(n):
            d[i] = _log1p(a[i])
    elif op == OP_TANH:
        if floating is float:
            cb_vm_tanh_f(a, d, n)
        else:
            for i in range(n):
                d[i] = tanh(a[i])
    elif op == OP_SIGMOID:
        if floating is float:
            cb_vm_sigmoid_f(a, d, n)
        else:
            # 1 / (1 + exp(-x)) overflows harmlessly to 0 for very negative x
            for i in range(n):
                d[i] = one / (one + exp(-a[i]))
    elif op == OP_ERF:
        if floating is float:
            cb_vm_erf_f(a, d, n)
        else:
            for i in range(n):
                d[i] = erf(a[i])
    elif op == OP_SOFTPLUS:
        # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), stable both ways
        for i in range(n):
            u = a[i]
            v = u if u > zero else -u
            d[i] = (u if u > zero else zero) + _log1p(_exp(-v))
    elif op == OP_SOFTSIGN:
        for i in range(n):
            u = a[i]
            d[i] = u / (one + (u if u > zero else -u))
    elif op == OP_RECIP:
        for i in range(n):
            d[i] = one / a[i]
    elif op == OP_SELECT_GT:
        for i in range(n):
            u = c[i]
            v = e[i]
            d[i] = u if a[i] > b[i] else v
    elif op == OP_SELECT_GE:
        for i in range(n):
            u = c[i]
            v = e[i]
            d[i] = u if a[i] >= b[i] else v
    elif op == OP_COPY:
        for i in range(n):
            d[i] = a[i]


cdef void _fill(floating* d, floating v, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        d[i] = v


cdef void _eval(const int* code, int n_code, floating** reg, floating* out,
                Py_ssize_t n) noexcept nogil:
    cdef int k, dst
    cdef const int* ins
    cdef Py_ssize_t done
    cdef floating* d
    for k in range(n_code):
        ins = code + 6 * k
        dst = ins[1]
        d = out if dst < 0 else reg[dst]
        # the exact opcodes on the CPU's widest vectors (the header's loops),
        # the rest of the block and the other opcodes in _step's plain loops
        if floating is float:
            done = cb_ew_step_f(ins[0], d, reg[ins[2]], reg[ins[3]], reg[ins[4]], reg[ins[5]], n)
        else:
            done = cb_ew_step_d(ins[0], d, reg[ins[2]], reg[ins[3]], reg[ins[4]], reg[ins[5]], n)
        if done < n:
            _step(ins[0], d + done, reg[ins[2]] + done, reg[ins[3]] + done, reg[ins[4]] + done,
                  reg[ins[5]] + done, n - done)


cdef int _run(floating* out, const int* code, int n_code, int n_regs, floating** base,
              const int* kinds, int n_ops, Py_ssize_t P, Py_ssize_t C, Py_ssize_t Q,
              int threads) noexcept nogil:
    """Returns 0, or -1 when scratch memory could not be had."""
    cdef Py_ssize_t total = P * C * Q, blk, nq = 1, n_blocks, b, start, n, ch, q0, r
    cdef floating** regs
    cdef floating** reg
    cdef floating* scratch
    cdef floating* tiled = NULL
    cdef int j, n_chan = 0, t, tid
    if total == 0:
        return 0
    if Q == 1:
        # Blocks are whole rows of C, so a CHAN vector tiled once over a block
        # lines up with every block.
        blk = C * (BLOCK // C) if C < BLOCK else C
        if total < blk:
            blk = total     # small outputs: no tiling or filling past their end
        n_blocks = (total + blk - 1) // blk
    else:
        blk = Q if Q < BLOCK else BLOCK
        nq = (Q + blk - 1) // blk
        n_blocks = P * C * nq
    if n_blocks < threads:
        threads = <int> n_blocks
    for j in range(n_ops):
        if kinds[j] == CHAN:
            n_chan += 1
    # Per thread: MAXREG register pointers and n_regs scratch blocks; SCALAR
    # operands are filled once, CHAN ones tiled once (Q == 1) or per block.
    regs = <floating**> malloc(threads * MAXREG * sizeof(floating*))
    scratch = <floating*> malloc(threads * n_regs * blk * sizeof(floating))
    if Q == 1 and n_chan:
        tiled = <floating*> malloc(n_chan * blk * sizeof(floating))
    if regs == NULL or scratch == NULL or (Q == 1 and n_chan and tiled == NULL):
        free(regs)
        free(scratch)
        free(tiled)
        return -1
    if tiled != NULL:
        t = 0
        for j in range(n_ops):
            if kinds[j] == CHAN:
                for r in range(blk // C):
                    for ch in range(C):
                        tiled[t * blk + r * C + ch] = base[j][ch]
                t += 1
    for tid in range(threads):
        reg = regs + tid * MAXREG
        t = 0
        for j in range(n_regs):
            reg[j] = scratch + (tid * n_regs + j) * blk
            if j < n_ops and kinds[j] == SCALAR:
                _fill(reg[j], base[j][0], blk)
            elif j < n_ops and kinds[j] == CHAN and Q == 1:
                reg[j] = tiled + t * blk
                t += 1
    for b in prange(n_blocks, num_threads=threads, schedule="static"):
        reg = regs + cb_get_thread_num() * MAXREG
        if Q == 1:
            start = b * blk
            n = total - start
            if n > blk:
                n = blk
            for j in range(n_ops):
                if kinds[j] == FULL:
                    reg[j] = base[j] + start
        else:
            ch = (b // nq) % C
            q0 = (b % nq) * blk
            start = (b // nq) * Q + q0
            n = Q - q0
            if n > blk:
                n = blk
            for j in range(n_ops):
                if kinds[j] == FULL:
                    reg[j] = base[j] + start
                elif kinds[j] == CHAN:
                    _fill(reg[j], base[j][ch], n)
        _eval(code, n_code, reg, out + start, n)
    free(tiled)
    free(scratch)
    free(regs)
    return 0


def _check_kinds(const int[::1] kinds):
    cdef Py_ssize_t j
    for j in range(kinds.shape[0]):
        if kinds[j] != FULL and kinds[j] != CHAN and kinds[j] != SCALAR:
            raise ValueError("ewise: operand %d has unknown kind %d" % (j, kinds[j]))


def check(const int[:, ::1] code, int n_regs, int n_ops):
    """Raise ValueError unless ``code`` is a program over ``n_ops`` operands
    and ``n_regs`` registers that the kernel can run."""
    cdef Py_ssize_t j, k
    if n_regs > MAXREG or n_ops > n_regs or code.shape[1] != 6 or code.shape[0] == 0:
        raise ValueError("ewise: bad program (%d instructions, %d operands, %d registers)"
                         % (code.shape[0], n_ops, n_regs))
    for j in range(code.shape[0]):
        ok = 0 <= code[j, 0] < N_OPS and (n_ops <= code[j, 1] < n_regs or code[j, 1] == -1)
        for k in range(2, 6):
            ok = ok and 0 <= code[j, k] < n_regs
        if not ok:
            raise ValueError("ewise: bad instruction %d: %s" % (j, list(code[j])))


cdef object _dispatch(cnp.ndarray out, const int[:, ::1] code, int n_regs, void** ptrs,
                      const int[::1] kinds, int n_ops, Py_ssize_t P, Py_ssize_t C, Py_ssize_t Q):
    """Run ``code`` into ``out`` over the operand pointers ``ptrs``."""
    cdef int rc
    cdef int threads = threads_for(4.0 * P * C * Q * code.shape[0])
    cdef int type_num = cnp.PyArray_TYPE(out)
    if type_num == cnp.NPY_FLOAT:
        with nogil:
            rc = _run(<float*> cnp.PyArray_DATA(out), &code[0, 0], <int> code.shape[0], n_regs,
                      <float**> ptrs, &kinds[0] if n_ops else NULL, n_ops, P, C, Q, threads)
    elif type_num == cnp.NPY_DOUBLE:
        with nogil:
            rc = _run(<double*> cnp.PyArray_DATA(out), &code[0, 0], <int> code.shape[0], n_regs,
                      <double**> ptrs, &kinds[0] if n_ops else NULL, n_ops, P, C, Q, threads)
    else:
        raise TypeError("ewise: float32 or float64 only, got %s" % out.dtype)
    team_done(threads)
    if rc:
        raise MemoryError("ewise: no memory for the block buffers")
    return out


def run(cnp.ndarray out, const int[:, ::1] code, int n_regs, operands, const int[::1] kinds,
        Py_ssize_t P, Py_ssize_t C, Py_ssize_t Q):
    """Run ``code`` into ``out`` (C-contiguous float32/float64, size P*C*Q).

    ``operands``: arrays of out's dtype, C-contiguous (FULL: size P*C*Q, CHAN:
    size C, SCALAR: size 1), one per ``kinds`` entry; ``n_regs`` >=
    len(operands) counts operands and scratch registers."""
    cdef int j
    cdef cnp.ndarray a
    cdef void* ptrs[MAXREG]
    operands = list(operands)
    check(code, n_regs, len(operands))
    _check_kinds(kinds)
    if kinds.shape[0] != len(operands):
        raise ValueError("ewise.run: %d kinds for %d operands" % (kinds.shape[0], len(operands)))
    if not out.flags.c_contiguous or out.size != P * C * Q:
        raise ValueError("ewise.run: out must be C-contiguous of size %d" % (P * C * Q))
    for j in range(len(operands)):
        a = operands[j]
        want = P * C * Q if kinds[j] == FULL else (C if kinds[j] == CHAN else 1)
        if a.dtype != out.dtype or not a.flags.c_contiguous or a.size != want:
            raise ValueError("ewise.run: operand %d must be C-contiguous %s of size %d, got %s "
                             "of size %d" % (j, out.dtype, want, a.dtype, a.size))
        ptrs[j] = cnp.PyArray_DATA(a)
    return _dispatch(out, code, n_regs, ptrs, kinds, len(operands), P, C, Q)


cdef class Program:
    """A checked program bound to its operand kinds, baked constants, channel
    axis and in-place operand: ``program(arrays)`` runs it on the tensor
    operands of one fused step, or returns None when they do not fit it (a
    full-size operand of another shape, a channel vector of the wrong size,
    another dtype); the caller then computes the ops one by one."""

    cdef int[:, ::1] code
    cdef int[::1] kinds
    cdef int n_regs, n_tensor, has_axis, axis, inplace, n_consts
    cdef list consts
    cdef object dtype
    cdef int is_float

    def __init__(self, code, int n_regs, kinds, consts, axis, inplace, dtype):
        self.code = np.ascontiguousarray(code, dtype=np.int32)
        self.kinds = np.ascontiguousarray(kinds, dtype=np.int32)
        self.consts = [np.ascontiguousarray(c, dtype=dtype).reshape(1) for c in consts]
        self.n_consts = len(self.consts)
        self.n_tensor = self.kinds.shape[0] - self.n_consts
        self.n_regs = n_regs
        check(self.code, n_regs, self.kinds.shape[0])
        _check_kinds(self.kinds)
        for j in range(self.n_tensor, self.kinds.shape[0]):
            if self.kinds[j] != SCALAR:
                raise ValueError("ewise: the baked constants must be SCALAR operands")
        if axis is not None and not (isinstance(axis, int) and axis < 0):
            raise ValueError("ewise: the channel axis counts from the end (< 0), got %r"
                             % (axis,))
        if inplace is not None and not (isinstance(inplace, int) and
                                        0 <= inplace < self.n_tensor and
                                        self.kinds[inplace] == FULL):
            raise ValueError("ewise: the in-place operand must be a FULL tensor operand, got %r"
                             % (inplace,))
        self.has_axis = axis is not None
        self.axis = axis if axis is not None else 0
        self.inplace = inplace if inplace is not None else -1
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError("ewise: float32 or float64 only, got %s" % self.dtype)
        self.is_float = self.dtype == np.float32

    def __call__(self, list arrays):
        cdef Py_ssize_t n_arr = len(arrays), j, P, C = 1, Q = 1, total = 1, ax, d
        cdef cnp.ndarray a, out = None
        cdef object shape = None
        cdef int kind
        cdef void* ptrs[MAXREG]
        if n_arr != self.n_tensor:
            raise ValueError("ewise: %d operands for a program of %d" % (n_arr, self.n_tensor))
        for j in range(n_arr):
            if self.kinds[j] == FULL:
                shape = np.shape(arrays[j])
                break
        if shape is None:
            return None
        for d in shape:
            total *= d
        if self.has_axis:
            ax = len(shape) + self.axis
            if ax < 0:
                return None
            C = shape[ax]
            for d in shape[ax + 1:]:
                Q *= d
        P = total // (C * Q) if C * Q else 0
        for j in range(n_arr):
            if type(arrays[j]) is not np.ndarray:
                arrays[j] = np.asarray(arrays[j])   # NumPy scalars from reductions
            a = <cnp.ndarray> arrays[j]
            if a.descr.type_num != <int> (cnp.NPY_FLOAT if self.is_float else cnp.NPY_DOUBLE):
                return None
            kind = self.kinds[j]
            if kind == FULL:
                if (<object> a).shape != shape:
                    return None
            elif cnp.PyArray_SIZE(a) != (C if kind == CHAN else 1):
                return None
            if not cnp.PyArray_IS_C_CONTIGUOUS(a):
                a = np.ascontiguousarray(a)
                arrays[j] = a
            ptrs[j] = cnp.PyArray_DATA(a)
        for j in range(self.n_consts):
            ptrs[n_arr + j] = cnp.PyArray_DATA(<cnp.ndarray> self.consts[j])
        if self.inplace >= 0:
            a = <cnp.ndarray> arrays[self.inplace]
            # a full-size operand the plan no longer needs (see graph/fusion.py),
            # already checked for shape and made contiguous
            if cnp.PyArray_ISWRITEABLE(a):
                out = a
        if out is None:
            out = np.empty(shape, self.dtype)
        if total == 0:
            return out
        return _dispatch(out, self.code, self.n_regs, ptrs, self.kinds, n_arr + self.n_consts,
                         P, C, Q)


# ------------------------------------------------- float32 functions of arrays

DEF CHUNK = 4096    # elements per parallel part of the whole-array functions


cdef void _map_f(int op, const float* x, float* y, Py_ssize_t n, int threads) noexcept nogil:
    cdef Py_ssize_t k, start, m, n_chunks = (n + CHUNK - 1) // CHUNK
    for k in prange(n_chunks, num_threads=threads, schedule="static"):
        start = k * CHUNK
        m = n - start
        if m > CHUNK:
            m = CHUNK
        if op == OP_EXP:
            cb_vm_exp_f(x + start, y + start, m)
        elif op == OP_TANH:
            cb_vm_tanh_f(x + start, y + start, m)
        elif op == OP_SIGMOID:
            cb_vm_sigmoid_f(x + start, y + start, m)
        else:
            cb_vm_erf_f(x + start, y + start, m)


cdef object _map(str name, int op, x, out):
    cdef cnp.ndarray a, y
    cdef int threads
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError("%s: float32 only, got %s" % (name, a.dtype))
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    if out is None:
        y = np.empty_like(a)
    else:
        y = out
        if y.dtype != np.float32 or not y.flags.c_contiguous or not y.flags.writeable \
                or (<object> y).shape != (<object> a).shape:
            raise ValueError("%s: out must be a writable C-contiguous float32 array of shape %s"
                             % (name, (<object> a).shape))
    if a.size == 0:
        return y
    threads = threads_for(20.0 * a.size)
    if threads > (a.size + CHUNK - 1) // CHUNK:
        threads = <int> ((a.size + CHUNK - 1) // CHUNK)
    with nogil:
        _map_f(op, <const float*> cnp.PyArray_DATA(a), <float*> cnp.PyArray_DATA(y),
               cnp.PyArray_SIZE(a), threads)
    team_done(threads)
    return y


def exp_f32(x, out=None):
    """exp of a float32 array (any shape and strides; ``out``: a C-contiguous
    float32 array of its shape, else a new one) through the vectorised rows."""
    return _map("exp_f32", OP_EXP, x, out)


def tanh_f32(x, out=None):
    """tanh of a float32 array, as ``exp_f32``."""
    return _map("tanh_f32", OP_TANH, x, out)


def sigmoid_f32(x, out=None):
    """1 / (1 + exp(-x)) of a float32 array, as ``exp_f32``."""
    return _map("sigmoid_f32", OP_SIGMOID, x, out)


def erf_f32(x, out=None):
    """erf of a float32 array, as ``exp_f32`` (absolute error <= 2e-7)."""
    return _map("erf_f32", OP_ERF, x, out)


# ------------------------------------------------------------ concatenation

DEF CONCAT_MAX = 64


cdef inline void _copy_bytes(char* d, const char* s, Py_ssize_t n) noexcept nogil:
    # a channel run is a few dozen to a few thousand bytes: fixed 16-byte
    # moves the compiler turns into vector loads and stores, not a call
    while n >= 16:
        memcpy(d, s, 16)
        d += 16
        s += 16
        n -= 16
    if n > 0:
        memcpy(d, s, n)


cdef void _concat_rows(char* out, Py_ssize_t width, const char** src,
                       const Py_ssize_t* widths, const Py_ssize_t* offsets, int n,
                       Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    cdef Py_ssize_t r
    cdef int i
    for r in range(r0, r1):
        for i in range(n):
            _copy_bytes(out + r * width + offsets[i], src[i] + r * widths[i], widths[i])


@cython.final
cdef class ConcatLastCall:
    """``call(arrays)``: concat_last of arrays shaped as ``concat_last_call``
    was told into a new array, or None when they do not fit (a bound plan's
    step then runs its op)."""
    cdef tuple shapes, out_shape
    cdef object dtype
    cdef int typenum

    def __call__(self, list arrays):
        cdef Py_ssize_t i, n = len(self.shapes)
        if len(arrays) != n:
            return None
        for i in range(n):
            if not fits(arrays[i], self.typenum, <tuple> self.shapes[i]):
                return None
        return concat_last(arrays, np.empty(self.out_shape, self.dtype))


def concat_last_call(shapes, dtype):
    """A ConcatLastCall for C-contiguous arrays of these ``shapes`` and
    ``dtype`` (float32 or float64), concatenated along their last axis."""
    cdef ConcatLastCall call = ConcatLastCall()
    shapes = tuple([tuple([int(d) for d in s]) for s in shapes])
    dtype = np.dtype(dtype)
    nd = len(shapes[0]) if shapes else 0
    if not 1 <= len(shapes) <= CONCAT_MAX or nd < 1 or \
            dtype not in (np.float32, np.float64) or \
            any([len(s) != nd or s[:nd - 1] != shapes[0][:nd - 1] for s in shapes]):
        raise ValueError("concat_last_call: expected 1 to %d float shapes of one leading "
                         "shape, got %s %s" % (CONCAT_MAX, dtype, shapes))
    call.shapes, call.dtype = shapes, dtype
    call.typenum = cnp.NPY_FLOAT if dtype == np.float32 else cnp.NPY_DOUBLE
    call.out_shape = shapes[0][:nd - 1] + (sum([s[nd - 1] for s in shapes]),)
    return call


def concat_last(arrays, out):
    """``out[..., o_i:o_i + c_i] = arrays[i]``: the concatenation of
    C-contiguous arrays of one dtype along their last axis (the channels of
    channels_last maps) into a C-contiguous ``out`` of their dtype and
    leading shape, rows split over the team. Returns out. NumPy's
    concatenate copies such narrow runs on one thread several times slower
    than a copy (a DenseNet's dense blocks concatenate 58 times a call)."""
    if not isinstance(out, np.ndarray) or not out.flags.c_contiguous or \
            not out.flags.writeable or out.ndim < 1:
        raise ValueError("concat_last: out must be a writable C-contiguous array")
    cdef Py_ssize_t n = len(arrays), total = 0, rows, i
    if n < 1 or n > CONCAT_MAX:
        raise ValueError("concat_last: expected 1 to %d arrays, got %d" % (CONCAT_MAX, n))
    cdef Py_ssize_t nd = out.ndim
    shape = tuple(out.shape)
    lead = shape[:nd - 1]
    cdef const char* src[CONCAT_MAX]
    cdef Py_ssize_t widths[CONCAT_MAX]
    cdef Py_ssize_t offsets[CONCAT_MAX]
    cdef Py_ssize_t item = out.itemsize
    for i in range(n):
        a = arrays[i]
        if not isinstance(a, np.ndarray) or a.dtype != out.dtype or not a.flags.c_contiguous \
                or a.ndim != nd or tuple(a.shape)[:nd - 1] != lead:
            raise ValueError("concat_last: array %d must be C-contiguous %s of leading shape "
                             "%s, got %s" % (i, out.dtype, lead,
                                             "%s %s" % (getattr(a, "dtype", type(a).__name__),
                                                        getattr(a, "shape", ""))))
        src[i] = <const char*> cnp.PyArray_DATA(<cnp.ndarray> a)
        widths[i] = a.shape[nd - 1] * item
        offsets[i] = total
        total += widths[i]
    if total != shape[nd - 1] * item:
        raise ValueError("concat_last: the arrays hold %d of out's %d last-axis elements"
                         % (total // item, shape[nd - 1]))
    rows = out.size // shape[nd - 1] if shape[nd - 1] else 0
    if rows == 0 or total == 0:
        return out
    cdef char* dst = <char*> cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef int threads = threads_for(2.0 * rows * total), t
    if threads > rows:
        threads = <int> rows
    with nogil:
        if threads <= 1:
            _concat_rows(dst, total, src, widths, offsets, <int> n, 0, rows)
        else:
            for t in prange(threads, num_threads=threads, schedule='static'):
                _concat_rows(dst, total, src, widths, offsets, <int> n,
                             (rows * t) // threads, (rows * (t + 1)) // threads)
    team_done(threads)
    return out
