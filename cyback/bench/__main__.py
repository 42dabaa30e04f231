"""python -m cyback.bench: benchmark cyback against the installed peers.

    python -m cyback.bench [--quick | --heavy] [--threads 2] [--out DIR]
                           [--suites ops,models] [--peers numpy,torch,ort,torch.jit,tf]
    python -m cyback.bench --compare old.json new.json

Writes DIR/report.md, DIR/results.json and PNG charts (with matplotlib, the
``bench`` extra). The peers are optional: each one that imports takes part.
"""
import argparse
import json
import os
import sys
import time


class Progress:
    """A one-line text progress bar on stderr (plain lines when it is not a terminal)."""

    def __init__(self, total, stream=sys.stderr, width=30):
        self.total, self.done, self.stream, self.width = max(total, 1), 0, stream, width
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.perf_counter()

    def step(self, label):
        self.done += 1
        frac = self.done / self.total
        bar = "#" * int(frac * self.width)
        line = "[%-*s] %3d%% %5.0fs  %s" % (self.width, bar, frac * 100,
                                            time.perf_counter() - self.t0, label[:50])
        if self.tty:
            self.stream.write("\r" + line.ljust(100))
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m cyback.bench",
                                description="Benchmark cyback against the installed peers.")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="tiny sizes, few short blocks: a smoke run of a few seconds")
    size.add_argument("--heavy", action="store_true", help="large shapes (minutes)")
    p.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    p.add_argument("--suites", default="ops,models", help="ops, models or both")
    p.add_argument("--peers", default="numpy,torch,torch.jit,ort,tf",
                   help="peers allowed to take part (those installed do)")
    p.add_argument("--cases", default=None, help="comma-separated op families to run")
    p.add_argument("--models", default=None, help="comma-separated models to run")
    p.add_argument("--out", default="cyback-bench", help="output folder (default ./cyback-bench)")
    p.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"),
                   help="list the cases slower/faster beyond noise between two results.json")
    p.add_argument("--threshold", type=float, default=0.10,
                   help="--compare: smallest relative change reported (default 0.10)")
    p.add_argument("--scripts", action="store_true",
                   help="also run the checkout's kernel scripts benchmarks/bench_*.py "
                        "(their smoke sizes with --quick) and fold their tables into the report")
    p.add_argument("--no-charts", action="store_true")
    args = p.parse_args(argv)
    args.argv = list(argv)
    if args.threads < 1:
        p.error("--threads must be positive")
    return args


def run(args, stream=None):
    """Run the suites named in ``args``; returns the result document (also written to disk)."""
    stream = sys.stderr if stream is None else stream
    import numpy as np

    import cyback

    from . import found, machine, ops
    from .report import write_report
    from .timing import time_alternated

    cyback.set_num_threads(args.threads)
    scale = "tiny" if args.quick else ("heavy" if args.heavy else "normal")
    blocks = 3 if args.quick else 9
    block_s = 0.002 if args.quick else 0.03
    warm_s = 0.005 if args.quick else 0.1
    suites = set(args.suites.split(","))
    unknown = suites - {"ops", "models"}
    if unknown:
        raise SystemExit("python -m cyback.bench: unknown suite(s) %s" % ", ".join(sorted(unknown)))
    wanted = set(args.peers.split(",")) if args.peers else set()
    available = found.availability(wanted)
    print("python -m cyback.bench: peers and tools", file=stream)
    for line in found.format_availability(available):
        print("  " + line, file=stream)
    charts = not args.no_charts and found.have(available, "matplotlib")
    if not args.no_charts and not charts:
        print("  no charts: matplotlib is not installed (pip install matplotlib); the report "
              "and results.json are written all the same", file=stream)
    torch = None
    if wanted & {"torch", "torch.jit", "ort"}:
        try:
            import torch
            torch.set_num_threads(args.threads)
        except Exception:
            torch = None
    op_cases = list(ops.CASES)
    if args.cases:
        keep = set(args.cases.split(","))
        op_cases = [c for c in op_cases if c.__name__[len("case_"):] in keep]

    models_mod = None
    model_names = []
    if "models" in suites:
        os.environ.setdefault("KERAS_BACKEND", "cyback")
        try:
            import contextlib
            import io
            with contextlib.redirect_stderr(io.StringIO()):
                import keras
            if keras.backend.backend() != "cyback":
                raise ImportError("Keras runs on %s" % keras.backend.backend())
            from . import models as models_mod
            model_names = args.models.split(",") if args.models else list(models_mod.MODELS)
            if args.quick:
                model_names = model_names[:1]
        except ImportError as e:
            print("models suite skipped: Keras on cyback is not importable (%s)" % e, file=stream)
    batches = (1,) if args.quick else (1, 32)
    from . import scripts
    script_names = scripts.script_names() if args.scripts else []
    if args.scripts and not script_names:
        print("--scripts: no benchmarks/ folder beside this cyback (an installed package)",
              file=stream)
    total = (1 + (len(op_cases) if "ops" in suites else 0) + len(model_names) * len(batches)
             + len(script_names))
    bar = Progress(total, stream)

    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    t_start = time.perf_counter()
    load_start = machine.load_average()
    sgemm_n = 128 if args.quick else (2048 if args.heavy else 1024)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((sgemm_n, sgemm_n), dtype=np.float32)
    # A roofline is a peak: the fastest of the repeats, not their median, so
    # that a burst of load during the measurement does not lower it.
    with ops.blas_threads(args.threads):
        a @ a
        times = []
        for _ in range(3 if args.quick else 9):
            t0 = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - t0)
    sgemm = 2.0 * sgemm_n ** 3 / min(times) / 1e9
    bar.step("sgemm roofline %.1f GFLOPS" % sgemm)

    rows = []
    if "ops" in suites:
        for make in op_cases:
            case = make(scale, torch if "torch" in wanted else None, args.threads)
            if "numpy" not in wanted:
                case.engines.pop("numpy", None)
            errors = ops.checked(case)
            stats = time_alternated(case.engines, blocks=blocks, block_seconds=block_s,
                                    warmup_seconds=warm_s, keep_latencies=case.family == "overhead")
            base = stats["cyback"]["median_s"]
            for engine, s in stats.items():
                row = {"suite": "ops", "case": case.name, "family": case.family, "engine": engine,
                       "median_us": s["median_s"] * 1e6, "p90_us": s["p90_s"] * 1e6,
                       "calls_per_block": s["calls"], "cyback_speedup": s["median_s"] / base,
                       "max_err": errors.get(engine),
                       "gflops": case.flops / s["median_s"] / 1e9 if case.flops else None}
                if "latencies_s" in s:
                    row["latencies_us"] = [round(v * 1e6, 3) for v in s["latencies_s"][:2000]]
                rows.append(row)
            bar.step(case.name)
    versions = machine.engine_versions()
    if torch is not None:
        versions["torch"] = torch.__version__
    if model_names:
        peers = models_mod.load_peers(args.threads, tuple(wanted))
        versions.update(models_mod.peer_versions(peers))

        def progress(label, seconds):
            bar.step("model " + label)
        for r in models_mod.run_models(model_names, batches, threads=args.threads,
                                       quick=args.quick, peers=peers, wanted=tuple(wanted),
                                       progress=progress, blocks=blocks):
            r["suite"] = "models"
            rows.append(r)
    script_results = []
    for name in script_names:
        script_results.append(scripts.run_script(name, args.threads, args.quick))
        bar.step(name)
    argv = getattr(args, "argv", sys.argv[1:])
    doc = {"command": " ".join(["python -m cyback.bench"] + argv),
           "started": started, "seconds": time.perf_counter() - t_start,
           "load_start": load_start, "load_end": machine.load_average(),
           "threads": args.threads, "scale": scale, "blocks": blocks, "block_seconds": block_s,
           "sgemm_n": sgemm_n, "sgemm_gflops": sgemm, "machine": machine.describe(args.threads),
           "versions": versions, "rows": rows, "scripts": script_results, "found": available}
    if model_names:
        doc["summary"] = models_mod.summary([r for r in rows if r["suite"] == "models"])
    os.makedirs(args.out, exist_ok=True)
    results = os.path.join(args.out, "results.json")
    with open(results, "w") as f:
        json.dump(doc, f, indent=1, default=float)
    doc["report"] = write_report(args.out, doc, charts_wanted=charts)
    doc["files"] = [results, doc["report"]] + doc.pop("charts", [])
    return doc


def speedup_lines(rows):
    """A table of each peer's time against cyback's, per case or model."""
    base = {}
    for r in rows:
        if "median_us" in r and r["engine"] in ("cyback", "cyback K.function"):
            base[(r.get("case") or r.get("model"), r.get("batch"))] = r["median_us"]
    table = []
    for r in rows:
        if "median_us" not in r or r["engine"].startswith("cyback"):
            continue
        what = r.get("case") or "%s, batch %d" % (r["model"], r["batch"])
        mine = base.get((r.get("case") or r.get("model"), r.get("batch")))
        table.append((what, r["engine"], "%.1f" % mine if mine else "-",
                      "%.1f" % r["median_us"], "%.2fx" % r["cyback_speedup"]))
    if not table:
        return ["no peer ran: nothing to compare cyback with (see 'not found' above)"]
    head = ("case", "peer", "cyback us", "peer us", "cyback speed-up")
    widths = [max(len(row[i]) for row in table + [head]) for i in range(5)]
    fmt = "  %-*s  %-*s  %*s  %*s  %*s"
    out = [fmt % sum(zip(widths, head), ())]
    out += [fmt % sum(zip(widths, row), ()) for row in table]
    return out


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.compare:
        from .compare import format_comparison
        print(format_comparison(args.compare[0], args.compare[1], args.threshold))
        return 0
    doc = run(args)
    from .report import summary_rows
    print("sgemm roofline: %.3g GFLOPS (%d thread%s); load average %s at the start, %s at "
          "the end" % (doc["sgemm_gflops"], doc["threads"], "" if doc["threads"] == 1 else "s",
                       " ".join(map(str, doc["load_start"])),
                       " ".join(map(str, doc["load_end"]))))
    for line in speedup_lines(doc["rows"]):
        print(line)
    rows = summary_rows(doc.get("summary", {}))
    if rows:
        print("summary:")
        width = max(len(label) for label, _ in rows)
        for label, value in rows:
            print("  %-*s  %s" % (width, label, value))
    print("wrote:")
    for path in doc["files"]:
        print("  " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
