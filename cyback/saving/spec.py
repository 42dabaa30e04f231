"""A model file's graph, independent of the framework that wrote it.

``tf_keras_config`` and ``keras3_config`` parse their dialect into these
classes; ``builder`` turns them into a Keras 2.3.1 model. A ``Node`` is one
call of a layer: its positional and keyword arguments, where a tensor is a
``TensorRef`` (the producing layer, which of its calls, which output).
"""
import collections

__all__ = ['TensorRef', 'Node', 'LayerSpec', 'ModelSpec', 'tensor_refs']


class TensorRef(collections.namedtuple('TensorRef', 'layer node tensor')):
    """Output ``tensor`` of call ``node`` of layer ``layer`` (a name)."""

    def __str__(self):
        return '%s[%d][%d]' % self


class Node:
    """One call: ``args`` and ``kwargs`` hold TensorRefs, lists/dicts of
    them, and constants."""

    def __init__(self, args, kwargs):
        self.args = list(args)
        self.kwargs = dict(kwargs)

    def __repr__(self):
        return 'Node(args=%r, kwargs=%r)' % (self.args, self.kwargs)


class LayerSpec:
    """A layer of the file.

    ``role``: 'input' (an InputLayer), 'layer', 'model' (a nested model,
    ``model`` holds its ModelSpec) or 'op' (a tensor operation the file
    stores as a graph node: tf.keras ``TFOpLambda``, Keras 3 ops).
    ``class_name`` and ``config`` are the file's own; ``node_offset`` is the
    index the file gives this layer's first listed call (tf.keras counts a
    nested model's own input node, which it does not list).
    """

    def __init__(self, name, class_name, config, nodes, role='layer', model=None,
                 node_offset=0, registered_name=None):
        self.name = name
        self.class_name = class_name
        self.config = config
        self.nodes = nodes
        self.role = role
        self.model = model
        self.node_offset = node_offset
        self.registered_name = registered_name

    def __repr__(self):
        return 'LayerSpec(%r, %r, role=%r)' % (self.class_name, self.name, self.role)


class ModelSpec:
    """``kind`` is 'functional' or 'sequential'. A sequential model has no
    nodes: its ``layers`` run in order. ``writer`` is the dialect
    (files.KERAS3 or files.TF_KERAS)."""

    def __init__(self, name, kind, layers, inputs=(), outputs=(), writer=None,
                 trainable=True, input_shape=None):
        self.name = name
        self.kind = kind
        self.layers = list(layers)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.writer = writer
        self.trainable = trainable
        # A Keras 3 Sequential without an InputLayer keeps its input shape in
        # build_config.
        self.input_shape = input_shape

    def __repr__(self):
        return 'ModelSpec(%r, %s, %d layers)' % (self.name, self.kind, len(self.layers))


def tensor_refs(value):
    """Every TensorRef in a nested structure, in order."""
    found = []
    _collect(value, found)
    return found


def _collect(value, found):
    if isinstance(value, TensorRef):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, found)
