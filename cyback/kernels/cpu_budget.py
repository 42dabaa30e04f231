"""How many CPUs this process may use, and the OpenMP wait policy.

The host's core count overstates what a process gets in two common cases: a
CPU affinity mask (``taskset``, ``docker --cpuset-cpus``, a job scheduler) and
a cgroup CPU quota (``docker --cpus``, Kubernetes limits), which lets every
core run but throttles the whole group once it has used its share of each
period. A team larger than the quota finishes each parallel region only after
the throttled threads get their next period.

The wait policy matters on shared machines: by default libgomp's idle team
threads spin for a while (300000 rounds, milliseconds) before sleeping, taking
a core from the process that keeps it busy — and from the team's own thread
that shares that core, which the barrier at the end of every region then
waits for. Sleeping at once has its own cost: waking a sleeping thread
(on a VM especially) takes longer than many batch-1 layers, and a model's
call runs one region per op with a few microseconds of Python between them.
So idle threads spin briefly (SPIN_ROUNDS) and then sleep: long enough to
bridge the gaps inside one call, short enough that a busy neighbour loses
little (docs/performance.md, "How idle threads wait").
"""
import math
import os

from cyback.kernels.settings import raw

_CGROUP_ROOT = "/sys/fs/cgroup"


def affinity_cpus():
    """CPUs in this process's affinity mask (all CPUs where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except OSError:
            pass
    return os.cpu_count() or 1


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _own_cgroups(proc_cgroup):
    """``{controller: path}`` from /proc/self/cgroup; the v2 group is under ''."""
    groups = {}
    text = _read(proc_cgroup) or ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for c in (controllers.split(",") if controllers else [""]):
            groups[c] = path
    return groups


def _quota_v2(text):
    # "max 100000" means no limit; "150000 100000" means 1.5 CPUs.
    parts = (text or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = float(parts[0]), float(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _quota_v1(quota_text, period_text):
    try:
        quota, period = float(quota_text), float(period_text)
    except (TypeError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpu_quota(root=_CGROUP_ROOT, proc_cgroup="/proc/self/cgroup"):
    """The cgroup's CPU quota in CPUs (e.g. 1.5), or None when unlimited.

    Looks at the process's own group first, then at the root of the cgroup
    mount (inside a container the group's path is often not visible and the
    container's own limit sits at the root). The smallest limit wins, as the
    kernel applies every limit on the way up.
    """
    groups = _own_cgroups(proc_cgroup)
    found = []
    v2_dirs = [os.path.join(root, groups.get("", "/").lstrip("/")), root]
    for d in v2_dirs:
        q = _quota_v2(_read(os.path.join(d, "cpu.max")))
        if q is not None:
            found.append(q)
    cpu_path = groups.get("cpu", "/").lstrip("/")
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for d in (os.path.join(root, mount, cpu_path), os.path.join(root, mount)):
            q = _quota_v1(_read(os.path.join(d, "cpu.cfs_quota_us")),
                          _read(os.path.join(d, "cpu.cfs_period_us")))
            if q is not None:
                found.append(q)
    return min(found) if found else None


def default_threads(root=_CGROUP_ROOT, proc_cgroup="/proc/self/cgroup"):
    """The default team size: the affinity mask, capped by the cgroup quota
    rounded up (a 1.5-CPU quota gets 2 threads: the half CPU is worth having,
    and a quota is shared over a period, not per core)."""
    n = affinity_cpus()
    quota = cgroup_cpu_quota(root, proc_cgroup)
    if quota is not None:
        n = min(n, max(1, int(math.ceil(quota - 1e-9))))
    return n


#: Rounds (a pause instruction each, tens of nanoseconds) libgomp's idle
#: threads spin before they sleep: long enough to bridge the gaps between the
#: ops of one batch-1 call, short enough that a busy neighbour loses little
#: (docs/performance.md; benchmarks/bench_contention.py --variant compares
#: spin counts).
SPIN_ROUNDS = 2000


def set_openmp_environment(environ=os.environ):
    """Idle OpenMP threads spin SPIN_ROUNDS and then sleep, unless the user
    chose a wait policy or a spin count. ``OMP_WAIT_POLICY=PASSIVE`` is for
    OpenMP runtimes other than libgomp (sleep at once); libgomp takes
    ``GOMP_SPINCOUNT`` over it. libgomp reads these when it is loaded, so this
    must run before the first kernel is imported."""
    if raw("OMP_WAIT_POLICY", environ) is None and raw("GOMP_SPINCOUNT", environ) is None:
        environ["OMP_WAIT_POLICY"] = "PASSIVE"
        environ["GOMP_SPINCOUNT"] = str(SPIN_ROUNDS)
