"""The Markdown report of a ``python -m cyback.bench`` run."""
import os
import re

from . import charts

METHOD = """\
## Method

- Every case runs on cyback and on each installed peer, all set to the same
  thread count ({threads}); NumPy references get their BLAS set to it too.
- Before any time counts, each peer's output is checked against cyback's
  (max |difference| / max(1, max |cyback|) <= 1e-4); a mismatch stops the run.
- Warm-up: each engine runs for a while first, which also calibrates how many
  calls fill one block (~{block_ms:.0f} ms).
- Repeated blocks: {blocks} blocks per engine; each call is timed on its own.
  The figures are the median and the 90th percentile of the per-block means.
- Alternation: the engines take turns block by block, the order rotating, so
  load from other processes falls on all of them alike.
- Roofline: NumPy's float32 matmul (sgemm, n={sgemm_n}) measured in the same
  run with the same threads, best of 9 (a peak); GFLOPS of the op cases are
  shown against it.
- The machine is shared: the load average at the start and end of the run is
  given above; figures taken with load above the core count are indicative.
"""


def _table(rows, columns):
    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return "%.3g" % v if abs(v) < 100 else "%.0f" % v
        return str(v)
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(fmt(r.get(c)) for c in columns) + " |")
    return "\n".join(out)


PEER_LABELS = {"ort": "ONNX Runtime", "torch": "PyTorch (eager)", "torch.jit": "TorchScript",
               "tf": "TensorFlow (tf.function)", "numpy": "NumPy reference"}


def summary_rows(summary):
    """(label, value) pairs saying what each summary key of results.json is."""
    out = []
    for key, value in sorted(summary.items()):
        m = re.match(r"geomean_vs_(.+)_b(\d+)$", key)
        if m:
            out.append(("cyback speed-up over %s, batch %s (geometric mean over the models)"
                        % (PEER_LABELS.get(m.group(1), m.group(1)), m.group(2)),
                        "%.2fx" % value))
        elif key == "mlp_b1_kfunction_us":
            out.append(("MLP 32-64-64-10 at batch 1, one K.function call", "%.1f us" % value))
        else:
            out.append((key.replace("_", " "), "%.3f" % value))
    return out


def speedup_series(rows, label):
    """(labels, {peer: speed-up per label}, labels no peer ran) for a chart of
    ``rows``; a case that ran on cyback alone gets no empty slot in the chart."""
    keys = []
    for r in rows:
        if label(r) not in keys:
            keys.append(label(r))
    peers = sorted({r["engine"] for r in rows if not r["engine"].startswith("cyback")})
    labels, series, alone = [], {p: [] for p in peers}, []
    for k in keys:
        values = {p: next((r["cyback_speedup"] for r in rows
                           if label(r) == k and r["engine"] == p), None) for p in peers}
        if all(v is None for v in values.values()):
            alone.append(k)
            continue
        labels.append(k)
        for p in peers:
            series[p].append(values[p])
    return labels, series, alone


def write_report(outdir, doc, charts_wanted=True):
    """Write report.md (and the charts, when wanted and matplotlib is there)
    into ``outdir``; returns the report's path. ``doc["charts"]`` lists the
    charts written."""
    os.makedirs(outdir, exist_ok=True)
    rows = [r for r in doc["rows"] if "median_us" in r]
    pngs = {}
    ops = [r for r in rows if r["suite"] == "ops"]
    models = [r for r in rows if r["suite"] == "models"]
    alone = []

    def speedups(rs, label):
        labels, series, solo = speedup_series(rs, label)
        alone.extend(solo)
        return labels, series

    if ops and charts_wanted:
        labels, series = speedups(ops, lambda r: r["case"])
        pngs["ops"] = charts.speedup_chart(
            os.path.join(outdir, "speedup_ops.png"), labels, series,
            "op cases: speed-up of cyback over each peer (>1 = cyback faster)")
        fl = [r for r in ops if r.get("gflops")]
        cases = []
        for r in fl:
            if r["case"] not in cases:
                cases.append(r["case"])
        engines = sorted({r["engine"] for r in fl})
        g = {e: [next((r["gflops"] for r in fl if r["case"] == c and r["engine"] == e), None)
                 for c in cases] for e in engines}
        pngs["gflops"] = charts.gflops_chart(os.path.join(outdir, "gflops.png"), cases, g,
                                             doc.get("sgemm_gflops"),
                                             "GFLOPS against the sgemm roofline")
    if models and charts_wanted:
        labels, series = speedups(models, lambda r: "%s b%d" % (r["model"], r["batch"]))
        pngs["models"] = charts.speedup_chart(os.path.join(outdir, "speedup_models.png"), labels,
                                              series, "models: speed-up of cyback (K.function) "
                                                      "over each peer (>1 = cyback faster)")
    groups = {}
    for r in rows:
        if r.get("latencies_us") and r.get("batch") in (1, None):
            case = r.get("model") or r.get("case")
            groups.setdefault(case, {})[r["engine"].replace("cyback ", "")] = r["latencies_us"]
    if groups and charts_wanted:
        pngs["latency"] = charts.latency_chart(os.path.join(outdir, "latency_b1.png"), groups,
                                               "single-call latency distributions, batch 1")

    m = doc["machine"]
    lines = ["# cyback benchmark report", "",
             "Command: `%s`  " % doc["command"],
             "Started %s, took %.0f s; load average %s at start, %s at end." % (
                 doc["started"], doc["seconds"], " ".join(map(str, doc["load_start"])),
                 " ".join(map(str, doc["load_end"]))), "",
             "## Machine", "",
             "- CPU: %s (%s logical cores, %s usable), ISA: %s" % (
                 m.get("cpu"), m.get("logical_cores"), m.get("usable_cores"),
                 " ".join(m.get("isa", []))),
             "- OS: %s" % m.get("os"),
             "- BLAS: %s (threads outside references: %s)" % (m.get("blas"), m.get("blas_threads")),
             "- Threads for every engine: %s" % doc["threads"],
             "- sgemm roofline (same run): %.1f GFLOPS" % doc.get("sgemm_gflops", 0.0),
             "- Versions: " + ", ".join("%s %s" % kv for kv in sorted(doc["versions"].items())),
             ""]
    lines.append(METHOD.format(threads=doc["threads"], block_ms=doc["block_seconds"] * 1e3,
                               blocks=doc["blocks"], sgemm_n=doc["sgemm_n"]))
    if doc.get("found"):
        from .found import format_availability
        lines += ["## Peers and tools", ""]
        lines += [("    - " + ln.strip()) if ln.startswith("  ") else "- " + ln
                  for ln in format_availability(doc["found"])]
        lines.append("")
    if doc.get("summary"):
        lines += ["## Summary", "", "| | |", "|---|---|"]
        for label, value in summary_rows(doc["summary"]):
            lines.append("| %s | %s |" % (label, value))
        lines.append("")
    for key, title in (("ops", "Op cases: speed-up"), ("gflops", "Op cases: GFLOPS"),
                       ("models", "Models: speed-up"), ("latency", "Batch-1 latency")):
        if pngs.get(key):
            lines += ["![%s](%s)" % (title, os.path.basename(pngs[key])), ""]
    if alone and pngs:
        lines += ["Not in the speed-up charts (no peer ran them): %s." % ", ".join(alone), ""]
    if ops:
        lines += ["## Op cases", "", _table(ops, ["case", "engine", "median_us", "p90_us", "gflops",
                                                  "cyback_speedup"]), ""]
    if models:
        lines += ["## Models", "", _table(models, ["model", "batch", "engine", "median_us",
                                                   "p90_us", "cyback_speedup"]), ""]
    skipped = [r for r in doc["rows"] if "skipped" in r]
    if skipped:
        lines += ["## Skipped", ""] + ["- %s %s: %s" % (r.get("case") or r.get("model"),
                                                          r["engine"], r["skipped"])
                                       for r in skipped] + [""]
    for sr in doc.get("scripts", []):
        lines += ["## Kernel script %s" % sr["script"], ""]
        if "error" in sr:
            lines += ["Failed: %s" % sr["error"], ""]
            continue
        lines += ["`%s` (%.0f s)" % (sr["command"], sr["seconds"]), ""]
        cols = []
        for r in sr["rows"]:
            for k, v in r.items():
                if k not in cols and not isinstance(v, (list, dict)):
                    cols.append(k)
        if sr["rows"]:
            lines += [_table(sr["rows"], cols), ""]
    lines += ["`cyback_speedup` = the peer's median time / cyback's (>1: cyback is faster).", ""]
    path = os.path.join(outdir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    doc["charts"] = [p for p in pngs.values() if p]
    return path
