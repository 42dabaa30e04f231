"""tf.keras 2.x (and Keras 2.2/2.3) model configs: the graph, and the layer
keys that differ from Keras 2.3.1.

A tf.keras functional config lists layers with ``inbound_nodes`` as lists of
calls, each call a list of ``[layer_name, node_index, tensor_index, kwargs]``
(one entry per input tensor; several entries = a list input). Tensors passed
as keyword arguments (MultiHeadAttention's ``value``, a TFOpLambda's ``y``)
are written as the same ``[layer_name, node_index, tensor_index]`` triples
inside ``kwargs``. A nested model whose first layer is an InputLayer has a
first node tf.keras does not list, so the file numbers its calls from 1.

``normalize_layer`` rewrites what tf.keras writes differently from Keras
2.3.1 for the same meaning (BatchNormalization's ``axis`` as a list,
SeparableConv's unused ``kernel_*`` keys, mixed-precision dtype policies);
everything else is left to ``layer_configs``.
"""
from cyback.saving.errors import ModelFileError
from cyback.saving.spec import LayerSpec, ModelSpec, Node, TensorRef

__all__ = ['parse_model', 'normalize_layer', 'MODEL_CLASSES', 'OP_CLASSES']

MODEL_CLASSES = ('Functional', 'Model', 'Sequential')
# tf.keras's wrappers of TensorFlow functions applied to Keras tensors.
OP_CLASSES = ('TFOpLambda', 'SlicingOpLambda')


def parse_model(config, writer, label):
    """The ModelSpec of a tf.keras-dialect ``{"class_name", "config"}``."""
    if not isinstance(config, dict) or 'class_name' not in config:
        raise ModelFileError('%s: a model config must be a dict with class_name' % label)
    class_name = config['class_name']
    body = config.get('config')
    if class_name == 'Sequential':
        return _parse_sequential(body, writer, label)
    if class_name in ('Functional', 'Model'):
        return _parse_functional(body, writer, label)
    raise ModelFileError(
        '%s: the top-level model is a %r; cyback loads Functional and Sequential '
        'models (a subclassed model stores no graph, only its Python class)'
        % (label, class_name))


def _parse_sequential(body, writer, label):
    # Keras 2.2 wrote the layer list itself; later versions a dict.
    if isinstance(body, list):
        name, layers_config, trainable = None, body, True
    elif isinstance(body, dict):
        name = body.get('name')
        layers_config = body.get('layers', [])
        trainable = body.get('trainable', True)
    else:
        raise ModelFileError('%s: the Sequential config is neither a list nor a dict' % label)
    layers = []
    for index, entry in enumerate(layers_config):
        _check_layer_entry(entry, label)
        cfg = entry.get('config') or {}
        layer_name = cfg.get('name') or entry.get('name') or '%s_layer_%d' % (name, index)
        layers.append(_layer_spec(entry, layer_name, [], writer, label))
    return ModelSpec(name, 'sequential', layers, writer=writer, trainable=trainable)


def _parse_functional(body, writer, label):
    if not isinstance(body, dict) or 'layers' not in body:
        raise ModelFileError('%s: the functional model config has no layers' % label)
    names = set()
    entries = body['layers']
    for entry in entries:
        _check_layer_entry(entry, label)
        names.add(entry.get('name') or entry['config'].get('name'))
    layers = []
    for entry in entries:
        name = entry.get('name') or entry['config'].get('name')
        nodes = [_parse_node(node, names, label, name)
                 for node in entry.get('inbound_nodes') or []]
        layers.append(_layer_spec(entry, name, nodes, writer, label))
    inputs = _refs(body.get('input_layers'), label)
    outputs = _refs(body.get('output_layers'), label)
    return ModelSpec(body.get('name'), 'functional', layers, inputs, outputs, writer=writer,
                     trainable=body.get('trainable', True))


def _check_layer_entry(entry, label):
    if not isinstance(entry, dict) or 'class_name' not in entry or not isinstance(
            entry.get('config'), dict):
        raise ModelFileError('%s: a layer entry of the model config is not '
                             '{"class_name", "config"}: %.200r' % (label, entry))


def _layer_spec(entry, name, nodes, writer, label):
    class_name = entry['class_name']
    config = entry['config']
    if class_name in MODEL_CLASSES:
        inner = parse_model({'class_name': class_name, 'config': config}, writer, label)
        offset = 1 if _starts_with_input(class_name, config) else 0
        return LayerSpec(name, class_name, config, nodes, role='model', model=inner,
                         node_offset=offset)
    if class_name == 'InputLayer':
        return LayerSpec(name, class_name, config, nodes, role='input')
    role = 'op' if class_name in OP_CLASSES else 'layer'
    return LayerSpec(name, class_name, config, nodes, role=role)


def _starts_with_input(class_name, config):
    if class_name in ('Functional', 'Model'):
        return True
    layers = config.get('layers') if isinstance(config, dict) else config
    return bool(layers) and layers[0].get('class_name') == 'InputLayer'


def _is_ref(value, names):
    return (isinstance(value, (list, tuple)) and len(value) == 3
            and isinstance(value[0], str) and value[0] in names
            and isinstance(value[1], int) and isinstance(value[2], int))


def _kwargs_refs(value, names):
    if _is_ref(value, names):
        return TensorRef(*value)
    if isinstance(value, dict):
        return {k: _kwargs_refs(v, names) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and any(_is_ref(v, names) for v in value):
        return [_kwargs_refs(v, names) for v in value]
    return value


_CONSTANT = '_CONSTANT_VALUE'


def _parse_node(node, names, label, layer_name):
    """One call. Its first argument is written as entries ``[layer, node,
    tensor, kwargs]`` in the argument's structure: a list of entries for
    ordinary layers, the bare entry (or a nested list/dict) for TFOpLambda,
    whose input structure is kept; constants in it are ``["_CONSTANT_VALUE",
    -1, value, kwargs]``. The call's other arguments are the ``kwargs`` every
    entry carries."""
    found_kwargs = []
    first = _first_argument(node, names, label, layer_name, found_kwargs)
    if first is None:
        raise ModelFileError('%s: layer %r has a malformed inbound node: %.200r'
                             % (label, layer_name, node))
    kwargs = found_kwargs[0] if found_kwargs else {}
    return Node([first], _kwargs_refs(kwargs, names))


def _is_entry(value):
    return (isinstance(value, (list, tuple)) and len(value) in (3, 4)
            and isinstance(value[0], str) and isinstance(value[1], int))


def _first_argument(value, names, label, layer_name, found_kwargs):
    if _is_entry(value):
        if len(value) == 4 and value[3]:
            if not isinstance(value[3], dict):
                raise ModelFileError('%s: layer %r has malformed call arguments %.200r'
                                     % (label, layer_name, value[3]))
            found_kwargs.append(value[3])
        if value[0] == _CONSTANT:
            return value[2]
        if value[0] not in names:
            raise ModelFileError('%s: layer %r is called on the output of %r, which the '
                                 'model does not have' % (label, layer_name, value[0]))
        if not isinstance(value[2], int):
            return None
        return TensorRef(value[0], int(value[1]), int(value[2]))
    if isinstance(value, dict):
        items = {k: _first_argument(v, names, label, layer_name, found_kwargs)
                 for k, v in value.items()}
        return None if any(v is None for v in items.values()) else items
    if isinstance(value, (list, tuple)) and value:
        items = [_first_argument(v, names, label, layer_name, found_kwargs) for v in value]
        if any(v is None for v in items):
            return None
        # Ordinary layers wrap a single input in a one-entry list.
        return items[0] if len(items) == 1 else items
    return None


def _refs(value, label):
    if value is None:
        return []
    if (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str)):
        value = [value]
    try:
        return [TensorRef(v[0], int(v[1]), int(v[2])) for v in value]
    except (TypeError, ValueError, IndexError) as e:
        raise ModelFileError('%s: malformed model inputs/outputs %.200r' % (label, value)) from e


# -- layer configs ------------------------------------------------------------

# SeparableConv passes these to its base class, where they are unused: a
# separable convolution has no plain 'kernel' weight.
_SEPARABLE_UNUSED = ('kernel_initializer', 'kernel_regularizer', 'kernel_constraint')


def normalize_layer(class_name, config):
    """tf.keras's config of a layer, with the tf.keras spellings of Keras
    2.3.1 arguments rewritten. Returns a new dict; raises ValueError with the
    reason when a value has no Keras 2.3.1 equivalent."""
    config = dict(config)
    if 'dtype' in config:
        config['dtype'] = dtype_name(config['dtype'])
    if class_name == 'BatchNormalization' and isinstance(config.get('axis'), (list, tuple)):
        axis = config['axis']
        if len(axis) != 1:
            raise ValueError('BatchNormalization over several axes (axis=%r) is not '
                             'supported' % (axis,))
        config['axis'] = axis[0]
    if class_name in ('SeparableConv1D', 'SeparableConv2D'):
        for key in _SEPARABLE_UNUSED:
            config.pop(key, None)
    return config


# tf.keras/Keras 3 mixed-precision policies keep float32 variables; cyback
# computes in the variable dtype.
_MIXED_POLICIES = {'mixed_float16': 'float32', 'mixed_bfloat16': 'float32'}


def dtype_name(value):
    """A layer's dtype (a string, or a tf.keras/Keras 3 policy dict) as the
    dtype name Keras 2.3.1 takes."""
    if isinstance(value, dict):
        inner = value.get('config')
        name = inner.get('name') if isinstance(inner, dict) else None
        if not isinstance(name, str):
            raise ValueError('unreadable dtype policy %r' % (value,))
        value = name
    if isinstance(value, str):
        return _MIXED_POLICIES.get(value, value)
    return value
