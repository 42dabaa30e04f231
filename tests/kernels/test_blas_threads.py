"""The BLAS thread-count contexts of cyback.kernels.blas_threads, and the
choice of the OpenBLAS the kernels' float32 GEMMs call."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from cyback.kernels import blas_threads as bt
from cyback.kernels import runtime

# blas_info() names the libraries it found, or says it found none to control
pytestmark = pytest.mark.skipif("thread control unavailable" in bt.blas_info(),
                                reason="needs openblas: no OpenBLAS found to control")


@pytest.fixture
def blas_at_one():
    saved = bt.get_blas_threads()
    bt.set_blas_threads(1)
    try:
        yield
    finally:
        bt.set_blas_threads(saved)


def test_blas_threads_sets_and_restores_nested_and_on_error(blas_at_one):
    with bt.blas_threads(2) as outer:
        assert bt.get_blas_threads() == 2
        with bt.blas_threads(1):
            assert bt.get_blas_threads() == 1
        assert bt.get_blas_threads() == 2
        with bt.blas_threads(2):            # already there: nothing to restore
            assert bt.get_blas_threads() == 2
        assert bt.get_blas_threads() == 2
    assert isinstance(outer, bt.blas_threads) and bt.get_blas_threads() == 1
    with pytest.raises(KeyError):
        with bt.blas_threads(2):
            raise KeyError("inside")
    assert bt.get_blas_threads() == 1


def test_blas_threads_context_is_reusable(blas_at_one):
    ctx = bt.blas_threads(2)
    for _ in range(2):
        with ctx:
            assert bt.get_blas_threads() == 2
        assert bt.get_blas_threads() == 1


def test_blas_limit_is_shared_and_limits(blas_at_one):
    assert bt.blas_limit(1) is bt.blas_limit(1)
    with bt.blas_limit(1):
        assert bt.get_blas_threads() == 1
    bt.set_blas_threads(2)
    with bt.blas_limit(1):
        assert bt.get_blas_threads() == 1
        with bt.blas_limit(1):                  # re-entered on the same thread
            assert bt.get_blas_threads() == 1
        assert bt.get_blas_threads() == 1       # the outer hold still stands
    assert bt.get_blas_threads() == 2
    with pytest.raises(KeyError):
        with bt.blas_limit(1):
            raise KeyError("inside")
    assert bt.get_blas_threads() == 2


def test_blas_limit_holds_while_any_thread_is_inside(blas_at_one):
    # BLAS configured at 2 threads, kernels on 4 Python threads each holding
    # it at 1: no thread may see 2 while it is inside (a per-thread context
    # that restores what it found lets the first to leave put 2 back under
    # the others' GEMMs); after the last one leaves it is 2 again.
    bt.set_blas_threads(2)
    seen, errors = [], []
    start = threading.Barrier(4)

    def work():
        try:
            start.wait()
            for _ in range(300):
                with bt.blas_limit(1):
                    seen.append(bt.get_blas_threads())    # a ctypes call: lets others run
        except Exception as e:          # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(seen) == 1200 and set(seen) == {1}
    assert bt.get_blas_threads() == 2


def test_holds_cover_every_library_the_kernels_call(blas_at_one):
    # with the float32 GEMMs on NumPy's OpenBLAS its count is held too: at 2
    # its GEMMs inside the kernels' OpenMP threads would start threads of
    # their own
    bt.set_blas_threads(2)
    assert bt._held and all(get() == 2 for _, get in bt._held)
    assert len(bt._held) == 1 + (bt.sgemm_library() is not None)
    with bt.blas_limit(1):
        assert all(get() == 1 for _, get in bt._held)
    assert all(get() == 2 for _, get in bt._held)
    with bt.blas_threads(1):
        assert all(get() == 1 for _, get in bt._held)
    assert all(get() == 2 for _, get in bt._held)


def test_openblas_version():
    assert bt.openblas_version("OpenBLAS 0.3.31.188.0  USE64BITINT SkylakeX") == (0, 3, 31, 188, 0)
    assert bt.openblas_version("OpenBLAS 0.3.30 DYNAMIC_ARCH") == (0, 3, 30)
    assert bt.openblas_version("OpenBLAS 0.3.30") < bt.openblas_version("OpenBLAS 0.3.31.188.0")
    assert bt.openblas_version("some BLAS") == () and bt.openblas_version(None) == ()


def test_sgemm_choice_reads_the_environment():
    assert bt.sgemm_choice({}) == "auto"
    assert bt.sgemm_choice({"CYBACK_SGEMM": " NumPy "}) == "numpy"
    assert bt.sgemm_choice({"CYBACK_SGEMM": "scipy"}) == "scipy"
    assert bt.sgemm_choice({"CYBACK_SGEMM": ""}) == "auto"
    from cyback.kernels._checks import ConfigWarning
    with pytest.warns(ConfigWarning,
                      match="CYBACK_SGEMM must be one of auto, scipy, numpy, got 'mkl'"):
        assert bt.sgemm_choice({"CYBACK_SGEMM": "mkl"}) == "auto"


class _FakeLib:
    def __init__(self, path, version):
        self.path, self.version, self.n = path, version, 1

    def entry(self):
        def setter(n):
            self.n = n
        config = (lambda: ("OpenBLAS %s SkylakeX" % self.version).encode()) if self.version \
            else None
        return (self.path, setter, lambda: self.n, config)


@pytest.mark.parametrize("scipy_v, numpy_v, has_sgemm, choice, routed", [
    ("0.3.30", "0.3.31.188.0", True, "auto", True),
    ("0.3.31", "0.3.31", True, "auto", False),          # a tie stays on SciPy's
    ("0.3.31", "0.3.30", True, "auto", False),
    ("0.3.31", "0.3.30", True, "numpy", True),
    ("0.3.30", "0.3.31", True, "scipy", False),
    ("0.3.30", "0.3.31", False, "numpy", False),         # no 64-bit CBLAS sgemm to call
    ("", "0.3.31", True, "auto", False),                 # SciPy's version unknown
    (None, "0.3.31", True, "auto", True),                # no SciPy OpenBLAS found at all
])
def test_route_sgemm(scipy_v, numpy_v, has_sgemm, choice, routed):
    # a real CBLAS sgemm address, so that nothing could crash while routed
    address = runtime.kernel_sgemm64_address() or 0x1000
    saved = (runtime.kernel_sgemm64_address(), list(bt._held), bt._sgemm_path)
    sp = _FakeLib("scipy.libs/libscipy_openblas.so", scipy_v) if scipy_v is not None else None
    nl = _FakeLib("numpy.libs/libscipy_openblas64_.so", numpy_v)
    found = [lib.entry() for lib in (sp, nl) if lib is not None]
    try:
        bt._route_sgemm(found, {nl.path: address} if has_sgemm else {}, choice)
        assert runtime.kernel_sgemm64_address() == (address if routed else 0)
        assert bt._sgemm_path == (nl.path if routed else None)
        held = [get for _, get in bt._held]
        expect = [lib for lib in (sp, nl if routed else None) if lib is not None]
        assert len(held) == len(expect)
        for lib in expect:
            lib.n = 3
        assert [get() for get in held] == [3] * len(expect)
    finally:
        runtime.set_kernel_sgemm64(saved[0])
        bt._held[:], bt._sgemm_path = saved[1], saved[2]


_SGEMM_PROBE = '''
import numpy as np
import cyback
from cyback.kernels import blas_threads, conv, runtime
rng = np.random.default_rng(0)
# a batch-1 1x1 wide enough for the GEMM tiles
x = rng.standard_normal((1, 7, 7, 256), dtype=np.float32)
w = rng.standard_normal((1, 1, 256, 256), dtype=np.float32)
g = conv._geometry(x.shape, w.shape, (1, 1), (1, 1), [(0, 0), (0, 0)], True, "probe")[0]
assert conv._use_pointwise_gemm(g, True, True)
y = conv.conv_forward(x, w, (1, 1), (1, 1), [(0, 0), (0, 0)])
ref = x.astype(np.float64).reshape(-1, 256) @ w.astype(np.float64).reshape(256, 256)
err = np.abs(y.reshape(ref.shape) - ref).max() / np.abs(ref).max()
print(runtime.kernel_sgemm64_address() != 0, blas_threads.sgemm_library() is not None, err < 1e-5)
print(blas_threads.blas_info())
'''


def _probe(value):
    env = dict(os.environ)
    env.pop("CYBACK_SGEMM", None)
    if value is not None:
        env["CYBACK_SGEMM"] = value
    return subprocess.run([sys.executable, "-c", _SGEMM_PROBE], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)


def test_cyback_sgemm_setting_in_a_fresh_process():
    scipy_run = _probe("scipy")
    assert scipy_run.returncode == 0, scipy_run.stderr
    assert scipy_run.stdout.splitlines()[0] == "False False True"
    assert "the kernels' float32 GEMMs: SciPy's" in scipy_run.stdout
    numpy_run = _probe("numpy")
    assert numpy_run.returncode == 0, numpy_run.stderr
    expect = "True True True" if bt._sgemm64 else "False False True"
    assert numpy_run.stdout.splitlines()[0] == expect
    bad = _probe("mkl")        # warns and keeps the default: import goes on
    assert bad.returncode == 0, bad.stderr
    assert "CYBACK_SGEMM must be one of auto, scipy, numpy, got 'mkl'" in bad.stderr


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True),
                                              (True, True)])
def test_float32_products_agree_across_the_two_libraries(trans_a, trans_b):
    # the routed CBLAS call takes every layout the kernels pass (either
    # operand transposed, a bias as C's initial value) like SciPy's Fortran one
    address = runtime.kernel_sgemm64_address()
    if not address:
        pytest.skip("the kernels' float32 GEMMs run on SciPy's OpenBLAS here")
    from cyback.kernels import linalg
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 53, 37) if trans_a else (3, 37, 53), dtype=np.float32)
    b = rng.standard_normal((3, 41, 53) if trans_b else (3, 53, 41), dtype=np.float32)
    bias = rng.standard_normal(41, dtype=np.float32)
    a64 = a.astype(np.float64).transpose(0, 2, 1) if trans_a else a.astype(np.float64)
    b64 = b.astype(np.float64).transpose(0, 2, 1) if trans_b else b.astype(np.float64)
    outs = []
    for addr in (address, 0):
        runtime.set_kernel_sgemm64(addr)
        try:
            outs.append((linalg.batch_gemm(a, b, trans_a, trans_b),
                         linalg.matmul(a[0].T if trans_a else a[0],
                                       b[0].T if trans_b else b[0], bias)))
        finally:
            runtime.set_kernel_sgemm64(address)
    for batched, single in outs:
        np.testing.assert_allclose(batched, a64 @ b64, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(single, a64[0] @ b64[0] + bias, rtol=1e-5, atol=1e-4)
