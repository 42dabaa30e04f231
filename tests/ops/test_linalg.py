"""cyback.ops.linalg's products as plans run them."""
import numpy as np

from cyback.kernels import linalg as kernels
from cyback.ops import linalg


def test_contract_runs_it_for_sequences_and_matches_tensordot(monkeypatch):
    # A Dense layer on a time-major view: the (T * N, K) copy goes to it.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 22, 16)).astype(np.float32).transpose(1, 0, 2)
    w = rng.standard_normal((16, 144)).astype(np.float32)
    bias = rng.standard_normal(144).astype(np.float32)
    seen = []
    real = kernels.small_k_product

    def spy(a, b, bias=None):
        out = real(a, b, bias)
        seen.append(out is not None)
        return out
    monkeypatch.setattr(kernels, "small_k_product", spy)
    out = linalg.contract(x, w, (2,), (0,), bias)
    assert seen == [True]
    np.testing.assert_allclose(out, np.tensordot(x.astype(np.float64), w, ((2,), (0,))) + bias,
                               rtol=1e-5, atol=1e-4)
    # and a product it declines still comes out right, through the GEMM
    x64 = x.astype(np.float64)
    out64 = linalg.contract(x64, w.astype(np.float64), (2,), (0,), bias.astype(np.float64))
    assert seen == [True, False]
    np.testing.assert_allclose(out64, np.tensordot(x64, w, ((2,), (0,))) + bias, rtol=1e-10)
