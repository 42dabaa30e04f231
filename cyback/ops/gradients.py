"""Reverse-mode differentiation over the graph.

``gradients(loss, variables)`` walks the nodes between the variables and the
loss in reverse topological order, asking each op for the gradients of its
inputs (``Op.grad``) and summing the contributions that reach a tensor along
several paths. Gradients are ordinary graph tensors, so they can be
differentiated again.
"""
from cyback.graph import collector
from cyback.graph.function import topo_nodes
from cyback.graph.tensor import Tensor, as_tensor, is_float_dtype
from cyback.ops import elementwise as ew
from cyback.ops import reduction
from cyback.ops import shape as shp


def _depends_on(nodes, sources):
    """Ids of the tensors on some path from ``sources`` through ``nodes`` (in
    topological order)."""
    reach = {s.id for s in sources}
    for node in nodes:
        if any(x.id in reach for x in node.inputs):
            for o in node.outputs:
                reach.add(o.id)
    return reach


def gradients(loss, variables):
    """Gradients of ``loss`` (summed if not a scalar; a list of losses is
    summed too) with respect to ``variables``, as a list even for a single
    variable (as ``tf.gradients`` and Keras's TensorFlow backend do).

    Variables the loss does not depend on get zeros of their shape.
    """
    variables = [variables] if isinstance(variables, Tensor) else list(variables)
    for v in variables:
        if not isinstance(v, Tensor):
            raise TypeError("gradients: expected tensors or variables, got %r" % (v,))
    parts = [as_tensor(x) for x in loss] if isinstance(loss, (list, tuple)) else [as_tensor(loss)]
    if not parts:
        raise ValueError("gradients: empty list of losses")
    total = None
    for part in parts:
        if not is_float_dtype(part.dtype):
            raise TypeError("gradients: the loss must be a float tensor, got dtype %s"
                            % part.dtype)
        if part.ndim != 0:
            part = reduction.reduce_sum(part, None, False)
        total = part if total is None else ew.add(total, part)
    return gradients_with_seeds([total], [ew.ones_like(total)], variables)


def gradients_with_seeds(outputs, seeds, wrt):
    """Gradients with respect to ``wrt`` of ``sum(output * seed)`` over the pairs:
    the vector-Jacobian product that a reverse scan needs for one step."""
    for v in wrt:
        if not isinstance(v, Tensor):
            raise TypeError("gradients: expected tensors or variables, got %r" % (v,))
    with collector.paused():
        return _vjp(outputs, seeds, wrt)


def _vjp(outputs, seeds, wrt):
    # gradients_with_seeds's walk, run with the cycle collector paused
    nodes = topo_nodes(outputs)
    reach = _depends_on(nodes, wrt)
    grads = {}
    for o, s in zip(outputs, seeds):
        if s is not None and is_float_dtype(o.dtype):
            grads[o.id] = s if o.id not in grads else ew.add(grads[o.id], s)
    for node in reversed(nodes):
        if not any(o.id in reach for o in node.outputs):
            continue
        out_grads = [grads.get(o.id) for o in node.outputs]
        if all(g is None for g in out_grads):
            continue
        in_grads = node.op.grad(node.inputs, node.outputs, out_grads)
        if len(in_grads) != len(node.inputs):
            raise RuntimeError("%s.grad returned %d gradients for %d inputs"
                               % (type(node.op).__name__, len(in_grads), len(node.inputs)))
        for x, g in zip(node.inputs, in_grads):
            if g is None or x.id not in reach or not is_float_dtype(x.dtype):
                continue
            g = as_tensor(g)
            if g.dtype != x.dtype:
                g = ew.cast(g, x.dtype)
            prev = grads.get(x.id)
            grads[x.id] = g if prev is None else ew.add(prev, g)
    return [grads[v.id] if v.id in grads else shp.zeros_like(v) for v in wrt]
