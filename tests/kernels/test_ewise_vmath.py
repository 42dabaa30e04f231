"""The vectorised float32 exp, tanh, sigmoid and erf (include/cyback_vmath.h,
through cyback.kernels.ewise's exp_f32 / tanh_f32 / sigmoid_f32 / erf_f32 and
the element-wise programs) against float64 NumPy / SciPy references.

Every instruction set the CPU has runs (AVX-512, AVX2 + FMA, baseline); the
error bounds are asserted on dense grids, random values and the special
values (signed zeros, denormals, infinities, NaN, the overflow and underflow
borders). An element's result must not depend on where it falls in an array
(masked tails), on the thread count or on AVX-512 against AVX2.
"""
import numpy as np
import pytest
from scipy import special

from cyback.kernels import ewise, runtime

from instruction_sets import instruction_set

SETS = ["avx512", "avx2", "baseline"]
FUNCS = {
    "exp": (ewise.exp_f32, np.exp),
    "tanh": (ewise.tanh_f32, np.tanh),
    "sigmoid": (ewise.sigmoid_f32, special.expit),
    "erf": (ewise.erf_f32, special.erf),
}
TINY = np.finfo(np.float32).tiny
DENORM = np.float32(2.0 ** -149)


def _last_below(border):
    """The largest float32 <= border (a float64)."""
    x = np.float32(border)
    while float(x) > border:
        x = np.nextafter(x, np.float32(-np.inf))
    return x


# the largest float32 whose exp is finite (exp(x) below FLT_MAX + half its
# spacing), and the largest whose exp rounds to 0 (exp(x) <= 2^-150, the
# half-way point to the smallest denormal, which rounds to even: 0)
EXP_MAX = _last_below(128 * np.log(2) + np.log1p(-2.0 ** -25))
EXP_ZERO = _last_below(-150 * np.log(2))


@pytest.fixture(params=SETS)
def iset(request):
    with instruction_set(ewise, request.param) as which:
        yield which


def _ulps(got, want):
    """|got - want| in units of the last place of float32 at ``want`` (the
    denormal spacing below the normal range)."""
    w32 = np.abs(want).astype(np.float32)
    sp = np.maximum(np.spacing(w32).astype(np.float64), 2.0 ** -149)
    return np.abs(got.astype(np.float64) - want) / sp


def _grid(name):
    rng = np.random.default_rng(3)
    lo, hi = {"exp": (-110, 95), "tanh": (-12, 12), "sigmoid": (-110, 40),
              "erf": (-6, 6)}[name]
    parts = [np.linspace(lo, hi, 400_001), rng.uniform(-2, 2, 50_000),
             np.geomspace(1e-30, 1, 20_000), -np.geomspace(1e-30, 1, 20_000)]
    return np.concatenate(parts).astype(np.float32)


def _reference(name, x):
    with np.errstate(all="ignore"):
        return FUNCS[name][1](x.astype(np.float64))


# ulp bound on normal results; erf: absolute bound, and ulps where |x| < 0.92
ULP_BOUND = {"exp": 1.5, "tanh": 2.0, "sigmoid": 3.0}


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_error_bounds_on_dense_grids(name, iset):
    x = _grid(name)
    got = FUNCS[name][0](x)
    want = _reference(name, x)
    assert got.dtype == np.float32 and got.shape == x.shape
    with np.errstate(over="ignore"):
        finite = np.isfinite(want.astype(np.float32))
    np.testing.assert_array_equal(np.isfinite(got), finite)
    u = _ulps(got[finite], want[finite])
    if name == "erf":
        assert np.max(np.abs(got - want)) <= 2e-7
        small = np.abs(x) < 0.92
        assert np.max(_ulps(got[small], want[small])) <= 2.5
    else:
        assert np.max(u) <= ULP_BOUND[name], float(x[finite][np.argmax(u)])
        normal = np.abs(want[finite]) >= TINY
        rel = np.abs(got[finite][normal] - want[finite][normal]) / np.abs(want[finite][normal])
        assert np.max(rel) <= 3e-7


def test_exp_special_values(iset):
    x = np.array([0.0, -0.0, DENORM, -DENORM, TINY, 1e-30, -np.inf, np.inf, np.nan,
                  EXP_MAX, np.nextafter(EXP_MAX, np.float32(np.inf)), 1000.0,
                  np.nextafter(EXP_ZERO, np.float32(np.inf)), EXP_ZERO, -1000.0,
                  -87.0, -100.0, -103.0], np.float32)
    y = ewise.exp_f32(x)
    np.testing.assert_array_equal(y[:6], 1.0)
    assert y[6] == 0.0 and not np.signbit(y[6])
    assert y[7] == np.inf and np.isnan(y[8])
    assert np.isfinite(y[9]) and y[10] == np.inf and y[11] == np.inf
    assert y[12] > 0 and y[13] == 0.0 and y[14] == 0.0
    # normal, then denormal results of the gradual underflow: within one of
    # their units (the denormal spacing)
    assert np.all(_ulps(y[15:], np.exp(x[15:].astype(np.float64))) <= 1.0)


def test_tanh_special_values(iset):
    x = np.array([0.0, -0.0, DENORM, -DENORM, TINY, 1e-30, -1e-20, 9.1, -9.1, 50.0, -1e30,
                  np.inf, -np.inf, np.nan], np.float32)
    y = ewise.tanh_f32(x)
    np.testing.assert_array_equal(y[:7], x[:7])          # tanh(x) = x next to 0
    np.testing.assert_array_equal(np.signbit(y[:7]), np.signbit(x[:7]))
    np.testing.assert_array_equal(y[7:13], np.sign(x[7:13]))
    assert np.isnan(y[13])


def test_sigmoid_special_values(iset):
    x = np.array([0.0, -0.0, np.inf, -np.inf, 20.0, 1000.0, -1000.0, -88.0, -100.0,
                  -103.0, np.nan], np.float32)
    y = ewise.sigmoid_f32(x)
    np.testing.assert_array_equal(y[:7], [0.5, 0.5, 1.0, 0.0, 1.0, 1.0, 0.0])
    # large negative x: the tiny (denormal) values, not 0
    want = special.expit(x[7:10].astype(np.float64))
    assert np.all(y[7:10] > 0) and np.all(_ulps(y[7:10], want) <= 1.0)
    assert np.isnan(y[10])


def test_erf_special_values(iset):
    x = np.array([0.0, -0.0, DENORM, -DENORM, TINY, 1e-30, -1e-20, 4.0, -4.0, 3.95, 10.0,
                  -1e30, np.inf, -np.inf, np.nan], np.float32)
    y = ewise.erf_f32(x)
    np.testing.assert_array_equal(np.signbit(y[:7]), np.signbit(x[:7]))
    assert y[0] == 0.0 and y[1] == 0.0
    want = special.erf(x[2:7].astype(np.float64))
    assert np.all(_ulps(y[2:7], want) <= 1.0)
    np.testing.assert_array_equal(y[7:14], [1, -1, 1, 1, -1, 1, -1])
    assert np.isnan(y[14])


@pytest.mark.parametrize("name", ["tanh", "erf"])
def test_odd_symmetry_is_exact(name, iset):
    x = _grid(name)
    f = FUNCS[name][0]
    np.testing.assert_array_equal(f(-x), -f(x))


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_result_does_not_depend_on_the_place_in_the_array(name, iset):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(300) * 6).astype(np.float32)
    f = FUNCS[name][0]
    whole = f(x)
    for n in (1, 7, 15, 17, 33):
        for start in (0, 1, 5, 16, 250):
            np.testing.assert_array_equal(f(x[start:start + n]), whole[start:start + n])
    # non-contiguous input (copied first), and an output array given
    np.testing.assert_array_equal(f(x[::3]), whole[::3])
    np.testing.assert_array_equal(f(x.reshape(20, 15).T), whole.reshape(20, 15).T)
    out = np.empty_like(x)
    assert f(x, out=out) is out
    np.testing.assert_array_equal(out, whole)


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_same_bits_on_avx512_and_avx2_and_any_thread_count(name):
    x = _grid(name)
    f = FUNCS[name][0]
    runs = {}
    for which in ("avx512", "avx2"):
        if which == "avx512" and not ewise._use_avx512(True):
            continue
        with instruction_set(ewise, which):
            for threads in (1, 2):
                runtime.force_team_threads(threads)
                try:
                    runs[which, threads] = f(x)
                finally:
                    runtime.force_team_threads(None)
    if not runs:
        pytest.skip("needs avx2: this CPU has no AVX2 + FMA")
    first = next(iter(runs.values()))
    for y in runs.values():
        np.testing.assert_array_equal(y, first)


def test_baseline_results_are_the_same_at_any_thread_count():
    x = _grid("erf")
    with instruction_set(ewise, "baseline"):
        runtime.force_team_threads(1)
        try:
            one = ewise.erf_f32(x)
        finally:
            runtime.force_team_threads(None)
        np.testing.assert_array_equal(ewise.erf_f32(x), one)


def test_programs_use_the_same_rows():
    """The element-wise programs' exp/tanh/sigmoid/erf opcodes give the bits of
    the whole-array functions, whatever the block an element falls in."""
    rng = np.random.default_rng(5)
    n = 3 * 1024 + 7
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    for name, (f, _) in FUNCS.items():
        code = np.array([[ewise.OPCODES[name][0], -1, 0, 0, 0, 0]], np.int32)
        out = np.empty_like(x)
        ewise.run(out, code, 1, [x], np.array([ewise.KIND_FULL], np.int32), 1, n, 1)
        np.testing.assert_array_equal(out, f(x))


def test_gelu_program():
    """0.5 * x * (1 + erf(x / sqrt(2))) as one program, against float64."""
    op = ewise.OPCODES
    # registers: 0 x, 1 1/sqrt(2), 2 one, 3 half, 4.. scratch
    code = np.array([[op["multiply"][0], 4, 0, 1, 0, 0],
                     [op["erf"][0], 4, 4, 0, 0, 0],
                     [op["add"][0], 4, 4, 2, 0, 0],
                     [op["multiply"][0], 4, 4, 0, 0, 0],
                     [op["multiply"][0], -1, 4, 3, 0, 0]], np.int32)
    x = np.linspace(-8, 8, 10_001).astype(np.float32)
    consts = [np.array([v], np.float32) for v in (1 / np.sqrt(2), 1.0, 0.5)]
    kinds = np.array([ewise.KIND_FULL] + [ewise.KIND_SCALAR] * 3, np.int32)
    out = np.empty_like(x)
    ewise.run(out, code, 5, [x] + consts, kinds, 1, x.size, 1)
    x64 = x.astype(np.float64)
    want = 0.5 * x64 * (1 + special.erf(x64 / np.sqrt(2)))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=2e-7 * 8)


def test_erf_is_not_exact():
    """Training plans fuse only NumPy-bit-identical opcodes."""
    assert "erf" in ewise.OPCODES
    assert not {"exp", "tanh", "sigmoid", "erf"} & ewise.EXACT


@pytest.mark.parametrize("f", [ewise.exp_f32, ewise.tanh_f32, ewise.sigmoid_f32, ewise.erf_f32])
def test_arguments(f):
    with pytest.raises(TypeError, match="float32 only"):
        f(np.ones(3))
    with pytest.raises(ValueError, match="out must be"):
        f(np.ones(3, np.float32), out=np.empty(4, np.float32))
    with pytest.raises(ValueError, match="out must be"):
        f(np.ones(4, np.float32), out=np.empty(8, np.float32)[::2])
    assert f(np.zeros((0, 3), np.float32)).shape == (0, 3)
    y = f(np.float32(0.5))
    assert y.shape == () and y.dtype == np.float32
