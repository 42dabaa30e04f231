"""Winograd F(2x2, 3x3) forward convolutions (cyback/kernels/winograd.pyx),
2-D and 3-D, reached through conv_forward and prepared calls as the backend
reaches them."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyback.kernels import conv, winograd

from instruction_sets import instruction_set
from kernels.test_conv import _ref_epilogue, ref_backward_input, ref_forward, same_on_threads

pytestmark = pytest.mark.skipif(not winograd.available(),
                                reason="needs winograd: this build has no vector kernels")

STRIDE1 = ((1, 1), (1, 1))


def _geometry(x_shape, w_shape, pads, channels_last=True):
    g, _, _ = conv._geometry(x_shape, w_shape, (1, 1), (1, 1), pads, channels_last, "test")
    return g


def _close(y, ref):
    # Products summed in transform space: a few units in the last place of
    # the largest terms, so the bound scales with the output's magnitude.
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * scale)


@pytest.fixture(params=["avx512", "avx512-6", "avx2", "baseline"])
def wino_isa(request):
    """The AVX-512 kernels (32 output channels per block where F > 16) with
    products in groups of 12 tiles and of 6, the AVX2 ones (16) and the
    baseline ones (8)."""
    winograd._use_wide_tiles(request.param == "avx512")
    try:
        with instruction_set(winograd, request.param.split("-")[0]) as which:
            yield which
    finally:
        winograd._use_wide_tiles(None)


# (N, H, W), C, F, pads: odd output sizes drop a tile's last row / column;
# channels off the vector width and partial output blocks; asymmetric and
# no padding; a single output row and column.
CASES = [
    ((2, 9, 11), 32, 20, [(1, 1), (1, 1)]),
    ((1, 8, 8), 24, 16, [(1, 1), (1, 1)]),
    ((3, 13, 6), 27, 33, [(2, 0), (0, 3)]),
    ((1, 10, 12), 40, 17, [(0, 0), (0, 0)]),
    ((16, 3, 3), 24, 16, [(0, 0), (0, 0)]),
    ((5, 7, 4), 64, 48, [(1, 1), (1, 1)]),
    ((2, 6, 30), 25, 40, [(0, 2), (2, 1)]),
]


EPILOGUES = ["none", "bias_relu", "bias_res_relu6", "res"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_matches_reference(wino_isa, case, epilogue):
    (n, h, w), c, f, pads = case
    rng = np.random.default_rng(10 * CASES.index(case) + EPILOGUES.index(epilogue))
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    k = rng.standard_normal((3, 3, c, f)).astype(np.float32)
    assert conv._use_winograd(_geometry(x.shape, k.shape, pads), True, np.float32)
    ref = ref_forward(x, k, (1, 1), (1, 1), pads)
    bias = rng.standard_normal(f).astype(np.float32) * 4 if "bias" in epilogue else None
    res = rng.standard_normal(ref.shape).astype(np.float32) * 4 if "res" in epilogue else None
    act = {"none": None, "res": None}.get(epilogue, epilogue.rsplit("_", 1)[-1])
    y = conv.conv_forward(x, k, *STRIDE1, pads, bias=bias, residual=res, activation=act)
    assert y.dtype == np.float32 and y.shape == ref.shape
    _close(y, _ref_epilogue(ref, bias, act, res))


def test_avx512_and_avx2_agree_bit_for_bit():
    # Same transforms and the same order of sums per output channel; the
    # AVX-512 set only holds 32 of them per block instead of 16.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 11, 9, 40)).astype(np.float32)
    k = rng.standard_normal((3, 3, 40, 48)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    pads = [(1, 1), (1, 1)]
    with instruction_set(winograd, "avx512"):
        wide = conv.conv_forward(x, k, *STRIDE1, pads, bias=b)
    with instruction_set(winograd, "avx2"):
        narrow = conv.conv_forward(x, k, *STRIDE1, pads, bias=b)
    _close(wide, ref_forward(x, k, (1, 1), (1, 1), pads) + b)
    assert np.array_equal(wide, narrow)


def test_tile_groups_of_12_and_6_agree_bit_for_bit():
    # Each tile's sums run over the channels in the same order whatever group
    # it is in: the 63 tiles go in items of 11, one group each against 6 + 5,
    # with a residual and relu6 in the output transform.
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 13, 17, 70)).astype(np.float32)
    k = rng.standard_normal((3, 3, 70, 40)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    pads = [(1, 1), (1, 1)]
    res = rng.standard_normal((1, 13, 17, 40)).astype(np.float32)
    got = {}
    with instruction_set(winograd, "avx512"):
        for wide in (True, False):
            try:
                assert winograd._use_wide_tiles(wide) == (12 if wide else 6)
                got[wide] = conv.conv_forward(x, k, *STRIDE1, pads, bias=b, residual=res,
                                              activation="relu6")
            finally:
                winograd._use_wide_tiles(None)
    _close(got[True], _ref_epilogue(ref_forward(x, k, (1, 1), (1, 1), pads), b, "relu6", res))
    assert np.array_equal(got[True], got[False])


def test_items_of_24_tiles_from_192_channels():
    # From 192 channels an item holds up to 24 tiles (90 tiles: 4 items of
    # 23 or 22 on two threads); the sums and so the bits are the same on
    # every thread count.
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 17, 19, 200)).astype(np.float32)
    k = rng.standard_normal((3, 3, 200, 24)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    pads = [(1, 1), (1, 1)]
    y = same_on_threads(lambda: conv.conv_forward(x, k, *STRIDE1, pads, bias=b))
    _close(y, ref_forward(x, k, (1, 1), (1, 1), pads) + b)


def test_thread_count_does_not_change_results():
    # The tiles of a work item and the order of every sum are fixed by the
    # shapes; threads only take whole items.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 21, 19, 48)).astype(np.float32)
    k = rng.standard_normal((3, 3, 48, 40)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    y = same_on_threads(lambda: conv.conv_forward(x, k, *STRIDE1, [(1, 1), (1, 1)], bias=b,
                                                  activation="relu"))
    _close(y, _ref_epilogue(ref_forward(x, k, (1, 1), (1, 1), [(1, 1), (1, 1)]), b, "relu"))


def test_agrees_with_the_direct_kernel_to_rounding():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 28, 28, 64)).astype(np.float32)
    k = rng.standard_normal((3, 3, 64, 64)).astype(np.float32)
    y = conv.conv_forward(x, k, *STRIDE1, [(1, 1), (1, 1)])
    conv._TUNE["winograd"] = False
    try:
        y_direct = conv.conv_forward(x, k, *STRIDE1, [(1, 1), (1, 1)])
    finally:
        conv._TUNE["winograd"] = True
    assert not np.array_equal(y, y_direct)     # a different sum, really taken
    _close(y, y_direct)


def test_prepared_call_takes_winograd_and_matches_conv_forward():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 12, 14, 32)).astype(np.float32)
    k = rng.standard_normal((3, 3, 32, 24)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    r = rng.standard_normal((2, 12, 14, 24)).astype(np.float32)
    pads = [(1, 1), (1, 1)]
    call = conv.forward_call(x.shape, k.shape, (1, 1), (1, 1), pads, True, np.float32,
                             has_bias=True, has_residual=True, activation="relu6")
    y = call(x, k, b, r)
    assert np.array_equal(y, conv.conv_forward(x, k, *STRIDE1, pads, bias=b, residual=r,
                                               activation="relu6"))
    _close(y, _ref_epilogue(ref_forward(x, k, (1, 1), (1, 1), pads), b, "relu6", r))
    # read-only and non-contiguous arguments: the checked fallback, same values
    xf = np.asfortranarray(x)
    k.setflags(write=False)
    assert np.array_equal(call(xf, k, b, r), y)


def test_float16_noncontiguous_and_empty_inputs():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 10, 20, 32)).astype(np.float32)[:, :, ::2]
    k = rng.standard_normal((3, 3, 32, 16)).astype(np.float32)
    pads = [(1, 1), (1, 1)]
    _close(conv.conv_forward(x, k, *STRIDE1, pads), ref_forward(x, k, (1, 1), (1, 1), pads))
    y16 = conv.conv_forward(x.astype(np.float16), k.astype(np.float16), *STRIDE1, pads)
    assert y16.dtype == np.float16
    ref16 = ref_forward(x.astype(np.float16), k.astype(np.float16), (1, 1), (1, 1), pads)
    np.testing.assert_allclose(y16, ref16, rtol=2e-3, atol=2e-2 * np.abs(ref16).max())
    empty = conv.conv_forward(np.zeros((0, 10, 10, 32), np.float32), k, *STRIDE1, pads)
    assert empty.shape == (0, 10, 10, 16)


def test_input_gradient_of_a_stride1_conv_runs_it_too():
    # The input gradient of a stride-1 convolution is a forward convolution
    # with the flipped kernel, F -> C channels: Winograd once F >= 24.
    rng = np.random.default_rng(7)
    k = rng.standard_normal((3, 3, 20, 32)).astype(np.float32)
    dy = rng.standard_normal((2, 9, 9, 32)).astype(np.float32)
    pads = [(1, 1), (1, 1)]
    assert conv._use_winograd(_geometry((2, 9, 9, 32), (3, 3, 32, 20), pads), True, np.float32)
    dx = conv.conv_backward_input(dy, k, (2, 9, 9, 20), (1, 1), (1, 1), pads)
    _close(dx, ref_backward_input(dy, k, (2, 9, 9, 20), (1, 1), (1, 1), pads))


@pytest.mark.parametrize("x_shape, k_shape, strides, dilation, last, dtype, why", [
    ((2, 16, 16, 32), (3, 3, 32, 32), (1, 1), (1, 1), True, np.float32, None),
    ((2, 16, 16, 32), (3, 3, 32, 32), (1, 1), (1, 1), True, np.float64, "float64"),
    ((2, 32, 16, 16), (3, 3, 32, 32), (1, 1), (1, 1), False, np.float32, None),
    ((2, 32, 16, 16), (3, 3, 32, 32), (1, 1), (1, 1), False, np.float64, "float64 first"),
    ((2, 16, 16, 32), (3, 3, 32, 32), (2, 2), (1, 1), True, np.float32, "strides"),
    ((2, 16, 16, 32), (3, 3, 32, 32), (1, 1), (2, 2), True, np.float32, "dilation"),
    ((2, 16, 16, 32), (5, 5, 32, 32), (1, 1), (1, 1), True, np.float32, "5x5"),
    ((2, 16, 16, 32), (3, 1, 32, 32), (1, 1), (1, 1), True, np.float32, "3x1"),
    ((2, 64, 32), (3, 32, 32), (1,), (1,), True, np.float32, "1-D"),
    ((2, 4, 8, 8, 32), (3, 3, 3, 32, 32), (1, 1, 1), (1, 1, 1), True, np.float32, None),
    ((2, 4, 8, 8, 12), (3, 3, 3, 12, 32), (1, 1, 1), (1, 1, 1), True, np.float32, None),
    ((2, 4, 8, 8, 8), (3, 3, 3, 8, 32), (1, 1, 1), (1, 1, 1), True, np.float32,
     "8 channels in 3-D"),
    ((2, 4, 8, 8, 32), (5, 3, 3, 32, 32), (1, 1, 1), (1, 1, 1), True, np.float32, None),
    ((2, 4, 8, 8, 32), (3, 3, 3, 32, 32), (2, 1, 1), (1, 1, 1), True, np.float32,
     "depth stride"),
    ((2, 4, 8, 8, 32), (3, 3, 3, 32, 32), (1, 1, 1), (2, 1, 1), True, np.float32,
     "depth dilation"),
    ((2, 4, 8, 8, 32), (3, 3, 5, 32, 32), (1, 1, 1), (1, 1, 1), True, np.float32, "3x3x5"),
    ((2, 32, 4, 8, 8), (3, 3, 3, 32, 32), (1, 1, 1), (1, 1, 1), False, np.float32, None),
    ((2, 16, 16, 24), (3, 3, 24, 32), (1, 1), (1, 1), True, np.float32, None),
    ((2, 16, 16, 12), (3, 3, 12, 32), (1, 1), (1, 1), True, np.float32, "12 channels in"),
    ((2, 16, 16, 32), (3, 3, 32, 8), (1, 1), (1, 1), True, np.float32, "8 channels out"),
    ((1, 6, 6, 32), (3, 3, 32, 32), (1, 1), (1, 1), True, np.float32, "9 tiles"),
    ((1, 7, 7, 512), (3, 3, 512, 512), (1, 1), (1, 1), True, np.float32,
     "16 tiles for a 16 MB kernel"),
    ((1, 8, 8, 2048), (3, 3, 2048, 32), (1, 1), (1, 1), True, np.float32, "2048 channels"),
])
def test_where_it_runs(x_shape, k_shape, strides, dilation, last, dtype, why):
    rank = len(x_shape) - 2
    pads = [(1, 1)] * rank
    g, _, _ = conv._geometry(x_shape, k_shape, strides, dilation, pads, last, "test")
    assert conv._use_winograd(g, last, dtype) == (why is None), why
    for off in ("winograd",) + (() if last else ("winograd_channels_first",)):
        conv._TUNE[off] = False
        try:
            assert not conv._use_winograd(g, last, dtype)
        finally:
            conv._TUNE[off] = True


@pytest.mark.parametrize("case", CASES[:4])
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_channels_first_through_channels_last_copies(case, epilogue):
    # x and y go through channels_last copies made on the team; a residual
    # (and so the bias and activation after it) is added by the caller.
    (n, h, w), c, f, pads = case
    rng = np.random.default_rng(100 + 10 * CASES.index(case) + EPILOGUES.index(epilogue))
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    k = rng.standard_normal((3, 3, c, f)).astype(np.float32)
    assert conv._use_winograd(_geometry(x.shape, k.shape, pads, False), False, np.float32)
    ref = np.moveaxis(ref_forward(np.moveaxis(x, 1, -1), k, (1, 1), (1, 1), pads), -1, 1)
    bias = rng.standard_normal(f).astype(np.float32) * 4 if "bias" in epilogue else None
    res = rng.standard_normal(ref.shape).astype(np.float32) * 4 if "res" in epilogue else None
    act = {"none": None, "res": None}.get(epilogue, epilogue.rsplit("_", 1)[-1])
    want = np.moveaxis(_ref_epilogue(np.moveaxis(ref, 1, -1), bias, act,
                                     None if res is None else np.moveaxis(res, 1, -1)), -1, 1)

    def run():
        return conv.conv_forward(x, k, *STRIDE1, pads, channels_last=False, bias=bias,
                                 residual=res, activation=act)
    y = same_on_threads(run)
    _close(y, want)
    call = conv.forward_call(x.shape, k.shape, (1, 1), (1, 1), pads, False, np.float32,
                             bias is not None, res is not None, act)
    assert np.array_equal(call(x, k, bias, res), y)
    # the same sums as channels_last: the copies move values, nothing else
    y_last = conv.conv_forward(np.moveaxis(x, 1, -1).copy(), k, *STRIDE1, pads, bias=bias,
                               residual=None if res is None else np.moveaxis(res, 1, -1).copy(),
                               activation=act)
    assert np.array_equal(np.moveaxis(y_last, -1, 1), y)


def test_environment_switch(monkeypatch):
    for value, on in [("0", False), ("1", True), ("", True), (" 0 ", False)]:
        monkeypatch.setenv("CYBACK_WINOGRAD", value)
        assert conv._env_winograd() is on
    monkeypatch.setenv("CYBACK_WINOGRAD", "yes")
    from cyback.kernels._checks import ConfigWarning
    with pytest.warns(ConfigWarning, match="CYBACK_WINOGRAD must be 0 or 1.*the default"):
        assert conv._env_winograd() is True


def test_bad_geometries_are_refused():
    with pytest.raises(ValueError, match="unsupported geometry"):
        winograd.Winograd(1, 8, 8, 4096, 16, 8, 8, 1, 1)
    with pytest.raises(ValueError, match="unsupported geometry"):
        winograd.Winograd(1, 8, 8, 32, 0, 8, 8, 1, 1)


@st.composite
def geometries(draw):
    n = draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    pads = [(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(2)]
    if h + sum(pads[0]) < 3 or w + sum(pads[1]) < 3:
        pads = [(1, 1), (1, 1)]
    if h + sum(pads[0]) < 3 or w + sum(pads[1]) < 3:
        h, w = 3, 3
    c, f = draw(st.integers(24, 40)), draw(st.integers(16, 40))
    return n, h, w, c, f, pads


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(geometries(), st.integers(0, 2**31 - 1))
def test_random_geometries(geo, seed):
    n, h, w, c, f, pads = geo
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    k = rng.standard_normal((3, 3, c, f)).astype(np.float32)
    old = conv._TUNE["winograd_min_tiles"]
    conv._TUNE["winograd_min_tiles"] = 1      # every geometry, however small
    try:
        assert conv._use_winograd(_geometry(x.shape, k.shape, pads), True, np.float32)
        y = conv.conv_forward(x, k, *STRIDE1, pads)
    finally:
        conv._TUNE["winograd_min_tiles"] = old
    _close(y, ref_forward(x, k, (1, 1), (1, 1), pads))


@pytest.fixture(params=["cached", "uncached"])
def kernel_cache(request):
    """Prepared calls keeping their kernel's transform, and (the limit at 0)
    transforming it on every call."""
    old = winograd._max_cached_kernel_bytes()
    if request.param == "uncached":
        winograd._max_cached_kernel_bytes(0)
    try:
        yield request.param
    finally:
        winograd._max_cached_kernel_bytes(old)


@pytest.mark.parametrize("c, f", [(32, 48), (136, 150)])
def test_prepared_call_reuses_the_transform_only_for_the_same_kernel_values(kernel_cache, c, f):
    # 136 x 150 channels: a 734 KB kernel, above what the cache once kept.
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 10, 10, c)).astype(np.float32)
    k = rng.standard_normal((3, 3, c, f)).astype(np.float32)
    pads = [(1, 1), (1, 1)]
    call = conv.forward_call(x.shape, k.shape, (1, 1), (1, 1), pads, True, np.float32)

    def fresh(kernel):
        return conv.conv_forward(x, kernel, *STRIDE1, pads)

    y = call(x, k)
    assert np.array_equal(y, fresh(k))
    assert np.array_equal(call(x, k.copy()), y)          # equal values, another array
    k[1, 2, 5, 7] += 1.0                                  # changed in place
    assert np.array_equal(call(x, k), fresh(k))
    k2 = rng.standard_normal(k.shape).astype(np.float32)  # a new kernel
    assert np.array_equal(call(x, k2), fresh(k2))
    assert np.array_equal(call(x, k), fresh(k))           # and back
    with instruction_set(winograd, "baseline"):           # another block width
        yb = call(x, k)
    _close(yb, ref_forward(x, k, (1, 1), (1, 1), pads))
    assert np.array_equal(call(x, k), fresh(k))


def test_prepared_calls_share_a_cache_across_threads():
    import concurrent.futures
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 12, 12, 32)).astype(np.float32)
    ks = [rng.standard_normal((3, 3, 32, 32)).astype(np.float32) for _ in range(3)]
    pads = [(1, 1), (1, 1)]
    call = conv.forward_call(x.shape, ks[0].shape, (1, 1), (1, 1), pads, True, np.float32)
    want = [conv.conv_forward(x, k, *STRIDE1, pads) for k in ks]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: (i % 3, call(x, ks[i % 3])), range(60)))
    for i, y in got:
        assert np.array_equal(y, want[i])


def test_non_finite_inputs_reach_the_same_outputs_as_the_direct_sum():
    # Each input position of a tile enters only the transformed positions
    # whose outputs read it, so a NaN reaches exactly the outputs whose 3x3
    # window holds it; an infinity may come out as NaN there instead of
    # +-inf (the transforms take differences).
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, 12, 12, 32)).astype(np.float32)
    k = rng.standard_normal((3, 3, 32, 16)).astype(np.float32)
    pads = [(1, 1), (1, 1)]
    for r, c in [(5, 6), (0, 0), (11, 11), (4, 9)]:
        xn = x.copy()
        xn[0, r, c, 3] = np.nan
        y = conv.conv_forward(xn, k, *STRIDE1, pads)
        hit = np.zeros(y.shape[1:], bool)
        hit[max(r - 1, 0):r + 2, max(c - 1, 0):c + 2] = True
        assert np.isnan(y[0][hit]).all()
        assert np.isfinite(y[0][~hit]).all()
        xi = x.copy()
        xi[0, r, c, 3] = np.inf
        yi = conv.conv_forward(xi, k, *STRIDE1, pads)
        assert np.isfinite(yi[0][~hit]).all() and not np.isfinite(yi[0][hit]).any()


def test_sixteen_channels_with_short_avx512_tiles_need_wide_outputs():
    # With the direct kernel's 6-pixel AVX-512 tiles, 16 channels in take
    # Winograd once F > 16 (its two-vector blocks); with 12-pixel tiles 24.
    if not conv._use_avx512(True):
        pytest.skip("needs avx512: AVX-512 is off: no AVX-512F on this CPU, or CYBACK_AVX512=0")

    def runs(c, f):
        g, _, _ = conv._geometry((2, 16, 16, c), (3, 3, c, f), (1, 1), (1, 1), [(1, 1)] * 2,
                                 True, "test")
        return conv._use_winograd(g, True, np.float32)
    try:
        conv._use_wide_tiles(False)
        assert runs(16, 32) and runs(16, 17) and not runs(16, 16) and not runs(12, 32)
        conv._use_wide_tiles(True)
        assert not runs(16, 32) and runs(24, 32)
    finally:
        conv._use_wide_tiles(None)


def test_the_fewest_channels_depend_on_the_kernel_set():
    # 16 channels in: Winograd beside the AVX2 (6-pixel) direct tiles, the
    # direct kernel beside AVX-512's 12-pixel ones; _TUNE overrides either.
    g, _, _ = conv._geometry((2, 16, 16, 16), (3, 3, 16, 32), (1, 1), (1, 1), [(1, 1)] * 2,
                             True, "test")
    had512 = conv._use_avx512(True)
    conv._use_wide_tiles(True)
    try:
        assert conv._use_winograd(g, True, np.float32) == (winograd.available() and not had512)
        conv._use_avx512(False)
        assert conv._use_winograd(g, True, np.float32) == winograd.available()
        conv._TUNE["winograd_min_c"] = 24
        assert not conv._use_winograd(g, True, np.float32)
    finally:
        conv._TUNE["winograd_min_c"] = None
        conv._use_avx512(True)
        conv._use_wide_tiles(None)
    conv._TUNE["winograd_min_c"] = 16
    try:
        assert conv._use_winograd(g, True, np.float32) == winograd.available()
    finally:
        conv._TUNE["winograd_min_c"] = None


# 3-D: (N, D, H, W), C, F, pads. Depth padding on either side or none, a
# kernel deeper and shallower than 3, one output plane, odd tiles.
CASES_3D = [
    ((2, 5, 9, 11), (3, 3, 3), 32, 20, [(1, 1), (1, 1), (1, 1)]),
    ((1, 4, 6, 6), (3, 3, 3), 24, 33, [(0, 0), (0, 0), (0, 0)]),
    ((2, 6, 7, 5), (2, 3, 3), 40, 17, [(1, 0), (2, 0), (0, 1)]),
    ((2, 3, 8, 8), (1, 3, 3), 32, 32, [(0, 0), (1, 1), (1, 1)]),
    ((1, 3, 8, 9), (5, 3, 3), 12, 48, [(2, 2), (1, 1), (1, 1)]),
    ((3, 1, 5, 4), (3, 3, 3), 16, 16, [(1, 1), (1, 1), (1, 1)]),
]


@pytest.mark.parametrize("case", CASES_3D)
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_3d_matches_reference(wino_isa, case, epilogue):
    # The depth taps join the channels of the 16 products: one sum over
    # (kd, c) per transformed position.
    (n, d, h, w), kdims, c, f, pads = case
    rng = np.random.default_rng(300 + 10 * CASES_3D.index(case) + EPILOGUES.index(epilogue))
    x = rng.standard_normal((n, d, h, w, c)).astype(np.float32)
    k = rng.standard_normal(kdims + (c, f)).astype(np.float32)
    ones = (1, 1, 1)
    g, _, _ = conv._geometry(x.shape, k.shape, ones, ones, pads, True, "test")
    old = conv._TUNE["winograd_min_tiles"]
    conv._TUNE["winograd_min_tiles"] = 1
    try:
        assert conv._use_winograd(g, True, np.float32)
        ref = ref_forward(x, k, ones, ones, pads)
        bias = rng.standard_normal(f).astype(np.float32) * 4 if "bias" in epilogue else None
        res = rng.standard_normal(ref.shape).astype(np.float32) * 4 if "res" in epilogue \
            else None
        act = {"none": None, "res": None}.get(epilogue, epilogue.rsplit("_", 1)[-1])
        y = same_on_threads(lambda: conv.conv_forward(x, k, ones, ones, pads, bias=bias,
                                                      residual=res, activation=act))
    finally:
        conv._TUNE["winograd_min_tiles"] = old
    assert y.dtype == np.float32 and y.shape == ref.shape
    _close(y, _ref_epilogue(ref, bias, act, res))


def test_3d_channels_first_prepared_call_and_input_gradient():
    rng = np.random.default_rng(31)
    ones = (1, 1, 1)
    pads = [(1, 1)] * 3
    x = rng.standard_normal((2, 32, 4, 10, 9)).astype(np.float32)
    k = rng.standard_normal((3, 3, 3, 32, 24)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    g, _, _ = conv._geometry(x.shape, k.shape, ones, ones, pads, False, "test")
    assert conv._use_winograd(g, False, np.float32)
    x_last = np.moveaxis(x, 1, -1)
    want = np.moveaxis(_ref_epilogue(ref_forward(x_last, k, ones, ones, pads), b, "relu"), -1, 1)
    y = conv.conv_forward(x, k, ones, ones, pads, channels_last=False, bias=b,
                          activation="relu")
    _close(y, want)
    # the channels_last call makes the same sums
    y_last = conv.conv_forward(x_last.copy(), k, ones, ones, pads, bias=b, activation="relu")
    assert np.array_equal(np.moveaxis(y_last, -1, 1), y)
    call = conv.forward_call(x_last.shape, k.shape, ones, ones, pads, True, np.float32,
                             has_bias=True, activation="relu")
    assert np.array_equal(call(x_last.copy(), k, b), y_last)
    assert np.array_equal(call(x_last.copy(), k, b), y_last)    # the kept transform
    # the input gradient of a stride-1 conv3d is one too (F = 24 -> C = 32)
    dy = rng.standard_normal((2, 4, 10, 9, 24)).astype(np.float32)
    kg = rng.standard_normal((3, 3, 3, 32, 24)).astype(np.float32)
    g, _, _ = conv._geometry(dy.shape, (3, 3, 3, 24, 32), ones, ones, pads, True, "test")
    assert conv._use_winograd(g, True, np.float32)
    dx = conv.conv_backward_input(dy, kg, (2, 4, 10, 9, 32), ones, ones, pads)
    _close(dx, ref_backward_input(dy, kg, (2, 4, 10, 9, 32), ones, ones, pads))


def test_3d_agrees_with_the_direct_kernel_and_bad_geometries_are_refused():
    rng = np.random.default_rng(32)
    ones = (1, 1, 1)
    x = rng.standard_normal((2, 6, 12, 12, 32)).astype(np.float32)
    k = rng.standard_normal((3, 3, 3, 32, 32)).astype(np.float32)
    y = conv.conv_forward(x, k, ones, ones, [(1, 1)] * 3)
    conv._TUNE["winograd"] = False
    try:
        y_direct = conv.conv_forward(x, k, ones, ones, [(1, 1)] * 3)
    finally:
        conv._TUNE["winograd"] = True
    assert not np.array_equal(y, y_direct)     # a different sum, really taken
    _close(y, y_direct)
    for bad in [dict(D=0), dict(OD=0), dict(KD=0), dict(pd=-1)]:
        args = dict(D=4, OD=4, KD=3, pd=1)
        args.update(bad)
        with pytest.raises(ValueError, match="unsupported geometry"):
            winograd.Winograd(1, 8, 8, 32, 16, 8, 8, 1, 1, **args)
