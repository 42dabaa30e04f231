"""Concatenate's compute on the team's copy kernel (channels_last maps of
256 KiB and up, kernels/ewise.pyx concat_last) and on NumPy (the rest):
NumPy's results either way, for every layout the op sees."""
import numpy as np
import pytest

import cyback as K


@pytest.mark.parametrize("shapes,axis", [
    (((2, 56, 56, 64), (2, 56, 56, 32)), -1),           # the kernel
    (((1, 28, 28, 128), (1, 28, 28, 32), (1, 28, 28, 96)), 3),
    (((1, 7, 7, 16), (1, 7, 7, 32)), -1),               # small: NumPy
    (((2, 64, 64, 8), (2, 64, 64, 8)), 1),              # not the last axis
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_concatenate_matches_numpy(shapes, axis, dtype):
    rng = np.random.default_rng(len(shapes))
    xs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    phs = [K.placeholder(shape=(None,) + s[1:], dtype=dtype) for s in shapes]
    f = K.function(phs, [K.concatenate(phs, axis=axis)])
    got = f(xs)[0]
    want = np.concatenate(xs, axis=axis)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_concatenate_of_a_non_contiguous_input_goes_to_numpy():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((1, 64, 64, 80)).astype("float32")[..., ::2]
    b = rng.standard_normal((1, 64, 64, 24)).astype("float32")
    from cyback.ops.shape import Concatenate
    got = Concatenate(3).compute(a, b)[0]
    assert got.tobytes() == np.concatenate([a, b], axis=3).tobytes()
