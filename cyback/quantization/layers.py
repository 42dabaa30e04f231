"""The int8 layers ``cyback.quantize`` puts in place of Dense, Conv1D and
Conv2D: Keras 2.3.1 layers on the ops of ``cyback.ops.quantized``.

Each takes float32 and returns float32. Its input is quantized with the
scale and zero point calibration gave (``input_scale``,
``input_zero_point``: config values), its weights are int8 codes with one
float32 scale per output channel, its sums are int32, and the product's
epilogue dequantizes, adds the float32 bias and applies relu / relu6; any
other activation runs after, in float32.

Weights, in this order (all non-trainable; ``get_weights`` and HDF5 files
hold them as they are):

- ``kernel``: int8, the float layer's kernel shape ((K, units) for Dense,
  window + (channels, filters) for the convolutions);
- ``kernel_scale``: float32 (units or filters,);
- ``bias``: float32 (units or filters,), when ``use_bias``.

The configs hold plain values only, so a saved quantized model loads with
no code from the file: ``custom_objects()`` names these classes for
``keras.models.load_model`` and ``cyback.load_model``.
"""
from cyback.kernels import conv_utils
from cyback.layers import custom_objects as _layer_objects
from cyback.layers import import_keras
from cyback.ops import quantized as qops
from cyback.quantization.arguments import (
    check_quantization,
    fused_activation,
    int_tuple,
    positive_int,
)
from cyback.quantization.recurrent import RECURRENT_LAYERS

keras = import_keras()
K = keras.backend
Layer = keras.engine.base_layer.Layer
InputSpec = keras.engine.base_layer.InputSpec

__all__ = ['QuantizedDense', 'QuantizedConv1D', 'QuantizedConv2D', 'LAYERS', 'custom_objects']


class _QuantizedLayer(Layer):
    """What the int8 layers share: the input's quantization, the activation
    (fused into the product when it is linear, relu or relu6), the weights."""

    def __init__(self, activation=None, use_bias=True, input_scale=1.0, input_zero_point=0,
                 **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        check_quantization(cls, input_scale, input_zero_point)
        self.input_scale = float(input_scale)
        self.input_zero_point = int(input_zero_point)
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self._fused = fused_activation(self.activation)

    def _add_weights(self, kernel_shape, channels):
        self.kernel = self.add_weight(name='kernel', shape=kernel_shape, dtype='int8',
                                      initializer='zeros', trainable=False)
        self.kernel_scale = self.add_weight(name='kernel_scale', shape=(channels,),
                                            dtype='float32', initializer='ones',
                                            trainable=False)
        self.bias = self.add_weight(name='bias', shape=(channels,), dtype='float32',
                                    initializer='zeros', trainable=False) \
            if self.use_bias else None

    def _operands(self):
        packed = qops.PackInt8()(self.kernel)
        vectors = qops.EpilogueVectors(self.input_scale)(
            *((self.kernel_scale,) if self.bias is None else (self.kernel_scale, self.bias)))
        return packed, vectors

    def _finish(self, y):
        if self._fused is None:
            y = self.activation(y)
        return y

    def get_config(self):
        config = {
            'activation': keras.activations.serialize(self.activation),
            'use_bias': self.use_bias,
            'input_scale': self.input_scale,
            'input_zero_point': self.input_zero_point,
        }
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))


class QuantizedDense(_QuantizedLayer):
    """``Dense(units)`` in int8. Weights: ``kernel`` int8 (input_dim, units),
    ``kernel_scale`` float32 (units,), ``bias`` float32 (units,)."""

    def __init__(self, units, activation=None, use_bias=True, input_scale=1.0,
                 input_zero_point=0, **kwargs):
        if 'input_shape' not in kwargs and 'input_dim' in kwargs:
            kwargs['input_shape'] = (kwargs.pop('input_dim'),)
        super().__init__(activation, use_bias, input_scale, input_zero_point, **kwargs)
        self.units = positive_int(type(self).__name__, 'units', units)
        self.input_spec = InputSpec(min_ndim=2)
        self.supports_masking = True

    def build(self, input_shape):
        input_dim = input_shape[-1]
        if input_dim is None:
            raise ValueError('%s: the last axis of the input must be known, got %s'
                             % (type(self).__name__, input_shape))
        self._add_weights((input_dim, self.units), self.units)
        self.input_spec = InputSpec(min_ndim=2, axes={-1: input_dim})
        self.built = True

    def call(self, inputs):
        packed, vectors = self._operands()
        op = qops.QuantizedDense(self.units, self.input_scale, self.input_zero_point,
                                 self._fused or 'linear')
        return self._finish(op(inputs, packed, vectors))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config['units'] = self.units
        return config


class _QuantizedConv(_QuantizedLayer):
    rank = None

    def __init__(self, filters, kernel_size, strides=1, padding='valid', dilation_rate=1,
                 activation=None, use_bias=True, input_scale=1.0, input_zero_point=0,
                 data_format='channels_last', **kwargs):
        super().__init__(activation, use_bias, input_scale, input_zero_point, **kwargs)
        cls = type(self).__name__
        if data_format != 'channels_last':
            raise ValueError("%s: only data_format='channels_last' runs in int8, got %r"
                             % (cls, data_format))
        allowed = ('valid', 'same', 'causal') if self.rank == 1 else ('valid', 'same')
        if padding not in allowed:
            raise ValueError('%s: padding must be one of %s, got %r' % (cls, allowed, padding))
        self.filters = positive_int(cls, 'filters', filters)
        self.kernel_size = int_tuple(cls, 'kernel_size', kernel_size, self.rank)
        self.strides = int_tuple(cls, 'strides', strides, self.rank)
        self.dilation_rate = int_tuple(cls, 'dilation_rate', dilation_rate, self.rank)
        self.padding = padding
        self.data_format = 'channels_last'
        self.input_spec = InputSpec(ndim=self.rank + 2)

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels is None:
            raise ValueError('%s: the channel axis of the input must be known, got %s'
                             % (type(self).__name__, input_shape))
        self._add_weights(self.kernel_size + (channels, self.filters), self.filters)
        self.input_spec = InputSpec(ndim=self.rank + 2, axes={-1: channels})
        self.built = True

    def call(self, inputs):
        packed, vectors = self._operands()
        op = qops.QuantizedConv(self.rank, self.filters, self.kernel_size, self.strides,
                                self.dilation_rate, self.padding, self.input_scale,
                                self.input_zero_point, self._fused or 'linear')
        return self._finish(op(inputs, packed, vectors))

    def compute_output_shape(self, input_shape):
        spatial = tuple(conv_utils.conv_output_length(n, k, s, d, self.padding)
                        for n, k, s, d in zip(input_shape[1:-1], self.kernel_size,
                                              self.strides, self.dilation_rate))
        return (input_shape[0],) + spatial + (self.filters,)

    def get_config(self):
        config = super().get_config()
        config.update({
            'filters': self.filters,
            'kernel_size': self.kernel_size,
            'strides': self.strides,
            'padding': self.padding,
            'dilation_rate': self.dilation_rate,
            'data_format': self.data_format,
        })
        return config


class QuantizedConv1D(_QuantizedConv):
    """``Conv1D`` (channels_last; 'valid', 'same' or 'causal') in int8.
    Weights: ``kernel`` int8 (kernel_size, channels, filters),
    ``kernel_scale`` float32 (filters,), ``bias`` float32 (filters,)."""

    rank = 1


class QuantizedConv2D(_QuantizedConv):
    """``Conv2D`` (channels_last; 'valid' or 'same') in int8. Weights:
    ``kernel`` int8 (kh, kw, channels, filters), ``kernel_scale`` float32
    (filters,), ``bias`` float32 (filters,)."""

    rank = 2


LAYERS = {cls.__name__: cls for cls in (QuantizedDense, QuantizedConv1D, QuantizedConv2D)}
LAYERS.update(RECURRENT_LAYERS)


def custom_objects():
    """Name -> class of the int8 layers, and of cyback.layers' layers and
    activations (which the float model may have used: relu6, gelu, ...), for
    loading a saved quantized model. A new dict each call."""
    objects = _layer_objects()
    objects.update(LAYERS)
    return objects
