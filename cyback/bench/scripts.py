"""The kernel benchmark scripts of a source checkout (benchmarks/bench_*.py),
run from ``python -m cyback.bench --scripts`` so that one command gathers
every figure. They stay scripts: each is run as its own process with its usual
command line, and its JSON result (benchmarks/results/<name>.json) is folded
into the report."""
import glob
import json
import os
import subprocess
import sys

from cyback.kernels.settings import raw

# Each script's smallest command line: its own smoke options where it has them.
QUICK_ARGS = {
    "bench_conv.py": ["--quick"], "bench_pool.py": ["--quick"], "bench_ctc.py": ["--quick"],
    "bench_rnn.py": ["--repeats", "3", "--batch", "8", "--steps", "20", "--no-unroll"],
    "bench_linalg.py": ["--repeats", "3"], "bench_overhead.py": ["--calls", "300"],
}
# the model suite runs in-process; the peer suites need a second Python with
# TensorFlow and the peers (their --tf-python), which a gathering run does not have
SKIP = {"bench_models.py", "bench_applications.py", "bench_int8_models.py"}


def benchmarks_dir():
    """The checkout's benchmarks/ folder beside the cyback package, or None when
    cyback is installed without its sources."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(here, "benchmarks")
    return path if os.path.isfile(os.path.join(path, "_common.py")) else None


def script_names():
    folder = benchmarks_dir()
    if folder is None:
        return []
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "bench_*.py"))
                  if os.path.basename(p) not in SKIP)


def run_script(name, threads, quick, timeout=900):
    """Run one script; returns {"script", "seconds", "rows", "meta"} or an "error"."""
    import time
    folder = benchmarks_dir()
    results = os.path.join(folder, "results")
    before = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(results, "*.json"))}
    env = dict(os.environ, CYBACK_NUM_THREADS=str(threads),
               PYTHONPATH=os.pathsep.join(
                   [os.path.dirname(folder)]
                   + [p for p in (raw("PYTHONPATH") or "").split(os.pathsep) if p]))
    cmd = [sys.executable, os.path.join(folder, name)] + (QUICK_ARGS.get(name, []) if quick else [])
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"script": name, "error": "timed out after %d s" % timeout}
    out = {"script": name, "command": " ".join([os.path.basename(sys.executable)] + cmd[1:]),
           "seconds": time.perf_counter() - t0}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        out["error"] = "exit %d: %s" % (proc.returncode, tail[0][:300])
        return out
    changed = [p for p in glob.glob(os.path.join(results, "*.json"))
               if before.get(p) != os.path.getmtime(p)]
    out["rows"], out["meta"] = [], {}
    for path in changed:
        with open(path) as f:
            doc = json.load(f)
        out["rows"].extend(doc.get("rows", []))
        out["meta"].update({k: v for k, v in doc.items() if k != "rows"})
    return out
