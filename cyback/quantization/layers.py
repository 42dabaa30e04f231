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

__all__ = ['QuantizedDense', 'QuantizedConv1D', 'QuantizedConv2D', 'QuantizedConv3D',
           'QuantizedDepthwiseConv2D', 'QuantizedSeparableConv2D', 'LAYERS', 'custom_objects']


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


def _channels_last_around(op, data_format, x, *operands):
    """``op`` (a channels_last int8 product) on a channels_first x: the
    input moved to channels_last before it and the output back after (the
    int8 kernels read channels fastest)."""
    if data_format != 'channels_first':
        return op(x, *operands)
    n = K.ndim(x)
    y = op(K.permute_dimensions(x, (0,) + tuple(range(2, n)) + (1,)), *operands)
    return K.permute_dimensions(y, (0, n - 1) + tuple(range(1, n - 1)))


class _QuantizedConv(_QuantizedLayer):
    rank = None

    def __init__(self, filters, kernel_size, strides=1, padding='valid', dilation_rate=1,
                 activation=None, use_bias=True, input_scale=1.0, input_zero_point=0,
                 data_format='channels_last', **kwargs):
        super().__init__(activation, use_bias, input_scale, input_zero_point, **kwargs)
        cls = type(self).__name__
        if data_format not in ('channels_last', 'channels_first'):
            raise ValueError("%s: data_format must be 'channels_last' or 'channels_first', "
                             "got %r" % (cls, data_format))
        allowed = ('valid', 'same', 'causal') if self.rank == 1 else ('valid', 'same')
        if padding not in allowed:
            raise ValueError('%s: padding must be one of %s, got %r' % (cls, allowed, padding))
        self.filters = positive_int(cls, 'filters', filters)
        self.kernel_size = int_tuple(cls, 'kernel_size', kernel_size, self.rank)
        self.strides = int_tuple(cls, 'strides', strides, self.rank)
        self.dilation_rate = int_tuple(cls, 'dilation_rate', dilation_rate, self.rank)
        self.padding = padding
        self.data_format = data_format
        self.input_spec = InputSpec(ndim=self.rank + 2)

    @property
    def _channel_axis(self):
        return 1 if self.data_format == 'channels_first' else -1

    def build(self, input_shape):
        channels = input_shape[self._channel_axis]
        if channels is None:
            raise ValueError('%s: the channel axis of the input must be known, got %s'
                             % (type(self).__name__, input_shape))
        self._add_weights(self.kernel_size + (channels, self.filters), self.filters)
        self.input_spec = InputSpec(ndim=self.rank + 2, axes={self._channel_axis: channels})
        self.built = True

    def call(self, inputs):
        packed, vectors = self._operands()
        op = qops.QuantizedConv(self.rank, self.filters, self.kernel_size, self.strides,
                                self.dilation_rate, self.padding, self.input_scale,
                                self.input_zero_point, self._fused or 'linear')
        return self._finish(_channels_last_around(op, self.data_format, inputs, packed,
                                                  vectors))

    def compute_output_shape(self, input_shape):
        first = self.data_format == 'channels_first'
        sizes = input_shape[2:] if first else input_shape[1:-1]
        spatial = tuple(conv_utils.conv_output_length(n, k, s, d, self.padding)
                        for n, k, s, d in zip(sizes, self.kernel_size,
                                              self.strides, self.dilation_rate))
        if first:
            return (input_shape[0], self.filters) + spatial
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
    """``Conv1D`` ('valid', 'same' or 'causal'; channels_first through a
    transpose) in int8.
    Weights: ``kernel`` int8 (kernel_size, channels, filters),
    ``kernel_scale`` float32 (filters,), ``bias`` float32 (filters,)."""

    rank = 1


class QuantizedConv2D(_QuantizedConv):
    """``Conv2D`` ('valid' or 'same'; channels_first through a transpose) in
    int8. Weights:
    ``kernel`` int8 (kh, kw, channels, filters), ``kernel_scale`` float32
    (filters,), ``bias`` float32 (filters,)."""

    rank = 2


class QuantizedConv3D(_QuantizedConv):
    """``Conv3D`` ('valid' or 'same'; channels_first through a transpose) in
    int8, its patches formed in NumPy. Weights: ``kernel`` int8 (kd, kh, kw,
    channels, filters), ``kernel_scale`` float32 (filters,), ``bias`` float32
    (filters,)."""

    rank = 3


class QuantizedDepthwiseConv2D(_QuantizedLayer):
    """``DepthwiseConv2D`` (channels_last; 'valid' or 'same') in int8, on
    qgemm's depthwise kernel. Weights: ``kernel`` int8 (kh, kw, channels,
    depth_multiplier), ``kernel_scale`` float32 (channels * depth_multiplier,),
    ``bias`` float32 (channels * depth_multiplier,)."""

    def __init__(self, kernel_size, strides=1, padding='valid', depth_multiplier=1,
                 dilation_rate=1, activation=None, use_bias=True, input_scale=1.0,
                 input_zero_point=0, data_format='channels_last', **kwargs):
        super().__init__(activation, use_bias, input_scale, input_zero_point, **kwargs)
        _separable_args(self, kernel_size, strides, padding, depth_multiplier, dilation_rate,
                        data_format)

    def build(self, input_shape):
        channels = _known_channels(self, input_shape)
        width = channels * self.depth_multiplier
        self._add_weights(self.kernel_size + (channels, self.depth_multiplier), width)
        self.input_spec = InputSpec(ndim=4, axes={-1: channels})
        self.built = True

    def _operands(self):
        packed = qops.PackDepthwise()(self.kernel)
        vectors = qops.EpilogueVectors(self.input_scale)(
            *((self.kernel_scale,) if self.bias is None else (self.kernel_scale, self.bias)))
        return packed, vectors

    def call(self, inputs):
        packed, vectors = self._operands()
        op = qops.QuantizedDepthwiseConv(self.kernel_size, self.strides, self.dilation_rate,
                                         self.padding, self.depth_multiplier, self.input_scale,
                                         self.input_zero_point, self._fused or 'linear')
        return self._finish(op(inputs, packed, vectors))

    def compute_output_shape(self, input_shape):
        return _separable_output_shape(self, input_shape,
                                       input_shape[-1] * self.depth_multiplier)

    def get_config(self):
        config = super().get_config()
        config.update(_separable_config(self))
        return config


class QuantizedSeparableConv2D(_QuantizedLayer):
    """``SeparableConv2D`` (channels_last; 'valid' or 'same') in int8: the
    depthwise convolution on qgemm's depthwise kernel, its result requantized
    in that kernel's epilogue to uint8 codes of (``depthwise_output_scale``,
    ``depthwise_output_zero_point``), calibrated on the float layer's
    depthwise result, then the 1x1 pointwise product on qgemm's GEMM with the
    bias and activation. Weights: ``depthwise_kernel`` int8 (kh, kw,
    channels, depth_multiplier), ``depthwise_scale`` float32 (channels *
    depth_multiplier,), ``pointwise_kernel`` int8 (1, 1, channels *
    depth_multiplier, filters), ``pointwise_scale`` float32 (filters,),
    ``bias`` float32 (filters,)."""

    def __init__(self, filters, kernel_size, strides=1, padding='valid', depth_multiplier=1,
                 dilation_rate=1, activation=None, use_bias=True, input_scale=1.0,
                 input_zero_point=0, depthwise_output_scale=1.0, depthwise_output_zero_point=0,
                 data_format='channels_last', **kwargs):
        super().__init__(activation, use_bias, input_scale, input_zero_point, **kwargs)
        cls = type(self).__name__
        self.filters = positive_int(cls, 'filters', filters)
        _separable_args(self, kernel_size, strides, padding, depth_multiplier, dilation_rate,
                        data_format)
        check_quantization(cls + ' (depthwise output)', depthwise_output_scale,
                           depthwise_output_zero_point)
        self.depthwise_output_scale = float(depthwise_output_scale)
        self.depthwise_output_zero_point = int(depthwise_output_zero_point)

    def build(self, input_shape):
        channels = _known_channels(self, input_shape)
        width = channels * self.depth_multiplier
        self.depthwise_kernel = self.add_weight(
            name='depthwise_kernel', shape=self.kernel_size + (channels, self.depth_multiplier),
            dtype='int8', initializer='zeros', trainable=False)
        self.depthwise_scale = self.add_weight(name='depthwise_scale', shape=(width,),
                                               dtype='float32', initializer='ones',
                                               trainable=False)
        self.pointwise_kernel = self.add_weight(name='pointwise_kernel',
                                                shape=(1, 1, width, self.filters), dtype='int8',
                                                initializer='zeros', trainable=False)
        self.pointwise_scale = self.add_weight(name='pointwise_scale', shape=(self.filters,),
                                               dtype='float32', initializer='ones',
                                               trainable=False)
        self.bias = self.add_weight(name='bias', shape=(self.filters,), dtype='float32',
                                    initializer='zeros', trainable=False) \
            if self.use_bias else None
        self.input_spec = InputSpec(ndim=4, axes={-1: channels})
        self.built = True

    def call(self, inputs):
        dw_packed = qops.PackDepthwise()(self.depthwise_kernel)
        dw_vectors = qops.EpilogueVectors(self.input_scale)(self.depthwise_scale)
        pw_packed = qops.PackInt8()(self.pointwise_kernel)
        pw_vectors = qops.EpilogueVectors(self.depthwise_output_scale)(
            *((self.pointwise_scale,) if self.bias is None else
              (self.pointwise_scale, self.bias)))
        op = qops.QuantizedDepthwiseConv(
            self.kernel_size, self.strides, self.dilation_rate, self.padding,
            self.depth_multiplier, self.input_scale, self.input_zero_point,
            self._fused or 'linear', pointwise=self.filters,
            mid_scale=self.depthwise_output_scale, mid_zero=self.depthwise_output_zero_point)
        return self._finish(op(inputs, dw_packed, dw_vectors, pw_packed, pw_vectors))

    def compute_output_shape(self, input_shape):
        return _separable_output_shape(self, input_shape, self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(_separable_config(self))
        config.update({'filters': self.filters,
                       'depthwise_output_scale': self.depthwise_output_scale,
                       'depthwise_output_zero_point': self.depthwise_output_zero_point})
        return config


def _separable_args(layer, kernel_size, strides, padding, depth_multiplier, dilation_rate,
                    data_format):
    cls = type(layer).__name__
    if data_format != 'channels_last':
        raise ValueError("%s: only data_format='channels_last' runs in int8, got %r"
                         % (cls, data_format))
    if padding not in ('valid', 'same'):
        raise ValueError("%s: padding must be one of ('valid', 'same'), got %r"
                         % (cls, padding))
    layer.kernel_size = int_tuple(cls, 'kernel_size', kernel_size, 2)
    layer.strides = int_tuple(cls, 'strides', strides, 2)
    layer.dilation_rate = int_tuple(cls, 'dilation_rate', dilation_rate, 2)
    layer.depth_multiplier = positive_int(cls, 'depth_multiplier', depth_multiplier)
    layer.padding = padding
    layer.data_format = data_format
    layer.input_spec = InputSpec(ndim=4)


def _known_channels(layer, input_shape):
    channels = input_shape[-1]
    if channels is None:
        raise ValueError('%s: the channel axis of the input must be known, got %s'
                         % (type(layer).__name__, input_shape))
    return channels


def _separable_output_shape(layer, input_shape, width):
    spatial = tuple(conv_utils.conv_output_length(n, k, s, d, layer.padding)
                    for n, k, s, d in zip(input_shape[1:3], layer.kernel_size, layer.strides,
                                          layer.dilation_rate))
    return (input_shape[0],) + spatial + (width,)


def _separable_config(layer):
    return {'kernel_size': layer.kernel_size, 'strides': layer.strides,
            'padding': layer.padding, 'depth_multiplier': layer.depth_multiplier,
            'dilation_rate': layer.dilation_rate, 'data_format': layer.data_format}


LAYERS = {cls.__name__: cls for cls in (QuantizedDense, QuantizedConv1D, QuantizedConv2D,
                                        QuantizedConv3D, QuantizedDepthwiseConv2D,
                                        QuantizedSeparableConv2D)}
LAYERS.update(RECURRENT_LAYERS)


def custom_objects():
    """Name -> class of the int8 layers, and of cyback.layers' layers and
    activations (which the float model may have used: relu6, gelu, ...), for
    loading a saved quantized model. A new dict each call."""
    objects = _layer_objects()
    objects.update(LAYERS)
    return objects
