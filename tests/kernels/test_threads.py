"""The default thread policy: affinity mask, cgroup CPU quota, OpenMP wait policy."""
import os
import subprocess
import sys

import pytest

from cyback.kernels import cpu_budget


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _proc_cgroup(tmp_path, lines):
    p = tmp_path / "proc_cgroup"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_v2_quota_of_own_group(tmp_path):
    root = tmp_path / "cg"
    _write(str(root / "job" / "cpu.max"), "150000 100000\n")
    proc = _proc_cgroup(tmp_path, ["0::/job"])
    assert cpu_budget.cgroup_cpu_quota(str(root), proc) == pytest.approx(1.5)


def test_v2_unlimited_is_none(tmp_path):
    root = tmp_path / "cg"
    _write(str(root / "cpu.max"), "max 100000\n")
    proc = _proc_cgroup(tmp_path, ["0::/"])
    assert cpu_budget.cgroup_cpu_quota(str(root), proc) is None


def test_v1_quota_and_smallest_limit_wins(tmp_path):
    root = tmp_path / "cg"
    _write(str(root / "cpu,cpuacct" / "docker" / "cpu.cfs_quota_us"), "300000\n")
    _write(str(root / "cpu,cpuacct" / "docker" / "cpu.cfs_period_us"), "100000\n")
    _write(str(root / "cpu,cpuacct" / "cpu.cfs_quota_us"), "50000\n")
    _write(str(root / "cpu,cpuacct" / "cpu.cfs_period_us"), "100000\n")
    proc = _proc_cgroup(tmp_path, ["4:cpu,cpuacct:/docker", "0::/"])
    assert cpu_budget.cgroup_cpu_quota(str(root), proc) == pytest.approx(0.5)


def test_v1_no_quota(tmp_path):
    root = tmp_path / "cg"
    _write(str(root / "cpu" / "cpu.cfs_quota_us"), "-1\n")
    _write(str(root / "cpu" / "cpu.cfs_period_us"), "100000\n")
    proc = _proc_cgroup(tmp_path, ["1:cpu:/"])
    assert cpu_budget.cgroup_cpu_quota(str(root), proc) is None


def test_garbage_and_missing_files_are_ignored(tmp_path):
    root = tmp_path / "cg"
    _write(str(root / "cpu.max"), "lots\n")
    assert cpu_budget.cgroup_cpu_quota(str(root), str(tmp_path / "missing")) is None


@pytest.mark.parametrize("quota,expect", [("50000 100000", 1), ("100000 100000", 1),
                                          ("150000 100000", 2), ("max 100000", None)])
def test_default_threads_caps_by_quota_rounded_up(tmp_path, quota, expect):
    root = tmp_path / "cg"
    _write(str(root / "cpu.max"), quota)
    proc = _proc_cgroup(tmp_path, ["0::/"])
    n = cpu_budget.default_threads(str(root), proc)
    assert n == min(cpu_budget.affinity_cpus(), expect or 10 ** 6)


def test_affinity_mask_counts():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no affinity masks on this platform")
    assert cpu_budget.affinity_cpus() == len(os.sched_getaffinity(0))


def test_wait_policy_left_to_the_user():
    env = {}
    cpu_budget.set_openmp_environment(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE",
                   "GOMP_SPINCOUNT": str(cpu_budget.SPIN_ROUNDS)}
    env = {"OMP_WAIT_POLICY": "active"}
    cpu_budget.set_openmp_environment(env)
    assert env == {"OMP_WAIT_POLICY": "active"}
    env = {"GOMP_SPINCOUNT": "10000"}
    cpu_budget.set_openmp_environment(env)
    assert env == {"GOMP_SPINCOUNT": "10000"}


def _fresh(code, **env):
    full = dict(os.environ)
    for var in ("CYBACK_NUM_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        full.pop(var, None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, check=True,
                          stdout=subprocess.PIPE, text=True).stdout.split()


def test_import_sets_policy_and_team_from_the_mask():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity masks on this platform")
    cpu = sorted(os.sched_getaffinity(0))[0]
    code = ("import os; os.sched_setaffinity(0, {%d}); import cyback; "
            "print(cyback.get_num_threads(), os.environ['OMP_WAIT_POLICY'], "
            "os.environ['GOMP_SPINCOUNT'])" % cpu)
    assert _fresh(code) == ["1", "PASSIVE", str(cpu_budget.SPIN_ROUNDS)]


def test_explicit_settings_win():
    code = "import os, cyback; print(cyback.get_num_threads(), os.environ.get('OMP_WAIT_POLICY'))"
    assert _fresh(code, CYBACK_NUM_THREADS="3", OMP_WAIT_POLICY="active") == ["3", "active"]
    assert _fresh(code, OMP_NUM_THREADS="3") == ["3", "PASSIVE"]


# ---------------------------------------------------------------- team policy
# The policy's state is per process and per thread, and the tests' conftest
# sets the cutoff to 0 (every parallel path runs): each case runs in a fresh
# process with the default cutoff (1e6) and two threads.

_TEAM = """
import time, cyback
from cyback.kernels import runtime as r
cyback.set_num_threads(2)
r.force_host_busy(%(busy)r)
r.set_warm_window(%(warm)r)
r.team_rest()
out = []
%(body)s
print(*out)
"""


def _team(body, warm=1.0, busy=False):
    full = dict(os.environ)
    for var in ("CYBACK_PARALLEL_MIN_WORK", "CYBACK_NUM_THREADS", "CYBACK_TEAM_WARM_US"):
        full.pop(var, None)
    code = _TEAM % {"warm": warm, "busy": busy, "body": body}
    return [int(v) for v in subprocess.run([sys.executable, "-c", code], env=full, check=True,
                                           stdout=subprocess.PIPE, text=True).stdout.split()]


needs_openmp = pytest.mark.skipif(not __import__("cyback").kernels.runtime.openmp_enabled(),
                                  reason="needs openmp: built without OpenMP")


@needs_openmp
def test_team_above_the_cutoff_always():
    assert _team("out += [r.team_threads(2e6), r.team_threads(1e4)]", warm=0.0) == [2, 1]


@needs_openmp
def test_team_for_a_dense_run_of_medium_ops_then_while_warm():
    # 3e5 each: the fourth makes 1.2e6 of demand; tiny work never takes the team
    body = "out += [r.team_threads(3e5) for _ in range(6)] + [r.team_threads(1e4)]"
    assert _team(body) == [1, 1, 1, 2, 2, 2, 1]


@needs_openmp
def test_team_not_for_spaced_ops():
    # a gap longer than the warm window starts a new run
    body = "for _ in range(6):\n    out.append(r.team_threads(3e5)); time.sleep(0.02)"
    assert _team(body, warm=0.002) == [1] * 6


@needs_openmp
def test_team_rules_off_without_spin():
    body = "out += [r.team_threads(3e5) for _ in range(6)] + [r.team_threads(2e6)]"
    assert _team(body, warm=0.0) == [1] * 6 + [2]


@needs_openmp
def test_team_rules_off_on_a_busy_host():
    # forced busy: every sample window (100 ms) counts as above the bound (a
    # first sample does not); two such windows in a row make the host busy,
    # which holds for half a second after the windows fall below it again;
    # while busy only work from 16 cutoffs takes the team
    # (set_busy_work_factor)
    body = ("r.host_busy(); time.sleep(0.11)\n"
            "out.append(int(r.host_busy())); time.sleep(0.11)\n"
            "out += [int(r.host_busy())] + [r.team_threads(3e5) for _ in range(6)]\n"
            "out += [r.team_threads(2e6), r.team_threads(1.5e7), r.team_threads(1.6e7)]\n"
            "r.set_busy_work_factor(1)\n"
            "out.append(r.team_threads(2e6))\n"
            "r.force_host_busy(False); time.sleep(0.11)\n"
            "out.append(int(r.host_busy())); time.sleep(0.6)\n"
            "out.append(int(r.host_busy()))")
    assert _team(body, busy=True) == [0, 1] + [1] * 6 + [1, 1, 2, 2, 1, 0]


@needs_openmp
def test_one_window_above_the_bound_is_a_burst_not_a_busy_host():
    # a window above the bound between windows below it (another library's
    # threads spinning a little after their last call) leaves the rules on
    body = ("r.host_busy(); time.sleep(0.11)\n"
            "out.append(int(r.host_busy()))\n"
            "r.force_host_busy(False); time.sleep(0.11)\n"
            "out.append(int(r.host_busy()))\n"
            "r.force_host_busy(True); time.sleep(0.11)\n"
            "out.append(int(r.host_busy()))\n"
            "r.force_host_busy(False); time.sleep(0.11)\n"
            "out += [int(r.host_busy())] + [r.team_threads(3e5) for _ in range(6)]")
    assert _team(body, busy=True) == [0, 0, 0, 0] + [1, 1, 1, 2, 2, 2]


def _idle_seconds_of_mask():
    cpus = os.sched_getaffinity(0)
    idle = 0
    with open("/proc/stat") as f:
        for line in f:
            fields = line.split()
            if fields[0][:3] == "cpu" and fields[0][3:].isdigit() and int(fields[0][3:]) in cpus:
                idle += int(fields[4]) + int(fields[5])
    return idle / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/stat") or not hasattr(os, "sched_getaffinity"),
                    reason="no /proc/stat")
def test_idle_cpu_seconds_are_the_masks_cpus_of_proc_stat():
    from cyback.kernels import runtime
    before = runtime.idle_cpu_seconds()
    between = _idle_seconds_of_mask()
    after = runtime.idle_cpu_seconds()
    assert 0 < before <= between <= after


def test_idle_cpu_seconds_follow_the_affinity_mask():
    # on one CPU of the mask, the idle time is that CPU's alone
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2 or \
            not os.path.exists("/proc/stat"):
        pytest.skip("needs /proc/stat and two CPUs in the affinity mask")
    code = ("import os\n"
            "from cyback.kernels import runtime as r\n"
            "full = r.idle_cpu_seconds()\n"
            "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
            "print(full, r.idle_cpu_seconds())")
    full, one = [float(v) for v in subprocess.run(
        [sys.executable, "-c", code], check=True, stdout=subprocess.PIPE,
        text=True).stdout.split()]
    assert 0 < one < full


@needs_openmp
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks")
def test_a_busy_loop_on_one_of_our_cpus_makes_the_host_busy():
    # the default bounds and a real neighbour: a team of two on two CPUs, a
    # busy loop pinned to one of them, so that about one CPU is left
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs in the affinity mask")
    body = ("import os, subprocess, sys\n"
            "cpus = sorted(os.sched_getaffinity(0))[:2]\n"
            "os.sched_setaffinity(0, cpus)\n"
            "loop = ('import os, time\\nos.sched_setaffinity(0, {%d})\\n'\n"
            "        't = time.time()\\nwhile time.time() - t < 5: pass' % cpus[0])\n"
            "p = subprocess.Popen([sys.executable, '-c', loop])\n"
            "time.sleep(0.3)\n"
            "seen, t0 = [], time.time()\n"
            "while time.time() - t0 < 1.0:\n"
            "    sum(range(20000)); seen.append(int(r.host_busy()))\n"
            "p.kill(); p.wait()\n"
            "out.append(max(seen))")
    assert _team(body, busy=None) == [1]


@needs_openmp
def test_team_stays_warm_after_a_region_ends():
    # a real kernel call over the cutoff warms the team for medium work after it
    body = ("import numpy as np\n"
            "from cyback.kernels import reduce\n"
            "reduce.sum_middle(np.ones((1, 1 << 20, 1), np.float32), 1, 1 << 20, 1)\n"
            "out.append(r.team_threads(3e5))")
    assert _team(body) == [2]


def test_warm_window_follows_the_spin_settings():
    from cyback.kernels import runtime
    assert runtime.spin_rounds({"GOMP_SPINCOUNT": "1000"}) == 1000
    assert runtime.spin_rounds({"GOMP_SPINCOUNT": "2k"}) == 2000
    assert runtime.spin_rounds({"GOMP_SPINCOUNT": "infinity"}) is None
    assert runtime.spin_rounds({"GOMP_SPINCOUNT": "junk", "OMP_WAIT_POLICY": "passive"}) == 0
    assert runtime.spin_rounds({"OMP_WAIT_POLICY": "ACTIVE"}) is None
    assert runtime.spin_rounds({}) == 3e5
    assert runtime.warm_window({"GOMP_SPINCOUNT": "1000"}) == pytest.approx(
        1000 * runtime.SPIN_ROUND_SECONDS)
    assert runtime.warm_window({"OMP_WAIT_POLICY": "passive"}) == 0
    assert runtime.warm_window({"OMP_WAIT_POLICY": "active"}) == 1.0
    assert runtime.warm_window({"CYBACK_TEAM_WARM_US": "40", "GOMP_SPINCOUNT": "0"}) == \
        pytest.approx(40e-6)
    # the process's own window comes from the settings cyback made at import
    assert runtime.get_warm_window() == pytest.approx(runtime.warm_window())


def test_join_window_from_the_environment():
    from cyback.kernels import runtime
    default = runtime.join_window({})
    assert 0 < default <= 1e-3
    assert runtime.join_window({"CYBACK_JOIN_US": "0"}) == 0
    assert runtime.join_window({"CYBACK_JOIN_US": " 500 "}) == pytest.approx(500e-6)
    assert runtime.join_window({"CYBACK_JOIN_US": "5e9"}) == 1.0
    assert runtime.join_window({"CYBACK_JOIN_US": "junk"}) == default   # config raises
    assert runtime.get_join_window() == pytest.approx(runtime.join_window())
    old = runtime.get_join_window()
    try:
        runtime.set_join_window(-3)
        assert runtime.get_join_window() == 0
        runtime.set_join_window(2e-4)
        assert runtime.get_join_window() == pytest.approx(2e-4)
    finally:
        runtime.set_join_window(old)
