"""What load_model accepts: a path, a pathlib.Path, an open h5py.File, a
binary file object (seekable or not)."""
import io
import os
import pathlib

import h5py
import numpy as np
import pytest

import cyback

from .conftest import FIXTURES_DIR
from .test_fixtures import assert_outputs, reference

FILES = ['two_in_two_out.tf_keras.h5', 'two_in_two_out.keras3.keras',
         'two_in_two_out.keras3.h5', 'embedding_bilstm.tf_keras.keras']


class _Stream(io.RawIOBase):
    """A readable stream that cannot seek (a socket, a pipe)."""

    def __init__(self, data):
        self._data = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, buffer):
        chunk = self._data.read(min(len(buffer), 1000))
        buffer[:len(chunk)] = chunk
        return len(chunk)


def _check(model, filename):
    _, xs, ys = reference(filename)
    assert_outputs(model, xs, ys)


@pytest.mark.parametrize('filename', FILES)
def test_pathlib_path(filename):
    _check(cyback.load_model(pathlib.Path(FIXTURES_DIR) / filename), filename)


@pytest.mark.parametrize('filename', FILES)
def test_bytes_path(filename):
    _check(cyback.load_model(os.fsencode(os.path.join(FIXTURES_DIR, filename))), filename)


@pytest.mark.parametrize('filename', FILES)
def test_open_binary_file(filename):
    with open(os.path.join(FIXTURES_DIR, filename), 'rb') as f:
        model = cyback.load_model(f)
        assert not f.closed
    _check(model, filename)


@pytest.mark.parametrize('filename', FILES)
def test_bytes_io(filename):
    with open(os.path.join(FIXTURES_DIR, filename), 'rb') as f:
        buffer = io.BytesIO(f.read())
    _check(cyback.load_model(buffer), filename)


@pytest.mark.parametrize('filename', FILES)
def test_stream_that_cannot_seek(filename):
    with open(os.path.join(FIXTURES_DIR, filename), 'rb') as f:
        stream = _Stream(f.read())
    _check(cyback.load_model(stream), filename)


@pytest.mark.parametrize('filename', [f for f in FILES if f.endswith('.h5')])
def test_open_h5py_file(filename):
    with h5py.File(os.path.join(FIXTURES_DIR, filename), 'r') as f:
        model = cyback.load_model(f)
        # The caller's file stays open: it is theirs to close.
        assert f.id.valid
    _check(model, filename)


def test_h5py_file_in_memory():
    with open(os.path.join(FIXTURES_DIR, 'nested.tf_keras.h5'), 'rb') as f:
        data = f.read()
    with h5py.File(io.BytesIO(data), 'r') as h5:
        model = cyback.load_model(h5)
    _check(model, 'nested.tf_keras.h5')


def test_the_package_entry_point_is_the_same_loader():
    from cyback.saving import load_model
    path = os.path.join(FIXTURES_DIR, 'shared_layer.keras3.keras')
    a = cyback.load_model(path)
    b = load_model(path)
    _, xs, _ = reference('shared_layer.keras3.keras')
    np.testing.assert_array_equal(a.predict(xs), b.predict(xs))
