"""Shared pytest setup. tests/ itself has no __init__.py, so this folder is on
sys.path and test modules can ``import gradcheck``; sub-folders are packages so
that equal file names in different folders do not clash."""
import os
import tempfile

import numpy as np
import pytest

# Never read the developer's own keras.json.
os.environ.setdefault("KERAS_HOME", tempfile.mkdtemp(prefix="cyback-keras-home-"))
# Kernels keep small problems on one thread; the tests' problems are small, so
# lift the cutoff to run (and check thread-invariance of) every parallel path.
os.environ.setdefault("CYBACK_PARALLEL_MIN_WORK", "0")
# Child interpreters (``python -c``) must import the installed cyback, not the
# source tree in the working directory, which has no compiled kernels after a
# plain `pip install .` (Python 3.11+ honours this; older ones need cwd=).
os.environ["PYTHONSAFEPATH"] = "1"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _restore_settings():
    import cyback as K
    saved = (K.floatx(), K.epsilon(), K.image_data_format())
    yield
    K.set_floatx(saved[0])
    K.set_epsilon(saved[1])
    K.set_image_data_format(saved[2])
