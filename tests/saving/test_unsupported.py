"""Layers cyback cannot build are reported together, by class and name; the
caller's custom_objects fill the gaps."""
import json
import os
import shutil
import zipfile

import h5py
import keras
import numpy as np
import pytest

import cyback
from cyback.saving import UnsupportedLayersError

from .conftest import FIXTURES_DIR
from .test_fixtures import assert_outputs, reference


def rewrite_h5(tmp_path, filename, change):
    """A copy of a fixture .h5 whose model config went through change()."""
    path = str(tmp_path / filename)
    shutil.copy(os.path.join(FIXTURES_DIR, filename), path)
    with h5py.File(path, 'r+') as f:
        config = json.loads(f.attrs['model_config'])
        change(config)
        f.attrs['model_config'] = json.dumps(config)
    return path


def rewrite_keras(tmp_path, filename, change):
    path = str(tmp_path / filename)
    with zipfile.ZipFile(os.path.join(FIXTURES_DIR, filename)) as src, \
            zipfile.ZipFile(path, 'w') as dst:
        for member in src.namelist():
            data = src.read(member)
            if member == 'config.json':
                config = json.loads(data)
                change(config)
                data = json.dumps(config)
            dst.writestr(member, data)
    return path


def layer_named(config, name):
    for entry in config['config']['layers']:
        if entry.get('name', entry['config'].get('name')) == name:
            return entry
    raise KeyError(name)


def spoil_cnn(config):
    layers = config['config']['layers']
    by_class = {}
    for entry in layers:
        by_class.setdefault(entry['class_name'], []).append(entry)
    by_class['Activation'][0]['class_name'] = 'FancyLayer'
    by_class['ReLU'][0]['class_name'] = 'SparkleLayer'
    by_class['BatchNormalization'][1]['config']['renorm'] = True


def test_every_unsupported_layer_in_one_error(tmp_path):
    path = rewrite_h5(tmp_path, 'cnn_bn.tf_keras.h5', spoil_cnn)
    with pytest.raises(UnsupportedLayersError) as info:
        cyback.load_model(path)
    entries = {(cls, name) for cls, name, _ in info.value.layers}
    assert entries == {('FancyLayer', 'activation'), ('SparkleLayer', 're_lu'),
                       ('BatchNormalization', 'batch_normalization_1')}
    message = str(info.value)
    assert "FancyLayer 'activation'" in message
    assert "SparkleLayer 're_lu'" in message
    assert 'renorm=True' in message
    assert '3 layers cannot be loaded' in message


class FancyLayer(keras.layers.Activation):
    pass


class SparkleLayer(keras.layers.ReLU):
    pass


def test_custom_objects_fill_the_gaps(tmp_path):
    path = rewrite_h5(tmp_path, 'cnn_bn.tf_keras.h5', spoil_cnn)
    with pytest.raises(UnsupportedLayersError) as info:
        cyback.load_model(path, custom_objects={'FancyLayer': FancyLayer})
    assert {entry[:2] for entry in info.value.layers} == {
        ('BatchNormalization', 'batch_normalization_1'), ('SparkleLayer', 're_lu')}

    def only_classes(config):
        spoil_cnn(config)
        layer_named(config, 'batch_normalization_1')['config']['renorm'] = False
    path = rewrite_h5(tmp_path, 'cnn_bn.tf_keras.h5', only_classes)
    model = cyback.load_model(path, custom_objects={'FancyLayer': FancyLayer,
                                                    'SparkleLayer': SparkleLayer})
    assert isinstance(model.get_layer('activation'), FancyLayer)
    _, xs, ys = reference('cnn_bn.tf_keras.h5')
    assert_outputs(model, xs, ys)


def test_keras3_registered_name_is_looked_up(tmp_path):
    def register(config):
        entry = layer_named(config, 'subtract')
        entry['class_name'] = 'Sparkle'
        entry['registered_name'] = 'my_package>Sparkle'
        entry['module'] = 'my_package.layers'
    path = rewrite_keras(tmp_path, 'shared_layer.keras3.keras', register)
    with pytest.raises(UnsupportedLayersError, match="Sparkle 'subtract'"):
        cyback.load_model(path)
    model = cyback.load_model(
        path, custom_objects={'my_package>Sparkle': keras.layers.Subtract})
    _, xs, ys = reference('shared_layer.keras3.keras')
    assert_outputs(model, xs, ys)


def test_unknown_operations_are_listed(tmp_path):
    def spoil(config):
        for entry in config['config']['layers']:
            if entry['class_name'] == 'TFOpLambda':
                entry['config']['function'] = 'math.cumsum'
    path = rewrite_h5(tmp_path, 'tensor_ops.tf_keras.h5', spoil)
    with pytest.raises(UnsupportedLayersError) as info:
        cyback.load_model(path)
    assert len(info.value.layers) == 3
    assert all(cls == 'TFOpLambda' and 'tf.math.cumsum' in reason
               for cls, _, reason in info.value.layers)

    def spoil3(config):
        for entry in config['config']['layers']:
            if entry['class_name'] == 'Multiply' and 'trainable' not in entry['config']:
                entry['class_name'] = 'Einsum'
    path = rewrite_keras(tmp_path, 'tensor_ops.keras3.keras', spoil3)
    with pytest.raises(UnsupportedLayersError, match='Keras 3 operation Einsum'):
        cyback.load_model(path)


@pytest.mark.parametrize('key, value, expect', [
    ('activation', 'sparkle', "activation 'sparkle' is not an activation"),
    ('kernel_regularizer', {'class_name': 'OrthogonalRegularizer', 'config': {}},
     'OrthogonalRegularizer'),
    ('kernel_constraint', {'class_name': 'Sparkle', 'config': {}}, 'Sparkle'),
    ('lora_rank', 4, 'lora_rank=4'),
])
def test_unsupported_arguments(tmp_path, key, value, expect):
    def spoil(config):
        layer_named(config, 'dense')['config'][key] = value
    path = rewrite_keras(tmp_path, 'shared_layer.keras3.keras', spoil)
    with pytest.raises(UnsupportedLayersError) as info:
        cyback.load_model(path)
    assert info.value.layers[0][:2] == ('Dense', 'dense')
    assert expect in info.value.layers[0][2]


def test_ignorable_arguments_are_dropped(tmp_path):
    def noise(config):
        cfg = layer_named(config, 'dense')['config']
        cfg.update({'lora_rank': None, 'quantization_config': None, 'groups': 1})
    path = rewrite_keras(tmp_path, 'shared_layer.keras3.keras', noise)
    model = cyback.load_model(path)
    _, xs, ys = reference('shared_layer.keras3.keras')
    assert_outputs(model, xs, ys)


def test_sparse_input_is_refused(tmp_path):
    def sparse(config):
        layer_named(config, 'left')['config']['sparse'] = True
    path = rewrite_keras(tmp_path, 'shared_layer.keras3.keras', sparse)
    with pytest.raises(UnsupportedLayersError, match="InputLayer 'left': sparse"):
        cyback.load_model(path)


def test_mask_keras_does_not_compute_is_refused(tmp_path):
    # Without mask_zero, Keras 2.3.1 gives the LSTM no mask, but the file
    # still passes one: loading would silently change the result.
    def no_mask_zero(config):
        layer_named(config, 'embedding')['config']['mask_zero'] = False
    path = rewrite_keras(tmp_path, 'embedding_bilstm.keras3.keras', no_mask_zero)
    with pytest.raises(UnsupportedLayersError, match="Bidirectional 'bidirectional'.*mask"):
        cyback.load_model(path)


def test_zero_output_for_mask_writes_zeros_at_masked_steps(tmp_path):
    def zero_output(config):
        layer_named(config, 'lstm')['config']['zero_output_for_mask'] = True
    path = rewrite_keras(tmp_path, 'masking_lstm.keras3.keras', zero_output)
    model = cyback.load_model(path)
    # The masked average that follows ignores masked steps: same outputs.
    _, xs, ys = reference('masking_lstm.keras3.keras')
    assert_outputs(model, xs, ys)
    zeroed = model.get_layer('lstm_masked_steps')
    steps = keras.models.Model(model.input, zeroed.output).predict(xs[0])
    masked = ~np.any(xs[0] != 0.0, axis=-1)
    assert masked.any() and (~masked).any()
    assert np.all(steps[masked] == 0.0)
    assert np.all(np.abs(steps[~masked]).sum(axis=-1) > 0)

    # Without a mask the flag changes nothing, and no layer is added.
    path = rewrite_keras(tmp_path, 'gru_timedistributed.keras3.keras',
                         lambda c: layer_named(c, 'gru')['config'].update(
                             zero_output_for_mask=True))
    model = cyback.load_model(path)
    assert 'ZeroMaskedSteps' not in [type(layer).__name__ for layer in model.layers]
    _, xs, ys = reference('gru_timedistributed.keras3.keras')
    assert_outputs(model, xs, ys)


def test_bidirectional_with_a_different_backward_layer_is_refused(tmp_path):
    def spoil(config):
        cfg = layer_named(config, 'bidirectional')['config']
        cfg['backward_layer']['config']['units'] = 5
    path = rewrite_keras(tmp_path, 'embedding_bilstm.keras3.keras', spoil)
    with pytest.raises(UnsupportedLayersError, match='backward layer'):
        cyback.load_model(path)


def test_keras3_sequential_without_input_layer_uses_build_config(tmp_path):
    def drop_input(config):
        layers = config['config']['layers']
        assert layers[0]['class_name'] == 'InputLayer'
        del layers[0]
    path = rewrite_keras(tmp_path, 'cnn_bn.keras3.keras', drop_input)
    model = cyback.load_model(path)
    _, xs, ys = reference('cnn_bn.keras3.keras')
    assert_outputs(model, xs, ys)

    def no_shape_at_all(config):
        drop_input(config)
        config.pop('build_config')
    path = rewrite_keras(tmp_path, 'cnn_bn.keras3.keras', no_shape_at_all)
    with pytest.raises(UnsupportedLayersError, match='input shape'):
        cyback.load_model(path)
