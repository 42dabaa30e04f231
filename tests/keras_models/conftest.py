"""Multi-backend Keras (2.3.1) running on cyback (imported by
tests/keras_on_cyback.py before any test module imports it; without keras
the whole directory is skipped).
"""

import importlib.util
import os
import random

import numpy as np
import pytest

from keras_on_cyback import fresh_keras_state, import_keras, pytest_sessionfinish  # noqa: F401

keras = import_keras('tests/keras_models/conftest.py')
if keras is None:
    collect_ignore_glob = ['test_*.py']     # skip the folder (keras_on_cyback.py)

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
