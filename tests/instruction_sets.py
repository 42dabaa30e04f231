"""Run a test with one of a kernel module's instruction sets."""
import contextlib

import pytest


@contextlib.contextmanager
def instruction_set(module, which):
    """Run ``module``'s vector kernels compiled for AVX-512 (``"avx512"``; only
    modules with such a set), for AVX2 + FMA (``"avx2"``, capped below AVX-512)
    or its baseline set (``"baseline"``); a set the CPU lacks skips the test.
    Afterwards the default set runs again (the widest the CPU has, unless
    CYBACK_AVX512=0). Each kernel module keeps its own switch
    (include/cyback_simd.h)."""
    if which == "avx2" and not module._use_avx2(True):
        pytest.skip("needs avx2: this CPU has no AVX2 + FMA")
    if which == "avx512" and not module._use_avx512(True):
        module._use_avx2(True)
        pytest.skip("needs avx512: AVX-512 is off: no AVX-512F on this CPU, or CYBACK_AVX512=0")
    if which == "avx2" and hasattr(module, "_use_avx512"):
        module._use_avx512(False)
    elif which == "baseline":
        module._use_avx2(False)
    try:
        yield which
    finally:
        module._use_avx2(True)
