"""Pooling, depthwise and locally connected kernels against NumPy and PyTorch.

Run: python benchmarks/bench_pool.py [--repeats N] [--quick]
Prints median milliseconds, effective GB/s (bytes of every array read or
written once: these kernels are memory-bound) and the speed-up over a
vectorized NumPy reference (strided slices per window offset, no Python loop
over pixels) and over torch if it is importable. Writes
benchmarks/results/pool.json.
"""
import argparse
import itertools
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from cyback.bench.timing import time_alternated  # noqa: E402
from cyback.kernels import depthwise as dw_module  # noqa: E402
from cyback.kernels.depthwise import (  # noqa: E402
    depthwise_backward_input,
    depthwise_backward_kernel,
    depthwise_forward,
)
from cyback.kernels.local import local_backward_input, local_backward_kernel, local_forward
from cyback.kernels.pool import pool_backward, pool_forward  # noqa: E402
from cyback.kernels.runtime import get_max_threads  # noqa: E402

from _common import median_time, print_table, try_import_torch, write_json  # noqa: E402

torch = try_import_torch()


def same_pads(size, k, s):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return (total // 2, total - total // 2)


# ----------------------------------------------------------- NumPy references

def _pad(x, axes, pads, value):
    width = [(0, 0)] * x.ndim
    for a, p in zip(axes, pads):
        width[a] = p
    return np.pad(x, width, constant_values=value)


def _slices(x_ndim, axes, offs, ss, outs):
    idx = [slice(None)] * x_ndim
    for a, o, s, n in zip(axes, offs, ss, outs):
        idx[a] = slice(o, o + s * (n - 1) + 1, s)
    return tuple(idx)


def np_pool_fwd(x, ks, ss, ps, axes, mode):
    outs = [(x.shape[a] + p[0] + p[1] - k) // s + 1 for a, k, s, p in zip(axes, ks, ss, ps)]
    if mode == 'max':
        xp = _pad(x, axes, ps, -np.inf)
        y = None
        for offs in itertools.product(*[range(k) for k in ks]):
            v = xp[_slices(x.ndim, axes, offs, ss, outs)]
            y = v.copy() if y is None else np.maximum(y, v, out=y)
        return y
    xp = _pad(x, axes, ps, 0)
    ones = _pad(np.ones([x.shape[a] for a in axes], x.dtype), range(len(axes)), ps, 0)
    y = None
    cnt = None
    for offs in itertools.product(*[range(k) for k in ks]):
        v = xp[_slices(x.ndim, axes, offs, ss, outs)]
        c = ones[_slices(len(axes), range(len(axes)), offs, ss, outs)]
        y = v.copy() if y is None else np.add(y, v, out=y)
        cnt = c.copy() if cnt is None else cnt + c
    shape = [1] * x.ndim
    for i, a in enumerate(axes):
        shape[a] = outs[i]
    return y / cnt.reshape(shape)


def np_pool_bwd(x, y, dy, ks, ss, ps, axes, mode):
    outs = [dy.shape[a] for a in axes]
    dxp = _pad(np.zeros_like(x), axes, ps, 0)
    crop = [slice(None)] * x.ndim
    for a, p in zip(axes, ps):
        crop[a] = slice(p[0], p[0] + x.shape[a])
    if mode == 'max':
        xp = _pad(x, axes, ps, -np.inf)
        rem = dy.copy()
        for offs in itertools.product(*[range(k) for k in ks]):
            sl = _slices(x.ndim, axes, offs, ss, outs)
            hit = xp[sl] == y
            dxp[sl] += np.where(hit, rem, 0)
            rem[hit] = 0
        return dxp[tuple(crop)]
    ones = _pad(np.ones([x.shape[a] for a in axes], x.dtype), range(len(axes)), ps, 0)
    cnt = 0
    for offs in itertools.product(*[range(k) for k in ks]):
        cnt = cnt + ones[_slices(len(axes), range(len(axes)), offs, ss, outs)]
    shape = [1] * x.ndim
    for i, a in enumerate(axes):
        shape[a] = outs[i]
    g = dy / cnt.reshape(shape)
    for offs in itertools.product(*[range(k) for k in ks]):
        dxp[_slices(x.ndim, axes, offs, ss, outs)] += g
    return dxp[tuple(crop)]


def np_dw_fwd(x, k, ps):
    # channels_last, stride 1, M = 1
    n, h, w, c = x.shape
    kh, kw = k.shape[:2]
    xp = _pad(x, (1, 2), ps, 0)
    y = np.zeros((n, h, w, c), x.dtype)
    for a in range(kh):
        for b in range(kw):
            y += xp[:, a:a + h, b:b + w] * k[a, b, :, 0]
    return y


def np_dw_bwd(x, k, dy, ps):
    n, h, w, c = x.shape
    kh, kw = k.shape[:2]
    xp = _pad(x, (1, 2), ps, 0)
    dxp = np.zeros_like(xp)
    dk = np.zeros_like(k)
    for a in range(kh):
        for b in range(kw):
            dxp[:, a:a + h, b:b + w] += dy * k[a, b, :, 0]
            dk[a, b, :, 0] = np.einsum('nhwc,nhwc->c', xp[:, a:a + h, b:b + w], dy)
    return dxp[:, ps[0][0]:ps[0][0] + h, ps[1][0]:ps[1][0] + w], dk


def np_local_patches(x, ks):
    v = np.lib.stride_tricks.sliding_window_view(x, ks, axis=(1, 2))  # N,OH,OW,C,kh,kw
    n, oh, ow = v.shape[:3]
    return np.ascontiguousarray(v.transpose(1, 2, 0, 4, 5, 3)).reshape(oh * ow, n, -1)


def np_local_fwd(x, k, ks):
    return np.matmul(np_local_patches(x, ks), k)  # (P, N, F), left in position-major order


def np_local_bwd(x, k, dy_p, ks):
    pt = np_local_patches(x, ks)
    dk = np.matmul(pt.transpose(0, 2, 1), dy_p)
    dpt = np.matmul(dy_p, k.transpose(0, 2, 1))
    n, h, w, c = x.shape
    oh, ow = h - ks[0] + 1, w - ks[1] + 1
    dpt = dpt.reshape(oh, ow, n, ks[0], ks[1], c)
    dx = np.zeros_like(x)
    for a in range(ks[0]):
        for b in range(ks[1]):
            dx[:, a:a + oh, b:b + ow] += dpt[:, :, :, a, b].transpose(2, 0, 1, 3)
    return dx, dk


# ------------------------------------------------------------------ cases

def nbytes(*arrays):
    return sum(a.nbytes for a in arrays)


def bench_pool(rows, rng, shape, ks, ss, cl, mode, repeats, np_repeats):
    nd = len(ks)
    spatial = shape[1:-1]
    ps = tuple(same_pads(n, k, s) for n, k, s in zip(spatial, ks, ss))
    x = rng.standard_normal(shape, dtype=np.float32)
    if not cl:
        x = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    axes = tuple(range(1, nd + 1)) if cl else tuple(range(2, nd + 2))
    y = pool_forward(x, ks, ss, ps, cl, mode)
    dy = rng.standard_normal(y.shape, dtype=np.float32)
    label = "%s%dd %s/%s %s %s" % (mode, nd, "x".join(map(str, ks)), ss[0],
                                   "NHWC" if cl else "NCHW", "x".join(map(str, shape)))
    t_f = median_time(lambda: pool_forward(x, ks, ss, ps, cl, mode), repeats)
    t_b = median_time(lambda: pool_backward(x, y, dy, ks, ss, ps, cl, mode), repeats)
    n_f = median_time(lambda: np_pool_fwd(x, ks, ss, ps, axes, mode), np_repeats, 0)
    n_b = median_time(lambda: np_pool_bwd(x, y, dy, ks, ss, ps, axes, mode), np_repeats, 0)
    tt_f = tt_b = None
    if torch is not None and all(p[0] == 0 for p in ps):
        # torch pads symmetrically; TF 'same' here only pads after, which
        # ceil_mode reproduces.
        tx = torch.from_numpy(x)
        if cl:
            tx = tx.permute(0, nd + 1, *range(1, nd + 1))  # channels_last memory format
        tf_ = torch.nn.functional
        fn = {(2, 'max'): tf_.max_pool2d, (3, 'max'): tf_.max_pool3d,
              (2, 'avg'): tf_.avg_pool2d, (3, 'avg'): tf_.avg_pool3d}
        f = fn[(nd, mode)]
        kw = dict(ceil_mode=True)
        if mode == 'avg':
            kw['count_include_pad'] = False
        with torch.no_grad():
            tt_f = median_time(lambda: f(tx, ks, ss, **kw), repeats)
        txg = tx.detach().requires_grad_(True)
        f(txg, ks, ss, **kw)  # one call with autograd on before timing the backward
        tdy = torch.from_numpy(dy)
        if cl:
            tdy = tdy.permute(0, nd + 1, *range(1, nd + 1))

        def tb():
            txg.grad = None
            f(txg, ks, ss, **kw).backward(tdy)
        tt_b = max(median_time(tb, repeats) - tt_f, 1e-9)
    fb = nbytes(x, y)
    bb = nbytes(x, y, dy, x) if mode == 'max' else nbytes(dy, x)
    rows.append(dict(case=label, pass_="fwd", ms=t_f * 1e3, GBs=fb / t_f / 1e9,
                     numpy_ms=n_f * 1e3, x_numpy=n_f / t_f,
                     torch_ms=None if tt_f is None else tt_f * 1e3,
                     x_torch=None if tt_f is None else tt_f / t_f))
    rows.append(dict(case=label, pass_="bwd", ms=t_b * 1e3, GBs=bb / t_b / 1e9,
                     numpy_ms=n_b * 1e3, x_numpy=n_b / t_b,
                     torch_ms=None if tt_b is None else tt_b * 1e3,
                     x_torch=None if tt_b is None else tt_b / t_b))


def bench_depthwise(rows, rng, shape, repeats, np_repeats, m=1):
    """3x3/1 'same' depthwise, depth multiplier m: NHWC and NCHW forward and
    backward (input + kernel gradients), against NumPy and torch (NHWC:
    channels_last memory format; NCHW: contiguous), outputs checked first.
    The forward passes (cyback NHWC, NCHW, NCHW through the general register
    tiles instead of the 3x3 row-reuse ones, and torch's two) are timed
    alternated block by block, so that their ratios come from one window."""
    n, h, w, c = shape
    x = rng.standard_normal(shape, dtype=np.float32)
    k = rng.standard_normal((3, 3, c, m), dtype=np.float32)
    ps = ((1, 1), (1, 1))
    y = depthwise_forward(x, k, 1, 1, ps)
    dy = rng.standard_normal(y.shape, dtype=np.float32)
    xcf = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    dycf = np.ascontiguousarray(dy.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(depthwise_forward(xcf, k, 1, 1, ps, False),
                               y.transpose(0, 3, 1, 2), rtol=1e-4, atol=1e-4)
    label = "depthwise 3x3/1 M=%d %%s %s" % (m, "x".join(map(str, shape)))

    def cf_tiles(reuse):
        dw_module._use_k3(reuse)
        try:
            return depthwise_forward(xcf, k, 1, 1, ps, False)
        finally:
            dw_module._use_k3(True)
    np.testing.assert_array_equal(cf_tiles(False), cf_tiles(True))
    forward = {"f": lambda: depthwise_forward(x, k, 1, 1, ps), "fc": lambda: cf_tiles(True),
               "fg": lambda: cf_tiles(False)}
    if torch is not None:
        tk = torch.from_numpy(np.ascontiguousarray(k.transpose(2, 3, 0, 1).reshape(c * m, 1, 3, 3)))
        conv = torch.nn.functional.conv2d
        tx = {"f": torch.from_numpy(x).permute(0, 3, 1, 2),  # channels_last
              "fc": torch.from_numpy(xcf)}
        for key in tx:
            with torch.no_grad():
                np.testing.assert_allclose(conv(tx[key], tk, padding=1, groups=c).numpy(),
                                           y.transpose(0, 3, 1, 2), rtol=1e-4, atol=1e-4)

            def tf(t=tx[key]):
                with torch.no_grad():
                    return conv(t, tk, padding=1, groups=c)
            forward["torch_" + key] = tf
    st = time_alternated(forward, blocks=max(5, min(repeats, 9)), block_seconds=0.15)
    t = {key: st[key]["median_s"] for key in ("f", "fc", "fg")}
    tt = {key: st["torch_" + key]["median_s"] for key in ("f", "fc") if "torch_" + key in st}
    backward = {
        "b": lambda: (depthwise_backward_input(dy, k, x.shape, 1, 1, ps),
                      depthwise_backward_kernel(x, dy, k.shape, 1, 1, ps)),
        "bc": lambda: (depthwise_backward_input(dycf, k, xcf.shape, 1, 1, ps, False),
                       depthwise_backward_kernel(xcf, dycf, k.shape, 1, 1, ps, False))}
    n_f = n_b = None
    if m == 1:
        n_f = median_time(lambda: np_dw_fwd(x, k, ps), np_repeats, 0)
        n_b = median_time(lambda: np_dw_bwd(x, k, dy, ps), np_repeats, 0)
    if torch is not None:
        for key, arr, g in (("f", x, dy), ("fc", xcf, dycf)):
            txg = torch.from_numpy(arr)
            tdy = torch.from_numpy(g)
            if key == "f":
                txg, tdy = txg.permute(0, 3, 1, 2), tdy.permute(0, 3, 1, 2)  # channels_last
            txg = txg.detach().requires_grad_(True)
            tkg = tk.detach().requires_grad_(True)

            def tb(txg=txg, tkg=tkg, tdy=tdy):
                txg.grad = tkg.grad = None
                conv(txg, tkg, padding=1, groups=c).backward(tdy)
            backward["torch_b" if key == "f" else "torch_bc"] = tb
    # The backward passes alternated with torch's like the forward ones, so
    # that their ratio comes from one window. (M = 2 NHWC still reads 1.4 ms
    # here against 0.85 in a process that runs nothing else: after a switch
    # from other work its first calls run 2-5x slower, for tens of calls.)
    st = time_alternated(backward, blocks=max(5, min(repeats, 9)), block_seconds=0.15)
    t["b"], t["bc"] = st["b"]["median_s"], st["bc"]["median_s"]
    for key, fwd in (("b", "f"), ("bc", "fc")):
        if "torch_" + key in st:
            # torch's backward runs its forward pass too
            tt[key] = max(st["torch_" + key]["median_s"] - tt[fwd], 1e-9)
    for key, pass_, layout, nb, ref in (("f", "fwd", "NHWC", nbytes(x, y), n_f),
                                         ("fc", "fwd", "NCHW", nbytes(x, y), None),
                                         ("b", "bwd(in+k)", "NHWC", nbytes(dy, x, x, dy), n_b),
                                         ("bc", "bwd(in+k)", "NCHW", nbytes(dy, x, x, dy), None)):
        rows.append(dict(case=label % layout, pass_=pass_, ms=t[key] * 1e3, GBs=nb / t[key] / 1e9,
                         numpy_ms=None if ref is None else ref * 1e3,
                         x_numpy=None if ref is None else ref / t[key],
                         torch_ms=tt[key] * 1e3 if key in tt else None,
                         x_torch=tt[key] / t[key] if key in tt else None))
    for key, pass_ in (("f", "fwd"), ("b", "bwd(in+k)")):
        rows.append(dict(case=label % "NCHW/NHWC", pass_=pass_, ms=t[key + "c"] * 1e3,
                         x_numpy=None, x_torch=None, cf_over_cl=t[key + "c"] / t[key]))
    rows.append(dict(case=label % "NCHW general tiles/NHWC", pass_="fwd", ms=t["fg"] * 1e3,
                     x_numpy=None, x_torch=None, cf_over_cl=t["fg"] / t["f"]))


def bench_local(rows, rng, shape, ks, f, repeats, np_repeats):
    n, h, w, c = shape
    oh, ow = h - ks[0] + 1, w - ks[1] + 1
    P, K = oh * ow, ks[0] * ks[1] * c
    x = rng.standard_normal(shape, dtype=np.float32)
    k = rng.standard_normal((P, K, f), dtype=np.float32)
    y = local_forward(x, k, ks, 1)
    dy = rng.standard_normal(y.shape, dtype=np.float32)
    dy_p = np.ascontiguousarray(dy.reshape(n, P, f).transpose(1, 0, 2))
    label = "local2d %dx%d F=%d NHWC %s" % (ks[0], ks[1], f, "x".join(map(str, shape)))
    t_f = median_time(lambda: local_forward(x, k, ks, 1), repeats)
    t_b = median_time(lambda: (local_backward_input(dy, k, x.shape, ks, 1),
                               local_backward_kernel(x, dy, k.shape, ks, 1)), repeats)
    n_f = median_time(lambda: np_local_fwd(x, k, ks), np_repeats, 0)
    n_b = median_time(lambda: np_local_bwd(x, k, dy_p, ks), np_repeats, 0)
    flops = 2.0 * n * P * K * f
    rows.append(dict(case=label, pass_="fwd", ms=t_f * 1e3, GBs=nbytes(x, k, y) / t_f / 1e9,
                     GFLOPs=flops / t_f / 1e9, numpy_ms=n_f * 1e3, x_numpy=n_f / t_f))
    rows.append(dict(case=label, pass_="bwd(in+k)", ms=t_b * 1e3,
                     GBs=nbytes(dy, k, x, x, dy, k) / t_b / 1e9,
                     GFLOPs=2 * flops / t_b / 1e9, numpy_ms=n_b * 1e3, x_numpy=n_b / t_b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smaller batch (8) for a smoke run")
    ap.add_argument("--only", choices=["pool", "depthwise", "local"], help="one family only")
    args = ap.parse_args()
    if torch is not None:
        torch.set_num_threads(get_max_threads())
    print("load average %.1f" % os.getloadavg()[0])
    rng = np.random.default_rng(0)
    nb = 8 if args.quick else 32
    r, nr = args.repeats, max(1, args.repeats // 2)
    rows = []
    want = lambda fam: args.only in (None, fam)  # noqa: E731
    if want("pool"):
        for cl in (True, False):
            for mode in ('max', 'avg'):
                for ks in ((2, 2), (3, 3)):
                    bench_pool(rows, rng, (nb, 112, 112, 64), ks, (2, 2), cl, mode, r, nr)
        for cl in (True, False):
            for mode in ('max', 'avg'):
                bench_pool(rows, rng, (4, 16, 56, 56, 32), (2, 2, 2), (2, 2, 2), cl, mode, r, nr)
    if want("depthwise"):
        bench_depthwise(rows, rng, (32, 32, 32, 16), max(r, 20), nr)
        bench_depthwise(rows, rng, (32, 32, 32, 16), max(r, 20), nr, m=2)
        bench_depthwise(rows, rng, (nb, 112, 112, 32), r, nr)
        bench_depthwise(rows, rng, (nb, 14, 14, 512), r, nr)
        bench_depthwise(rows, rng, (nb, 7, 7, 1024), r, nr)
    if want("local"):
        bench_local(rows, rng, (nb, 16, 16, 16), (3, 3), 32, r, nr)
    for row in rows:
        row["pass"] = row.pop("pass_")
    cols = ["case", "pass", "ms", "GBs", "GFLOPs", "numpy_ms", "x_numpy", "torch_ms", "x_torch",
            "cf_over_cl"]
    print_table(rows, cols, title="float32, %d threads, median of %d (NumPy: %d); "
                "x_* = reference time / cyback time" % (get_max_threads(), r, nr))
    path = write_json("pool", rows, threads=get_max_threads(), repeats=r,
                      torch=None if torch is None else torch.__version__)
    print("wrote", path)


if __name__ == "__main__":
    main()
