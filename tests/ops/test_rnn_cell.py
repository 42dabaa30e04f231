"""The fused recurrent op's helpers."""
import numpy as np
import pytest

from cyback.ops.rnn_cell import _joined


def test_joined_is_a_view_of_adjacent_gate_slices():
    full = np.arange(2 * 3 * 12, dtype=np.float32).reshape(2, 3, 12)
    parts = [full[:, :, 0:4], full[:, :, 4:8], full[:, :, 8:12]]
    out = _joined(parts, np.float32)
    assert np.shares_memory(out, full) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, full)


def test_joined_copies_what_is_not_adjacent():
    full = np.arange(2 * 3 * 12, dtype=np.float64).reshape(2, 3, 12)
    cases = [
        [full[:, :, 4:8], full[:, :, 0:4], full[:, :, 8:12]],       # out of order
        [full[:, :, 0:4], full[:, :, 4:8], full[:, :, 4:8]],        # repeated
        [full[:, :, 0:3], full[:, :, 3:6], full[:, :, 6:9]],        # a gap at the end
        [np.ascontiguousarray(full[:, :, i:i + 4]) for i in (0, 4, 8)],
    ]
    for parts in cases:
        out = _joined(parts, np.float64)
        assert not np.shares_memory(out, full) and out.flags.c_contiguous
        np.testing.assert_array_equal(out, np.concatenate(parts, axis=2))
    # A dtype change copies too.
    out = _joined([full[:, :, 0:4], full[:, :, 4:8], full[:, :, 8:12]], np.float32)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, full.astype(np.float32))


def _projection_graph(bias=True):
    import cyback as K
    x = K.placeholder((5, None, 3))
    W = K.variable(np.ones((3, 8), np.float32))
    zx = K.dot(x, W)
    if bias:
        zx = zx + K.variable(np.zeros(8, np.float32))
    return x, W, zx


@pytest.mark.parametrize("bias", [True, False])
def test_projection_of_finds_x_w_and_the_bias(bias):
    from cyback.graph.function import rewritten_steps
    from cyback.graph.optimize import Context
    from cyback.ops.rnn_cell import _projection_of
    x, W, zx = _projection_graph(bias)
    steps, targets = rewritten_steps([zx], {})
    found = _projection_of(targets[0], Context(steps, targets, True), False)
    assert found["x"] is x and found["W"] is W
    assert ("xb" in found) == bias


def test_projection_read_by_another_op_stays_a_product():
    import cyback as K
    from cyback.graph.function import rewritten_steps
    from cyback.graph.optimize import Context
    from cyback.ops.rnn_cell import _projection_of
    _, _, zx = _projection_graph()
    steps, targets = rewritten_steps([zx, K.sum(zx)], {})
    assert _projection_of(targets[0], Context(steps, targets, True), False) is None
    # nor is a product of a placeholder weight
    y = K.placeholder((3, 8))
    steps, targets = rewritten_steps([K.dot(K.placeholder((5, None, 3)), y)], {})
    assert _projection_of(targets[0], Context(steps, targets, True), False) is None


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_projection_is_the_product_step(contiguous, dtype):
    # The op's own projection gives the values of the product and add steps
    # it replaced, bit for bit.
    from cyback.ops.rnn_cell import _PRODUCT, _projection
    rng = np.random.default_rng(0)
    for T, B, n_in, G in [(22, 1, 16, 144), (3, 5, 7, 12), (1, 1, 1, 4)]:
        x = rng.standard_normal((B, T, n_in)).astype(dtype)
        x = x.transpose(1, 0, 2) if not contiguous else np.ascontiguousarray(x.transpose(1, 0, 2))
        w = rng.standard_normal((n_in, G)).astype(dtype)
        b = rng.standard_normal(G).astype(dtype)
        out = _projection(x, w, b)
        assert out.shape == (T, B, G) and out.dtype == dtype
        want = _PRODUCT.compute_epilogue((x, w), b, None)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_allclose(out, np.einsum("tbi,ig->tbg", x, w) + b,
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(_projection(x, w, None), np.einsum("tbi,ig->tbg", x, w),
                                   rtol=1e-5, atol=1e-5)


def _lstm_op():
    from cyback.ops.rnn_cell import FusedRecurrent
    return FusedRecurrent("lstm", {"zx": 0, "h0": 1, "c0": 2, "R": 3}, ("h", "c"), 0, 1, 4,
                          "rnn")


def _lstm_inputs(T=5, B=3, u=4, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, B, 4 * u)).astype(np.float32),
            rng.standard_normal((B, u)).astype(np.float32),
            rng.standard_normal((B, u)).astype(np.float32),
            (rng.standard_normal((u, 4 * u)) * 0.5).astype(np.float32))


def test_op_reads_inputs_of_any_layout_and_dtype():
    # Inputs that are not C-contiguous arrays of the op's dtype are converted;
    # the others are read in place. Both give the same values.
    op = _lstm_op()
    zx, h0, c0, R = _lstm_inputs()
    want = op.compute(zx, h0, c0, R)
    odd = (zx, h0.astype(np.float64), np.asfortranarray(c0), np.asfortranarray(R))
    for got in (op.compute(*odd), _lstm_op().compute(*odd), op.compute(zx, h0, c0, R)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    # h0 given as a list: converted
    got = op.compute(zx, h0.tolist(), c0, R)
    np.testing.assert_array_equal(got[0], want[0])


def test_inference_call_returns_shared_read_only_empty_records():
    op = _lstm_op()
    zx, h0, c0, R = _lstm_inputs()
    full = op.compute(zx, h0, c0, R)
    run = op.compute_for([True, True, True, False, False, False])
    first, second = run(zx, h0, c0, R), run(zx, h0, c0, R)
    for k in range(3):
        np.testing.assert_array_equal(first[k], full[k])
    for a, b, f in zip(first[3:], second[3:], full[3:]):
        assert a.size == 0 and a.ndim == f.ndim and a.dtype == f.dtype
        assert a is b and not a.flags.writeable
