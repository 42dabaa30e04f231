"""A ModelSpec -> a Keras 2.3.1 model on cyback.

Two passes. ``Builder.prepare`` creates every layer (nested models too) and
collects every layer that cannot be created, so that the loader reports them
all at once. ``Builder.build`` then replays the file's calls in dependency
order and makes the ``keras.Model`` / ``keras.Sequential``.

Calls are translated to Keras 2.3.1's convention, one ``inputs`` argument (a
tensor or a list) plus non-tensor keyword arguments:

- positional tensors and the tensor keywords a layer takes as further inputs
  (MultiHeadAttention's ``value``, ``key``) become the input list;
- ``mask=``: Keras 2.3.1 propagates masks itself (Embedding(mask_zero),
  Masking), so the file's mask argument and the operation nodes that only
  compute it are dropped, and the builder checks that Keras 2.3.1 does give
  the layer a mask there;
- a mask reaching a layer that does not support masking ends there, as in
  tf.keras and Keras 3 (Keras 2.3.1 would raise);
- an RNN that writes zeros at masked steps (``zero_output_for_mask``, which
  tf.keras and Keras 3 force on a Bidirectional returning sequences) gets a
  ``ZeroMaskedSteps`` layer after it when its input is masked: Keras 2.3.1
  repeats the last output there;
- ``training``: Keras 3 records the value it had while the graph was traced
  and overrides it at run time, so it is dropped; tf.keras records it only
  when the user passed it, so it is kept.
"""
import collections

from cyback.layers import import_keras
from cyback.saving import files, op_layers
from cyback.saving.layer_configs import Unsupported
from cyback.saving.spec import TensorRef, tensor_refs

keras = import_keras()

__all__ = ['Builder']

# Tensor keywords some layers take as further entries of their input list.
_LIST_KEYWORDS = {'MultiHeadAttention': ('value', 'key')}


class _Prepared:
    def __init__(self, spec):
        self.spec = spec
        self.layers = {}        # layer name -> Keras layer (or nested _Prepared)
        self.ops = {}           # (layer name, node index) -> (TensorOp, input refs)
        self.conditions = {}    # layer name -> set of conditions
        self.mask_only = set()  # names of op nodes that only compute masks


class Builder:
    """``translator``: a layer_configs.Translator for the file's dialect."""

    def __init__(self, translator, label):
        self.translator = translator
        self.label = label
        self.unsupported = []   # (class_name, layer name, reason)

    # -- pass 1: layers -----------------------------------------------------------

    def prepare(self, spec):
        prepared = _Prepared(spec)
        prepared.mask_only = _mask_only_ops(spec)
        for layer in spec.layers:
            if layer.role == 'input':
                self._check_input(layer)
            elif layer.role == 'model':
                prepared.layers[layer.name] = self.prepare(layer.model)
            elif layer.role == 'op':
                if layer.name in prepared.mask_only:
                    continue
                for index, node in enumerate(layer.nodes):
                    try:
                        prepared.ops[(layer.name, index)] = self._make_op(
                            layer, node, index, spec.writer)
                    except Unsupported as e:
                        self._refuse(layer, e)
                        break
            else:
                try:
                    instance, conditions = self.translator.layer(
                        layer.class_name, layer.config, layer.registered_name)
                except Unsupported as e:
                    self._refuse(layer, e)
                    continue
                prepared.layers[layer.name] = instance
                prepared.conditions[layer.name] = conditions
        return prepared

    def _refuse(self, layer, error):
        self.unsupported.append((layer.class_name, layer.name, str(error)))

    def _check_input(self, layer):
        cfg = layer.config
        for key in ('sparse', 'ragged'):
            if cfg.get(key):
                self._refuse(layer, Unsupported('%s inputs are not supported' % key))
        if _batch_shape(cfg) is None:
            self._refuse(layer, Unsupported('the input has no recorded shape'))

    def _make_op(self, layer, node, index, writer):
        if writer == files.KERAS3:
            config, refs = op_layers.op_from_keras3(layer.class_name, layer.config, node)
        else:
            config, refs = op_layers.op_from_tf_keras(layer.config, node)
        name = layer.name if len(layer.nodes) == 1 else '%s_%d' % (layer.name, index)
        return op_layers.TensorOp(name=name, **config), refs

    # -- pass 2: graph ----------------------------------------------------------

    def build(self, prepared):
        spec = prepared.spec
        if spec.kind == 'sequential':
            model = self._build_sequential(prepared)
        else:
            model = self._build_functional(prepared)
        if not spec.trainable:
            model.trainable = False
        return model

    def _build_sequential(self, prepared):
        spec = prepared.spec
        model = keras.models.Sequential(name=spec.name)
        layers = list(spec.layers)
        if layers and layers[0].role == 'input':
            first = layers.pop(0)
            model.add(keras.layers.InputLayer(
                batch_input_shape=_batch_shape(first.config),
                dtype=first.config.get('dtype') or keras.backend.floatx(), name=first.name))
        elif spec.input_shape is not None:
            model.add(keras.layers.InputLayer(batch_input_shape=tuple(spec.input_shape)))
        for layer in layers:
            instance = prepared.layers[layer.name]
            if isinstance(instance, _Prepared):
                instance = self.build(instance)
                prepared.layers[layer.name] = instance
            model.add(instance)
        if not model.layers:
            raise Unsupported('the Sequential model %r has no layers' % spec.name)
        if not model.inputs:
            raise Unsupported('the file does not record the input shape of the Sequential '
                              'model %r' % spec.name)
        return model

    def _build_functional(self, prepared):
        spec = prepared.spec
        produced = {}
        for layer in spec.layers:
            if layer.role == 'input':
                cfg = layer.config
                tensor = keras.layers.Input(
                    batch_shape=_batch_shape(cfg),
                    dtype=cfg.get('dtype') or keras.backend.floatx(), name=layer.name)
                produced[(layer.name, 0)] = [tensor]
        pending = collections.deque()
        for layer in spec.layers:
            if layer.role == 'input' or layer.name in prepared.mask_only:
                continue
            for index, node in enumerate(layer.nodes):
                pending.append((layer, index, node))
        stalled = 0
        while pending:
            layer, index, node = pending.popleft()
            key = (layer.name, layer.node_offset + index)
            needed = self._needed_refs(layer, index, node, prepared)
            if not all((r.layer, r.node) in produced for r in needed):
                pending.append((layer, index, node))
                stalled += 1
                if stalled > len(pending):
                    missing = sorted({str(r) for r in needed
                                      if (r.layer, r.node) not in produced})
                    raise Unsupported(
                        'layer %r is called on tensors no call produces (%s): the graph '
                        'is inconsistent' % (layer.name, ', '.join(missing)))
                continue
            stalled = 0
            produced[key] = self._call(layer, index, node, prepared, produced)
        inputs = [self._resolve(r, produced) for r in spec.inputs]
        outputs = [self._resolve(r, produced) for r in spec.outputs]
        try:
            return keras.models.Model(inputs=inputs, outputs=outputs, name=spec.name)
        except (ValueError, TypeError) as e:
            raise Unsupported('the graph of model %r does not connect its inputs to its '
                              'outputs: %s' % (spec.name, e)) from e

    def _needed_refs(self, layer, index, node, prepared):
        if layer.role == 'op':
            return prepared.ops[(layer.name, index)][1]
        kwargs = {k: v for k, v in node.kwargs.items() if k != 'mask'}
        return tensor_refs([node.args, kwargs])

    def _resolve(self, value, produced):
        if isinstance(value, TensorRef):
            outputs = produced.get((value.layer, value.node))
            if outputs is None or value.tensor >= len(outputs):
                raise Unsupported('the graph refers to %s, which no call produces' % (value,))
            return outputs[value.tensor]
        if isinstance(value, (list, tuple)):
            return [self._resolve(v, produced) for v in value]
        if isinstance(value, dict):
            return {k: self._resolve(v, produced) for k, v in value.items()}
        return value

    def _call(self, layer, index, node, prepared, produced):
        if layer.role == 'op':
            op, refs = prepared.ops[(layer.name, index)]
            tensors = [self._resolve(r, produced) for r in refs]
            return _as_list(op(tensors[0] if len(tensors) == 1 else tensors))
        instance = prepared.layers[layer.name]
        if isinstance(instance, _Prepared):
            instance = self.build(instance)
            prepared.layers[layer.name] = instance
        inputs, kwargs, wants_mask = self._arguments(layer, node, instance,
                                                     prepared.spec.writer)
        inputs = self._resolve(inputs, produced)
        kwargs = self._resolve(kwargs, produced)
        has_mask = _input_mask(inputs) is not None
        if wants_mask and not has_mask:
            self._refuse(layer, Unsupported(
                'the file passes it a mask that Keras 2.3.1 does not compute at this point '
                'of the graph'))
        if has_mask and _rejects_masks(instance):
            _drop_masks(instance)
        try:
            outputs = _as_list(instance(inputs, **kwargs))
        except (ValueError, TypeError, AttributeError, IndexError, UnicodeError) as e:
            raise Unsupported('calling layer %r as the file does fails in Keras 2.3.1: %s: %s'
                              % (layer.name, type(e).__name__, e)) from e
        if has_mask and 'zero_masked_steps' in prepared.conditions.get(layer.name, ()):
            name = '%s_masked_steps' % layer.name
            if index:
                name += '_%d' % index
            outputs[0] = op_layers.ZeroMaskedSteps(name=name)(outputs[0])
        return outputs

    def _arguments(self, layer, node, instance, writer):
        """(inputs, keyword arguments, whether the file passes a mask)."""
        args = list(node.args)
        kwargs = dict(node.kwargs)
        wants_mask = kwargs.pop('mask', None) is not None
        if writer == files.KERAS3:
            kwargs.pop('training', None)
        extra = [kwargs.pop(k) for k in _LIST_KEYWORDS.get(layer.class_name, ())
                 if kwargs.get(k) is not None]
        if not args:
            raise Unsupported('layer %r is called without inputs' % layer.name)
        if len(args) == 1 and not extra:
            inputs = args[0]
        else:
            if any(tensor_refs(a) != [a] for a in args[1:]):
                raise Unsupported('layer %r is called with non-tensor positional arguments '
                                  '%.100r' % (layer.name, args[1:]))
            inputs = args + extra
        call = instance.call
        from keras.utils.generic_utils import has_arg
        for key in list(kwargs):
            if has_arg(call, key):
                continue
            if kwargs[key] is None:
                del kwargs[key]
            else:
                raise Unsupported('layer %r is called with %s=%.80r, which Keras 2.3.1 %s '
                                  'does not take' % (layer.name, key, kwargs[key],
                                                     type(instance).__name__))
        return inputs, kwargs, wants_mask


def _no_mask(inputs, mask=None):
    return None


def _rejects_masks(layer):
    """Whether Keras 2.3.1 raises when this layer gets a mask: it does not
    support masking and keeps the base class's compute_mask (a layer with its
    own compute_mask, Bidirectional's, decides for itself)."""
    base = keras.engine.base_layer.Layer.compute_mask
    return not layer.supports_masking and type(layer).compute_mask is base


def _drop_masks(layer):
    """tf.keras and Keras 3 drop the mask at a layer that does not support
    masking (Flatten after a masked sequence); Keras 2.3.1 raises instead.
    This layer instance takes the mask and passes none on, as they do."""
    layer.supports_masking = True
    layer.compute_mask = _no_mask


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _batch_shape(cfg):
    shape = cfg.get('batch_input_shape', cfg.get('batch_shape'))
    if shape is None and cfg.get('shape') is not None:
        shape = [cfg.get('batch_size')] + list(cfg['shape'])
    return tuple(shape) if shape is not None else None


def _input_mask(inputs):
    from keras.engine.base_layer import _collect_previous_mask
    mask = _collect_previous_mask(inputs)
    if isinstance(mask, list):
        return mask if any(m is not None for m in mask) else None
    return mask


def _mask_only_ops(spec):
    """Names of operation nodes whose outputs reach layers only through
    ``mask=`` arguments (directly or through other such nodes)."""
    if spec.kind != 'functional':
        return set()
    ops = {layer.name for layer in spec.layers if layer.role == 'op'}
    consumers = collections.defaultdict(list)   # producer -> [(consumer, as_mask)]
    for layer in spec.layers:
        for node in layer.nodes:
            for ref in tensor_refs(node.kwargs.get('mask')):
                consumers[ref.layer].append((layer.name, True))
            rest = [node.args, {k: v for k, v in node.kwargs.items() if k != 'mask'}]
            for ref in tensor_refs(rest):
                consumers[ref.layer].append((layer.name, False))
    for ref in spec.outputs:
        consumers[ref.layer].append((None, False))
    mask_only = set()
    changed = True
    while changed:
        changed = False
        for name in ops - mask_only:
            uses = consumers.get(name, [])
            if uses and all(as_mask or consumer in mask_only for consumer, as_mask in uses):
                mask_only.add(name)
                changed = True
    return mask_only
