"""kernels.linalg.pack_panels / packed_product (include/cyback_packed_gemm.h)
against a float64 NumPy reference, in every instruction set the CPU has."""
import numpy as np
import pytest

from cyback.kernels import linalg, runtime

from instruction_sets import instruction_set

SETS = ["avx512", "avx2"]


def _reference(x, w, bias=None, residual=None, act=0):
    y = x.astype(np.float64) @ w.astype(np.float64)
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    if act:
        y = np.maximum(y, 0)
        if act == 2:
            y = np.minimum(y, 6)
    return y


def _close(got, want, k):
    assert got.dtype == np.float32 and got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-7 * scale * max(1, k) ** 0.5 * 4)


@pytest.mark.parametrize("k,n", [(1, 1), (3, 16), (5, 17), (16, 33), (37, 100), (128, 64)])
def test_pack_panels_lays_columns_out_16_at_a_time_with_zeros_past_n(k, n, rng):
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed = linalg.pack_panels(w)
    P = (n + 15) // 16
    assert packed.shape == (P, k, 16) and packed.dtype == np.float32
    assert packed.ctypes.data % 64 == 0
    want = np.zeros((k, P * 16), np.float32)
    want[:, :n] = w
    np.testing.assert_array_equal(packed, want.reshape(k, P, 16).transpose(1, 0, 2))


def test_pack_panels_reads_transposed_and_read_only_weights(rng):
    w = rng.standard_normal((20, 9)).astype(np.float32)
    ro = w.T.copy().T           # Fortran order
    ro.flags.writeable = False
    np.testing.assert_array_equal(linalg.pack_panels(ro), linalg.pack_panels(w))


@pytest.mark.parametrize("bad", [np.zeros((3, 4)), np.zeros((2, 3, 4), np.float32),
                                 np.zeros(5, np.float32)])
def test_pack_panels_rejects_what_it_cannot_pack(bad):
    with pytest.raises(ValueError, match="pack_panels: expected a 2-D float32 weight"):
        linalg.pack_panels(bad)


SHAPES = [(1, 1, 1), (1, 7, 5), (2, 3, 40), (3, 65, 17), (5, 16, 130), (11, 9, 31),
          (12, 33, 32), (13, 20, 16), (25, 128, 100), (64, 31, 200)]


@pytest.mark.parametrize("which", SETS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_products_match_the_reference(which, m, k, n, rng):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed = linalg.pack_panels(w)
    with instruction_set(linalg, which):
        got = linalg.packed_product(x, packed, n)
    _close(got, _reference(x, w), k)


@pytest.mark.parametrize("which", SETS)
@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("with_bias,with_residual", [(True, False), (False, True),
                                                     (True, True)])
def test_the_epilogue_adds_bias_then_residual_then_activates(which, act, with_bias,
                                                             with_residual, rng):
    m, k, n = 14, 23, 37
    x = 2 * rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    res = 3 * rng.standard_normal((m, n)).astype(np.float32) if with_residual else None
    with instruction_set(linalg, which):
        got = linalg.packed_product(x, linalg.pack_panels(w), n, bias, res, act)
    _close(got, _reference(x, w, bias, res, act), k)
    if act == 2:
        assert got.max() <= 6 and got.min() >= 0


def test_rows_of_any_stride_are_read_in_place(rng):
    big = rng.standard_normal((20, 50)).astype(np.float32)
    x = big[::2, 3:33]                  # row stride 100 values, 30 columns
    w = rng.standard_normal((30, 21)).astype(np.float32)
    rbig = rng.standard_normal((10, 40)).astype(np.float32)
    res = rbig[:, 5:26]
    got = linalg.packed_product(x, linalg.pack_panels(w), 21, None, res)
    _close(got, _reference(x, w, None, res), 30)


def test_relu_passes_nan_through(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x[1, 2] = np.nan
    w = rng.standard_normal((4, 20)).astype(np.float32)
    got = linalg.packed_product(x, linalg.pack_panels(w), 20, None, None, 1)
    assert np.isnan(got[1]).all() and not np.isnan(got[[0, 2]]).any()


def test_empty_products(rng):
    w = rng.standard_normal((6, 18)).astype(np.float32)
    got = linalg.packed_product(np.zeros((0, 6), np.float32), linalg.pack_panels(w), 18)
    assert got.shape == (0, 18)
    bias = rng.standard_normal(5).astype(np.float32)
    got = linalg.packed_product(np.zeros((3, 0), np.float32),
                                linalg.pack_panels(np.zeros((0, 5), np.float32)), 5, bias,
                                None, 1)
    np.testing.assert_array_equal(got, np.tile(np.maximum(bias, 0), (3, 1)))


def test_arrays_it_cannot_take_give_none(rng):
    w = rng.standard_normal((8, 20)).astype(np.float32)
    packed = linalg.pack_panels(w)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    assert linalg.packed_product(x.astype(np.float64), packed, 20) is None
    assert linalg.packed_product(x[:, :7], packed, 20) is None          # k differs
    assert linalg.packed_product(x, packed, 40) is None                 # panels differ
    assert linalg.packed_product(x, packed, 20, np.zeros(19, np.float32)) is None
    assert linalg.packed_product(x, packed, 20, None, np.zeros((3, 20), np.float32)) is None
    assert linalg.packed_product(x, packed, 20, act=3) is None
    assert linalg.packed_product(x[:, ::-1], packed, 20) is None        # column stride
    with instruction_set(linalg, "baseline"):
        assert not linalg.packed_available()
        assert linalg.packed_product(x, packed, 20) is None


@pytest.mark.parametrize("which", SETS)
def test_balanced_row_blocks_give_the_remainder_blocks_bits(which, rng):
    # rows that would leave a remainder of 1-3 go in blocks of nearly equal
    # sizes (49: 10 x 4 + 9): the same sums, so the same bits, as full
    # blocks and a remainder, with the epilogue
    w = rng.standard_normal((70, 100)).astype(np.float32)
    packed = linalg.pack_panels(w)
    bias = rng.standard_normal(100).astype(np.float32)
    with instruction_set(linalg, which):
        for m in (1, 2, 7, 13, 14, 25, 37, 49, 50, 51, 61, 98, 99, 193, 194, 195, 196):
            x = rng.standard_normal((m, 70)).astype(np.float32)
            res = rng.standard_normal((m, 100)).astype(np.float32)
            try:
                linalg._use_balanced_blocks(False)
                want = linalg.packed_product(x, packed, 100, bias, res, 1)
            finally:
                linalg._use_balanced_blocks(True)
            got = linalg.packed_product(x, packed, 100, bias, res, 1)
            np.testing.assert_array_equal(got, want)
            _close(got, _reference(x, w, bias, res, 1), 70)


def test_the_same_bits_for_any_thread_count_and_on_every_call(rng):
    m, k, n = 64, 96, 300
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    packed = linalg.pack_panels(w)
    saved = runtime.get_max_threads()
    try:
        runtime.set_num_threads(1)
        one = linalg.packed_product(x, packed, n, bias)
        runtime.set_num_threads(2)
        two = [linalg.packed_product(x, packed, n, bias) for _ in range(3)]
    finally:
        runtime.set_num_threads(saved)
    for y in two:
        np.testing.assert_array_equal(y, one)


# ------------------------------------------------ the prepared call (bound plans)

@pytest.mark.parametrize("x_shape,k,y_shape", [((1, 7), 7, (1, 5)), ((2, 3, 40), 40, (2, 3, 17)),
                                               ((1, 4, 8), 8, (1, 4, 3, 6)),
                                               ((5, 2, 6), 12, (5, 33))])
@pytest.mark.parametrize("has_bias,has_res,act", [(False, False, 0), (True, False, 1),
                                                  (True, True, 2), (False, True, 0)])
def test_packed_product_call_gives_packed_products_bits(x_shape, k, y_shape, has_bias, has_res,
                                                        act, rng):
    n = int(np.prod(y_shape)) // int(np.prod(x_shape) // k)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed = linalg.pack_panels(w)
    bias = rng.standard_normal(n).astype(np.float32) if has_bias else None
    res = rng.standard_normal(y_shape).astype(np.float32) if has_res else None
    call = linalg.packed_product_call(x_shape, k, n, y_shape, has_bias, has_res, act)
    got = call(x, packed, bias, res)
    rows = x.reshape(-1, k)
    want = linalg.packed_product(rows, packed, n, bias,
                                 None if res is None else res.reshape(-1, n), act)
    assert got.shape == tuple(y_shape) and got.dtype == np.float32
    np.testing.assert_array_equal(got.reshape(-1, n), want)
    _close(got.reshape(-1, n), _reference(rows, w, bias,
                                          None if res is None else res.reshape(-1, n), act), k)


def test_packed_product_call_declines_arrays_that_do_not_fit(rng):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    packed = linalg.pack_panels(rng.standard_normal((8, 5)).astype(np.float32))
    bias = np.ones(5, np.float32)
    call = linalg.packed_product_call((3, 8), 8, 5, (3, 5), True, False, 0)
    assert call(x, packed, bias) is not None
    assert call(x[:2], packed, bias) is None                       # other rows
    assert call(x.astype(np.float64), packed, bias) is None         # other dtype
    assert call(np.asfortranarray(x), packed, bias) is None         # not C-contiguous
    assert call(x, packed, None) is None                            # no bias
    assert call(x, packed, np.ones(6, np.float32)) is None          # other bias size
    assert call(x, packed, bias, np.zeros((3, 5), np.float32)) is None   # a residual
    wrong = linalg.pack_panels(rng.standard_normal((8, 20)).astype(np.float32))
    assert call(x, wrong, bias) is None                             # other panels
    with_res = linalg.packed_product_call((3, 8), 8, 5, (3, 5), False, True, 0)
    assert with_res(x, packed, None, np.zeros((5, 3), np.float32)) is None


@pytest.mark.parametrize("args", [((3, 8), 8, 5, (3, 5), False, False, 3),
                                  ((3, 8), 8, 5, (4, 5), False, False, 0),
                                  ((3, 8), 0, 5, (3, 5), False, False, 0),
                                  ((3, 8), 8, 0, (3, 5), False, False, 0),
                                  ((3, 8), 8, 5, (), False, False, 0)])
def test_packed_product_call_rejects_bad_geometry(args):
    with pytest.raises(ValueError, match="packed_product_call"):
        linalg.packed_product_call(*args)
