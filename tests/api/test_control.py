"""switch, in_train_phase, in_test_phase."""
import numpy as np
import pytest

import cyback as K
from cyback.ops import random as rnd

from gradcheck import check_grads

pytestmark = pytest.mark.usefixtures("fresh_learning_phase")


def test_switch_scalar_condition():
    c = K.placeholder((), dtype="bool")
    a, b = K.placeholder((None, 3)), K.placeholder((None, 3))
    out = K.switch(c, a, b)
    assert K.int_shape(out) == (None, 3)
    f = K.function([c, a, b], [out])
    x, y = np.ones((2, 3)), np.zeros((2, 3))
    np.testing.assert_array_equal(f([True, x, y])[0], x)
    np.testing.assert_array_equal(f([False, x, y])[0], y)


def test_switch_callables_and_int_condition():
    c = K.placeholder((), dtype="int32")
    a = K.placeholder((2,))
    f = K.function([c, a], [K.switch(c, lambda: a * 2, lambda: a - 1)])
    np.testing.assert_array_equal(f([1, [1.0, 2.0]])[0], [2.0, 4.0])
    np.testing.assert_array_equal(f([0, [1.0, 2.0]])[0], [0.0, 1.0])
    # Python and constant conditions pick a branch now.
    assert K.switch(True, a, lambda: 1 / 0) is a
    assert K.switch(K.constant(0, dtype="int32"), lambda: 1 / 0, a) is a


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_switch_tensor_condition_broadcasts_trailing_axes(dtype, rng):
    x = rng.standard_normal((4, 3, 2)).astype(dtype)
    y = rng.standard_normal((4, 3, 2)).astype(dtype)
    cond = np.array([True, False, False, True])
    pc = K.placeholder((None,), dtype="bool")
    px, py = K.placeholder((None, 3, 2), dtype=dtype), K.placeholder((None, 3, 2), dtype=dtype)
    out = K.switch(pc, px, py)
    assert K.int_shape(out) == (None, 3, 2) and K.dtype(out) == dtype
    got = K.function([pc, px, py], [out])([cond, x, y])[0]
    np.testing.assert_array_equal(got, np.where(cond[:, None, None], x, y))
    cond2 = rng.standard_normal((4, 3)) > 0
    got = K.eval(K.switch(K.constant(cond2, "bool"), K.constant(x, dtype), K.constant(y, dtype)))
    np.testing.assert_array_equal(got, np.where(cond2[..., None], x, y))
    # Same-rank condition: element-wise; a float condition is truth-tested.
    cond3 = (rng.standard_normal((4, 3, 2)) > 0).astype(dtype)
    got = K.eval(K.switch(K.constant(cond3, dtype), K.constant(x, dtype), K.constant(y, dtype)))
    np.testing.assert_array_equal(got, np.where(cond3 != 0, x, y))


def test_switch_grads(rng):
    cond = K.constant(np.array([True, False, True]), "bool")
    check_grads(lambda a, b: K.switch(cond, a * a, b * 3), rng.standard_normal((3, 2)),
                rng.standard_normal((3, 2)))
    c = K.constant(True, "bool")
    check_grads(lambda a, b: K.switch(c, a, b), rng.standard_normal(2), rng.standard_normal(2))


def test_switch_errors():
    a = K.placeholder((2, 3))
    with pytest.raises(ValueError, match="switch: rank of `condition` should be less than or "
                                         "equal"):
        K.switch(K.placeholder((2, 3, 4), dtype="bool"), a, a)
    with pytest.raises(ValueError, match="switch: condition of shape \\(3,\\) does not match"):
        K.switch(K.placeholder((3,), dtype="bool"), a, a)
    with pytest.raises(TypeError, match="switch: condition must be"):
        K.switch("yes", a, a)
    with pytest.raises(TypeError, match="switch: then_expression"):
        K.switch(K.placeholder((), dtype="bool"), None, a)


def test_in_train_phase_with_learning_phase_input():
    a, b = K.placeholder((None, 2)), K.placeholder((None, 2))
    out = K.in_train_phase(a, b)
    assert out._uses_learning_phase
    f = K.function([a, b, K.learning_phase()], [out])
    x, y = np.ones((3, 2)), np.zeros((3, 2))
    np.testing.assert_array_equal(f([x, y, 1])[0], x)
    np.testing.assert_array_equal(f([x, y, 0])[0], y)
    test = K.in_test_phase(a, b)
    assert test._uses_learning_phase
    g = K.function([a, b, K.learning_phase()], [test])
    np.testing.assert_array_equal(g([x, y, 1])[0], y)
    np.testing.assert_array_equal(g([x, y, 0])[0], x)
    # Not fed: the learning phase defaults to test.
    np.testing.assert_array_equal(K.function([a, b], [out])([x, y])[0], y)


def test_in_train_phase_fixed_and_explicit_training():
    a, b = K.placeholder((2,)), K.placeholder((2,))
    assert K.in_train_phase(a, b, training=1) is a
    assert K.in_train_phase(a, b, training=0) is b
    assert K.in_train_phase(a, b, training=True) is a
    assert K.in_test_phase(a, b, training=False) is a
    assert K.in_train_phase(lambda: a, lambda: b, training=1) is a
    K.set_learning_phase(1)
    assert K.in_train_phase(a, b) is a
    assert K.in_test_phase(a, lambda: b) is b
    K.set_learning_phase(0)
    assert K.in_train_phase(a, lambda: b) is b
    # An explicit symbolic flag does not mark the result as learning-phase dependent.
    t = K.placeholder((), dtype="bool")
    out = K.in_train_phase(a, b, training=t)
    assert not out._uses_learning_phase
    f = K.function([t, a, b], [out])
    np.testing.assert_array_equal(f([True, [1, 2], [3, 4]])[0], [1, 2])


def test_in_train_phase_errors():
    a = K.placeholder((2,))
    with pytest.raises(TypeError, match="in_train_phase: training must be"):
        K.in_train_phase(a, a, training="yes")
    with pytest.raises(ValueError, match="in_train_phase: training must be a scalar"):
        K.in_train_phase(a, a, training=K.placeholder((2,), dtype="bool"))


def test_dropout_under_in_train_phase_draws_nothing_in_test_mode(monkeypatch):
    x = K.placeholder((None, 100))
    out = K.in_train_phase(lambda: K.dropout(x, 0.5, seed=1), x)
    f = K.function([x, K.learning_phase()], [out])
    calls = []
    original = rnd.DropoutMask.draw

    def counting(self, rng, shape):
        calls.append(shape)
        return original(self, rng, shape)
    monkeypatch.setattr(rnd.DropoutMask, "draw", counting)
    data = np.ones((4, 100), "float32")
    np.testing.assert_array_equal(f([data, 0])[0], data)
    assert calls == []
    y = f([data, 1])[0]
    assert calls == [(4, 100)] and (y == 0).any() and (y == 2).any()
    # Gradients through the switch follow the phase too.
    v = K.variable(np.ones((3, 4)))
    loss = K.sum(K.in_train_phase(lambda: K.dropout(v, 0.5, seed=2), v * 3))
    g = K.function([K.learning_phase()], K.gradients(loss, [v]))
    np.testing.assert_array_equal(g([0])[0], np.full((3, 4), 3.0))
    assert set(np.unique(g([1])[0])) <= {0.0, 2.0}
