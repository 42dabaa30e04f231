"""Rescaling, Normalization, Resizing and CenterCrop: the preprocessing layers that
tf.keras 2.x and Keras 3 models keep inside the model (EfficientNet, MobileNetV3,
ConvNeXt, RegNet start with them), as Keras 2.3.1 layers."""
import numbers

import numpy as np

from cyback.layers import _args
from cyback.layers._einsum import einsum
from cyback.layers._keras import import_keras

keras = import_keras()
K = keras.backend
Layer = keras.engine.base_layer.Layer

__all__ = ['Rescaling', 'Normalization', 'Resizing', 'CenterCrop', 'resize_matrix']


def _float_input(inputs, dtype):
    if K.dtype(inputs) != dtype:
        inputs = K.cast(inputs, dtype)
    return inputs


def _number_or_array(cls, name, value):
    """A number or a (nested) list of numbers, as a float64 array."""
    if isinstance(value, bool):
        raise TypeError('%s: %s must be a number or a list of numbers, got %r'
                        % (cls, name, value))
    try:
        arr = np.asarray(value, dtype='float64')
    except (TypeError, ValueError):
        raise TypeError('%s: %s must be a number or a list of numbers, got %r'
                        % (cls, name, value)) from None
    if arr.dtype == object or not np.all(np.isfinite(arr)):
        raise ValueError('%s: %s must be finite numbers, got %r' % (cls, name, value))
    return arr


def _config_value(arr):
    return float(arr) if arr.ndim == 0 else arr.tolist()


def _data_format(cls, data_format):
    if data_format is None:
        return K.image_data_format()
    return _args.check_choice(cls, 'data_format', data_format,
                              ('channels_last', 'channels_first'))


class Rescaling(Layer):
    """``inputs * scale + offset``, in the layer's float dtype (integer images become
    floats). ``scale`` and ``offset`` are numbers or per-channel lists (Keras 3), which
    broadcast against the last axis (the channel axis under channels_first, as Keras 3
    does). No weights; passes masks through.
    """

    def __init__(self, scale, offset=0.0, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        self._scale = _number_or_array(cls, 'scale', scale)
        self._offset = _number_or_array(cls, 'offset', offset)
        self.scale, self.offset = _config_value(self._scale), _config_value(self._offset)
        self.supports_masking = True

    def _channel_shaped(self, arr, ndim):
        if arr.ndim > 0 and K.image_data_format() == 'channels_first' and ndim >= 3:
            return arr.reshape(arr.shape + (1,) * (ndim - 2 - arr.ndim))
        return arr

    def call(self, inputs):
        x = _float_input(inputs, self.dtype)
        ndim = K.ndim(x)
        scale = self._channel_shaped(self._scale, ndim)
        offset = self._channel_shaped(self._offset, ndim)
        out = x * (float(scale) if scale.ndim == 0 else K.constant(scale, dtype=self.dtype))
        if offset.ndim or float(offset) != 0.0:
            out = out + (float(offset) if offset.ndim == 0
                         else K.constant(offset, dtype=self.dtype))
        return out

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        base = super().get_config()
        return dict(list(base.items()) + [('scale', self.scale), ('offset', self.offset)])


class Normalization(Layer):
    """Feature-wise ``(inputs - mean) / max(sqrt(variance), epsilon)`` over the kept
    ``axis`` (an int, a list, or None for one scalar mean); ``invert=True`` applies the
    inverse, ``mean + inputs * max(sqrt(variance), epsilon)``. epsilon is the backend's
    (``K.epsilon()``, 1e-7 by default, as tf.keras).

    With ``mean`` and ``variance`` given (numbers or arrays broadcastable to the kept
    axes, as a config stores them) the layer has no weights. Without them it holds the
    adapted state as tf.keras 2.x and Keras 3 save it: non-trainable weights, in this
    order, ``mean`` and ``variance`` of shape ``tuple(input_shape[a] for a in axis)``
    (zeros and ones until set), and ``count`` (int64, shape ()). ``adapt(data)`` sets
    them from a NumPy array.
    """

    def __init__(self, axis=-1, mean=None, variance=None, invert=False, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        if axis is None:
            axis = ()
        elif isinstance(axis, (list, tuple)):
            axis = tuple(_args.check_int(cls, 'axis', a) for a in axis)
        else:
            axis = (_args.check_int(cls, 'axis', axis),)
        self.axis = axis
        if (mean is None) != (variance is None):
            raise ValueError('%s: give both mean and variance, or neither (got mean=%r, '
                             'variance=%r)' % (cls, mean, variance))
        self._mean_arg = None if mean is None else _number_or_array(cls, 'mean', mean)
        self._variance_arg = None if variance is None else _number_or_array(
            cls, 'variance', variance)
        if self._variance_arg is not None and np.any(self._variance_arg < 0):
            raise ValueError('%s: variance must not be negative' % cls)
        self.invert = _args.check_bool(cls, 'invert', invert)
        self.supports_masking = True

    def build(self, input_shape):
        cls = type(self).__name__
        ndim = len(input_shape)
        keep = []
        for a in self.axis:
            if not -ndim <= a < ndim:
                raise ValueError('%s: axis %d is out of range for an input of rank %d'
                                 % (cls, a, ndim))
            keep.append(a % ndim)
        if len(set(keep)) != len(keep):
            raise ValueError('%s: axis %r names an axis twice' % (cls, self.axis))
        keep = sorted(keep)
        for a in keep:
            if input_shape[a] is None:
                raise ValueError('%s: the kept axis %d of the input shape %s must be known'
                                 % (cls, a, tuple(input_shape)))
        self._keep = keep
        self._reduce = [a for a in range(ndim) if a not in keep]
        self._broadcast_shape = tuple(input_shape[a] if a in keep else 1 for a in range(ndim))
        shape = tuple(input_shape[a] for a in keep)
        if self._mean_arg is None:
            self.adapt_mean = self.add_weight(name='mean', shape=shape, initializer='zeros',
                                              trainable=False)
            self.adapt_variance = self.add_weight(name='variance', shape=shape,
                                                  initializer='ones', trainable=False)
            self.count = self.add_weight(name='count', shape=(), dtype='int64',
                                         initializer='zeros', trainable=False)
        else:
            try:
                mean = np.broadcast_to(self._mean_arg, shape)
                variance = np.broadcast_to(self._variance_arg, shape)
            except ValueError:
                raise ValueError('%s: mean %s and variance %s do not broadcast to the kept '
                                 'axes\' shape %s' % (cls, self._mean_arg.shape,
                                                       self._variance_arg.shape,
                                                       shape)) from None
            self._mean_const = mean.reshape(self._broadcast_shape)
            self._variance_const = variance.reshape(self._broadcast_shape)
        self.built = True

    def _moments(self):
        if self._mean_arg is not None:
            return (K.constant(self._mean_const, dtype=self.dtype),
                    K.constant(self._variance_const, dtype=self.dtype))
        if self._keep == [len(self._broadcast_shape) - 1]:
            return self.adapt_mean, self.adapt_variance
        return (K.reshape(self.adapt_mean, self._broadcast_shape),
                K.reshape(self.adapt_variance, self._broadcast_shape))

    def call(self, inputs):
        x = _float_input(inputs, self.dtype)
        mean, variance = self._moments()
        std = K.maximum(K.sqrt(variance), K.epsilon())
        if self.invert:
            return mean + x * std
        return (x - mean) / std

    def adapt(self, data):
        """Set ``mean``, ``variance`` and ``count`` from a NumPy array of samples."""
        cls = type(self).__name__
        if self._mean_arg is not None:
            raise ValueError('%s: adapt() needs a layer built without mean and variance'
                             % cls)
        data = np.asarray(data, dtype='float64')
        if not self.built:
            self.build((None,) + data.shape[1:])
        if data.ndim != len(self._broadcast_shape):
            raise ValueError('%s: adapt() got data of rank %d, the layer was built for rank '
                             '%d' % (cls, data.ndim, len(self._broadcast_shape)))
        axes = tuple(self._reduce)
        shape = tuple(data.shape[a] for a in self._keep)
        mean = data.mean(axis=axes).reshape(shape)
        variance = data.var(axis=axes).reshape(shape)
        count = int(np.prod([data.shape[a] for a in axes])) if axes else 1
        K.batch_set_value([(self.adapt_mean, mean), (self.adapt_variance, variance),
                           (self.count, np.array(count, dtype='int64'))])

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {
            'axis': list(self.axis) if len(self.axis) != 1 else self.axis[0],
            'mean': None if self._mean_arg is None else _config_value(self._mean_arg),
            'variance': None if self._variance_arg is None else _config_value(
                self._variance_arg),
            'invert': self.invert,
        }
        if not self.axis:
            config['axis'] = None
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))


def resize_matrix(in_size, out_size, interpolation):
    """(out_size, in_size) matrix taking a signal of ``in_size`` samples to ``out_size``,
    with half-pixel centres as TensorFlow 2's ``tf.image.resize`` (no antialiasing):
    output sample o reads input position ``(o + 0.5) * in / out - 0.5``."""
    m = np.zeros((out_size, in_size), dtype='float64')
    scale = in_size / out_size
    rows = np.arange(out_size)
    if interpolation == 'nearest':
        src = np.minimum(np.floor((rows + 0.5) * scale).astype(int), in_size - 1)
        m[rows, src] = 1.0
        return m
    pos = (rows + 0.5) * scale - 0.5
    lo = np.floor(pos)
    frac = pos - lo
    lo = lo.astype(int)
    i0 = np.clip(lo, 0, in_size - 1)
    i1 = np.clip(lo + 1, 0, in_size - 1)
    np.add.at(m, (rows, i0), 1.0 - frac)
    np.add.at(m, (rows, i1), frac)
    return m


def _aspect_crop(height, width, target_h, target_w):
    """(top, left, crop height, crop width): the largest centred window of the target's
    aspect ratio, as tf.keras's smart_resize picks it."""
    crop_h = min(height, int(float(width * target_h) / target_w))
    crop_w = min(width, int(float(height * target_w) / target_h))
    return (int(float(height - crop_h) / 2), int(float(width - crop_w) / 2), crop_h, crop_w)


class _ImageLayer(Layer):
    """Shared by Resizing and CenterCrop: a batch of images, (batch, height, width,
    channels) or, with channels_first, (batch, channels, height, width)."""

    def _image_axes(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError('%s: expected a batch of images of rank 4, got shape %s'
                             % (type(self).__name__, tuple(input_shape)))
        return (2, 3) if self.data_format == 'channels_first' else (1, 2)

    def _crop(self, x, top, left, height, width):
        h_axis, _ = self._axes
        if h_axis == 1:
            return x[:, top:top + height, left:left + width, :]
        return x[:, :, top:top + height, left:left + width]

    def _resize(self, x, in_h, in_w, interpolation):
        """x's spatial size (in_h, in_w) resized to (self.height, self.width): a product
        with a constant interpolation matrix along each spatial axis."""
        wh = K.constant(resize_matrix(in_h, self.height, interpolation), dtype=self.dtype)
        ww = K.constant(resize_matrix(in_w, self.width, interpolation), dtype=self.dtype)
        if self._axes == (1, 2):
            x = einsum(K, 'bhwc,yh->bywc', x, wh)
            return einsum(K, 'bywc,xw->byxc', x, ww)
        x = einsum(K, 'bchw,yh->bcyw', x, wh)
        return einsum(K, 'bcyw,xw->bcyx', x, ww)

    def _smart_resize(self, x, in_h, in_w):
        top, left, crop_h, crop_w = _aspect_crop(in_h, in_w, self.height, self.width)
        if (crop_h, crop_w) != (in_h, in_w):
            x = self._crop(x, top, left, crop_h, crop_w)
        return self._resize(x, crop_h, crop_w, 'bilinear')

    def compute_output_shape(self, input_shape):
        axes = self._image_axes(input_shape)
        out = list(input_shape)
        out[axes[0]], out[axes[1]] = self.height, self.width
        return tuple(out)


class Resizing(_ImageLayer):
    """Resize a batch of images to ``(height, width)``, as tf.keras 2.x / Keras 3 with
    ``antialias=False``: ``interpolation`` 'bilinear' or 'nearest' (half-pixel centres,
    as TensorFlow 2). ``crop_to_aspect_ratio=True`` first crops the largest centred
    window of the target's aspect ratio; Keras 3's ``pad_to_aspect_ratio=True`` pads
    the image symmetrically with ``fill_value`` to that aspect ratio instead.
    ``data_format``: None (the backend's image_data_format), 'channels_last' or
    'channels_first'.

    The input's height and width must be known when the layer is built (the
    interpolation is a product with constant matrices). Other interpolations
    ('bicubic', 'area', 'lanczos3', ...) and ``antialias=True`` are refused. No weights.
    """

    INTERPOLATIONS = ('bilinear', 'nearest')

    def __init__(self, height, width, interpolation='bilinear', crop_to_aspect_ratio=False,
                 pad_to_aspect_ratio=False, fill_mode='constant', fill_value=0.0,
                 antialias=False, data_format=None, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        self.height = _args.check_int(cls, 'height', height, minimum=1)
        self.width = _args.check_int(cls, 'width', width, minimum=1)
        if interpolation not in self.INTERPOLATIONS:
            raise ValueError('%s: interpolation %r is not supported (supported: %s)'
                             % (cls, interpolation, ', '.join(self.INTERPOLATIONS)))
        self.interpolation = interpolation
        self.crop_to_aspect_ratio = _args.check_bool(cls, 'crop_to_aspect_ratio',
                                                     crop_to_aspect_ratio)
        self.pad_to_aspect_ratio = _args.check_bool(cls, 'pad_to_aspect_ratio',
                                                    pad_to_aspect_ratio)
        if self.crop_to_aspect_ratio and self.pad_to_aspect_ratio:
            raise ValueError('%s: crop_to_aspect_ratio and pad_to_aspect_ratio cannot both '
                             'be True' % cls)
        if fill_mode != 'constant':
            raise ValueError("%s: fill_mode must be 'constant', got %r" % (cls, fill_mode))
        self.fill_mode = fill_mode
        self.fill_value = _args.check_number(cls, 'fill_value', fill_value)
        if antialias:
            raise ValueError('%s: antialias=True is not supported' % cls)
        self.antialias = False
        self.data_format = _data_format(cls, data_format)

    def build(self, input_shape):
        cls = type(self).__name__
        self._axes = self._image_axes(input_shape)
        in_h, in_w = input_shape[self._axes[0]], input_shape[self._axes[1]]
        if in_h is None or in_w is None:
            raise ValueError('%s: the input height and width must be known (got shape %s)'
                             % (cls, tuple(input_shape)))
        self.built = True

    def _pad(self, x, in_h, in_w):
        """Pad with fill_value towards the target aspect ratio, as Keras 3 does: the same
        number of rows (columns) on both sides, half the missing amount rounded down."""
        top = (max(in_h, int(float(in_w * self.height) / self.width)) - in_h) // 2
        left = (max(in_w, int(float(in_h * self.width) / self.height)) - in_w) // 2
        if top == 0 and left == 0:
            return x, in_h, in_w
        # Pad (x - fill) with zeros, then add fill back.
        padded = K.spatial_2d_padding(x - self.fill_value, padding=((top, top), (left, left)),
                                      data_format=self.data_format)
        return padded + self.fill_value, in_h + 2 * top, in_w + 2 * left

    def call(self, inputs):
        x = _float_input(inputs, self.dtype)
        shape = K.int_shape(x)
        in_h, in_w = shape[self._axes[0]], shape[self._axes[1]]
        if self.crop_to_aspect_ratio:
            top, left, in_h2, in_w2 = _aspect_crop(in_h, in_w, self.height, self.width)
            if (in_h2, in_w2) != (in_h, in_w):
                x = self._crop(x, top, left, in_h2, in_w2)
            in_h, in_w = in_h2, in_w2
        elif self.pad_to_aspect_ratio:
            x, in_h, in_w = self._pad(x, in_h, in_w)
        if (in_h, in_w) == (self.height, self.width):
            return x
        return self._resize(x, in_h, in_w, self.interpolation)

    def get_config(self):
        config = {'height': self.height, 'width': self.width,
                  'interpolation': self.interpolation,
                  'crop_to_aspect_ratio': self.crop_to_aspect_ratio,
                  'pad_to_aspect_ratio': self.pad_to_aspect_ratio,
                  'fill_mode': self.fill_mode, 'fill_value': self.fill_value,
                  'antialias': self.antialias, 'data_format': self.data_format}
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))


class CenterCrop(_ImageLayer):
    """Crop the central ``(height, width)`` window of a batch of images; an image smaller
    than that (in either dimension) is instead resized to it as tf.keras does
    (centre-cropped to the target's aspect ratio, then bilinear). With an unknown input
    size the layer crops, and the input must then be at least the target size.
    ``data_format`` as Resizing's. No weights.
    """

    def __init__(self, height, width, data_format=None, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        self.height = _args.check_int(cls, 'height', height, minimum=1)
        self.width = _args.check_int(cls, 'width', width, minimum=1)
        self.data_format = _data_format(cls, data_format)

    def build(self, input_shape):
        self._axes = self._image_axes(input_shape)
        self.built = True

    def call(self, inputs):
        x = _float_input(inputs, self.dtype)
        static = K.int_shape(x)
        in_h, in_w = static[self._axes[0]], static[self._axes[1]]
        known = isinstance(in_h, numbers.Integral) and isinstance(in_w, numbers.Integral)
        if known and (in_h < self.height or in_w < self.width):
            return self._smart_resize(x, in_h, in_w)
        if known:
            return self._crop(x, (in_h - self.height) // 2, (in_w - self.width) // 2,
                              self.height, self.width)
        dynamic = K.shape(x)
        top = (dynamic[self._axes[0]] - self.height) // 2
        left = (dynamic[self._axes[1]] - self.width) // 2
        return self._crop(x, top, left, self.height, self.width)

    def get_config(self):
        config = {'height': self.height, 'width': self.width, 'data_format': self.data_format}
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))
