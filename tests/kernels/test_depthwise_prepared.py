"""depthwise.forward_call: a prepared depthwise_forward gives its results bit
for bit, takes depthwise_forward for arrays that do not fit (and for inputs
it does not run directly: channels_first, 1-D), and raises its errors when
it is prepared."""
import numpy as np
import pytest

from cyback.kernels import depthwise

# x shape, kernel shape, strides, dilation, pads, channels_last
CASES = [
    ((1, 32, 32, 16), (3, 3, 16, 1), (1, 1), (1, 1), ((1, 1), (1, 1)), True),
    ((2, 9, 11, 5), (3, 3, 5, 2), (2, 2), (1, 1), ((1, 1), (0, 1)), True),
    ((3, 7, 7, 33), (5, 3, 33, 1), (1, 2), (2, 1), ((4, 4), (1, 1)), True),
    ((2, 4, 8, 8), (3, 3, 4, 1), (1, 1), (1, 1), ((1, 1), (1, 1)), False),
    ((2, 20, 6), (5, 6, 3), (2,), (1,), ((2, 2),), True),
    ((0, 8, 8, 4), (3, 3, 4, 1), (1, 1), (1, 1), ((1, 1), (1, 1)), True),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("epilogue", [(False, None), (True, "relu6"), (True, None)])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_same_bits_as_depthwise_forward(case, epilogue, dtype):
    xs, ks, s, d, p, last = CASES[case]
    with_bias, act = epilogue
    rng = np.random.default_rng(case)
    x = rng.standard_normal(xs).astype(dtype)
    k = rng.standard_normal(ks).astype(dtype)
    bias = rng.standard_normal(ks[-2] * ks[-1]).astype(dtype) if with_bias else None
    want = depthwise.depthwise_forward(x, k, s, d, p, last, bias, act)
    call = depthwise.forward_call(xs, ks, s, d, p, last, dtype, with_bias, act)
    for _ in range(2):
        y = call(x, k, bias)
        assert y.dtype == dtype and y.shape == want.shape
        np.testing.assert_array_equal(y, want)


def test_arrays_that_do_not_fit_take_depthwise_forward(monkeypatch):
    xs, ks, s, d, p, last = CASES[0]
    rng = np.random.default_rng(9)
    x = rng.standard_normal(xs).astype(np.float32)
    k = rng.standard_normal(ks).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    want = depthwise.depthwise_forward(x, k, s, d, p, last, bias, "relu")
    call = depthwise.forward_call(xs, ks, s, d, p, last, np.float32, True, "relu")
    calls = []
    plain = depthwise.depthwise_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return plain(*args, **kwargs)
    monkeypatch.setattr(depthwise, "depthwise_forward", counted)
    readonly = x.copy()
    readonly.flags.writeable = False
    np.testing.assert_array_equal(call(readonly, k, bias), want)
    assert calls == []
    np.testing.assert_array_equal(call(np.asfortranarray(x), k, bias), want)
    np.testing.assert_array_equal(call(x, k, bias[::-1].copy()[::-1]), want)   # strided
    assert len(calls) == 2
    with pytest.raises(TypeError, match="depthwise_forward: dtype mismatch"):
        call(x, k.astype(np.float64), bias)
    with pytest.raises(ValueError, match="depthwise_forward: bias must be"):
        call(x, k, bias[:8])
    with pytest.raises(TypeError, match="depthwise_forward"):  # not read as native floats
        call(x.astype(">f4"), k, bias)


def test_preparing_checks_like_depthwise_forward():
    args = ((1, 8, 8, 3), (3, 3, 3, 1), (1, 1), (1, 1), ((0, 0), (0, 0)), True)
    with pytest.raises(ValueError, match="depthwise_forward: activation"):
        depthwise.forward_call(*args, "float32", activation="tanh")
    with pytest.raises(TypeError, match="depthwise_forward: expected float32 or float64"):
        depthwise.forward_call(*args, "float16")
    with pytest.raises(ValueError, match="depthwise_forward: kernel"):
        depthwise.forward_call((1, 8, 8, 3), (3, 3, 4, 1), (1, 1), (1, 1),
                               ((0, 0), (0, 0)), True, "float32")


# channels_last float32 layers of fewer channels than depthwise.PAD_CHANNELS
# run padded (PaddedForwardCall); wider ones that are no multiple of a vector
# (NASNet's 11, 22, 44) run their last vector overlapping the one before.
NARROW = [
    ((3, 5, 6, 1), (3, 3, 1, 1), (1, 1), (1, 1), ((1, 1), (1, 1))),
    ((1, 6, 6, 3), (3, 3, 3, 1), (2, 1), (1, 1), ((0, 1), (1, 1))),
]
ODD = [
    ((1, 12, 12, 11), (7, 7, 11, 1), (1, 1), (1, 1), ((3, 3), (3, 3))),
    ((2, 13, 9, 22), (5, 5, 22, 1), (2, 2), (1, 1), ((1, 2), (2, 1))),
    ((1, 9, 9, 44), (3, 3, 44, 1), (1, 1), (2, 2), ((2, 2), (2, 2))),
    ((2, 20, 19, 13), (3, 3, 13, 1), (1, 1), (1, 1), ((1, 1), (1, 1))),
    ((1, 11, 11, 9), (5, 5, 9, 1), (2, 2), (1, 1), ((0, 1), (0, 1))),
]


def _operands(xs, ks, with_bias):
    rng = np.random.default_rng(sum(xs))
    x = rng.standard_normal(xs).astype(np.float32)
    k = rng.standard_normal(ks).astype(np.float32)
    bias = rng.standard_normal(ks[-2]).astype(np.float32) if with_bias else None
    return x, k, bias


@pytest.mark.parametrize("epilogue", [(False, None), (True, "relu"), (True, "relu6")])
@pytest.mark.parametrize("case", NARROW)
def test_padded_channels_give_the_same_bits(case, epilogue):
    xs, ks, s, d, p = case
    with_bias, act = epilogue
    x, k, bias = _operands(xs, ks, with_bias)
    call = depthwise.forward_call(xs, ks, s, d, p, True, np.float32, with_bias, act)
    if depthwise._use_avx2(True):
        assert type(call).__name__ == "PaddedForwardCall"
    want = depthwise.depthwise_forward(x, k, s, d, p, True, bias=bias, activation=act)
    got = call(x, k, bias)
    assert got.flags.c_contiguous and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # arrays it was not prepared for take depthwise_forward
    xf = np.asfortranarray(x)
    np.testing.assert_array_equal(call(xf, k, bias), want)


@pytest.mark.parametrize("epilogue", [(False, None), (True, "relu6")])
@pytest.mark.parametrize("case", ODD)
def test_odd_channel_counts_run_overlapping_vectors_to_the_same_bits(case, epilogue):
    xs, ks, s, d, p = case
    with_bias, act = epilogue
    x, k, bias = _operands(xs, ks, with_bias)
    call = depthwise.forward_call(xs, ks, s, d, p, True, np.float32, with_bias, act)
    assert type(call).__name__ == "ForwardCall"
    got = call(x, k, bias)
    # every channel as it comes out of a layer of whole vectors of channels
    vl = depthwise.PAD_CHANNELS
    c = xs[-1]
    for lo in sorted(set(list(range(0, c - vl + 1, vl)) + [c - vl])):
        part = slice(lo, lo + vl)
        alone = depthwise.depthwise_forward(
            np.ascontiguousarray(x[..., part]), np.ascontiguousarray(k[:, :, part]), s, d, p,
            True, bias=None if bias is None else bias[part].copy(), activation=act)
        np.testing.assert_array_equal(got[..., part], alone)


def test_whole_vectors_and_multipliers_are_not_padded():
    whole = depthwise.forward_call((1, 8, 8, 16), (3, 3, 16, 1), (1, 1), (1, 1),
                                   ((1, 1), (1, 1)), True, np.float32)
    multiplier = depthwise.forward_call((1, 8, 8, 11), (3, 3, 11, 2), (1, 1), (1, 1),
                                        ((1, 1), (1, 1)), True, np.float32)
    double = depthwise.forward_call((1, 8, 8, 11), (3, 3, 11, 1), (1, 1), (1, 1),
                                    ((1, 1), (1, 1)), True, np.float64)
    for call in (whole, multiplier, double):
        assert type(call).__name__ == "ForwardCall"
