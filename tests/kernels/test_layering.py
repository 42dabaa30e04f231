"""Kernels know arrays only: no kernel source imports a cyback module outside
cyback.kernels. import-linter (pyproject.toml) checks the .py modules; it does
not read Cython, so the .pyx/.pxd/.pxi sources are checked here."""
import pathlib
import re

import pytest

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "cyback" / "kernels"

# import cyback.x / from cyback.x import / from cyback import x / cimport cyback.x
_IMPORT = re.compile(r"^\s*(?:from\s+(cyback(?:\.\w+)*)\s+c?import\s+(\w+)"
                     r"|c?import\s+(cyback(?:\.\w+)*))", re.M)


def outside_imports(source):
    """The cyback modules outside cyback.kernels that ``source`` imports."""
    found = []
    for m in _IMPORT.finditer(source):
        module = m.group(1) or m.group(3)
        if module == "cyback" and m.group(2):
            module = "cyback." + m.group(2)
        if module != "cyback.kernels" and not module.startswith("cyback.kernels."):
            found.append(module)
    return found


def test_checker_finds_outside_imports():
    src = ("from cyback.kernels cimport _blas\nimport cyback.kernels.runtime\n"
           "from cyback import kernels\nfrom cyback.graph.tensor import Tensor\n"
           "    from cyback import config\ncimport cyback.ops.conv\n")
    assert outside_imports(src) == ["cyback.graph.tensor", "cyback.config", "cyback.ops.conv"]


def test_kernel_sources_import_only_kernels():
    if not KERNELS.is_dir():
        pytest.skip("tests copied without the source tree (cibuildwheel's test run)")
    sources = sorted(KERNELS.glob("*.pyx")) + sorted(KERNELS.glob("*.pxd")) + \
        sorted(KERNELS.glob("*.pxi"))
    assert sources, "no kernel sources under %s" % KERNELS
    bad = {p.name: outside_imports(p.read_text()) for p in sources}
    assert not {k: v for k, v in bad.items() if v}
