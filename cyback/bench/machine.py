"""A description of the machine and software a benchmark ran on."""
import os
import platform
import sys

import numpy as np

ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_tile",
             "neon", "asimd", "sve")


def load_average():
    """The 1, 5 and 15 minute load averages (zeros where the OS has none)."""
    try:
        return tuple(round(v, 2) for v in os.getloadavg())
    except (AttributeError, OSError):
        return (0.0, 0.0, 0.0)


def cpu_info():
    """CPU model, logical cores and the SIMD flags that matter for the kernels."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if (key in ("model name", "Model", "Hardware")
                        and model in ("", platform.machine(), platform.processor())):
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"cpu": model, "logical_cores": os.cpu_count(), "usable_cores": usable,
            "isa": [f for f in ISA_FLAGS if f in flags], "arch": platform.machine()}


def blas_info():
    """NumPy's BLAS library and its thread count (as cyback left it)."""
    info = {}
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        info["blas"] = "%s %s" % (blas.get("name", "?"), blas.get("version", ""))
    except Exception:
        info["blas"] = "unknown"
    try:
        from cyback.kernels.blas_threads import get_blas_threads
        info["blas_threads"] = get_blas_threads()
    except Exception:
        pass
    return info


def engine_versions():
    """Versions of Python, NumPy, SciPy, cyback and Keras (when imported)."""
    v = {"python": sys.version.split()[0], "numpy": np.__version__}
    try:
        import scipy
        v["scipy"] = scipy.__version__
    except Exception:
        pass
    try:
        import cyback
        v["cyback"] = getattr(cyback, "__version__", "?")
    except Exception:
        pass
    keras = sys.modules.get("keras")
    if keras is not None:
        v["keras"] = getattr(keras, "__version__", "?")
    return v


def describe(threads=None):
    """Everything above in one dict, plus the OS and the thread setting."""
    d = dict(cpu_info(), os=platform.platform(), load=load_average())
    d.update(blas_info())
    if threads is not None:
        d["threads"] = threads
    d["versions"] = engine_versions()
    return d
