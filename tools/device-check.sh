#!/usr/bin/env bash
# Runs on a GPU machine, from a checkout (or a copy of golden/ and tools/)
# beside the device-bundle/ that scripts/make-device-bundle.sh built on a
# machine with nvcc: the gpu tests, `ced gate --backend cuda`, and `ced bench`
# on `bench` at N = 8192. The log goes to device-check.log in the folder named
# by the environment variable OUT (default: device-out/ in the checkout).
# Exit code 0 when every step passed, 1 otherwise.
# Usage: tools/device-check.sh        (or OUT=/some/dir tools/device-check.sh)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$root/device-bundle
out=${OUT:-$root/device-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CED_GOLDEN_DIR=$root/golden
ced=$bundle/bin/ced
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  echo "== cuda_backend_test"; timeout 120 "$bundle/bin/cuda_backend_test" || status=1
  echo "== gpu_side_by_side_test"; timeout 300 "$bundle/bin/gpu_side_by_side_test" || status=1
  echo "== ced gate --backend cuda"; timeout 200 "$ced" gate --golden "$root/golden" --backend cuda || status=1
  echo "== ced bench (bench, N = 8192)"
  timeout 200 "$ced" bench --config bench --tokens 8192 --decode 16 --backend cuda --backend cuda-bf16 || status=1
  echo "== ced bench reference (bench, N = 256, for the ratio)"
  timeout 120 "$ced" bench --config bench --tokens 256 --decode 4 --backend reference --backend cuda || status=1
  echo "device-check status $status"
} 2>&1 | tee "$out/device-check.log"
exit $status
