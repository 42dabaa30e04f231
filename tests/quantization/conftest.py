"""cyback.quantization on multi-backend Keras (2.3.1) running on cyback.

Keras reads KERAS_BACKEND and KERAS_HOME once, when ``keras`` is first
imported, so both are set here before any test module imports it (as
tests/layers/conftest.py does). Without keras or h5py the directory is
skipped.
"""
import importlib.util
import os
import random
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
            'keras was imported with backend %r before tests/quantization/conftest.py could '
            'select cyback; run these tests in their own pytest process'
            % keras.backend.backend())


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    if keras is None:
        pytest.skip('multi-backend keras and h5py are not installed')
    keras.backend.reset_uids()
    np.random.seed(0)
    random.seed(0)
    saved_floatx = keras.backend.floatx()
    yield
    keras.backend.set_floatx(saved_floatx)


def pytest_sessionfinish(session, exitstatus):
    if keras is not None:
        shutil.rmtree(_KERAS_HOME, ignore_errors=True)
