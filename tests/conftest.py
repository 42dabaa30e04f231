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


@pytest.fixture
def one_thread():
    """Finite differences make hundreds of tiny kernel calls; on a loaded
    machine each OpenMP fork/join can cost milliseconds, so run them on one
    thread (the value tests cover the threaded paths)."""
    import cyback as K
    saved = K.get_num_threads()
    K.set_num_threads(1)
    yield
    K.set_num_threads(saved)


@pytest.fixture
def fresh_learning_phase():
    """No fixed learning phase and a new placeholder, before and after the test."""
    from cyback import config
    config.reset_learning_phase()
    yield
    config.reset_learning_phase()


@pytest.fixture(params=["cloudpickle", "pickle"])
def round_trip(request):
    """``obj -> loads(dumps(obj))`` with pickle and with cloudpickle."""
    module = pytest.importorskip(request.param)
    return lambda obj: module.loads(module.dumps(obj))


@pytest.fixture(autouse=True)
def _restore_settings():
    import cyback as K
    saved = (K.floatx(), K.epsilon(), K.image_data_format())
    yield
    K.set_floatx(saved[0])
    K.set_epsilon(saved[1])
    K.set_image_data_format(saved[2])
