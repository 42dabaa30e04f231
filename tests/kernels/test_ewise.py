"""The element-wise program kernel (cyback/kernels/ewise.pyx) against NumPy.

Exact opcodes must match NumPy's ufuncs bit for bit in the same precision;
transcendental ones are compared with a float64 reference within a few units
in the last place. Operand layouts (FULL / CHAN / SCALAR), block boundaries,
in-place output and the OpenMP path (tests/conftest.py sets
CYBACK_PARALLEL_MIN_WORK=0) are covered, as are the argument checks of
``check``, ``run`` and ``Program``.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from scipy import special

from cyback.kernels import ewise, runtime

FULL, CHAN, SCALAR = ewise.KIND_FULL, ewise.KIND_CHAN, ewise.KIND_SCALAR
DTYPES = [np.float32, np.float64]
BLOCK = 1024


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


REF = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "negative": np.negative, "abs": np.abs,
    "square": np.square, "sqrt": np.sqrt, "exp": np.exp, "expm1": np.expm1, "log": np.log,
    "log1p": np.log1p, "tanh": np.tanh, "sigmoid": _sigmoid,
    "softplus": lambda x: np.logaddexp(0.0, x),
    "softsign": lambda x: x / (1.0 + np.abs(x)),
    "reciprocal": np.reciprocal,
    "select_gt": lambda a, b, c, d: np.where(a > b, c, d),
    "select_ge": lambda a, b, c, d: np.where(a >= b, c, d),
    "copy": np.copy,
    "erf": special.erf,
}


def test_reference_table_covers_every_opcode():
    assert set(REF) == set(ewise.OPCODES)
    assert ewise.EXACT <= set(ewise.OPCODES)


def _code(rows):
    return np.array(rows, dtype=np.int32).reshape(-1, 6)


def _one_op(name):
    """A program computing ``name`` of operands 0..n-1 into the output."""
    num, n_src = ewise.OPCODES[name]
    return _code([[num, -1] + (list(range(n_src)) + [0, 0, 0, 0])[:4]]), n_src


def _inputs(name, n, dtype, rng, special):
    """Operands of ``name`` of size n, in its domain (special values too for
    the exact ops: NaN, infinities, signed zeros)."""
    _, n_src = ewise.OPCODES[name]
    if name in ("sqrt", "log"):
        xs = [rng.uniform(0.01, 50.0, n)]
    elif name == "log1p":
        xs = [rng.uniform(-0.9, 50.0, n)]
    elif name in ("exp", "expm1"):
        xs = [rng.uniform(-20.0, 20.0, n)]
    elif name in ("sigmoid", "softplus", "tanh", "softsign", "erf"):
        xs = [rng.uniform(-40.0, 40.0, n) * rng.uniform(0, 1, n) ** 3]
    else:
        xs = [rng.standard_normal(n) * 3 for _ in range(n_src)]
    xs = [x.astype(dtype) for x in xs]
    if special and name in ewise.EXACT and n >= 8:
        vals = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5, np.nan], dtype)
        for i, x in enumerate(xs):
            # different special patterns per operand so NaN meets numbers
            x[:8] = np.roll(vals, 3 * i)
    if name in ("select_gt", "select_ge") and n > 4:
        xs[1][::5] = xs[0][::5]       # ties decide between > and >=
    return xs


def _check_close(name, got, xs, dtype):
    if name in ewise.EXACT:
        with np.errstate(all="ignore"):
            want = REF[name](*xs)
        assert want.dtype == dtype
        np.testing.assert_array_equal(got, want)
        if name not in ("maximum", "minimum", "abs"):
            # signed zeros too (-(0) = -0, 0 * -1 = -0); abs: see its own test
            num = ~np.isnan(want)
            np.testing.assert_array_equal(np.signbit(got[num]), np.signbit(want[num]))
    else:
        with np.errstate(all="ignore"):
            want = REF[name](*[x.astype(np.float64) for x in xs])
        eps = np.finfo(dtype).eps
        np.testing.assert_allclose(got, want.astype(dtype), rtol=8 * eps,
                                   atol=np.finfo(dtype).tiny)


def _sets():
    """The vector sets this CPU runs for the programs' loops: AVX-512, AVX2
    (the exact opcodes' wide loops, include/cyback_ewise_step.h) and the
    baseline plain loops."""
    names = ["baseline"]
    if ewise._use_avx2(True):
        names.append("avx2")
        if ewise._use_avx512(True):
            names.append("avx512")
    return names


@pytest.fixture(params=_sets())
def vector_set(request):
    ewise._use_avx2(request.param != "baseline")
    ewise._use_avx512(request.param == "avx512")
    yield request.param
    ewise._use_avx2(True)
    ewise._use_avx512(True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(ewise.OPCODES))
def test_every_opcode_matches_numpy(name, dtype, vector_set):
    rng = np.random.default_rng(7)
    n = 2 * BLOCK + 37
    code, n_src = _one_op(name)
    xs = _inputs(name, n, dtype, rng, special=True)
    out = np.full(n, 12345.0, dtype)
    res = ewise.run(out, code, n_src, xs, np.full(n_src, FULL, np.int32), 1, n, 1)
    assert res is out
    _check_close(name, out, xs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_abs_of_zero_is_positive_zero(dtype):
    code, _ = _one_op("abs")
    x = np.array([0.0, -0.0, 1.0, -1.0], dtype)
    out = np.empty_like(x)
    ewise.run(out, code, 1, [x], np.array([FULL], np.int32), 1, x.size, 1)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(np.abs(x)))
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(1 / out, 1 / np.abs(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(ewise.EXACT))
def test_exact_opcodes_give_the_same_bits_on_every_set(name, dtype):
    # signed zeros meeting each other and NaNs of both signs, at every place
    # of a vector and in the tail after the last whole one
    rng = np.random.default_rng(11)
    n = 3 * 16 + 5
    code, n_src = _one_op(name)
    vals = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1.5, -1.5], dtype)
    xs = [vals[rng.integers(0, 8, n)] for _ in range(n_src)]
    outs = []
    try:
        for vs in _sets():
            ewise._use_avx2(vs != "baseline")
            ewise._use_avx512(vs == "avx512")
            out = np.empty(n, dtype)
            with np.errstate(all="ignore"):
                ewise.run(out, code, n_src, xs, np.full(n_src, FULL, np.int32), 1, n, 1)
            outs.append(out.tobytes())
    finally:
        ewise._use_avx2(True)
        ewise._use_avx512(True)
    assert len(set(outs)) == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_maximum_minimum_propagate_nan_from_either_side(dtype, vector_set):
    a = np.array([np.nan, 1.0, np.nan, -np.inf, 0.0, np.inf], dtype)
    b = np.array([1.0, np.nan, np.nan, np.nan, np.nan, np.nan], dtype)
    for name, ref in (("maximum", np.maximum), ("minimum", np.minimum)):
        code, _ = _one_op(name)
        for x, y in ((a, b), (b, a)):
            out = np.zeros_like(x)
            ewise.run(out, code, 2, [x, y], np.array([FULL, FULL], np.int32), 1, x.size, 1)
            np.testing.assert_array_equal(out, ref(x, y))
            assert np.isnan(out).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 7, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5])
def test_sizes_around_the_block(n, dtype):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    # out = max(a * b, 0.5) - a, through two scratch registers
    op = ewise.OPCODES
    code = _code([[op["multiply"][0], 3, 0, 1, 0, 0],
                  [op["maximum"][0], 4, 3, 2, 0, 0],
                  [op["subtract"][0], -1, 4, 0, 0, 0]])
    half = np.array([0.5], dtype)
    out = np.full(n, np.nan, dtype)
    ewise.run(out, code, 5, [a, b, half], np.array([FULL, FULL, SCALAR], np.int32), 1, n, 1)
    np.testing.assert_array_equal(out, np.maximum(a * b, dtype(0.5)) - a)


def _layout_program():
    """out = select_gt(x, t, x * s + k, x - k) with x FULL, s and t CHAN, k
    SCALAR: every operand kind in one program, register reuse included."""
    op = ewise.OPCODES
    # registers: 0 x, 1 s, 2 t, 3 k; scratch 4, 5
    code = _code([[op["multiply"][0], 4, 0, 1, 0, 0],
                  [op["add"][0], 4, 4, 3, 0, 0],
                  [op["subtract"][0], 5, 0, 3, 0, 0],
                  [op["select_gt"][0], -1, 0, 2, 4, 5]])
    kinds = np.array([FULL, CHAN, CHAN, SCALAR], np.int32)
    return code, 6, kinds


def _layout_ref(x, s, t, k, P, C, Q):
    x3 = x.reshape(P, C, Q)
    s3, t3 = s.reshape(1, C, 1), t.reshape(1, C, 1)
    return np.where(x3 > t3, x3 * s3 + k[0], x3 - k[0]).reshape(-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("P,C,Q", [
    (1, 1, 1), (2, 3, 1), (5, 7, 1), (300, 7, 1),     # Q == 1: channels last
    (3, 1500, 1), (2, BLOCK + 1, 1), (0, 4, 1),       # C over one block, empty
    (2, 3, 5), (1, 4, 1), (4, 3, 1500), (2, 2, BLOCK),  # Q > 1: channels first
    (3, 5, 2 * BLOCK + 1), (3, 0, 5),
])
def test_channel_and_scalar_operands(P, C, Q, dtype):
    rng = np.random.default_rng(P * 1000 + C * 10 + Q)
    n = P * C * Q
    x = rng.standard_normal(n).astype(dtype)
    s = rng.standard_normal(C).astype(dtype)
    t = (rng.standard_normal(C) * 0.5).astype(dtype)
    k = np.array([0.75], dtype)
    code, n_regs, kinds = _layout_program()
    out = np.empty(n, dtype)
    ewise.run(out, code, n_regs, [x, s, t, k], kinds, P, C, Q)
    np.testing.assert_array_equal(out, _layout_ref(x, s, t, k, P, C, Q))


@pytest.mark.parametrize("dtype", DTYPES)
def test_output_may_alias_a_full_operand(dtype):
    rng = np.random.default_rng(3)
    P, C, Q = 3, 4, 700
    x = rng.standard_normal(P * C * Q).astype(dtype)
    s = rng.standard_normal(C).astype(dtype)
    t = rng.standard_normal(C).astype(dtype)
    k = np.array([-1.25], dtype)
    want = _layout_ref(x, s, t, k, P, C, Q)
    code, n_regs, kinds = _layout_program()
    res = ewise.run(x, code, n_regs, [x, s, t, k], kinds, P, C, Q)
    assert res is x
    np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("P,C,Q", [(97, 13, 1), (5, 6, 333), (1, 1, 10 * BLOCK + 3)])
def test_parallel_blocks_equal_one_thread(P, C, Q):
    rng = np.random.default_rng(11)
    n = P * C * Q
    x = rng.standard_normal(n)
    s, t = rng.standard_normal(C), rng.standard_normal(C)
    k = np.array([0.1])
    code, n_regs, kinds = _layout_program()
    old = runtime.get_max_threads()
    results = []
    try:
        for nt in (1, 3, 4):
            runtime.set_num_threads(nt)
            out = np.empty(n)
            ewise.run(out, code, n_regs, [x, s, t, k], kinds, P, C, Q)
            results.append(out)
    finally:
        runtime.set_num_threads(old)
    want = _layout_ref(x, s, t, k, P, C, Q)
    for out in results:
        np.testing.assert_array_equal(out, want)


# ------------------------------------------------------------------ Program

def _add_program(kinds, consts=(), axis=None, inplace=None, dtype="float32"):
    op = ewise.OPCODES
    code = _code([[op["add"][0], -1, 0, 1, 0, 0]])
    return ewise.Program(code, len(kinds) + len(consts), list(kinds) + [SCALAR] * len(consts),
                         list(consts), axis, inplace, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_program_full_chan_scalar_and_consts(dtype):
    rng = np.random.default_rng(5)
    op = ewise.OPCODES
    # out = (x + b) * 2.5, b on axis -3 (channels_first, 4-D)
    code = _code([[op["add"][0], 3, 0, 1, 0, 0],
                  [op["multiply"][0], -1, 3, 2, 0, 0]])
    prog = ewise.Program(code, 4, [FULL, CHAN, SCALAR], [2.5], -3, None, dtype)
    x = rng.standard_normal((2, 3, 4, 5)).astype(dtype)
    b = rng.standard_normal((3, 1, 1)).astype(dtype)
    out = prog([x, b])
    assert out.shape == x.shape and out.dtype == dtype
    np.testing.assert_array_equal(out, (x + b) * dtype(2.5))
    # a batch of 0 and a batch of 1
    for batch in (0, 1):
        xb = x[:batch].copy()
        np.testing.assert_array_equal(prog([xb, b]), (xb + b) * dtype(2.5))


def test_program_numpy_scalar_and_noncontiguous_operands():
    rng = np.random.default_rng(6)
    prog = _add_program([FULL, SCALAR])
    x = rng.standard_normal((6, 4)).astype(np.float32).T       # not C-contiguous
    out = prog([x, np.float32(1.5)])
    np.testing.assert_array_equal(out, x + np.float32(1.5))
    assert not np.shares_memory(out, x)
    prog = _add_program([FULL, FULL])
    y = rng.standard_normal((4, 12)).astype(np.float32)[:, ::2]
    np.testing.assert_array_equal(prog([x, y]), x + y)


def test_program_inplace_writes_into_a_writeable_operand_only():
    rng = np.random.default_rng(8)
    prog = _add_program([FULL, FULL], inplace=0)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y = rng.standard_normal((3, 5)).astype(np.float32)
    want = x + y
    out = prog([x, y])
    assert out is x
    np.testing.assert_array_equal(out, want)
    # read-only operand: a new array, the operand is left alone
    x = rng.standard_normal((3, 5)).astype(np.float32)
    x.flags.writeable = False
    keep = x.copy()
    out = prog([x, y])
    assert out is not x
    np.testing.assert_array_equal(x, keep)
    np.testing.assert_array_equal(out, keep + y)


def test_program_declines_operands_that_do_not_fit():
    prog = _add_program([FULL, CHAN], axis=-1)
    x = np.ones((3, 4), np.float32)
    assert prog([x, np.ones(5, np.float32)]) is None            # channel size
    assert prog([x.astype(np.float64), np.ones(4)]) is None     # dtype
    prog = _add_program([FULL, FULL])
    assert prog([x, np.ones((1, 4), np.float32)]) is None       # broadcasting full operand
    assert prog([x, np.ones((4, 3), np.float32)]) is None
    np.testing.assert_array_equal(prog([x, x]), x + x)


def test_program_rejects_bad_arguments():
    prog = _add_program([FULL, FULL])
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="ewise"):
        prog([x])
    with pytest.raises(TypeError):
        prog((x, x))
    with pytest.raises(TypeError, match="float32 or float64"):
        _add_program([FULL, FULL], dtype="int32")
    with pytest.raises(ValueError, match="ewise"):
        ewise.Program(_code([[0, -1, 0, 5, 0, 0]]), 2, [FULL, FULL], [], None, None, "float32")
    with pytest.raises(ValueError, match="ewise"):
        ewise.Program(_code([[0, -1, 0, 1, 0, 0]]), 1, [FULL, FULL], [], None, None, "float32")


def test_program_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="ewise"):
        _add_program([FULL, 7])


def _in_subprocess(src):
    """Run ``src`` (which may crash) in a fresh interpreter with ``ewise``
    imported (through the package: it cimports cyback.kernels.runtime)."""
    head = "from cyback.kernels import ewise\n"
    return subprocess.run([sys.executable, "-c", head + textwrap.dedent(src)],
                          capture_output=True, text=True, timeout=60)


def test_program_rejects_an_inplace_index_out_of_range():
    r = _in_subprocess("""
        import numpy as np
        code = np.array([[ewise.OPCODES['add'][0], -1, 0, 1, 0, 0]], np.int32)
        try:
            p = ewise.Program(code, 2, [0, 0], [], None, 5, 'float32')
            p([np.ones(3, np.float32), np.ones(3, np.float32)])
        except ValueError as e:
            print('ValueError', e)
        """)
    assert r.returncode == 0 and "ValueError" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_program_rejects_a_nonnegative_axis():
    r = _in_subprocess("""
        import numpy as np
        code = np.array([[ewise.OPCODES['add'][0], -1, 0, 1, 0, 0]], np.int32)
        try:
            ewise.Program(code, 2, [0, 1], [], 0, None, 'float32')
        except ValueError as e:
            print('ValueError', e)
        """)
    assert r.returncode == 0 and "ValueError" in r.stdout, (r.returncode, r.stdout, r.stderr)


# ------------------------------------------------------------------ check / run

def test_check_accepts_a_good_program():
    code, n_src = _one_op("select_gt")
    ewise.check(code, 4, 4)
    ewise.check(_code([[0, 2, 0, 1, 0, 0], [6, -1, 2, 0, 0, 0]]), 3, 2)


@pytest.mark.parametrize("code,n_regs,n_ops", [
    (np.zeros((0, 6), np.int32), 2, 2),                   # no instruction
    (_code([[0, -1, 0, 1, 0, 0]]), 2, 3),                 # more operands than registers
    (_code([[0, -1, 0, 1, 0, 0]]), ewise.MAX_REGISTERS + 1, 2),
    (np.zeros((1, 5), np.int32), 2, 2),                   # rows of 5
    (_code([[0, 1, 0, 1, 0, 0]]), 2, 2),                  # writes an operand register
    (_code([[0, 3, 0, 1, 0, 0]]), 3, 2),                  # dst past the registers
    (_code([[0, -2, 0, 1, 0, 0]]), 2, 2),
    (_code([[0, -1, 0, 2, 0, 0]]), 2, 2),                 # source past the registers
    (_code([[0, -1, -1, 1, 0, 0]]), 2, 2),
    (_code([[len(ewise.OPCODES), 2, 0, 1, 0, 0]]), 3, 2),  # unknown opcode
    (_code([[-1, 2, 0, 1, 0, 0]]), 3, 2),
])
def test_check_rejects_bad_programs(code, n_regs, n_ops):
    with pytest.raises(ValueError, match="ewise"):
        ewise.check(code, n_regs, n_ops)


@pytest.mark.parametrize("opcode", [len(ewise.OPCODES), 99, -1])
def test_check_rejects_unknown_opcode_writing_the_output(opcode):
    with pytest.raises(ValueError, match="ewise"):
        ewise.check(_code([[opcode, -1, 0, 1, 0, 0]]), 2, 2)


def test_check_rejects_wrong_code_arrays():
    with pytest.raises(ValueError):
        ewise.check(np.zeros((1, 6)), 2, 2)                       # float code
    with pytest.raises(ValueError):
        ewise.check(np.asfortranarray(np.zeros((2, 6), np.int32)), 2, 2)


def test_run_rejects_bad_operands():
    code, _ = _one_op("add")
    x = np.ones(6, np.float32)
    full2 = np.array([FULL, FULL], np.int32)
    with pytest.raises(ValueError, match="kinds"):
        ewise.run(np.empty(6, np.float32), code, 2, [x, x], np.array([FULL], np.int32), 1, 6, 1)
    with pytest.raises(ValueError, match="out"):
        ewise.run(np.empty(12, np.float32)[::2], code, 2, [x, x], full2, 1, 6, 1)
    with pytest.raises(ValueError, match="out"):
        ewise.run(np.empty(5, np.float32), code, 2, [x, x], full2, 1, 6, 1)
    with pytest.raises(ValueError, match="operand 1"):
        ewise.run(np.empty(6, np.float32), code, 2, [x, x.astype(np.float64)], full2, 1, 6, 1)
    with pytest.raises(ValueError, match="operand 1"):
        ewise.run(np.empty(6, np.float32), code, 2, [x, np.ones(12, np.float32)[::2]],
                  full2, 1, 6, 1)
    with pytest.raises(ValueError, match="operand 1"):
        ewise.run(np.empty(6, np.float32), code, 2, [x, np.ones(2, np.float32)],
                  np.array([FULL, CHAN], np.int32), 2, 3, 1)
    with pytest.raises(ValueError, match="operand 1"):
        ewise.run(np.empty(6, np.float32), code, 2, [x, np.ones(2, np.float32)],
                  np.array([FULL, SCALAR], np.int32), 2, 3, 1)
    with pytest.raises(ValueError, match="ewise"):
        ewise.run(np.empty(6, np.float32), code, 2, [x, x, x], np.array([FULL] * 3, np.int32),
                  1, 6, 1)
    i = np.ones(6, np.int32)
    with pytest.raises(TypeError, match="float32 or float64"):
        ewise.run(np.empty(6, np.int32), code, 2, [i, i], full2, 1, 6, 1)


def test_run_rejects_an_unknown_kind():
    code, _ = _one_op("add")
    x = np.ones(6, np.float32)
    with pytest.raises(ValueError, match="ewise"):
        ewise.run(np.empty(6, np.float32), code, 2, [x, np.ones(1, np.float32)],
                  np.array([FULL, 7], np.int32), 1, 6, 1)


# ------------------------------------------------------------ concat_last

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,widths", [((1, 56, 56), (64, 32)), ((3, 5), (1, 3, 17)),
                                         ((2, 7, 7), (992, 32)), ((0, 4), (3, 5)),
                                         ((4,), (0, 6)), ((9, 11), (5,) * 12)])
def test_concat_last_matches_numpy(dtype, lead, widths):
    rng = np.random.default_rng(sum(widths))
    xs = [rng.standard_normal(lead + (w,)).astype(dtype) for w in widths]
    want = np.concatenate(xs, axis=-1)
    saved = runtime.get_max_threads()
    try:
        for threads in (1, 2, 3):
            runtime.set_num_threads(threads)
            out = np.full(want.shape, 7.0, dtype)
            assert ewise.concat_last(xs, out) is out
            assert out.tobytes() == want.tobytes()
    finally:
        runtime.set_num_threads(saved)


def test_concat_last_bad_arguments():
    a, b = np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="writable C-contiguous"):
        ewise.concat_last([a, b], np.zeros((2, 14), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="array 1 must be C-contiguous float32"):
        ewise.concat_last([a, b.astype(np.float64)], np.zeros((2, 7), np.float32))
    with pytest.raises(ValueError, match="array 1"):
        ewise.concat_last([a, np.zeros((3, 4), np.float32)], np.zeros((2, 7), np.float32))
    with pytest.raises(ValueError, match="array 0"):
        ewise.concat_last([np.zeros((2, 6), np.float32)[:, ::2], b],
                          np.zeros((2, 7), np.float32))
    with pytest.raises(ValueError, match="hold 7 of out's 8"):
        ewise.concat_last([a, b], np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError, match="1 to 64 arrays"):
        ewise.concat_last([], np.zeros((2, 0), np.float32))


# ------------------------------------------------ concat_last's prepared call

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", [[(2, 3, 4), (2, 3, 1)], [(1, 7)], [(5, 2), (5, 0), (5, 9)],
                                    [(1, 4, 4, 3)] * 9])
def test_concat_last_call_gives_numpys_concatenation(dtype, shapes):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    call = ewise.concat_last_call(shapes, dtype)
    got = call(arrays)
    np.testing.assert_array_equal(got, np.concatenate(arrays, axis=-1))
    assert got.dtype == dtype


def test_concat_last_call_declines_arrays_that_do_not_fit():
    a = np.ones((2, 3), np.float32)
    b = np.zeros((2, 5), np.float32)
    call = ewise.concat_last_call([(2, 3), (2, 5)], np.float32)
    assert call([a, b]).shape == (2, 8)
    assert call([a]) is None                                   # fewer arrays
    assert call([a, b, b]) is None                             # more
    assert call([a, np.zeros((2, 4), np.float32)]) is None     # another width
    assert call([a, b.astype(np.float64)]) is None             # another dtype
    assert call([a, np.zeros((5, 2), np.float32).T]) is None   # not C-contiguous
    assert call([a, "b"]) is None


@pytest.mark.parametrize("shapes,dtype", [([], np.float32), ([(2, 3), (3, 3)], np.float32),
                                          ([(2, 3), (2, 3, 1)], np.float32),
                                          ([(2, 3)], np.int32), ([()], np.float32)])
def test_concat_last_call_rejects_bad_shapes(shapes, dtype):
    with pytest.raises(ValueError, match="concat_last_call"):
        ewise.concat_last_call(shapes, dtype)
