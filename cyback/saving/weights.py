"""Put a file's weights into a Keras 2.3.1 model, by layer and variable name.

Every weight gets a key: its variable name (``kernel``, ``moving_mean``...)
preceded by the roles of the sub-layers it sits in that tell two weights of
one layer apart (a Bidirectional's ``forward``/``backward`` layer,
MultiHeadAttention's ``query``/``key``/``value``/``attention_output``
projections). Other path parts (an RNN's cell, a TimeDistributed's inner
layer, uniquifying ``_1`` suffixes) do not matter. A model weight is filled
from the file weight with the same key in the same layer; a key missing on
either side, a key that is not unique, or a shape that differs is a problem,
and all problems are reported together.

The files name weights in two ways:

- ``H5Source``: a group per layer whose ``weight_names`` attribute lists
  variable names (``dense/kernel:0``; Keras 3's legacy .h5 drops ``:0``;
  a nested model's group holds all its layers' weights);
- ``Keras3Source``: Keras 3's ``layers/<class>_<n>/vars/<i>``, where a layer
  is addressed by its class name numbered in ``model.layers`` order and its
  variables by creation order. The order of each class's variables is the
  table ``_OWN_VARIABLES`` below (from Keras 3's ``build`` methods), and
  sub-layers are the attributes in ``_SUBLAYERS``; the ``name`` attribute
  Keras 3 writes on each ``vars`` group is checked against the layer's name.
"""
import re

import numpy as np

from cyback.saving.errors import WeightMismatchError
from cyback.saving.files import attr_list, attr_text, read_dataset

__all__ = ['FileVar', 'H5Source', 'Keras3Source', 'keras3_layout_from_spec',
           'keras3_layout_from_model', 'match_model', 'assign', 'canonical_key',
           'snake_case']

_DIRECTIONS = ('forward', 'backward')
_ROLE_NAMES = ('query', 'key', 'value', 'attention_output')
# Keras 3 names a depthwise convolution's kernel 'kernel'; tf.keras and
# Keras 2.3.1 'depthwise_kernel'.
_ALIASES = {'DepthwiseConv1D': {'kernel': 'depthwise_kernel'},
            'DepthwiseConv2D': {'kernel': 'depthwise_kernel'}}


def canonical_key(components, aliases=None):
    """The key of a weight from the parts of its name below its layer."""
    *path, var = components
    var = var.split(':')[0]
    if aliases:
        var = aliases.get(var, var)
    roles = []
    for part in path:
        base = re.sub(r'_\d+$', '', part)
        for direction in _DIRECTIONS:
            if base.startswith(direction):
                roles.append(direction)
                break
        else:
            if base in _ROLE_NAMES:
                roles.append(base)
    return tuple(roles) + (var,)


def snake_case(name):
    """A class name as Keras 3 writes it in weight paths (Conv2D -> conv2d,
    BatchNormalization -> batch_normalization, ReLU -> re_lu)."""
    name = re.sub(r'\W+', '', name)
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i > 0:
            prev = name[i - 1]
            nxt = name[i + 1] if i + 1 < len(name) else ''
            if prev.islower() or (nxt.islower() and prev != '_'):
                out.append('_')
        out.append(ch.lower())
    return ''.join(out)


class FileVar:
    """One weight of the file: ``key``, the HDF5 dataset and where it is."""

    def __init__(self, key, dataset, where):
        self.key = key
        self.dataset = dataset
        self.where = where

    @property
    def shape(self):
        return tuple(self.dataset.shape)


# -- the file side: tf.keras / Keras 2 / Keras 3 legacy layout ---------------------

class H5Source:
    """Weights under a group per layer (``layer_names``, ``weight_names``)."""

    def __init__(self, group, label):
        self.group = group
        self.label = label
        self.layer_names = attr_list(group, 'layer_names')
        self._entries = {}
        self._consumed = set()

    def entries(self, top):
        if top not in self._entries:
            if top not in self.group:
                raise WeightMismatchError(self.label, [
                    'the file lists layer %r but has no group for it (damaged file)' % top])
            layer_group = self.group[top]
            found = []
            for name in attr_list(layer_group, 'weight_names'):
                if name not in layer_group:
                    raise WeightMismatchError(self.label, [
                        'layer %r lists weight %r, which the file does not hold (damaged '
                        'file)' % (top, name)])
                found.append((name, layer_group[name]))
            self._entries[top] = found
        return self._entries[top]

    def has_layer(self, top):
        return top in self.layer_names and bool(self.entries(top))

    def layer_vars(self, path, class_name, file_top=None):
        """FileVars of the layer at ``path`` (names from the top model down);
        ``file_top`` is the file's name for ``path[0]`` when they differ."""
        top = file_top or path[0]
        if top not in self.layer_names:
            return None
        leaf = path[-1]
        aliases = _ALIASES.get(class_name)
        result = []
        for name, dataset in self.entries(top):
            parts = name.split('/')
            if len(path) == 1:
                if parts[0] in (leaf, top) and len(parts) > 1:
                    parts = parts[1:]
            else:
                if leaf not in parts[:-1]:
                    continue
                parts = parts[parts.index(leaf) + 1:]
            self._consumed.add((top, name))
            result.append(FileVar(canonical_key(parts, aliases), dataset,
                                  '%s/%s' % (top, name)))
        return result

    def unconsumed(self, tops=None):
        left = []
        for top in (tops if tops is not None else self.layer_names):
            if top not in self.layer_names:
                continue
            for name, _ in self.entries(top):
                if (top, name) not in self._consumed:
                    left.append('%s/%s' % (top, name))
        return left


# -- the file side: Keras 3 layout ------------------------------------------------

def _bias(cfg):
    return ['bias'] if cfg.get('use_bias', True) else []


def _norm(cfg, stats=()):
    names = []
    if cfg.get('scale', True) or cfg.get('rms_scaling'):
        names.append('gamma')
    if cfg.get('center', True) and not cfg.get('rms_scaling'):
        names.append('beta')
    return names + list(stats)


def _normalization(cfg):
    # Keras 3 keeps adapted statistics as variables only when the config
    # does not give mean and variance.
    return [] if cfg.get('mean') is not None else ['mean', 'variance', 'count']


def _einsum(cfg):
    return ['kernel'] + (['bias'] if cfg.get('bias_axes') else [])


_OWN_VARIABLES = {
    'Dense': lambda c: ['kernel'] + _bias(c),
    'EinsumDense': _einsum,
    'Embedding': lambda c: ['embeddings'],
    'PReLU': lambda c: ['alpha'],
    'BatchNormalization': lambda c: _norm(c, ('moving_mean', 'moving_variance')),
    'LayerNormalization': _norm,
    'GroupNormalization': _norm,
    'Normalization': _normalization,
    'LayerScale': lambda c: ['gamma'],
    'DepthwiseConv1D': lambda c: ['depthwise_kernel'] + _bias(c),
    'DepthwiseConv2D': lambda c: ['depthwise_kernel'] + _bias(c),
    'SeparableConv1D': lambda c: ['depthwise_kernel', 'pointwise_kernel'] + _bias(c),
    'SeparableConv2D': lambda c: ['depthwise_kernel', 'pointwise_kernel'] + _bias(c),
    'LSTMCell': lambda c: ['kernel', 'recurrent_kernel'] + _bias(c),
    'GRUCell': lambda c: ['kernel', 'recurrent_kernel'] + _bias(c),
    'SimpleRNNCell': lambda c: ['kernel', 'recurrent_kernel'] + _bias(c),
    'ConvLSTMCell': lambda c: ['kernel', 'recurrent_kernel'] + _bias(c),
}
_OWN_VARIABLES.update(dict.fromkeys(
    ('Conv1D', 'Conv2D', 'Conv3D', 'Conv1DTranspose', 'Conv2DTranspose', 'Conv3DTranspose'),
    lambda c: ['kernel'] + _bias(c)))

_RNN_CELLS = {'LSTM': 'LSTMCell', 'GRU': 'GRUCell', 'SimpleRNN': 'SimpleRNNCell',
              'ConvLSTM1D': 'ConvLSTMCell', 'ConvLSTM2D': 'ConvLSTMCell',
              'ConvLSTM3D': 'ConvLSTMCell'}


def _inner(entry):
    return entry.get('class_name'), entry.get('config') or {}


def _sublayers(class_name, cfg):
    """(attribute or attribute candidates, role, class_name, config) of a
    layer's sub-layers."""
    if class_name in _RNN_CELLS:
        return [('cell', None, _RNN_CELLS[class_name], cfg)]
    if class_name == 'RNN' and isinstance(cfg.get('cell'), dict):
        return [('cell', None) + _inner(cfg['cell'])]
    if class_name == 'Bidirectional':
        forward = _inner(cfg['layer'])
        backward = _inner(cfg['backward_layer']) if cfg.get('backward_layer') else forward
        return [('forward_layer', 'forward') + forward,
                ('backward_layer', 'backward') + backward]
    if class_name == 'TimeDistributed':
        return [('layer', None) + _inner(cfg['layer'])]
    if class_name == 'MultiHeadAttention':
        # Keras 3 names the projections' attributes query_dense...; tf_keras's
        # own zip format keeps the private _query_dense...
        bias = {'bias_axes': 'x'} if cfg.get('use_bias', True) else {}
        return [((attr, '_' + attr), role, 'EinsumDense', bias) for attr, role in (
            ('query_dense', 'query'), ('key_dense', 'key'), ('value_dense', 'value'),
            ('output_dense', 'attention_output'))]
    return []


class Keras3Source:
    """Weights in Keras 3's layout. ``layout`` maps a layer path (names from
    the top model down) to (HDF5 path, Keras 3 class name, config).
    ``check_names``: the layer names Keras 3 stores must be the layout's (a
    file's own config); a model built in code may name its layers
    differently, like Keras 3, which addresses them by class and position."""

    def __init__(self, root, label, layout, check_names=True):
        self.root = root
        self.label = label
        self.layout = layout
        self.check_names = check_names
        self._consumed = set()
        self.problems = []

    def layer_vars(self, path, class_name=None, file_top=None):
        if file_top is not None:
            path = (file_top,) + tuple(path[1:])
        if path not in self.layout:
            return None
        h5path, k3_class, cfg = self.layout[path]
        result = []
        self._collect(h5path, k3_class, cfg, (), result, path[-1])
        return result

    def _collect(self, h5path, class_name, cfg, roles, result, layer_name):
        group = self.root.get(h5path + '/vars')
        datasets = self._datasets(group)
        if (self.check_names and group is not None and layer_name is not None
                and 'name' in group.attrs):
            stored = attr_text(group.attrs['name'])
            if stored != layer_name:
                self.problems.append(
                    '%s/vars belongs to layer %r, but the config puts layer %r there'
                    % (h5path, stored, layer_name))
        if datasets:
            table = _OWN_VARIABLES.get(class_name)
            if table is None:
                self.problems.append(
                    '%s: %d weights of a %s, whose variable order cyback does not know'
                    % (h5path, len(datasets), class_name))
                for name, _ in datasets:
                    self._consumed.add('%s/vars/%s' % (h5path, name))
            else:
                names = table(cfg)
                if len(names) != len(datasets):
                    self.problems.append(
                        '%s: a %s with this config has %d weights (%s), the file %d'
                        % (h5path, class_name, len(names), ', '.join(names), len(datasets)))
                for (index, dataset), var in zip(datasets, names):
                    where = '%s/vars/%s' % (h5path, index)
                    self._consumed.add(where)
                    result.append(FileVar(tuple(roles) + (var,), dataset, where))
        for attrs, role, sub_class, sub_cfg in _sublayers(class_name, cfg):
            if isinstance(attrs, str):
                attrs = (attrs,)
            attr = next((a for a in attrs if '%s/%s' % (h5path, a) in self.root), attrs[0])
            sub_roles = roles + ((role,) if role else ())
            self._collect('%s/%s' % (h5path, attr), sub_class, sub_cfg, sub_roles, result,
                          None)

    @staticmethod
    def _datasets(group):
        if group is None:
            return []
        items = []
        for key in group.keys():
            if key.isdigit():
                items.append((int(key), group[key]))
        return [(str(i), ds) for i, ds in sorted(items)]

    def unconsumed(self, tops=None):
        left = []
        layers = self.root.get('layers')
        if layers is None:
            return left

        def visit(name, obj):
            if hasattr(obj, 'shape') and '/vars/' in '/' + name:
                where = 'layers/' + name
                if where not in self._consumed:
                    left.append(where)
        layers.visititems(visit)
        return left


def keras3_layout_from_spec(spec):
    """Layer path -> (HDF5 path, class, config) of a Keras 3 file's model."""
    layout = {}
    _spec_layout(spec, 'layers', (), layout)
    return layout


def _spec_layout(spec, prefix, names, layout):
    used = {}
    for layer in spec.layers:
        if layer.role == 'op' or (layer.role == 'input' and spec.kind == 'sequential'):
            continue
        segment = _unique(snake_case(layer.class_name), used)
        path = '%s/%s' % (prefix, segment)
        if layer.role == 'model':
            _spec_layout(layer.model, path + '/layers', names + (layer.name,), layout)
        else:
            layout[names + (layer.name,)] = (path, layer.class_name, layer.config)


def _unique(name, used):
    if name in used:
        used[name] += 1
        return '%s_%d' % (name, used[name])
    used[name] = 0
    return name


def keras3_layout_from_model(model):
    """The same for a Keras 2.3.1 model built in code: Keras 3's class names
    are Keras 2.3.1's (a Model is Keras 3's Functional)."""
    layout = {}
    _model_layout(model, 'layers', (), layout)
    return layout


def _model_layout(model, prefix, names, layout):
    import keras
    used = {}
    for layer in model.layers:
        if isinstance(layer, keras.engine.InputLayer) and isinstance(
                model, keras.models.Sequential):
            continue
        if isinstance(layer, keras.models.Sequential):
            class_name = 'Sequential'
        elif isinstance(layer, keras.engine.network.Network):
            class_name = 'Functional'
        else:
            class_name = type(layer).__name__
        path = '%s/%s' % (prefix, _unique(snake_case(class_name), used))
        if class_name in ('Sequential', 'Functional'):
            _model_layout(layer, path + '/layers', names + (layer.name,), layout)
        else:
            layout[names + (layer.name,)] = (path, class_name, layer.get_config())


# -- the model side ---------------------------------------------------------------

def _is_model(layer):
    import keras
    return isinstance(layer, keras.engine.network.Network)


def weighted_layers(model, names=()):
    """(path, layer) of every layer that owns weights, nested models
    walked into."""
    found = []
    for layer in model.layers:
        if _is_model(layer):
            found.extend(weighted_layers(layer, names + (layer.name,)))
        elif layer.weights:
            found.append((names + (layer.name,), layer))
    return found


def target_vars(layer):
    """(key, variable) of a Keras 2.3.1 layer's weights."""
    result = []
    for variable in layer.weights:
        parts = variable.name.split('/')
        if layer.name in parts[:-1]:
            parts = parts[parts.index(layer.name) + 1:]
        result.append((canonical_key(parts), variable))
    return result


def match_layer(path, layer, file_vars, problems):
    """[(variable, FileVar)] for one layer; problems appended."""
    label = '/'.join(path)
    targets = target_vars(layer)
    by_key = {}
    for var in file_vars:
        if var.key in by_key:
            problems.append('layer %r: the file has two weights named %s (%s, %s)'
                            % (label, '/'.join(var.key), by_key[var.key].where, var.where))
            return []
        by_key[var.key] = var
    seen = set()
    pairs = []
    for key, variable in targets:
        if key in seen:
            problems.append('layer %r: two model weights are named %s; they cannot be told '
                            'apart by name' % (label, '/'.join(key)))
            return []
        seen.add(key)
        source = by_key.get(key)
        if source is None:
            problems.append('layer %r (%s): weight %s is not in the file (the file has: %s)'
                            % (label, type(layer).__name__, '/'.join(key),
                               ', '.join('/'.join(k) for k in by_key) or 'none'))
            continue
        want = tuple(int(d) for d in variable.shape)
        if source.shape != want:
            problems.append('layer %r: weight %s has shape %s in the file (%s), the model '
                            'needs %s' % (label, '/'.join(key), source.shape, source.where,
                                          want))
            continue
        pairs.append((variable, source))
    for key, var in by_key.items():
        if key not in seen:
            problems.append('layer %r (%s): the file has weight %s (%s), which the model '
                            'layer does not have' % (label, type(layer).__name__,
                                                     '/'.join(key), var.where))
    return pairs


def match_model(model, source, label, renames=None, skip_missing_layers=False,
                skip_mismatch=False):
    """[(variable, FileVar)] for the whole model; raises WeightMismatchError
    with every problem unless ``skip_mismatch`` (then mismatching layers are
    left as they are, and the problems returned as warnings).

    ``renames`` maps a model layer path's first name to the file's
    (``load_weights`` by position)."""
    problems = []
    warnings = []
    pairs = []
    for path, layer in weighted_layers(model):
        file_top = (renames or {}).get(path[0])
        file_vars = source.layer_vars(path, type(layer).__name__, file_top=file_top)
        if file_vars is None:
            if not skip_missing_layers:
                problems.append('layer %r (%s) has weights, the file has none for it'
                                % ('/'.join(path), type(layer).__name__))
            continue
        layer_problems = []
        layer_pairs = match_layer(path, layer, file_vars, layer_problems)
        if layer_problems and skip_mismatch:
            warnings.extend(layer_problems)
            continue
        problems.extend(layer_problems)
        pairs.extend(layer_pairs)
    problems.extend(getattr(source, 'problems', []))
    if not skip_missing_layers:
        for where in source.unconsumed():
            problems.append('the file has weight %s, which no model layer takes' % where)
    if problems:
        raise WeightMismatchError(label, problems)
    return pairs, warnings


def assign(pairs, label):
    """Set every variable from its file weight in one batch."""
    import keras
    values = []
    for variable, source in pairs:
        array = read_dataset(source.dataset, label)
        dtype = np.dtype(keras.backend.dtype(variable))
        values.append((variable, np.asarray(array).astype(dtype, copy=False)))
    keras.backend.batch_set_value(values)
