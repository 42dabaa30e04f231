"""batch_dot (batched GEMM) against NumPy's matmul and PyTorch's bmm;
products with a short inner axis (a recurrent layer's input projection over
all steps) through the 1x1 convolution kernels against the GEMM they replace;
and products with a weight packed once (packed_product: an inference plan's
Dense layers) against kernels.linalg.matmul (BLAS) and NumPy.

Run: python benchmarks/bench_linalg.py [--repeats N]
Shapes are those batch_dot sees in models: attention scores and values
(many small matrices, OpenMP over the batch with single-threaded GEMMs) and a
few large products (BLAS's own threads). Prints median ms, GFLOPS, the ratio
to NumPy and torch, and the machine's sgemm GFLOPS measured in the same run;
writes benchmarks/results/linalg.json.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cyback.bench.timing import time_alternated  # noqa: E402
from cyback.kernels.linalg import (  # noqa: E402
    batch_gemm,
    matmul,
    pack_panels,
    packed_available,
    packed_product,
    small_k_product,
)

from _common import (  # noqa: E402
    median_time,
    print_table,
    reference_blas,
    sgemm_gflops,
    try_import_torch,
    write_json,
)

torch = try_import_torch()

CASES = [
    # name, batch, m, k, n
    ("attention scores 64x(128x64)@(64x128)", 64, 128, 64, 128),
    ("attention values 64x(128x128)@(128x64)", 64, 128, 128, 64),
    ("many tiny 4096x(8x8)@(8x8)", 4096, 8, 8, 8),
    ("seq2seq 32x(50x256)@(256x50)", 32, 50, 256, 50),
    ("large 4x(512x512)@(512x512)", 4, 512, 512, 512),
]

# (m, k) @ (k, n) with bias, k short: the input projections of the model
# benchmark's audio model, LSTM(128) and GRU(128) at batch 32, and wider ones.
SMALL_K = [(704, 16, 144), (1600, 32, 512), (1600, 32, 384), (3200, 64, 256),
           (1600, 128, 512), (50, 32, 512)]


def small_k_rows(repeats):
    """small_k_product (which ops.linalg.contract tries first) against
    kernels.linalg.matmul and NumPy's dot, alternated in blocks; outputs
    checked first. A product it declines (more than 64 in k, fewer than 512
    rows) shows as None."""
    rng = np.random.default_rng(1)
    rows = []
    for m, k, n in SMALL_K:
        a = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        bias = rng.standard_normal(n, dtype=np.float32)
        want = a.astype(np.float64) @ w + bias
        engines = {"matmul": lambda: matmul(a, w, bias), "np.dot": lambda: np.dot(a, w) + bias}
        taken = small_k_product(a, w, bias) is not None
        if taken:
            engines["small_k"] = lambda: small_k_product(a, w, bias)
        for f in engines.values():
            np.testing.assert_allclose(f(), want, rtol=1e-4, atol=1e-3)
        st = time_alternated(engines, blocks=repeats, block_seconds=0.05)
        us = {e: v["median_s"] * 1e6 for e, v in st.items()}
        rows.append({"case": "(%d,%d)@(%d,%d)" % (m, k, k, n),
                     "small_k us": us.get("small_k"), "matmul us": us["matmul"],
                     "np.dot us": us["np.dot"],
                     "matmul / small_k": us["matmul"] / us["small_k"] if taken else None})
    return rows


# (m, k) @ (k, n) with bias, a weight packed once: batch-1 and batch-8
# classifiers, an attention block's projections (64 tokens), a text model's
# Dense layer, the im2col products of ResNet-50's last stage, and a product
# of 512 rows (PackedProduct.MAX_ROWS).
PACKED = [(1, 1280, 1000), (8, 1280, 1000), (64, 128, 384), (64, 256, 128), (1, 250, 250),
          (49, 4608, 512), (196, 2304, 256), (512, 128, 384)]


def packed_rows(repeats):
    """packed_product against kernels.linalg.matmul and NumPy's dot (with
    the bias add), alternated in blocks; outputs checked first."""
    if not packed_available():
        return []
    rng = np.random.default_rng(2)
    rows = []
    for m, k, n in PACKED:
        a = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        bias = rng.standard_normal(n, dtype=np.float32)
        packed = pack_panels(w)
        want = a.astype(np.float64) @ w + bias
        engines = {"packed": lambda: packed_product(a, packed, n, bias),
                   "matmul": lambda: matmul(a, w, bias), "np.dot": lambda: np.dot(a, w) + bias}
        for f in engines.values():
            np.testing.assert_allclose(f(), want, rtol=1e-4, atol=1e-3 * np.sqrt(k))
        st = time_alternated(engines, blocks=repeats, block_seconds=0.05)
        us = {e: v["median_s"] * 1e6 for e, v in st.items()}
        rows.append({"case": "(%d,%d)@(%d,%d)" % (m, k, k, n), "packed us": us["packed"],
                     "GFLOPS": 2.0 * m * k * n / us["packed"] / 1e3,
                     "matmul us": us["matmul"], "np.dot us": us["np.dot"],
                     "matmul / packed": us["matmul"] / us["packed"]})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    roof = sgemm_gflops()
    rows = []
    for name, b, m, k, n in CASES:
        a = rng.standard_normal((b, m, k), dtype=np.float32)
        c = rng.standard_normal((b, k, n), dtype=np.float32)
        flops = 2.0 * b * m * k * n
        t_cy = median_time(lambda: batch_gemm(a, c), args.repeats)
        with reference_blas():
            t_np = median_time(lambda: np.matmul(a, c), args.repeats)
        row = {"case": name, "cyback ms": t_cy * 1e3, "GFLOPS": flops / t_cy / 1e9,
               "of sgemm": flops / t_cy / 1e9 / roof, "x numpy": t_np / t_cy}
        if torch is not None:
            ta, tc = torch.from_numpy(a), torch.from_numpy(c)
            t_t = median_time(lambda: torch.bmm(ta, tc), args.repeats)
            row["x torch"] = t_t / t_cy
        rows.append(row)
    cols = ["case", "cyback ms", "GFLOPS", "of sgemm", "x numpy"] + \
        (["x torch"] if torch is not None else [])
    print_table(rows, cols, title="batch_dot (float32), sgemm roofline %.1f GFLOPS" % roof)
    sk = small_k_rows(args.repeats)
    print_table(sk, list(sk[0]), title="short-k products with bias, alternated (matmul / "
                "small_k > 1: the 1x1 kernels are faster); load average %.1f"
                % os.getloadavg()[0])
    pk = packed_rows(args.repeats)
    if pk:
        print_table(pk, list(pk[0]), title="products with a packed weight and a bias, "
                    "alternated (matmul / packed > 1: the packed kernel is faster)")
    print("wrote", write_json("linalg", rows, sgemm_gflops=roof, small_k=sk, packed=pk))


if __name__ == "__main__":
    main()
