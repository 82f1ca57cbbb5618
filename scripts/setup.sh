#!/usr/bin/env bash
# Installs what the harness needs (Debian packages), configures and builds.
# Idempotent: a second run only rebuilds what changed. Used by verify.sh,
# test.sh and CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${CED_BUILD_DIR:-$root/build}

packages=(build-essential cmake ninja-build pkg-config libeigen3-dev libhdf5-dev hdf5-tools libgtest-dev libgmock-dev
          librapidcheck-dev libcli11-dev libtomlplusplus-dev libfmt-dev python3
          nlohmann-json3-dev python3-dev python3-venv python3-numpy python3-torch python3-pytest pybind11-dev)
packages+=(gnuplot-nox)  # the plots of `ced replay-budget` and `ced merge` (tools/replay-budget.gp)
packages+=(python3-h5py)  # scripts/bench-numpy.py reads run files (its timings want libopenblas0-pthread too, by hand)
packages+=(${CED_SETUP_EXTRA:-})  # scripts/test.sh long: slurm-wlm munge for the Slurm test
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Configured through the presets (CMakePresets.json): `cuda` where nvcc is
# found (on PATH, in $CUDA_HOME or $CUDA_PATH, or /usr/local/cuda; no GPU is
# needed to build), `dev` otherwise. CED_BUILD_DIR moves the build folder
# (default build/), CED_CMAKE_ARGS adds cache settings.
preset=dev
if [ -n "${CUDACXX:-}" ] || command -v nvcc >/dev/null 2>&1; then
  preset=cuda
else
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    if [ -n "$d" ] && [ -x "$d/bin/nvcc" ]; then preset=cuda; break; fi
  done
fi

if [ ! -f "$build/build.ninja" ]; then
  (cd "$root" && cmake --preset "$preset" -B "$build" ${CED_CMAKE_ARGS:-})
fi
cmake --build "$build" -j "$(nproc)"
