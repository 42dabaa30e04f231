"""ops/attention.py and kernels/attention.pyx: softmax(q k^T + bias) v per batch
and head, against a NumPy reference; its gradient against finite differences."""
import numpy as np
import pytest

import cyback as K
from cyback.kernels import attention as kernel
from cyback.ops.attention import Attention

from gradcheck import check_grads
from instruction_sets import instruction_set


def reference(q, k, v, bias=None):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum("bthd,bshd->bhts", q, k)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, v)


def operands(rng, b, t, s, h, d, dv, dtype):
    return tuple(rng.normal(size=shape).astype(dtype)
                 for shape in ((b, t, h, d), (b, s, h, d), (b, s, h, dv)))


SHAPES = [(1, 64, 64, 4, 32, 32), (3, 5, 7, 2, 3, 4), (2, 300, 17, 3, 8, 5), (1, 1, 1, 1, 1, 1),
          (2, 9, 1, 2, 4, 3), (1, 2, 600, 1, 2, 2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
def test_kernel_matches_numpy(rng, shape, dtype, tol):
    q, k, v = operands(rng, *shape, dtype)
    out = kernel.attention(q, k, v)
    assert out.dtype == dtype and out.shape == shape[:2] + (shape[3], shape[5])
    np.testing.assert_allclose(out, reference(q, k, v), rtol=tol, atol=tol)


@pytest.mark.parametrize("bias_shape", ["bhts", "1hts", "b1ts", "ts", "hts"])
def test_kernel_adds_a_broadcast_bias(rng, bias_shape):
    b, t, s, h = 2, 6, 5, 3
    q, k, v = operands(rng, b, t, s, h, 4, 2, np.float64)
    dims = {"b": b, "h": h, "t": t, "s": s, "1": 1}
    bias = rng.normal(size=[dims[c] for c in bias_shape]) * 3
    bias[..., 0] = -1e9                             # a masked position
    np.testing.assert_allclose(kernel.attention(q, k, v, bias), reference(q, k, v, bias),
                               rtol=1e-12, atol=1e-12)


def test_kernel_reads_strided_views_in_place(rng):
    joined = rng.normal(size=(2, 7, 3, 12)).astype(np.float32)   # one q|k|v projection
    q, k, v = joined[..., :4], joined[..., 4:8], joined[..., 8:]
    np.testing.assert_allclose(kernel.attention(q, k, v), reference(q, k, v), rtol=2e-5,
                               atol=2e-5)
    # every other position and a reversed head order: any stride BLAS can take
    big = rng.normal(size=(2, 14, 3, 4)).astype(np.float32)
    q2 = big[:, ::2, ::-1]
    np.testing.assert_allclose(kernel.attention(q2, k, v), reference(q2, k, v), rtol=2e-5,
                               atol=2e-5)


def test_kernel_result_does_not_depend_on_the_thread_count(rng):
    q, k, v = operands(rng, 3, 200, 150, 4, 16, 16, np.float32)
    old = K.get_num_threads()
    try:
        K.set_num_threads(1)
        one = kernel.attention(q, k, v)
        K.set_num_threads(2)
        two = kernel.attention(q, k, v)
    finally:
        K.set_num_threads(old)
    assert one.tobytes() == two.tobytes()


def test_kernel_empty_sizes(rng):
    q, k, v = operands(rng, 0, 4, 3, 2, 5, 6, np.float32)
    assert kernel.attention(q, k, v).shape == (0, 4, 2, 6)
    q, k, v = operands(rng, 2, 4, 0, 2, 5, 6, np.float32)
    out = kernel.attention(q, k, v)                 # nothing to attend to: an empty sum
    assert out.shape == (2, 4, 2, 6) and not out.any()
    q, k, v = operands(rng, 2, 4, 3, 2, 0, 6, np.float64)
    np.testing.assert_allclose(kernel.attention(q, k, v), reference(q, k, v), atol=1e-14)


def test_kernel_nan_and_fully_masked_rows(rng):
    q, k, v = operands(rng, 1, 3, 4, 1, 2, 2, np.float32)
    q[0, 1, 0, 0] = np.nan
    out = kernel.attention(q, k, v)
    assert np.isnan(out[0, 1]).all() and np.isfinite(out[0, [0, 2]]).all()


def test_kernel_bad_arguments(rng):
    q, k, v = operands(rng, 2, 3, 4, 2, 5, 6, np.float32)
    with pytest.raises(ValueError, match="4-D"):
        kernel.attention(q[0], k, v)
    with pytest.raises(ValueError, match="do not match"):
        kernel.attention(q, k[:, :, :1], v)
    with pytest.raises(ValueError, match="do not match"):
        kernel.attention(q, k, v[:, :3])
    with pytest.raises(TypeError, match="one dtype"):
        kernel.attention(q, k.astype(np.float64), v)
    with pytest.raises(TypeError, match="float32 or float64"):
        kernel.attention(q.astype(np.int32), k, v)
    with pytest.raises(TypeError, match="NumPy array"):
        kernel.attention(q.tolist(), k, v)
    with pytest.raises(ValueError, match="bias"):
        kernel.attention(q, k, v, np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="bias"):
        kernel.attention(q, k, v, np.zeros((3, 2, 3, 4), np.float32))


# ------------------------------------------------------------------ the op


def test_op_shape_rule_and_value(rng):
    q, k, v = operands(rng, 2, 5, 3, 2, 4, 3, np.float32)
    phs = [K.placeholder((None,) + a.shape[1:]) for a in (q, k, v)]
    out = Attention()(*phs)
    assert K.int_shape(out) == (None, 5, 2, 3)
    np.testing.assert_allclose(K.function(phs, [out])([q, k, v])[0], reference(q, k, v),
                               rtol=2e-5, atol=2e-5)


def test_op_bad_shapes():
    with pytest.raises(ValueError, match="4-D"):
        Attention()(K.placeholder((2, 3, 4)), K.placeholder((2, 3, 1, 4)),
                    K.placeholder((2, 3, 1, 4)))
    with pytest.raises(ValueError, match="do not match"):
        Attention()(K.placeholder((2, 3, 2, 4)), K.placeholder((2, 3, 1, 4)),
                    K.placeholder((2, 3, 2, 4)))
    with pytest.raises(ValueError, match="bias"):
        Attention(biased=True)(K.placeholder((2, 3, 2, 4)), K.placeholder((2, 5, 2, 4)),
                               K.placeholder((2, 5, 2, 4)), K.placeholder((5,)))


def test_gradient_matches_finite_differences(rng, one_thread):
    q, k, v = operands(rng, 2, 3, 4, 2, 2, 3, np.float64)
    check_grads(lambda a, b, c: Attention()(a, b, c), q, k, v)


def test_gradient_with_a_bias(rng, one_thread):
    q, k, v = operands(rng, 1, 3, 2, 2, 2, 2, np.float64)
    bias = rng.normal(size=(1, 2, 3, 2))
    check_grads(lambda a, b, c, m: Attention(biased=True)(a, b, c, m), q, k, v, bias)
    small = rng.normal(size=(3, 2))                 # broadcast over batch and heads
    check_grads(lambda a, b, c, m: Attention(biased=True)(a, b, c, m), q, k, v, small)


def test_second_derivatives_are_refused_clearly(rng):
    q = K.placeholder((1, 2, 1, 2), dtype="float64")
    out = K.sum(Attention()(q, q, q))
    g = K.gradients(out, [q])[0]
    with pytest.raises(ValueError, match="second derivatives"):
        K.gradients(K.sum(g), [q])


@pytest.mark.parametrize("which", ["avx512", "avx2", "baseline"])
@pytest.mark.parametrize("shape", [(1, 64, 64, 4, 32, 32), (2, 7, 13, 3, 5, 9),
                                   (3, 70, 33, 2, 17, 80), (1, 5, 200, 2, 64, 65),
                                   (2, 9, 1, 2, 4, 3), (1, 3, 4, 1, 0, 2)])
def test_kernel_products_in_every_instruction_set(rng, which, shape):
    # float32: the products run in registers (include/cyback_attention.h) or,
    # in the baseline set, through BLAS; rows past a tile of 4, columns past
    # a vector and past 64, views of a joined projection, a bias
    b, t, s, h, d, dv = shape
    joined = rng.normal(size=(b, max(t, s), h, 2 * d + dv)).astype(np.float32)
    q = joined[:, :t, :, :d]
    k = joined[:, :s, :, d:2 * d]
    v = joined[:, :s, :, 2 * d:]
    bias = (rng.normal(size=(t, s)) * 2).astype(np.float32)
    with instruction_set(kernel, which):
        got = kernel.attention(q, k, v)
        biased = kernel.attention(q, k, v, bias)
        old = K.get_num_threads()
        try:
            K.set_num_threads(1)
            one = kernel.attention(q, k, v)
        finally:
            K.set_num_threads(old)
    np.testing.assert_allclose(got, reference(q, k, v), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(biased, reference(q, k, v, bias), rtol=2e-5, atol=2e-5)
    assert one.tobytes() == got.tobytes()


def test_prepared_call_gives_the_kernels_bits_and_declines_what_does_not_fit(rng):
    joined = rng.normal(size=(2, 7, 3, 12)).astype(np.float32)    # one q|k|v projection
    q, k, v = joined[..., :4], joined[..., 4:8], joined[..., 8:]
    call = kernel.attention_call(q, k, v)
    got = call(q, k, v)
    assert got.shape == (2, 7, 3, 4) and got.tobytes() == kernel.attention(q, k, v).tobytes()
    contiguous = [np.ascontiguousarray(a) for a in (q, k, v)]
    assert call(*contiguous) is None                               # other strides
    assert call(q[:1], k[:1], v[:1]) is None                       # other shapes
    assert call(*[a.astype(np.float64) for a in (q, k, v)]) is None
    assert call(q, k, "v") is None
    again = kernel.attention_call(*contiguous)
    assert again(*contiguous).tobytes() == kernel.attention(*contiguous).tobytes()
    one = operands(rng, 1, 1, 1, 1, 3, 2, np.float64)               # length-1 axes
    assert kernel.attention_call(*one)(*one).tobytes() == kernel.attention(*one).tobytes()
    # nothing to prepare: empty sizes, other dtypes, mismatched shapes
    assert kernel.attention_call(*operands(rng, 0, 4, 3, 2, 5, 6, np.float32)) is None
    assert kernel.attention_call(*operands(rng, 1, 4, 3, 2, 5, 6, np.float16)) is None
    assert kernel.attention_call(q, k[:, :3], v) is None
