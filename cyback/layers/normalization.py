"""LayerNormalization, GroupNormalization and UnitNormalization (tf.keras 2.x /
Keras 3 semantics) as Keras 2.3.1 layers."""
from cyback.layers import _args
from cyback.layers._keras import import_keras
from cyback.ops.normalization import layer_norm

keras = import_keras()
K = keras.backend
Layer = keras.engine.base_layer.Layer
InputSpec = keras.engine.base_layer.InputSpec

__all__ = ['LayerNormalization', 'GroupNormalization', 'UnitNormalization']


def _broadcast_param(param, ndim, axes, full_shape):
    """A weight of shape ``full_shape[axes]`` reshaped to broadcast against a rank-``ndim``
    input (a no-op when it already does: the last axis alone)."""
    if axes == [ndim - 1]:
        return param
    shape = [1] * ndim
    for a in axes:
        shape[a] = full_shape[a]
    return K.reshape(param, tuple(shape))


class _WeightArgs:
    """The initializer/regularizer/constraint arguments of gamma and beta."""

    def _set_weight_args(self, beta_initializer, gamma_initializer, beta_regularizer,
                         gamma_regularizer, beta_constraint, gamma_constraint):
        _args.set_weight_args(
            self, beta_initializer=beta_initializer, gamma_initializer=gamma_initializer,
            beta_regularizer=beta_regularizer, gamma_regularizer=gamma_regularizer,
            beta_constraint=beta_constraint, gamma_constraint=gamma_constraint)

    def _weight_args_config(self):
        return _args.weight_args_config(
            self, 'beta_initializer', 'gamma_initializer', 'beta_regularizer',
            'gamma_regularizer', 'beta_constraint', 'gamma_constraint')

    def _add_gamma_beta(self, shape, gamma, beta):
        self.gamma = self.add_weight(
            name='gamma', shape=shape, initializer=self.gamma_initializer,
            regularizer=self.gamma_regularizer, constraint=self.gamma_constraint,
        ) if gamma else None
        self.beta = self.add_weight(
            name='beta', shape=shape, initializer=self.beta_initializer,
            regularizer=self.beta_regularizer, constraint=self.beta_constraint,
        ) if beta else None


class LayerNormalization(_WeightArgs, Layer):
    """Normalize each sample over ``axis`` to mean 0 and variance 1, then scale by
    ``gamma`` and shift by ``beta``:
    ``(x - mean) / sqrt(var + epsilon) * gamma + beta``.

    ``axis``: an int or a list of ints (the normalized axes; not the batch axis).
    ``rms_scaling`` (Keras 3 only; deprecated there): ``x / sqrt(var + epsilon) * gamma``,
    no centering and no ``beta``, as Keras 3 computes it.

    Weights, in creation order (as tf.keras 2.x): ``gamma`` (if ``scale`` or
    ``rms_scaling``) and ``beta`` (if ``center`` and not ``rms_scaling``), each of shape
    ``tuple(input_shape[a] for a in sorted(axis))``; with the default axis=-1 that is
    ``(channels,)``. Passes masks through unchanged.
    """

    def __init__(self, axis=-1, epsilon=1e-3, center=True, scale=True,
                 beta_initializer='zeros', gamma_initializer='ones',
                 beta_regularizer=None, gamma_regularizer=None,
                 beta_constraint=None, gamma_constraint=None, rms_scaling=False, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        self.axis = _args.check_axis_arg(cls, axis)
        self.epsilon = _args.check_number(cls, 'epsilon', epsilon, minimum=0.0)
        self.center = _args.check_bool(cls, 'center', center)
        self.scale = _args.check_bool(cls, 'scale', scale)
        self.rms_scaling = _args.check_bool(cls, 'rms_scaling', rms_scaling)
        self._set_weight_args(beta_initializer, gamma_initializer, beta_regularizer,
                              gamma_regularizer, beta_constraint, gamma_constraint)
        self.supports_masking = True

    def build(self, input_shape):
        cls = type(self).__name__
        ndim = len(input_shape)
        self._axes = _args.resolve_axes(cls, self.axis, ndim)
        for a in self._axes:
            if input_shape[a] is None:
                raise ValueError('%s: the normalized axis %d of the input shape %s must be '
                                 'known' % (cls, a, input_shape))
        self._input_shape = tuple(input_shape)
        shape = tuple(input_shape[a] for a in self._axes)
        self.input_spec = InputSpec(ndim=ndim, axes={a: input_shape[a] for a in self._axes})
        self._add_gamma_beta(shape, gamma=self.scale or self.rms_scaling,
                             beta=self.center and not self.rms_scaling)
        self.built = True

    def call(self, inputs):
        ndim = len(self._input_shape)
        axes = self._axes
        if list(axes) == [ndim - 1] and not self.rms_scaling and \
                all(K.dtype(w) == K.dtype(inputs) for w in self.weights):
            # one op: the statistics and the scaling in one pass per row
            return layer_norm(inputs, self.gamma, self.beta, self.epsilon)
        variance_of = inputs
        if not self.rms_scaling:
            mean = K.mean(inputs, axis=axes, keepdims=True)
            variance_of = centered = inputs - mean
        else:
            centered = inputs - K.mean(inputs, axis=axes, keepdims=True)
        variance = K.mean(K.square(centered), axis=axes, keepdims=True)
        inv = 1.0 / K.sqrt(variance + self.epsilon)
        if self.gamma is not None:
            inv = inv * _broadcast_param(self.gamma, ndim, axes, self._input_shape)
        out = variance_of * inv
        if self.beta is not None:
            out = out + _broadcast_param(self.beta, ndim, axes, self._input_shape)
        return out

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {'axis': self.axis, 'epsilon': self.epsilon, 'center': self.center,
                  'scale': self.scale, 'rms_scaling': self.rms_scaling}
        config.update(self._weight_args_config())
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))


class GroupNormalization(_WeightArgs, Layer):
    """Split the channels (``axis``) into ``groups`` groups of consecutive channels and
    normalize each sample's group over it and every other non-batch axis, then scale by
    ``gamma`` and shift by ``beta`` per channel. ``groups=-1`` makes every channel its own
    group (instance normalization); ``groups=1`` is layer normalization over all axes.

    A Keras mask (e.g. (batch, time) from ``Embedding(mask_zero=True)``) weights the
    moments, as tf.keras 2.x does: masked positions do not count in the mean and
    variance (they are normalized all the same).

    Weights, in creation order (as tf.keras 2.x): ``gamma`` (if ``scale``) and ``beta``
    (if ``center``), each of shape ``(channels,)``.
    """

    def __init__(self, groups=32, axis=-1, epsilon=1e-3, center=True, scale=True,
                 beta_initializer='zeros', gamma_initializer='ones',
                 beta_regularizer=None, gamma_regularizer=None,
                 beta_constraint=None, gamma_constraint=None, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        self.groups = _args.check_int(cls, 'groups', groups)
        if self.groups == 0 or self.groups < -1:
            raise ValueError('%s: groups must be a positive integer or -1, got %d'
                             % (cls, self.groups))
        self.axis = _args.check_axis_arg(cls, axis, allow_list=False)
        self.epsilon = _args.check_number(cls, 'epsilon', epsilon, minimum=0.0)
        self.center = _args.check_bool(cls, 'center', center)
        self.scale = _args.check_bool(cls, 'scale', scale)
        self._set_weight_args(beta_initializer, gamma_initializer, beta_regularizer,
                              gamma_regularizer, beta_constraint, gamma_constraint)
        self.supports_masking = True

    def build(self, input_shape):
        cls = type(self).__name__
        ndim = len(input_shape)
        (self._axis,) = _args.resolve_axes(cls, self.axis, ndim)
        channels = input_shape[self._axis]
        if channels is None:
            raise ValueError('%s: the channel axis %d of the input shape %s must be known'
                             % (cls, self._axis, input_shape))
        groups = channels if self.groups == -1 else self.groups
        if groups > channels:
            raise ValueError('%s: groups (%d) cannot be more than the number of channels (%d)'
                             % (cls, groups, channels))
        if channels % groups:
            raise ValueError('%s: the number of channels (%d) must be a multiple of groups (%d)'
                             % (cls, channels, groups))
        self._groups = groups
        self._input_shape = tuple(input_shape)
        self.input_spec = InputSpec(ndim=ndim, axes={self._axis: channels})
        self._add_gamma_beta((channels,), gamma=self.scale, beta=self.center)
        self.built = True

    def _grouped_shape(self, shape):
        shape = list(shape)
        shape[self._axis:self._axis + 1] = [self._groups, shape[self._axis] // self._groups]
        return tuple(shape)

    def call(self, inputs, mask=None):
        ndim = len(self._input_shape)
        shape = _args.static_or_symbolic_shape(K, inputs)
        grouped = K.reshape(inputs, self._grouped_shape(shape))
        # Moments over every axis of the grouped tensor but the batch and the group axis.
        axes = [a for a in range(1, ndim + 1) if a != self._axis]
        if mask is None:
            mean = K.mean(grouped, axis=axes, keepdims=True)
            variance = K.mean(K.square(grouped - mean), axis=axes, keepdims=True)
        else:
            weights = K.cast(mask, K.dtype(inputs))
            while K.ndim(weights) < ndim:
                weights = K.expand_dims(weights, -1)
            weights = K.reshape(weights * K.ones_like(inputs), self._grouped_shape(shape))
            # An all-masked group has no weight: its moments are taken as 0 (mean) and
            # 0 (variance) instead of 0/0.
            total = K.maximum(K.sum(weights, axis=axes, keepdims=True), K.epsilon())
            mean = K.sum(grouped * weights, axis=axes, keepdims=True) / total
            variance = K.sum(K.square(grouped - mean) * weights, axis=axes,
                             keepdims=True) / total
        normalized = K.reshape((grouped - mean) / K.sqrt(variance + self.epsilon), shape)
        if self.gamma is not None:
            normalized = normalized * _broadcast_param(self.gamma, ndim, [self._axis],
                                                       self._input_shape)
        if self.beta is not None:
            normalized = normalized + _broadcast_param(self.beta, ndim, [self._axis],
                                                       self._input_shape)
        return normalized

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {'groups': self.groups, 'axis': self.axis, 'epsilon': self.epsilon,
                  'center': self.center, 'scale': self.scale}
        config.update(self._weight_args_config())
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))


class UnitNormalization(Layer):
    """Scale each sample to unit L2 norm over ``axis`` (an int or a list of ints):
    ``x / sqrt(max(sum(x ** 2), 1e-12))``, as tf.keras 2.x computes it (Keras 3 divides
    by ``max(norm, 1e-12)``, which differs only for norms below 1e-6). No weights;
    passes masks through.
    """

    def __init__(self, axis=-1, **kwargs):
        super().__init__(**kwargs)
        self.axis = _args.check_axis_arg(type(self).__name__, axis)
        self.supports_masking = True

    def build(self, input_shape):
        self._axes = _args.resolve_axes(type(self).__name__, self.axis, len(input_shape))
        self.built = True

    def call(self, inputs):
        square_sum = K.sum(K.square(inputs), axis=self._axes, keepdims=True)
        return inputs / K.sqrt(K.maximum(square_sum, 1e-12))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        base = super().get_config()
        return dict(list(base.items()) + [('axis', self.axis)])
