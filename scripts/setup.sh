#!/usr/bin/env bash
# Installs what the harness needs (Debian packages), configures and builds.
# Idempotent: a second run only rebuilds what changed. Used by verify.sh,
# test.sh and CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${CED_BUILD_DIR:-$root/build}

packages=(build-essential cmake ninja-build pkg-config libeigen3-dev libhdf5-dev hdf5-tools libgtest-dev libgmock-dev
          librapidcheck-dev libcli11-dev libtomlplusplus-dev libfmt-dev libbenchmark-dev python3)
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

# The CUDA toolkit, where present, builds the optimized backend (no GPU needed to build).
if [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDACXX=/usr/local/cuda/bin/nvcc; fi

if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CED_CMAKE_ARGS:-}
fi
cmake --build "$build" -j "$(nproc)"
