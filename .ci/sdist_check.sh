#!/usr/bin/env bash
# CI: cyback as a package index serves it. Build the sdist from the checkout, then a wheel
# from that sdist alone (python -m build does exactly this), check what each carries, install
# the wheel into a fresh virtual environment and run the tests that need no Keras against the
# installed copy, from outside the checkout so that `import cyback` cannot find the source tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=${PYTHON:-python3}

"$py" -m venv "$work/tools"
"$work/tools/bin/pip" install -q build
"$work/tools/bin/python" -m build --outdir "$work/dist" "$root"
sdist=$(ls "$work"/dist/cyback-*.tar.gz)
wheel=$(ls "$work"/dist/cyback-*.whl)

fail() { echo "sdist_check: $*" >&2; exit 1; }
kernels=$(cd "$root/cyback/kernels" && ls ./*.pyx | sed 's|^\./||; s|\.pyx$||')

# The sdist: every kernel source and header, the build files, nothing generated.
tar tzf "$sdist" | sed 's|^[^/]*/||' > "$work/sdist.txt"
for f in setup.py pyproject.toml MANIFEST.in LICENSE README.md; do
    grep -qx "$f" "$work/sdist.txt" || fail "$f missing from the sdist"
done
for f in $(cd "$root" && ls cyback/kernels/*.pyx cyback/kernels/*.pxd include/*.h); do
    grep -qx "$f" "$work/sdist.txt" || fail "$f missing from the sdist"
done
if grep -E '\.(c|cpp|so|o|html)$' "$work/sdist.txt"; then fail "generated files in the sdist"; fi

# The wheel: one extension module per kernel, no sources or headers.
"$work/tools/bin/python" -m zipfile -l "$wheel" | awk 'NR > 1 {print $1}' > "$work/wheel.txt"
for k in $kernels; do
    grep -q "^cyback/kernels/$k\..*\.so$" "$work/wheel.txt" || fail "kernel $k missing from the wheel"
done
if grep -E '\.(c|cpp|pyx|pxd|h)$' "$work/wheel.txt"; then fail "sources in the wheel"; fi
wheel_kb=$(du -k "$wheel" | cut -f1)
echo "wheel $(basename "$wheel"): ${wheel_kb} kB"
# Thirteen kernel modules, most with AVX2 and baseline copies of their vector code (the
# convolutions, the recurrent product and the int8 products AVX-512 ones too) and float and
# double variants, stripped, plus the Python (model loading, layers, quantization) come to
# ~3.2 MB zipped; the limit catches what should never be shipped (symbols and debug info
# double it, sources, build products).
[ "$wheel_kb" -lt 4096 ] || fail "wheel is ${wheel_kb} kB, over 4 MB"

"$py" -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$wheel[test]"
site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
installed_kb=$(du -sk "$site/cyback" | cut -f1)
echo "installed cyback: ${installed_kb} kB"
# Unzipped, the same modules come to ~7.5 MB of kernels plus the Python and its bytecode
# (~12 MB in all; debug symbols or sources would add several MB).
[ "$installed_kb" -lt 13312 ] || fail "installed package is ${installed_kb} kB, over 13 MB"

cd "$work"
"$work/venv/bin/python" - "$site" $kernels <<'PY'
import importlib, os, sys
site, kernels = os.path.realpath(sys.argv[1]), sys.argv[2:]
import cyback
assert os.path.realpath(cyback.__file__).startswith(site), cyback.__file__
for k in kernels:
    importlib.import_module("cyback.kernels." + k)
print("cyback", cyback.__version__, "from", os.path.dirname(cyback.__file__), "with kernels", *kernels)
PY
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider \
    "$root/tests/kernels" "$root/tests/api" "$root/tests/graph" "$root/tests/ops" "$root"/tests/test_*.py
