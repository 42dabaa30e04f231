"""cyback.ops.codes: a float tensor's uint8 codes, as qgemm.quantize makes
them, in a compiled function; its refusals."""
import numpy as np
import pytest

import cyback as K
from cyback.kernels import qgemm
from cyback.ops.codes import Codes


def test_codes_in_a_function(rng):
    x = K.placeholder(shape=(None, 5))
    f = K.function([x], [Codes(0.05, 7)(x)])
    for xv in (rng.standard_normal((4, 5)).astype(np.float32),
               rng.standard_normal((3, 5)),                       # float64 in
               np.zeros((0, 5), np.float32)):
        got = f([xv])[0]
        want = qgemm.quantize(np.ascontiguousarray(xv, np.float32), 0.05, 7)
        assert got.dtype == np.uint8 and got.tobytes() == want.tobytes()


def test_codes_refusals():
    with pytest.raises(ValueError, match="expected a float input, got int32"):
        Codes(0.1, 0)(K.placeholder(shape=(2,), dtype="int32"))
    x = K.placeholder(shape=(2,))
    y = Codes(0.1, 0)(x)
    with pytest.raises(TypeError, match="no gradient"):
        y.node.op.grad([x], [y], [K.ones_like(x)])
