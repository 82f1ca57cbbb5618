#!/usr/bin/env bash
# Builds the CUDA configuration on this machine (sm_90; nvcc needed, no GPU)
# and packs what tools/device-check.sh runs on a GPU machine into
# device-bundle/ (gitignored): the binaries and the non-system shared
# libraries they load (HDF5, fmt, toml++, OpenMP), so the GPU machine needs
# none of our Debian packages, only an NVIDIA driver and the CUDA toolkit's
# cuBLAS (the CUDA runtime is linked statically). Then copy device-bundle/,
# golden/ and tools/device-check.sh (or the whole checkout) to the GPU
# machine and run tools/device-check.sh there (see README.md, "On a GPU machine").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export CED_BUILD_DIR=${CED_BUILD_DIR:-$root/build-cuda}
export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
export CED_CMAKE_ARGS="-DCED_ENABLE_CUDA=ON -DCED_CUDA_ARCHS=90"
"$root/scripts/setup.sh"
out=$root/device-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for exe in tools/ced unit-tests/gpu_side_by_side_test optimized/cuda_backend_test; do
  cp "$CED_BUILD_DIR/$exe" "$out/bin/"
done
strip --strip-debug "$out"/bin/*  # no debug info: the GPU machine only runs them
for exe in "$out"/bin/*; do
  ldd "$exe" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*|libcublasLt*) ;;
      *) cp -n "$lib" "$out/lib/" ;;
    esac
  done
done
du -sh "$out"
size=$(du -sm "$out" | cut -f1)
if [ "$size" -gt 60 ]; then echo "device-bundle is ${size} MiB, over its 60 MiB budget: a binary or library grew unexpectedly" >&2; exit 1; fi
