"""Graph-level selection for K.switch and the learning-phase helpers.

Selection is the element-wise ``Where`` op. A scalar condition selects a whole
branch; when the condition is known at compile time (the learning phase,
which every compiled Function fixes per plan) ``Where.simplify`` forwards the
chosen branch and the other one is never computed.
"""
from cyback.graph.shapes import format_shape
from cyback.graph.tensor import as_tensor
from cyback.ops import elementwise as ew
from cyback.ops.shape import reshape_static_dims


def select(condition, then_t, else_t):
    """``then_t`` where ``condition`` holds, else ``else_t``.

    A condition of lower rank than the branches gets size-1 trailing axes (as
    Keras's TensorFlow backend tiles it), so a (batch,) condition picks rows.
    """
    condition = as_tensor(condition)
    then_t, else_t = ew.pair(then_t, else_t)
    if condition.dtype != "bool":
        condition = ew.cast(condition, "bool")
    expr_ndim = then_t.ndim
    if condition.ndim > expr_ndim:
        raise ValueError("switch: rank of `condition` should be less than or equal to rank of "
                         "`then_expression` and `else_expression`; ndim(condition)=%d %s, "
                         "ndim(then_expression)=%d %s"
                         % (condition.ndim, format_shape(condition.shape), expr_ndim,
                            format_shape(then_t.shape)))
    given = condition.shape
    if 0 < condition.ndim < expr_ndim:
        condition = reshape_static_dims(condition, tuple(range(condition.ndim, expr_ndim)),
                                        expr_ndim)
    for i, (c, d) in enumerate(zip(condition.shape, then_t.shape)):
        if c is not None and d is not None and c not in (1, d):
            raise ValueError("switch: condition of shape %s does not match expressions of shape "
                             "%s at axis %d" % (format_shape(given), format_shape(then_t.shape), i))
    return ew.where(condition, then_t, else_t)
