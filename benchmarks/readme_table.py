"""Write the README's performance table from a bench_applications result.

    python benchmarks/readme_table.py [benchmarks/results/applications.json]

Replaces what stands between the ``<!-- perf-table -->`` and
``<!-- /perf-table -->`` lines of README.md with a table made from the JSON
(per model and batch: cyback's time, the best peer's, the ratio) and a caption
naming the machine and the command (the date stays in the result's JSON). The
table is never edited by hand: run the benchmark, then this.
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(os.path.dirname(HERE), "README.md")
START, END = "<!-- perf-table -->", "<!-- /perf-table -->"
NAMES = {"mobilenet": "MobileNet", "mobilenetv2": "MobileNetV2", "resnet50": "ResNet50",
         "densenet121": "DenseNet121", "inceptionv3": "InceptionV3",
         "nasnetmobile": "NASNetMobile", "text_bilstm": "Embedding + BiLSTM(64)",
         "text_cnn": "Embedding + Conv1D text CNN",
         "transformer_block": "Transformer encoder block"}
PEERS = {"tf": "TF", "ort": "ONNX Runtime", "openvino": "OpenVINO", "litert": "LiteRT"}


def _ms(v):
    return "-" if v is None else ("%.2f ms" % v if v < 10 else "%.1f ms" % v)


def table(result):
    rows = [r for r in result["summary"] if r["model"] != "geomean"]
    batches = sorted({r["batch"] for r in rows})
    by = {(r["model"], r["batch"]): r for r in rows}
    models = list(dict.fromkeys(r["model"] for r in rows))
    head = ["model"]
    for b in batches:
        head += ["cyback b%d" % b, "best peer b%d" % b, "ratio b%d" % b]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in models:
        cells = [NAMES.get(m, m)]
        for b in batches:
            r = by.get((m, b), {})
            best = r.get("best_peer")
            cells.append(_ms(r.get("cyback")))
            cells.append("%s (%s)" % (_ms(r.get(best)), PEERS.get(best, best)) if best else "-")
            cells.append("%.2f×" % r["ratio_to_best"] if "ratio_to_best" in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    geo = {r["batch"]: r["ratio_to_best"] for r in result["summary"] if r["model"] == "geomean"}
    blas = re.findall(r"(\w+) MAX_THREADS=", result.get("versions", {}).get("cyback_blas", ""))
    blas_note = " (OpenBLAS kernels: %s)" % ", ".join(sorted(set(blas))) if blas else ""
    lines.append("")
    lines.append("Ratio: the best peer's time over cyback's (above 1: cyback is faster). Geomean "
                 + ", ".join("%.2f× at batch %d" % (geo[b], b) for b in batches if b in geo)
                 + ". %s%s; %d threads for every engine, median of %d rounds; `%s` (when: "
                 "the result's JSON, benchmarks/results/)."
                 % (result.get("machine", "machine not recorded"), blas_note, result["threads"],
                    result["rounds"], result["command"]))
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else os.path.join(HERE, "results", "applications.json")
    with open(path) as f:
        result = json.load(f)
    with open(README) as f:
        text = f.read()
    if START not in text or END not in text:
        raise SystemExit("README.md has no %s ... %s section" % (START, END))
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    with open(README, "w") as f:
        f.write(before + START + "\n" + table(result) + "\n" + END + after)
    print("wrote the performance table of README.md from", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
