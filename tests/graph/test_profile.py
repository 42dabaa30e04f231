"""Function.profile: the plan of a call run step by step, with each step's time."""
import numpy as np
import pytest

import cyback as K
from cyback.graph.profile import Profile, StepTime


def _cnn():
    rng = np.random.default_rng(0)
    x = K.placeholder((None, 8, 8, 3))
    k = K.variable(rng.standard_normal((3, 3, 3, 4)).astype("float32"))
    b = K.variable(rng.standard_normal(4).astype("float32"))
    y = K.relu(K.bias_add(K.conv2d(x, k), b))
    y = K.softmax(K.batch_flatten(K.pool2d(y, (2, 2), strides=(2, 2))))
    return x, y, rng.standard_normal((2, 8, 8, 3)).astype("float32")


def test_profile_covers_every_step_and_gives_the_function_s_outputs():
    x, y, xv = _cnn()
    f = K.function([x], [y])
    p = f.profile([xv], calls=3)
    assert isinstance(p, Profile)
    assert [s.index for s in p.steps] == list(range(len(f.plan_ops())))
    assert all(isinstance(s, StepTime) and s.seconds >= 0 for s in p.steps)
    labels = [s.label for s in p.steps]
    assert labels[0] == "conv2d + add + relu"    # a fused step names its ops
    assert "softmax" in labels and "pool2d" in labels
    first = p.steps[0]
    assert first.inputs[0] == (2, 8, 8, 3) and first.outputs == [(2, 6, 6, 4)]
    np.testing.assert_array_equal(p.outputs[0], f([xv])[0])
    assert p.call_seconds > 0 and p.step_seconds == pytest.approx(
        sum(s.seconds for s in p.steps))
    kinds = p.by_label()
    assert sum(n for _, n, _ in kinds) == len(p.steps)
    assert [t for _, _, t in kinds] == sorted((t for _, _, t in kinds), reverse=True)
    text = p.table(top=2)
    assert "a call:" in text and "the 2 slowest steps:" in text and "conv2d + add + relu" in text


def test_profile_refreshes_frozen_weights_and_takes_the_learning_phase():
    x, y, xv = _cnn()
    f = K.function([x], [y])
    before = f.profile([xv], calls=1).outputs[0]
    var = _variables_of(f)[0]
    K.set_value(var, K.get_value(var) * 2)       # the frozen prelude must be refreshed
    after = f.profile([xv], calls=1)
    np.testing.assert_array_equal(after.outputs[0], f([xv])[0])
    assert not np.array_equal(before, after.outputs[0])
    assert f.profile([xv], calls=1, learning_phase=1).outputs[0].shape == (2, 36)


def _variables_of(f):
    from cyback.graph.function import leaves_of
    from cyback.graph.tensor import Variable
    return [t for t in leaves_of(f.outputs) if isinstance(t, Variable)]


@pytest.mark.parametrize("kwargs,match", [
    (dict(calls=0), "calls must be a positive int"),
    (dict(calls=True), "calls must be a positive int"),
    (dict(learning_phase=2), "learning_phase must be 0 or 1"),
])
def test_profile_bad_arguments(kwargs, match):
    x, y, xv = _cnn()
    f = K.function([x], [y])
    with pytest.raises(ValueError, match=match):
        f.profile([xv], **kwargs)
    with pytest.raises(ValueError, match="expected a list of 1 input"):
        f.profile(xv)


def test_profile_refuses_a_function_with_updates():
    x, y, xv = _cnn()
    var = _variables_of(K.function([x], [y]))[0]
    f = K.function([x], [y], updates=[K.update_add(var, K.ones_like(var))])
    before = K.get_value(var)
    with pytest.raises(ValueError, match="assigns variables"):
        f.profile([xv])
    np.testing.assert_array_equal(K.get_value(var), before)
