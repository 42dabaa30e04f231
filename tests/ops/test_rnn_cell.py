"""The fused recurrent op's helpers."""
import numpy as np

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
