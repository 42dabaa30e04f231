"""The model suite needs Keras on cyback: Keras reads KERAS_BACKEND once, at its
first import, so it is set here before any test imports keras (KERAS_HOME is
already a temporary folder, set by the top conftest)."""
import os

os.environ.setdefault("KERAS_BACKEND", "cyback")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_threads():
    """The benchmarks set cyback's thread count (and BLAS's for references);
    the rest of the suite runs with the count it started with."""
    import cyback
    from cyback.kernels.blas_threads import get_blas_threads, set_blas_threads
    saved = cyback.get_num_threads(), get_blas_threads()
    yield
    cyback.set_num_threads(saved[0])
    set_blas_threads(saved[1])
