"""cyback.kernels.memory: freed large arrays stay in the process, so a call
that allocates and frees the same blocks again does not page-fault them in
anew. Checked by counting the minor page faults of repeated 8 MB allocations
in child processes (no timings)."""
import os
import subprocess
import sys
import textwrap

import pytest

from cyback.kernels import memory

CHILD = textwrap.dedent(r"""
    import resource, sys
    import numpy as np
    import cyback
    from cyback.kernels import memory
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    def call():
        # a plan's intermediates: several 8 MB arrays written, then freed
        a = [np.ones(1 << 21, np.float32) for _ in range(4)]
        return sum(float(x[0]) for x in a)
    for _ in range(3):
        call()
    before = faults()
    for _ in range(20):
        call()
    print(memory.settings(), (faults() - before) / 20)
""")

GLIBC = sys.platform.startswith("linux") and memory._glibc()


def _run(**env):
    full = dict(os.environ)
    for k in list(full):
        if k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "CYBACK_MALLOC"):
            del full[k]
    full.update(env)
    out = subprocess.run([sys.executable, "-c", CHILD], env=full, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    mode, per_call = out.stdout.split()
    return mode, float(per_call)


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")
def test_freed_blocks_are_reused_without_page_faults():
    mode, kept = _run()
    assert mode == "kept"
    # 4 x 8 MB is 8192 pages per call: none come back faulting
    assert kept < 100, kept
    # (glibc 2.36's defaults re-fault about 2000 of them per call)
    assert _run(CYBACK_MALLOC="system")[0] == "system"


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")
def test_the_users_own_malloc_settings_win():
    assert _run(GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")[0] == "system"
    assert _run(MALLOC_ARENA_MAX_="2")[0] == "system"


def test_user_choice_detection():
    assert memory._user_chose({"CYBACK_MALLOC": "System"})
    assert memory._user_chose({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1"})
    assert memory._user_chose({"MALLOC_TRIM_THRESHOLD_": "1"})
    assert not memory._user_chose({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"})
    assert not memory._user_chose({"CYBACK_MALLOC": "kept", "MALLOC": "x"})
