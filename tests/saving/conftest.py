"""Model files on multi-backend Keras 2.3.1 running on cyback (imported by
tests/keras_on_cyback.py; without Keras or h5py the directory is skipped).
TensorFlow is never imported: the files in fixtures/ were made elsewhere
(fixtures/README.md).
"""
import os

import numpy as np
import pytest

from keras_on_cyback import import_keras, remove_keras_home

keras = import_keras('tests/saving/conftest.py')
if keras is None:
    collect_ignore_glob = ['test_*.py']     # skip the folder (keras_on_cyback.py)

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
    remove_keras_home()
