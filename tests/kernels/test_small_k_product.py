"""Products with a short inner axis through the 1x1 convolution kernels
(cyback.kernels.linalg.small_k_product); tests/ops/test_linalg.py checks that
contract runs them."""
import numpy as np
import pytest

from cyback.kernels import linalg

from kernels.test_conv import same_on_threads


def _operands(m, k, f, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, f)).astype(np.float32)
    bias = rng.standard_normal(f).astype(np.float32)
    return a, b, bias


def _ref(a, b, bias=None):
    out = a.astype(np.float64) @ b.astype(np.float64)
    return out if bias is None else out + bias


@pytest.mark.parametrize("m, k, f", [(512, 1, 16), (704, 16, 144), (1600, 32, 512),
                                     (513, 64, 17), (2000, 33, 100), (521, 16, 48)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_the_product(m, k, f, with_bias):
    a, b, bias = _operands(m, k, f, seed=m + k + f)
    bias = bias if with_bias else None
    out = same_on_threads(lambda: linalg.small_k_product(a, b, bias))
    assert out.shape == (m, f) and out.dtype == np.float32
    np.testing.assert_allclose(out, _ref(a, b, bias), rtol=1e-5, atol=1e-4 * np.sqrt(k))


def test_declines_what_it_does_not_run():
    a, b, bias = _operands(600, 32, 64)
    assert linalg.small_k_product(a[:511], b) is None                       # few rows
    assert linalg.small_k_product(a.astype(np.float64), b.astype(np.float64)) is None
    assert linalg.small_k_product(np.asfortranarray(a), b) is None          # not C-contiguous
    assert linalg.small_k_product(a, np.asfortranarray(b)) is None
    assert linalg.small_k_product(a, b[:, :15]) is None                      # few columns
    wide_a, wide_b, _ = _operands(600, 65, 64)
    assert linalg.small_k_product(wide_a, wide_b) is None                    # long inner axis
    assert linalg.small_k_product(a, b, bias[:10]) is None                   # bias of another shape
    assert linalg.small_k_product(a, b, bias.astype(np.float64)) is None
    assert linalg.small_k_product(a, b[:16]) is None                         # shapes disagree
    assert linalg.small_k_product(a[None], b) is None


def test_non_finite_values_reach_their_rows_and_columns():
    a, b, bias = _operands(640, 8, 32)
    a[3, 2] = np.nan
    b[5, 7] = np.inf
    out = linalg.small_k_product(a, b, bias)
    with np.errstate(invalid="ignore"):
        want = a @ b + bias
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(want))


@pytest.mark.parametrize("m, row", [(704, 88), (1600, 100), (512, 128), (513, 57), (521, 521),
                                    (1031, 1031), (2 * 521, 2 * 521)])
def test_rows_of_the_product(m, row):
    # the pixels are cut into rows of 16 to 128 where M allows, so that each
    # thread reads only its rows of a; a prime M stays one row
    assert linalg._product_row(m) == row


def test_rows_do_not_change_the_sums(monkeypatch):
    a, b, bias = _operands(704, 16, 144, seed=3)
    linalg._PRODUCTS.clear()
    in_rows = linalg.small_k_product(a, b, bias)
    monkeypatch.setattr(linalg, "_product_row", lambda m: m)
    linalg._PRODUCTS.clear()
    try:
        one_row = linalg.small_k_product(a, b, bias)
    finally:
        linalg._PRODUCTS.clear()
    np.testing.assert_array_equal(in_rows, one_row)
