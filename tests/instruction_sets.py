"""Run a test with a kernel module's AVX2 set or its baseline set."""
import contextlib

import pytest


@contextlib.contextmanager
def instruction_set(module, which):
    """Run ``module``'s vector kernels compiled for AVX2 + FMA (``"avx2"``;
    the test is skipped on a CPU without them) or its baseline set
    (``"baseline"``); AVX2 again afterwards. Each kernel module keeps its own
    switch (include/cyback_simd.h)."""
    if which == "avx2" and not module._use_avx2(True):
        pytest.skip("this CPU has no AVX2 + FMA")
    module._use_avx2(which == "avx2")
    try:
        yield which
    finally:
        module._use_avx2(True)
