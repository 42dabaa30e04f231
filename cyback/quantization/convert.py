"""``quantize``: a float32 Keras model in, the same model with its Dense,
Conv1D and Conv2D layers and the input projections of its LSTM, GRU and
SimpleRNN layers in int8 out.

1. pick the layers: Keras's own Dense, Conv1D, Conv2D, LSTM, GRU and
   SimpleRNN (not their subclasses: a transposed, separable or depthwise
   convolution is another computation), convolutions channels_last, not
   named in ``skip``;
2. calibrate: run the float model on the calibration batches and observe
   each picked layer's input (once for ``minmax``, twice for the histogram
   methods), giving its scale and zero point;
3. rebuild the graph node by node with the same inputs (names, shapes,
   dtypes), the int8 layer in place of each picked one and a copy of every
   other layer with its weights;
4. quantize the weights symmetrically per output channel (a recurrent
   layer's input kernel per column; its recurrent kernel stays float32).
"""
import numpy as np

from cyback.layers import convolutional as cyback_layers
from cyback.layers import import_keras
from cyback.quantization import calibration, weights
from cyback.quantization.data import Batches, graph_function
from cyback.quantization.layers import (
    QuantizedConv1D,
    QuantizedConv2D,
    QuantizedConv3D,
    QuantizedDense,
    QuantizedDepthwiseConv2D,
    QuantizedSeparableConv2D,
)
from cyback.quantization.layers import custom_objects as _quantized_objects
from cyback.quantization.recurrent import QuantizedGRU, QuantizedLSTM, QuantizedSimpleRNN


def quantize(model, calibration_data, *, per_channel=True, activations='uint8', skip=(),
             method='minmax', percentile=99.99, batch_size=32):
    """A Keras model computing ``model``'s outputs with its Dense, Conv1D and
    Conv2D layers in int8 (int32 sums), everything else in float32.

    ``calibration_data``: inputs representative of the model's use (see
    ``cyback.quantization.data``), from which each quantized layer's input
    gets a scale and zero point. ``per_channel``: one weight scale per
    output channel (else one per layer). ``activations``: ``"uint8"``
    (asymmetric, a zero point from the range) or ``"int8"`` (symmetric).
    ``skip``: names of layers to keep in float32. ``method``: ``"minmax"``
    (the observed range), ``"percentile"`` (clipped at ``percentile`` at
    each end) or ``"entropy"`` (the clipping with the least KL divergence).
    The model's weights are not changed; the result has new layers with the
    same names.
    """
    keras = import_keras()
    _check_model(keras, model)
    if activations not in calibration.ACTIVATIONS:
        raise ValueError('quantize: activations must be one of %s, got %r'
                         % (calibration.ACTIVATIONS, activations))
    if method not in calibration.METHODS:
        raise ValueError('quantize: method must be one of %s, got %r'
                         % (calibration.METHODS, method))
    if not isinstance(per_channel, bool):
        raise TypeError('quantize: per_channel must be True or False, got %r' % (per_channel,))
    skip = _check_skip(model, skip)
    picked = [layer for layer in model.layers if layer.name not in skip and
              quantizable(keras, layer)]
    nodes = _model_nodes(model)
    inputs_of = {layer.name: [node.input_tensors[0] for node in nodes
                              if node.outbound_layer is layer] for layer in picked}
    params = _calibrate(keras, model, picked, inputs_of, calibration_data, method, percentile,
                        activations, batch_size)
    quantized = {layer.name: _int8_layer(keras, layer, *params[layer.name]) for layer in picked}
    result, layer_map = _rebuild(keras, model, quantized)
    for old, new in layer_map.items():
        if old.name in quantized:
            _set_int8_weights(old, new, per_channel)
        elif old.weights:
            new.set_weights(old.get_weights())
    return result


def quantizable(keras, layer):
    """Whether ``quantize`` runs ``layer`` in int8."""
    kind = type(layer)
    if kind is keras.layers.Dense:
        return True
    if kind in (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D):
        return True         # channels_first through a transpose
    if kind in (cyback_layers.Conv1D, cyback_layers.Conv2D):
        # the Conv1D/Conv2D of models loaded from tf.keras and Keras 3 files, with
        # tf.keras's groups: one group is Keras's own convolution
        return layer.groups == 1
    if kind in (keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D):
        return layer.data_format == 'channels_last'
    return kind in _recurrent_classes(keras)


def _recurrent_classes(keras):
    return {keras.layers.LSTM: QuantizedLSTM, keras.layers.GRU: QuantizedGRU,
            keras.layers.SimpleRNN: QuantizedSimpleRNN}


def _check_model(keras, model):
    if not isinstance(model, keras.models.Model):
        raise TypeError('quantize: expected a Keras model, got %s' % type(model).__name__)
    if not getattr(model, 'built', False) or not getattr(model, '_input_layers', None):
        raise ValueError('quantize: the model has no inputs yet; build it (give the first '
                         'layer an input_shape, or call it on data) before quantizing')


def _check_skip(model, skip):
    if isinstance(skip, str):
        skip = (skip,)
    try:
        skip = set(skip)
    except TypeError:
        raise TypeError('quantize: skip must be a list of layer names, got %r'
                        % (skip,)) from None
    unknown = sorted(str(s) for s in skip - {layer.name for layer in model.layers})
    if unknown:
        raise ValueError('quantize: skip names layers the model does not have: %s'
                         % ', '.join(unknown))
    return skip


def _model_nodes(model):
    return [node for depth in sorted(model._nodes_by_depth, reverse=True)
            for node in model._nodes_by_depth[depth]]


def _calibrate(keras, model, picked, inputs_of, data, method, percentile, activations,
               batch_size):
    """layer name -> (input scale, input zero point)."""
    if not picked:
        return {}
    observers = {layer.name: calibration.Observer(method, percentile,
                                                  symmetric=(activations == 'int8'))
                 for layer in picked}
    tensors, owners = [], []
    for layer in picked:
        for t in inputs_of[layer.name]:
            tensors.append(t)
            owners.append(layer.name)
            if type(layer) is keras.layers.SeparableConv2D:
                # the depthwise result inside the layer, requantized before
                # the pointwise product
                observers[(layer.name, 'depthwise')] = calibration.Observer(
                    method, percentile, symmetric=(activations == 'int8'))
                tensors.append(keras.backend.depthwise_conv2d(
                    t, layer.depthwise_kernel, strides=layer.strides, padding=layer.padding,
                    data_format=layer.data_format, dilation_rate=layer.dilation_rate))
                owners.append((layer.name, 'depthwise'))
    run = graph_function(keras, model.inputs, tensors)
    batches = Batches(data, len(model.inputs), batch_size)
    for pass_index in range(observers[picked[0].name].passes):
        for batch in batches:
            for name, value in zip(owners, run(batch)):
                observers[name].observe(value, pass_index)
    params = {name: obs.scale_and_zero(activations) for name, obs in observers.items()
              if isinstance(name, str)}
    for name, obs in observers.items():
        if not isinstance(name, str):
            params[name[0]] += obs.scale_and_zero(activations)
    return params


def _int8_layer(keras, layer, scale, zero, *middle):
    config = layer.get_config()
    recurrent = _recurrent_classes(keras).get(type(layer))
    if recurrent is not None:
        keys = ['units', 'activation', 'recurrent_activation', 'use_bias', 'return_sequences',
                'return_state', 'go_backwards', 'stateful', 'unroll', 'reset_after']
        args = {key: config[key] for key in keys if key in config}
        return recurrent(name=layer.name, input_scale=scale, input_zero_point=zero, **args)
    common = dict(name=layer.name, activation=layer.activation,
                  use_bias=config['use_bias'], input_scale=scale, input_zero_point=zero)
    if isinstance(layer, keras.layers.Dense):
        return QuantizedDense(config['units'], **common)
    if type(layer) in (keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D):
        args = dict(strides=config['strides'], padding=config['padding'],
                    depth_multiplier=config['depth_multiplier'],
                    dilation_rate=config.get('dilation_rate', 1), **common)
        if type(layer) is keras.layers.DepthwiseConv2D:
            return QuantizedDepthwiseConv2D(config['kernel_size'], **args)
        return QuantizedSeparableConv2D(config['filters'], config['kernel_size'],
                                        depthwise_output_scale=middle[0],
                                        depthwise_output_zero_point=middle[1], **args)
    cls = {1: QuantizedConv1D, 2: QuantizedConv2D, 3: QuantizedConv3D}[layer.rank]
    return cls(config['filters'], config['kernel_size'], strides=config['strides'],
               padding=config['padding'], dilation_rate=config['dilation_rate'],
               data_format=config['data_format'], **common)


def _set_int8_weights(old, new, per_channel):
    values = old.get_weights()
    if isinstance(new, (QuantizedDepthwiseConv2D, QuantizedSeparableConv2D)):
        # a depthwise kernel (kh, kw, C, M) has C * M output channels
        dw = values[0]
        codes, scale = weights.quantize_kernel(dw.reshape(dw.shape[:2] + (-1,)), per_channel)
        arrays = [codes.reshape(dw.shape), scale]
        if isinstance(new, QuantizedSeparableConv2D):
            arrays += list(weights.quantize_kernel(values[1], per_channel))
            values = values[1:]
        if new.use_bias:
            arrays.append(np.asarray(values[1], dtype=np.float32))
        new.set_weights(arrays)
        return
    codes, scale = weights.quantize_kernel(values[0], per_channel)
    arrays = [codes, scale]
    if isinstance(new, (QuantizedLSTM, QuantizedGRU, QuantizedSimpleRNN)):
        # kernel, recurrent kernel[, bias]: the recurrent product stays float32
        arrays += [np.asarray(v, dtype=np.float32) for v in values[1:]]
    elif new.use_bias:
        arrays.append(np.asarray(values[1], dtype=np.float32))
    new.set_weights(arrays)


def _rebuild(keras, model, replacements):
    """A functional model on new Input layers like ``model``'s, calling a
    copy of each layer (or its replacement, by name) node by node in the
    order of ``model``'s graph. Returns it and {old layer: new layer}."""
    layer_map = {}
    tensor_map = {}
    inputs = []
    for layer in model._input_layers:
        x = keras.layers.Input(batch_shape=layer.batch_input_shape, dtype=layer.dtype,
                               sparse=layer.sparse, name=layer.name)
        inputs.append(x)
    for old, new in zip(model.inputs, inputs):
        tensor_map[id(old)] = new
    with keras.utils.custom_object_scope(_quantized_objects()):
        for node in _model_nodes(model):
            layer = node.outbound_layer
            if isinstance(layer, keras.engine.InputLayer):
                continue
            new = layer_map.get(layer)
            if new is None:
                new = replacements.get(layer.name)
                if new is None:
                    new = layer.__class__.from_config(layer.get_config())
                layer_map[layer] = new
            refs = node.input_tensors
            args = [tensor_map[id(x)] for x in refs]
            outs = new(args[0] if len(args) == 1 else args, **(node.arguments or {}))
            outs = outs if isinstance(outs, list) else [outs]
            for ref, out in zip(node.output_tensors, outs):
                tensor_map[id(ref)] = out
    outputs = [tensor_map[id(x)] for x in model.outputs]
    return keras.models.Model(inputs, outputs, name=model.name), layer_map
