"""Model files on multi-backend Keras 2.3.1 running on cyback (imported by
tests/keras_on_cyback.py; without Keras or h5py the directory is skipped).
TensorFlow is never imported: the files in fixtures/ were made elsewhere
(fixtures/README.md).
"""
import os

import pytest

from keras_on_cyback import fresh_keras_state, import_keras, pytest_sessionfinish  # noqa: F401

keras = import_keras('tests/saving/conftest.py')
if keras is None:
    collect_ignore_glob = ['test_*.py']     # skip the folder (keras_on_cyback.py)

FIXTURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures')


@pytest.fixture
def fixtures_dir():
    return FIXTURES_DIR
