"""Damaged, truncated and foreign files give a clear error naming the file,
never a crash; a file whose config no longer parses is refused before any
layer is built."""
import io
import json
import os
import shutil
import zipfile

import h5py
import numpy as np
import pytest

import cyback
from cyback.saving import ModelFileError, UnsupportedLayersError, WeightMismatchError

from .conftest import FIXTURES_DIR

H5_MODEL = os.path.join(FIXTURES_DIR, 'cnn_bn.tf_keras.h5')
ZIP_MODEL = os.path.join(FIXTURES_DIR, 'cnn_bn.keras3.keras')
CLEAR_ERRORS = (ValueError, OSError)


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def read(path):
    with open(path, 'rb') as f:
        return f.read()


@pytest.mark.parametrize('source', [H5_MODEL, ZIP_MODEL])
@pytest.mark.parametrize('fraction', [0.0005, 0.1, 0.5, 0.9, 0.999])
def test_truncated_file(tmp_path, source, fraction):
    data = read(source)
    path = write(tmp_path, 'cut' + os.path.splitext(source)[1],
                 data[:max(1, int(len(data) * fraction))])
    with pytest.raises(ModelFileError) as info:
        cyback.load_model(path)
    assert path in str(info.value)
    assert 'truncated' in str(info.value) or 'damaged' in str(info.value)


def test_empty_file(tmp_path):
    path = write(tmp_path, 'empty.h5', b'')
    with pytest.raises(ModelFileError, match='empty'):
        cyback.load_model(path)


@pytest.mark.parametrize('data', [b'not a model at all\n' * 10, bytes(range(256)) * 4,
                                  b'{"class_name": "Functional"}'])
def test_foreign_file(tmp_path, data):
    path = write(tmp_path, 'foreign.h5', data)
    with pytest.raises(ModelFileError, match='neither HDF5'):
        cyback.load_model(path)


def test_missing_file(tmp_path):
    path = str(tmp_path / 'nowhere.h5')
    with pytest.raises(FileNotFoundError, match='nowhere.h5'):
        cyback.load_model(path)


def test_directory_and_saved_model(tmp_path):
    with pytest.raises(ModelFileError, match='is a directory'):
        cyback.load_model(str(tmp_path))
    (tmp_path / 'saved_model.pb').write_bytes(b'\x08\x01')
    with pytest.raises(ModelFileError, match='SavedModel'):
        cyback.load_model(str(tmp_path))


def test_wrong_argument_type():
    with pytest.raises(TypeError, match='expected a path'):
        cyback.load_model(12)


def _garble_every_json(data, start_marker):
    """Flip bytes inside every copy of the config JSON (HDF5 may keep more
    than one)."""
    data = bytearray(data)
    start = data.find(start_marker)
    assert start >= 0
    while start >= 0:
        for offset in range(40, 400, 37):
            data[start + offset] = ord('#')
        start = data.find(start_marker, start + 1)
    return bytes(data)


def test_corrupted_config_in_hdf5(tmp_path):
    data = _garble_every_json(read(H5_MODEL), b'{"class_name": "Sequential"')
    path = write(tmp_path, 'garbled.h5', data)
    with pytest.raises(ModelFileError, match='not valid JSON') as info:
        cyback.load_model(path)
    assert path in str(info.value)


def test_corrupted_member_of_zip(tmp_path):
    # The archive stores members uncompressed: flipping bytes of config.json
    # breaks its CRC.
    data = bytearray(read(ZIP_MODEL))
    start = data.find(b'"class_name"')
    for offset in range(10, 200, 19):
        data[start + offset] ^= 0x55
    path = write(tmp_path, 'garbled.keras', bytes(data))
    with pytest.raises(ModelFileError) as info:
        cyback.load_model(path)
    assert path in str(info.value)


@pytest.mark.parametrize('seed', range(12))
def test_random_damage_never_crashes(tmp_path, seed):
    """Bytes overwritten at random places: the load fails with a clear error
    or, when only weight values were hit (HDF5 keeps no checksums), returns a
    model; it never crashes the interpreter."""
    rng = np.random.default_rng(seed)
    data = bytearray(read(H5_MODEL if seed % 2 else ZIP_MODEL))
    for position in rng.integers(0, len(data), size=8):
        data[position] = int(rng.integers(0, 256))
    path = write(tmp_path, 'damaged' + ('.h5' if seed % 2 else '.keras'), bytes(data))
    try:
        cyback.load_model(path)
    except CLEAR_ERRORS as e:
        assert str(e)


def test_zip_without_config(tmp_path):
    path = str(tmp_path / 'bare.keras')
    with zipfile.ZipFile(path, 'w') as z:
        z.writestr('metadata.json', '{}')
    with pytest.raises(ModelFileError, match='without config.json'):
        cyback.load_model(path)


def test_zip_without_weights(tmp_path):
    path = str(tmp_path / 'noweights.keras')
    with zipfile.ZipFile(ZIP_MODEL) as src, zipfile.ZipFile(path, 'w') as dst:
        dst.writestr('config.json', src.read('config.json'))
        dst.writestr('model.weights.npz', b'')
    with pytest.raises(ModelFileError, match='no model.weights.h5.*model.weights.npz'):
        cyback.load_model(path)


def test_weights_only_file_to_load_model():
    path = os.path.join(FIXTURES_DIR, 'cnn_bn.tf_keras.save_weights.h5')
    with pytest.raises(ModelFileError, match='load_weights'):
        cyback.load_model(path)


def test_hdf5_without_keras_content(tmp_path):
    path = str(tmp_path / 'plain.h5')
    with h5py.File(path, 'w') as f:
        f['data'] = np.arange(3)
    with pytest.raises(ModelFileError, match='neither a Keras model nor a Keras weight'):
        cyback.load_model(path)


def test_model_config_without_weights_group(tmp_path):
    path = str(tmp_path / 'config_only.h5')
    with h5py.File(H5_MODEL, 'r') as src, h5py.File(path, 'w') as dst:
        for key, value in src.attrs.items():
            dst.attrs[key] = value
    with pytest.raises(ModelFileError, match='no model_weights'):
        cyback.load_model(path)


def test_missing_weight_dataset(tmp_path):
    path = str(tmp_path / 'missing_weight.h5')
    shutil.copy(H5_MODEL, path)
    with h5py.File(path, 'r+') as f:
        del f['model_weights/dense/dense/bias:0']
    with pytest.raises(WeightMismatchError, match="'dense'.*bias:0"):
        cyback.load_model(path)


def test_weight_of_wrong_shape_in_file(tmp_path):
    path = str(tmp_path / 'reshaped.h5')
    shutil.copy(H5_MODEL, path)
    with h5py.File(path, 'r+') as f:
        del f['model_weights/dense/dense/bias:0']
        f['model_weights/dense/dense/bias:0'] = np.zeros(7, 'float32')
        del f['model_weights/conv_a/conv_a/kernel:0']
        f['model_weights/conv_a/conv_a/kernel:0'] = np.zeros((3, 3, 3, 5), 'float32')
    with pytest.raises(WeightMismatchError) as info:
        cyback.load_model(path)
    problems = info.value.problems
    assert len(problems) == 2
    assert any("'dense'" in p and '(7,)' in p and '(5,)' in p for p in problems)
    assert any("'conv_a'" in p and '(3, 3, 3, 5)' in p and '(3, 3, 3, 6)' in p
               for p in problems)


def test_keras3_file_with_a_vars_group_of_another_layer(tmp_path):
    # Keras 3 writes each vars group's layer name: a file whose groups do not
    # follow its config is refused, even when the shapes happen to fit.
    src = zipfile.ZipFile(os.path.join(FIXTURES_DIR, 'shared_layer.keras3.keras'))
    weights = io.BytesIO(src.read('model.weights.h5'))
    with h5py.File(weights, 'r+') as f:
        f['layers/dense/vars'].attrs['name'] = 'someone_else'
    path = str(tmp_path / 'renamed.keras')
    with zipfile.ZipFile(path, 'w') as dst:
        dst.writestr('config.json', src.read('config.json'))
        dst.writestr('metadata.json', src.read('metadata.json'))
        dst.writestr('model.weights.h5', weights.getvalue())
    with pytest.raises(WeightMismatchError, match='someone_else'):
        cyback.load_model(path)


def test_graph_referring_to_a_missing_layer(tmp_path):
    path = str(tmp_path / 'dangling.h5')
    shutil.copy(os.path.join(FIXTURES_DIR, 'two_in_two_out.tf_keras.h5'), path)
    with h5py.File(path, 'r+') as f:
        config = json.loads(f.attrs['model_config'])
        config['config']['layers'][-1]['inbound_nodes'] = [[['ghost', 0, 0, {}]]]
        f.attrs['model_config'] = json.dumps(config)
    with pytest.raises(ModelFileError, match="'ghost'"):
        cyback.load_model(path)


def test_subclassed_model_is_refused(tmp_path):
    path = str(tmp_path / 'subclassed.keras')
    weights = io.BytesIO()
    with h5py.File(weights, 'w') as f:
        f.create_group('layers')
    with zipfile.ZipFile(path, 'w') as z:
        z.writestr('config.json', json.dumps({
            'module': 'mypackage.models', 'class_name': 'MyModel',
            'config': {'units': 3}, 'registered_name': 'MyModel'}))
        z.writestr('model.weights.h5', weights.getvalue())
    with pytest.raises(ModelFileError, match='subclassed model'):
        cyback.load_model(path)


def test_unsupported_is_not_a_file_error():
    # The error classes are distinct, and all are ValueErrors.
    for cls in (ModelFileError, UnsupportedLayersError, WeightMismatchError):
        assert issubclass(cls, ValueError)


def _free_space_offset(data):
    """Where the free-space object of the first global heap collection keeps
    its size."""
    start = data.find(b'GCOL\x01\x00\x00\x00')
    offset = start + 16
    while int.from_bytes(data[offset:offset + 2], 'little') != 0:
        size = int.from_bytes(data[offset + 8:offset + 16], 'little')
        offset += 16 + (size + 7) // 8 * 8
    return offset + 8


def test_damaged_global_heap_is_refused_before_hdf5_reads_it(tmp_path):
    # HDF5 itself can loop forever on such a heap; the loader checks first.
    data = bytearray(read(os.path.join(FIXTURES_DIR, 'cnn_bn.tf_keras.save_weights.h5')))
    at = _free_space_offset(data)
    data[at] ^= 0x43
    path = write(tmp_path, 'heap.h5', bytes(data))
    with pytest.raises(ModelFileError, match='global heap') as info:
        cyback.load_model(path)
    assert path in str(info.value)


@pytest.mark.parametrize('filename', sorted(f for f in os.listdir(FIXTURES_DIR)
                                            if f.endswith('.h5')))
def test_heap_check_passes_sound_files(filename):
    from cyback.saving import hdf5_heap
    with open(os.path.join(FIXTURES_DIR, filename), 'rb') as f:
        assert hdf5_heap.damaged_collections(f) == []
        assert f.tell() == 0


def test_damaged_heap_refused_through_an_open_h5py_file(tmp_path):
    data = bytearray(read(os.path.join(FIXTURES_DIR, 'shared_layer.tf_keras.h5')))
    data[_free_space_offset(data)] ^= 0x43
    path = write(tmp_path, 'heap.h5', bytes(data))
    with h5py.File(path, 'r') as f:
        with pytest.raises(ModelFileError, match='global heap'):
            cyback.load_model(f)
