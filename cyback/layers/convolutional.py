"""The convolutions tf.keras 2.x and Keras 3 have and Keras 2.3.1 lacks: Conv1D and
Conv2D with ``groups``, Conv1DTranspose, DepthwiseConv1D; as Keras 2.3.1 layers."""
from cyback.layers import _args
from cyback.layers._keras import import_keras

keras = import_keras()
K = keras.backend
Layer = keras.engine.base_layer.Layer
InputSpec = keras.engine.base_layer.InputSpec
conv_utils = keras.utils.conv_utils
activations = keras.activations

__all__ = ['Conv1D', 'Conv2D', 'Conv1DTranspose', 'DepthwiseConv1D']


def _check_groups(cls, groups, filters):
    groups = _args.check_int(cls, 'groups', groups, minimum=1)
    if filters % groups:
        raise ValueError('%s: filters (%d) must be a multiple of groups (%d)'
                         % (cls, filters, groups))
    return groups


def _conv1d_as_2d(x, data_format):
    """(B, T, C) / (B, C, T) as a one-row image."""
    return K.expand_dims(x, 1 if data_format == 'channels_last' else 2)


def _image_row(x, data_format):
    return K.squeeze(x, 1 if data_format == 'channels_last' else 2)


def _causal_pad(x, left, data_format):
    """Left-pad the time axis of a 1-D input by ``left`` steps."""
    if left == 0:
        return x
    if data_format == 'channels_last':
        return K.temporal_padding(x, (left, 0))
    return K.permute_dimensions(
        K.temporal_padding(K.permute_dimensions(x, (0, 2, 1)), (left, 0)), (0, 2, 1))


def depthwise_conv1d(x, kernel, stride, padding, data_format, dilation):
    """Depthwise 1-D convolution of (B, T, C) by a (k, C, multiplier) kernel, through
    the 2-D depthwise convolution on a one-row image; 'causal' pads on the left."""
    if padding == 'causal':
        x = _causal_pad(x, dilation * (int(K.int_shape(kernel)[0]) - 1), data_format)
        padding = 'valid'
    out = K.depthwise_conv2d(_conv1d_as_2d(x, data_format), K.expand_dims(kernel, 0),
                             strides=(1, stride), padding=padding, data_format=data_format,
                             dilation_rate=(1, dilation))
    return _image_row(out, data_format)


class _GroupedConv:
    """Grouped convolution for Conv1D / Conv2D: the input channels split into
    ``groups`` equal groups, group g convolved with kernel[..., g * F/G:(g + 1) * F/G]
    (the kernel holds C/G input channels) into output channels g * F/G onwards.
    Mixed in before Keras's ConvND: with groups = 1 the stock layer runs."""

    def __init__(self, filters, kernel_size, groups=1, **kwargs):
        super().__init__(filters, kernel_size, **kwargs)
        self.groups = _check_groups(type(self).__name__, groups, self.filters)

    def build(self, input_shape):
        if self.groups == 1:
            return super().build(input_shape)
        self._build_grouped(input_shape)

    def call(self, inputs):
        if self.groups == 1:
            return super().call(inputs)
        return self._call_grouped(inputs)

    def get_config(self):
        config = super().get_config()
        config['groups'] = self.groups
        return config

    def _build_grouped(self, input_shape):
        cls = type(self).__name__
        channel_axis = 1 if self.data_format == 'channels_first' else -1
        channels = input_shape[channel_axis]
        if channels is None:
            raise ValueError('%s: the channel axis of the input shape %s must be known'
                             % (cls, tuple(input_shape)))
        if channels % self.groups:
            raise ValueError('%s: the number of input channels (%d) must be a multiple of '
                             'groups (%d)' % (cls, channels, self.groups))
        self.kernel = self.add_weight(
            shape=self.kernel_size + (channels // self.groups, self.filters),
            initializer=self.kernel_initializer, name='kernel',
            regularizer=self.kernel_regularizer, constraint=self.kernel_constraint)
        self.bias = self.add_weight(
            shape=(self.filters,), initializer=self.bias_initializer, name='bias',
            regularizer=self.bias_regularizer, constraint=self.bias_constraint,
        ) if self.use_bias else None
        self.input_spec = InputSpec(ndim=self.rank + 2, axes={channel_axis: channels})
        self._channels = channels
        self.built = True

    def _conv(self, x, kernel):
        if self.rank == 1:
            return K.conv1d(x, kernel, strides=self.strides[0], padding=self.padding,
                            data_format=self.data_format, dilation_rate=self.dilation_rate[0])
        return K.conv2d(x, kernel, strides=self.strides, padding=self.padding,
                        data_format=self.data_format, dilation_rate=self.dilation_rate)

    def _call_grouped(self, inputs):
        channels, groups = self._channels, self.groups
        if groups == channels:
            # One input channel a group: a depthwise convolution with multiplier F/C,
            # whose output channel c * F/C + m is the grouped one's.
            kernel = K.reshape(self.kernel, self.kernel_size + (channels,
                                                                self.filters // channels))
            if self.rank == 1:
                out = depthwise_conv1d(inputs, kernel, self.strides[0], self.padding,
                                       self.data_format, self.dilation_rate[0])
            else:
                out = K.depthwise_conv2d(inputs, kernel, strides=self.strides,
                                         padding=self.padding, data_format=self.data_format,
                                         dilation_rate=self.dilation_rate)
        else:
            cin, cout = channels // groups, self.filters // groups
            last = self.data_format == 'channels_last'
            outs = []
            for g in range(groups):
                part = inputs[..., g * cin:(g + 1) * cin] if last else \
                    inputs[:, g * cin:(g + 1) * cin]
                outs.append(self._conv(part, self.kernel[..., g * cout:(g + 1) * cout]))
            out = K.concatenate(outs, axis=-1 if last else 1)
        if self.bias is not None:
            out = K.bias_add(out, self.bias, data_format=self.data_format)
        if self.activation is not None:
            out = self.activation(out)
        return out


class Conv2D(_GroupedConv, keras.layers.Conv2D):
    """Keras 2.3.1's Conv2D, plus tf.keras's ``groups``: with groups > 1 the kernel has
    shape (kh, kw, in_channels / groups, filters) and each group of input channels
    makes its share of the output channels (groups = channels is a depthwise
    convolution, as ConvNeXt uses). Weights: ``kernel``, then ``bias``."""


class Conv1D(_GroupedConv, keras.layers.Conv1D):
    """Keras 2.3.1's Conv1D, plus tf.keras's ``groups``; see Conv2D. Weights: ``kernel``
    (k, in_channels / groups, filters), then ``bias`` (filters,)."""


class _Conv1DBase(Layer):
    """Arguments shared by Conv1DTranspose and DepthwiseConv1D."""

    def _set_common(self, kernel_size, strides, padding, data_format, dilation_rate,
                    activation, use_bias, bias_initializer, bias_regularizer,
                    activity_regularizer, bias_constraint, paddings):
        cls = type(self).__name__
        self.kernel_size = _args.int_tuple(cls, 'kernel_size', kernel_size, 1)
        self.strides = _args.int_tuple(cls, 'strides', strides, 1)
        self.dilation_rate = _args.int_tuple(cls, 'dilation_rate', dilation_rate, 1)
        if not isinstance(padding, str) or padding.lower() not in paddings:
            raise ValueError('%s: padding must be one of %s, got %r'
                             % (cls, ', '.join(paddings), padding))
        self.padding = padding.lower()
        self.data_format = K.normalize_data_format(data_format)
        self.activation = activations.get(activation)
        self.use_bias = _args.check_bool(cls, 'use_bias', use_bias)
        _args.set_weight_args(self, bias_initializer=bias_initializer,
                              bias_regularizer=bias_regularizer,
                              activity_regularizer=activity_regularizer,
                              bias_constraint=bias_constraint)
        self.input_spec = InputSpec(ndim=3)

    def _channels(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError('%s: expected an input of rank 3, got shape %s'
                             % (type(self).__name__, tuple(input_shape)))
        axis = 1 if self.data_format == 'channels_first' else -1
        channels = input_shape[axis]
        if channels is None:
            raise ValueError('%s: the channel axis of the input shape %s must be known'
                             % (type(self).__name__, tuple(input_shape)))
        return axis, channels

    def _finish(self, out):
        if self.bias is not None:
            out = K.bias_add(out, self.bias, data_format=self.data_format)
        if self.activation is not None:
            out = self.activation(out)
        return out

    def _common_config(self):
        return {
            'kernel_size': self.kernel_size, 'strides': self.strides, 'padding': self.padding,
            'data_format': self.data_format, 'dilation_rate': self.dilation_rate,
            'activation': activations.serialize(self.activation), 'use_bias': self.use_bias,
            **_args.weight_args_config(self, 'bias_initializer', 'bias_regularizer',
                                       'activity_regularizer', 'bias_constraint'),
        }

    def _time_axis(self):
        return 2 if self.data_format == 'channels_first' else 1


class DepthwiseConv1D(_Conv1DBase):
    """Depthwise 1-D convolution: each input channel c convolved with its own
    ``depth_multiplier`` filters into output channels ``c * depth_multiplier + m``.
    ``padding``: 'valid', 'same' or 'causal'.

    Weights (as tf.keras 2.x): ``depthwise_kernel`` (kernel_size, channels,
    depth_multiplier), then ``bias`` (channels * depth_multiplier,).
    """

    def __init__(self, kernel_size, strides=1, padding='valid', depth_multiplier=1,
                 data_format=None, dilation_rate=1, activation=None, use_bias=True,
                 depthwise_initializer='glorot_uniform', bias_initializer='zeros',
                 depthwise_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 depthwise_constraint=None, bias_constraint=None, **kwargs):
        super().__init__(**kwargs)
        self._set_common(kernel_size, strides, padding, data_format, dilation_rate,
                         activation, use_bias, bias_initializer, bias_regularizer,
                         activity_regularizer, bias_constraint, ('valid', 'same', 'causal'))
        cls = type(self).__name__
        if self.strides[0] > 1 and self.dilation_rate[0] > 1:
            raise ValueError('%s: strides > 1 and dilation_rate > 1 cannot be combined'
                             % cls)
        self.depth_multiplier = _args.check_int(cls, 'depth_multiplier', depth_multiplier,
                                                minimum=1)
        _args.set_weight_args(self, depthwise_initializer=depthwise_initializer,
                              depthwise_regularizer=depthwise_regularizer,
                              depthwise_constraint=depthwise_constraint)

    def build(self, input_shape):
        axis, channels = self._channels(input_shape)
        self.depthwise_kernel = self.add_weight(
            shape=self.kernel_size + (channels, self.depth_multiplier),
            initializer=self.depthwise_initializer, name='depthwise_kernel',
            regularizer=self.depthwise_regularizer, constraint=self.depthwise_constraint)
        self.bias = self.add_weight(
            shape=(channels * self.depth_multiplier,), initializer=self.bias_initializer,
            name='bias', regularizer=self.bias_regularizer, constraint=self.bias_constraint,
        ) if self.use_bias else None
        self.input_spec = InputSpec(ndim=3, axes={axis: channels})
        self.built = True

    def call(self, inputs):
        out = depthwise_conv1d(inputs, self.depthwise_kernel, self.strides[0], self.padding,
                               self.data_format, self.dilation_rate[0])
        return self._finish(out)

    def compute_output_shape(self, input_shape):
        axis, channels = self._channels(input_shape)
        out = list(input_shape)
        t = self._time_axis()
        out[t] = conv_utils.conv_output_length(input_shape[t], self.kernel_size[0],
                                               self.padding, self.strides[0],
                                               self.dilation_rate[0])
        out[axis] = channels * self.depth_multiplier
        return tuple(out)

    def get_config(self):
        config = self._common_config()
        config.update({
            'depth_multiplier': self.depth_multiplier,
            **_args.weight_args_config(self, 'depthwise_initializer', 'depthwise_regularizer',
                                       'depthwise_constraint'),
        })
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))


class Conv1DTranspose(_Conv1DBase):
    """Transposed 1-D convolution (the gradient of Conv1D with respect to its input),
    as tf.keras's: output length ``(T - 1) * stride + k_eff - 2 * pad + output_padding``
    (``k_eff = dilation * (k - 1) + 1``; 'same' keeps ``T * stride`` without
    output_padding). ``padding``: 'valid' or 'same'.

    Weights (as tf.keras 2.x): ``kernel`` (kernel_size, filters, in_channels), then
    ``bias`` (filters,).
    """

    def __init__(self, filters, kernel_size, strides=1, padding='valid', output_padding=None,
                 data_format=None, dilation_rate=1, activation=None, use_bias=True,
                 kernel_initializer='glorot_uniform', bias_initializer='zeros',
                 kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, **kwargs):
        super().__init__(**kwargs)
        self._set_common(kernel_size, strides, padding, data_format, dilation_rate,
                         activation, use_bias, bias_initializer, bias_regularizer,
                         activity_regularizer, bias_constraint, ('valid', 'same'))
        cls = type(self).__name__
        self.filters = _args.check_int(cls, 'filters', filters, minimum=1)
        if output_padding is None:
            self.output_padding = None
        else:
            value = output_padding[0] if isinstance(output_padding, (list, tuple)) and \
                len(output_padding) == 1 else output_padding
            value = _args.check_int(cls, 'output_padding', value, minimum=0)
            if value >= self.strides[0]:
                raise ValueError('%s: output_padding (%d) must be smaller than the stride '
                                 '(%d)' % (cls, value, self.strides[0]))
            self.output_padding = (value,)
        _args.set_weight_args(self, kernel_initializer=kernel_initializer,
                              kernel_regularizer=kernel_regularizer,
                              kernel_constraint=kernel_constraint)

    def build(self, input_shape):
        axis, channels = self._channels(input_shape)
        self.kernel = self.add_weight(
            shape=self.kernel_size + (self.filters, channels),
            initializer=self.kernel_initializer, name='kernel',
            regularizer=self.kernel_regularizer, constraint=self.kernel_constraint)
        self.bias = self.add_weight(
            shape=(self.filters,), initializer=self.bias_initializer, name='bias',
            regularizer=self.bias_regularizer, constraint=self.bias_constraint,
        ) if self.use_bias else None
        self.input_spec = InputSpec(ndim=3, axes={axis: channels})
        self.built = True

    def _length(self, length):
        return conv_utils.deconv_length(
            length, self.strides[0], self.kernel_size[0], self.padding,
            None if self.output_padding is None else self.output_padding[0],
            self.dilation_rate[0])

    def call(self, inputs):
        shape = K.shape(inputs)
        t = self._time_axis()
        static = K.int_shape(inputs)[t]
        out_len = self._length(static if static is not None else shape[t])
        if self.data_format == 'channels_last':
            out_shape = (shape[0], 1, out_len, self.filters)
        else:
            out_shape = (shape[0], self.filters, 1, out_len)
        out = K.conv2d_transpose(_conv1d_as_2d(inputs, self.data_format),
                                 K.expand_dims(self.kernel, 0), out_shape,
                                 strides=(1, self.strides[0]), padding=self.padding,
                                 data_format=self.data_format,
                                 dilation_rate=(1, self.dilation_rate[0]))
        return self._finish(_image_row(out, self.data_format))

    def compute_output_shape(self, input_shape):
        axis, _ = self._channels(input_shape)
        out = list(input_shape)
        t = self._time_axis()
        out[t] = None if input_shape[t] is None else self._length(input_shape[t])
        out[axis] = self.filters
        return tuple(out)

    def get_config(self):
        config = self._common_config()
        config.update({
            'filters': self.filters,
            'output_padding': self.output_padding,
            **_args.weight_args_config(self, 'kernel_initializer', 'kernel_regularizer',
                                       'kernel_constraint'),
        })
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))
