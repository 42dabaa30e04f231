"""Keras 3 model configs (``.keras`` archives and legacy ``.h5``): the graph,
and the layer keys that differ from tf.keras / Keras 2.3.1.

Keras 3 writes every object as ``{"module", "class_name", "config",
"registered_name"}`` (the legacy ``.h5`` drops ``module``), adds
``build_config`` / ``compile_config``, and writes a layer's dtype as a policy
object. ``inbound_nodes`` are calls ``{"args": [...], "kwargs": {...}}`` in
which a tensor is ``{"class_name": "__keras_tensor__", "config":
{"keras_history": [layer, node, tensor]}}``. Tensor operations applied in the
functional API are nodes of their own (``module`` ``keras.src.ops.*``, a
config without ``trainable``): the masks Keras 3 propagates are such nodes,
e.g. Embedding(mask_zero=True) gives a ``NotEqual(ids, 0)`` node feeding the
next layer's ``mask=``.

``normalize_layer`` rewrites one layer's config into the tf.keras spelling
(then ``layer_configs`` maps it to Keras 2.3.1).
"""
from cyback.saving import tf_keras_config
from cyback.saving.errors import ModelFileError
from cyback.saving.spec import LayerSpec, ModelSpec, Node, TensorRef

__all__ = ['parse_model', 'normalize_layer', 'decode_value', 'is_op_entry', 'strip_shared_ids']

_MODEL_CLASSES = ('Functional', 'Sequential', 'Model')


def parse_model(config, writer, label):
    """The ModelSpec of a Keras 3 model config (top level of config.json or
    of a legacy .h5 ``model_config``)."""
    if not isinstance(config, dict) or 'class_name' not in config:
        raise ModelFileError('%s: a model config must be a dict with class_name' % label)
    class_name = config['class_name']
    body = config.get('config')
    if not isinstance(body, dict):
        raise ModelFileError('%s: the model config of %r has no config dict'
                             % (label, class_name))
    if class_name == 'Sequential':
        return _parse_sequential(config, body, writer, label)
    if class_name in ('Functional', 'Model') and 'layers' in body:
        return _parse_functional(body, writer, label)
    raise ModelFileError(
        '%s: the top-level model is a %r%s; cyback loads Functional and Sequential '
        'models (a subclassed model stores no graph, only its Python class)'
        % (label, class_name, ' from %s' % config['module'] if config.get('module') else ''))


def is_op_entry(entry):
    """Whether a layer entry is a tensor operation rather than a layer."""
    module = entry.get('module') or ''
    if module.startswith('keras.src.ops') or module.startswith('keras.ops'):
        return True
    if module:
        return False
    cfg = entry.get('config')
    return (entry.get('class_name') != 'InputLayer' and isinstance(cfg, dict)
            and 'trainable' not in cfg)


def _check_entry(entry, label):
    if not isinstance(entry, dict) or 'class_name' not in entry or not isinstance(
            entry.get('config'), dict):
        raise ModelFileError('%s: a layer entry of the model config is not '
                             '{"class_name", "config"}: %.200r' % (label, entry))


def _parse_sequential(config, body, writer, label):
    layers = []
    for index, entry in enumerate(body.get('layers', [])):
        _check_entry(entry, label)
        name = entry['config'].get('name') or '%s_layer_%d' % (body.get('name'), index)
        layers.append(_layer_spec(entry, name, [], writer, label))
    build = config.get('build_config') or {}
    input_shape = build.get('input_shape') if isinstance(build, dict) else None
    return ModelSpec(body.get('name'), 'sequential', layers, writer=writer,
                     trainable=body.get('trainable', True), input_shape=input_shape)


def _parse_functional(body, writer, label):
    entries = body['layers']
    names = set()
    for entry in entries:
        _check_entry(entry, label)
        names.add(entry.get('name') or entry['config'].get('name'))
    layers = []
    for entry in entries:
        name = entry.get('name') or entry['config'].get('name')
        nodes = []
        for node in entry.get('inbound_nodes') or []:
            if not isinstance(node, dict) or 'args' not in node:
                raise ModelFileError('%s: layer %r has a malformed inbound node: %.200r'
                                     % (label, name, node))
            args = decode_value(node.get('args', []), names, label, name)
            kwargs = decode_value(node.get('kwargs') or {}, names, label, name)
            nodes.append(Node(args, kwargs))
        layers.append(_layer_spec(entry, name, nodes, writer, label))
    return ModelSpec(body.get('name'), 'functional', layers,
                     _refs(body.get('input_layers'), label),
                     _refs(body.get('output_layers'), label), writer=writer,
                     trainable=body.get('trainable', True))


def _layer_spec(entry, name, nodes, writer, label):
    class_name = entry['class_name']
    config = entry['config']
    registered = entry.get('registered_name')
    if class_name in _MODEL_CLASSES and 'layers' in config:
        inner = parse_model(entry, writer, label)
        return LayerSpec(name, class_name, config, nodes, role='model', model=inner,
                         registered_name=registered)
    if class_name == 'InputLayer':
        return LayerSpec(name, class_name, config, nodes, role='input')
    role = 'op' if is_op_entry(entry) else 'layer'
    return LayerSpec(name, class_name, config, nodes, role=role, registered_name=registered)


def decode_value(value, names, label, layer_name):
    """A node argument with Keras 3's wrappers (``__keras_tensor__``,
    ``__tuple__``) turned into TensorRefs and lists."""
    if isinstance(value, dict):
        class_name = value.get('class_name')
        if class_name == '__keras_tensor__':
            history = (value.get('config') or {}).get('keras_history')
            if (not isinstance(history, list) or len(history) != 3
                    or not isinstance(history[0], str)):
                raise ModelFileError('%s: layer %r has a tensor argument without a valid '
                                     'keras_history: %.200r' % (label, layer_name, value))
            if history[0] not in names:
                raise ModelFileError('%s: layer %r is called on the output of %r, which '
                                     'the model does not have'
                                     % (label, layer_name, history[0]))
            return TensorRef(history[0], int(history[1]), int(history[2]))
        if class_name == '__tuple__':
            inner = (value.get('config') or {}).get('value', [])
            return [decode_value(v, names, label, layer_name) for v in inner]
        return {k: decode_value(v, names, label, layer_name) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_value(v, names, label, layer_name) for v in value]
    return value


def _refs(value, label):
    if value is None:
        return []
    if isinstance(value, dict):
        # Keras 3 models with dict inputs/outputs: keep the file's key order.
        value = list(value.values())
    if isinstance(value, list) and len(value) == 3 and isinstance(value[0], str):
        value = [value]
    refs = []
    for item in value:
        if isinstance(item, dict) and item.get('class_name') == '__keras_tensor__':
            item = item['config']['keras_history']
        try:
            refs.append(TensorRef(item[0], int(item[1]), int(item[2])))
        except (TypeError, ValueError, IndexError, KeyError) as e:
            raise ModelFileError('%s: malformed model inputs/outputs %.200r'
                                 % (label, value)) from e
    return refs


# -- layer configs ------------------------------------------------------------

def normalize_layer(class_name, config):
    """Keras 3's config of a layer in tf.keras spelling. Returns a new dict;
    raises ValueError with the reason when a value has no equivalent."""
    config = strip_shared_ids(config)
    if 'dtype' in config:
        config['dtype'] = tf_keras_config.dtype_name(config['dtype'])
    if class_name == 'LeakyReLU' and 'negative_slope' in config:
        config['alpha'] = config.pop('negative_slope')
    if class_name == 'Bidirectional' and config.get('backward_layer') is not None:
        _check_mirrored(config['layer'], config.pop('backward_layer'))
    if class_name == 'Lambda':
        _lambda_to_keras2(config)
    return tf_keras_config.normalize_layer(class_name, config)


def strip_shared_ids(value):
    """A copy without Keras 3's ``shared_object_id`` keys, which mark objects
    serialized more than once (a dtype policy shared by layers) and carry no
    meaning of their own."""
    if isinstance(value, dict):
        return {k: strip_shared_ids(v) for k, v in value.items() if k != 'shared_object_id'}
    if isinstance(value, list):
        return [strip_shared_ids(v) for v in value]
    return value


def _check_mirrored(forward, backward):
    """Keras 2.3.1's Bidirectional builds its backward layer from the forward
    one (go_backwards flipped): a file whose backward layer differs otherwise
    cannot be represented."""
    def comparable(entry):
        cfg = strip_shared_ids(dict(entry.get('config') or {}))
        for key in ('name', 'go_backwards'):
            cfg.pop(key, None)
        return entry.get('class_name'), cfg
    if (forward.get('config') or {}).get('go_backwards') == (
            backward.get('config') or {}).get('go_backwards'):
        raise ValueError('the backward layer does not run backwards')
    if comparable(forward) != comparable(backward):
        raise ValueError('its backward layer is configured differently from the forward '
                         'one, which Keras 2.3.1 Bidirectional cannot represent')


def _lambda_to_keras2(config):
    """Keras 3 serializes a Lambda's functions as ``__lambda__`` objects
    (base64 marshal, defaults, closure) or named functions; Keras 2.3.1
    takes ``function`` plus ``function_type`` (and the same for
    ``output_shape``)."""
    for key in ('function', 'output_shape'):
        value = config.get(key)
        if isinstance(value, dict) and value.get('class_name') == '__lambda__':
            inner = value.get('config') or {}
            config[key] = [inner.get('code'), inner.get('defaults'), inner.get('closure')]
            kind = 'lambda'
        elif isinstance(value, dict) and value.get('class_name') == 'function':
            config[key] = value.get('config')
            kind = 'function'
        elif isinstance(value, str):
            kind = 'function'
        else:
            config[key] = value
            kind = 'raw'
        config[key + '_type'] = kind
    if config.get('mask') is None:
        config.pop('mask', None)
    else:
        raise ValueError('a Lambda mask stored in the file (Keras 2.3.1 Lambda layers '
                         'cannot load one)')
