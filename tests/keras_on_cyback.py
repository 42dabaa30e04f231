"""Multi-backend Keras (2.3.1) on cyback, for the test folders that need it
(tests/keras_models, tests/layers, tests/saving, tests/quantization), and what their
conftests share: ``fresh_keras_state`` (autouse there) and the session's end.

Keras reads KERAS_BACKEND and KERAS_HOME once, when ``keras`` is first
imported, so the first conftest to call ``import_keras`` sets both; a
temporary KERAS_HOME keeps the user's keras.json out of the tests (Keras
writes a default one there). Without keras or h5py a folder skips itself:
its conftest sets ``collect_ignore_glob`` (pytest.importorskip there would
abort the whole run when the folder is named on the command line, as the
conftest is then loaded while pytest parses its arguments).
"""
import importlib.util
import os
import random
import shutil
import sys
import tempfile

import numpy as np
import pytest

_home = []      # the temporary KERAS_HOME, once made


def installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_keras(conftest):
    """Keras imported with the cyback backend, or None when keras or h5py is
    not installed. ``conftest`` names the caller in the error raised when
    Keras was imported with another backend first."""
    if not (installed('keras') and installed('h5py')):
        return None
    if 'keras' not in sys.modules:
        _home.append(tempfile.mkdtemp(prefix='cyback-keras-home-'))
        os.environ['KERAS_HOME'] = _home[0]
        os.environ['KERAS_BACKEND'] = 'cyback'
    import keras
    if keras.backend.backend() != 'cyback':
        raise RuntimeError(
            'keras was imported with backend %r before %s could select cyback; run '
            'these tests in their own pytest process' % (keras.backend.backend(), conftest))
    return keras


def remove_keras_home():
    """Remove the temporary KERAS_HOME (at the end of the session)."""
    while _home:
        shutil.rmtree(_home.pop(), ignore_errors=True)


@pytest.fixture(autouse=True)
def fresh_keras_state():
    """Each test starts from the same Keras state and leaves none behind:
    layer names come from backend uids (save/load goes by name), and Keras
    2.3.1's initializers draw from NumPy's and Python's global generators,
    so uids are reset and both generators seeded with 0, then given back as
    they were, with floatx. A conftest imports this fixture to use it."""
    keras = sys.modules.get('keras')
    if keras is None:
        pytest.skip('multi-backend keras and h5py are not installed')
    keras.backend.reset_uids()
    saved = (np.random.get_state(), random.getstate(), keras.backend.floatx())
    np.random.seed(0)
    random.seed(0)
    yield
    np.random.set_state(saved[0])
    random.setstate(saved[1])
    keras.backend.set_floatx(saved[2])
    keras.backend.reset_uids()


def pytest_sessionfinish(session, exitstatus):
    """A conftest imports this hook to remove the temporary KERAS_HOME."""
    remove_keras_home()
