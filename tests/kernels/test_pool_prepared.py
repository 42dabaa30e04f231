"""pool.forward_call: a prepared pool_forward gives its results bit for bit,
takes pool_forward for arrays that do not fit, and raises its errors when it
is prepared."""
import numpy as np
import pytest

from cyback.kernels import pool

# x shape, pool size, strides, pads, channels_last
CASES = [
    ((1, 24, 24, 64), (2, 2), (2, 2), ((0, 0), (0, 0)), True),
    ((2, 7, 9, 3), (3, 3), (2, 1), ((1, 1), (1, 0)), True),
    ((2, 3, 7, 9), (3, 2), (1, 2), ((1, 1), (0, 1)), False),
    ((3, 20, 5), (4,), (3,), ((1, 2),), True),
    ((1, 4, 5, 6, 2), (2, 2, 3), (1, 2, 2), ((0, 1), (1, 0), (1, 1)), True),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_same_bits_as_pool_forward(case, mode, dtype):
    xs, k, s, p, last = CASES[case]
    x = np.random.default_rng(case).standard_normal(xs).astype(dtype)
    want = pool.pool_forward(x, k, s, p, last, mode)
    call = pool.forward_call(xs, k, s, p, last, mode, dtype)
    for _ in range(2):
        y = call(x)
        assert y.dtype == dtype and y.shape == want.shape
        np.testing.assert_array_equal(y, want)


def test_arrays_that_do_not_fit_take_pool_forward(monkeypatch):
    xs, k, s, p, last = CASES[1]
    x = np.random.default_rng(7).standard_normal(xs).astype(np.float32)
    want = pool.pool_forward(x, k, s, p, last, "max")
    call = pool.forward_call(xs, k, s, p, last, "max", np.float32)
    calls = []
    plain = pool.pool_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return plain(*args, **kwargs)
    monkeypatch.setattr(pool, "pool_forward", counted)
    readonly = x.copy()
    readonly.flags.writeable = False
    np.testing.assert_array_equal(call(readonly), want)
    assert calls == []
    np.testing.assert_array_equal(call(np.asfortranarray(x)), want)
    assert call(x.astype(np.float64)).dtype == np.float64
    assert len(calls) == 2
    with pytest.raises(TypeError, match="pool_forward"):
        call(x.astype(np.int32))
    with pytest.raises(ValueError, match="pool_forward"):
        call(x[:, :1, :1])          # window larger than the input


def test_preparing_checks_like_pool_forward():
    with pytest.raises(ValueError, match="pool_forward: mode"):
        pool.forward_call((1, 4, 4, 1), (2, 2), (2, 2), ((0, 0), (0, 0)), True, "min",
                          "float32")
    with pytest.raises(TypeError, match="pool_forward: expected float32"):
        pool.forward_call((1, 4, 4, 1), (2, 2), (2, 2), ((0, 0), (0, 0)), True, "max",
                          "float16")
    with pytest.raises(ValueError, match="pool_forward: each pad"):
        pool.forward_call((1, 4, 4, 1), (2, 2), (2, 2), ((2, 0), (0, 0)), True, "max",
                          "float32")
