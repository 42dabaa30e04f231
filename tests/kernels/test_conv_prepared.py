"""conv.forward_call: a prepared conv_forward gives conv_forward's results
bit for bit on every path, falls back to conv_forward for any array that
does not fit what it was prepared for (and for changed tuning), and raises
conv_forward's errors when it is prepared."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyback.kernels import conv

# x shape, kernel shape, strides, dilation, pads, channels_last: the direct
# kernel (with and without its padded copy), the 1x1 blocks, the stride-1
# taps, im2col, channels_first, 1-D and 3-D, an empty batch
CASES = [
    ((1, 32, 32, 16), (3, 3, 16, 16), (1, 1), (1, 1), ((1, 1), (1, 1)), True),
    ((2, 26, 26, 32), (3, 3, 32, 64), (1, 1), (1, 1), ((0, 0), (0, 0)), True),
    ((1, 9, 9, 16), (1, 1, 16, 32), (1, 1), (1, 1), ((0, 0), (0, 0)), True),
    ((2, 7, 7, 128), (1, 1, 128, 64), (1, 1), (1, 1), ((0, 0), (0, 0)), True),
    ((1, 12, 12, 64), (3, 3, 64, 64), (1, 1), (1, 1), ((1, 1), (1, 1)), True),
    ((2, 15, 15, 8), (3, 3, 8, 4), (2, 2), (1, 1), ((1, 0), (1, 0)), True),
    ((2, 3, 11, 10), (3, 2, 3, 5), (1, 2), (2, 1), ((2, 2), (0, 1)), False),
    ((3, 50, 4), (5, 4, 24), (2,), (1,), ((2, 2),), True),
    ((1, 4, 5, 6, 3), (2, 3, 3, 3, 17), (1, 1, 1), (1, 1, 1), ((1, 0), (1, 1), (1, 1)), True),
    ((0, 8, 8, 3), (3, 3, 3, 16), (1, 1), (1, 1), ((1, 1), (1, 1)), True),
]


def _arrays(case, dtype, with_bias, with_res, seed=0):
    xs, ks, s, d, p, last = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    k = rng.standard_normal(ks).astype(dtype)
    bias = rng.standard_normal(ks[-1]).astype(dtype) if with_bias else None
    y = conv.conv_forward(x, k, s, d, p, last)
    res = rng.standard_normal(y.shape).astype(dtype) if with_res else None
    return x, k, bias, res


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("epilogue", [(False, False, None), (True, False, "relu"),
                                      (True, True, "relu6"), (False, True, None)])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_same_bits_as_conv_forward(case, epilogue, dtype):
    xs, ks, s, d, p, last = CASES[case]
    with_bias, with_res, act = epilogue
    x, k, bias, res = _arrays(CASES[case], dtype, with_bias, with_res)
    want = conv.conv_forward(x, k, s, d, p, last, bias=bias, residual=res, activation=act)
    call = conv.forward_call(xs, ks, s, d, p, last, dtype, with_bias, with_res, act)
    for _ in range(2):              # scratch reused or not, the same answer
        y = call(x, k, bias, res)
        assert y.dtype == dtype and y.shape == want.shape
        np.testing.assert_array_equal(y, want)


def _counting_fallback(monkeypatch):
    calls = []
    plain = conv.conv_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return plain(*args, **kwargs)
    monkeypatch.setattr(conv, "conv_forward", counted)
    return calls


def test_arrays_that_do_not_fit_take_conv_forward(monkeypatch):
    case = CASES[0]
    xs, ks, s, d, p, last = case
    x, k, bias, _ = _arrays(case, np.float32, True, False)
    want = conv.conv_forward(x, k, s, d, p, last, bias=bias, activation="relu")
    unbiased = conv.conv_forward(x, k, s, d, p, last, activation="relu")
    call = conv.forward_call(xs, ks, s, d, p, last, np.float32, True, False, "relu")
    calls = _counting_fallback(monkeypatch)
    np.testing.assert_array_equal(call(x, k, bias), want)
    assert calls == []
    readonly = x.copy()
    readonly.flags.writeable = False
    np.testing.assert_array_equal(call(readonly, k, bias), want)   # reads only: fits
    assert calls == []
    strided = np.asfortranarray(x)
    np.testing.assert_array_equal(call(strided, k, bias), want)
    wide = x.astype(np.float64)
    assert call(wide, k.astype(np.float64), bias.astype(np.float64)).dtype == np.float64
    np.testing.assert_array_equal(call(x, k, None), unbiased)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="conv_forward: kernel"):
        call(x, k[:, :, :8], bias)
    with pytest.raises(TypeError, match="conv_forward"):       # not read as native floats
        call(x.astype(">f4"), k, bias)
    with pytest.raises(TypeError, match="conv_forward: dtype mismatch"):
        call(x, k.astype(np.float64), bias)


def test_changed_tuning_takes_conv_forward(monkeypatch):
    case = CASES[0]
    xs, ks, s, d, p, last = case
    x, k, _, _ = _arrays(case, np.float32, False, False)
    call = conv.forward_call(xs, ks, s, d, p, last, np.float32)
    direct = call(x, k)
    calls = _counting_fallback(monkeypatch)
    old = conv._TUNE["direct"]
    conv._TUNE["direct"] = False
    try:
        im2col = call(x, k)
    finally:
        conv._TUNE["direct"] = old
    assert calls == [1]
    np.testing.assert_allclose(im2col, direct, rtol=1e-5, atol=1e-5)


def test_preparing_checks_like_conv_forward():
    xs, ks = (1, 8, 8, 3), (3, 3, 3, 4)
    with pytest.raises(ValueError, match="conv_forward: activation"):
        conv.forward_call(xs, ks, (1, 1), (1, 1), ((0, 0), (0, 0)), True, "float32",
                          activation="tanh")
    with pytest.raises(TypeError, match="conv_forward: expected float32 or float64"):
        conv.forward_call(xs, ks, (1, 1), (1, 1), ((0, 0), (0, 0)), True, "float16")
    with pytest.raises(ValueError, match="conv_forward: kernel"):
        conv.forward_call(xs, (3, 3, 5, 4), (1, 1), (1, 1), ((0, 0), (0, 0)), True, "float32")
    with pytest.raises(ValueError, match="conv_forward: strides"):
        conv.forward_call(xs, ks, (0, 1), (1, 1), ((0, 0), (0, 0)), True, "float32")


@st.composite
def _geometries(draw):
    rank = draw(st.integers(1, 3))
    ks, ss, ds, ps, sp = [], [], [], [], []
    for _ in range(rank):
        k, s, d = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
        span = (k - 1) * d + 1
        a, b = draw(st.integers(0, span)), draw(st.integers(0, span))
        ks.append(k)
        ss.append(s)
        ds.append(d)
        ps.append((a, b))
        sp.append(draw(st.integers(max(1, span - a - b), span + 7)))
    c, f = draw(st.integers(1, 20)), draw(st.integers(1, 40))
    last = draw(st.booleans())
    n = draw(st.integers(0, 3))
    xs = (n,) + tuple(sp) + (c,) if last else (n, c) + tuple(sp)
    return xs, tuple(ks) + (c, f), tuple(ss), tuple(ds), tuple(ps), last


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_geometries(), st.sampled_from([np.float32, np.float64]), st.booleans(),
       st.booleans(), st.sampled_from([None, "relu", "relu6"]), st.integers(0, 2 ** 31))
def test_any_geometry_same_bits_as_conv_forward(geom, dtype, with_bias, with_res, act, seed):
    xs, ks, s, d, p, last = geom
    x, k, bias, res = _arrays(geom, dtype, with_bias, with_res, seed)
    want = conv.conv_forward(x, k, s, d, p, last, bias=bias, residual=res, activation=act)
    call = conv.forward_call(xs, ks, s, d, p, last, dtype, with_bias, with_res, act)
    np.testing.assert_array_equal(call(x, k, bias, res), want)
