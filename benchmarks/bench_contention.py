"""Threads under contention: a busy loop pinned to one core while a
demo-sized Keras training (the convnet of ``cyback.demo``) and a conv2d
forward+backward run at cyback's default thread policy and at fixed thread
counts.

Run: python benchmarks/bench_contention.py [--epochs 2] [--repeats 2] [--threads 1,2]
     [--no-busy] [--env OMP_WAIT_POLICY=active ...]
     [--variant spin2000:GOMP_SPINCOUNT=2000 ...]

Every configuration runs in a fresh process (OpenMP reads its environment when
it starts), the configurations alternate, and each is repeated; the table
gives the median seconds and the ratio to the best fixed thread count of the
same workload. Writes benchmarks/results/contention.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)
from _common import print_table, write_json  # noqa: E402

TRAIN = r"""
import os, sys, time, json
os.environ['KERAS_BACKEND'] = 'cyback'
import numpy as np
from cyback import demo
keras = demo._import_keras()
np.random.seed(0)
(x, y), _ = demo.load_data(0)
model = demo.build_model(keras)
model.train_on_batch(x[:32], y[:32])
t0 = time.perf_counter()
model.fit(x, y, batch_size=32, epochs=%(epochs)d, verbose=0)
dt = time.perf_counter() - t0
import cyback
print(json.dumps(dict(seconds=dt, threads=cyback.get_num_threads())))
"""

CONV = r"""
import time, json
import numpy as np
import cyback as K
x = K.placeholder((None, 28, 28, 32))
w = K.variable(np.random.RandomState(0).randn(3, 3, 32, 32).astype('float32') * 0.1)
y = K.conv2d(x, w, padding='same', data_format='channels_last')
loss = K.sum(y * y)
f = K.function([x], [loss] + K.gradients(loss, [x, w]))
xv = np.random.RandomState(1).randn(32, 28, 28, 32).astype('float32')
f([xv])
t0 = time.perf_counter()
for _ in range(%(iters)d):
    f([xv])
dt = time.perf_counter() - t0
print(json.dumps(dict(seconds=dt, threads=K.get_num_threads())))
"""


def busy_loop(core):
    """A process spinning on one core (``core``), killed by the caller."""
    code = "import os; os.sched_setaffinity(0, {%d})\nwhile True: pass" % core
    return subprocess.Popen([sys.executable, "-c", code])


def run(code, threads, extra_env):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.abspath(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for var in ("CYBACK_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS"):
        env.pop(var, None)
    if threads is not None:
        env["CYBACK_NUM_THREADS"] = str(threads)
    env.update(extra_env)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--conv-iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", default="1,2", help="fixed thread counts to compare")
    ap.add_argument("--no-busy", action="store_true", help="no busy loop (idle baseline)")
    ap.add_argument("--env", action="append", default=[],
                    help="VAR=value set for the default-policy runs only (e.g. "
                         "OMP_WAIT_POLICY=active to see the old behaviour)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:VAR=value[,VAR=value...]: one more default-policy "
                         "configuration with these variables, alternated with the rest "
                         "(e.g. spin4000:GOMP_SPINCOUNT=4000)")
    args = ap.parse_args()
    fixed = [int(t) for t in args.threads.split(",") if t]
    extra = dict(e.split("=", 1) for e in args.env)
    configs = [("default", None, extra)]
    for v in args.variant:
        name, _, assigns = v.partition(":")
        if not name or name in [c[0] for c in configs] or name.endswith(" threads"):
            ap.error("--variant %r: give each variant a name of its own" % v)
        configs.append((name, None, dict(a.split("=", 1) for a in assigns.split(",") if a)))
    configs += [("%d threads" % t, t, {}) for t in fixed]
    workloads = [("keras demo training (%d epochs)" % args.epochs,
                  TRAIN % dict(epochs=args.epochs)),
                 ("conv2d 3x3 32ch fwd+bwd x%d" % args.conv_iters,
                  CONV % dict(iters=args.conv_iters))]
    load = open("/proc/loadavg").read().split()[:3]
    busy = None if args.no_busy else busy_loop(0)
    times = {}
    try:
        time.sleep(0.5)
        for _ in range(args.repeats):
            for wname, code in workloads:
                for cname, threads, env in configs:
                    r = run(code, threads, env)
                    times.setdefault((wname, cname), []).append(r["seconds"])
                    times[(wname, cname, "n")] = r["threads"]
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    rows = []
    for wname, _ in workloads:
        best = min(statistics.median(times[(wname, c)]) for c, t, _ in configs if t is not None)
        for cname, _, _ in configs:
            med = statistics.median(times[(wname, cname)])
            rows.append(dict(workload=wname, config=cname, team=times[(wname, cname, "n")],
                             seconds=med, runs=" ".join("%.2f" % s for s in times[(wname, cname)]),
                             vs_best_fixed=med / best))
    title = ("busy loop on core 0" if busy is not None else "no busy loop") + \
        "; load before: %s; %d cores" % (" ".join(load), os.cpu_count())
    print_table(rows, ["workload", "config", "team", "seconds", "runs", "vs_best_fixed"],
                title=title)
    path = write_json("contention", rows, busy=busy is not None, load_before=load,
                      default_env=extra,
                      variants={name: env for name, t, env in configs[1:] if t is None})
    print("wrote", path)


if __name__ == "__main__":
    main()
