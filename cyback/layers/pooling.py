"""Global poolings with tf.keras 2.x / Keras 3's ``keepdims``, as Keras 2.3.1 layers
(same class names, so configs with or without ``keepdims`` load)."""
from cyback.layers import _args
from cyback.layers._keras import import_keras

keras = import_keras()
K = keras.backend
Layer = keras.engine.base_layer.Layer
InputSpec = keras.engine.base_layer.InputSpec

__all__ = [
    'GlobalAveragePooling1D', 'GlobalAveragePooling2D', 'GlobalAveragePooling3D',
    'GlobalMaxPooling1D', 'GlobalMaxPooling2D', 'GlobalMaxPooling3D',
]


class _GlobalPooling(Layer):
    """Mean or max over every spatial axis; ``keepdims=True`` keeps them as size 1.
    ``data_format``: None (the backend's image_data_format), 'channels_last' or
    'channels_first'. No weights; the output has no mask."""

    rank = None
    mode = None

    def __init__(self, data_format=None, keepdims=False, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        if data_format is not None:
            _args.check_choice(cls, 'data_format', data_format,
                               ('channels_last', 'channels_first'))
        self.data_format = K.normalize_data_format(data_format)
        self.keepdims = _args.check_bool(cls, 'keepdims', keepdims)
        self.input_spec = InputSpec(ndim=self.rank + 2)

    def _spatial_axes(self):
        first = 1 if self.data_format == 'channels_last' else 2
        return list(range(first, first + self.rank))

    def call(self, inputs):
        axes = self._spatial_axes()
        if self.mode == 'max':
            return K.max(inputs, axis=axes, keepdims=self.keepdims)
        return K.mean(inputs, axis=axes, keepdims=self.keepdims)

    def compute_output_shape(self, input_shape):
        axes = self._spatial_axes()
        if self.keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(input_shape))
        return tuple(d for i, d in enumerate(input_shape) if i not in axes)

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        base = super().get_config()
        return dict(list(base.items()) + [('data_format', self.data_format),
                                          ('keepdims', self.keepdims)])


class GlobalAveragePooling1D(_GlobalPooling):
    """Mean over the steps; with a Keras mask (batch, steps), the mean of the unmasked
    steps only, as tf.keras computes it. No weights."""

    rank, mode = 1, 'mean'

    def __init__(self, data_format='channels_last', keepdims=False, **kwargs):
        super().__init__(data_format=data_format, keepdims=keepdims, **kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is None:
            return super().call(inputs)
        steps = self._spatial_axes()[0]
        weights = K.expand_dims(K.cast(mask, K.dtype(inputs)), 2 if steps == 1 else 1)
        return (K.sum(inputs * weights, axis=steps, keepdims=self.keepdims) /
                K.sum(weights, axis=steps, keepdims=self.keepdims))


class GlobalMaxPooling1D(_GlobalPooling):
    """Max over the steps (keepdims: (batch, 1, channels)). No weights."""

    rank, mode = 1, 'max'

    def __init__(self, data_format='channels_last', keepdims=False, **kwargs):
        super().__init__(data_format=data_format, keepdims=keepdims, **kwargs)


class GlobalAveragePooling2D(_GlobalPooling):
    """Mean over height and width. No weights."""

    rank, mode = 2, 'mean'


class GlobalMaxPooling2D(_GlobalPooling):
    """Max over height and width. No weights."""

    rank, mode = 2, 'max'


class GlobalAveragePooling3D(_GlobalPooling):
    """Mean over the three spatial axes. No weights."""

    rank, mode = 3, 'mean'


class GlobalMaxPooling3D(_GlobalPooling):
    """Max over the three spatial axes. No weights."""

    rank, mode = 3, 'max'
