"""conv.packed_forward_call (kernels/conv_packed.pxi): convolutions of few
output positions as the patch matrix times the kernel packed in panels,
against a float64 NumPy reference; which geometries its rule takes."""
import numpy as np
import pytest

from cyback.kernels import conv, linalg

from .test_conv import ref_forward
from instruction_sets import instruction_set


def _packed(k):
    return linalg.pack_panels(k.reshape(-1, k.shape[-1]))


def _check(got, want, k):
    scale = max(1.0, float(np.abs(want).max()))
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * scale * k.size ** 0.25)


# x shape, kernel shape, strides, dilation, pads: the layers it is made for
# (a 5x5 on a 7x7 map at batch 1, 1x1 on few pixels, asymmetric 1x7, a
# strided 3x3, a dilated one, 1-D and 3-D) and odd sizes
CASES = [
    ((1, 7, 7, 72), (5, 5, 72, 40), (1, 1), (1, 1), ((2, 2), (2, 2))),
    ((1, 7, 7, 96), (1, 1, 96, 33), (1, 1), (1, 1), ((0, 0), (0, 0))),
    ((2, 5, 6, 80), (1, 1, 80, 17), (1, 1), (1, 1), ((0, 0), (0, 0))),
    ((1, 9, 9, 70), (1, 7, 70, 24), (1, 1), (1, 1), ((0, 0), (3, 3))),
    ((1, 11, 13, 65), (3, 3, 65, 20), (2, 2), (1, 1), ((0, 1), (1, 1))),
    ((1, 9, 9, 66), (3, 3, 66, 16), (1, 1), (2, 2), ((2, 2), (2, 2))),
    ((3, 10, 80), (3, 80, 30), (2,), (1,), ((1, 1),)),
    ((1, 4, 5, 5, 70), (3, 2, 2, 70, 18), (1, 1, 1), (1, 1, 1), ((1, 1), (1, 0), (0, 1))),
    ((1, 1, 1, 130), (1, 1, 130, 1), (1, 1), (1, 1), ((0, 0), (0, 0))),
]


@pytest.mark.parametrize("which", ["avx512", "avx2"])
@pytest.mark.parametrize("case", CASES)
def test_matches_the_reference(which, case, rng):
    xs, ks, strides, dilation, pads = case
    x = rng.standard_normal(xs).astype(np.float32)
    k = rng.standard_normal(ks).astype(np.float32)
    with instruction_set(linalg, which):
        call = conv.packed_forward_call(xs, ks, strides, dilation, pads, True, np.float32)
        assert call is not None
        got = call(x, _packed(k))
    _check(got, ref_forward(x, k, strides, dilation, pads), k)


@pytest.mark.parametrize("act", [None, "relu", "relu6"])
def test_bias_residual_and_activation_in_the_tile(act, rng):
    xs, ks, strides, dilation, pads = CASES[0]
    x = rng.standard_normal(xs).astype(np.float32)
    k = rng.standard_normal(ks).astype(np.float32)
    b = rng.standard_normal(ks[-1]).astype(np.float32)
    want = ref_forward(x, k, strides, dilation, pads) + b
    res = rng.standard_normal(want.shape).astype(np.float32)
    want = want + res
    if act:
        want = np.maximum(want, 0)
        if act == "relu6":
            want = np.minimum(want, 6)
    call = conv.packed_forward_call(xs, ks, strides, dilation, pads, True, np.float32, True,
                                    True, act)
    _check(call(x, _packed(k), b, res), want, k)
    # the same arguments as conv_forward: the same result up to the order of sums
    plain = conv.conv_forward(x, k, strides, dilation, pads, True, bias=b, residual=res,
                              activation=act)
    np.testing.assert_allclose(call(x, _packed(k), b, res), plain, rtol=1e-5, atol=1e-4)


def test_arrays_it_was_not_prepared_for_give_none(rng):
    xs, ks, strides, dilation, pads = CASES[0]
    x = rng.standard_normal(xs).astype(np.float32)
    k = rng.standard_normal(ks).astype(np.float32)
    call = conv.packed_forward_call(xs, ks, strides, dilation, pads, True, np.float32, True)
    b = np.zeros(ks[-1], np.float32)
    assert call(x, _packed(k)) is None                          # prepared with a bias
    assert call(x[:, :, :, :-1], _packed(k), b) is None
    assert call(x.astype(np.float64), _packed(k), b) is None
    assert call(x, _packed(k[..., :32]), b) is None                  # fewer panels
    assert call(x, _packed(k), b, np.zeros((1, 7, 7, 40), np.float32)) is None
    assert call(np.asfortranarray(x), _packed(k), b) is None


def test_it_takes_winograds_layers_of_few_positions_and_many_channels(rng):
    xs, ks = (1, 10, 10, 128), (3, 3, 128, 72)
    pads = ((1, 1), (1, 1))
    call = conv.packed_forward_call(xs, ks, (1, 1), (1, 1), pads, True, np.float32)
    assert call is not None
    x = rng.standard_normal(xs).astype(np.float32)
    k = rng.standard_normal(ks).astype(np.float32)
    _check(call(x, _packed(k)), ref_forward(x, k, (1, 1), (1, 1), pads), k)


def test_it_takes_small_odd_maps_winograds_tiles_overcover(rng):
    # 7x7 maps: 4x4 Winograd tiles compute 64 outputs for 49, so up to
    # CB_PG_MAX_ROWS positions run packed (ResNet-50's last stage at batch 8)
    pads = ((1, 1), (1, 1))
    assert conv.packed_forward_call((8, 7, 7, 512), (3, 3, 512, 512), (1, 1), (1, 1), pads,
                                    True, np.float32) is not None
    assert conv.packed_forward_call((11, 7, 7, 512), (3, 3, 512, 512), (1, 1), (1, 1), pads,
                                    True, np.float32) is None       # 539 positions
    assert conv.packed_forward_call((2, 14, 14, 256), (3, 3, 256, 256), (1, 1), (1, 1), pads,
                                    True, np.float32) is None       # even: covered exactly
    xs, ks = (3, 7, 7, 128), (3, 3, 128, 64)
    call = conv.packed_forward_call(xs, ks, (1, 1), (1, 1), pads, True, np.float32)
    assert call is not None
    x = rng.standard_normal(xs).astype(np.float32)
    k = rng.standard_normal(ks).astype(np.float32)
    _check(call(x, _packed(k)), ref_forward(x, k, (1, 1), (1, 1), pads), k)


@pytest.mark.parametrize("case,why", [
    (((1, 7, 7, 32), (3, 3, 32, 64), (1, 1), (1, 1), ((1, 1), (1, 1))), "winograd"),
    (((1, 17, 17, 128), (3, 3, 128, 64), (1, 1), (1, 1), ((1, 1), (1, 1))), "winograd"),
    (((1, 14, 14, 128), (3, 3, 128, 32), (1, 1), (1, 1), ((1, 1), (1, 1))), "winograd"),
    (((1, 400, 50), (3, 50, 250), (1,), (1,), ((0, 0),)), "direct kernel"),
    (((1, 30, 30, 64), (1, 1, 64, 64), (1, 1), (1, 1), ((0, 0), (0, 0))), "too many rows"),
    (((1, 30, 30, 300), (1, 1, 300, 200), (1, 1), (1, 1), ((0, 0), (0, 0))), "widens"),
    (((1, 50, 50, 300), (1, 1, 300, 64), (1, 1), (1, 1), ((0, 0), (0, 0))), "too many rows"),
    (((1, 30, 30, 64), (3, 3, 64, 16), (1, 1), (1, 1), ((1, 1), (1, 1))), "im2col rows"),
    (((0, 7, 7, 72), (3, 3, 72, 40), (1, 1), (1, 1), ((1, 1), (1, 1))), "empty batch"),
])
def test_the_rule_leaves_what_other_strategies_do_better(case, why):
    xs, ks, strides, dilation, pads = case
    assert conv.packed_forward_call(xs, ks, strides, dilation, pads, True, np.float32) is None, \
        why


def test_a_bottleneck_projection_of_many_positions_runs_packed(rng):
    xs, ks = (2, 20, 20, 300), (1, 1, 300, 40)
    pads = ((0, 0), (0, 0))
    call = conv.packed_forward_call(xs, ks, (1, 1), (1, 1), pads, True, np.float32)
    assert call is not None
    x = rng.standard_normal(xs).astype(np.float32)
    k = rng.standard_normal(ks).astype(np.float32)
    _check(call(x, _packed(k)), ref_forward(x, k, (1, 1), (1, 1), pads), k)


def test_the_rule_takes_only_channels_last_float32():
    xs, ks, strides, dilation, pads = CASES[0]
    assert conv.packed_forward_call(xs, ks, strides, dilation, pads, True, np.float64) is None
    first = (1, 72, 7, 7)
    assert conv.packed_forward_call(first, ks, strides, dilation, pads, False,
                                    np.float32) is None


def test_can_be_turned_off():
    xs, ks, strides, dilation, pads = CASES[0]
    saved = conv._TUNE["packed"]
    conv._TUNE["packed"] = False
    try:
        assert conv.packed_forward_call(xs, ks, strides, dilation, pads, True,
                                        np.float32) is None
    finally:
        conv._TUNE["packed"] = saved


def test_bad_arguments_raise_conv_forwards_errors():
    with pytest.raises(ValueError, match="expects 4 input channels"):
        conv.packed_forward_call((1, 7, 7, 3), (3, 3, 4, 8), (1, 1), (1, 1),
                                 ((1, 1), (1, 1)), True, np.float32)
    with pytest.raises(ValueError, match="activation must be one of"):
        conv.packed_forward_call((1, 7, 7, 4), (3, 3, 4, 8), (1, 1), (1, 1),
                                 ((1, 1), (1, 1)), True, np.float32, activation="tanh")


def test_the_same_bits_for_any_thread_count(rng):
    from cyback.kernels import runtime
    xs, ks, strides, dilation, pads = CASES[0]
    x = rng.standard_normal(xs).astype(np.float32)
    k = rng.standard_normal(ks).astype(np.float32)
    call = conv.packed_forward_call(xs, ks, strides, dilation, pads, True, np.float32)
    saved = runtime.get_max_threads()
    try:
        runtime.set_num_threads(1)
        one = call(x, _packed(k))
        runtime.set_num_threads(2)
        two = call(x, _packed(k))
    finally:
        runtime.set_num_threads(saved)
    np.testing.assert_array_equal(one, two)
