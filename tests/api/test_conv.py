"""conv1d/2d/3d, their transposes, depthwise and separable convolutions:
values against direct-loop NumPy references, shapes, gradients and errors."""
import numpy as np
import pytest

import cyback as K

from gradcheck import check_grads

RS = np.random.RandomState(7)


def kc(a, dtype=None):
    """A constant keeping the array's dtype (K.constant would take floatx)."""
    return K.constant(a, dtype=dtype or np.asarray(a).dtype.name)


def kv(a, dtype=None):
    return K.variable(a, dtype=dtype or np.asarray(a).dtype.name)


def rand(*shape, dtype="float64"):
    return RS.uniform(-1, 1, size=shape).astype(dtype)


@pytest.fixture(params=[True, False], ids=["phases", "col2im"])
def phase_split(request):
    """Strided transposes and input gradients through the kernels' phase
    split or through col2im (cyback.kernels.conv)."""
    from cyback.kernels import conv
    old = conv._TUNE["phase_split"]
    conv._TUNE["phase_split"] = request.param
    try:
        yield request.param
    finally:
        conv._TUNE["phase_split"] = old


# ------------------------------------------------------------------ references

def ref_pads(n, k, s, d, padding):
    span = (k - 1) * d + 1
    if padding == "valid":
        return (0, 0)
    if padding == "causal":
        return (span - 1, 0)
    out = -(-n // s)
    total = max((out - 1) * s + span - n, 0)
    return (total // 2, total - total // 2)


def _to_last(a, cl):
    return a if cl else np.moveaxis(a, 1, -1)


def _from_last(a, cl):
    return a if cl else np.moveaxis(a, -1, 1)


def ref_conv(x, k, strides, dil, padding, cl=True, depthwise=False):
    """Direct loops over output positions and kernel taps."""
    x = _to_last(np.asarray(x, np.float64), cl)
    k = np.asarray(k, np.float64)
    r = x.ndim - 2
    pads = [ref_pads(x.shape[1 + i], k.shape[i], strides[i], dil[i], padding) for i in range(r)]
    xp = np.pad(x, [(0, 0)] + pads + [(0, 0)])
    outs = tuple((xp.shape[1 + i] - (k.shape[i] - 1) * dil[i] - 1) // strides[i] + 1
                 for i in range(r))
    C = x.shape[-1]
    F = C * k.shape[-1] if depthwise else k.shape[-1]
    y = np.zeros((x.shape[0],) + outs + (F,))
    for n in range(x.shape[0]):
        for pos in np.ndindex(*outs):
            acc = np.zeros(F)
            for kp in np.ndindex(*k.shape[:r]):
                idx = tuple(pos[i] * strides[i] + kp[i] * dil[i] for i in range(r))
                v = xp[(n,) + idx]
                if depthwise:
                    acc += (v[:, None] * k[kp]).reshape(-1)
                else:
                    acc += v @ k[kp]
            y[(n,) + pos] = acc
    return _from_last(y, cl)


def ref_conv_transpose(x, k, out_shape, strides, dil, padding, cl=True):
    """Scatter each input position through the kernel, then crop the pads
    the matching forward convolution would have added."""
    x = _to_last(np.asarray(x, np.float64), cl)
    k = np.asarray(k, np.float64)
    r = x.ndim - 2
    out_shape = tuple(out_shape) if cl else (out_shape[0],) + tuple(out_shape[2:]) + \
        (out_shape[1],)
    sizes = out_shape[1:-1]
    pads = [ref_pads(sizes[i], k.shape[i], strides[i], dil[i], padding) for i in range(r)]
    big = [sizes[i] + pads[i][0] + pads[i][1] + (k.shape[i] - 1) * dil[i] + strides[i]
           for i in range(r)]
    y = np.zeros((x.shape[0],) + tuple(big) + (k.shape[-2],))
    for n in range(x.shape[0]):
        for pos in np.ndindex(*x.shape[1:-1]):
            for kp in np.ndindex(*k.shape[:r]):
                idx = tuple(pos[i] * strides[i] + kp[i] * dil[i] for i in range(r))
                y[(n,) + idx] += k[kp] @ x[(n,) + pos]
    crop = (slice(None),) + tuple(slice(pads[i][0], pads[i][0] + sizes[i]) for i in range(r))
    return _from_last(y[crop], cl)


def cf(a):
    """channels_last array -> channels_first."""
    return np.ascontiguousarray(np.moveaxis(a, -1, 1))


# ------------------------------------------------------------------ forward values

CASES_2D = [
    # x spatial, kernel, strides, dilation, padding
    ((5, 6), (3, 3), (1, 1), (1, 1), "valid"),
    ((5, 6), (3, 2), (2, 2), (1, 1), "same"),
    ((7, 5), (2, 3), (3, 2), (1, 1), "valid"),
    ((7, 6), (3, 3), (1, 1), (2, 2), "same"),
    ((7, 7), (2, 2), (1, 1), (3, 2), "valid"),
    ((4, 4), (5, 5), (1, 1), (1, 1), "same"),  # kernel larger than the input
    ((1, 1), (1, 1), (1, 1), (1, 1), "valid"),
    ((6, 5), (1, 1), (2, 1), (1, 1), "same"),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", CASES_2D)
def test_conv2d_values(case, fmt, dtype):
    sp, ks, st, dl, pad = case
    cl = fmt == "channels_last"
    x = rand(2, *sp, 3, dtype=dtype)
    k = rand(*ks, 3, 4, dtype=dtype)
    want = ref_conv(x, k, st, dl, pad)
    xin = x if cl else cf(x)
    y = K.eval(K.conv2d(kv(xin, dtype=dtype), kv(k, dtype=dtype), st, pad,
                        fmt, dl))
    assert y.dtype == dtype
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(y, want if cl else cf(want), rtol=tol, atol=tol)


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("pad", ["valid", "same", "causal"])
@pytest.mark.parametrize("st,dl", [(1, 1), (2, 1), (1, 3), (3, 1)])
def test_conv1d_values(fmt, pad, st, dl):
    cl = fmt == "channels_last"
    x = rand(2, 9, 3)
    k = rand(3, 3, 2)
    want = ref_conv(x, k, (st,), (dl,), pad)
    xin = x if cl else cf(x)
    y = K.eval(K.conv1d(kc(xin), kc(k), strides=st, padding=pad,
                        data_format=fmt, dilation_rate=dl))
    np.testing.assert_allclose(y, want if cl else cf(want), rtol=1e-12, atol=1e-12)


def test_conv1d_causal_never_sees_the_future():
    x = rand(1, 8, 1)
    k = rand(3, 1, 1)
    y = K.eval(K.conv1d(kc(x), kc(k), padding="causal", dilation_rate=2))
    x2 = x.copy()
    x2[0, 5:] += 10
    y2 = K.eval(K.conv1d(kc(x2), kc(k), padding="causal", dilation_rate=2))
    np.testing.assert_allclose(y[0, :5], y2[0, :5])
    assert not np.allclose(y[0, 5:], y2[0, 5:])


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", [((4, 5, 3), (2, 3, 2), (1, 1, 1), (1, 1, 1), "valid"),
                                  ((4, 5, 3), (3, 2, 2), (2, 1, 2), (1, 1, 1), "same"),
                                  ((5, 4, 5), (2, 2, 2), (1, 1, 1), (2, 1, 2), "same")])
def test_conv3d_values(case, fmt):
    sp, ks, st, dl, pad = case
    cl = fmt == "channels_last"
    x = rand(2, *sp, 2, dtype="float32")
    k = rand(*ks, 2, 3, dtype="float32")
    want = ref_conv(x, k, st, dl, pad)
    xin = x if cl else cf(x)
    y = K.eval(K.conv3d(kc(xin), kv(k), st, pad, fmt, dl))
    np.testing.assert_allclose(y, want if cl else cf(want), rtol=1e-5, atol=1e-5)


def test_defaults_and_int_arguments():
    K.set_image_data_format("channels_first")
    x = rand(1, 2, 6, 6)
    k = rand(3, 3, 2, 2)
    y = K.eval(K.conv2d(kc(x), kc(k), strides=2, dilation_rate=1))
    want = cf(ref_conv(np.moveaxis(x, 1, -1), k, (2, 2), (1, 1), "valid"))
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    y = K.eval(K.conv2d(kc(x), kc(k), padding="SAME"))
    assert y.shape == (1, 2, 6, 6)


def test_float16_computes_in_float32():
    x = rand(2, 5, 5, 3)
    k = rand(3, 3, 3, 2)
    y = K.eval(K.conv2d(kc(x, dtype="float16"), kc(k, dtype="float16"),
                        padding="same"))
    assert y.dtype == np.float16
    want = ref_conv(x.astype(np.float16), k.astype(np.float16), (1, 1), (1, 1), "same")
    np.testing.assert_allclose(y, want, rtol=1e-2, atol=1e-2)
    d = K.eval(K.depthwise_conv2d(kc(x, dtype="float16"),
                                  kc(k[:, :, :, :1], dtype="float16")))
    assert d.dtype == np.float16 and d.shape == (2, 3, 3, 3)


def test_numpy_kernel_takes_the_input_dtype():
    x = kv(rand(1, 4, 4, 2), dtype="float32")
    y = K.conv2d(x, rand(2, 2, 2, 3))  # a float64 NumPy kernel
    assert y.dtype == "float32"
    assert K.eval(y).dtype == np.float32


def test_none_batch_and_spatial_through_function():
    k = rand(3, 3, 2, 4)
    xp = K.placeholder((None, None, None, 2), dtype="float64")
    y = K.conv2d(xp, kc(k), strides=(2, 1), padding="same")
    assert K.int_shape(y) == (None, None, None, 4)
    xp2 = K.placeholder((None, 7, 5, 2), dtype="float64")
    y2 = K.conv2d(xp2, kc(k), strides=(2, 1), padding="same")
    assert K.int_shape(y2) == (None, 4, 5, 4)
    f = K.function([xp, xp2], [y, y2])
    for n in (1, 3):
        x = rand(n, 7, 5, 2)
        a, b = f([x, x])
        want = ref_conv(x, k, (2, 1), (1, 1), "same")
        np.testing.assert_allclose(a, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(b, want, rtol=1e-12, atol=1e-12)


def test_empty_batch_and_non_contiguous_input():
    k = rand(2, 2, 3, 2)
    xp = K.placeholder((None, 4, 4, 3), dtype="float64")
    f = K.function([xp], [K.conv2d(xp, kc(k), padding="same")])
    assert f([np.zeros((0, 4, 4, 3))])[0].shape == (0, 4, 4, 2)
    base = rand(2, 3, 4, 4)
    x = base.transpose(0, 2, 3, 1)  # channels_last view, not contiguous
    np.testing.assert_allclose(f([x])[0], ref_conv(x, k, (1, 1), (1, 1), "same"),
                               rtol=1e-12, atol=1e-12)
    # Constants are read-only arrays; strided ones too.
    y = K.eval(K.conv2d(kc(x), kc(k)))
    np.testing.assert_allclose(y, ref_conv(x, k, (1, 1), (1, 1), "valid"), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ transposes

TRANSPOSE_CASES = [
    # x spatial, kernel, strides, padding, output spatial
    ((3, 3), (3, 3), (2, 2), "valid", (7, 7)),
    ((3, 3), (3, 3), (2, 2), "valid", (8, 8)),
    ((3, 4), (3, 2), (2, 2), "same", (6, 8)),
    ((3, 4), (3, 3), (2, 2), "same", (5, 7)),
    ((4, 4), (2, 2), (1, 1), "valid", (5, 5)),
    ((4, 4), (3, 3), (1, 1), "same", (4, 4)),
    ((2, 2), (1, 1), (3, 3), "valid", (4, 4)),
]


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_conv2d_transpose_values(phase_split, case, fmt):
    sp, ks, st, pad, osp = case
    cl = fmt == "channels_last"
    x = rand(2, *sp, 3)
    k = rand(*ks, 4, 3)  # (kh, kw, out_channels, in_channels)
    oshape = (2,) + osp + (4,)
    want = ref_conv_transpose(x, k, oshape, st, (1, 1), pad)
    xin = x if cl else cf(x)
    os_fmt = oshape if cl else (2, 4) + osp
    y = K.eval(K.conv2d_transpose(kv(xin), kv(k), os_fmt, st, pad, fmt))
    np.testing.assert_allclose(y, want if cl else cf(want), rtol=1e-12, atol=1e-12)


def test_conv2d_transpose_is_the_adjoint_of_conv2d():
    x = rand(2, 7, 6, 3)
    k = rand(3, 2, 3, 4)
    for pad, st in (("valid", (2, 2)), ("same", (2, 3)), ("same", (1, 1))):
        y = K.eval(K.conv2d(kc(x), kc(k), st, pad))
        g = rand(*y.shape)
        xt = K.eval(K.conv2d_transpose(kc(g), kc(k), x.shape, st, pad))
        assert xt.shape == x.shape
        np.testing.assert_allclose(np.sum(y * g), np.sum(x * xt), rtol=1e-10)


def test_conv2d_transpose_dilation():
    x = rand(1, 4, 4, 2)
    k = rand(3, 3, 3, 2)
    for pad, osp in (("valid", (8, 8)), ("same", (4, 4))):
        want = ref_conv_transpose(x, k, (1,) + osp + (3,), (1, 1), (2, 2), pad)
        y = K.eval(K.conv2d_transpose(kc(x), kc(k), (1,) + osp + (3,),
                                      padding=pad, dilation_rate=(2, 2)))
        np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_conv2d_transpose_symbolic_batch():
    k = rand(3, 3, 4, 3)
    xp = K.placeholder((None, 3, 3, 3), dtype="float64")
    for batch in (None, K.shape(xp)[0]):
        y = K.conv2d_transpose(xp, kc(k), (batch, 7, 7, 4), (2, 2))
        assert K.int_shape(y) == (None, 7, 7, 4)
        f = K.function([xp], [y])
        x = rand(3, 3, 3, 3)
        np.testing.assert_allclose(
            f([x])[0], ref_conv_transpose(x, k, (3, 7, 7, 4), (2, 2), (1, 1), "valid"),
            rtol=1e-12, atol=1e-12)
    # Keras's Conv2DTranspose: sizes from K.shape(inputs) arithmetic
    shp = K.shape(xp)
    y = K.conv2d_transpose(xp, kc(k), (shp[0], shp[1] * 2 + 1, shp[2] * 2 + 1, 4),
                           (2, 2), "valid", "channels_last")
    assert K.int_shape(y) == (None, 7, 7, 4)
    # as a 1-D int tensor
    y = K.conv2d_transpose(xp, kc(k), K.stack([shp[0], 7, 7, 4]), (2, 2))
    assert K.function([xp], [y])([rand(2, 3, 3, 3)])[0].shape == (2, 7, 7, 4)


def test_conv2d_transpose_unknown_spatial_sizes(one_thread):
    # Conv2DTranspose on (None, None, None, C) inputs: every size symbolic.
    k = rand(3, 3, 4, 3)
    xp = K.placeholder((None, None, None, 3), dtype="float64")
    s = K.shape(xp)
    y = K.conv2d_transpose(xp, kc(k), (s[0], s[1] * 2, s[2] * 2, 4), (2, 2), "same")
    assert K.int_shape(y) == (None, None, None, 4)
    gx = K.gradients(K.sum(y * y), [xp])[0]
    f = K.function([xp], [y, gx])
    x = rand(2, 3, 5, 3)
    a, b = f([x])
    want = ref_conv_transpose(x, k, (2, 6, 10, 4), (2, 2), (1, 1), "same")
    np.testing.assert_allclose(a, want, rtol=1e-12, atol=1e-12)
    assert b.shape == x.shape


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_conv3d_transpose_values(fmt):
    cl = fmt == "channels_last"
    x = rand(1, 2, 3, 2, 2)
    k = rand(2, 3, 2, 3, 2)
    for pad, st, osp in (("valid", (2, 1, 2), (4, 5, 4)), ("same", (2, 2, 1), (4, 6, 2))):
        oshape = (1,) + osp + (3,)
        want = ref_conv_transpose(x, k, oshape, st, (1, 1, 1), pad)
        y = K.eval(K.conv3d_transpose(kc(x if cl else cf(x)), kc(k),
                                      oshape if cl else (1, 3) + osp, st, pad, fmt))
        np.testing.assert_allclose(y, want if cl else cf(want), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ depthwise, separable

@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", [((5, 6), (3, 3), (1, 1), (1, 1), "valid"),
                                  ((5, 6), (2, 3), (2, 2), (1, 1), "same"),
                                  ((7, 6), (3, 2), (1, 1), (2, 2), "same")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_depthwise_conv2d_values(case, fmt, dtype):
    sp, ks, st, dl, pad = case
    cl = fmt == "channels_last"
    x = rand(2, *sp, 3, dtype=dtype)
    k = rand(*ks, 3, 2, dtype=dtype)
    want = ref_conv(x, k, st, dl, pad, depthwise=True)
    y = K.eval(K.depthwise_conv2d(kv(x if cl else cf(x), dtype=dtype),
                                  kc(k), st, pad, fmt, dl))
    assert y.dtype == dtype
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(y, want if cl else cf(want), rtol=tol, atol=tol)


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_separable_conv2d_values(fmt):
    cl = fmt == "channels_last"
    x = rand(2, 6, 5, 3)
    dk = rand(3, 3, 3, 2)
    pk = rand(1, 1, 6, 4)
    for st, dl, pad in (((1, 1), (1, 1), "valid"), ((2, 2), (1, 1), "same"),
                        ((1, 1), (2, 2), "same")):
        want = ref_conv(ref_conv(x, dk, st, dl, pad, depthwise=True), pk, (1, 1), (1, 1),
                        "valid")
        y = K.eval(K.separable_conv2d(kc(x if cl else cf(x)), kc(dk),
                                      kc(pk), st, pad, fmt, dl))
        np.testing.assert_allclose(y, want if cl else cf(want), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_separable_conv1d_values(fmt):
    cl = fmt == "channels_last"
    x = rand(2, 9, 3)
    dk = rand(3, 3, 2)
    pk = rand(1, 6, 4)
    for st, dl, pad in ((1, 1, "valid"), (2, 1, "same"), (1, 2, "causal")):
        want = ref_conv(ref_conv(x, dk, (st,), (dl,), pad, depthwise=True), pk, (1,), (1,),
                        "valid")
        y = K.eval(K.separable_conv1d(kc(x if cl else cf(x)), kv(dk),
                                      kv(pk), st, pad, fmt, dl))
        np.testing.assert_allclose(y, want if cl else cf(want), rtol=1e-12, atol=1e-12)


def test_depthwise_none_batch():
    k = rand(3, 3, 2, 3)
    xp = K.placeholder((None, 5, 5, 2), dtype="float64")
    y = K.depthwise_conv2d(xp, kc(k), (2, 2), "same")
    assert K.int_shape(y) == (None, 3, 3, 6)
    x = rand(1, 5, 5, 2)
    np.testing.assert_allclose(K.function([xp], [y])([x])[0],
                               ref_conv(x, k, (2, 2), (1, 1), "same", depthwise=True),
                               rtol=1e-12, atol=1e-12)
    kvar = kv(k)
    y = K.depthwise_conv2d(xp, kvar, (2, 2), "same")
    f = K.function([xp], [y] + K.gradients(K.sum(y), [xp, kvar]))
    shapes = [a.shape for a in f([np.zeros((0, 5, 5, 2))])]
    assert shapes == [(0, 3, 3, 6), (0, 5, 5, 2), (3, 3, 2, 3)]


# ------------------------------------------------------------------ gradients

def test_conv2d_grads(one_thread, phase_split):
    x, k = rand(2, 5, 4, 2), rand(3, 2, 2, 3)
    for st, dl, pad, fmt in (((1, 1), (1, 1), "valid", "channels_last"),
                             ((2, 2), (1, 1), "same", "channels_first"),
                             ((1, 1), (2, 1), "same", "channels_last")):
        xin = x if fmt == "channels_last" else cf(x)
        check_grads(lambda a, b: K.conv2d(a, b, st, pad, fmt, dl), xin, k)


def test_conv1d_and_conv3d_grads(one_thread):
    check_grads(lambda a, b: K.conv1d(a, b, 1, "causal", dilation_rate=2), rand(2, 7, 2),
                rand(3, 2, 2))
    check_grads(lambda a, b: K.conv1d(a, b, 2, "same", "channels_first"), rand(1, 2, 7),
                rand(2, 2, 3))
    check_grads(lambda a, b: K.conv3d(a, b, (2, 1, 1), "same"), rand(1, 3, 3, 2, 2),
                rand(2, 2, 1, 2, 2))


def test_transpose_grads(one_thread, phase_split):
    check_grads(lambda a, b: K.conv2d_transpose(a, b, (2, 7, 6, 2), (2, 2), "same"),
                rand(2, 4, 3, 3), rand(3, 2, 2, 3))
    check_grads(lambda a, b: K.conv2d_transpose(a, b, (1, 2, 5, 5), (2, 2), "valid",
                                                "channels_first"),
                rand(1, 2, 2, 2), rand(2, 2, 2, 2))
    check_grads(lambda a, b: K.conv3d_transpose(a, b, (1, 3, 3, 4, 2), (1, 1, 2), "same"),
                rand(1, 3, 3, 2, 2), rand(2, 1, 2, 2, 2))
    check_grads(lambda a, b: K.conv2d_transpose(a, b, (2, 8, 7, 3), (3, 2), "same"),
                rand(2, 3, 4, 2), rand(2, 3, 3, 2))
    # the input gradient of a strided conv
    check_grads(lambda a, b: K.conv2d(a, b, (2, 3), "same"), rand(2, 7, 8, 2),
                rand(3, 3, 2, 3))


def test_depthwise_and_separable_grads(one_thread):
    check_grads(lambda a, b: K.depthwise_conv2d(a, b, (2, 1), "same"), rand(2, 5, 4, 2),
                rand(3, 2, 2, 2))
    check_grads(lambda a, b: K.depthwise_conv2d(a, b, (1, 1), "valid", "channels_first",
                                                (2, 1)),
                rand(1, 2, 6, 4), rand(2, 2, 2, 1))
    check_grads(lambda a, b, c: K.separable_conv2d(a, b, c, (1, 1), "same"),
                rand(1, 4, 4, 2), rand(2, 2, 2, 2), rand(1, 1, 4, 3))
    check_grads(lambda a, b, c: K.separable_conv1d(a, b, c, 1, "causal", "channels_first", 2),
                rand(2, 2, 6), rand(2, 2, 1), rand(1, 2, 2))


def test_second_derivatives(one_thread):
    def conv_sq(op):
        def build(a, b):
            y = op(a, b)
            return K.concatenate([K.flatten(g) for g in K.gradients(K.sum(y * y), [a, b])])
        return build
    x, k = rand(1, 4, 4, 2), rand(2, 2, 2, 2)
    check_grads(conv_sq(lambda a, b: K.conv2d(a, b, (2, 1), "same")), x, k, rtol=1e-4)
    check_grads(conv_sq(lambda a, b: K.depthwise_conv2d(a, b, (1, 1), "same")), x, k,
                rtol=1e-4)
    check_grads(conv_sq(lambda a, b: K.conv2d_transpose(a, b, (1, 8, 8, 2), (2, 2), "same")),
                x, k, rtol=1e-4)


# ------------------------------------------------------------------ errors

def _err(exc, match, fn, *args, **kw):
    with pytest.raises(exc, match=match):
        fn(*args, **kw)


def test_errors():
    x = K.placeholder((None, 5, 5, 3))
    k = K.variable(rand(3, 3, 3, 4))
    _err(ValueError, "conv2d: x must be 4-D", K.conv2d, K.placeholder((None, 5, 3)), k)
    _err(ValueError, "conv2d: kernel must be 4-D", K.conv2d, x, K.variable(rand(3, 3, 4)))
    _err(ValueError, "conv2d: .*expects 2 input channels.*has 3", K.conv2d, x,
         K.variable(rand(3, 3, 2, 4)))
    _err(ValueError, "conv2d: .*expects 3 input channels.*has 5", K.conv2d, x, k,
         data_format="channels_first")
    _err(ValueError, "conv2d: padding must be one of", K.conv2d, x, k, padding="full")
    _err(ValueError, "conv2d: padding must be one of", K.conv2d, x, k, padding="causal")
    _err(ValueError, "conv2d: data_format", K.conv2d, x, k, data_format="NHWC")
    _err(ValueError, "conv2d: the kernel window .* larger", K.conv2d,
         K.placeholder((None, 2, 5, 3)), k)
    _err(ValueError, "conv2d: the dilated kernel window .* larger", K.conv2d, x, k,
         dilation_rate=3)
    _err(ValueError, "conv2d: strides must be positive", K.conv2d, x, k, strides=(0, 1))
    _err(ValueError, "conv2d: strides must have 2 entries", K.conv2d, x, k, strides=(1, 1, 1))
    _err(TypeError, "conv2d: strides must hold ints", K.conv2d, x, k, strides=(1.5, 1))
    _err(ValueError, "conv2d: dilation_rate must be positive", K.conv2d, x, k,
         dilation_rate=(1, -1))
    _err(ValueError, "conv2d: strides > 1 cannot be combined with dilation_rate > 1",
         K.conv2d, x, k, strides=2, dilation_rate=2)
    _err(TypeError, "conv2d: x must be a float tensor", K.conv2d,
         K.placeholder((None, 5, 5, 3), dtype="int32"), k)
    _err(TypeError, "conv2d: x and kernel must share one dtype", K.conv2d,
         K.placeholder((None, 5, 5, 3), dtype="float64"), k)
    _err(ValueError, "conv1d: x must be 3-D", K.conv1d, x, k)
    _err(ValueError, "conv3d: x must be 5-D", K.conv3d, x, k)


def test_run_time_errors_name_the_function():
    xp = K.placeholder((None, None, None, 3))
    f = K.function([xp], [K.conv2d(xp, K.variable(rand(3, 3, 3, 4)))])
    _err(ValueError, "conv2d: the kernel window", f, [np.zeros((1, 2, 5, 3), "float32")])
    xq = K.placeholder((None, None, None, None))
    f = K.function([xq], [K.conv2d(xq, K.variable(rand(3, 3, 3, 4)))])
    _err(ValueError, "conv2d: the kernel .* expects 3 input channels but the input .* has 2",
         f, [np.zeros((1, 4, 4, 2), "float32")])


def test_transpose_errors():
    x = K.placeholder((None, 3, 3, 3))
    k = K.variable(rand(3, 3, 4, 3))
    ct = K.conv2d_transpose
    _err(ValueError, "output_shape must have 4 entries", ct, x, k, (7, 7, 4), (2, 2))
    _err(ValueError, "only the batch entry of output_shape may be None", ct, x, k,
         (None, None, 7, 4), (2, 2))
    _err(ValueError, "output_shape .* has 5 channels", ct, x, k, (2, 7, 7, 5), (2, 2))
    _err(ValueError, "takes 3 input channels .* has 2", ct, K.placeholder((None, 3, 3, 2)), k,
         (2, 7, 7, 4), (2, 2))
    _err(ValueError, "conv2d_transpose: the input has shape", ct, x, k, (2, 12, 7, 4), (2, 2))
    _err(ValueError, "negative size", ct, x, k, (2, -7, 7, 4), (2, 2))
    _err(ValueError, "conv2d_transpose: padding", ct, x, k, (2, 7, 7, 4), (2, 2), "causal")
    _err(ValueError, "strides > 1 cannot be combined", ct, x, k, (2, 7, 7, 4), (2, 2),
         dilation_rate=(2, 2))
    _err(ValueError, "conv3d_transpose: x must be 5-D", K.conv3d_transpose, x, k,
         (2, 7, 7, 4, 4))
    _err(TypeError, "output_shape must be a tuple", ct, x, k, 7)
    # batch mismatch found at run time
    xp = K.placeholder((None, 3, 3, 3))
    f = K.function([xp], [ct(xp, k, (5, 7, 7, 4), (2, 2))])
    with pytest.raises(ValueError, match="conv2d_transpose"):
        f([np.zeros((2, 3, 3, 3), "float32")])


def test_depthwise_separable_errors():
    x = K.placeholder((None, 5, 5, 3))
    dk = K.variable(rand(3, 3, 3, 2))
    _err(ValueError, "depthwise_conv2d: .*expects 2 input channels", K.depthwise_conv2d, x,
         K.variable(rand(3, 3, 2, 2)))
    _err(ValueError, "depthwise_conv2d: depthwise_kernel must be 4-D", K.depthwise_conv2d, x,
         K.variable(rand(3, 3, 2)))
    _err(ValueError, "depthwise_conv2d: padding", K.depthwise_conv2d, x, dk, padding="causal")
    _err(ValueError, "depthwise_conv2d: strides > 1 cannot", K.depthwise_conv2d, x, dk, 2,
         dilation_rate=2)
    _err(ValueError, "separable_conv2d: pointwise_kernel must have shape \\(1, 1, 6, filters\\)",
         K.separable_conv2d, x, dk, K.variable(rand(1, 1, 5, 4)))
    _err(ValueError, "separable_conv2d: pointwise_kernel must have shape", K.separable_conv2d,
         x, dk, K.variable(rand(2, 1, 6, 4)))
    _err(ValueError, "separable_conv1d: pointwise_kernel must be 3-D", K.separable_conv1d,
         K.placeholder((None, 5, 3)), K.variable(rand(3, 3, 2)), K.variable(rand(1, 1, 6, 4)))
    _err(ValueError, "separable_conv2d: data_format", K.separable_conv2d, x, dk,
         K.variable(rand(1, 1, 6, 4)), data_format="nchw")


def test_prepared_calls_are_not_pickled_and_are_rebuilt():
    import pickle
    rng = np.random.default_rng(5)
    k = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)
    x = rng.standard_normal((2, 6, 6, 4)).astype(np.float32)
    xp = K.placeholder((None, 6, 6, 4))
    f = K.function([xp], [K.relu(K.conv2d(xp, K.variable(k), padding="same"))])
    want = f([x])[0]
    g = pickle.loads(pickle.dumps(f))
    np.testing.assert_array_equal(g([x])[0], want)
    np.testing.assert_array_equal(g([x[:1]])[0], want[:1])     # another batch size


def test_last_prepared_call_serves_only_its_own_arguments():
    # a fused step calls its conv with the same kinds of arguments each time:
    # Geometry.forward_again reuses the last prepared call for those only
    # (the packed kernel, which would take these shapes, is off: its calls
    # are memoised apart, tests/kernels/test_conv_packed.py)
    from cyback.kernels import conv as conv_kernels
    rng = np.random.default_rng(6)
    k = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    x = rng.standard_normal((2, 6, 6, 4)).astype(np.float32)
    xp = K.placeholder((None, 6, 6, 4))
    f = K.function([xp], [K.relu(K.bias_add(K.conv2d(xp, K.variable(k), padding="same"),
                                            K.variable(b)))])
    op, = f.plan_ops(0)
    geom = op.base.geom
    geom._last = None
    assert geom.forward_again(x, k, b, "relu") is None
    saved = conv_kernels._TUNE["packed"]
    conv_kernels._TUNE["packed"] = False
    try:
        geom._packed_calls.clear()
        want = f([x])[0]
    finally:
        conv_kernels._TUNE["packed"] = saved
    np.testing.assert_array_equal(geom.forward_again(x, k, b, "relu"), want)
    for args in [(x[:1], k, b, "relu"), (x.astype(np.float64), k.astype(np.float64), b, "relu"),
                 (x, k, b, None), (x, k, None, "relu"), (x, k, b, "relu", want)]:
        assert geom.forward_again(*args) is None
    # another batch size, on the same path as want (the packed kernel sums in
    # another order than BLAS's im2col product, which differs by BLAS build)
    conv_kernels._TUNE["packed"] = False
    try:
        np.testing.assert_array_equal(f([x[:1]])[0], want[:1])
        np.testing.assert_array_equal(f([x])[0], want)
    finally:
        conv_kernels._TUNE["packed"] = saved
