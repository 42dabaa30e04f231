"""qgemm.WindowExtremeCall, the max / min over the positions of an int8 1-D
convolution: against an exact NumPy integer reference (the documented
epilogue at every position, then the reduction) on random shapes with
every instruction set the CPU runs, negative column scales (where the
greatest result comes from the least sum), float32 and uint8 outputs,
thread and team invariance, and the argument checks."""
import numpy as np
import pytest

from cyback.kernels import qgemm

from .test_qgemm import ref_gemm, same_bits, thread_and_team_states


@pytest.fixture(params=qgemm.INSTRUCTION_SETS)
def each_set(request):
    if request.param not in qgemm.instruction_sets():
        pytest.skip("needs %s: this CPU (or this build's compiler) has no %s"
                    % (request.param, request.param))
    try:
        assert qgemm._use_instruction_set(request.param) == request.param
        yield request.param
    finally:
        qgemm._use_instruction_set(None)


def ref_windows(x, kw, stride):
    """(B, OW, kw * C) windows of codes x (B, W, C)."""
    b, w, c = x.shape
    ow = (w - kw) // stride + 1
    return np.stack([x[:, i * stride:i * stride + kw].reshape(b, kw * c) for i in range(ow)],
                    axis=1)


def ref_extreme(x, w, sa, za, sb, bias, act, out_scale, out_zero, kw, stride, kind):
    """The epilogue of every window's exact sum (test_qgemm's reference), then
    the max / min over the windows."""
    a = ref_windows(x, kw, stride)
    y = ref_gemm(a.reshape(-1, a.shape[-1]), w, sa, za, sb, bias, act, out_scale, out_zero)
    y = y.reshape(a.shape[0], a.shape[1], -1)
    return y.max(axis=1) if kind == "max" else y.min(axis=1)


def rand_case(rng, b, w, c, kw, n, negative=0.3, with_bias=True):
    x = rng.integers(0, 256, (b, w, c), dtype=np.uint8)
    wt = rng.integers(-128, 128, (kw * c, n), dtype=np.int8)
    sign = np.where(rng.random(n) < negative, -1, 1).astype(np.float32)
    sb = (rng.uniform(1e-3, 2e-2, n) * sign).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    return x, wt, sb, bias


CASES = [(1, 1, 1, 1, 1, 1), (1, 5, 3, 2, 17, 1), (1, 40, 50, 3, 250, 1), (2, 9, 7, 4, 33, 2),
         (3, 30, 16, 5, 64, 1), (5, 13, 1, 3, 16, 3), (4, 64, 20, 1, 48, 1),
         (1, 398, 12, 7, 31, 2), (7, 6, 9, 6, 5, 1)]


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("out", ["float32", "uint8"])
def test_matches_the_integer_reference(each_set, rng, kind, out):
    for b, w, c, kw, n, stride in CASES:
        x, wt, sb, bias = rand_case(rng, b, w, c, kw, n)
        packed = qgemm.pack_weights(wt)
        za = int(rng.integers(0, 256))
        for act in (None, "relu", "relu6"):
            for bias_ in (bias, None):
                vectors = qgemm.epilogue_vectors(0.05, sb, bias_)
                codes = (0.04, int(rng.integers(0, 256))) if out == "uint8" else (None, None)
                call = qgemm.WindowExtremeCall(packed, vectors, c, kw, stride, za, act,
                                               *codes, kind=kind)
                got = call(x)
                want = ref_extreme(x, wt, 0.05, za, sb, bias_, act, *codes, kw, stride, kind)
                assert same_bits(got, want), (each_set, b, w, c, kw, n, stride, act)


def test_same_bits_as_the_convolution_then_the_reduction(rng):
    x, wt, sb, bias = rand_case(rng, 3, 50, 24, 3, 70)
    packed = qgemm.pack_weights(wt)
    vectors = qgemm.epilogue_vectors(0.02, sb, bias)
    y = qgemm.conv(x[:, None], packed, vectors, (1, 3), zero_a=9, activation="relu",
                   out_scale=0.05, out_zero_point=3).reshape(3, 48, 70)
    call = qgemm.WindowExtremeCall(packed, vectors, 24, 3, 1, 9, "relu", 0.05, 3)
    assert same_bits(call(x), y.max(axis=1))
    assert same_bits(qgemm.WindowExtremeCall(packed, vectors, 24, 3, 1, 9, "relu", 0.05, 3,
                                             kind="min")(x), y.min(axis=1))


def test_results_do_not_depend_on_threads_or_the_team(rng):
    x, wt, sb, bias = rand_case(rng, 3, 300, 20, 3, 90)
    packed = qgemm.pack_weights(wt)
    vectors = qgemm.epilogue_vectors(0.03, sb, bias)
    call = qgemm.WindowExtremeCall(packed, vectors, 20, 3, 1, 5, "relu", 0.02, 0)
    want = ref_extreme(x, wt, 0.03, 5, sb, bias, "relu", 0.02, 0, 3, 1, "max")
    one = x[1:2]
    for _ in thread_and_team_states():
        # three sequences split whole, or one split by its windows
        assert same_bits(call(x), want)
        assert same_bits(call(one), want[1:2])


def test_odd_inputs(rng):
    x, wt, sb, bias = rand_case(rng, 2, 12, 5, 3, 20)
    packed = qgemm.pack_weights(wt)
    vectors = qgemm.epilogue_vectors(0.03, sb, bias)
    call = qgemm.WindowExtremeCall(packed, vectors, 5, 3, 1, 4)
    want = ref_extreme(x, wt, 0.03, 4, sb, bias, None, None, None, 3, 1, "max")
    # a view with gaps is copied; an empty batch gives an empty result
    wide = np.zeros((2, 12, 9), np.uint8)
    wide[:, :, 2:7] = x
    assert same_bits(call(wide[:, :, 2:7]), want)
    assert call(x[:0]).shape == (0, 20)
    # exactly one window
    assert same_bits(call(x[:, :3]), ref_extreme(x[:, :3], wt, 0.03, 4, sb, bias, None, None,
                                                 None, 3, 1, "max"))


def test_bad_arguments(rng):
    x, wt, sb, bias = rand_case(rng, 1, 10, 4, 3, 8)
    packed = qgemm.pack_weights(wt)
    vectors = qgemm.epilogue_vectors(0.03, sb, bias)
    with pytest.raises(ValueError, match="K = 8"):
        qgemm.WindowExtremeCall(packed, vectors, 4, 2, 1, 0)
    with pytest.raises(ValueError, match="kind must be"):
        qgemm.WindowExtremeCall(packed, vectors, 4, 3, 1, 0, kind="mean")
    with pytest.raises(ValueError, match=">= 1"):
        qgemm.WindowExtremeCall(packed, vectors, 4, 3, 0, 0)
    with pytest.raises(ValueError, match="zero_a"):
        qgemm.WindowExtremeCall(packed, vectors, 4, 3, 1, 300)
    with pytest.raises(ValueError, match="out_zero_point"):
        qgemm.WindowExtremeCall(packed, vectors, 4, 3, 1, 0, None, 0.1)
    call = qgemm.WindowExtremeCall(packed, vectors, 4, 3, 1, 0)
    with pytest.raises(TypeError, match="uint8 codes"):
        call(x.astype(np.float32))
    with pytest.raises(TypeError, match="uint8 codes"):
        call(x[..., :3])
    with pytest.raises(ValueError, match="no window"):
        call(x[:, :2])
    assert call.matches(packed, vectors)
    assert not call.matches(packed.copy(), vectors)
