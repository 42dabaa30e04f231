"""cyback.quantization on multi-backend Keras (2.3.1) running on cyback
(imported by tests/keras_on_cyback.py; without keras or h5py the directory is
skipped).
"""
import random

import numpy as np
import pytest

from keras_on_cyback import import_keras, remove_keras_home

keras = import_keras('tests/quantization/conftest.py')
if keras is None:
    collect_ignore_glob = ['test_*.py']     # skip the folder (keras_on_cyback.py)


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
    remove_keras_home()
