"""Kernel outputs against a reference recorded from the code before the kernel
modules were split (tests/kernels/digests/, kernel_outputs.py says which
entries were re-recorded since, and why): a fixed set of small problems
through every kernel module, forward and gradients, float32 and float64, on
one and two threads.

On the machine the reference was recorded on (same CPU features, compiler,
BLAS and settings: the "signature") every output must be bit-identical; on
any other machine each must agree within a float tolerance. Either way the
test runs and can fail: it never skips. CYBACK_TEST_DIGESTS=exact demands
bit-identity whatever the signature (to check a refactoring on a machine
whose signature differs from the reference's, record a reference there from
the old code first: ``python tests/kernels/digests/kernel_outputs.py --record
--code OLD_CHECKOUT``).

The outputs are computed in a child interpreter, so that the thread settings
and the kernels' state of the test session play no part.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DIGESTS = os.path.join(HERE, "digests")
SCRIPT = os.path.join(DIGESTS, "kernel_outputs.py")
REFERENCE_JSON = os.path.join(DIGESTS, "reference.json")
REFERENCE_NPZ = os.path.join(DIGESTS, "reference.npz")
REFERENCE_TAG = "t2f2"

#: (relative, absolute as a fraction of the reference's largest magnitude)
#: for float results computed in a dtype, off the reference's machine. Sums
#: taken in another order or with other vector widths differ by a few ulps
#: per term; the reference stores float64 outputs as float32, hence the
#: float64 bound.
TOLERANCE = {"float32": (1e-3, 1e-4), "float64": (1e-5, 1e-6)}


def _reference_name(entry):
    parts = entry.split("/")
    return "/".join(parts[:-2] + parts[-1:])


def _tag(entry):
    return entry.split("/")[-2]


def _compute(tmp_path):
    out = str(tmp_path / "kernel_outputs.npz")
    proc = subprocess.run([sys.executable, SCRIPT, out], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, \
        "kernel_outputs.py failed (%d):\n%s\n%s" % (proc.returncode, proc.stdout, proc.stderr)
    data = np.load(out)
    return json.loads(str(data["__meta__"])), data


def _differs(a, ref):
    """'' when ``a`` agrees with the reference array within tolerance, else
    a description of how far off it is."""
    if a.shape != ref.shape:
        return "shape %s, reference %s" % (a.shape, ref.shape)
    if a.dtype.kind in "iub":
        diff = np.abs(a.astype(np.int64) - ref.astype(np.int64))
        # uint8 codes come from rounding a quotient: a tie may round apart
        allowed = 1 if a.dtype == np.uint8 else 0
        bad = diff > allowed
        worst = diff.max() if diff.size else 0
    else:
        rtol, atol = TOLERANCE.get(a.dtype.name, TOLERANCE["float32"])
        r = ref.astype(np.float64)
        scale = max(1.0, float(np.abs(r).max())) if r.size else 1.0
        diff = np.abs(a.astype(np.float64) - r)
        bad = ~(diff <= rtol * np.abs(r) + atol * scale)   # NaN counts as bad
        worst = float(np.nanmax(diff)) if diff.size else 0.0
        if np.isnan(diff).any():
            worst = float("nan")
    if bad.any():
        return "%d of %d elements outside the tolerance, max abs difference %.3g" \
            % (int(bad.sum()), bad.size, worst)
    return ""


def _max_diff(a, ref):
    if a.shape != ref.shape:
        return "shape %s, reference %s" % (a.shape, ref.shape)
    d = np.abs(a.astype(np.float64) - ref.astype(np.float64))
    return "max abs difference %.3g from the reference's %s run" % (
        float(d.max()) if d.size else 0.0, REFERENCE_TAG)


def _signature_diff(ours, theirs):
    keys = sorted(set(ours) | set(theirs))
    return ["%s: %r here, %r in the reference" % (k, ours.get(k), theirs.get(k))
            for k in keys if ours.get(k) != theirs.get(k)]


def test_kernel_outputs_match_the_reference(tmp_path):
    with open(REFERENCE_JSON) as f:
        ref = json.load(f)
    ref_arrays = np.load(REFERENCE_NPZ)
    meta, arrays = _compute(tmp_path)

    problems = ["%s: raised %s" % item for item in sorted(meta["errors"].items())]
    ours, theirs = meta["entries"], ref["entries"]
    problems += ["%s: missing (the reference has it)" % k for k in sorted(set(theirs) - set(ours))
                 if k.rsplit("/", 1)[0] not in meta["errors"]]
    problems += ["%s: not in the reference (re-record it with kernel_outputs.py --record "
                 "from the old code)" % k for k in sorted(set(ours) - set(theirs))]

    demand = os.environ.get("CYBACK_TEST_DIGESTS", "")
    exact = meta["signature_key"] == ref["signature_key"] or demand == "exact"
    mode = "bit-identical" if exact else "within tolerance"
    print("kernel digests: %d entries, compared %s (signature %s, reference %s)"
          % (len(ours), mode, meta["signature_key"], ref["signature_key"]))
    if not exact:
        for line in _signature_diff(meta["signature"], ref["signature"]):
            print("  signature differs: " + line)

    for entry in sorted(set(ours) & set(theirs)):
        a, r = arrays[entry], ref_arrays[_reference_name(entry)]
        if exact:
            if ours[entry] != theirs[entry]:
                problems.append("%s: bytes differ (%s)" % (entry, _max_diff(a, r)))
        else:
            why = _differs(a, r)
            if why:
                problems.append("%s: %s" % (entry, why))

    # On any machine: forcing the team onto one thread must not change a bit
    # (kernels split their work by the team's size, not by the threads running it).
    for entry in sorted(ours):
        if _tag(entry) == "t2f1":
            twin = entry.replace("/t2f1/", "/t2f2/")
            if twin in ours and ours[twin] != ours[entry]:
                problems.append("%s: differs from %s (results depend on the threads that ran)"
                                % (entry, twin))

    if problems:
        pytest.fail("%d kernel output(s) differ from tests/kernels/digests/reference.* (%s):\n"
                    % (len(problems), mode) + "\n".join("  " + p for p in problems),
                    pytrace=False)
