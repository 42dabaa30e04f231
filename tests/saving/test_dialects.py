"""Which writer a file comes from: versions, and configs without them."""
import json
import os
import shutil

import h5py
import pytest

import cyback
from cyback.saving import files

from .conftest import FIXTURES_DIR
from .test_fixtures import assert_outputs, reference


@pytest.mark.parametrize('version, writer', [
    ('2.21.0', files.TF_KERAS), ('2.4.0', files.TF_KERAS), ('2.2.4-tf', files.TF_KERAS),
    ('2.3.0-tf', files.TF_KERAS), ('3.15.1', files.KERAS3), ('3.0.0', files.KERAS3),
    ('2.3.1', files.KERAS2), ('2.2.4', files.KERAS2), ('2.1.6', files.KERAS2)])
def test_writer_from_version(version, writer):
    info = files.ModelFile('x')
    info.keras_version = version
    assert files._writer(info) == writer


def _copy_with(tmp_path, filename, change_config, attrs):
    path = str(tmp_path / filename)
    shutil.copy(os.path.join(FIXTURES_DIR, filename), path)
    with h5py.File(path, 'r+') as f:
        config = json.loads(f.attrs['model_config'])
        change_config(config)
        f.attrs['model_config'] = json.dumps(config)
        for key, value in attrs.items():
            for group in (f, f['model_weights']):
                if value is None:
                    if key in group.attrs:
                        del group.attrs[key]
                else:
                    group.attrs[key] = value
    return path


def test_tf2_0_era_file(tmp_path):
    # TensorFlow 2.0-2.3 wrote class_name "Model" and versions like 2.2.4-tf.
    def older(config):
        config['class_name'] = 'Model'
    path = _copy_with(tmp_path, 'two_in_two_out.tf_keras.h5', older,
                      {'keras_version': '2.2.4-tf'})
    model = cyback.load_model(path)
    _, xs, ys = reference('two_in_two_out.tf_keras.h5')
    assert_outputs(model, xs, ys)


@pytest.mark.parametrize('filename', ['embedding_bilstm.keras3.h5',
                                      'embedding_bilstm.tf_keras.h5'])
def test_without_a_version_the_config_tells(tmp_path, filename):
    path = _copy_with(tmp_path, filename, lambda c: None, {'keras_version': None})
    with cyback.saving.files.open_source(path) as source:
        assert source.keras_version is None
        assert source.writer == (files.KERAS3 if 'keras3' in filename else files.TF_KERAS)
    model = cyback.load_model(path)
    _, xs, ys = reference(filename)
    assert_outputs(model, xs, ys)
