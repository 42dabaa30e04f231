"""Model-level benchmark (issue 8): seven Keras 2.3.1 architectures on cyback
against ONNX Runtime, PyTorch (eager, TorchScript) and TF ``tf.function``.

    KERAS_BACKEND=cyback python benchmarks/bench_models.py [--quick] [--threads 2]
        [--models mlp,cnn,...] [--batches 1,32] [--peers ort,torch,torch.jit,tf]

Run it against any checkout with PYTHONPATH=<checkout>; the peers are optional
(each one that imports takes part) and each one's output is checked against
cyback's to 1e-4 before its time counts. Engines run alternated in one
process with the same thread count. Prints a table, the geomean speed-up of
cyback against each peer per batch size and the MLP batch-1 K.function time;
writes benchmarks/results/models.json and models.png (with matplotlib).
"""
import argparse
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "cyback")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, print_table, write_json  # noqa: E402  (loads cyback.bench)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="few short blocks (a smoke run)")
    p.add_argument("--threads", type=int, default=2, help="threads for every engine")
    p.add_argument("--models", default=None, help="comma-separated subset of the seven models")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--peers", default="ort,torch,torch.jit,tf")
    p.add_argument("--blocks", type=int, default=None)
    p.add_argument("--out", default="models", help="result name under benchmarks/results")
    args = p.parse_args(argv)

    import contextlib
    import io
    with contextlib.redirect_stderr(io.StringIO()):
        import keras  # noqa: F401  (prints "Using cyback backend.")
    import cyback
    from cyback.bench import charts, machine
    from cyback.bench.models import MODELS, load_peers, peer_versions, run_models, summary

    models = args.models.split(",") if args.models else list(MODELS)
    batches = [int(b) for b in args.batches.split(",")]
    wanted = tuple(args.peers.split(",")) if args.peers else ()
    peers = load_peers(args.threads, wanted)
    load = machine.load_average()

    def progress(what, seconds):
        print("  %-14s %.1fs" % (what, seconds), file=sys.stderr, flush=True)

    rows = run_models(models, batches, threads=args.threads, quick=args.quick, peers=peers,
                      wanted=wanted, progress=progress, blocks=args.blocks)
    shown = [dict(r, engine=r["engine"]) for r in rows if "median_us" in r]
    print_table(shown, ["model", "batch", "engine", "median_us", "p90_us", "cyback_speedup"],
                title="Per-call time, %d threads (median and p90 over blocks); cyback_speedup = "
                      "engine time / cyback K.function time; load %s"
                      % (args.threads, " ".join("%.2f" % v for v in load)))
    for r in rows:
        if "skipped" in r:
            print("skipped %s on %s b%d: %s" % (r["engine"], r["model"], r["batch"], r["skipped"]))
    summ = summary(rows)
    for b in batches:
        g = summ.get("geomean_vs_ort_b%d" % b)
        print("geomean cyback/ORT speed-up at batch %d: %s"
              % (b, "-" if g is None else "%.3fx" % g))
    for k, v in sorted(summ.items()):
        if k.startswith("geomean") and "_ort_" not in k:
            print("%s: %.3fx" % (k, v))
    if "mlp_b1_kfunction_us" in summ:
        print("MLP batch 1 through K.function: %.1f us" % summ["mlp_b1_kfunction_us"])
    path = write_json(args.out, rows, threads=args.threads, quick=args.quick, load=load,
                      summary=summ, cyback=os.path.dirname(cyback.__file__),
                      versions=dict(machine.engine_versions(), **peer_versions(peers)))
    print("wrote", path)
    png = models_chart(rows, os.path.join(RESULTS_DIR, args.out + ".png"), charts)
    if png:
        print("wrote", png)
    return rows


def models_chart(rows, path, charts):
    """Speed-up of cyback's K.function over each peer, per model and batch."""
    labels = []
    series = {}
    keys = []
    for r in rows:
        if "median_us" in r and (r["model"], r["batch"]) not in keys:
            keys.append((r["model"], r["batch"]))
    peers = sorted({r["engine"] for r in rows
                    if "median_us" in r and not r["engine"].startswith("cyback")})
    for model, batch in keys:
        labels.append("%s b%d" % (model, batch))
        for peer in peers:
            v = [r["cyback_speedup"] for r in rows if r["model"] == model and r["batch"] == batch
                 and r["engine"] == peer and "median_us" in r]
            series.setdefault(peer, []).append(v[0] if v else None)
    return charts.speedup_chart(path, labels, series,
                                "cyback (K.function) speed-up over each peer; >1 = cyback faster")


if __name__ == "__main__":
    main()
