"""``report``: how far each int8 layer's output is from the float layer's,
so that a user can keep the layers that hurt in float32 (``skip``).

For each quantized layer two errors are measured on the data, each as the
largest absolute difference and the relative RMS (the RMS of the difference
over the RMS of the float output):

- ``in_model``: the int8 model's output of the layer against the float
  model's, each model run on the data: what the layer's output is off by
  where it stands, with every error before it;
- ``isolated``: the int8 layer run on the float layer's own input: what
  quantizing this layer alone costs.
"""
import collections
import math

import numpy as np

from cyback.layers import import_keras
from cyback.quantization.data import Batches, graph_function
from cyback.quantization.layers import LAYERS

LayerError = collections.namedtuple(
    'LayerError', ['name', 'class_name', 'max_abs', 'rel_rms', 'isolated_max_abs',
                   'isolated_rel_rms'])


class QuantizationReport(object):
    """One ``LayerError`` per quantized layer, in the model's order; ``str()``
    is a table."""

    def __init__(self, rows):
        self.rows = list(rows)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, name):
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(name)

    def __str__(self):
        head = ('layer', 'class', 'max abs', 'rel RMS', 'isolated max abs', 'isolated rel RMS')
        body = [(r.name, r.class_name, '%.4g' % r.max_abs, '%.4g' % r.rel_rms,
                 '%.4g' % r.isolated_max_abs, '%.4g' % r.isolated_rel_rms) for r in self.rows]
        widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
        lines = ['  '.join(str(c).ljust(w) for c, w in zip(line, widths))
                 for line in [head] + body]
        return '\n'.join(lines)

    __repr__ = __str__


class _Error(object):
    def __init__(self):
        self.max_abs = 0.0
        self.err2 = 0.0
        self.ref2 = 0.0

    def add(self, got, want):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        diff = got - want
        if diff.size:
            self.max_abs = max(self.max_abs, float(np.max(np.abs(diff))))
        self.err2 += float(np.sum(diff * diff))
        self.ref2 += float(np.sum(want * want))

    def rel_rms(self):
        if self.ref2 > 0:
            return math.sqrt(self.err2 / self.ref2)
        return 0.0 if self.err2 == 0 else math.inf


def report(float_model, quantized_model, data, batch_size=32):
    """The output error of each of ``quantized_model``'s int8 layers against
    the layer of the same name in ``float_model``, on ``data`` (as
    ``quantize``'s calibration data). Returns a ``QuantizationReport``."""
    keras = import_keras()
    for m, what in ((float_model, 'float_model'), (quantized_model, 'quantized_model')):
        if not isinstance(m, keras.models.Model):
            raise TypeError('report: %s must be a Keras model, got %s'
                            % (what, type(m).__name__))
    if len(float_model.inputs) != len(quantized_model.inputs):
        raise ValueError('report: the models have %d and %d inputs'
                         % (len(float_model.inputs), len(quantized_model.inputs)))
    float_layers = {layer.name: layer for layer in float_model.layers}
    pairs = []
    for layer in quantized_model.layers:
        if type(layer) not in _INT8_CLASSES:
            continue
        ref = float_layers.get(layer.name)
        if ref is None:
            raise ValueError('report: the float model has no layer %r' % layer.name)
        pairs.append((layer, ref))
    q_out, f_out, iso, owners = [], [], [], []
    for q, f in pairs:
        q_nodes, f_nodes = _nodes(quantized_model, q), _nodes(float_model, f)
        if len(q_nodes) != len(f_nodes):
            raise ValueError('report: layer %r is called %d times in one model and %d in the '
                             'other' % (q.name, len(q_nodes), len(f_nodes)))
        for qn, fn in zip(q_nodes, f_nodes):
            q_out.append(qn.output_tensors[0])
            f_out.append(fn.output_tensors[0])
            owners.append(q.name)
    for q, f in pairs:
        for fn in _nodes(float_model, f):
            iso.append(_call_alone(keras, q, fn))
    run_q = graph_function(keras, quantized_model.inputs, q_out)
    run_f = graph_function(keras, float_model.inputs, f_out + iso)
    in_model = {q.name: _Error() for q, _ in pairs}
    isolated = {q.name: _Error() for q, _ in pairs}
    if pairs:
        for batch in Batches(data, len(float_model.inputs), batch_size, what='report: data'):
            got = run_q(batch)
            ref = run_f(batch)
            n = len(f_out)
            for name, g, w, i in zip(owners, got, ref[:n], ref[n:]):
                in_model[name].add(g, w)
                isolated[name].add(i, w)
    rows = [LayerError(q.name, type(q).__name__, in_model[q.name].max_abs,
                       in_model[q.name].rel_rms(), isolated[q.name].max_abs,
                       isolated[q.name].rel_rms()) for q, _ in pairs]
    return QuantizationReport(rows)


_INT8_CLASSES = frozenset(LAYERS.values())


def _call_alone(keras, layer, node):
    """``layer``'s first output on the inputs (and mask) of the float
    layer's ``node``."""
    if isinstance(layer, keras.layers.RNN):
        inputs = list(node.input_tensors)
        mask = node.input_masks[0] if node.input_masks else None
        out = layer.call(inputs if len(inputs) > 1 else inputs[0], mask=mask)
        return out[0] if isinstance(out, list) else out
    return layer.call(node.input_tensors[0])


def _nodes(model, layer):
    """The layer's nodes that are part of ``model``, in depth order."""
    return [node for depth in sorted(model._nodes_by_depth, reverse=True)
            for node in model._nodes_by_depth[depth] if node.outbound_layer is layer]
