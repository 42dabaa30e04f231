"""Benchmark of the convolution kernels (cyback.kernels.conv).

    python benchmarks/bench_conv.py [--quick] [--phases | --pointwise | --packed | --tiles |
                                     --blocks | --vs-torch]

For each shape: forward and backward (input + kernel gradients) GFLOPS of
cyback, a NumPy im2col + matmul reference, PyTorch CPU if it is installed (timed
alternately with cyback; fwd_x_torch, bwd_x_torch: torch time / cyback time),
and the machine's sgemm rate measured in the same run (the roofline). Also the
2-thread over 1-thread speedup of the ResNet 3x3 forward, the direct kernel
against the GEMM paths on the narrow layers of the model benchmark, and
1 against 2 threads at batch 1, and the phase split of strided input
gradients (transposed convolutions) against col2im, and the direct kernel's
AVX-512 tiles of 12 and of 6 pixels against its AVX2 set (--tiles), and the
packed kernel of inference plans against the default strategy (--packed),
and MobileNetV2's inverted residual blocks run row by row against the same
three layers run one after the other, and in 2, 3 or 4 bands of rows at
batch 1 (--blocks, writes benchmarks/results/conv_blocks.json).
Writes benchmarks/results/conv.json.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (median_time, print_table, reference_blas, sgemm_gflops,  # noqa
                     try_import_torch, write_json)

from cyback.bench.timing import paired_ratio, settle as settle_idle, time_alternated  # noqa: E402
from cyback.kernels import conv  # noqa: E402
from cyback.kernels.conv_utils import conv_pads  # noqa: E402
from cyback.kernels.runtime import get_max_threads, set_num_threads  # noqa: E402

QUICK = "--quick" in sys.argv
REPEATS = 3 if QUICK else 5

# name, x shape (channels_last), kernel shape (*k, C, F), strides, padding,
# channels_last, transposed (then kernel is (*k, out, in) and x is the
# transposed conv's input)
CASES = [
    ("resnet3x3 NHWC", (32, 56, 56, 64), (3, 3, 64, 64), (1, 1), "same", True, False),
    ("resnet3x3 NCHW", (32, 56, 56, 64), (3, 3, 64, 64), (1, 1), "same", False, False),
    ("narrow3x3 16 NHWC", (32, 56, 56, 16), (3, 3, 16, 16), (1, 1), "same", True, False),
    ("narrow3x3 32 NHWC", (32, 56, 56, 32), (3, 3, 32, 32), (1, 1), "same", True, False),
    ("1x1 64->256", (32, 56, 56, 64), (1, 1, 64, 256), (1, 1), "valid", True, False),
    ("stem 7x7/2", (8, 224, 224, 3), (7, 7, 3, 64), (2, 2), "same", True, False),
    ("3x3/2 64->128", (32, 56, 56, 64), (3, 3, 64, 128), (2, 2), "same", True, False),
    ("conv1d text k5", (32, 200, 128), (5, 128, 128), (1,), "same", True, False),
    ("conv2d (5,1) on W=1", (32, 200, 1, 128), (5, 1, 128, 128), (1, 1), "same", True, False),
    ("conv3d video k3", (4, 16, 56, 56, 32), (3, 3, 3, 32, 32), (1, 1, 1), "same", True, False),
    ("conv2d_T 3x3/2", (16, 28, 28, 64), (3, 3, 32, 64), (2, 2), "same", True, True),
]


def im2col_forward(x, w, strides, pads):
    """NumPy reference: full patch matrix via sliding windows, one matmul."""
    rank = x.ndim - 2
    xp = np.pad(x, [(0, 0)] + list(pads) + [(0, 0)])
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[:rank],
                                                   axis=tuple(range(1, rank + 1)))
    win = win[(slice(None),) + tuple(slice(None, None, s) for s in strides)]
    # win: (N, *out, C, *k) -> patches ordered like the kernel (*k, C)
    perm = (0,) + tuple(range(1, rank + 1)) + tuple(range(rank + 2, 2 * rank + 2)) + (rank + 1,)
    cols = np.ascontiguousarray(win.transpose(perm)).reshape(-1, w[..., 0].size)
    return (cols @ w.reshape(-1, w.shape[-1])).reshape(win.shape[:rank + 1] + (w.shape[-1],))


def im2col_backward(x, w, dy, strides, pads):
    """NumPy reference gradients: dW from the patch matrix, dx by per-tap scatter."""
    rank = x.ndim - 2
    xp = np.pad(x, [(0, 0)] + list(pads) + [(0, 0)])
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[:rank],
                                                   axis=tuple(range(1, rank + 1)))
    win = win[(slice(None),) + tuple(slice(None, None, s) for s in strides)]
    perm = (0,) + tuple(range(1, rank + 1)) + tuple(range(rank + 2, 2 * rank + 2)) + (rank + 1,)
    cols = np.ascontiguousarray(win.transpose(perm)).reshape(-1, w[..., 0].size)
    dy2 = dy.reshape(-1, dy.shape[-1])
    dw = (cols.T @ dy2).reshape(w.shape)
    dcols = (dy2 @ w.reshape(-1, w.shape[-1]).T).reshape(dy.shape[:-1] + w.shape[:-1])
    dxp = np.zeros_like(xp)
    out = dy.shape[1:-1]
    for taps in np.ndindex(*w.shape[:rank]):
        sl = tuple(slice(t, t + (o - 1) * s + 1, s) for t, o, s in zip(taps, out, strides))
        dxp[(slice(None),) + sl] += dcols[(Ellipsis,) + taps + (slice(None),)]
    crop = tuple(slice(a, a + n) for n, (a, _) in zip(x.shape[1:-1], pads))
    return dxp[(slice(None),) + crop], dw


def torch_funcs(torch, x, w, strides, pads, channels_last, transposed):
    """(forward, backward) closures for torch with pre-padded input (torch pads symmetrically)."""
    import torch.nn.functional as F
    rank = x.ndim - 2
    conv_fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[rank]
    convt_fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[rank]
    wt = torch.from_numpy(np.ascontiguousarray(np.moveaxis(w, (-2, -1), (1, 0)) if not transposed
                                               else np.moveaxis(w, (-1, -2), (0, 1))))
    mf = {2: torch.channels_last, 3: torch.channels_last_3d}.get(rank) if channels_last else None
    if transposed:
        xt = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)))
        if mf is not None:
            xt, wt = xt.contiguous(memory_format=mf), wt.contiguous(memory_format=mf)
        # torch crops symmetrically: same work and output size, shifted by a row.
        p = [(a + b + 1) // 2 for a, b in pads]
        op = [2 * q - a - b for q, (a, b) in zip(p, pads)]

        def fwd():
            return convt_fn(xt, wt, stride=strides, padding=p, output_padding=op)
        y = fwd()
        xt.requires_grad_(True)
        wt.requires_grad_(True)
    else:
        xp = np.pad(x, [(0, 0)] + list(pads) + [(0, 0)])
        xt = torch.from_numpy(np.ascontiguousarray(np.moveaxis(xp, -1, 1)))
        if mf is not None:
            xt, wt = xt.contiguous(memory_format=mf), wt.contiguous(memory_format=mf)

        def fwd():
            return conv_fn(xt, wt, stride=strides)
        y = fwd()
        xt.requires_grad_(True)
        wt.requires_grad_(True)
    dy = torch.randn(y.shape)
    if mf is not None:
        dy = dy.contiguous(memory_format=mf)

    def bwd():
        with torch.enable_grad():
            out = (convt_fn(xt, wt, stride=strides, padding=p, output_padding=op) if transposed
                   else conv_fn(xt, wt, stride=strides))
            return torch.autograd.grad(out, (xt, wt), dy)

    def fwd_ng():
        with torch.no_grad():
            return fwd()
    return fwd_ng, bwd


def run_case(name, xshape, kshape, strides, padding, channels_last, transposed, torch, roof):
    """The case's arrays and the closures to time (cyback, NumPy, torch)."""
    rng = np.random.default_rng(0)
    rank = len(xshape) - 2
    x = rng.standard_normal(xshape, dtype=np.float32)
    w = rng.standard_normal(kshape, dtype=np.float32)
    dil = (1,) * rank
    if transposed:
        # Transposed conv of x: output size in * stride ('same'); the conv it
        # transposes maps that output back to x.
        out_sp = tuple(n * s for n, s in zip(xshape[1:-1], strides))
        pads = [conv_pads(o, k, s, 1, padding) for o, k, s in zip(out_sp, kshape[:rank], strides)]
        out_shape = (xshape[0],) + out_sp + (kshape[-2],)
        flops = 2.0 * x.size * int(np.prod(kshape[:rank])) * kshape[-2]
        xin = x if channels_last else np.ascontiguousarray(np.moveaxis(x, -1, 1))
        oshape = out_shape if channels_last else (out_shape[0], out_shape[-1]) + out_shape[1:-1]
        gy = rng.standard_normal(out_shape, dtype=np.float32)
        gyin = gy if channels_last else np.ascontiguousarray(np.moveaxis(gy, -1, 1))

        def fwd():
            return conv.conv_backward_input(xin, w, oshape, strides, dil, pads,
                                            channels_last=channels_last)

        def bwd():
            return (conv.conv_forward(gyin, w, strides, dil, pads, channels_last=channels_last),
                    conv.conv_backward_kernel(gyin, xin, kshape, strides, dil, pads,
                                              channels_last=channels_last))

        def np_fwd():
            return im2col_backward(np.zeros(out_shape, np.float32), w, x, strides, pads)[0]

        def np_bwd():
            return (im2col_forward(gy, w, strides, pads),
                    im2col_backward(gy, w, x, strides, pads)[1])
    else:
        pads = [conv_pads(n, k, s, 1, padding)
                for n, k, s in zip(xshape[1:-1], kshape[:rank], strides)]
        xin = x if channels_last else np.ascontiguousarray(np.moveaxis(x, -1, 1))
        y = conv.conv_forward(xin, w, strides, dil, pads, channels_last=channels_last)
        flops = 2.0 * y.size * int(np.prod(kshape[:-1]))
        dy = rng.standard_normal(y.shape, dtype=np.float32)
        dyl = dy if channels_last else np.ascontiguousarray(np.moveaxis(dy, 1, -1))

        def fwd():
            return conv.conv_forward(xin, w, strides, dil, pads, channels_last=channels_last)

        def bwd():
            return (conv.conv_backward_input(dy, w, xin.shape, strides, dil, pads,
                                             channels_last=channels_last),
                    conv.conv_backward_kernel(xin, dy, kshape, strides, dil, pads,
                                              channels_last=channels_last))

        def np_fwd():
            return im2col_forward(x, w, strides, pads)

        def np_bwd():
            return im2col_backward(x, w, dyl, strides, pads)
    torch_fns = torch_funcs(torch, x, w, strides, pads, channels_last, transposed) \
        if torch is not None else None
    return dict(name=name, flops=flops, fwd=fwd, bwd=bwd, np_fwd=np_fwd, np_bwd=np_bwd,
                torch=torch_fns)


def pointwise_vs_sgemm():
    """A 1x1 channels_last convolution is a GEMM of the (N*P, C) view of x
    with the (C, F) kernel. cyback's default (GEMM tiles on OpenMP threads
    for these widths), its untiled paths (_TUNE["pointwise_gemm"] = False:
    the direct kernel, or row blocks where that does not apply) and NumPy's
    sgemm of the same shape on all threads, each writing into a
    preallocated output (a fresh 100 MB output costs its page faults in
    either), alternated block by block with an idle pause before each (so
    that OpenBLAS's spinning threads do not steal the next block's cores:
    after a block of sgemm calls its other thread ran on for 100-110 ms of
    CPU time, and with the former 0.1 s pause the batch-1 cyback block that
    followed ran its first 60 calls at 0.9 ms against a steady 0.55).
    x_vs_sgemm is the median over rounds of the time of a round's block
    over its sgemm block, with the quartiles of default's
    (cyback.bench.timing.paired_ratio): the host slows down in spells that
    hit either engine's blocks at random; fast_vs_sgemm is the ratio of
    the two engines' lower-quartile blocks (cyback.bench.timing)."""
    rng = np.random.default_rng(2)
    rows = []
    for n, hw, c, f in ((32, 56, 64, 64), (32, 56, 64, 256), (32, 28, 128, 512),
                        (32, 14, 256, 1024), (1, 56, 64, 256), (1, 14, 256, 1024),
                        (1, 7, 512, 2048)):
        x = rng.standard_normal((n, hw, hw, c), dtype=np.float32)
        w = rng.standard_normal((1, 1, c, f), dtype=np.float32)
        x2, w2 = x.reshape(-1, c), w.reshape(c, f)
        y = np.empty((n, hw, hw, f), np.float32)
        y2 = y.reshape(-1, f)
        pads = [(0, 0), (0, 0)]
        ref = x2 @ w2
        np.testing.assert_allclose(conv.conv_forward(x, w, (1, 1), (1, 1), pads).reshape(ref.shape),
                                   ref, rtol=1e-4, atol=1e-3)

        def default(x=x, w=w, y=y):
            conv.conv_forward(x, w, (1, 1), (1, 1), pads, out=y)

        def sgemm(x2=x2, w2=w2, y2=y2):
            with reference_blas():
                np.matmul(x2, w2, out=y2)
        engines = {"default": default, "untiled": _tuned(default, pointwise_gemm=False),
                   "sgemm": sgemm}
        st = time_alternated(engines, blocks=3 if QUICK else 15, block_seconds=0.08,
                             settle_seconds=0.25)
        med = {k: v["median_s"] for k, v in st.items()}
        pair = paired_ratio(st, "default", "sgemm")
        rows.append(dict(case="1x1 %d->%d (%d,%d,%d)" % (c, f, n, hw, hw),
                         default_ms=med["default"] * 1e3, untiled_ms=med["untiled"] * 1e3,
                         sgemm_ms=med["sgemm"] * 1e3,
                         default_vs_sgemm=pair["median"],
                         vs_sgemm_iqr="%.2f-%.2f" % (pair["q25"], pair["q75"]),
                         fast_vs_sgemm=st["default"]["q25_s"] / st["sgemm"]["q25_s"],
                         untiled_vs_sgemm=paired_ratio(st, "untiled", "sgemm")["median"]))
    return rows


# Narrow layers of benchmarks/bench_models.py and a few strided ones: name,
# x, kernel, strides, pads (channels_last).
DIRECT_CASES = [
    ("resnet 3x3 16 b1", (1, 32, 32, 16), (3, 3, 16, 16), (1, 1), [(1, 1), (1, 1)]),
    ("resnet 3x3 16 b32", (32, 32, 32, 16), (3, 3, 16, 16), (1, 1), [(1, 1), (1, 1)]),
    ("cnn 3x3 1->32 b1", (1, 28, 28, 1), (3, 3, 1, 32), (1, 1), [(0, 0), (0, 0)]),
    ("cnn 3x3 32 b1", (1, 26, 26, 32), (3, 3, 32, 32), (1, 1), [(0, 0), (0, 0)]),
    ("cnn 3x3 32 b32", (32, 26, 26, 32), (3, 3, 32, 32), (1, 1), [(0, 0), (0, 0)]),
    ("1x1 16->32 b1", (1, 32, 32, 16), (1, 1, 16, 32), (1, 1), [(0, 0), (0, 0)]),
    ("1x1 32->64 b32", (32, 32, 32, 32), (1, 1, 32, 64), (1, 1), [(0, 0), (0, 0)]),
    ("conv1d k12/4 1->16 b32", (32, 400, 1), (12, 1, 16), (4,), [(0, 0)]),
    ("conv1d k12/4 16 b32", (32, 98, 16), (12, 16, 16), (4,), [(0, 0)]),
    ("3x3 64 b8", (8, 56, 56, 64), (3, 3, 64, 64), (1, 1), [(1, 1), (1, 1)]),
    ("stem 7x7/2 b8", (8, 112, 112, 3), (7, 7, 3, 64), (2, 2), [(3, 3), (3, 3)]),
]


def _tuned(run, **tune):
    """run() with conv._TUNE entries changed for the call."""
    def call():
        old = {k: conv._TUNE[k] for k in tune}
        conv._TUNE.update(tune)
        try:
            return run()
        finally:
            conv._TUNE.update(old)
    return call


def direct_vs_gemm(nthreads):
    """The direct kernel (Winograd off) against the GEMM paths (_TUNE['direct']
    off too), alternated in blocks; and at batch 1, the default path on one
    thread against the whole team (whose wake-up a small conv may not repay).
    Outputs are checked against each other first."""
    rng = np.random.default_rng(3)
    rows = []
    for name, xs, ks, strides, pads in DIRECT_CASES:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ks, dtype=np.float32)
        dil = (1,) * len(strides)

        def run(x=x, w=w, strides=strides, dil=dil, pads=pads):
            return conv.conv_forward(x, w, strides, dil, pads)
        engines = {"direct": _tuned(run, direct=True, winograd=False),
                   "gemm": _tuned(run, direct=False, winograd=False)}
        if xs[0] == 1:
            engines["one_thread"] = _tuned(run, flops_per_byte=1e30)
            engines["team"] = _tuned(run, flops_per_byte=1e-30)
        y = engines["direct"]()
        np.testing.assert_allclose(y, engines["gemm"](), rtol=1e-4, atol=1e-3)
        flops = 2.0 * y.size * np.prod(ks[:-1])
        st = time_alternated(engines, blocks=3 if QUICK else 9, block_seconds=0.05)
        med = {k: v["median_s"] for k, v in st.items()}
        row = dict(case=name, direct_us=med["direct"] * 1e6, gemm_us=med["gemm"] * 1e6,
                   gemm_over_direct=med["gemm"] / med["direct"],
                   direct_gflops=flops / med["direct"] / 1e9)
        if xs[0] == 1:
            row.update(b1_1thread_us=med["one_thread"] * 1e6, b1_team_us=med["team"] * 1e6)
        rows.append(row)
    return rows


# 3x3 (and 3-D (3, 3, 3)) stride-1 channels_last float32 layers Winograd takes:
# name, x, kernel, pads.
WINOGRAD_CASES = [
    ("cnn 3x3 32->64 b1", (1, 26, 26, 32), (3, 3, 32, 64), [(0, 0), (0, 0)]),
    ("cnn 3x3 32->64 b32", (32, 26, 26, 32), (3, 3, 32, 64), [(0, 0), (0, 0)]),
    ("3x3 64 b1", (1, 56, 56, 64), (3, 3, 64, 64), [(1, 1), (1, 1)]),
    ("3x3 64 b8", (8, 56, 56, 64), (3, 3, 64, 64), [(1, 1), (1, 1)]),
    ("3x3 128 b8", (8, 28, 28, 128), (3, 3, 128, 128), [(1, 1), (1, 1)]),
    ("3x3 256 b1", (1, 14, 14, 256), (3, 3, 256, 256), [(1, 1), (1, 1)]),
    ("3x3 256 b8", (8, 14, 14, 256), (3, 3, 256, 256), [(1, 1), (1, 1)]),
    ("3x3 16->32 b32", (32, 28, 28, 16), (3, 3, 16, 32), [(1, 1), (1, 1)]),
    ("conv3d 3x3x3 32 b4", (4, 16, 56, 56, 32), (3, 3, 3, 32, 32), [(1, 1)] * 3),
    ("conv3d 3x3x3 12->16 b4", (4, 16, 56, 56, 12), (3, 3, 3, 12, 16), [(1, 1)] * 3),
    ("conv3d 3x3x3 64 b1", (1, 8, 28, 28, 64), (3, 3, 3, 64, 64), [(1, 1)] * 3),
]


def winograd_vs_direct():
    """Winograd F(2x2, 3x3) (the default for these shapes) against the
    direct kernel and im2col + GEMM (_TUNE['winograd'], ['direct'] off),
    alternated in blocks, through conv_forward: Winograd transforms its
    kernel at every call here (a compiled plan's prepared call keeps the
    transform while the kernel is unchanged). GFLOPS count the direct sum's
    flops. rel_diff_e6: largest difference from the direct sum over the
    output's largest magnitude, in millionths."""
    rng = np.random.default_rng(4)
    rows = []
    for name, xs, ks, pads in WINOGRAD_CASES:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ks, dtype=np.float32)

        def run(x=x, w=w, pads=pads):
            ones = (1,) * len(pads)
            return conv.conv_forward(x, w, ones, ones, pads)
        engines = {"winograd": _tuned(run, winograd=True), "direct": _tuned(run, winograd=False),
                   "gemm": _tuned(run, winograd=False, direct=False)}
        y, y_direct = engines["winograd"](), engines["direct"]()
        np.testing.assert_allclose(y, engines["gemm"](), rtol=1e-4, atol=1e-3 * np.abs(y).max())
        flops = 2.0 * y.size * np.prod(ks[:-1])
        st = time_alternated(engines, blocks=3 if QUICK else 9, block_seconds=0.05)
        med = {k: v["median_s"] for k, v in st.items()}
        rows.append(dict(case=name, winograd_us=med["winograd"] * 1e6,
                         direct_us=med["direct"] * 1e6, gemm_us=med["gemm"] * 1e6,
                         direct_over_winograd=med["direct"] / med["winograd"],
                         gemm_over_winograd=med["gemm"] / med["winograd"],
                         winograd_gflops=flops / med["winograd"] / 1e9,
                         rel_diff_e6=1e6 * float(np.abs(y - y_direct).max()
                                                / np.abs(y_direct).max())))
    return rows


# Layers the packed kernel takes in an inference plan (conv_packed.pxi,
# _use_packed): name, x, kernel, strides, pads.
PACKED_CASES = [
    ("ResNet 3x3 512 7x7 b1", (1, 7, 7, 512), (3, 3, 512, 512), (1, 1), [(1, 1), (1, 1)]),
    ("ResNet 3x3 256 14x14 b1", (1, 14, 14, 256), (3, 3, 256, 256), (1, 1), [(1, 1), (1, 1)]),
    ("ResNet 3x3/2 512 b1", (1, 14, 14, 512), (3, 3, 512, 512), (2, 2), [(0, 1), (0, 1)]),
    ("Inception 1x7 768->192 b1", (1, 17, 17, 768), (1, 7, 768, 192), (1, 1), [(0, 0), (3, 3)]),
    ("1x1 960->320 7x7 b8", (8, 7, 7, 960), (1, 1, 960, 320), (1, 1), [(0, 0), (0, 0)]),
    ("1x1 160->960 7x7 b1", (1, 7, 7, 160), (1, 1, 160, 960), (1, 1), [(0, 0), (0, 0)]),
    ("3x3 128 10x10 b1", (1, 10, 10, 128), (3, 3, 128, 128), (1, 1), [(1, 1), (1, 1)]),
    ("1x1 576->96 14x14 b8", (8, 14, 14, 576), (1, 1, 576, 96), (1, 1), [(0, 0), (0, 0)]),
]


def packed_vs_default():
    """The packed kernel (the kernel packed once, as an inference plan's
    frozen prelude does) against the strategy conv_forward picks without it,
    alternated in blocks, both prepared calls with a bias."""
    from cyback.kernels import linalg
    if not linalg.packed_available():
        return []
    rng = np.random.default_rng(6)
    rows = []
    for name, xs, ks, strides, pads in PACKED_CASES:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ks, dtype=np.float32)
        b = rng.standard_normal(ks[-1], dtype=np.float32)
        ones = (1,) * len(strides)
        packed_call = conv.packed_forward_call(xs, ks, strides, ones, pads, True, np.float32, True)
        if packed_call is None:
            continue
        plain_call = conv.forward_call(xs, ks, strides, ones, pads, True, np.float32, True)
        packed = linalg.pack_panels(w.reshape(-1, ks[-1]))
        engines = {"packed": lambda: packed_call(x, packed, b),
                   "default": lambda: plain_call(x, w, b)}
        np.testing.assert_allclose(engines["packed"](), engines["default"](), rtol=1e-4,
                                   atol=1e-4 * np.abs(engines["default"]()).max())
        flops = 2.0 * engines["packed"]().size * np.prod(ks[:-1])
        st = time_alternated(engines, blocks=3 if QUICK else 9, block_seconds=0.05)
        med = {k: v["median_s"] for k, v in st.items()}
        rows.append(dict(case=name, packed_us=med["packed"] * 1e6,
                         default_us=med["default"] * 1e6,
                         default_over_packed=med["default"] / med["packed"],
                         packed_gflops=flops / med["packed"] / 1e9))
    return rows


# The direct kernel's float32 AVX-512 rows in tiles of 12 pixels and of 6
# (conv._use_wide_tiles), and its AVX2 set: name, x, kernel, strides, pads.
TILE_CASES = [
    ("3x3 16 b32", (32, 56, 56, 16), (3, 3, 16, 16), (1, 1), [(1, 1), (1, 1)]),
    ("3x3 32 b32", (32, 56, 56, 32), (3, 3, 32, 32), (1, 1), [(1, 1), (1, 1)]),
    ("3x3 16 b1", (1, 32, 32, 16), (3, 3, 16, 16), (1, 1), [(1, 1), (1, 1)]),
    ("stem 7x7/2 b8", (8, 224, 224, 3), (7, 7, 3, 64), (2, 2), [(3, 3), (3, 3)]),
    ("3x3/2 64->128 b32", (32, 56, 56, 64), (3, 3, 64, 128), (2, 2), [(1, 1), (1, 1)]),
    ("conv1d k5 128 b32", (32, 200, 128), (5, 128, 128), (1,), [(2, 2)]),
    ("conv3d 3x3x3 16 b4", (4, 16, 56, 56, 16), (3, 3, 3, 16, 16), (1, 1, 1), [(1, 1)] * 3),
    ("1x1 32->64 b32", (32, 32, 32, 32), (1, 1, 32, 64), (1, 1), [(0, 0), (0, 0)]),
]


def tiles_vs_avx2():
    """Winograd off, alternated in blocks: the direct kernel's AVX-512 rows with
    12-pixel and 6-pixel float32 tiles and its AVX2 set (the same sums: outputs
    are compared bit for bit first). The default (None) picks 6 pixels where a
    512-bit FMA runs as two 256-bit halves (AMD Zen 4). Empty without AVX-512."""
    if not conv._use_avx512(True):
        return []
    default = conv._use_wide_tiles(None)
    rng = np.random.default_rng(6)
    rows = []
    try:
        for name, xs, ks, strides, pads in TILE_CASES:
            x = rng.standard_normal(xs, dtype=np.float32)
            w = rng.standard_normal(ks, dtype=np.float32)
            dil = (1,) * len(strides)

            def engine(avx512, wide, x=x, w=w, strides=strides, dil=dil, pads=pads):
                def call():
                    conv._use_avx512(avx512)
                    conv._use_wide_tiles(wide)
                    return conv.conv_forward(x, w, strides, dil, pads)
                return _tuned(call, winograd=False)
            engines = {"tiles12": engine(True, True), "tiles6": engine(True, False),
                       "avx2": engine(False, None)}
            outs = [f() for f in engines.values()]
            assert all(np.array_equal(outs[0], y) for y in outs[1:]), name
            flops = 2.0 * outs[0].size * np.prod(ks[:-1])
            st = time_alternated(engines, blocks=3 if QUICK else 9, block_seconds=0.1)
            med = {k: v["median_s"] for k, v in st.items()}
            rows.append(dict(case=name, tiles12_ms=med["tiles12"] * 1e3,
                             tiles6_ms=med["tiles6"] * 1e3, avx2_ms=med["avx2"] * 1e3,
                             tiles12_over_tiles6=med["tiles12"] / med["tiles6"],
                             avx2_over_tiles6=med["avx2"] / med["tiles6"],
                             tiles6_gflops=flops / med["tiles6"] / 1e9))
    finally:
        conv._use_avx512(True)
        conv._use_wide_tiles(None)
    print("default tiles on this CPU: %s pixels" % (12 if default else 6))
    return rows


def print_tiles():
    rows = tiles_vs_avx2()
    if not rows:
        print("no AVX-512 here (or CYBACK_AVX512=0): nothing to compare")
        return
    print_table(rows, list(rows[0]),
                title="direct kernel, float32 AVX-512 tiles of 12 and 6 pixels and the AVX2 "
                      "set (x_over_tiles6 > 1: 6-pixel tiles are faster); load average %.1f"
                      % os.getloadavg()[0])


# Strided input gradients: name, dx shape (channels_last), kernel (*k, dx
# channels, dy channels), strides, padding[, channels_last]. A transposed convolution's forward
# pass is the input gradient of the convolution it transposes (dx is then
# its output).
PHASE_CASES = [
    ("conv2d_T 3x3/2 64->32 b16", (16, 56, 56, 32), (3, 3, 32, 64), (2, 2), "same"),
    ("conv2d_T 4x4/2 64->32 b16", (16, 56, 56, 32), (4, 4, 32, 64), (2, 2), "same"),
    ("conv2d_T 3x3/2 32->32 b16", (16, 56, 56, 32), (3, 3, 32, 32), (2, 2), "same"),
    ("conv2d_T 3x3/2 64->64 b1", (1, 56, 56, 64), (3, 3, 64, 64), (2, 2), "same"),
    ("conv2d_T 4x4/3 32->32 b16", (16, 60, 60, 32), (4, 4, 32, 32), (3, 3), "same"),
    ("conv2d_T 2x2/2 16->16 b16", (16, 56, 56, 16), (2, 2, 16, 16), (2, 2), "valid"),
    ("conv2d_T 2x2/2 64->64 b16", (16, 56, 56, 64), (2, 2, 64, 64), (2, 2), "valid"),
    ("conv3d_T 3^3/2 32->16 b4", (4, 16, 32, 32, 16), (3, 3, 3, 16, 32), (2, 2, 2), "same"),
    ("conv1d_T k4/2 64->64 b32", (32, 400, 64), (4, 64, 64), (2,), "same"),
    ("conv 3x3/2 32->64 dx b32", (32, 56, 56, 32), (3, 3, 32, 64), (2, 2), "same"),
    ("conv 3x3/2 64->128 dx b32", (32, 56, 56, 64), (3, 3, 64, 128), (2, 2), "same"),
    ("conv2d_T 3x3/2 64->8 b16", (16, 56, 56, 8), (3, 3, 8, 64), (2, 2), "same"),
    ("conv2d_T 3x3/2 128->64 b16", (16, 56, 56, 64), (3, 3, 64, 128), (2, 2), "same"),
    ("conv2d_T 3x3/2 256->128 b8", (8, 28, 28, 128), (3, 3, 128, 256), (2, 2), "same"),
    ("conv2d_T 3x3/2 64->32 b16 NCHW", (16, 56, 56, 32), (3, 3, 32, 64), (2, 2), "same", False),
    ("conv2d_T 3x3/2 32->32 b16 NCHW", (16, 56, 56, 32), (3, 3, 32, 32), (2, 2), "same", False),
]


def phases_vs_col2im():
    """Strided channels_last input gradients through the phase split and
    through GEMM + col2im (_TUNE['phase_split'] True / False), alternated in
    blocks, outputs checked against each other first; `default` is the path
    conv_backward_input takes unforced."""
    rng = np.random.default_rng(4)
    rows = []
    for name, xs, ks, strides, padding, *layout in PHASE_CASES:
        last = layout[0] if layout else True
        rank = len(strides)
        dil = (1,) * rank
        pads = [conv_pads(n, k, s, 1, padding) for n, k, s in zip(xs[1:-1], ks[:rank], strides)]
        w = rng.standard_normal(ks, dtype=np.float32)
        ys = conv.conv_forward(np.zeros(xs, np.float32), w, strides, dil, pads).shape
        dy = rng.standard_normal(ys, dtype=np.float32)
        if not last:
            dy = np.ascontiguousarray(np.moveaxis(dy, -1, 1))
            xs = (xs[0], xs[-1]) + xs[1:-1]

        def run(dy=dy, w=w, xs=xs, strides=strides, dil=dil, pads=pads, last=last):
            return conv.conv_backward_input(dy, w, xs, strides, dil, pads, channels_last=last)
        engines = {"phases": _tuned(run, phase_split=True),
                   "col2im": _tuned(run, phase_split=False)}
        a, b = engines["phases"](), engines["col2im"]()
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))
        g = conv._geometry(xs, ks, strides, dil, pads, last, "bench")[0]
        flops = 2.0 * dy.size * np.prod(ks[:-1])
        st = time_alternated(engines, blocks=3 if QUICK else 7, block_seconds=0.1)
        med = {k: v["median_s"] for k, v in st.items()}
        rows.append(dict(case=name, phases_ms=med["phases"] * 1e3, col2im_ms=med["col2im"] * 1e3,
                         col2im_over_phases=med["col2im"] / med["phases"],
                         phases_gflops=flops / med["phases"] / 1e9,
                         default="phases" if conv._use_phases(g, last, False) is not None
                         else "col2im"))
    return rows


def vs_torch(c):
    """cyback against torch on one case, forward and backward each timed with
    the two engines alternated block by block (cyback.bench.timing), so that
    a noisy neighbour or a slow spell of the host falls on both alike. Sets
    torch's median times (t_tf, t_tb) and the speed ratios torch time /
    cyback time (x_tf, x_tb; above 1: cyback is faster), both medians of the
    same run. The pause before each block lets the other library's worker
    threads stop spinning first."""
    for key, i, mine in (("tf", 0, c["fwd"]), ("tb", 1, c["bwd"])):
        st = time_alternated({"cyback": mine, "torch": c["torch"][i]},
                             blocks=3 if QUICK else 7, block_seconds=0.15,
                             settle_seconds=0.1)
        c["t_" + key] = st["torch"]["median_s"]
        c["t_c" + key[1]] = st["cyback"]["median_s"]
        c["x_" + key] = st["torch"]["median_s"] / st["cyback"]["median_s"]


def settle():
    """Let the previous library's idle worker threads go to sleep: they spin
    for a while after their work and would steal the next timing's cores."""
    settle_idle(0.3)


def print_phases():
    print_table(phases_vs_col2im(), ["case", "phases_ms", "col2im_ms", "col2im_over_phases",
                                     "phases_gflops", "default"],
                title="strided input gradients / transposed convs: phase split against "
                      "col2im (col2im_over_phases > 1: phases are faster); load average %.1f"
                      % os.getloadavg()[0])


def print_pointwise(rows=None):
    """Print the 1x1 table (measured now unless ``rows`` are given); returns its rows."""
    rows = pointwise_vs_sgemm() if rows is None else rows
    print_table(rows, ["case", "default_ms", "untiled_ms", "sgemm_ms", "default_vs_sgemm",
                       "vs_sgemm_iqr", "fast_vs_sgemm", "untiled_vs_sgemm"],
                title="1x1 NHWC forward against the same-shape sgemm (x_vs_sgemm: median over "
                      "rounds of a block's time / its round's sgemm block time, below 1.1: "
                      "within 10%%; vs_sgemm_iqr: default's quartiles; fast_vs_sgemm: the "
                      "lower quartiles' ratio, blocks outside the host's slow spells; untiled: "
                      "_TUNE['pointwise_gemm'] = False, the direct kernel or row blocks); "
                      "load average %.1f" % os.getloadavg()[0])
    return rows


def print_vs_torch(torch):
    rows = []
    for case in CASES:
        c = run_case(*case, torch=torch, roof=None)
        vs_torch(c)
        f = c["flops"]
        rows.append(dict(case=c["name"], fwd_gflops=f / c["t_cf"] / 1e9,
                         torch_fwd_gflops=f / c["t_tf"] / 1e9, fwd_x_torch=c["x_tf"],
                         bwd_gflops=2 * f / c["t_cb"] / 1e9,
                         torch_bwd_gflops=2 * f / c["t_tb"] / 1e9, bwd_x_torch=c["x_tb"]))
        settle()
    print_table(rows, list(rows[0]),
                title="cyback against torch, engines alternated (x_torch: torch time / cyback "
                      "time, above 1: cyback is faster); load average %.1f" % os.getloadavg()[0])


# MobileNetV2 blocks: name, (H, W, C), expanded channels (None: none),
# output channels, strides, pads, residual
BLOCK_CASES = [
    ("block 0 112x112 dw 32 > 16", (112, 112, 32), None, 16, (1, 1), ((1, 1), (1, 1)), False),
    ("block 1 112x112 16 > 96 /2 > 24", (112, 112, 16), 96, 24, (2, 2), ((0, 1), (0, 1)), False),
    ("block 2 56x56 24 > 144 > 24 +x", (56, 56, 24), 144, 24, (1, 1), ((1, 1), (1, 1)), True),
    ("block 3 56x56 24 > 144 /2 > 32", (56, 56, 24), 144, 32, (2, 2), ((0, 1), (0, 1)), False),
    ("block 4 28x28 32 > 192 > 32 +x", (28, 28, 32), 192, 32, (1, 1), ((1, 1), (1, 1)), True),
]


def blocks_vs_layers():
    """Each block (conv.block_forward, kernels/conv_blocks.pxi) against its three layers run by
    conv_forward / depthwise_forward one after the other (the plan's steps
    where the blocks are not joined), alternated, outputs checked first; at
    batch 1 also in 2, 3 and 4 bands of rows."""
    from cyback.kernels import depthwise
    rng = np.random.default_rng(9)
    rows = []
    for batch in (1, 8):
        for name, (h, w, c), e, f, strides, pads, res in BLOCK_CASES:
            x = rng.standard_normal((batch, h, w, c), dtype=np.float32)
            mid = c if e is None else e
            expand = None if e is None else \
                (rng.standard_normal((c, e), dtype=np.float32) * 0.3,
                 rng.standard_normal(e, dtype=np.float32), "relu6")
            dw = (rng.standard_normal((3, 3, mid), dtype=np.float32) * 0.3,
                  rng.standard_normal(mid, dtype=np.float32), "relu6")
            project = (rng.standard_normal((mid, f), dtype=np.float32) * 0.3,
                       rng.standard_normal(f, dtype=np.float32), None)
            residual = x if res else None

            def layers(x=x, expand=expand, dw=dw, project=project, residual=residual,
                       strides=strides, pads=pads, c=c, mid=mid, f=f):
                t = x
                if expand is not None:
                    t = conv.conv_forward(t, expand[0].reshape(1, 1, c, mid), (1, 1), (1, 1),
                                          ((0, 0), (0, 0)), bias=expand[1],
                                          activation="relu6")
                t = depthwise.depthwise_forward(t, dw[0].reshape(3, 3, mid, 1), strides, (1, 1),
                                                pads, True, dw[1], "relu6")
                return conv.conv_forward(t, project[0].reshape(1, 1, mid, f), (1, 1), (1, 1),
                                         ((0, 0), (0, 0)), bias=project[1], residual=residual)

            def block(bands=0, x=x, expand=expand, dw=dw, project=project, residual=residual,
                      strides=strides, pads=pads):
                return conv.block_forward(x, expand, dw, project, residual, strides, pads,
                                            bands=bands)
            engines = {"block": block, "layers": layers}
            if batch == 1:
                engines.update({"bands%d" % b: (lambda b=b: block(b)) for b in (2, 3, 4)})
            want = layers()
            for fn in engines.values():
                np.testing.assert_allclose(fn(), want, rtol=1e-4, atol=1e-4)
            st = time_alternated(engines, blocks=3 if QUICK else 7, block_seconds=0.1)
            med = {k: v["median_s"] for k, v in st.items()}
            row = dict(case=name, batch=batch, block_ms=med["block"] * 1e3,
                       layers_ms=med["layers"] * 1e3,
                       layers_over_block=med["layers"] / med["block"])
            for b in (2, 3, 4):
                key = "bands%d" % b
                row[key + "_ms"] = med[key] * 1e3 if key in med else None
            rows.append(row)
    return rows


def main():
    if "--blocks" in sys.argv:
        rows = blocks_vs_layers()
        print_table(rows, list(rows[0]),
                    title="depthwise blocks row by row against their three layers "
                          "(layers_over_block > 1: the block is faster); load average %.1f"
                          % os.getloadavg()[0])
        print("wrote", write_json("conv_blocks", rows, threads=get_max_threads()))
        return
    if "--phases" in sys.argv:
        # only the phase split's table (no JSON)
        print_phases()
        return
    if "--pointwise" in sys.argv:
        # only the 1x1 against sgemm table (no JSON)
        print_pointwise()
        return
    if "--packed" in sys.argv:
        # only the packed kernel's table (no JSON)
        rows = packed_vs_default()
        print_table(rows, list(rows[0]), title="packed kernel against the default strategy "
                    "(default_over_packed > 1: packed is faster)")
        return
    if "--tiles" in sys.argv:
        # only the tile-size table (no JSON)
        print_tiles()
        return
    torch = try_import_torch()
    if "--vs-torch" in sys.argv:
        # only the alternated comparison with torch (no JSON)
        if torch is None:
            sys.exit("--vs-torch needs torch installed")
        torch.set_num_threads(os.cpu_count())
        print_vs_torch(torch)
        return
    if torch is not None:
        torch.set_num_threads(os.cpu_count())
    nthreads = get_max_threads()
    rows = []
    roof = sgemm_gflops()
    print("sgemm roofline (numpy 2048^2 float32): %.1f GFLOPS; threads: %d; torch: %s; "
          "load average %.1f" % (roof, nthreads, torch.__version__ if torch else "not installed",
                                 os.getloadavg()[0]))
    # cyback's own figures and the NumPy references are timed in phases of
    # their own; the torch columns and the ratios come from vs_torch, which
    # alternates the two engines with a pause between blocks so that neither
    # library's idle threads spin while the other runs.
    cases = [run_case(*case, torch=torch, roof=roof) for case in CASES]
    for c in cases:
        c["t_f"] = median_time(c["fwd"], REPEATS, 1)
        c["t_b"] = median_time(c["bwd"], REPEATS, 1)
    settle()
    with reference_blas():
        for c in cases:
            c["t_nf"] = median_time(c["np_fwd"], 2 if QUICK else 3, 1)
            c["t_nb"] = median_time(c["np_bwd"], 2 if QUICK else 3, 1)
    if torch is not None:
        settle()
        for c in cases:
            vs_torch(c)
    settle()
    roof_end = sgemm_gflops()
    for c in cases:
        flops, t_f, t_b = c["flops"], c["t_f"], c["t_b"]
        row = dict(case=c["name"], fwd_ms=t_f * 1e3, fwd_gflops=flops / t_f / 1e9,
                   fwd_vs_sgemm=flops / t_f / 1e9 / roof, bwd_ms=t_b * 1e3,
                   bwd_gflops=2 * flops / t_b / 1e9, bwd_over_fwd=t_b / t_f,
                   np_fwd_x=c["t_nf"] / t_f, np_bwd_x=c["t_nb"] / t_b, sgemm_gflops=roof)
        if torch is not None:
            row["torch_fwd_gflops"] = flops / c["t_tf"] / 1e9
            row["torch_bwd_gflops"] = 2 * flops / c["t_tb"] / 1e9
            row["fwd_x_torch"] = c["x_tf"]
            row["bwd_x_torch"] = c["x_tb"]
        rows.append(row)
    print("sgemm roofline re-measured at the end: %.1f GFLOPS" % roof_end)
    settle()
    # Thread scaling of the main case.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 56, 56, 64), dtype=np.float32)
    w = rng.standard_normal((3, 3, 64, 64), dtype=np.float32)
    pads = [(1, 1), (1, 1)]
    times = {}
    try:
        for nt in sorted({1, nthreads}):
            set_num_threads(nt)
            times[nt] = median_time(lambda: conv.conv_forward(x, w, (1, 1), (1, 1), pads),
                                    REPEATS, 1)
    finally:
        set_num_threads(nthreads)
    speedup = times[1] / times[nthreads]
    columns = ["case", "fwd_ms", "fwd_gflops", "fwd_vs_sgemm", "bwd_ms", "bwd_gflops",
               "bwd_over_fwd", "np_fwd_x", "np_bwd_x", "sgemm_gflops"]
    if torch is not None:
        columns += ["torch_fwd_gflops", "torch_bwd_gflops", "fwd_x_torch", "bwd_x_torch"]
    print()
    print_table(rows, columns,
                title="conv kernels, float32 (np_*_x: NumPy im2col time / cyback time)")
    print("\nresnet3x3 NHWC forward: %d threads %.1f ms, 1 thread %.1f ms, speedup %.2fx"
          % (nthreads, times[nthreads] * 1e3, times[1] * 1e3, speedup))
    settle()
    print()
    pw_rows = print_pointwise()
    settle()
    d_rows = direct_vs_gemm(nthreads)
    print()
    print_table(d_rows, ["case", "direct_us", "gemm_us", "gemm_over_direct", "direct_gflops",
                         "b1_1thread_us", "b1_team_us"],
                title="direct kernel against the GEMM paths (gemm_over_direct > 1: direct "
                      "is faster); batch 1 on one thread and on %d" % nthreads)
    settle()
    w_rows = winograd_vs_direct()
    print()
    print_table(w_rows, ["case", "winograd_us", "direct_us", "gemm_us", "direct_over_winograd",
                         "gemm_over_winograd", "winograd_gflops", "rel_diff_e6"],
                title="Winograd F(2x2, 3x3) against the direct kernel and im2col + GEMM "
                      "(x_over_winograd > 1: Winograd is faster)")
    settle()
    p_rows = packed_vs_default()
    if p_rows:
        print()
        print_table(p_rows, list(p_rows[0]),
                    title="packed kernel (inference plans) against the default strategy "
                          "(default_over_packed > 1: packed is faster)")
    settle()
    t_rows = tiles_vs_avx2()
    if t_rows:
        print()
        print_table(t_rows, list(t_rows[0]),
                    title="direct kernel, float32 AVX-512 tiles of 12 and 6 pixels and the "
                          "AVX2 set (x_over_tiles6 > 1: 6-pixel tiles are faster)")
        settle()
    ph_rows = phases_vs_col2im()
    print()
    print_table(ph_rows, ["case", "phases_ms", "col2im_ms", "col2im_over_phases",
                          "phases_gflops", "default"],
                title="strided input gradients / transposed convs: phase split against "
                      "col2im (col2im_over_phases > 1: phases are faster)")
    load = os.getloadavg()[0]
    print("load average at the end: %.1f (a shared machine makes every figure noisy)" % load)
    path = write_json("conv", rows, pointwise=pw_rows, direct=d_rows, winograd=w_rows,
                      packed=p_rows, tiles=t_rows, phases=ph_rows,
                      threads=nthreads,
                      thread_speedup=speedup,
                      torch=torch.__version__ if torch else None, load_average=load)
    print("wrote", path)


if __name__ == "__main__":
    main()
