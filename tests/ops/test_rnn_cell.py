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
