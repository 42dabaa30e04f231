"""Checks of the int8 layers' constructor arguments, and which activations
the product's epilogue applies itself; shared by the dense, convolution and
recurrent int8 layers."""
import math

from cyback.layers import activations as _activations
from cyback.layers import import_keras

keras = import_keras()


def check_quantization(cls, scale, zero):
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
            not (math.isfinite(scale) and scale > 0):
        raise ValueError('%s: input_scale must be a finite positive number, got %r'
                         % (cls, scale))
    if isinstance(zero, bool) or not isinstance(zero, int) or not 0 <= zero <= 255:
        raise ValueError('%s: input_zero_point must be an integer from 0 to 255, got %r'
                         % (cls, zero))


def positive_int(cls, name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError('%s: %s must be a positive integer, got %r' % (cls, name, value))
    return value


def int_tuple(cls, name, value, rank):
    items = (value,) * rank if isinstance(value, int) else tuple(value)
    if len(items) != rank or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                     for v in items):
        raise ValueError('%s: %s must be %d positive integers, got %r'
                         % (cls, name, rank, value))
    return items


def fused_activation(activation):
    """The name of the activation the product's epilogue applies, or None
    when the layer applies it after (only Keras's own linear and relu and
    cyback.layers' relu6 are fused, not other functions of those names)."""
    fused = {keras.activations.linear: 'linear', keras.activations.relu: 'relu',
             _activations.relu6: 'relu6'}
    return fused.get(activation)
