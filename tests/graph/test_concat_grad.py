"""The gradient of a concatenation is one split op (ConcatSplit) with an
output per input: values against finite differences and NumPy, static and
run-time sizes, second order, and a graph linear in the number of inputs (an
unrolled RNN's stacked outputs made the gradient graph, its plan and its
compile time quadratic)."""
import numpy as np
import pytest

import cyback as K
from cyback.graph.function import topo_nodes
from cyback.ops.shape import ConcatSplit

from gradcheck import check_grads


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate_gradient(axis):
    rs = np.random.RandomState(0)
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    shapes = [tuple(s if i != axis % 3 else s + k for i, s in enumerate(sh))
              for k, sh in enumerate(shapes)]
    values = [rs.randn(*s) for s in shapes]
    check_grads(lambda *xs: K.concatenate(list(xs), axis=axis) ** 2, *values)


def test_concatenate_gradient_with_empty_and_unused_parts():
    rs = np.random.RandomState(1)
    a, b, c = rs.randn(2, 3), np.zeros((2, 0)), rs.randn(2, 1)
    check_grads(lambda x, y, z: K.concatenate([x, y, z], axis=1)[:, :2], a, b, c)


def test_run_time_sizes_are_read_from_the_inputs():
    x = K.placeholder((2, None))
    y = K.placeholder((2, None))
    loss = K.sum(K.concatenate([x, y], axis=1) * K.constant(np.arange(5.0)))
    gx, gy = K.gradients(loss, [x, y])
    splits = [n.op for n in topo_nodes([gx, gy]) if isinstance(n.op, ConcatSplit)]
    assert len(splits) == 1 and splits[0].sizes is None
    out = K.function([x, y], [gx, gy])([np.ones((2, 2), "float32"), np.ones((2, 3), "float32")])
    np.testing.assert_array_equal(out[0], [[0, 1]] * 2)
    np.testing.assert_array_equal(out[1], [[2, 3, 4]] * 2)


def test_second_order():
    x = K.placeholder((3,), dtype="float64")
    y = K.placeholder((2,), dtype="float64")
    cat = K.concatenate([x, y])
    g = K.gradients(K.sum(cat ** 3), [x])[0]       # 3 x**2, through ConcatSplit
    gg = K.gradients(K.sum(g * K.constant(np.arange(3.0))), [x])[0]   # 6 x * w
    xv = np.array([1.0, 2.0, -1.0])
    out = K.function([x, y], [gg])([xv, np.zeros(2)])[0]
    np.testing.assert_allclose(out, 6 * xv * np.arange(3.0))


@pytest.mark.parametrize("n", [50, 200])
def test_gradient_graph_is_linear_in_the_number_of_inputs(n):
    xs = [K.placeholder((1, 3)) for _ in range(n)]
    grads = K.gradients(K.sum(K.concatenate(xs, axis=0) ** 2), xs)
    edges = sum(len(node.inputs) for node in topo_nodes(grads))
    assert edges < 10 * n
