"""cyback.quantization on multi-backend Keras (2.3.1) running on cyback
(imported by tests/keras_on_cyback.py; without keras or h5py the directory is
skipped).
"""
from keras_on_cyback import fresh_keras_state, import_keras, pytest_sessionfinish  # noqa: F401

keras = import_keras('tests/quantization/conftest.py')
if keras is None:
    collect_ignore_glob = ['test_*.py']     # skip the folder (keras_on_cyback.py)
