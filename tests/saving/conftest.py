"""Model files on multi-backend Keras 2.3.1 running on cyback.

Keras reads KERAS_BACKEND and KERAS_HOME once, when ``keras`` is first
imported, so both are set here, before any test module imports it (a
temporary KERAS_HOME keeps the user's keras.json out). Without Keras or h5py
the directory is skipped. TensorFlow is never imported: the files in
fixtures/ were made elsewhere (fixtures/README.md).
"""
import importlib.util
import os
import shutil
import tempfile

import numpy as np
import pytest


def _installed(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


if not (_installed('keras') and _installed('h5py')):
    collect_ignore_glob = ['test_*.py']
    keras = None
else:
    _KERAS_HOME = tempfile.mkdtemp(prefix='cyback-keras-home-')
    os.environ['KERAS_HOME'] = _KERAS_HOME
    os.environ['KERAS_BACKEND'] = 'cyback'
    import keras

    if keras.backend.backend() != 'cyback':
        raise RuntimeError(
            'keras was imported with backend %r before tests/saving/conftest.py could '
            'select cyback; run these tests in their own pytest process'
            % keras.backend.backend())

FIXTURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures')


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    if keras is None:
        pytest.skip('multi-backend keras and h5py are not installed')
    # Layer names come from backend uids, and Keras 2.3.1's initializers draw
    # from NumPy's global generator: both start the same in every test, and
    # the generator is given back as it was.
    keras.backend.reset_uids()
    saved = np.random.get_state()
    np.random.seed(0)
    yield
    np.random.set_state(saved)
    keras.backend.reset_uids()


@pytest.fixture
def fixtures_dir():
    return FIXTURES_DIR


def pytest_sessionfinish(session, exitstatus):
    if keras is not None:
        shutil.rmtree(_KERAS_HOME, ignore_errors=True)
