"""switch, in_train_phase and in_test_phase of the Keras backend API."""
import numbers

import numpy as np

from cyback import config
from cyback.graph import calls as _calls
from cyback.graph.tensor import Constant, Tensor
from cyback.ops.control import select

__all__ = ["switch", "in_train_phase", "in_test_phase"]


def _value(branch):
    return branch() if callable(branch) and not isinstance(branch, Tensor) else branch


def _static_truth(condition):
    """True/False when the condition is a Python (or NumPy, or constant) scalar,
    else None."""
    if isinstance(condition, (bool, np.bool_, numbers.Number)):
        return bool(condition)
    if isinstance(condition, np.ndarray) and condition.ndim == 0:
        return bool(condition)
    if type(condition) is Constant and condition.value.ndim == 0:
        return bool(condition.value)
    return None


def switch(condition, then_expression, else_expression):
    """``then_expression`` where ``condition`` holds, else ``else_expression``.

    A scalar condition selects a whole branch (branches may be callables); a
    condition of lower rank than the branches is broadcast over their
    trailing axes."""
    known = _static_truth(condition)
    if known is not None:
        return _value(then_expression if known else else_expression)
    if condition is None or not isinstance(condition, (Tensor, np.ndarray, list, tuple)):
        raise TypeError("switch: condition must be a tensor or a Python bool, got %r"
                        % (condition,))
    then_t = _value(then_expression)
    else_t = _value(else_expression)
    if then_t is None or else_t is None:
        raise TypeError("switch: then_expression and else_expression must be tensors (or "
                        "callables returning tensors), got %r and %r" % (then_t, else_t))
    out = select(condition, then_t, else_t)
    if any(getattr(t, "_uses_learning_phase", False) for t in (condition, then_t, else_t)):
        out._uses_learning_phase = True
    return out


def in_train_phase(x, alt, training=None):
    """``x`` in the training phase, ``alt`` otherwise (either may be a callable).

    ``training`` defaults to the learning phase; a fixed 0/1/bool picks the
    branch now, a symbolic one builds a switch that a compiled function
    resolves when it knows the phase."""
    uses_learning_phase = training is None
    if training is None:
        training = config.learning_phase()
    if training is True or (isinstance(training, (int, np.integer)) and not
                            isinstance(training, bool) and training == 1):
        return _value(x)
    if training is False or (isinstance(training, (int, np.integer)) and training == 0):
        return _value(alt)
    if not isinstance(training, Tensor):
        raise TypeError("in_train_phase: training must be None, 0/1, a bool or a scalar "
                        "tensor, got %r" % (training,))
    if training.ndim != 0:
        raise ValueError("in_train_phase: training must be a scalar, got shape %s"
                         % (training.shape,))
    out = switch(training, x, alt)
    if uses_learning_phase:
        out._uses_learning_phase = True
    return out


def in_test_phase(x, alt, training=None):
    """``x`` in the test phase, ``alt`` otherwise."""
    return in_train_phase(alt, x, training=training)


# errors escaping each function name it; nodes remember it (graph/calls.py)
_calls.name_functions(globals(), __all__)
