"""Which peers and chart libraries are installed, said before a run starts.

Found by their import specs and distribution metadata only, so that asking
does not import PyTorch or TensorFlow (seconds each); a peer that is found
but then fails to import is reported by the suite that tries it.
"""
import importlib.metadata
import importlib.util

# (name shown, import name, distribution, what it is for, which --peers it serves)
PACKAGES = [
    ("numpy", "numpy", "numpy", "reference implementations of the op cases", ("numpy",)),
    ("torch", "torch", "torch", "PyTorch eager and TorchScript peers; exports the ONNX models",
     ("torch", "torch.jit", "ort")),
    ("onnxruntime", "onnxruntime", "onnxruntime", "ONNX Runtime peer (needs torch and onnx)",
     ("ort",)),
    ("onnx", "onnx", "onnx", "the ONNX export of the models for ONNX Runtime", ("ort",)),
    ("tensorflow", "tensorflow", "tensorflow", "TensorFlow peer (needs tf_keras)", ("tf",)),
    ("tf_keras", "tf_keras", "tf-keras", "the models built for the TensorFlow peer", ("tf",)),
    ("keras", "keras", "keras", "the model suite (multi-backend Keras 2.3.1 on cyback)", ()),
    ("matplotlib", "matplotlib", "matplotlib", "the PNG charts (the bench extra)", ()),
]
#: Engines some scripts in benchmarks/ compare against but this suite does not run.
OTHER_ENGINES = [("openvino", "openvino", "openvino",
                  "benchmarks/bench_applications.py only; not a peer of this suite")]


def _version(import_name, distribution):
    """The installed version, or None when the module cannot be found."""
    try:
        if importlib.util.find_spec(import_name) is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def availability(wanted=None):
    """[{name, version (None: not found), role, peers, other}] for every
    package the benchmarks can use; ``wanted`` (the --peers list) marks the
    peers left out on purpose."""
    rows = []
    for name, module, dist, role, peers in PACKAGES:
        row = {"name": name, "version": _version(module, dist), "role": role,
               "peers": list(peers), "other": False}
        if wanted is not None and peers and not set(peers) & set(wanted):
            row["skipped"] = "not in --peers"
        rows.append(row)
    for name, module, dist, role in OTHER_ENGINES:
        rows.append({"name": name, "version": _version(module, dist), "role": role,
                     "peers": [], "other": True})
    return rows


def format_availability(rows):
    """Lines saying what was found and what was not, and what each is for."""
    found = [r for r in rows if r["version"] and not r["other"]]
    missing = [r for r in rows if not r["version"] and not r["other"]]
    lines = ["found:" if found else "found: none of the peers"]
    for r in found:
        note = " (installed, left out: %s)" % r["skipped"] if r.get("skipped") else ""
        lines.append("  %s %s: %s%s" % (r["name"], r["version"], r["role"], note))
    if missing:
        lines.append("not found (install any of them to add what it is for):")
        lines += ["  %s: %s" % (r["name"], r["role"]) for r in missing]
    for r in rows:
        if r["other"]:
            lines.append("%s %s: %s" % (r["name"], r["version"] or "not found", r["role"]))
    return lines


def have(rows, name):
    return any(r["name"] == name and r["version"] for r in rows)
