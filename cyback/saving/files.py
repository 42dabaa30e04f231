"""Open a model or weight file and tell what wrote it.

A source is a path (``str`` or ``os.PathLike``), a binary file object, or an
open ``h5py.File``/``h5py.Group``. Two containers exist:

- HDF5: ``model.save('m.h5')`` of tf.keras 2.x, Keras 2.2/2.3 and Keras 3's
  legacy format (the model config in the ``model_config`` attribute, weights
  under ``model_weights/<layer>``), and the weight files of ``save_weights``
  (tf.keras layout at the root, or Keras 3's ``.weights.h5`` layout with its
  ``layers/<class>/vars/<i>`` groups);
- zip: Keras 3's ``.keras`` archive (``config.json``, ``metadata.json``,
  ``model.weights.h5``), also written by tf_keras 2.13+.

``open_source`` reads what decides the rest (config, versions) and leaves the
weights in the HDF5 file, read later array by array. A damaged file raises
``ModelFileError`` naming the file and the part that failed.
"""
import contextlib
import io
import json
import os
import zipfile

from cyback.saving import hdf5_heap
from cyback.saving.errors import ModelFileError

__all__ = ['ModelFile', 'open_source', 'attr_text', 'attr_list', 'read_dataset', 'hdf5_errors']

_HDF5_SIGNATURE = b'\x89HDF\r\n\x1a\n'
_ZIP_SIGNATURES = (b'PK\x03\x04', b'PK\x05\x06')

# What wrote the file.
KERAS3 = 'keras3'      # Keras 3 (.keras, legacy .h5, .weights.h5)
TF_KERAS = 'tf_keras'  # tf.keras 2.x / tf_keras (.h5, and .keras from 2.13)
KERAS2 = 'keras2'      # multi-backend Keras 2.0 - 2.3


class ModelFile:
    """What ``open_source`` found.

    ``config``: the model config (dict) or None for a weight file;
    ``training_config``: the compile arguments saved with it, or None;
    ``writer``: KERAS3, TF_KERAS or KERAS2; ``container``: 'hdf5' or 'zip';
    ``weights``: the HDF5 group holding the weights; ``weights_layout``:
    'layer_names' (a group per layer with ``weight_names``) or 'vars'
    (Keras 3's ``layers/.../vars/<i>``); ``h5file``: the HDF5 root;
    ``keras_version``: what the file says, or None; ``label``: the file's
    name for messages.
    """

    def __init__(self, label):
        self.label = label
        self.config = None
        self.training_config = None
        self.writer = None
        self.container = None
        self.weights = None
        self.weights_layout = None
        self.h5file = None
        self.keras_version = None
        self.backend = None


def attr_text(value):
    """An HDF5 string attribute as ``str`` (h5py gives ``bytes`` or ``str``)."""
    if isinstance(value, bytes):
        return value.decode('utf-8')
    if hasattr(value, 'tolist') and getattr(value, 'ndim', 1) == 0:
        return attr_text(value.tolist())
    return value


def attr_list(group, name):
    """A string-list attribute (``layer_names``, ``weight_names``) as strs."""
    if name not in group.attrs:
        return []
    return [attr_text(v) for v in group.attrs[name]]


@contextlib.contextmanager
def hdf5_errors(label):
    """HDF5 structures damaged inside the file surface from h5py as
    RuntimeError, KeyError, OSError or a decoding error at whichever access
    meets them; they become a ModelFileError naming the file."""
    try:
        yield
    except (RuntimeError, KeyError, OSError, UnicodeError) as e:
        raise ModelFileError('%s: the HDF5 file is damaged (%s: %s)'
                             % (label, type(e).__name__, e)) from e


def read_dataset(dataset, label):
    """The array of an HDF5 dataset; a damaged one raises ModelFileError."""
    try:
        return dataset[()]
    except Exception as e:  # h5py raises OSError, KeyError or RuntimeError here
        raise ModelFileError('%s: cannot read weight %r: the file is damaged (%s: %s)'
                             % (label, dataset.name, type(e).__name__, e)) from e


@contextlib.contextmanager
def open_source(source):
    """Open ``source`` and yield a ``ModelFile``; close what it opened."""
    with contextlib.ExitStack() as stack:
        h5py = _import_h5py()
        if isinstance(source, (h5py.File, h5py.Group)):
            label = getattr(source.file, 'filename', None) or '<h5py.File>'
            if os.path.isfile(label):
                with open(label, 'rb') as handle:
                    _check_heap(handle, label)
            with hdf5_errors(label):
                info = _describe_hdf5(source, label)
            yield info
            return
        if isinstance(source, (str, bytes, os.PathLike)):
            path = os.fsdecode(source)
            label = path
            if os.path.isdir(path):
                raise ModelFileError(_directory_message(path))
            try:
                handle = stack.enter_context(open(path, 'rb'))
            except OSError as e:
                raise type(e)(e.errno, '%s: %s' % (e.strerror, path)) from e
        elif hasattr(source, 'read'):
            label = getattr(source, 'name', None)
            label = label if isinstance(label, str) else '<file object>'
            handle = _seekable(source)
        else:
            raise TypeError('load_model: expected a path, a binary file object or an '
                            'h5py.File; got %s' % type(source).__name__)

        head = handle.read(8)
        handle.seek(0)
        if not head:
            raise ModelFileError('%s: the file is empty' % label)
        if head.startswith(_ZIP_SIGNATURES):
            yield _describe_zip(handle, label, stack)
        elif head == _HDF5_SIGNATURE or _hdf5_with_userblock(handle):
            _check_heap(handle, label)
            h5 = stack.enter_context(_open_hdf5(handle, label))
            with hdf5_errors(label):
                info = _describe_hdf5(h5, label)
            yield info
        else:
            raise ModelFileError(
                '%s: not a Keras model file: neither HDF5 (.h5) nor a zip archive '
                '(.keras) (it starts with %r)' % (label, head))


def _import_h5py():
    try:
        import h5py
    except ImportError as e:
        raise ImportError('cyback.load_model needs h5py (pip install h5py)') from e
    return h5py


def _check_heap(handle, label):
    damaged = hdf5_heap.damaged_collections(handle)
    if damaged:
        raise ModelFileError('%s: the HDF5 file is damaged: the global heap at byte %d: %s'
                             % ((label,) + damaged[0]))


def _seekable(fileobj):
    if getattr(fileobj, 'seekable', lambda: False)():
        return fileobj
    return io.BytesIO(fileobj.read())


def _hdf5_with_userblock(handle):
    # HDF5 also looks for its signature at 512, 1024, 2048... (a user block).
    offset = 512
    try:
        while offset <= 1 << 20:
            handle.seek(offset)
            if handle.read(8) == _HDF5_SIGNATURE:
                return True
            offset *= 2
        return False
    finally:
        handle.seek(0)


def _directory_message(path):
    if os.path.exists(os.path.join(path, 'saved_model.pb')):
        return ('%s is a TensorFlow SavedModel directory: it holds TensorFlow graphs, '
                'not a Keras config cyback can translate. Save the model as HDF5 '
                "(model.save('m.h5')) or, with Keras 3, as .keras." % path)
    return '%s is a directory, not a model file' % path


@contextlib.contextmanager
def _open_hdf5(handle, label):
    h5py = _import_h5py()
    try:
        h5 = h5py.File(handle, 'r')
    except Exception as e:
        raise ModelFileError('%s: cannot open the HDF5 file; it is truncated or damaged '
                             '(%s)' % (label, e)) from e
    try:
        yield h5
    finally:
        h5.close()


def _load_json(text, label, what):
    try:
        if isinstance(text, str):
            # h5py hands undecodable bytes back as surrogates.
            text.encode('utf-8')
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelFileError('%s: %s is not valid JSON (%s)' % (label, what, e)) from e
    return value


def _read_root_attr(h5, name, label):
    try:
        if name not in h5.attrs:
            return None
        return attr_text(h5.attrs[name])
    except Exception as e:
        raise ModelFileError('%s: cannot read the %r attribute: the file is damaged (%s)'
                             % (label, name, e)) from e


def _describe_hdf5(h5, label):
    info = ModelFile(label)
    info.container = 'hdf5'
    info.h5file = h5
    config_text = _read_root_attr(h5, 'model_config', label)
    if config_text is not None:
        info.config = _load_json(config_text, label, 'the model_config attribute')
        if not isinstance(info.config, dict) or 'class_name' not in info.config:
            raise ModelFileError('%s: the model_config attribute is not a Keras model config'
                                 % label)
        training = _read_root_attr(h5, 'training_config', label)
        if training is not None:
            info.training_config = _load_json(training, label, 'the training_config attribute')
        if 'model_weights' not in h5:
            raise ModelFileError('%s: the file has a model config but no model_weights group '
                                 '(not a full-model HDF5 save, or damaged)' % label)
        info.weights = h5['model_weights']
        info.weights_layout = 'layer_names'
    elif 'layer_names' in h5.attrs:
        info.weights = h5
        info.weights_layout = 'layer_names'
    elif 'layers' in h5 or 'vars' in h5:
        info.weights = h5
        info.weights_layout = 'vars'
    else:
        raise ModelFileError('%s: an HDF5 file, but neither a Keras model nor a Keras '
                             'weight file (no model_config, layer_names or layers/)' % label)
    info.keras_version = (_read_root_attr(h5, 'keras_version', label)
                          or _read_root_attr(info.weights, 'keras_version', label))
    info.backend = (_read_root_attr(h5, 'backend', label)
                    or _read_root_attr(info.weights, 'backend', label))
    info.writer = _writer(info)
    return info


def _describe_zip(handle, label, stack):
    try:
        archive = stack.enter_context(zipfile.ZipFile(handle))
        names = set(archive.namelist())
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ModelFileError('%s: a zip file that cannot be read; it is truncated or '
                             'damaged (%s)' % (label, e)) from e
    if 'config.json' not in names:
        raise ModelFileError('%s: a zip archive without config.json: not a .keras model '
                             'file' % label)
    info = ModelFile(label)
    info.container = 'zip'
    info.config = _load_json(_zip_read(archive, 'config.json', label), label, 'config.json')
    if not isinstance(info.config, dict) or 'class_name' not in info.config:
        raise ModelFileError('%s: config.json is not a Keras model config' % label)
    if 'metadata.json' in names:
        metadata = _load_json(_zip_read(archive, 'metadata.json', label), label,
                              'metadata.json')
        if isinstance(metadata, dict):
            info.keras_version = metadata.get('keras_version')
    info.training_config = info.config.get('compile_config') or None
    if 'model.weights.h5' not in names:
        other = sorted(n for n in names if n.startswith('model.weights'))
        raise ModelFileError('%s: the archive has no model.weights.h5%s' % (
            label, ' (it has %s, a weights format cyback does not read)' % ', '.join(other)
            if other else ''))
    data = _zip_read(archive, 'model.weights.h5', label)
    h5 = stack.enter_context(_open_hdf5(io.BytesIO(data), label + ':model.weights.h5'))
    info.h5file = h5
    info.weights = h5
    info.weights_layout = 'vars'
    info.writer = _writer(info)
    return info


def _zip_read(archive, name, label):
    try:
        return archive.read(name)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise ModelFileError('%s: cannot read %s from the archive; it is truncated or '
                             'damaged (%s)' % (label, name, e)) from e


def _version_tuple(text):
    parts = []
    for piece in text.split('-')[0].split('.'):
        digits = ''.join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _writer(info):
    version = info.keras_version
    if version:
        if version.endswith('-tf'):
            return TF_KERAS
        numbers = _version_tuple(version)
        if numbers and numbers[0] >= 3:
            return KERAS3
        if numbers and numbers >= (2, 4):
            return TF_KERAS
        if numbers:
            return KERAS2
    # No version: recognise the config dialect.
    if info.config is not None and _has_keras3_nodes(info.config):
        return KERAS3
    if info.weights_layout == 'vars':
        return KERAS3
    return TF_KERAS


def _has_keras3_nodes(config):
    layers = config.get('config', {}).get('layers', []) if isinstance(
        config.get('config'), dict) else []
    for layer in layers:
        for node in layer.get('inbound_nodes', []) or []:
            if isinstance(node, dict) and 'args' in node:
                return True
        if 'module' in layer and 'registered_name' in layer:
            return True
    return False
