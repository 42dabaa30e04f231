"""rnn over zero time steps is a ValueError naming rnn (there is no last output)."""
import numpy as np
import pytest

import cyback as K


@pytest.mark.parametrize("unroll", [False, True])
@pytest.mark.parametrize("time_major", [False, True])
def test_rnn_zero_time_steps(unroll, time_major):
    x = K.placeholder((0, 2, 3) if time_major else (2, 0, 3))
    w = K.variable(np.ones((3, 4)))

    def step(x_t, states):
        out = K.dot(x_t, w) + states[0]
        return out, [out]
    with pytest.raises(ValueError, match=r"^rnn: the inputs have 0 time steps"):
        K.rnn(step, x, [K.zeros((2, 4))], unroll=unroll, time_major=time_major)
