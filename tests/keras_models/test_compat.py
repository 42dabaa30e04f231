"""cyback._keras_compat: the names and HDF5 string fixes Keras needs."""

import collections
import collections.abc
import inspect
import os
import sys

import h5py
import keras  # noqa: F401  (the patched Keras modules must be loaded)
import numpy as np

from cyback import _keras_compat


def test_install_is_idempotent():
    hooks = [f for f in sys.meta_path
             if type(f).__name__ == '_KerasPostImportHook']
    _keras_compat.install()
    _keras_compat.install()
    assert _keras_compat.installed()
    assert [f for f in sys.meta_path
            if type(f).__name__ == '_KerasPostImportHook'] == hooks
    assert len(hooks) == 1


def test_names_keras_needs():
    assert collections.Iterable is collections.abc.Iterable
    assert collections.Mapping is collections.abc.Mapping
    assert collections.Sequence is collections.abc.Sequence
    assert collections.Container is collections.abc.Container
    assert np.Inf == np.inf
    assert np.string_ is np.bytes_

    def f(a, b=2, *args, **kw):
        pass
    spec = inspect.getargspec(f)
    assert spec.args == ['a', 'b'] and spec.varargs == 'args'
    assert spec.keywords == 'kw' and spec.defaults == (2,)
    assert inspect.ArgSpec._fields == ('args', 'varargs', 'keywords',
                                       'defaults')


def test_keras_modules_are_patched():
    from keras.engine import saving
    from keras.utils import io_utils
    for name in ('load_attributes_from_hdf5_group',
                 'load_weights_from_hdf5_group',
                 'load_weights_from_hdf5_group_by_name'):
        assert hasattr(getattr(saving, name), '__wrapped__'), name
    assert hasattr(io_utils.H5Dict.__getitem__, '__wrapped__')


def test_tf_file_attributes_decode(fixtures_dir):
    from keras.engine import saving
    with h5py.File(os.path.join(fixtures_dir, 'gru.h5'), 'r') as f:
        # h5py 3 gives str here; Keras decodes
        assert isinstance(f.attrs['keras_version'], str)
        names = saving.load_attributes_from_hdf5_group(f, 'layer_names')
        assert names == ['gru', 'gru_1', 'dense']
        weights = saving.load_attributes_from_hdf5_group(f['gru'],
                                                         'weight_names')
        assert len(weights) == 3 and all(isinstance(w, str) for w in weights)


def test_h5dict_round_trip_returns_bytes(tmp_path):
    from keras.utils.io_utils import H5Dict
    path = str(tmp_path / 'd.h5')
    d = H5Dict(path, mode='w')
    d['model_config'] = b'{"a": 1}'
    d['names'] = [b'x', b'yy']
    d['group']['inner'] = b'v'
    d.close()
    d = H5Dict(path, mode='r')
    assert d['model_config'].decode('utf-8') == '{"a": 1}'
    assert [n.decode('utf8') for n in d['names']] == ['x', 'yy']
    assert d['group']['inner'] == b'v'
    d.close()


def test_h5dict_chunked_attribute(tmp_path):
    from keras.utils.io_utils import H5Dict
    path = str(tmp_path / 'c.h5')
    with h5py.File(path, 'w') as f:
        f.attrs['names0'] = ['a', 'b']
        f.attrs['names1'] = ['c']
    d = H5Dict(path, mode='r')
    assert [n.decode('utf8') for n in d['names']] == ['a', 'b', 'c']
    d.close()
