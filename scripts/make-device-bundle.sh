#!/usr/bin/env bash
# Builds the CUDA configuration (sm_90; a GPU is not needed to build) and packs
# what tools/device-check.sh runs on a GPU machine into device-bundle/
# (gitignored): the binaries and the non-system shared libraries they load
# (HDF5, fmt, toml++, OpenMP, the C++ runtime), since a GPU machine need not
# have our build dependencies. The CUDA runtime is linked statically; cuBLAS
# and the driver come from the GPU machine's CUDA installation. Copy the
# repository with device-bundle/ to the GPU machine and run
# tools/device-check.sh there. scripts/check-device-bundle.sh tests the bundle
# here as far as a machine without a GPU allows.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export CED_BUILD_DIR=${CED_BUILD_DIR:-$root/build-cuda}
# nvcc: CUDACXX if set, else found by cmake/Options.cmake (PATH, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda).
export CED_CMAKE_ARGS="-DCED_ENABLE_CUDA=ON -DCED_CUDA_ARCHS=90"
"$root/scripts/setup.sh"
out=$root/device-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for exe in tools/ced unit-tests/gpu_side_by_side_test optimized/lab/cuda_backend_test optimized/lab/cuda_gemm_peak \
           optimized/lab/cuda_mode_tour; do
  cp "$CED_BUILD_DIR/$exe" "$out/bin/"
done
strip --strip-debug "$out"/bin/*  # small enough to copy quickly (the limit below)
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
if [ "$size" -gt 60 ]; then echo "device-bundle is ${size} MiB; keep it under 60 MiB" >&2; exit 1; fi
