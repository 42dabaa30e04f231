"""Op-level cases: cyback's backend functions against NumPy references and PyTorch.

A case is built by a function returning a :class:`Case`: the engines (name ->
zero-argument callable returning the output in cyback's layout), the FLOPs of
one call (None where counting them means little) and the case's label. Sizes
come in three scales: ``tiny`` (the test suite and ``--quick``), ``normal``
and ``heavy`` (``--heavy``: ResNet-sized shapes, minutes on two cores).
"""
import contextlib

import numpy as np

from .timing import check_close


class Case:
    def __init__(self, name, engines, flops=None, family=None):
        self.name, self.engines, self.flops, self.family = name, engines, flops, family


@contextlib.contextmanager
def blas_threads(n):
    """NumPy's BLAS at ``n`` threads for the references (cyback holds it at one)."""
    from cyback.kernels.blas_threads import get_blas_threads, set_blas_threads
    old = get_blas_threads()
    set_blas_threads(n)
    try:
        yield
    finally:
        set_blas_threads(old)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _f32(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _windows(xp, k, strides):
    """(N, *out, C, *k) sliding windows of a channels-last padded input."""
    rank = len(k)
    win = np.lib.stride_tricks.sliding_window_view(xp, k, axis=tuple(range(1, rank + 1)))
    return win[(slice(None),) + tuple(slice(None, None, s) for s in strides)]


def _same_pads(size, k, s):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def numpy_conv(x, w, strides, padding):
    """Channels-last convolution by im2col and one matmul (the NumPy reference)."""
    rank = x.ndim - 2
    k = w.shape[:rank]
    pads = [_same_pads(x.shape[1 + i], k[i], strides[i]) if padding == "same" else (0, 0)
            for i in range(rank)]
    xp = np.pad(x, [(0, 0)] + pads + [(0, 0)])
    win = _windows(xp, k, strides)
    perm = (0,) + tuple(range(1, rank + 1)) + tuple(range(rank + 2, 2 * rank + 2)) + (rank + 1,)
    cols = np.ascontiguousarray(win.transpose(perm)).reshape(-1, int(np.prod(w.shape[:-1])))
    return (cols @ w.reshape(-1, w.shape[-1])).reshape(win.shape[:rank + 1] + (w.shape[-1],))


SIZES = {
    # case: {scale: parameters}
    "dot": {"tiny": (4, 8, 8), "normal": (256, 512, 512), "heavy": (1024, 1024, 1024)},
    "batch_dot": {"tiny": (2, 4, 4), "normal": (32, 64, 64), "heavy": (64, 128, 128)},
    "conv2d": {"tiny": ((1, 6, 6, 2), 3), "normal": ((8, 32, 32, 32), 32),
               "heavy": ((32, 56, 56, 64), 64)},
    "conv1d": {"tiny": ((1, 10, 2), 3), "normal": ((16, 100, 64), 64),
               "heavy": ((32, 200, 128), 128)},
    "conv3d": {"tiny": ((1, 4, 4, 4, 2), 2), "normal": ((2, 8, 16, 16, 16), 16),
               "heavy": ((4, 16, 56, 56, 32), 32)},
    "conv2d_transpose": {"tiny": ((1, 3, 3, 2), 2), "normal": ((8, 14, 14, 32), 16),
                         "heavy": ((16, 28, 28, 64), 32)},
    "depthwise": {"tiny": (1, 6, 6, 2), "normal": (8, 32, 32, 64), "heavy": (32, 56, 56, 128)},
    "maxpool": {"tiny": (1, 4, 4, 2), "normal": (8, 32, 32, 64), "heavy": (32, 112, 112, 64)},
    "avgpool": {"tiny": (1, 4, 4, 2), "normal": (8, 32, 32, 64), "heavy": (32, 112, 112, 64)},
    "ctc": {"tiny": (2, 6, 4, 2), "normal": (16, 50, 20, 10), "heavy": (32, 200, 40, 40)},
    "overhead": {"tiny": 8, "normal": 8, "heavy": 8},
}


def _function(inputs, output):
    import cyback as K
    f = K.function(inputs, [output])
    return f


def case_dot(scale, torch, threads):
    import cyback as K
    m, k, n = SIZES["dot"][scale]
    rng = _rng()
    a, b = _f32(rng, (m, k)), _f32(rng, (k, n))
    x, w = K.placeholder((None, k)), K.variable(b)
    f = _function([x], K.dot(x, w))

    def ref():
        with blas_threads(threads):
            return a @ b
    engines = {"cyback": lambda: f([a])[0], "numpy": ref}
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        engines["torch"] = lambda: torch.mm(ta, tb).numpy()
    return Case("dot %dx%dx%d" % (m, k, n), engines, 2.0 * m * k * n, "dot")


def case_batch_dot(scale, torch, threads):
    import cyback as K
    bsz, m, n = SIZES["batch_dot"][scale]
    rng = _rng(1)
    a, b = _f32(rng, (bsz, m, n)), _f32(rng, (bsz, n, m))
    x, y = K.placeholder((None, m, n)), K.placeholder((None, n, m))
    f = _function([x, y], K.batch_dot(x, y, axes=(2, 1)))

    def ref():
        with blas_threads(threads):
            return np.matmul(a, b)
    engines = {"cyback": lambda: f([a, b])[0], "numpy": ref}
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        engines["torch"] = lambda: torch.bmm(ta, tb).numpy()
    return Case("batch_dot %dx%dx%dx%d" % (bsz, m, n, m), engines, 2.0 * bsz * m * n * m,
                "batch_dot")


def _conv_case(kind, scale, torch, threads):
    import cyback as K
    shape, filters = SIZES[kind][scale]
    rank = len(shape) - 2
    k = (5,) if kind == "conv1d" else (3,) * rank
    rng = _rng(2)
    xv = _f32(rng, shape)
    wv = _f32(rng, k + (shape[-1], filters), 1.0 / np.sqrt(np.prod(k) * shape[-1]))
    x, w = K.placeholder((None,) + shape[1:]), K.variable(wv)
    strides = (1,) * rank
    conv = {1: K.conv1d, 2: K.conv2d, 3: K.conv3d}[rank]
    f = _function([x], conv(x, w, strides if rank > 1 else 1, padding="same",
                            data_format="channels_last"))
    out_elems = int(np.prod(shape[:-1])) * filters

    def ref():
        with blas_threads(threads):
            return numpy_conv(xv, wv, strides, "same")
    engines = {"cyback": lambda: f([xv])[0], "numpy": ref}
    if torch is not None:
        F = torch.nn.functional
        tconv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[rank]
        tx = torch.from_numpy(np.ascontiguousarray(np.moveaxis(xv, -1, 1)))
        tw = torch.from_numpy(np.ascontiguousarray(np.moveaxis(wv, (-1, -2), (0, 1))))
        pad = tuple(kk // 2 for kk in k)

        def run():
            with torch.inference_mode():
                return np.moveaxis(tconv(tx, tw, padding=pad).numpy(), 1, -1)
        engines["torch"] = run
    label = "%s k%s %s->%d" % (kind, "x".join(map(str, k)), "x".join(map(str, shape)), filters)
    return Case(label, engines, 2.0 * out_elems * np.prod(k) * shape[-1], kind)


def case_conv1d(scale, torch, threads):
    return _conv_case("conv1d", scale, torch, threads)


def case_conv2d(scale, torch, threads):
    return _conv_case("conv2d", scale, torch, threads)


def case_conv3d(scale, torch, threads):
    return _conv_case("conv3d", scale, torch, threads)


def case_conv2d_transpose(scale, torch, threads):
    import cyback as K
    shape, filters = SIZES["conv2d_transpose"][scale]
    n, h, w_, c = shape
    rng = _rng(3)
    xv = _f32(rng, shape)
    wv = _f32(rng, (3, 3, filters, c), 1.0 / np.sqrt(9 * c))
    x, w = K.placeholder((None, h, w_, c)), K.variable(wv)
    out_shape = (n, 2 * h, 2 * w_, filters)
    f = _function([x], K.conv2d_transpose(x, w, out_shape, strides=(2, 2), padding="same",
                                          data_format="channels_last"))

    def ref():
        # scatter every input pixel's 3x3 patch, then crop the 'same' output
        full = np.zeros((n, 2 * h + 2, 2 * w_ + 2, filters), np.float32)
        with blas_threads(threads):
            taps = np.tensordot(xv, wv, axes=([3], [3]))        # (n, h, w, 3, 3, F)
        for i in range(3):
            for j in range(3):
                full[:, i:i + 2 * h:2, j:j + 2 * w_:2] += taps[:, :, :, i, j]
        # 'same' with stride 2 and an odd kernel pads (k - s) // 2 = 0 rows on top
        return full[:, :2 * h, :2 * w_]
    engines = {"cyback": lambda: f([xv])[0], "numpy": ref}
    if torch is not None:
        F = torch.nn.functional
        tx = torch.from_numpy(np.ascontiguousarray(np.moveaxis(xv, -1, 1)))
        tw = torch.from_numpy(np.ascontiguousarray(wv.transpose(3, 2, 0, 1)))

        def run():
            with torch.inference_mode():
                y = F.conv_transpose2d(tx, tw, stride=2)[:, :, :2 * h, :2 * w_]
                return np.moveaxis(y.numpy(), 1, -1)
        engines["torch"] = run
    return Case("conv2d_T 3x3/2 %s->%d" % ("x".join(map(str, shape)), filters), engines,
                2.0 * n * h * w_ * c * 9 * filters, "conv2d_transpose")


def case_depthwise(scale, torch, threads):
    import cyback as K
    shape = SIZES["depthwise"][scale]
    c = shape[-1]
    rng = _rng(4)
    xv, wv = _f32(rng, shape), _f32(rng, (3, 3, c, 1), 1.0 / 3)
    x, w = K.placeholder((None,) + shape[1:]), K.variable(wv)
    f = _function([x], K.depthwise_conv2d(x, w, padding="same", data_format="channels_last"))

    def ref():
        xp = np.pad(xv, [(0, 0), (1, 1), (1, 1), (0, 0)])
        out = np.zeros(shape, np.float32)
        for i in range(3):
            for j in range(3):
                out += xp[:, i:i + shape[1], j:j + shape[2]] * wv[i, j, :, 0]
        return out
    engines = {"cyback": lambda: f([xv])[0], "numpy": ref}
    if torch is not None:
        F = torch.nn.functional
        tx = torch.from_numpy(np.ascontiguousarray(np.moveaxis(xv, -1, 1)))
        tw = torch.from_numpy(np.ascontiguousarray(wv.transpose(2, 3, 0, 1)))

        def run():
            with torch.inference_mode():
                return np.moveaxis(F.conv2d(tx, tw, padding=1, groups=c).numpy(), 1, -1)
        engines["torch"] = run
    return Case("depthwise 3x3 %s" % "x".join(map(str, shape)), engines,
                2.0 * np.prod(shape) * 9, "depthwise")


def _pool_case(mode, scale, torch):
    import cyback as K
    shape = SIZES[mode + "pool"][scale]
    n, h, w, c = shape
    rng = _rng(5)
    xv = _f32(rng, shape)
    x = K.placeholder((None,) + shape[1:])
    f = _function([x], K.pool2d(x, (2, 2), strides=(2, 2), padding="valid",
                                data_format="channels_last", pool_mode=mode))
    red = np.max if mode == "max" else np.mean

    def ref():
        return red(xv[:, :h // 2 * 2, :w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, c), axis=(2, 4))
    engines = {"cyback": lambda: f([xv])[0], "numpy": ref}
    if torch is not None:
        F = torch.nn.functional
        tpool = F.max_pool2d if mode == "max" else F.avg_pool2d
        tx = torch.from_numpy(np.ascontiguousarray(np.moveaxis(xv, -1, 1)))

        def run():
            with torch.inference_mode():
                return np.moveaxis(tpool(tx, 2).numpy(), 1, -1)
        engines["torch"] = run
    return Case("%spool 2x2 %s" % (mode, "x".join(map(str, shape))), engines, None, "pool")


def case_maxpool(scale, torch, threads):
    return _pool_case("max", scale, torch)


def case_avgpool(scale, torch, threads):
    return _pool_case("avg", scale, torch)


def case_ctc(scale, torch, threads):
    import cyback as K
    n, t, c, lab = SIZES["ctc"][scale]
    rng = _rng(6)
    logits = rng.standard_normal((n, t, c))
    probs = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
    labels = rng.integers(0, c - 1, (n, lab)).astype(np.float32)
    in_len = np.full((n, 1), t, np.float32)
    lab_len = np.full((n, 1), lab, np.float32)
    yt, yp = K.placeholder((None, lab)), K.placeholder((None, t, c))
    il, ll = K.placeholder((None, 1)), K.placeholder((None, 1))
    f = _function([yt, yp, il, ll], K.ctc_batch_cost(yt, yp, il, ll))
    engines = {"cyback": lambda: f([labels, probs, in_len, lab_len])[0]}
    if torch is not None:
        F = torch.nn.functional
        lp = torch.from_numpy(np.log(probs + 1e-7).transpose(1, 0, 2).copy())
        tg = torch.from_numpy(labels.astype(np.int64))
        tl = torch.full((n,), t, dtype=torch.long)
        ll_ = torch.full((n,), lab, dtype=torch.long)

        def run():
            with torch.inference_mode():
                return F.ctc_loss(lp, tg, tl, ll_, blank=c - 1, reduction="none").numpy()[:, None]
        engines["torch"] = run
    return Case("ctc_batch_cost %dx%dx%d L%d" % (n, t, c, lab), engines, None, "ctc")


def case_overhead(scale, torch, threads):
    import cyback as K
    n = SIZES["overhead"][scale]
    x = K.placeholder((None, n))
    f = _function([x], x + 1.0)
    xv = np.ones((1, n), np.float32)
    one = np.float32(1.0)
    engines = {"cyback": lambda: f([xv])[0], "numpy": lambda: np.add(xv, one)}
    if torch is not None:
        tx = torch.from_numpy(xv)
        engines["torch"] = lambda: (tx + 1.0).numpy()
    return Case("per-call overhead x+1 (1x%d)" % n, engines, None, "overhead")


CASES = (case_overhead, case_dot, case_batch_dot, case_conv1d, case_conv2d, case_conv3d,
         case_conv2d_transpose, case_depthwise, case_maxpool, case_avgpool, case_ctc)


def checked(case, tol=1e-4):
    """Run each engine once and check it against cyback's output; returns {engine: error}."""
    ref = np.asarray(case.engines["cyback"]())
    return {name: check_close("%s on %s" % (name, case.name), fn(), ref, tol)
            for name, fn in case.engines.items() if name != "cyback"}
