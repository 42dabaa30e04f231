"""``load_model`` and ``load_weights``: the steps, in order.

1. open the source and tell what wrote it (``files``);
2. refuse serialized code unless ``safe_mode=False`` (``safety``);
3. Keras 2.2/2.3 files: Keras 2.3.1's own loader reads them as it always did;
   tf.keras 2.x and Keras 3 files: parse the config (``tf_keras_config`` /
   ``keras3_config``), create every layer and report all unsupported ones at
   once (``layer_configs``, ``builder``), build the graph;
4. map the weights by layer and variable name, check every shape, assign
   them in one batch (``weights``);
5. optionally compile from the saved training config (``compile_config``).
"""
import warnings

import cyback.layers
from cyback.layers import import_keras
from cyback.quantization import layers as quantized_layers
from cyback.saving import (
    compile_config,
    files,
    keras3_config,
    op_layers,
    safety,
    tf_keras_config,
    weights,
)
from cyback.saving.builder import Builder
from cyback.saving.errors import ModelFileError, UnsafeModelError, UnsupportedLayersError
from cyback.saving.layer_configs import Translator, Unsupported

__all__ = ['load_model', 'load_weights']


def load_model(filepath, custom_objects=None, compile=False, safe_mode=True):
    """Load a model file as a Keras 2.3.1 model running on cyback.

    ``filepath``: a path, an ``os.PathLike``, a binary file object or an open
    ``h5py.File``, holding a model saved by tf.keras/tf_keras 2.x
    (``model.save('m.h5')``), Keras 3 (``.keras`` or legacy ``.h5``) or Keras
    2.2/2.3. ``custom_objects``: name -> Keras 2.3.1 layer class or function,
    for layers neither Keras 2.3.1 nor ``cyback.layers`` provides (they win
    over both). ``compile``: compile the model with the optimizer, loss and
    metrics saved in the file. ``safe_mode``: refuse files that hold Python
    code (Lambda layers); ``False`` lets such code load and run — only for
    files you trust, written by this Python version.

    Raises ``ModelFileError`` for a file that is not a model or is damaged,
    ``UnsafeModelError`` for code under ``safe_mode``,
    ``UnsupportedLayersError`` naming every layer cyback cannot build, and
    ``WeightMismatchError`` for weights that do not fit (all ``ValueError``).
    """
    keras = import_keras()
    with files.open_source(filepath) as source:
        if source.config is None:
            raise ModelFileError(
                '%s holds weights only (no model config): build the model in code and '
                'use cyback.saving.load_weights(model, path)' % source.label)
        findings = safety.find_code(source.config, source.training_config)
        if findings and safe_mode:
            raise UnsafeModelError(source.label, findings)
        if source.writer == files.KERAS2:
            return _load_keras2(keras, source, custom_objects, compile)
        spec, objects, translator = _translation(keras, source, custom_objects)
        model = _build(translator, spec, source.label)
        with files.hdf5_errors(source.label):
            if source.weights_layout == 'vars':
                file_weights = weights.Keras3Source(source.weights, source.label,
                                                    weights.keras3_layout_from_spec(spec))
            else:
                file_weights = weights.H5Source(source.weights, source.label)
            pairs, _ = weights.match_model(model, file_weights, source.label)
            weights.assign(pairs, source.label)
        if compile:
            compile_config.compile_model(model, source.training_config, source.writer,
                                         objects, source.label)
        return model


def load_weights(model, filepath, by_name=False, skip_mismatch=False):
    """Fill ``model`` (a Keras 2.3.1 model on cyback, built in code) from a
    weight file of tf.keras/tf_keras 2.x (``save_weights('w.h5')``), Keras 3
    (``save_weights('w.weights.h5')``), Keras 2 or from a full-model file.

    HDF5 files naming layers (tf.keras, Keras 2, Keras 3 legacy): by default
    the model's layers with weights take the file's in order, as Keras does
    (by name when every name is found); ``by_name=True`` loads only layers
    whose names are in the file. Keras 3 ``.weights.h5`` files address layers
    by class and position in ``model.layers``, as Keras 3 does. Within a
    layer, weights always go by variable name, and every shape is checked.
    ``skip_mismatch=True`` leaves layers whose weights do not fit as they
    are (with a warning) instead of raising ``WeightMismatchError``.
    """
    import_keras()
    with files.open_source(filepath) as source, files.hdf5_errors(source.label):
        if source.weights_layout == 'vars':
            file_weights = weights.Keras3Source(source.weights, source.label,
                                                weights.keras3_layout_from_model(model),
                                                check_names=False)
            pairs, problems = weights.match_model(
                model, file_weights, source.label, skip_missing_layers=by_name,
                skip_mismatch=skip_mismatch)
        else:
            file_weights = weights.H5Source(source.weights, source.label)
            renames = None if by_name else _positional_names(model, file_weights,
                                                             source.label)
            pairs, problems = weights.match_model(
                model, file_weights, source.label, renames=renames,
                skip_missing_layers=by_name, skip_mismatch=skip_mismatch)
        for problem in problems:
            warnings.warn('load_weights: skipped: %s' % problem, stacklevel=2)
        weights.assign(pairs, source.label)
    return model


# -- steps ------------------------------------------------------------------------

def _objects(writer, custom_objects):
    objects = cyback.layers.custom_objects(keras3=(writer == files.KERAS3))
    # models that cyback.quantize made and Keras 2.3.1 saved
    objects.update(quantized_layers.LAYERS)
    objects['TensorOp'] = op_layers.TensorOp
    objects['ZeroMaskedSteps'] = op_layers.ZeroMaskedSteps
    objects.update(custom_objects or {})
    return objects


def _translation(keras, source, custom_objects):
    if source.writer == files.KERAS3:
        spec = keras3_config.parse_model(source.config, files.KERAS3, source.label)
        normalize = keras3_config.normalize_layer
    else:
        spec = tf_keras_config.parse_model(source.config, files.TF_KERAS, source.label)
        normalize = tf_keras_config.normalize_layer
    objects = _objects(source.writer, custom_objects)
    return spec, objects, Translator(keras, objects, normalize)


def _build(translator, spec, label):
    builder = Builder(translator, label)
    prepared = builder.prepare(spec)
    if builder.unsupported:
        raise UnsupportedLayersError(label, builder.unsupported)
    try:
        model = builder.build(prepared)
    except Unsupported as e:
        builder.unsupported.append(('Model', spec.name, str(e)))
        model = None
    if builder.unsupported:
        raise UnsupportedLayersError(label, builder.unsupported)
    return model


def _load_keras2(keras, source, custom_objects, compile):
    """Keras 2.2/2.3 files: Keras 2.3.1's loader, with cyback's layers known.
    It stops at the first unknown layer, so they are all looked up first."""
    objects = _objects(files.KERAS2, custom_objects)
    unknown = _unknown_keras2_layers(keras, source.config, objects)
    if unknown:
        raise UnsupportedLayersError(source.label, unknown)
    with files.hdf5_errors(source.label):
        return keras.models.load_model(source.h5file, custom_objects=objects,
                                       compile=compile)


def _unknown_keras2_layers(keras, config, objects):
    found = []
    body = config.get('config')
    entries = body if isinstance(body, list) else (body or {}).get('layers', [])
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        class_name = entry.get('class_name')
        layer_config = entry.get('config') or {}
        name = entry.get('name') or layer_config.get('name')
        if class_name in ('Model', 'Sequential'):
            found.extend(_unknown_keras2_layers(keras, entry, objects))
            continue
        known = class_name in objects or isinstance(getattr(keras.layers, class_name or '',
                                                            None), type)
        if not known:
            found.append((class_name, name, 'no such layer in Keras 2.3.1 or cyback.layers'))
        inner = layer_config.get('layer')
        if isinstance(inner, dict) and 'class_name' in inner:
            found.extend(_unknown_keras2_layers(
                keras, {'config': {'layers': [inner]}}, objects))
    return found


def _positional_names(model, source, label):
    """Model layer name -> file layer name, pairing the layers that have
    weights in order (Keras's ``load_weights`` without ``by_name``). None
    when every model layer with weights has a file layer of its name."""
    model_layers = [layer for layer in model.layers if layer.weights]
    if all(source.has_layer(layer.name) for layer in model_layers):
        return None
    file_layers = [name for name in source.layer_names if source.has_layer(name)]
    if len(file_layers) != len(model_layers):
        raise ModelFileError(
            '%s has weights for %d layers, the model has %d layers with weights; load by '
            'name (by_name=True) or build the same architecture'
            % (label, len(file_layers), len(model_layers)))
    return {layer.name: name for layer, name in zip(model_layers, file_layers)}
