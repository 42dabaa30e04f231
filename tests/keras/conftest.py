"""Multi-backend Keras (2.3.1) running on cyback.

Keras reads KERAS_BACKEND and KERAS_HOME once, when ``keras`` is first
imported, so both are set here, before any test module imports it. The
temporary KERAS_HOME keeps the user's ~/.keras/keras.json out of the tests
(Keras writes a default one there). Without keras installed the whole
directory is skipped (not collected).
"""

import importlib.util
import os
import random
import shutil
import tempfile

import numpy as np
import pytest


def _installed(name):
    # tests/ may be on sys.path (pytest's rootdir-relative imports), where
    # this very directory would pass for a namespace package named keras.
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


if not (_installed('keras') and _installed('h5py')):
    # Skip the directory. (pytest.importorskip here would abort the whole run
    # when this directory is named on the command line, as the conftest is
    # then loaded while pytest parses its arguments.)
    collect_ignore_glob = ['test_*.py']
    keras = None
else:
    _KERAS_HOME = tempfile.mkdtemp(prefix='cyback-keras-home-')
    os.environ['KERAS_HOME'] = _KERAS_HOME
    os.environ['KERAS_BACKEND'] = 'cyback'
    import keras

    if keras.backend.backend() != 'cyback':
        raise RuntimeError(
            'keras was imported with backend %r before '
            'tests/keras/conftest.py could select cyback; run these tests in '
            'their own pytest process' % keras.backend.backend())

FIXTURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            'fixtures')


def _load_architectures():
    spec = importlib.util.spec_from_file_location(
        'cyback_keras_fixture_architectures',
        os.path.join(FIXTURES_DIR, 'architectures.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ARCHITECTURES = _load_architectures()


def seed_everything(seed=0):
    """The seeds Keras 2.3.1 on a NumPy-based backend draws from."""
    np.random.seed(seed)
    random.seed(seed)


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    if keras is None:
        pytest.skip('multi-backend keras and h5py are not installed')
    # Layer names come from backend uids; resetting them keeps names (and so
    # save/load by name) independent of the order tests run in.
    keras.backend.reset_uids()
    seed_everything(0)
    yield


@pytest.fixture
def fixtures_dir():
    return FIXTURES_DIR


@pytest.fixture
def architectures():
    """fixtures/architectures.py: the builders shared with make_fixtures.py."""
    return _ARCHITECTURES


@pytest.fixture
def reseed():
    """reseed(seed): seed NumPy's and Python's global generators."""
    return seed_everything


def pytest_sessionfinish(session, exitstatus):
    if keras is not None:
        shutil.rmtree(_KERAS_HOME, ignore_errors=True)
