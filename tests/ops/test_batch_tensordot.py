"""BatchTensorDot remembers its transposes per shape: the same op on several
run-time shapes, identity and non-identity layouts, non-contiguous inputs and a
full memo all give NumPy's values."""
import numpy as np
import pytest

from cyback.ops import linalg


def _reference(x, y, ax, ay):
    return np.stack([np.tensordot(x[i], y[i], axes=([ax - 1], [ay - 1]))
                     for i in range(x.shape[0])])


@pytest.mark.parametrize("ax,ay", [(2, 1), (1, 1), (2, 2), (1, 2)])
def test_layouts_and_shapes(ax, ay):
    rng = np.random.default_rng(0)
    op = linalg.BatchTensorDot((ax,), (ay,))
    for b, m, k, n in [(4, 6, 5, 3), (1, 1, 7, 2), (3, 2, 1, 4)]:
        xs = (b, m, k) if ax == 2 else (b, k, m)
        ys = (b, k, n) if ay == 1 else (b, n, k)
        x = rng.standard_normal(xs).astype("float32")
        y = rng.standard_normal(ys).astype("float32")
        got = op.compute(x, y)[0]
        np.testing.assert_allclose(got, _reference(x, y, ax, ay), rtol=1e-5, atol=1e-5)
        # a non-contiguous view of the same values gives the same result
        xt = np.asfortranarray(x)
        np.testing.assert_array_equal(op.compute(xt, y)[0], got)


def test_memo_is_bounded_and_refilled(monkeypatch):
    monkeypatch.setattr(linalg, "_batch_layouts", {})
    op = linalg.BatchTensorDot((2,), (1,))
    y = np.ones((1, 3, 2), "float64")
    for m in range(1, 300):
        out = op.compute(np.ones((1, m, 3)), y)[0]
        assert out.shape == (1, m, 2) and np.all(out == 3)
    assert 0 < len(linalg._batch_layouts) <= 256
    with pytest.raises(ValueError, match="batch sizes differ"):
        op.compute(np.ones((2, 3, 3)), y)
