"""cyback.layers on multi-backend Keras (2.3.1) running on cyback (imported
by tests/keras_on_cyback.py; without keras or h5py the directory is skipped).
"""
import os

import numpy as np
import pytest

from keras_on_cyback import fresh_keras_state, import_keras, pytest_sessionfinish  # noqa: F401

keras = import_keras('tests/layers/conftest.py')
if keras is None:
    collect_ignore_glob = ['test_*.py']     # skip the folder (keras_on_cyback.py)

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')


@pytest.fixture(scope='session')
def reference():
    """tests/layers/data/reference.npz (written by make_reference.py with tf_keras and
    Keras 3)."""
    with np.load(os.path.join(DATA_DIR, 'reference.npz')) as data:
        return {k: data[k] for k in data.files}
