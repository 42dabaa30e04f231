"""cyback.ops.quantized: the int8 Dense and convolution ops against a NumPy
integer reference, in compiled functions (weights packed with the frozen
weights, refreshed when they change), their shape rules and their refusal
to be differentiated."""
import numpy as np
import pytest

import cyback as K
from cyback.kernels import conv_utils
from cyback.ops import quantized as qops


def ref_codes(x, scale, zero):
    v = np.asarray(x, np.float32) / np.float32(scale)
    v = np.where(np.isnan(v), np.float32(-zero), v)
    v = np.clip(v, np.float32(-zero), np.float32(255 - zero))
    return np.rint(v).astype(np.int64) + zero


def ref_epilogue(d, in_scale, scale, bias, act):
    y = d.astype(np.int32).astype(np.float32) * (np.float32(in_scale) * scale.astype(np.float32))
    if bias is not None:
        y = y + bias.astype(np.float32)
    if act in ("relu", "relu6"):
        y = np.maximum(np.float32(0), y)
    if act == "relu6":
        y = np.minimum(np.float32(6), y)
    return y


def ref_dense(x, w, scale, bias, in_scale, in_zero, act):
    q = ref_codes(x, in_scale, in_zero) - in_zero
    d = q.reshape(-1, w.shape[0]) @ w.astype(np.int64)
    y = ref_epilogue(d, in_scale, scale, bias, act)
    return y.reshape(x.shape[:-1] + (w.shape[1],))


def ref_conv(x, w, scale, bias, in_scale, in_zero, act, strides, dilation, padding):
    """x (N, *spatial, C), w (*window, C, F), by shifted slices in int64."""
    rank = x.ndim - 2
    q = ref_codes(x, in_scale, in_zero) - in_zero          # padding holds real 0
    sizes, window = x.shape[1:-1], w.shape[:rank]
    pads = [conv_utils.conv_pads(n, k, s, d, padding)
            for n, k, s, d in zip(sizes, window, strides, dilation)]
    out = [conv_utils.conv_output_length(n, k, s, d, padding)
           for n, k, s, d in zip(sizes, window, strides, dilation)]
    qp = np.pad(q, [(0, 0)] + pads + [(0, 0)])
    acc = np.zeros((x.shape[0],) + tuple(out) + (w.shape[-1],), np.int64)
    for tap in np.ndindex(*window):
        sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                   for t, d, o, s in zip(tap, dilation, out, strides))
        acc += np.einsum("...c,cf->...f", qp[(slice(None),) + sl], w[tap].astype(np.int64))
    y = ref_epilogue(acc.reshape(-1, w.shape[-1]), in_scale, scale, bias, act)
    return y.reshape(acc.shape)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def weights(rng, shape):
    w = rng.integers(-127, 128, shape, dtype=np.int8)
    scale = rng.uniform(1e-3, 1e-2, shape[-1]).astype(np.float32)
    bias = rng.standard_normal(shape[-1]).astype(np.float32)
    return w, scale, bias


def dense_graph(x, w, scale, bias, in_scale, in_zero, act):
    packed = qops.PackInt8()(w)
    vectors = qops.EpilogueVectors(in_scale)(scale, bias) if bias is not None else \
        qops.EpilogueVectors(in_scale)(scale)
    return qops.QuantizedDense(w.shape[-1], in_scale, in_zero, act)(x, packed, vectors)


@pytest.mark.parametrize("act", ["linear", "relu", "relu6"])
@pytest.mark.parametrize("xshape", [(1, 7), (5, 33), (2, 3, 20), (0, 9)])
def test_dense_in_a_function(rng, act, xshape):
    w, scale, bias = weights(rng, (xshape[-1], 19))
    x = K.placeholder(shape=(None,) + xshape[1:])
    kv, sv, bv = K.variable(w, dtype="int8"), K.variable(scale), K.variable(bias)
    f = K.function([x], [dense_graph(x, kv, sv, bv, 0.02, 131, act)])
    xv = (rng.standard_normal(xshape) * 2).astype(np.float32)
    assert same_bits(f([xv])[0], ref_dense(xv, w, scale, bias, 0.02, 131, act))
    # new weights reach the frozen packed kernel
    w2, scale2, bias2 = weights(rng, (xshape[-1], 19))
    K.set_value(kv, w2)
    K.set_value(sv, scale2)
    K.set_value(bv, bias2)
    assert same_bits(f([xv])[0], ref_dense(xv, w2, scale2, bias2, 0.02, 131, act))


def test_weights_are_packed_once_per_change(rng, monkeypatch):
    from cyback.kernels import qgemm
    packs = []
    real = qgemm.pack_weights

    def counting(w):
        packs.append(w.shape)
        return real(w)
    monkeypatch.setattr(qgemm, "pack_weights", counting)
    w, scale, bias = weights(rng, (10, 7))
    kv = K.variable(w, dtype="int8")
    x = K.placeholder(shape=(None, 10))
    f = K.function([x], [dense_graph(x, kv, K.variable(scale), K.variable(bias), 0.1, 9,
                                     "relu")])
    xv = rng.standard_normal((3, 10)).astype(np.float32)
    for _ in range(3):
        f([xv])
    assert packs == [(10, 7)]
    w2, _, _ = weights(rng, (10, 7))
    K.set_value(kv, w2)
    first = f([xv])[0]
    assert packs == [(10, 7)] * 2
    assert same_bits(f([xv])[0], first) and len(packs) == 2


def test_dense_without_bias_and_from_float64(rng):
    w, scale, _ = weights(rng, (12, 5))
    xv = rng.standard_normal((4, 12))
    y = K.eval(dense_graph(K.constant(xv, dtype="float64"), K.constant(w, dtype="int8"),
                           K.constant(scale), None, 0.05, 0, "linear"))
    assert same_bits(y, ref_dense(xv.astype(np.float32), w, scale, None, 0.05, 0, "linear"))


CONV_CASES = [
    # rank, x shape, window, strides, dilation, padding
    (2, (2, 6, 7, 3), (3, 3), (1, 1), (1, 1), "same"),
    (2, (1, 9, 8, 4), (3, 2), (2, 1), (1, 2), "same"),
    (2, (2, 7, 7, 5), (3, 3), (2, 2), (1, 1), "valid"),
    (2, (3, 5, 4, 6), (1, 1), (1, 1), (1, 1), "same"),       # 1x1: the product as it is
    (2, (1, 6, 6, 8), (1, 1), (2, 2), (1, 1), "valid"),      # 1x1 strided: patches
    (1, (2, 11, 3), (3,), (1,), (1,), "causal"),
    (1, (2, 12, 4), (5,), (2,), (1,), "same"),
    (1, (1, 10, 2), (3,), (1,), (3,), "valid"),
    (1, (2, 9, 7), (1,), (1,), (1,), "valid"),
    # one sequence, stride 1: its windows are overlapping rows, read in place
    (1, (1, 13, 5), (3,), (1,), (1,), "valid"),
    (1, (1, 13, 5), (4,), (1,), (1,), "same"),
    (1, (1, 8, 3), (3,), (1,), (1,), "causal"),
    (1, (1, 3, 6), (3,), (1,), (1,), "valid"),                # one window
]


@pytest.mark.parametrize("rank,xshape,window,strides,dilation,padding", CONV_CASES)
def test_conv_in_a_function(rng, rank, xshape, window, strides, dilation, padding):
    w, scale, bias = weights(rng, window + (xshape[-1], 13))
    x = K.placeholder(shape=(None,) + xshape[1:])
    op = qops.QuantizedConv(rank, 13, window, strides, dilation, padding, 0.03, 77, "relu")
    y = op(x, qops.PackInt8()(K.variable(w, dtype="int8")),
           qops.EpilogueVectors(0.03)(K.variable(scale), K.variable(bias)))
    xv = (rng.standard_normal(xshape) * 2).astype(np.float32)
    got = K.function([x], [y])([xv])[0]
    want = ref_conv(xv, w, scale, bias, 0.03, 77, "relu", strides, dilation, padding)
    assert y.shape[1:] == want.shape[1:]
    assert same_bits(got, want)


def test_empty_batch(rng):
    w, scale, bias = weights(rng, (3, 3, 2, 5))
    op = qops.QuantizedConv(2, 5, (3, 3), (1, 1), (1, 1), "same", 0.1, 3)
    x = K.placeholder(shape=(None, 4, 4, 2))
    y = op(x, qops.PackInt8()(K.constant(w, dtype="int8")),
           qops.EpilogueVectors(0.1)(K.constant(scale), K.constant(bias)))
    out = K.function([x], [y])([np.zeros((0, 4, 4, 2), np.float32)])[0]
    assert out.shape == (0, 4, 4, 5) and out.dtype == np.float32


def test_conv_threads_give_the_same_bits(rng):
    w, scale, bias = weights(rng, (3, 3, 8, 24))
    xv = rng.standard_normal((4, 15, 13, 8)).astype(np.float32)
    op = qops.QuantizedConv(2, 24, (3, 3), (1, 1), (1, 1), "same", 0.02, 120, "linear")
    y = op(K.constant(xv), qops.PackInt8()(K.constant(w, dtype="int8")),
           qops.EpilogueVectors(0.02)(K.constant(scale), K.constant(bias)))
    want = ref_conv(xv, w, scale, bias, 0.02, 120, "linear", (1, 1), (1, 1), "same")
    for threads in (1, 2, 3):
        K.set_num_threads(threads)
        assert same_bits(K.eval(y + 0), want)


def test_no_gradient(rng):
    w, scale, bias = weights(rng, (6, 4))
    x = K.placeholder(shape=(None, 6))
    y = dense_graph(x, K.variable(w, dtype="int8"), K.variable(scale), K.variable(bias),
                    0.1, 0, "relu")
    with pytest.raises(TypeError, match="quantized_dense has no gradient.*inference"):
        K.gradients(K.sum(y), [x])
    xc = K.placeholder(shape=(None, 5, 6))
    yc = qops.QuantizedConv(1, 4, (1,), (1,), (1,), "valid", 0.1, 0)(
        xc, qops.PackInt8()(K.variable(w[None], dtype="int8")),
        qops.EpilogueVectors(0.1)(K.variable(scale)))
    with pytest.raises(TypeError, match="quantized_conv has no gradient"):
        K.gradients(K.sum(yc), [xc])


def test_shape_rules_and_bad_arguments(rng):
    w, scale, bias = weights(rng, (6, 4))
    packed = qops.PackInt8()(K.constant(w, dtype="int8"))
    vectors = qops.EpilogueVectors(0.1)(K.constant(scale), K.constant(bias))
    x = K.placeholder(shape=(None, 7, 6))
    assert qops.QuantizedDense(4, 0.1, 0)(x, packed, vectors).shape == (None, 7, 4)
    with pytest.raises(ValueError, match="do not hold a \\(9, 4\\) kernel"):
        qops.QuantizedDense(4, 0.1, 0)(K.placeholder(shape=(None, 9)), packed, vectors)
    # 5 and 6 features pack into the same size: the product's own check (the
    # packed header's K) tells them apart
    x5 = K.placeholder(shape=(None, 5))
    y5 = qops.QuantizedDense(4, 0.1, 0)(x5, packed, vectors)
    with pytest.raises(ValueError, match="K = 5 columns, the packed weights 6 rows"):
        K.function([x5], [y5])([np.zeros((2, 5), np.float32)])
    with pytest.raises(ValueError, match="must be int8"):
        qops.PackInt8()(K.constant(w.astype(np.float32)))
    with pytest.raises(ValueError, match="2 or more axes"):
        qops.PackInt8()(K.constant(w[0], dtype="int8"))
    with pytest.raises(ValueError, match="fused activation"):
        qops.QuantizedDense(4, 0.1, 0, "tanh")
    with pytest.raises(ValueError, match="float input"):
        qops.QuantizedDense(4, 0.1, 0)(K.placeholder(shape=(None, 6), dtype="int32"), packed,
                                       vectors)
    with pytest.raises(ValueError, match="bias of its shape"):
        qops.EpilogueVectors(0.1)(K.constant(scale), K.constant(bias[:3]))
    with pytest.raises(ValueError, match="padding"):
        qops.QuantizedConv(2, 4, (3, 3), (1, 1), (1, 1), "causal", 0.1, 0)
    with pytest.raises(ValueError, match="strides must be 2"):
        qops.QuantizedConv(2, 4, (3, 3), (1,), (1, 1), "same", 0.1, 0)
    conv = qops.QuantizedConv(2, 4, (3, 3), (1, 1), (1, 1), "valid", 0.1, 0)
    wk, sk, _ = weights(rng, (3, 3, 1, 4))
    packed_k, vectors_k = qops.PackInt8()(K.constant(wk, dtype="int8")), \
        qops.EpilogueVectors(0.1)(K.constant(sk))
    with pytest.raises(ValueError, match="larger than the input"):
        conv(K.placeholder(shape=(None, 2, 5, 1)), packed_k, vectors_k)
    with pytest.raises(ValueError, match="4-D input"):
        conv(K.placeholder(shape=(None, 5, 1)), packed_k, vectors_k)
    with pytest.raises(ValueError, match="do not hold a \\(18, 4\\) kernel"):
        conv(K.placeholder(shape=(None, 5, 5, 2)), packed_k, vectors_k)
    # a window too large for sizes known only at run time
    xr = K.placeholder(shape=(None, None, None, 1))
    y = conv(xr, packed_k, vectors_k)
    with pytest.raises(ValueError, match="larger than the input"):
        K.function([xr], [y])([np.zeros((1, 2, 2, 1), np.float32)])


@pytest.mark.parametrize("depthwise", [False, True])
def test_window_geometry_per_run_time_shape(rng, depthwise):
    # (output sizes, pads) are remembered per input shape: calls of several
    # spatial sizes through one function each get their own, and a window
    # too large raises at every call
    if depthwise:
        wd = rng.integers(-127, 128, (3, 3, 4, 1)).astype(np.int8)
        op = qops.QuantizedDepthwiseConv((3, 3), (2, 2), (1, 1), "same", 1, 0.05, 7)
        packed = qops.PackDepthwise()(K.constant(wd, dtype="int8"))
        vectors = qops.EpilogueVectors(0.05)(K.constant(np.full(4, 0.01, np.float32)))
    else:
        w, scale, bias = weights(rng, (3, 3, 4, 6))
        op = qops.QuantizedConv(2, 6, (3, 3), (2, 2), (1, 1), "valid", 0.05, 7)
        packed = qops.PackInt8()(K.constant(w, dtype="int8"))
        vectors = qops.EpilogueVectors(0.05)(K.constant(scale), K.constant(bias))
    x = K.placeholder(shape=(None, None, None, 4))
    f = K.function([x], [op(x, packed, vectors)])
    for h, w_ in ((9, 7), (5, 11), (9, 7), (3, 3)):
        xv = rng.standard_normal((2, h, w_, 4)).astype(np.float32)
        got = f([xv])[0]
        if depthwise:
            want_hw = (-(-h // 2), -(-w_ // 2))
        else:
            want_hw = ((h - 3) // 2 + 1, (w_ - 3) // 2 + 1)
        assert got.shape == (2,) + want_hw + (4 if depthwise else 6,)
        if not depthwise:
            want = ref_conv(xv, w, scale, bias, 0.05, 7, "linear", (2, 2), (1, 1), "valid")
            assert same_bits(got, want)
    if not depthwise:
        for _ in range(2):
            with pytest.raises(ValueError, match="larger than the input"):
                f([np.zeros((1, 2, 5, 4), np.float32)])


def test_remembered_runs_follow_the_arrays_and_are_not_kept_in_copies(rng):
    # an op remembers its prepared call per input shape and operand arrays:
    # new arrays (new weights) are not served the old call, copies of the op
    # (``_with``) and pickles start without them
    import pickle

    from cyback.kernels import qgemm
    w, scale, bias = weights(rng, (12, 5))
    op = qops.QuantizedDense(5, 0.05, 7, "relu")
    x = rng.standard_normal((3, 12)).astype(np.float32)
    packed = qgemm.pack_weights(w)
    vectors = qgemm.epilogue_vectors(0.05, scale, bias)
    first = op.compute(x, packed, vectors)[0]
    assert "_runs" in vars(op)
    assert same_bits(op.compute(x, packed, vectors)[0], first)
    assert same_bits(first, ref_dense(x, w, scale, bias, 0.05, 7, "relu"))
    w2, scale2, bias2 = weights(rng, (12, 5))
    got = op.compute(x, qgemm.pack_weights(w2), qgemm.epilogue_vectors(0.05, scale2, bias2))[0]
    assert same_bits(got, ref_dense(x, w2, scale2, bias2, 0.05, 7, "relu"))
    assert "_runs" not in vars(op._with(activation="linear"))
    assert "_runs" not in vars(pickle.loads(pickle.dumps(op)))
    assert same_bits(pickle.loads(pickle.dumps(op)).compute(x, packed, vectors)[0], first)


def test_a_function_pickles_after_its_int8_ops_ran(rng):
    # an op the plan runs as built is the graph's own: once it ran it holds
    # prepared kernel calls, which the function's pickle leaves out
    import pickle
    w, scale, bias = weights(rng, (10, 6))
    x = K.placeholder(shape=(None, 10))
    f = K.function([x], [dense_graph(x, K.variable(w, dtype="int8"), K.variable(scale),
                                     K.variable(bias), 0.05, 3, "relu")])
    xv = rng.standard_normal((4, 10)).astype(np.float32)
    want = f([xv])[0]
    g = pickle.loads(pickle.dumps(f))
    assert same_bits(g([xv])[0], want) and same_bits(f([xv])[0], want)
