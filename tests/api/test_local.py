"""local_conv1d and local_conv2d (unshared weights, Keras 2.3.1 kernel layout
(positions, feature_dim, filters)): values, shapes, gradients and errors."""
import numpy as np
import pytest

import cyback as K

from gradcheck import check_grads

RS = np.random.RandomState(5)


def rand(*shape, dtype="float64"):
    return RS.uniform(-1, 1, size=shape).astype(dtype)


def kc(a, dtype=None):
    return K.constant(a, dtype=dtype or a.dtype.name)


def ref_local(x, k, ks, st, cl):
    """Keras's definition: at each output position, the input patch (sliced
    in the input's own layout and flattened) times that position's matrix."""
    r = x.ndim - 2
    sizes = x.shape[1:-1] if cl else x.shape[2:]
    outs = tuple((n - kk) // s + 1 for n, kk, s in zip(sizes, ks, st))
    F = k.shape[-1]
    y = np.zeros((x.shape[0],) + outs + (F,))
    for p, pos in enumerate(np.ndindex(*outs)):
        sl = tuple(slice(pos[i] * st[i], pos[i] * st[i] + ks[i]) for i in range(r))
        patch = x[(slice(None),) + sl + (slice(None),)] if cl else \
            x[(slice(None), slice(None)) + sl]
        y[(slice(None),) + pos] = patch.reshape(x.shape[0], -1) @ k[p]
    return y if cl else np.moveaxis(y, -1, 1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", [(7, 3, 1), (8, 3, 2), (5, 1, 1), (4, 4, 1), (9, 2, 3)])
def test_local_conv1d_values(case, fmt, dtype):
    n, kk, s = case
    cl = fmt == "channels_last"
    out = (n - kk) // s + 1
    x = rand(2, n, 3, dtype=dtype) if cl else rand(2, 3, n, dtype=dtype)
    k = rand(out, kk * 3, 4, dtype=dtype)
    y = K.eval(K.local_conv1d(K.variable(x, dtype=dtype), kc(k), (kk,), (s,), fmt))
    assert y.dtype == dtype
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(y, ref_local(x, k, (kk,), (s,), cl), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", [((5, 6), (3, 2), (1, 1)), ((7, 5), (2, 2), (2, 3)),
                                  ((3, 3), (3, 3), (1, 1)), ((4, 1), (1, 1), (2, 1))])
def test_local_conv2d_values(case, fmt, dtype):
    sp, ks, st = case
    cl = fmt == "channels_last"
    out = tuple((n - kk) // s + 1 for n, kk, s in zip(sp, ks, st))
    x = rand(2, *sp, 2, dtype=dtype) if cl else rand(2, 2, *sp, dtype=dtype)
    k = rand(out[0] * out[1], ks[0] * ks[1] * 2, 3, dtype=dtype)
    y = K.eval(K.local_conv2d(kc(x), K.variable(k, dtype=dtype), ks, st, out, fmt))
    assert y.dtype == dtype
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(y, ref_local(x, k, ks, st, cl), rtol=tol, atol=tol)


def test_int_arguments_default_format_and_float16():
    K.set_image_data_format("channels_first")
    x = rand(1, 2, 5, 5)
    k = rand(4, 2 * 2 * 2, 3)
    y = K.eval(K.local_conv2d(kc(x), kc(k), 2, 2, (2, 2)))
    np.testing.assert_allclose(y, ref_local(x, k, (2, 2), (2, 2), False), rtol=1e-12)
    h = K.eval(K.local_conv1d(kc(x[:, :, 0], "float16"), kc(k[:2, :4], "float16"), 2, 2))
    assert h.dtype == np.float16 and h.shape == (1, 3, 2)


def test_none_batch_and_spatial():
    k = rand(6, 3 * 2, 4)
    xp = K.placeholder((None, 4, 8, 2), dtype="float64")
    y = K.local_conv2d(xp, kc(k), (1, 3), (2, 2), (2, 3))
    assert K.int_shape(y) == (None, 2, 3, 4)
    xq = K.placeholder((None, None, 2), dtype="float64")
    k1 = rand(3, 2 * 2, 4)
    z = K.local_conv1d(xq, kc(k1), (2,), (2,))
    assert K.int_shape(z) == (None, 3, 4)
    f = K.function([xp, xq], [y, z])
    for n in (1, 3):
        x = rand(n, 4, 8, 2)
        a, b = f([x, x[:, 0, :6]])
        np.testing.assert_allclose(a, ref_local(x, k, (1, 3), (2, 2), True), rtol=1e-12)
        np.testing.assert_allclose(b, ref_local(x[:, 0, :6], k1, (2,), (2,), True),
                                   rtol=1e-12)
    assert f([np.zeros((0, 4, 8, 2)), np.zeros((0, 6, 2))])[0].shape == (0, 2, 3, 4)


def test_non_contiguous_input():
    x = rand(2, 3, 6).transpose(0, 2, 1)  # (2, 6, 3) view
    k = rand(5, 2 * 3, 2)
    y = K.eval(K.local_conv1d(kc(x), kc(k), (2,), (1,)))
    np.testing.assert_allclose(y, ref_local(np.ascontiguousarray(x), k, (2,), (1,), True),
                               rtol=1e-12)


def test_grads(one_thread):
    check_grads(lambda a, b: K.local_conv1d(a, b, (2,), (2,)), rand(2, 7, 2), rand(3, 4, 2))
    check_grads(lambda a, b: K.local_conv1d(a, b, (3,), (1,), "channels_first"),
                rand(1, 2, 5), rand(3, 6, 2))
    check_grads(lambda a, b: K.local_conv2d(a, b, (2, 2), (1, 2), (2, 2)),
                rand(2, 3, 4, 2), rand(4, 8, 2))
    check_grads(lambda a, b: K.local_conv2d(a, b, (2, 1), (1, 1), (2, 3), "channels_first"),
                rand(1, 2, 3, 3), rand(6, 4, 2))


def test_second_derivatives(one_thread):
    def build(a, b):
        y = K.local_conv2d(a, b, (2, 2), (1, 1), (2, 2))
        return K.concatenate([K.flatten(g) for g in K.gradients(K.sum(y * y), [a, b])])
    check_grads(build, rand(1, 3, 3, 2), rand(4, 8, 2), rtol=1e-4)


def _err(exc, match, fn, *args, **kw):
    with pytest.raises(exc, match=match):
        fn(*args, **kw)


def test_errors():
    x = K.placeholder((None, 5, 5, 3))
    k = K.variable(rand(9, 12, 2))
    lc2 = K.local_conv2d
    _err(ValueError, "local_conv2d: inputs must be 4-D", lc2, K.placeholder((None, 5, 3)), k,
         (2, 2), (1, 1), (3, 3))
    _err(ValueError, "local_conv2d: kernel must be 3-D", lc2, x, K.variable(rand(9, 12)),
         (2, 2), (1, 1), (3, 3))
    _err(ValueError, "local_conv2d: the kernel .* has 9 output positions but output_shape",
         lc2, x, k, (2, 2), (1, 1), (4, 4))
    _err(ValueError, "local_conv2d: the input .* gives output positions \\(4, 4\\)", lc2, x,
         K.variable(rand(9, 12, 2)), (2, 2), (1, 1), (3, 3))
    _err(ValueError, "feature_dim = prod\\(kernel_size\\) \\* channels = 27", lc2, x, k,
         (3, 3), (1, 1), (3, 3))
    _err(ValueError, "local_conv2d: the kernel window .* larger", lc2, x,
         K.variable(rand(9, 36, 2)), (6, 2), (1, 1),
         (3, 3))
    _err(ValueError, "local_conv2d: strides must be positive", lc2, x, k, (2, 2), (0, 1),
         (3, 3))
    _err(ValueError, "local_conv2d: output_shape must have 2 entries", lc2, x, k, (2, 2),
         (1, 1), (9,))
    _err(ValueError, "local_conv2d: data_format", lc2, x, k, (2, 2), (2, 2), (2, 2), "nhwc")
    _err(ValueError, "local_conv1d: kernel_size must have 1 entries", K.local_conv1d,
         K.placeholder((None, 5, 3)), k, (2, 2), (1,))
    _err(ValueError, "local_conv1d: the input .* gives output positions", K.local_conv1d,
         K.placeholder((None, 5, 3)), K.variable(rand(3, 6, 2)), (2,), (1,))
    _err(TypeError, "local_conv1d: inputs must be a float tensor", K.local_conv1d,
         K.placeholder((None, 5, 3), dtype="int32"), K.variable(rand(4, 6, 2)), 2, 1)
