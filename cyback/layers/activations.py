"""Activation functions that tf.keras 2.x and Keras 3 name in model configs and
Keras 2.3.1 lacks (or defines differently).

Each is a plain function of a tensor, written with backend ops so it has a
gradient, and named as the configs name it: registered through
``cyback.layers.custom_objects()`` they work as ``Activation("gelu")`` and
``Dense(..., activation="swish")``, and Keras 2.3.1 saves them by that name.

``hard_sigmoid`` is the one name whose meaning changed between frameworks:

- Keras 2.3.1 and tf.keras 2.x: ``clip(0.2 * x + 0.5, 0, 1)`` (Keras 2.3.1's own
  ``hard_sigmoid``, kept as is);
- Keras 3: ``relu6(x + 3) / 6`` = ``clip(x / 6 + 0.5, 0, 1)``, here
  :func:`hard_sigmoid_keras3`. ``custom_objects(keras3=True)`` maps the name
  ``"hard_sigmoid"`` to it, which is what a loader of Keras 3 files wants.

``elu``, ``selu``, ``softplus``, ``softsign``, ``exponential``, ``linear``,
``relu``, ``sigmoid``, ``tanh`` and ``softmax`` mean the same in all three
frameworks and stay Keras 2.3.1's own.
"""
import math

from cyback.layers._keras import import_keras
from cyback.ops.elementwise import erf

keras = import_keras()
K = keras.backend

__all__ = [
    'gelu', 'swish', 'silu', 'mish', 'hard_swish', 'hard_silu', 'hard_sigmoid_keras3',
    'relu6', 'leaky_relu', 'celu', 'hard_tanh', 'log_sigmoid', 'log_softmax', 'ACTIVATIONS',
]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(x, approximate=False):
    """Gaussian error linear unit, ``x * P(X <= x)`` for a standard normal X.

    ``approximate=False`` (the default of tf.keras and Keras 3):
    ``0.5 * x * (1 + erf(x / sqrt(2)))``; ``approximate=True``:
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``.
    """
    if not isinstance(approximate, bool):
        raise TypeError('gelu: approximate must be True or False, got %r' % (approximate,))
    if approximate:
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * K.square(x))
        return 0.5 * x * (1.0 + K.tanh(inner))
    return 0.5 * x * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))


def swish(x):
    """``x * sigmoid(x)`` (tf.keras's ``swish``; Keras 3 calls it ``silu`` too)."""
    return x * K.sigmoid(x)


def silu(x):
    """``x * sigmoid(x)``: the same function as :func:`swish`, under Keras 3's name."""
    return swish(x)


def mish(x):
    """``x * tanh(softplus(x))``."""
    return x * K.tanh(K.softplus(x))


def relu6(x):
    """``min(max(x, 0), 6)``."""
    return K.relu(x, max_value=6.0)


def hard_sigmoid_keras3(x):
    """Keras 3's ``hard_sigmoid``: ``relu6(x + 3) / 6``.

    Keras 2.x's (and tf.keras 2.x's) ``hard_sigmoid`` is
    ``clip(0.2 * x + 0.5, 0, 1)``: slope 0.2 on [-2.5, 2.5] instead of 1/6 on
    [-3, 3]. See the module docstring.
    """
    return K.relu(x + 3.0, max_value=6.0) * (1.0 / 6.0)


def hard_swish(x):
    """``x * relu6(x + 3) / 6`` (MobileNetV3's hard swish; Keras 3's ``hard_silu``)."""
    return x * hard_sigmoid_keras3(x)


def hard_silu(x):
    """The same function as :func:`hard_swish`, under Keras 3's other name."""
    return hard_swish(x)


def leaky_relu(x, negative_slope=0.2, alpha=None):
    """``x`` for x >= 0, else ``negative_slope * x``.

    ``alpha`` is tf.nn.leaky_relu's name for the slope; give one or the other.
    """
    if alpha is not None:
        if negative_slope != 0.2:
            raise ValueError('leaky_relu: give negative_slope or alpha, not both')
        negative_slope = alpha
    if isinstance(negative_slope, bool) or not isinstance(negative_slope, (int, float)):
        raise TypeError('leaky_relu: negative_slope must be a number, got %r' % (negative_slope,))
    return K.relu(x, alpha=float(negative_slope))


def celu(x, alpha=1.0):
    """Continuously differentiable ELU: ``max(x, 0) + min(0, alpha * (exp(x / alpha) - 1))``."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha == 0:
        raise ValueError('celu: alpha must be a non-zero number, got %r' % (alpha,))
    alpha = float(alpha)
    return K.relu(x) + K.minimum(0.0, alpha * (K.exp(K.minimum(x, 0.0) / alpha) - 1.0))


def hard_tanh(x):
    """``clip(x, -1, 1)``."""
    return K.clip(x, -1.0, 1.0)


def log_sigmoid(x):
    """``log(sigmoid(x)) = -softplus(-x)``, finite for large negative x."""
    return -K.softplus(-x)


def log_softmax(x, axis=-1):
    """``log(softmax(x))`` along ``axis``, computed as ``x - logsumexp(x)``."""
    return x - K.logsumexp(x, axis=axis, keepdims=True)


# The names configs write -> function. hard_sigmoid is absent on purpose: the
# Keras 2 meaning is Keras 2.3.1's built-in; custom_objects(keras3=True) adds
# the Keras 3 one under that name.
ACTIVATIONS = {
    'gelu': gelu,
    'swish': swish,
    'silu': silu,
    'mish': mish,
    'relu6': relu6,
    'hard_swish': hard_swish,
    'hard_silu': hard_silu,
    'hard_sigmoid_keras3': hard_sigmoid_keras3,
    'leaky_relu': leaky_relu,
    'celu': celu,
    'hard_tanh': hard_tanh,
    'log_sigmoid': log_sigmoid,
    'log_softmax': log_softmax,
}
