"""Small layers tf.keras 2.x / Keras 3 models use that Keras 2.3.1 lacks: Identity,
LeakyReLU with Keras 3's ``negative_slope``, and the custom layers of the Keras
applications (ConvNeXt's LayerScale and StochasticDepth, InceptionResNetV2's
CustomScaleLayer)."""
from cyback.layers import _args
from cyback.layers._keras import import_keras

keras = import_keras()
K = keras.backend
Layer = keras.engine.base_layer.Layer

__all__ = ['Identity', 'LeakyReLU', 'LayerScale', 'StochasticDepth', 'CustomScaleLayer']


class Identity(Layer):
    """Returns its input (a copy, so Keras's bookkeeping sees a new tensor); passes
    masks through. No weights."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs):
        return K.identity(inputs)

    def compute_output_shape(self, input_shape):
        return input_shape


class LeakyReLU(keras.layers.LeakyReLU):
    """``x`` for x >= 0, else ``negative_slope * x``. Takes Keras 3's ``negative_slope``
    (default 0.3) or tf.keras's / Keras 2's ``alpha``; the config writes both names.
    No weights."""

    def __init__(self, negative_slope=None, alpha=None, **kwargs):
        cls = type(self).__name__
        if negative_slope is not None and alpha is not None and negative_slope != alpha:
            raise ValueError('%s: give negative_slope or alpha, not both' % cls)
        slope = negative_slope if negative_slope is not None else alpha
        slope = 0.3 if slope is None else _args.check_number(cls, 'negative_slope', slope)
        super().__init__(alpha=slope, **kwargs)
        self.supports_masking = True

    def get_config(self):
        config = super().get_config()
        config['alpha'] = float(self.alpha)
        config['negative_slope'] = float(self.alpha)
        return config


class LayerScale(Layer):
    """ConvNeXt's layer scale: ``inputs * gamma``, per channel (last axis).

    Weights (as the tf.keras / Keras 3 applications): ``gamma`` (projection_dim,),
    initialised to ``init_values``.
    """

    def __init__(self, init_values, projection_dim, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        self.init_values = _args.check_number(cls, 'init_values', init_values)
        self.projection_dim = _args.check_int(cls, 'projection_dim', projection_dim,
                                              minimum=1)
        self.supports_masking = True

    def build(self, input_shape):
        if input_shape[-1] is not None and input_shape[-1] != self.projection_dim:
            raise ValueError('%s: the input has %d channels, projection_dim is %d'
                             % (type(self).__name__, input_shape[-1], self.projection_dim))
        self.gamma = self.add_weight(name='gamma', shape=(self.projection_dim,),
                                     initializer=keras.initializers.Constant(
                                         self.init_values))
        self.built = True

    def call(self, inputs):
        return inputs * self.gamma

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        base = super().get_config()
        return dict(list(base.items()) + [('init_values', self.init_values),
                                          ('projection_dim', self.projection_dim)])


class StochasticDepth(Layer):
    """ConvNeXt's stochastic depth: in training, each sample's input is zeroed with
    probability ``drop_path_rate`` and the rest scaled by ``1 / (1 - rate)``; at
    inference the identity. No weights."""

    def __init__(self, drop_path_rate, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        self.drop_path_rate = _args.check_number(cls, 'drop_path_rate', drop_path_rate,
                                                 minimum=0.0)
        if self.drop_path_rate >= 1.0:
            raise ValueError('%s: drop_path_rate must be in [0, 1), got %s'
                             % (cls, drop_path_rate))
        self.supports_masking = True

    def call(self, inputs, training=None):
        if self.drop_path_rate == 0.0:
            return inputs
        keep = 1.0 - self.drop_path_rate

        def dropped():
            shape = [K.shape(inputs)[0]] + [1] * (K.ndim(inputs) - 1)
            kept = K.cast(K.random_uniform(shape) < keep, K.dtype(inputs))
            return inputs * kept / keep

        return K.in_train_phase(dropped, inputs, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        base = super().get_config()
        return dict(list(base.items()) + [('drop_path_rate', self.drop_path_rate)])


class CustomScaleLayer(Layer):
    """InceptionResNetV2's residual scaling (Keras 3 application): ``inputs[0] +
    inputs[1] * scale``. No weights."""

    def __init__(self, scale, **kwargs):
        super().__init__(**kwargs)
        self.scale = _args.check_number(type(self).__name__, 'scale', scale)

    def call(self, inputs):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError('%s: expected a list of two tensors, got %r'
                             % (type(self).__name__, inputs))
        return inputs[0] + inputs[1] * self.scale

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])

    def get_config(self):
        base = super().get_config()
        return dict(list(base.items()) + [('scale', self.scale)])
