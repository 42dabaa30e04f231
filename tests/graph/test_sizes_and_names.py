"""What the graph layer does for item 4 of issue 40: the backend function a
node was built by (graph/calls.py) names errors, and large results of
constants are left for the run (graph/limits.py), while compiling too."""
import numpy as np
import pytest

import cyback as K
from cyback.graph import calls, limits
from cyback.graph.function import topo_nodes
from cyback.graph.tensor import Constant


def test_nodes_remember_the_outermost_backend_function():
    x = K.placeholder((2, 3))
    y = K.var(x, axis=1)                 # var builds its mean and square
    assert {n.call for n in topo_nodes([y])} == {"var"}
    z = x + 1.0                          # an operator is no backend function
    assert z.node.call is None
    assert K.dot(x, K.variable(np.ones((3, 2)))).node.call == "dot"


def test_an_error_escaping_a_function_is_named_after_it_once():
    e = ValueError("axis 5 is out of range")
    calls.name_error(e, "var")
    assert e.args == ("var: axis 5 is out of range",)
    calls.name_error(e, "var")
    assert e.args == ("var: axis 5 is out of range",)
    named = ValueError("mean: axis 5 (while running var)")
    calls.name_error(named, "var")
    assert str(named) == "mean: axis 5 (while running var)"
    other = KeyError("k")                # only plain ValueError / TypeError
    calls.name_error(other, "var")
    assert other.args == ("k",)


def test_a_wrapped_function_keeps_its_name_and_the_original_traceback():
    assert K.var.__name__ == "var" and K.var.__wrapped__.__module__ == "cyback.api.math"
    with pytest.raises(ValueError) as info:
        K.var(K.constant(np.ones((2, 3))), 5)
    frames = [tb.tb_frame.f_code.co_name for tb in _walk(info.value.__traceback__)]
    assert "normalize_axes" in frames        # raised where the check is


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def test_large_constant_results_are_left_for_the_run_when_compiling():
    # The learning phase becomes a constant only when the function is
    # compiled: the switch then forwards a constant, and the tile of it is
    # folded only when small. (An update makes it a training plan, whose
    # weight-only steps are not frozen.)
    small = K.in_train_phase(K.constant(np.arange(4.0, dtype="float32")),
                             K.constant(np.zeros(4, "float32")))
    v = K.variable(0.0)
    for reps, folded in ((3, True), (2 ** 27, False)):
        f = K.function([K.learning_phase()], [K.sum(K.tile(small, reps))],
                       updates=[K.update_add(v, 1.0)])
        tiles = [op for op in f.plan_ops(1) if type(op).__name__ == "Tile"]
        assert (not tiles) == folded
    f = K.function([K.learning_phase()], [K.sum(K.tile(small, 3))])
    assert float(f([1])[0]) == 18.0 and float(f([0])[0]) == 0.0


def test_the_fold_limit_and_the_size_bound():
    assert limits.foldable((limits.FOLD_BYTES // 4,), "float32")
    assert not limits.foldable((limits.FOLD_BYTES // 4 + 1,), "float32")
    assert limits.foldable((None, 10 ** 12), "float32")     # decided by the op's values
    limits.check_shape("f", (None, 2 ** 62), "float32")    # unknown sizes pass
    with pytest.raises(ValueError, match=r"^f: the result would have shape \(4, %d\), %d "
                       r"elements, more than an array can hold" % (2 ** 62, 2 ** 64)):
        limits.check_shape("f", (4, 2 ** 62), "float32")
    with pytest.raises(ValueError, match="^f: the result would have 65 axes"):
        limits.check_shape("f", (1,) * 65, "float32")


def test_folding_while_building_is_bounded_the_same_way():
    c = K.constant(np.ones(4, "float32"))
    assert type(K.tile(c, 3)) is Constant
    assert type(K.tile(c, 2 ** 27)) is not Constant
