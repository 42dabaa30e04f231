"""One layer's config (tf.keras spelling) -> a Keras 2.3.1 layer instance.

The class is looked up in the caller's ``custom_objects``, then in
``cyback.layers.custom_objects()``, then in ``keras.layers``. Argument values
Keras serializes as objects (initializers, regularizers, constraints,
activations) are rewritten to Keras 2.3.1's forms. A key the target class
does not take is dropped only when its value is the default or has no effect
(``groups=1``, ``time_major=False``, a ``seed``, ``keepdims=False``...);
otherwise the layer is unsupported, with the reason. Initializers are the one
exception: a loaded layer's weights come from the file, so an initializer
Keras 2.3.1 lacks is replaced by the class default.

``Translator.layer`` raises ``Unsupported`` with a reason; the loader
collects those for every layer and reports them together.
"""
import inspect

__all__ = ['Unsupported', 'Translator', 'LAYER_BASE_KWARGS']


class Unsupported(Exception):
    """A layer that cannot be built; ``str(e)`` is the reason."""


# What Keras 2.3.1's Layer.__init__ takes besides a class's own arguments.
LAYER_BASE_KWARGS = frozenset(('input_shape', 'batch_input_shape', 'batch_size', 'dtype',
                               'name', 'trainable', 'weights', 'input_dtype'))

# Keys tf.keras / Keras 3 write that Keras 2.3.1 lacks, dropped when the value
# is the default or has no effect on a loaded layer: key -> test(value, config).
_IGNORABLE = {
    'groups': lambda v, c: v == 1,
    'time_major': lambda v, c: v is False,
    'seed': lambda v, c: True,               # training-time randomness only
    'quantization_config': lambda v, c: v is None,
    'lora_rank': lambda v, c: not v,
    'lora_alpha': lambda v, c: not c.get('lora_rank'),
    'synchronized': lambda v, c: v is False,
    'renorm': lambda v, c: v is False,
    'renorm_clipping': lambda v, c: not c.get('renorm'),
    'renorm_momentum': lambda v, c: not c.get('renorm'),
    'fused': lambda v, c: True,              # an implementation choice
    'virtual_batch_size': lambda v, c: v is None,
    'adjustment': lambda v, c: v is None,
    'keepdims': lambda v, c: v is False,
    'ragged': lambda v, c: v is False,
    'sparse': lambda v, c: v is False,
    'optional': lambda v, c: v is False,
    'data_format': lambda v, c: v in (None, 'channels_last'),
    'dilation_rate': lambda v, c: all(d == 1 for d in _as_tuple(v)),
    'implementation': lambda v, c: True,     # an implementation choice
    'use_gate': lambda v, c: v is False,
    'sliding_window': lambda v, c: v is None,
    'rms_scaling': lambda v, c: v is False,
    'activity_regularizer': lambda v, c: v is None,
    'input_length': lambda v, c: v is None,
    'autocast': lambda v, c: True,
    'module': lambda v, c: True,             # a Lambda's module: names, not code
    'output_shape_module': lambda v, c: True,
    'zero_output_for_mask': lambda v, c: v is False or not c.get('return_sequences'),
    'build_input_shape': lambda v, c: True,
}

# Keras 2.3.1 spells these initializers as VarianceScaling.
_VARIANCE_SCALING = {
    'GlorotUniform': (1.0, 'fan_avg', 'uniform'),
    'GlorotNormal': (1.0, 'fan_avg', 'normal'),
    'HeUniform': (2.0, 'fan_in', 'uniform'),
    'HeNormal': (2.0, 'fan_in', 'normal'),
    'LecunUniform': (1.0, 'fan_in', 'uniform'),
    'LecunNormal': (1.0, 'fan_in', 'normal'),
}
_DISTRIBUTIONS = {'truncated_normal': 'normal', 'normal': 'normal', 'uniform': 'uniform'}


def _as_tuple(value):
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def init_arguments(cls, stop):
    """Every keyword the class's ``__init__`` chain names, up to ``stop``."""
    names = set()
    for klass in cls.__mro__:
        if klass is stop or klass is object:
            break
        init = klass.__dict__.get('__init__')
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != 'self':
                names.add(p.name)
    return names


class Translator:
    """Builds Keras 2.3.1 layers from configs in tf.keras spelling.

    ``objects``: name -> class/function from cyback.layers and the caller
    (the caller's win); ``normalize``: the dialect's ``normalize_layer``,
    applied to wrapped layers too.
    """

    def __init__(self, keras, objects, normalize):
        self.keras = keras
        self.objects = objects
        self.normalize = normalize
        self._base_layer = keras.engine.base_layer.Layer

    # -- classes ----------------------------------------------------------------

    def layer_class(self, class_name, registered_name=None):
        for key in (registered_name, class_name):
            if not key:
                continue
            for candidate in (key, key.split('>')[-1]):
                obj = self.objects.get(candidate)
                if isinstance(obj, type) and issubclass(obj, self._base_layer):
                    return obj
        builtin = getattr(self.keras.layers, class_name, None)
        if isinstance(builtin, type) and issubclass(builtin, self._base_layer):
            return builtin
        raise Unsupported('no such layer in Keras 2.3.1 or cyback.layers')

    # -- layers -----------------------------------------------------------------

    def layer(self, class_name, config, registered_name=None):
        """(Keras 2.3.1 layer instance, conditions). ``conditions`` is a set:
        'zero_masked_steps' means the file's layer writes zeros at masked
        time steps of its output sequence, which the builder adds after the
        Keras 2.3.1 layer when its input carries a mask."""
        cls = self.layer_class(class_name, registered_name)
        try:
            config = self.normalize(class_name, config)
        except ValueError as e:
            raise Unsupported(str(e)) from e
        conditions = set()
        config = self.config_for(cls, class_name, config, conditions)
        with self.keras.utils.CustomObjectScope(self.objects):
            try:
                layer = cls.from_config(config)
            except Unsupported:
                raise
            except Exception as e:
                raise Unsupported('Keras 2.3.1 %s rejects its config: %s: %s'
                                  % (cls.__name__, type(e).__name__, e)) from e
        return layer, conditions

    def config_for(self, cls, class_name, config, conditions):
        """The Keras 2.3.1 config of a layer of class ``cls``."""
        config = dict(config)
        if config.get('zero_output_for_mask') and config.get('return_sequences'):
            # Keras 2.3.1 RNNs repeat the last output at masked steps instead
            # of writing zeros; the builder zeroes them after the layer.
            conditions.add('zero_masked_steps')
            config.pop('zero_output_for_mask')
        inner = config.get('layer')
        if (class_name == 'Bidirectional' and isinstance(inner, dict)
                and (inner.get('config') or {}).get('return_sequences')):
            # tf.keras and Keras 3 force zero_output_for_mask on both
            # directions of a Bidirectional that returns sequences (tf.keras
            # without writing it in the config).
            conditions.add('zero_masked_steps')
        for key in list(config):
            value = config[key]
            if key == 'layer' and isinstance(value, dict) and 'class_name' in value:
                config[key] = self.wrapped(value, conditions)
            elif key.endswith('initializer'):
                config[key] = self.initializer(value)
                if config[key] is None and value is not None:
                    del config[key]
            elif key.endswith('regularizer'):
                config[key] = self.regularizer(value, key)
            elif key.endswith('constraint'):
                config[key] = self.constraint(value, key)
            elif key in ('activation', 'recurrent_activation'):
                config[key] = self.activation(value, key)
        if class_name == 'Lambda':
            accepted = {'function', 'function_type', 'output_shape', 'output_shape_type',
                        'arguments'} | LAYER_BASE_KWARGS
        else:
            accepted = init_arguments(cls, self._base_layer) | LAYER_BASE_KWARGS
        for key in list(config):
            if key in accepted:
                continue
            test = _IGNORABLE.get(key)
            if test is not None and test(config[key], config):
                del config[key]
                continue
            raise Unsupported('%s=%r is not supported (Keras 2.3.1 %s takes no %r, and '
                              'cyback.layers has no %s that does)'
                              % (key, config[key], cls.__name__, key, class_name))
        return config

    def wrapped(self, entry, conditions):
        """A wrapper's inner layer config, translated; the wrapper's
        ``from_config`` builds it through the custom-object scope."""
        class_name = entry['class_name']
        inner_cls = self.layer_class(class_name, entry.get('registered_name'))
        try:
            inner = self.normalize(class_name, entry.get('config') or {})
        except ValueError as e:
            raise Unsupported('its wrapped %s: %s' % (class_name, e)) from e
        inner = self.config_for(inner_cls, class_name, inner, conditions)
        # The wrapper's from_config resolves the name through the custom
        # object scope, which must give the class chosen here.
        self.objects.setdefault(class_name, inner_cls)
        return {'class_name': class_name, 'config': inner}

    # -- argument values ---------------------------------------------------------

    def initializer(self, value):
        """Keras 2.3.1's form of an initializer, or None to use the default."""
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, dict):
            return None
        name = value.get('class_name')
        cfg = dict(value.get('config') or {})
        if name in self.objects and isinstance(self.objects[name], type):
            return {'class_name': name, 'config': cfg}
        if name in _VARIANCE_SCALING:
            scale, mode, distribution = _VARIANCE_SCALING[name]
            return {'class_name': 'VarianceScaling',
                    'config': {'scale': scale, 'mode': mode, 'distribution': distribution,
                               'seed': cfg.get('seed')}}
        if name == 'VarianceScaling':
            distribution = _DISTRIBUTIONS.get(str(cfg.get('distribution', 'normal')).lower())
            if distribution is None:
                return None
            cfg['distribution'] = distribution
        cls = getattr(self.keras.initializers, name or '', None)
        if not isinstance(cls, type):
            return None
        allowed = init_arguments(cls, object)
        return {'class_name': name, 'config': {k: v for k, v in cfg.items() if k in allowed}}

    def regularizer(self, value, key):
        if value is None:
            return None
        if isinstance(value, dict):
            name = value.get('class_name')
            cfg = value.get('config') or {}
            if name in self.objects:
                return value
            if name in ('L1L2', 'L1', 'L2'):
                return {'class_name': 'L1L2',
                        'config': {'l1': float(cfg.get('l1', 0.0)),
                                   'l2': float(cfg.get('l2', 0.0))}}
            raise Unsupported('%s %r has no Keras 2.3.1 equivalent' % (key, name))
        if isinstance(value, str) and value in ('l1', 'l2', 'l1_l2'):
            return value
        raise Unsupported('%s %r has no Keras 2.3.1 equivalent' % (key, value))

    def constraint(self, value, key):
        if value is None:
            return None
        if isinstance(value, dict):
            name = value.get('class_name')
            if name in self.objects:
                return value
            cls = getattr(self.keras.constraints, name or '', None)
            if isinstance(cls, type):
                allowed = init_arguments(cls, object)
                cfg = value.get('config') or {}
                extra = set(cfg) - allowed
                if extra:
                    raise Unsupported('%s %s with %s is not supported by Keras 2.3.1'
                                      % (key, name, sorted(extra)))
                return {'class_name': name, 'config': dict(cfg)}
        raise Unsupported('%s %r has no Keras 2.3.1 equivalent' % (key, value))

    def activation(self, value, key):
        if isinstance(value, dict):
            # Keras 3 may write a function as {"class_name": "function",
            # "config": name}; only its name is used.
            if value.get('class_name') == 'function' and isinstance(value.get('config'), str):
                value = value['config']
            elif value.get('class_name') in self.objects:
                return value
            else:
                raise Unsupported('%s %r is not a known activation' % (key, value))
        if value is None or not isinstance(value, str):
            return value
        if value in self.objects:
            return value
        if callable(getattr(self.keras.activations, value, None)):
            return value
        raise Unsupported('%s %r is not an activation of Keras 2.3.1 or cyback.layers'
                          % (key, value))
