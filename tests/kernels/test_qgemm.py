"""cyback.kernels.qgemm: the int8 product against an exact NumPy integer
reference on every instruction set the CPU has, the requantizing epilogue's
rounding and saturation, activation quantization, the uint8 patch matrix,
thread and team invariance, and bad arguments."""
import contextlib

import numpy as np
import pytest

import cyback as K
from cyback.kernels import qgemm, runtime

SETS = qgemm.INSTRUCTION_SETS


@contextlib.contextmanager
def instruction_set(name):
    """Run the kernels with at most set ``name``; skip when the CPU lacks it."""
    if name not in qgemm.instruction_sets():
        pytest.skip("needs %s: this CPU (or this build's compiler) has no %s" % (name, name))
    try:
        assert qgemm._use_instruction_set(name) == name
        yield
    finally:
        qgemm._use_instruction_set(None)


@pytest.fixture(params=SETS)
def each_set(request):
    with instruction_set(request.param):
        yield request.param


# ---------------------------------------------------------------- references

def ref_sums(a, w):
    return a.astype(np.int64) @ w.astype(np.int64)


def ref_gemm(a, w, sa, za, sb, bias=None, act=None, out_scale=None, out_zero=None,
             residual=None):
    """The documented epilogue, step by step in float32."""
    d = ref_sums(a, w) - za * w.astype(np.int64).sum(axis=0)
    assert np.abs(d).max(initial=0) < 2 ** 31
    y = d.astype(np.int32).astype(np.float32) * (np.float32(sa) * np.asarray(sb, np.float32))
    if bias is not None:
        y = y + np.asarray(bias, np.float32)
    if residual is not None:
        y = y + residual
    if act in ("relu", "relu6"):
        y = np.maximum(np.float32(0), y)
    if act == "relu6":
        y = np.minimum(np.float32(6), y)
    if out_scale is None:
        return y
    return ref_codes(y / np.float32(out_scale), out_zero)


def ref_codes(v, zero):
    lo, hi = np.float32(-zero), np.float32(255 - zero)
    v = np.where(np.isnan(v), lo, v)
    return (np.rint(np.clip(v, lo, hi)).astype(np.int32) + zero).astype(np.uint8)


def ref_quantize(x, scale, zero):
    with np.errstate(over="ignore"):
        return ref_codes(np.asarray(x, np.float32) / np.float32(scale), zero)


def same_bits(x, y):
    x, y = np.asarray(x), np.asarray(y)
    return x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()


def rand_case(rng, m, k, n, narrow=False):
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    lo, hi = (-64, 64) if narrow else (-128, 128)
    w = rng.integers(lo, hi, (k, n), dtype=np.int8)
    sb = rng.uniform(1e-3, 2e-2, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return a, w, sb, bias


SHAPES = [(1, 1, 1), (1, 3, 5), (1, 64, 32), (1, 255, 47), (2, 7, 16), (3, 5, 33),
          (5, 9, 31), (7, 13, 48), (8, 16, 64), (9, 4, 17), (13, 130, 70), (17, 27, 3),
          (33, 61, 96), (64, 577, 65), (100, 36, 130)]


# ---------------------------------------------------------------- the product

@pytest.mark.parametrize("narrow", [False, True], ids=["wide", "narrow"])
def test_gemm_matches_integer_reference(each_set, rng, narrow):
    for m, k, n in SHAPES:
        a, w, sb, bias = rand_case(rng, m, k, n, narrow)
        packed = qgemm.pack_weights(w)
        za = int(rng.integers(0, 256))
        for act in (None, "relu", "relu6"):
            got = qgemm.gemm(a, packed, 0.03, za, sb, bias, act)
            want = ref_gemm(a, w, 0.03, za, sb, bias, act)
            assert same_bits(got, want), (each_set, m, k, n, act)
        got = qgemm.gemm(a, packed, 0.03, za, sb, None, None, out_scale=0.05,
                         out_zero_point=37)
        assert same_bits(got, ref_gemm(a, w, 0.03, za, sb, None, None, 0.05, 37)), (m, k, n)


def test_every_set_gives_the_same_bits(rng):
    a, w, sb, bias = rand_case(rng, 37, 301, 83)
    packed = qgemm.pack_weights(w)
    results = []
    for name in qgemm.instruction_sets():
        with instruction_set(name):
            results.append(qgemm.gemm(a, packed, 0.02, 128, sb, bias, "relu"))
            results.append(qgemm.gemm(a, packed, 0.02, 128, sb, bias, "relu", 0.04, 3))
    for r in results[2::2]:
        assert same_bits(r, results[0])
    for r in results[3::2]:
        assert same_bits(r, results[1])


def test_extreme_sums_at_the_longest_k(each_set):
    # The largest magnitudes the int32 sums can reach, at MAX_K: every
    # activation 255 against every weight -128 (and 127), and zero point 255
    # against activations 0.
    k = qgemm.MAX_K
    w = np.empty((k, 18), dtype=np.int8)
    w[:, :9] = -128
    w[:, 9:] = 127
    packed = qgemm.pack_weights(w)
    sb = np.ones(18, np.float32)
    for a_val, za in ((255, 0), (0, 255), (255, 255), (128, 0)):
        a = np.full((2, k), a_val, dtype=np.uint8)
        got = qgemm.gemm(a, packed, 1.0, za, sb)
        want = ref_gemm(a, w, 1.0, za, sb)
        assert same_bits(got, want), (a_val, za)
    assert qgemm.gemm(np.full((1, k), 255, np.uint8), packed, 1.0, 0, sb)[0, 0] == \
        np.float32(-255 * 128 * k)


def test_narrow_weights_at_their_edges(each_set, rng):
    # [-64, 63] takes AVX2's single vpmaddubsw; one weight outside switches
    # the whole matrix to the split activations. Both must be exact with
    # activations of 255, where an unsplit pair would saturate.
    for w_lo, w_hi in ((-64, 63), (-65, 63), (-64, 64), (-128, 127)):
        w = np.where(rng.random((40, 20)) < 0.5, w_lo, w_hi).astype(np.int8)
        a = np.full((5, 40), 255, dtype=np.uint8)
        a[1] = 254
        a[2] = rng.integers(0, 256, 40)
        packed = qgemm.pack_weights(w)
        sb = np.full(20, 0.5, np.float32)
        assert same_bits(qgemm.gemm(a, packed, 1.0, 0, sb), ref_gemm(a, w, 1.0, 0, sb))


def test_k_not_a_multiple_of_four_ignores_bytes_past_k(each_set, rng):
    # Rows with a stride longer than K: the bytes after each row's K values
    # (up to the next group of four) must not enter the sums.
    for k in (1, 2, 3, 5, 6, 7, 9, 31):
        wide = rng.integers(0, 256, (11, k + 5), dtype=np.uint8)
        a = wide[:, :k]
        w = rng.integers(-128, 128, (k, 21), dtype=np.int8)
        sb = np.full(21, 0.25, np.float32)
        got = qgemm.gemm(a, qgemm.pack_weights(w), 1.0, 3, sb)
        assert same_bits(got, ref_gemm(np.ascontiguousarray(a), w, 1.0, 3, sb)), k


def test_empty_products(each_set):
    w = np.ones((4, 5), np.int8)
    sb = np.ones(5, np.float32)
    out = qgemm.gemm(np.zeros((0, 4), np.uint8), qgemm.pack_weights(w), 1.0, 0, sb)
    assert out.shape == (0, 5) and out.dtype == np.float32
    out = qgemm.gemm(np.zeros((3, 4), np.uint8), qgemm.pack_weights(np.ones((4, 0), np.int8)),
                     1.0, 0, np.ones(0, np.float32), out_scale=1.0, out_zero_point=0)
    assert out.shape == (3, 0) and out.dtype == np.uint8
    # K = 0: every sum is 0, the output is act(bias)
    bias = np.array([-1.5, 0.0, 2.5, 7.0, np.nan], np.float32)
    out = qgemm.gemm(np.zeros((2, 0), np.uint8), qgemm.pack_weights(np.ones((0, 5), np.int8)),
                     1.0, 9, sb, bias, "relu6")
    want = np.array([0.0, 0.0, 2.5, 6.0, np.nan], np.float32)
    assert same_bits(out, np.stack([want, want]))


def test_requantization_rounds_half_to_even_and_saturates(each_set):
    # One weight of 1 per column and scales of 1: y = a - za + bias exactly,
    # so the bias walks y / out_scale across halves and both edges.
    n = 16 * 3 + 5
    w = np.ones((1, n), np.int8)
    packed = qgemm.pack_weights(w)
    sb = np.ones(n, np.float32)
    bias = np.linspace(-300.5, 300.5, n).astype(np.float32)
    bias[:8] = [0.5, 1.5, 2.5, -0.5, -1.5, 254.5, 255.5, -255.5]
    bias[8:12] = [np.nan, np.inf, -np.inf, 1e30]
    a = np.array([[0], [1], [128], [255]], np.uint8)
    for zo in (0, 1, 128, 255):
        for act in (None, "relu", "relu6"):
            got = qgemm.gemm(a, packed, 1.0, 0, sb, bias, act, out_scale=1.0,
                             out_zero_point=zo)
            want = ref_gemm(a, w, 1.0, 0, sb, bias, act, 1.0, zo)
            assert same_bits(got, want), (zo, act)
    got = qgemm.gemm(a[:1], packed, 1.0, 0, sb, bias, None, out_scale=1.0, out_zero_point=0)
    assert list(got[0, :8]) == [0, 2, 2, 0, 0, 254, 255, 0]
    assert list(got[0, 8:12]) == [0, 255, 0, 255]   # NaN -> 0, +-inf saturate


@pytest.mark.parametrize("m,n", [(1, 5), (7, 16), (13, 37), (40, 70)])
def test_residual_added_after_the_bias(each_set, rng, m, n):
    # partial panels read only the residual's valid columns; a residual with
    # rows longer than N (a view) is read in place
    a, w, sb, bias = rand_case(rng, m, 23, n)
    wide = rng.standard_normal((m, n + 3)).astype(np.float32) * 4
    res = wide[:, 2:n + 2]
    vectors = qgemm.epilogue_vectors(0.03, sb, bias)
    packed = qgemm.pack_weights(w)
    for act in (None, "relu", "relu6"):
        got = qgemm.gemm_prepared(a, packed, vectors, 9, act, residual=res)
        assert same_bits(got, ref_gemm(a, w, 0.03, 9, sb, bias, act, residual=res)), act
        got = qgemm.gemm_prepared(a, packed, vectors, 9, act, 0.05, 100, residual=res)
        assert same_bits(got, ref_gemm(a, w, 0.03, 9, sb, bias, act, 0.05, 100, res)), act
    # a residual column of NaN stays NaN through relu; inf saturates the codes
    res = np.zeros((m, n), np.float32)
    res[:, 0], res[:, -1] = np.nan, np.inf
    got = qgemm.gemm_prepared(a, packed, vectors, 9, "relu", residual=res)
    assert np.isnan(got[:, 0]).all() and same_bits(
        got, ref_gemm(a, w, 0.03, 9, sb, bias, "relu", residual=res))


@pytest.mark.parametrize("m,n", [(1, 16), (5, 37), (70, 64), (33, 3)])
def test_residual_of_codes_is_the_dequantized_residual(each_set, rng, m, n):
    # (codes - zero) * scale added as a float32 residual, to the bit, on every
    # set; codes with rows longer than N (a view) are read in place
    a, w, sb, bias = rand_case(rng, m, 23, n)
    wide = rng.integers(0, 256, (m, n + 5), dtype=np.uint8)
    codes = wide[:, 3:n + 3]
    scale, zero = np.float32(0.037), 17
    res = (codes.astype(np.int32) - zero).astype(np.float32) * scale
    vectors = qgemm.epilogue_vectors(0.03, sb, bias)
    packed = qgemm.pack_weights(w)
    for act in (None, "relu", "relu6"):
        got = qgemm.gemm_prepared(a, packed, vectors, 9, act, residual=(codes, scale, zero))
        assert same_bits(got, ref_gemm(a, w, 0.03, 9, sb, bias, act, residual=res)), act
        got = qgemm.gemm_prepared(a, packed, vectors, 9, act, 0.05, 100,
                                  residual=(codes, scale, zero), keep_float=True)
        want_f = ref_gemm(a, w, 0.03, 9, sb, bias, act, residual=res)
        want_q = ref_gemm(a, w, 0.03, 9, sb, bias, act, 0.05, 100, res)
        assert same_bits(got[0], want_f) and same_bits(got[1], want_q), act


def test_residual_of_codes_in_a_convolution(each_set, rng):
    x = rng.integers(0, 256, (2, 9, 8, 5), dtype=np.uint8)
    w = rng.integers(-128, 128, (3, 3, 5, 21), dtype=np.int8)
    sb = rng.uniform(1e-3, 1e-2, 21).astype(np.float32)
    packed = qgemm.pack_weights(w.reshape(-1, 21))
    vectors = qgemm.epilogue_vectors(0.02, sb)
    codes = rng.integers(0, 256, (2, 7, 6, 21), dtype=np.uint8)
    res = (codes.astype(np.int32) - 3).astype(np.float32) * np.float32(0.5)
    args = ((3, 3), (1, 1), (1, 1), ((0, 0), (0, 0)), 4)
    want = qgemm.conv(x, packed, vectors, *args, residual=res.reshape(-1, 21))
    got = qgemm.conv(x, packed, vectors, *args, residual=(codes.reshape(-1, 21), 0.5, 3))
    assert same_bits(got, want)


def test_residual_of_codes_bad_arguments(rng):
    a, w, sb, _ = rand_case(rng, 4, 8, 6)
    packed, vectors = qgemm.pack_weights(w), qgemm.epilogue_vectors(1.0, sb)
    codes = np.zeros((4, 6), np.uint8)
    for bad, match in (((codes, 0.5), "codes is \\(codes, scale, zero_point\\)"),
                       ((codes.astype(np.int8), 0.5, 0), "residual codes must be a uint8"),
                       ((codes[:, :5], 0.5, 0), "residual codes must be a uint8"),
                       ((codes, 0.0, 0), "scale must be positive"),
                       ((codes, float("nan"), 0), "scale must be positive"),
                       ((codes, 0.5, 256), "zero_point must be an integer")):
        with pytest.raises(ValueError, match=match):
            qgemm.gemm_prepared(a, packed, vectors, 0, residual=bad)


def test_overlapping_rows_are_read_in_place(each_set, rng):
    # a 1-D convolution's windows: k bytes every c, as a strided view
    c, kw, length = 5, 3, 40
    seq = rng.integers(0, 256, (length, c), dtype=np.uint8)
    rows = np.lib.stride_tricks.as_strided(seq, (length - kw + 1, kw * c), (c, 1),
                                           writeable=False)
    w = rng.integers(-128, 128, (kw * c, 19), dtype=np.int8)
    sb = rng.uniform(1e-3, 1e-2, 19).astype(np.float32)
    got = qgemm.gemm(rows, qgemm.pack_weights(w), 0.1, 7, sb)
    assert same_bits(got, ref_gemm(np.ascontiguousarray(rows), w, 0.1, 7, sb))


def test_residual_bad_arguments(rng):
    a, w, sb, _ = rand_case(rng, 4, 8, 6)
    packed, vectors = qgemm.pack_weights(w), qgemm.epilogue_vectors(1.0, sb)
    for bad in (np.zeros((4, 5), np.float32), np.zeros((4, 6), np.float64), [[0.0] * 6] * 4):
        with pytest.raises(ValueError, match="residual must be a float32 array"):
            qgemm.gemm_prepared(a, packed, vectors, 0, residual=bad)


def test_float_output_activation_edges(each_set):
    w = np.ones((1, 6), np.int8)
    packed = qgemm.pack_weights(w)
    bias = np.array([-0.0, -1.0, 5.999, 6.0, 6.5, np.nan], np.float32)
    a = np.zeros((1, 1), np.uint8)
    sb = np.ones(6, np.float32)
    relu6 = qgemm.gemm(a, packed, 1.0, 0, sb, bias, "relu6")[0]
    # 0 * s + -0.0 is +0.0
    assert same_bits(relu6, np.array([0.0, 0.0, 5.999, 6.0, 6.0, np.nan], np.float32))
    relu = qgemm.gemm(a, packed, 1.0, 0, sb, bias, "relu")[0]
    assert same_bits(relu, np.array([0.0, 0.0, 5.999, 6.0, 6.5, np.nan], np.float32))


def thread_and_team_states():
    """Each thread count (1, 2, 3, 5) with the team forced to 1 or 2 threads
    or left to decide, from rest; the thread count and the team's setting
    are restored after (or when the loop stops on a failure)."""
    saved = K.get_num_threads()
    try:
        for threads in (1, 2, 3, 5):
            K.set_num_threads(threads)
            for forced in (1, 2, None):
                runtime.force_team_threads(forced)
                runtime.team_rest()
                yield threads, forced
    finally:
        runtime.force_team_threads(None)
        K.set_num_threads(saved)


def test_results_do_not_depend_on_threads_or_the_team(rng):
    a, w, sb, bias = rand_case(rng, 97, 203, 150)
    packed = qgemm.pack_weights(w)
    row = a[:1]
    want = ref_gemm(a, w, 0.02, 7, sb, bias, "relu")
    want_row = ref_gemm(row, w, 0.02, 7, sb, bias, "relu")
    want_q = ref_gemm(a, w, 0.02, 7, sb, bias, "relu", 0.03, 0)
    for _ in thread_and_team_states():
        assert same_bits(qgemm.gemm(a, packed, 0.02, 7, sb, bias, "relu"), want)
        assert same_bits(qgemm.gemm(row, packed, 0.02, 7, sb, bias, "relu"), want_row)
        assert same_bits(qgemm.gemm(a, packed, 0.02, 7, sb, bias, "relu", 0.03, 0), want_q)


# ---------------------------------------------------------------- packing

def test_pack_weights_any_strides_and_shape(rng):
    w = rng.integers(-128, 128, (37, 50), dtype=np.int8)
    packed = qgemm.pack_weights(w)
    assert packed.dtype == np.uint8 and packed.ndim == 1
    assert packed.size == qgemm.packed_size(37, 50)
    assert qgemm.packed_shape(packed) == (37, 50)
    assert packed.ctypes.data % 64 == 0
    for view in (np.asfortranarray(w), w[::-1].copy()[::-1], w[:, ::-1].copy()[:, ::-1],
                 np.repeat(w, 2, axis=1)[:, ::2]):
        assert same_bits(qgemm.pack_weights(view), packed)
    a = rng.integers(0, 256, (6, 37), dtype=np.uint8)
    wt = rng.integers(-128, 128, (50, 37), dtype=np.int8)
    sb = np.ones(37, np.float32)
    assert same_bits(qgemm.gemm(a[:, :37], qgemm.pack_weights(wt.T[:37, :37]), 1.0, 0, sb),
                     ref_gemm(a, wt.T[:37, :37], 1.0, 0, sb))


def test_packed_size_counts_panels_and_groups():
    header, group = 64, 64
    assert qgemm.packed_size(0, 0) == header
    assert qgemm.packed_size(1, 1) == header + 1 * (1 + 1) * group
    assert qgemm.packed_size(8, 16) == header + 1 * (2 + 1) * group
    assert qgemm.packed_size(9, 17) == header + 2 * (3 + 1) * group


# ---------------------------------------------------------------- quantize

def test_quantize_matches_reference(each_set, rng):
    for shape in [(0,), (1,), (15,), (16,), (17,), (3, 7), (2, 5, 67), (1000,), (4, 1025)]:
        x = (rng.standard_normal(shape) * 4).astype(np.float32)
        for scale, zero in ((0.03, 0), (0.03, 128), (0.5, 255), (1e-3, 17)):
            got = qgemm.quantize(x, scale, zero)
            assert same_bits(got, ref_quantize(x, scale, zero)), (shape, scale, zero)


def test_quantize_edges(each_set):
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 127.5, 300, -300, np.nan, np.inf,
                  -np.inf, 3.4e38, -0.0] * 3, np.float32)
    got = qgemm.quantize(x, 1.0, 0)
    assert list(got[:14]) == [0, 2, 2, 0, 0, 126, 128, 255, 0, 0, 255, 0, 255, 0]
    got = qgemm.quantize(x, 1.0, 128)
    assert list(got[:14]) == [128, 130, 130, 128, 126, 254, 255, 255, 0, 0, 255, 0, 255, 128]
    for zero in (0, 1, 100, 254, 255):
        assert same_bits(qgemm.quantize(x, 0.7, zero), ref_quantize(x, 0.7, zero))


def test_quantize_non_contiguous_and_threads(rng):
    x = (rng.standard_normal((64, 300)) * 3).astype(np.float32)
    want = ref_quantize(x[:, ::3], 0.02, 100)
    try:
        for threads in (1, 2, 3):
            K.set_num_threads(threads)
            for forced in (1, None):
                runtime.force_team_threads(forced)
                assert same_bits(qgemm.quantize(x[:, ::3], 0.02, 100), want)
    finally:
        runtime.force_team_threads(None)


# ---------------------------------------------------------------- im2col

def ref_im2col(x, kh, kw, sh, sw, dh, dw, pads, pad):
    (pt, pb), (pl, pr) = pads
    b, h, w, c = x.shape
    xp = np.full((b, h + pt + pb, w + pl + pr, c), pad, np.uint8)
    xp[:, pt:pt + h, pl:pl + w] = x
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    rows = np.empty((b, oh, ow, kh, kw, c), np.uint8)
    for ky in range(kh):
        for kx in range(kw):
            rows[:, :, :, ky, kx] = xp[:, ky * dh:ky * dh + (oh - 1) * sh + 1:sh,
                                       kx * dw:kx * dw + (ow - 1) * sw + 1:sw]
    return rows.reshape(b * oh * ow, kh * kw * c)


IM2COL_CASES = [
    ((2, 5, 6, 3), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
    ((1, 7, 7, 1), (3, 2), (2, 1), (1, 2), ((0, 2), (1, 0))),
    ((3, 1, 9, 4), (1, 3), (1, 2), (1, 1), ((0, 0), (2, 0))),   # 1-D, causal
    ((1, 4, 4, 5), (1, 1), (2, 2), (1, 1), ((0, 0), (0, 0))),
    ((2, 6, 5, 2), (2, 2), (1, 1), (2, 2), ((1, 1), (1, 1))),
    ((1, 3, 3, 2), (3, 3), (1, 1), (1, 1), ((0, 0), (0, 0))),
    ((2, 15, 13, 3), (7, 7), (2, 2), (1, 1), ((3, 3), (3, 3))),  # a stem: runs of 21 bytes
    ((1, 3, 4, 3), (2, 5), (1, 3), (1, 1), ((2, 2), (6, 5))),   # windows wholly in the pads
    ((1, 2, 2, 1), (1, 4), (1, 1), (1, 1), ((0, 0), (3, 3))),   # a window wider than the row
    # runs of every copy size: 2, 6, 12, 26, 33 and 40 bytes, whole and cut by the pads
    ((2, 6, 7, 2), (3, 1), (1, 1), (1, 1), ((1, 1), (0, 0))),
    ((1, 6, 7, 2), (3, 3), (1, 2), (1, 1), ((1, 1), (1, 1))),
    ((1, 5, 9, 4), (2, 3), (2, 1), (1, 1), ((0, 1), (1, 1))),
    ((1, 5, 9, 13), (3, 2), (1, 1), (1, 1), ((1, 1), (1, 0))),
    ((1, 4, 6, 11), (1, 3), (1, 1), (1, 1), ((0, 0), (1, 1))),
    ((1, 4, 6, 40), (2, 1), (1, 1), (1, 1), ((1, 0), (0, 0))),
    ((1, 6, 6, 20), (2, 2), (1, 1), (2, 2), ((1, 1), (1, 1))),   # taps one at a time
    # MobileNet's stem (3x3, stride 2, padded at the bottom and right only):
    # inner windows copied as whole runs, the last row and column not
    ((2, 9, 11, 3), (3, 3), (2, 2), (1, 1), ((0, 1), (0, 1))),
    ((1, 8, 8, 1), (3, 3), (1, 1), (2, 1), ((2, 2), (1, 1))),    # vertical dilation only
]


@pytest.mark.parametrize("shape,ks,st,dil,pads", IM2COL_CASES)
def test_im2col_matches_reference(rng, shape, ks, st, dil, pads):
    x = rng.integers(0, 256, shape, dtype=np.uint8)
    want = ref_im2col(x, *ks, *st, *dil, pads, 77)
    saved = K.get_num_threads()
    try:
        for threads in (1, 2, 3):
            K.set_num_threads(threads)
            assert same_bits(qgemm.im2col(x, ks, st, dil, pads, 77), want)
    finally:
        K.set_num_threads(saved)


def test_convolution_through_im2col_is_exact(each_set, rng):
    # int8 convolution = patches x kernel reshaped (kh * kw * C, F); padded
    # taps hold the zero point, which the epilogue's zero-point term removes.
    x = rng.integers(0, 256, (2, 6, 7, 3), dtype=np.uint8)
    kern = rng.integers(-128, 128, (3, 3, 3, 19), dtype=np.int8)
    za = 90
    patches = qgemm.im2col(x, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), za)
    sb = np.ones(19, np.float32)
    got = qgemm.gemm(patches, qgemm.pack_weights(kern.reshape(27, 19)), 1.0, za, sb)
    xs = x.astype(np.int64) - za
    xp = np.pad(xs, ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = np.zeros((2, 6, 7, 19), np.int64)
    for ky in range(3):
        for kx in range(3):
            want += np.einsum("bhwc,cf->bhwf", xp[:, ky:ky + 6, kx:kx + 7],
                              kern[ky, kx].astype(np.int64))
    assert same_bits(got, want.reshape(-1, 19).astype(np.float32))


CONV_CASES = [
    ((2, 30, 29, 16), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 37),   # many blocks
    ((1, 57, 61, 3), (7, 7), (2, 2), (1, 1), ((3, 3), (2, 4)), 64),    # a stem
    ((3, 17, 19, 40), (1, 1), (2, 2), (1, 1), ((0, 0), (0, 0)), 21),   # strided 1x1
    ((1, 1, 300, 24), (1, 5), (1, 1), (1, 2), ((0, 0), (8, 0)), 19),   # 1-D, causal
    ((1, 4, 4, 8), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 5),       # a few rows
    ((2, 90, 97, 3), (3, 3), (2, 2), (1, 1), ((0, 1), (0, 1)), 32),    # blocks cut lines
]


@pytest.mark.parametrize("shape,ks,st,dil,pads,n", CONV_CASES)
def test_conv_matches_patches_times_weights(each_set, rng, shape, ks, st, dil, pads, n):
    # blocks of patch rows multiplied as they are formed: the bits of the whole
    # patch matrix's product, for every epilogue and thread count
    x = rng.integers(0, 256, shape, dtype=np.uint8)
    k = ks[0] * ks[1] * shape[-1]
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = qgemm.pack_weights(w)
    sb = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    vectors = qgemm.epilogue_vectors(0.02, sb, rng.standard_normal(n).astype(np.float32))
    patches = qgemm.im2col(x, ks, st, dil, pads, 77)
    res = rng.standard_normal((patches.shape[0], n)).astype(np.float32)
    saved = K.get_num_threads()
    try:
        for threads in (1, 2, 3):
            K.set_num_threads(threads)
            for act, codes, r in ((None, None, None), ("relu", (0.04, 3), None),
                                  ("relu6", None, res)):
                kw = {} if codes is None else {"out_scale": codes[0],
                                               "out_zero_point": codes[1]}
                want = qgemm.gemm_prepared(patches, packed, vectors, 77, act, residual=r, **kw)
                got = qgemm.conv(x, packed, vectors, ks, st, dil, pads, 77, act, residual=r,
                                 **kw)
                assert same_bits(got, want), (threads, act, codes)
    finally:
        K.set_num_threads(saved)


def test_conv_empty_and_bad_arguments(rng):
    w = rng.integers(-128, 128, (18, 4), dtype=np.int8)
    packed = qgemm.pack_weights(w)
    vectors = qgemm.epilogue_vectors(1.0, np.ones(4, np.float32))
    out = qgemm.conv(np.zeros((0, 5, 5, 2), np.uint8), packed, vectors, 3)
    assert out.shape == (0, 4) and out.dtype == np.float32
    x = np.zeros((1, 5, 5, 2), np.uint8)
    with pytest.raises(TypeError, match="4-D uint8"):
        qgemm.conv(x.astype(np.float32), packed, vectors, 3)
    with pytest.raises(ValueError, match="K = 27, the packed weights have 18"):
        qgemm.conv(np.zeros((1, 5, 5, 3), np.uint8), packed, vectors, 3)
    with pytest.raises(ValueError, match="does not fit"):
        qgemm.conv(x, packed, vectors, 3, dilation=3)
    with pytest.raises(ValueError, match="pads"):
        qgemm.conv(x, packed, vectors, 3, pads=((1, -1), (0, 0)))
    with pytest.raises(ValueError, match="residual must be a float32 array"):
        qgemm.conv(x, packed, vectors, 3, residual=np.zeros((9, 5), np.float32))


def test_im2col_empty_and_bad_arguments():
    x = np.zeros((0, 4, 4, 2), np.uint8)
    assert qgemm.im2col(x, 3, 1, 1, ((1, 1), (1, 1))).shape == (0, 18)
    x = np.zeros((1, 4, 4, 2), np.uint8)
    with pytest.raises(TypeError, match="4-D uint8"):
        qgemm.im2col(x.astype(np.float32), 3)
    with pytest.raises(ValueError, match="does not fit"):
        qgemm.im2col(x, 5)
    with pytest.raises(ValueError, match="kernel_size"):
        qgemm.im2col(x, (3, 0))
    with pytest.raises(ValueError, match="strides"):
        qgemm.im2col(x, 3, strides=1.5)
    with pytest.raises(ValueError, match="pads"):
        qgemm.im2col(x, 3, pads=((1, -1), (0, 0)))
    with pytest.raises(ValueError, match="pads"):
        qgemm.im2col(x, 3, pads=(1, 1))
    with pytest.raises(ValueError, match="pad_value"):
        qgemm.im2col(x, 3, pad_value=256)


# ---------------------------------------------------------------- sets and bad arguments

def test_instruction_set_hook():
    assert qgemm.instruction_sets()[0] == "scalar"
    assert qgemm.cpu_instruction_set() == qgemm.instruction_sets()[-1]
    with pytest.raises(ValueError, match="unknown instruction set"):
        qgemm._use_instruction_set("sse9")
    try:
        assert qgemm._use_instruction_set("scalar") == "scalar"
        assert qgemm.instruction_set() == "scalar"
    finally:
        qgemm._use_instruction_set(None)
    for name in SETS:
        if name not in qgemm.instruction_sets():
            with pytest.raises(ValueError, match="cannot run"):
                qgemm._use_instruction_set(name)


def test_avx512_capped_stops_at_avx_vnni_or_below():
    # CYBACK_AVX512=0 is read once per process: check it in a fresh one
    import os
    import subprocess
    import sys
    code = "from cyback.kernels import qgemm; print(qgemm.instruction_set())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, CYBACK_AVX512="0"), timeout=120)
    assert out.returncode == 0, out.stderr
    sets = qgemm.instruction_sets()
    want = "avx_vnni" if "avx_vnni" in sets else [s for s in sets if s != "avx512_vnni"][-1]
    assert out.stdout.split()[-1] == want


def test_bad_arguments(rng):
    a, w, sb, bias = rand_case(rng, 3, 8, 5)
    packed = qgemm.pack_weights(w)
    with pytest.raises(TypeError, match="int8"):
        qgemm.pack_weights(w.astype(np.int16))
    with pytest.raises(TypeError, match="int8 NumPy"):
        qgemm.pack_weights([[1, 2]])
    with pytest.raises(ValueError, match="2-D"):
        qgemm.pack_weights(w[0])
    with pytest.raises(ValueError, match="overflow"):
        qgemm.pack_weights(np.zeros((qgemm.MAX_K + 1, 1), np.int8))
    with pytest.raises(TypeError, match="uint8 array of activations"):
        qgemm.gemm(a.astype(np.int8), packed, 1.0, 0, sb)
    with pytest.raises(TypeError, match="uint8 array of activations"):
        qgemm.gemm(a[0], packed, 1.0, 0, sb)
    with pytest.raises(ValueError, match="K = 7"):
        qgemm.gemm(a[:, :7], packed, 1.0, 0, sb)
    with pytest.raises(TypeError, match="pack_weights returns"):
        qgemm.gemm(a, w, 1.0, 0, sb)
    with pytest.raises(ValueError, match="too short"):
        qgemm.gemm(a, packed[:10], 1.0, 0, sb)
    with pytest.raises(ValueError, match="not weights packed"):
        qgemm.gemm(a, packed[:-64].copy(), 1.0, 0, sb)
    bogus = packed.copy()
    bogus[:4] = 0
    with pytest.raises(ValueError, match="not weights packed"):
        qgemm.packed_shape(bogus)
    for bad in (0.0, -1.0, np.nan, np.inf, 1e39, 1e-50):
        with pytest.raises(ValueError, match="scale_a"):
            qgemm.gemm(a, packed, bad, 0, sb)
    with pytest.raises(TypeError, match="scale_a"):
        qgemm.gemm(a, packed, "x", 0, sb)
    for bad in (-1, 256, 1.0, True):
        with pytest.raises(ValueError, match="zero_a"):
            qgemm.gemm(a, packed, 1.0, bad, sb)
    with pytest.raises(ValueError, match="scale_b must hold"):
        qgemm.gemm(a, packed, 1.0, 0, sb[:4])
    with pytest.raises(ValueError, match="scale_b must be finite"):
        qgemm.gemm(a, packed, 1.0, 0, np.where(np.arange(5) == 2, np.inf, sb))
    with pytest.raises(ValueError, match="bias"):
        qgemm.gemm(a, packed, 1.0, 0, sb, bias[:3])
    with pytest.raises(ValueError, match="bias"):
        qgemm.gemm(a, packed, 1.0, 0, sb, np.arange(5))
    with pytest.raises(ValueError, match="activation"):
        qgemm.gemm(a, packed, 1.0, 0, sb, activation="tanh")
    with pytest.raises(ValueError, match="both out_scale and out_zero_point"):
        qgemm.gemm(a, packed, 1.0, 0, sb, out_scale=1.0)
    with pytest.raises(ValueError, match="out_zero_point"):
        qgemm.gemm(a, packed, 1.0, 0, sb, out_scale=1.0, out_zero_point=300)
    with pytest.raises(TypeError, match="float32"):
        qgemm.quantize(np.zeros(3), 1.0, 0)
    with pytest.raises(ValueError, match="scale"):
        qgemm.quantize(np.zeros(3, np.float32), 0.0, 0)
    with pytest.raises(ValueError, match="zero_point"):
        qgemm.quantize(np.zeros(3, np.float32), 1.0, -1)
    with pytest.raises(ValueError, match="k must be"):
        qgemm.packed_size(-1, 3)


def test_non_contiguous_activations(rng):
    a, w, sb, bias = rand_case(rng, 10, 24, 9)
    packed = qgemm.pack_weights(w)
    want = ref_gemm(a[::2], w, 0.1, 4, sb, bias)
    assert same_bits(qgemm.gemm(a[::2], packed, 0.1, 4, sb, bias), want)
    fa = np.asfortranarray(a)
    assert same_bits(qgemm.gemm(fa, packed, 0.1, 4, sb, bias), ref_gemm(a, w, 0.1, 4, sb, bias))


def test_prepared_epilogue_vectors(rng):
    a, w, sb, bias = rand_case(rng, 9, 40, 35)
    packed = qgemm.pack_weights(w)
    vectors = qgemm.epilogue_vectors(0.07, sb, bias)
    assert vectors.shape == (2, 48) and vectors.dtype == np.float32
    assert same_bits(vectors[0, :35], np.float32(0.07) * sb) and not vectors[:, 35:].any()
    assert same_bits(vectors[1, :35], bias)
    for act in (None, "relu6"):
        assert same_bits(qgemm.gemm_prepared(a, packed, vectors, 11, act),
                         qgemm.gemm(a, packed, 0.07, 11, sb, bias, act))
    no_bias = qgemm.epilogue_vectors(0.07, sb)
    assert no_bias.shape == (1, 48)
    assert same_bits(qgemm.gemm_prepared(a, packed, no_bias, 11, None, 0.1, 5),
                     qgemm.gemm(a, packed, 0.07, 11, sb, None, None, 0.1, 5))
    for bad in (vectors[:, :32].copy(), vectors.astype(np.float64), vectors[0],
                np.zeros((3, 48), np.float32), vectors.T.copy().T):
        with pytest.raises(ValueError, match="epilogue vectors"):
            qgemm.gemm_prepared(a, packed, bad, 11)
    with pytest.raises(ValueError, match="vector of N scales"):
        qgemm.epilogue_vectors(1.0, sb[None])
    with pytest.raises(ValueError, match="like scale_b"):
        qgemm.epilogue_vectors(1.0, sb, bias[:-1])


# ---------------------------------------------------------------- max pool of codes

def ref_max_pool(x, ks, st, pads):
    # padded cells hold -1, below every code, so they never win
    (pt, pb), (pl, pr) = pads
    xp = np.pad(x.astype(np.int16), ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=-1)
    oh = (xp.shape[1] - ks[0]) // st[0] + 1
    ow = (xp.shape[2] - ks[1]) // st[1] + 1
    y = np.full((x.shape[0], oh, ow, x.shape[3]), -1, np.int16)
    for ky in range(ks[0]):
        for kx in range(ks[1]):
            y = np.maximum(y, xp[:, ky:ky + (oh - 1) * st[0] + 1:st[0],
                                 kx:kx + (ow - 1) * st[1] + 1:st[1]])
    return y.astype(np.uint8)


@pytest.mark.parametrize("shape,ks,st,pads", [
    ((2, 9, 11, 64), (3, 3), (2, 2), ((0, 0), (0, 0))),
    ((1, 8, 8, 5), (3, 3), (2, 2), ((0, 1), (1, 1))),
    ((3, 5, 7, 1), (2, 3), (1, 2), ((1, 0), (2, 0))),
    ((1, 1, 9, 17), (1, 4), (1, 1), ((0, 0), (1, 2))),
])
def test_max_pool_of_codes_matches_reference(rng, shape, ks, st, pads):
    x = rng.integers(0, 256, shape, dtype=np.uint8)
    x.flat[::5] = 0          # windows of zeros, and of zeros beside padding
    want = ref_max_pool(x, ks, st, pads)
    saved = K.get_num_threads()
    try:
        for threads in (1, 2):
            K.set_num_threads(threads)
            assert same_bits(qgemm.max_pool(x, ks, st, pads), want)
            # a non-contiguous input is read as its values
            wide = np.concatenate([x, x], axis=-1)[..., :shape[-1]]
            assert same_bits(qgemm.max_pool(wide, ks, st, pads), want)
    finally:
        K.set_num_threads(saved)


def test_max_pool_of_codes_empty_and_bad_arguments():
    assert qgemm.max_pool(np.zeros((0, 4, 4, 3), np.uint8), 2, 2).shape == (0, 2, 2, 3)
    x = np.zeros((1, 4, 4, 3), np.uint8)
    with pytest.raises(TypeError, match="4-D uint8"):
        qgemm.max_pool(x.astype(np.float32), 2, 2)
    with pytest.raises(ValueError, match="below the window"):
        qgemm.max_pool(x, 2, 2, ((2, 0), (0, 0)))
    with pytest.raises(ValueError, match="does not fit"):
        qgemm.max_pool(x, 5, 1)
    with pytest.raises(ValueError, match="pads"):
        qgemm.max_pool(x, 2, 2, (1, 1))


# ---------------------------------------------------------------- ProductCall

@pytest.mark.parametrize("m,k,n", [(1, 250, 256), (37, 19, 40), (0, 8, 5), (200, 64, 17)])
def test_product_call_gives_gemm_prepareds_bits(each_set, rng, m, k, n):
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    packed = qgemm.pack_weights(w)
    vectors = qgemm.epilogue_vectors(0.03, rng.uniform(1e-3, 1e-2, n).astype(np.float32),
                                     rng.standard_normal(n).astype(np.float32))
    res = rng.standard_normal((m, n)).astype(np.float32)
    codes = (rng.integers(0, 256, (m, n), dtype=np.uint8), 0.05, 9)
    saved = K.get_num_threads()
    try:
        for threads in (1, 2):
            K.set_num_threads(threads)
            for act, out, keep, r in ((None, (None, None), False, None),
                                      ("relu", (0.04, 3), False, res),
                                      ("relu6", (0.05, 0), True, codes),
                                      (None, (0.02, 128), False, codes)):
                call = qgemm.ProductCall(packed, vectors, 11, act, *out, keep)
                want = qgemm.gemm_prepared(a, packed, vectors, 11, act, *out, r, keep)
                got = call(a, r)
                if keep:
                    assert type(got) is tuple and all(same_bits(g, w_)
                                                      for g, w_ in zip(got, want))
                else:
                    assert same_bits(got, want), (threads, act, out)
    finally:
        K.set_num_threads(saved)


def test_product_call_knows_its_arrays_and_keeps_none_alive(rng):
    import gc
    import weakref
    w = rng.integers(-128, 128, (12, 7), dtype=np.int8)
    packed = qgemm.pack_weights(w)
    vectors = qgemm.epilogue_vectors(0.1, np.ones(7, np.float32))
    call = qgemm.ProductCall(packed, vectors, 0)
    assert call.matches(packed, vectors)
    assert not call.matches(packed.copy(), vectors)
    assert not call.matches(packed, vectors.copy())
    alive = weakref.ref(packed)
    del packed
    gc.collect()
    assert alive() is None
    assert not call.matches(qgemm.pack_weights(w), vectors)


def test_product_call_bad_arguments(rng):
    w = rng.integers(-128, 128, (12, 7), dtype=np.int8)
    packed = qgemm.pack_weights(w)
    vectors = qgemm.epilogue_vectors(0.1, np.ones(7, np.float32))
    call = qgemm.ProductCall(packed, vectors, 0, "relu", 0.1, 0)
    with pytest.raises(TypeError, match="2-D uint8"):
        call(np.zeros((3, 12), np.float32))
    with pytest.raises(TypeError, match="2-D uint8"):
        call(np.zeros(12, np.uint8))
    with pytest.raises(ValueError, match="K = 11 columns, the packed weights 12 rows"):
        call(np.zeros((3, 11), np.uint8))
    with pytest.raises(ValueError, match="residual"):
        call(np.zeros((3, 12), np.uint8), np.zeros((3, 6), np.float32))
    with pytest.raises(TypeError, match="pack_weights"):
        qgemm.ProductCall(w, vectors, 0)
    with pytest.raises(ValueError, match="epilogue vectors"):
        qgemm.ProductCall(packed, np.ones((1, 7), np.float32), 0)
    with pytest.raises(ValueError, match="keep_float"):
        qgemm.ProductCall(packed, vectors, 0, keep_float=True)
    with pytest.raises(ValueError, match="activation"):
        qgemm.ProductCall(packed, vectors, 0, "tanh")


# ---------------------------------------------------------------- bound_run

def test_bound_run_is_its_call_on_reshaped_arrays(rng):
    w = rng.integers(-128, 128, (6, 5), dtype=np.int8)
    packed = qgemm.pack_weights(w)
    vectors = qgemm.epilogue_vectors(0.03, rng.uniform(1e-3, 1e-2, 5).astype(np.float32),
                                     rng.standard_normal(5).astype(np.float32))
    call = qgemm.ProductCall(packed, vectors, 7, "relu", 0.05, 3)
    codes = rng.integers(0, 256, (2, 3, 4, 6), dtype=np.uint8)
    res = rng.integers(0, 256, (2, 3, 4, 5), dtype=np.uint8)
    run = qgemm.bound_run(call, codes.shape, (-1, 6), (2, 3, 4, 5), "uint8", (0.02, 9))
    got = run(codes, packed, vectors, res)
    want = call(codes.reshape(-1, 6), (res.reshape(-1, 5), 0.02, 9))
    assert got.shape == (2, 3, 4, 5) and same_bits(got.reshape(-1, 5), want)
    plain = qgemm.bound_run(call, codes.shape, (-1, 6), (2, 3, 4, 5))
    assert same_bits(plain(codes, packed, vectors).reshape(-1, 5), call(codes.reshape(-1, 6)))
    # what does not fit is declined, never run
    assert plain(codes[:1], packed, vectors) is None                  # another shape
    assert plain(codes.astype(np.int8), packed, vectors) is None      # another dtype
    assert plain(np.asfortranarray(codes), packed, vectors) is None   # another layout
    assert plain(codes, packed.copy(), vectors) is None               # other weights
    assert plain(codes, packed, vectors, res) is None                 # a residual
    assert run(codes, packed, vectors) is None                        # none
    assert run(codes, packed, vectors, res.astype(np.float32)) is None
    assert run(codes, packed, vectors, res[:1]) is None


@pytest.mark.parametrize("args", [((4, 6), (-1, 6), (4, 5), "int8", None),
                                  ((4, 6), (-1, 6), (4, 5), "uint8", None),
                                  ((4, 6), (-1, 6), (4, 5), "float32", (0.1, 0)),
                                  ((4, 6), (-1, 6), (), None, None)])
def test_bound_run_bad_arguments(args):
    with pytest.raises(ValueError, match="bound_run"):
        qgemm.bound_run(None, *args)


@pytest.mark.parametrize("outer,n,inner", [(1, 398, 250), (3, 1, 17), (2, 5, 64), (1, 7, 257),
                                           (2, 3, 130), (1, 2, 1), (4, 9, 513), (0, 3, 5),
                                           (2, 4, 0)])
def test_max_middle_matches_numpy(each_set, rng, outer, n, inner):
    x = rng.integers(0, 256, (outer, n, inner), dtype=np.uint8)
    x[..., ::7] = 255
    assert same_bits(qgemm.max_middle(x), x.max(axis=1))


def test_max_middle_bad_arguments():
    with pytest.raises(TypeError, match="max_middle: expected a C-contiguous 3-D uint8"):
        qgemm.max_middle(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(TypeError, match="max_middle"):
        qgemm.max_middle(np.zeros((2, 3), np.uint8))
    with pytest.raises(TypeError, match="max_middle"):
        qgemm.max_middle(np.zeros((2, 3, 8), np.uint8)[:, :, ::2])
    with pytest.raises(ValueError, match="middle axis is empty"):
        qgemm.max_middle(np.zeros((2, 0, 4), np.uint8))


def test_few_rows_with_large_weights_split_panels_to_the_same_bits(rng):
    # up to 64 rows with 512 kB of packed weights or more split the panels
    # between the threads (each streams half the weights), products and
    # convolutions alike; the sums are exact, so the bits stay
    a, w, sb, bias = rand_case(rng, 49, 1030, 520)
    packed = qgemm.pack_weights(w)
    x = rng.integers(0, 256, (1, 7, 7, 120), dtype=np.uint8)
    wc = rng.integers(-128, 128, (9 * 120, 512), dtype=np.int8)
    packed_c = qgemm.pack_weights(wc)
    vectors = qgemm.epilogue_vectors(0.02, rng.uniform(1e-3, 1e-2, 512).astype(np.float32))
    assert packed.nbytes >= 1 << 19 and packed_c.nbytes >= 1 << 19
    want = ref_gemm(a, w, 0.02, 7, sb, bias, "relu", 0.05, 3)
    got = {}
    old = qgemm._panel_split()
    saved = K.get_num_threads()
    try:
        for rows in (64, 0):
            qgemm._panel_split(rows)
            for threads in (1, 2, 3):
                K.set_num_threads(threads)
                assert same_bits(qgemm.gemm(a, packed, 0.02, 7, sb, bias, "relu", 0.05, 3), want)
                y = qgemm.conv(x, packed_c, vectors, (3, 3), pads=((1, 1), (1, 1)), zero_a=5,
                               activation="relu")
                assert same_bits(y, got.setdefault("conv", y))
    finally:
        qgemm._panel_split(old)
        K.set_num_threads(saved)
    assert qgemm._panel_split() == old


@pytest.mark.parametrize("act", ["relu", "relu6"])
@pytest.mark.parametrize("out_scale", [6 / 255, 0.02, 0.03, 1e-3])
def test_codes_of_zero_point_0_leave_the_activation_to_their_clamp(each_set, act, out_scale):
    # relu, and relu6 where 6 / out_scale reaches 255, are dropped from an
    # epilogue that writes only codes of zero point 0; the codes keep their
    # bits: sums around 0 and 6 on either side, large ones, both signs of
    # scale, with a residual of codes and in a depthwise convolution
    rng = np.random.default_rng(3)
    k, n = 8, 40
    w = np.zeros((k, n), np.int8)
    w[0] = np.arange(-20, 20)
    w[1, ::3] = 127
    a = np.array([[1] * k, [3] * k, [0] * k, [255] * k, [2] * k], np.uint8)
    sb = np.full(n, 0.01, np.float32) * np.where(np.arange(n) % 4 == 0, -1, 1)
    bias = np.linspace(-6.5, 6.5, n).astype(np.float32)
    packed = qgemm.pack_weights(w)
    res_codes = rng.integers(0, 256, (5, n), dtype=np.uint8)
    x = rng.integers(0, 256, (1, 6, 7, n), dtype=np.uint8)
    dw = qgemm.pack_depthwise(rng.integers(-128, 128, (3, 3, n), dtype=np.int8))
    got = {}
    try:
        for fold in (True, False):
            assert qgemm._fold_activation(fold) == fold
            vectors = qgemm.epilogue_vectors(1.0, sb, bias)
            call = qgemm.ProductCall(packed, vectors, 1, act, out_scale, 0)
            dcall = qgemm.DepthwiseCall(dw, qgemm.epilogue_vectors(0.05, sb, bias), n, 9, (3, 3),
                                        pads=((1, 1), (1, 1)), activation=act,
                                        out_scale=out_scale, out_zero_point=0)
            got[fold] = (qgemm.gemm(a, packed, 1.0, 1, sb, bias, act, out_scale, 0),
                         call(a), call(a, (res_codes, 0.05, 7)), dcall(x),
                         qgemm.gemm_prepared(a, packed, vectors, 1, act, out_scale, 0,
                                             keep_float=True)[1])
    finally:
        qgemm._fold_activation(True)
    want = ref_gemm(a, w, 1.0, 1, sb, bias, act, out_scale, 0)
    for y in (got[True][0], got[True][1], got[True][4]):
        assert same_bits(y, want)
    for y, y_off in zip(got[True], got[False]):
        assert same_bits(y, y_off)
