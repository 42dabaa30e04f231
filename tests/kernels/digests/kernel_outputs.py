"""Run a fixed set of small problems through every kernel module and save the
outputs, so that two builds of cyback can be compared bit for bit.

    python kernel_outputs.py OUT.npz [--code DIR]
    python kernel_outputs.py --record [--code DIR]

``--code DIR`` puts DIR first on sys.path, to run another checkout's cyback
(with its kernels built), e.g. the code before a refactoring. The script
drives the kernels through the backend API (``import cyback as K``,
``K.function``, ``K.gradients``) and through the documented entry points of
the kernel modules, never through private names, so that it runs unchanged
on code whose kernel internals moved.

OUT.npz holds one array per entry ("case/dtype/threads/output") and a JSON
string under ``__meta__``: the sha256 of every entry, the machine signature
(what decides the bits of a float result besides the code: CPU features,
compiler, BLAS) and the inputs' seed. ``--record`` writes the reference that
tests/kernels/test_kernel_digests.py compares against instead (reference.json
and reference.npz beside this file). It holds the outputs of the code before
the kernel modules were split (issue 42, at 0badaba), except the float32
softmax, element-wise and CTC entries, which issue 39's vectorised float32
exp, tanh, sigmoid and erf changed on purpose: those were re-recorded from a
clean build of 6a891cb, whose other outputs were bit-identical to 0badaba's.
Re-record only for a change meant to change kernel outputs, saying so in the
commit.

Every case runs under three thread settings, with the team's cutoff at 0 so
that every parallel path runs: one thread ("t1"), two with every region
forced onto one ("t2f1"), two ("t2f2"). Kernels split their work by the
team's size, so t1 may differ from the others in the last bits, but t2f1
must equal t2f2: the threads that run a region must not change a result.
"""
import hashlib
import json
import os
import platform
import re
import sys

SEED = 20240542
THREADS = (("t1", 1, None), ("t2f1", 2, 1), ("t2f2", 2, 2))
DTYPES = ("float32", "float64")


def _parse_args(argv):
    out, code = None, None
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--code":
            code = args.pop(0)
        elif out is None:
            out = a
        else:
            raise SystemExit("usage: kernel_outputs.py OUT.npz [--code DIR]")
    if out is None:
        raise SystemExit("usage: kernel_outputs.py OUT.npz [--code DIR]")
    return out, code


# ----------------------------------------------------------------- signature

_ISA_FLAGS = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq",
              "avx512bw", "avx512vl", "avx512_vnni", "avxvnni", "avx512_bf16", "amx_int8")


def _cpu():
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, sorted(flags.intersection(_ISA_FLAGS))


def _compiler_of(path):
    """The compiler named in an extension module's .comment section (the
    toolchain decides the rounding of what it vectorises)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    found = sorted(set(m.decode("ascii", "replace")
                       for m in re.findall(rb"(?:GCC|clang version)[ -:][^\x00]{0,80}", data)))
    return "; ".join(found)


def _blas_configs():
    """NumPy's and SciPy's BLAS (name, version, configuration string)."""
    import numpy as np
    out = {"numpy": np.__version__}
    try:
        import scipy
        out["scipy"] = scipy.__version__
    except ImportError:
        scipy = None
    for name, mod in (("numpy", np), ("scipy", scipy)):
        if mod is None:
            continue
        try:
            cfg = mod.show_config(mode="dicts")
            blas = cfg["Build Dependencies"]["blas"]
            out[name + "_blas"] = "%s %s" % (blas.get("name"), blas.get("version"))
        except Exception as e:      # an old NumPy/SciPy: no dicts mode
            out[name + "_blas"] = "unknown (%s)" % type(e).__name__
    try:
        import threadpoolctl
        libs = threadpoolctl.threadpool_info()
        out["blas_libraries"] = sorted("%s %s %s" % (os.path.basename(i.get("filepath", "")),
                                                     i.get("version"), i.get("architecture"))
                                       for i in libs if i.get("user_api") == "blas")
    except Exception:
        pass
    return out


def signature():
    """What decides the bits of a result besides the code under test."""
    from cyback.kernels import conv
    try:
        from cyback._build_info import BUILD_INFO as build
    except ImportError:
        build = {}
    model, flags = _cpu()
    sig = {
        "machine": platform.machine(),
        "cpu_model": model,
        "cpu_flags": flags,
        "compiler": _compiler_of(conv.__file__),
        "compile_args": build.get("compile_args"),
        "openmp": build.get("openmp"),
        "native": build.get("native"),
        "python": platform.python_version(),
        "settings": {k: os.environ[k] for k in sorted(os.environ)
                     if k in ("CYBACK_AVX512", "CYBACK_SGEMM", "CYBACK_WINOGRAD",
                              "CYBACK_BLAS_THREADS", "OPENBLAS_CORETYPE")},
    }
    sig.update(_blas_configs())
    return sig


def signature_key(sig):
    return hashlib.sha256(json.dumps(sig, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the cases

def _cases(K, np):
    """[(name, dtypes, build)]: build(dtype, rs) -> (outputs dict) runs once
    per thread setting; rs is a RandomState seeded per case."""
    cases = []

    def case(name, dtypes=DTYPES):
        def deco(fn):
            cases.append((name, dtypes, fn))
            return fn
        return deco

    def run_with_grads(dtype, rs, inputs, forward):
        """Placeholders for ``inputs`` (name -> array), y = forward(*phs);
        outputs y and the gradients of sum(y * g) for a random g."""
        names = list(inputs)
        phs = [K.placeholder(shape=inputs[n].shape, dtype=dtype, name=n) for n in names]
        y = forward(*phs)
        yshape = K.int_shape(y)
        g = K.placeholder(shape=yshape, dtype=dtype, name="g")
        loss = K.sum(y * g)
        grads = K.gradients(loss, phs)
        f = K.function(phs + [g], [y] + grads)
        gv = rs.standard_normal(yshape).astype(dtype)
        res = f([inputs[n].astype(dtype) for n in names] + [gv])
        out = {"y": res[0]}
        out.update({"d_" + n: r for n, r in zip(names, res[1:])})
        return out

    def randn(rs, *shape):
        return rs.standard_normal(shape)

    def to_first(a):
        # channels_last -> channels_first
        return np.moveaxis(a, -1, 1).copy()

    # ---------------- convolutions: K.conv1d/2d/3d, forward and both gradients
    conv_specs = [
        # name, rank, x shape (channels_last), kernel shape, strides, padding, dilation
        ("conv1d_k3_s1_same", 1, (2, 11, 3), (3, 3, 5), 1, "same", 1),
        ("conv1d_k3_s2_valid", 1, (2, 12, 4), (3, 4, 6), 2, "valid", 1),
        ("conv1d_k3_d2_same", 1, (2, 13, 3), (3, 3, 4), 1, "same", 2),
        ("conv1d_k1", 1, (3, 7, 6), (1, 6, 5), 1, "valid", 1),
        ("conv1d_causal", 1, (2, 9, 3), (2, 3, 4), 1, "causal", 2),
        ("conv2d_k3_s1_same", 2, (2, 7, 6, 3), (3, 3, 3, 5), (1, 1), "same", (1, 1)),
        ("conv2d_k1x1", 2, (2, 5, 6, 8), (1, 1, 8, 7), (1, 1), "valid", (1, 1)),
        ("conv2d_k1x1_s2", 2, (2, 7, 6, 5), (1, 1, 5, 6), (2, 2), "valid", (1, 1)),
        ("conv2d_k3_s2_valid", 2, (2, 9, 8, 4), (3, 3, 4, 6), (2, 2), "valid", (1, 1)),
        ("conv2d_k3_s2_same", 2, (1, 8, 9, 3), (3, 3, 3, 4), (2, 2), "same", (1, 1)),
        ("conv2d_k3x2_s21", 2, (2, 9, 7, 3), (3, 2, 3, 5), (2, 1), "valid", (1, 1)),
        ("conv2d_k3_d2_same", 2, (2, 9, 9, 3), (3, 3, 3, 4), (1, 1), "same", (2, 2)),
        ("conv2d_k5_s1_valid", 2, (1, 9, 10, 2), (5, 5, 2, 3), (1, 1), "valid", (1, 1)),
        # Winograd F(2x2, 3x3) (float32 only; float64 takes the direct kernel, as
        # above): stride 1, 24+ channels in (12+ in 3-D), 16+ out, 16+ 2x2 tiles
        ("conv2d_winograd_k3", 2, (1, 9, 8, 24), (3, 3, 24, 16), (1, 1), "same", (1, 1)),
        ("conv2d_winograd_k3_valid", 2, (1, 10, 10, 24), (3, 3, 24, 16), (1, 1), "valid",
         (1, 1)),
        ("conv3d_k3_s1_same", 3, (1, 5, 6, 5, 3), (3, 3, 3, 3, 4), (1, 1, 1), "same",
         (1, 1, 1)),
        ("conv3d_k1", 3, (2, 3, 4, 3, 5), (1, 1, 1, 5, 4), (1, 1, 1), "valid", (1, 1, 1)),
        ("conv3d_k3_s2_valid", 3, (1, 7, 6, 7, 2), (3, 3, 3, 2, 3), (2, 2, 2), "valid",
         (1, 1, 1)),
        ("conv3d_k3_d2_same", 3, (1, 6, 6, 6, 2), (3, 3, 3, 2, 3), (1, 1, 1), "same",
         (2, 2, 2)),
        ("conv3d_winograd_k3", 3, (1, 3, 10, 10, 12), (3, 3, 3, 12, 16), (1, 1, 1), "valid",
         (1, 1, 1)),
    ]
    convs = {1: K.conv1d, 2: K.conv2d, 3: K.conv3d}
    for name, rank, xs, ks, strides, padding, dil in conv_specs:
        for fmt in ("channels_last", "channels_first"):
            if padding == "causal" and fmt == "channels_first":
                continue

            def build(dtype, rs, rank=rank, xs=xs, ks=ks, strides=strides, padding=padding,
                      dil=dil, fmt=fmt):
                x = randn(rs, *xs)
                if fmt == "channels_first":
                    x = to_first(x)
                k = randn(rs, *ks) * 0.5
                return run_with_grads(dtype, rs, {"x": x, "k": k}, lambda a, b: convs[rank](
                    a, b, strides=strides, padding=padding, data_format=fmt,
                    dilation_rate=dil))
            case("%s/%s" % (name, fmt), ("float32",) if "winograd" in name else DTYPES)(build)

    # ---------------- transposed convolutions (the backward-input kernels as a forward)
    tconv_specs = [
        ("conv2d_transpose_s2_same", 2, (2, 4, 5, 4), (3, 3, 3, 4), (2, 8, 10, 3), (2, 2),
         "same"),
        ("conv2d_transpose_s1_valid", 2, (1, 5, 5, 3), (3, 3, 2, 3), (1, 7, 7, 2), (1, 1),
         "valid"),
        ("conv3d_transpose_s2_same", 3, (1, 3, 3, 3, 2), (3, 3, 3, 3, 2), (1, 6, 6, 6, 3),
         (2, 2, 2), "same"),
    ]
    tconvs = {2: K.conv2d_transpose, 3: K.conv3d_transpose}
    for name, rank, xs, ks, outs, strides, padding in tconv_specs:
        for fmt in ("channels_last", "channels_first"):
            def build(dtype, rs, rank=rank, xs=xs, ks=ks, outs=outs, strides=strides,
                      padding=padding, fmt=fmt):
                x = randn(rs, *xs)
                o = outs
                if fmt == "channels_first":
                    x = to_first(x)
                    o = (outs[0], outs[-1]) + tuple(outs[1:-1])
                k = randn(rs, *ks) * 0.5
                return run_with_grads(dtype, rs, {"x": x, "k": k}, lambda a, b: tconvs[rank](
                    a, b, o, strides=strides, padding=padding, data_format=fmt))
            case("%s/%s" % (name, fmt))(build)

    # ---------------- depthwise and separable
    dw_specs = [
        ("depthwise_k3_s1_same", (2, 7, 8, 4), (3, 3, 4, 2), (1, 1), "same", (1, 1)),
        ("depthwise_k3_s2_valid", (2, 9, 9, 3), (3, 3, 3, 1), (2, 2), "valid", (1, 1)),
        ("depthwise_k3_d2_same", (1, 9, 8, 5), (3, 3, 5, 1), (1, 1), "same", (2, 2)),
        ("depthwise_k5_m3", (1, 8, 8, 2), (5, 5, 2, 3), (1, 1), "valid", (1, 1)),
        ("depthwise_k3_c16", (2, 6, 6, 16), (3, 3, 16, 1), (1, 1), "same", (1, 1)),
    ]
    for name, xs, ks, strides, padding, dil in dw_specs:
        for fmt in ("channels_last", "channels_first"):
            def build(dtype, rs, xs=xs, ks=ks, strides=strides, padding=padding, dil=dil,
                      fmt=fmt):
                x = randn(rs, *xs)
                if fmt == "channels_first":
                    x = to_first(x)
                k = randn(rs, *ks) * 0.5
                return run_with_grads(dtype, rs, {"x": x, "k": k},
                                      lambda a, b: K.depthwise_conv2d(
                                          a, b, strides=strides, padding=padding,
                                          data_format=fmt, dilation_rate=dil))
            case("%s/%s" % (name, fmt))(build)

    for fmt in ("channels_last", "channels_first"):
        def build_sep2(dtype, rs, fmt=fmt):
            x = randn(rs, 2, 7, 7, 4)
            if fmt == "channels_first":
                x = to_first(x)
            dk, pk = randn(rs, 3, 3, 4, 2) * 0.5, randn(rs, 1, 1, 8, 5) * 0.5
            return run_with_grads(dtype, rs, {"x": x, "dk": dk, "pk": pk},
                                  lambda a, b, c: K.separable_conv2d(
                                      a, b, c, strides=(1, 1), padding="same", data_format=fmt))
        case("separable_conv2d_k3_same/%s" % fmt)(build_sep2)

        def build_sep1(dtype, rs, fmt=fmt):
            x = randn(rs, 2, 10, 3)
            if fmt == "channels_first":
                x = to_first(x)
            dk, pk = randn(rs, 3, 3, 2) * 0.5, randn(rs, 1, 6, 4) * 0.5
            return run_with_grads(dtype, rs, {"x": x, "dk": dk, "pk": pk},
                                  lambda a, b, c: K.separable_conv1d(
                                      a, b, c, strides=2, padding="valid", data_format=fmt))
        case("separable_conv1d_k3_s2/%s" % fmt)(build_sep1)

    # ---------------- pooling
    pool_specs = [
        ("pool2d_2x2_s2", 2, (2, 8, 7, 3), (2, 2), (2, 2), "valid"),
        ("pool2d_3x3_s1_same", 2, (2, 6, 6, 4), (3, 3), (1, 1), "same"),
        ("pool2d_3x3_s2_same", 2, (1, 9, 8, 2), (3, 3), (2, 2), "same"),
        ("pool3d_2_s2", 3, (1, 6, 5, 6, 2), (2, 2, 2), (2, 2, 2), "valid"),
        ("pool3d_3_s1_same", 3, (1, 4, 5, 4, 3), (3, 3, 3), (1, 1, 1), "same"),
    ]
    pools = {2: K.pool2d, 3: K.pool3d}
    for name, rank, xs, ps, strides, padding in pool_specs:
        for mode in ("max", "avg"):
            for fmt in ("channels_last", "channels_first"):
                def build(dtype, rs, rank=rank, xs=xs, ps=ps, strides=strides, padding=padding,
                          mode=mode, fmt=fmt):
                    x = randn(rs, *xs)
                    if fmt == "channels_first":
                        x = to_first(x)
                    return run_with_grads(dtype, rs, {"x": x}, lambda a: pools[rank](
                        a, ps, strides=strides, padding=padding, data_format=fmt,
                        pool_mode=mode))
                case("%s_%s/%s" % (name, mode, fmt))(build)

    # ---------------- locally connected
    for fmt in ("channels_last", "channels_first"):
        def build_local1(dtype, rs, fmt=fmt):
            x = randn(rs, 2, 9, 3)          # kernel 3, stride 2 -> 4 steps
            if fmt == "channels_first":
                x = to_first(x)
            k = randn(rs, 4, 3 * 3, 5) * 0.5
            return run_with_grads(dtype, rs, {"x": x, "k": k},
                                  lambda a, b: K.local_conv1d(a, b, (3,), (2,),
                                                              data_format=fmt))
        case("local_conv1d_k3_s2/%s" % fmt)(build_local1)

        def build_local2(dtype, rs, fmt=fmt):
            x = randn(rs, 2, 6, 5, 3)       # kernel 3x2, strides 1x1 -> 4x4
            if fmt == "channels_first":
                x = to_first(x)
            k = randn(rs, 16, 3 * 2 * 3, 4) * 0.5
            return run_with_grads(dtype, rs, {"x": x, "k": k},
                                  lambda a, b: K.local_conv2d(a, b, (3, 2), (1, 1), (4, 4),
                                                              data_format=fmt))
        case("local_conv2d_k3x2/%s" % fmt)(build_local2)

    # ---------------- products (K and the linalg entry points)
    @case("dot_bias_relu")
    def _dense(dtype, rs):
        x, w, b = randn(rs, 9, 13), randn(rs, 13, 11), randn(rs, 11)
        return run_with_grads(dtype, rs, {"x": x, "w": w, "b": b},
                              lambda a, c, d: K.relu(K.bias_add(K.dot(a, c), d)))

    @case("dot_3d")
    def _dot3(dtype, rs):
        x, w = randn(rs, 3, 5, 7), randn(rs, 7, 6)
        return run_with_grads(dtype, rs, {"x": x, "w": w}, lambda a, c: K.dot(a, c))

    @case("batch_dot")
    def _bdot(dtype, rs):
        x, y = randn(rs, 4, 5, 6), randn(rs, 4, 6, 3)
        return run_with_grads(dtype, rs, {"x": x, "y": y},
                              lambda a, c: K.batch_dot(a, c, axes=(2, 1)))

    @case("batch_dot_t")
    def _bdot_t(dtype, rs):
        x, y = randn(rs, 3, 5, 6), randn(rs, 3, 4, 6)
        return run_with_grads(dtype, rs, {"x": x, "y": y},
                              lambda a, c: K.batch_dot(a, c, axes=(2, 2)))

    @case("linalg_entry_points")
    def _linalg(dtype, rs):
        from cyback.kernels import linalg
        a, b, bias = (randn(rs, 37, 29).astype(dtype), randn(rs, 29, 23).astype(dtype),
                      randn(rs, 23).astype(dtype))
        out = {"matmul": linalg.matmul(a, b), "matmul_bias": linalg.matmul(a, b, bias),
               "matmul_at": linalg.matmul(randn(rs, 29, 37).astype(dtype).T, b)}
        for act in (0, 1, 2):
            r = linalg.dense(a, b, bias, act)
            if r is not None:
                out["dense_act%d" % act] = r
        x3, y3 = randn(rs, 5, 7, 6).astype(dtype), randn(rs, 5, 6, 4).astype(dtype)
        out["batch_gemm"] = linalg.batch_gemm(x3, y3)
        out["batch_gemm_tb"] = linalg.batch_gemm(x3, np.ascontiguousarray(
            y3.transpose(0, 2, 1)), trans_b=True)
        out["batch_gemm_ta"] = linalg.batch_gemm(np.ascontiguousarray(
            x3.transpose(0, 2, 1)), y3, trans_a=True)
        return out

    # ---------------- softmax, reductions, elementwise chains
    @case("softmax")
    def _softmax(dtype, rs):
        return run_with_grads(dtype, rs, {"x": randn(rs, 7, 13) * 3}, K.softmax)

    @case("softmax_3d")
    def _softmax3(dtype, rs):
        return run_with_grads(dtype, rs, {"x": randn(rs, 3, 5, 9) * 3}, K.softmax)

    @case("softmax_entry_point")
    def _softmax_k(dtype, rs):
        from cyback.kernels import softmax
        return {"y": softmax.softmax_last(randn(rs, 6, 17).astype(dtype) * 4)}

    @case("reduce_sum_mean")
    def _reduce(dtype, rs):
        x = randn(rs, 6, 37, 5)
        return run_with_grads(dtype, rs, {"x": x},
                              lambda a: K.concatenate([K.sum(a, axis=1),
                                                       K.mean(a, axis=1)], axis=-1))

    @case("reduce_entry_point")
    def _reduce_k(dtype, rs):
        from cyback.kernels import reduce
        x = randn(rs, 4, 53, 7).astype(dtype)
        return {"sum": reduce.sum_middle(x, 4, 53, 7),
                "mean": reduce.sum_middle(x, 4, 53, 7, True)}

    @case("reduce_axes")
    def _reduce2(dtype, rs):
        x = randn(rs, 5, 6, 7)
        return run_with_grads(dtype, rs, {"x": x},
                              lambda a: K.sum(a, axis=(0, 2)) + K.mean(a, axis=[0, 2]) +
                              K.max(a, axis=(0, 2)))

    @case("elementwise_chain")
    def _ewise(dtype, rs):
        x, y, z = randn(rs, 7, 19), randn(rs, 7, 19), randn(rs, 19)
        return run_with_grads(dtype, rs, {"x": x, "y": y, "z": z},
                              lambda a, b, c: K.tanh(a) * K.sigmoid(b) + K.exp(-K.square(a - c))
                              + K.relu(b * 0.5 - c) / (1.0 + K.abs(a)))

    # ---------------- CTC
    @case("ctc_batch_cost")
    def _ctc(dtype, rs):
        B, T, C = 3, 12, 6
        logits = randn(rs, B, T, C)
        labels = np.array([[1, 2, 2, 3], [4, 0, 0, 0], [3, 1, 4, 0]], dtype="int32")
        label_len = np.array([[4], [1], [3]], dtype="int32")
        in_len = np.array([[12], [9], [11]], dtype="int32")
        yp = K.placeholder(shape=(B, T, C), dtype=dtype)
        yt = K.placeholder(shape=labels.shape, dtype="int32")
        il = K.placeholder(shape=(B, 1), dtype="int32")
        ll = K.placeholder(shape=(B, 1), dtype="int32")
        probs = K.softmax(yp)
        loss = K.ctc_batch_cost(yt, probs, il, ll)
        g = K.gradients(K.sum(loss), [yp])[0]
        res = K.function([yt, yp, il, ll], [loss, g])([labels, logits.astype(dtype),
                                                        in_len, label_len])
        return {"loss": res[0], "d_logits": res[1]}

    @case("ctc_entry_point")
    def _ctc_k(dtype, rs):
        from cyback.kernels import ctc
        logits = randn(rs, 2, 10, 5).astype(dtype)
        labels = np.array([[1, 3, 3], [2, 4, 0]], dtype="int32")
        loss, grad = ctc.ctc_loss(logits, labels, np.array([10, 8], dtype="int32"),
                                  np.array([3, 2], dtype="int32"))
        return {"loss": np.asarray(loss), "grad": np.asarray(grad)}

    # ---------------- recurrent cells through K.rnn (the fused cell kernels)
    def rnn_case(cell, B, T, n_in, u, go_backwards=False, masked=False, reset_after=False):
        def build(dtype, rs):
            G = {"lstm": 4, "gru": 3, "simple": 1}[cell]
            vals = {"x": randn(rs, B, T, n_in), "h0": randn(rs, B, u) * 0.5,
                    "W": randn(rs, n_in, G * u) * 0.4, "R": randn(rs, u, G * u) * 0.4,
                    "b": randn(rs, G * u) * 0.1}
            if reset_after:
                vals["rb"] = randn(rs, G * u) * 0.1
            mask = None
            if masked:
                m = np.ones((B, T), dtype=bool)
                m[0, T // 2:] = False
                m[-1, :2] = False
                mask = K.constant(m, dtype="bool")

            def forward(*phs):
                p = dict(zip(vals, phs))
                x, h0, W, R, b = p["x"], p["h0"], p["W"], p["R"], p["b"]
                if cell == "lstm":
                    def step(xt, states):
                        h, c = states
                        z = K.bias_add(K.dot(xt, W) + K.dot(h, R), b)
                        i, f = K.sigmoid(z[:, :u]), K.sigmoid(z[:, u:2 * u])
                        c2 = f * c + i * K.tanh(z[:, 2 * u:3 * u])
                        h2 = K.sigmoid(z[:, 3 * u:]) * K.tanh(c2)
                        return h2, [h2, c2]
                    init = [h0, h0 * 0.5]
                elif cell == "gru":
                    def step(xt, states):
                        h = states[0]
                        xz = K.bias_add(K.dot(xt, W), b)
                        if reset_after:
                            inner = K.bias_add(K.dot(h, R), p["rb"])
                        else:
                            inner = K.dot(h, R[:, :2 * u])
                        z = K.sigmoid(xz[:, :u] + inner[:, :u])
                        r = K.sigmoid(xz[:, u:2 * u] + inner[:, u:2 * u])
                        rec = r * inner[:, 2 * u:] if reset_after else K.dot(r * h, R[:, 2 * u:])
                        hh = K.tanh(xz[:, 2 * u:] + rec)
                        out = z * h + (1 - z) * hh
                        return out, [out]
                    init = [h0]
                else:
                    def step(xt, states):
                        out = K.tanh(K.bias_add(K.dot(xt, W), b) + K.dot(states[0], R))
                        return out, [out]
                    init = [h0]
                last, outputs, states = K.rnn(step, x, init, go_backwards=go_backwards,
                                              mask=mask)
                return outputs + K.expand_dims(states[-1], 1)
            return run_with_grads(dtype, rs, vals, forward)
        return build

    for cell, B, T, n_in, u, gb, masked, ra, tag in [
            ("lstm", 3, 6, 5, 7, False, False, False, "lstm"),
            ("lstm", 9, 5, 4, 8, True, True, False, "lstm_b9_backwards_masked"),
            ("gru", 3, 6, 5, 7, False, False, False, "gru"),
            ("gru", 9, 5, 4, 6, False, True, True, "gru_reset_after_b9_masked"),
            ("gru", 2, 4, 3, 5, True, False, True, "gru_reset_after_backwards"),
            ("simple", 3, 7, 4, 6, False, False, False, "simple_rnn"),
            ("simple", 10, 5, 3, 5, True, True, False, "simple_rnn_b10_backwards_masked")]:
        case("rnn_" + tag)(rnn_case(cell, B, T, n_in, u, gb, masked, ra))

    # ---------------- int8 products (the qgemm entry points)
    @case("qgemm", dtypes=("float32",))
    def _qgemm(dtype, rs):
        from cyback.kernels import qgemm
        M, Kd, N = 13, 37, 21
        x = randn(rs, M, Kd).astype("float32")
        a = qgemm.quantize(x, 0.03, 128)
        w = rs.randint(-127, 128, size=(Kd, N)).astype("int8")
        packed = qgemm.pack_weights(w)
        sb = (rs.rand(N) * 0.01 + 0.001).astype("float32")
        bias = randn(rs, N).astype("float32")
        out = {"quantized": a, "packed": packed,
               "gemm": qgemm.gemm(a, packed, 0.03, 128, sb),
               "gemm_bias_relu": qgemm.gemm(a, packed, 0.03, 128, sb, bias, "relu")}
        return out

    return cases


def compute(names=None):
    """{entry: array} for every case (or the cases named), every dtype and
    thread setting."""
    import numpy as np

    import cyback as K
    from cyback.kernels import runtime

    saved = (K.get_num_threads(), runtime.parallel_min_work())
    runtime.set_parallel_min_work(0)
    runtime.force_host_busy(False)
    results, errors = {}, {}
    try:
        for tag, threads, forced in THREADS:
            K.set_num_threads(threads)
            runtime.force_team_threads(forced)
            for i, (name, dtypes, build) in enumerate(_cases(K, np)):
                if names is not None and name not in names:
                    continue
                for dtype in dtypes:
                    key = "%s/%s/%s" % (name, dtype, tag)
                    rs = np.random.RandomState((SEED + i * 7919) % 2 ** 31)
                    runtime.team_rest()
                    try:
                        outs = build(dtype, rs)
                    except Exception as e:
                        errors[key] = "%s: %s" % (type(e).__name__, e)
                        continue
                    for out_name, arr in outs.items():
                        results["%s/%s" % (key, out_name)] = np.ascontiguousarray(arr)
    finally:
        runtime.force_team_threads(None)
        runtime.force_host_busy(None)
        runtime.set_parallel_min_work(saved[1])
        K.set_num_threads(saved[0])
    return results, errors


def sha256_of(arr):
    import numpy as np
    arr = np.ascontiguousarray(arr)
    h = hashlib.sha256()
    h.update(("%s%s" % (arr.dtype.str, arr.shape)).encode())
    h.update(arr.tobytes())
    return h.hexdigest()


REFERENCE_TAG = "t2f2"     # the thread setting whose arrays the reference keeps
HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE_JSON = os.path.join(HERE, "reference.json")
REFERENCE_NPZ = os.path.join(HERE, "reference.npz")


def reference_name(entry):
    """'case/dtype/tag/output' -> 'case/dtype/output' (the reference keeps
    one array per output: thread settings agree to within rounding)."""
    parts = entry.split("/")
    return "/".join(parts[:-2] + parts[-1:])


def thread_tag(entry):
    return entry.split("/")[-2]


def write_outputs(out, results, errors, meta_extra):
    import numpy as np
    meta = dict(meta_extra, errors=errors,
                entries={k: sha256_of(v) for k, v in sorted(results.items())})
    np.savez_compressed(out, __meta__=np.array(json.dumps(meta, sort_keys=True)), **results)
    return meta


def write_reference(results, errors, meta_extra):
    """reference.json (signature, sha256 of every entry) and reference.npz
    (each output of the REFERENCE_TAG run, of another where only that one
    gives it, float64 stored as float32: enough
    for the tolerance comparison on other machines, and under 1 MiB)."""
    import numpy as np
    if errors:
        raise SystemExit("not recording a reference with errors: %s" % sorted(errors))
    meta = dict(meta_extra, entries={k: sha256_of(v) for k, v in sorted(results.items())})
    with open(REFERENCE_JSON, "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    arrays = {}
    # REFERENCE_TAG's array, or another setting's for an output only it gives
    order = [REFERENCE_TAG] + [t for t, _, _ in THREADS if t != REFERENCE_TAG]
    for k, v in sorted(results.items(), key=lambda kv: order.index(thread_tag(kv[0]))):
        arrays.setdefault(reference_name(k),
                          v.astype(np.float32) if v.dtype == np.float64 else v)
    np.savez_compressed(REFERENCE_NPZ, **arrays)


def main(argv):
    record = "--record" in argv
    argv = [a for a in argv if a != "--record"]
    out, code = _parse_args(argv if not record else ["-"] + argv)
    if code is not None:
        sys.path.insert(0, os.path.abspath(code))

    import cyback
    if code is not None and not os.path.abspath(cyback.__file__).startswith(
            os.path.abspath(code) + os.sep):
        raise SystemExit("imported %s, not the code in %s" % (cyback.__file__, code))
    results, errors = compute()
    sig = signature()
    meta_extra = {"signature": sig, "signature_key": signature_key(sig), "seed": SEED}
    if record:
        write_reference(results, errors, meta_extra)
        where = "%s and %s" % (REFERENCE_JSON, REFERENCE_NPZ)
    else:
        write_outputs(out, results, errors, meta_extra)
        where = out
    print("%d entries, %d errors, signature %s, from %s, written to %s"
          % (len(results), len(errors), meta_extra["signature_key"],
             os.path.dirname(cyback.__file__), where))
    for k, v in sorted(errors.items()):
        print("ERROR %s: %s" % (k, v))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
