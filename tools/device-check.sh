#!/usr/bin/env bash
# The GPU check: everything worth knowing about the CUDA model from one run of
# a few minutes on a GPU machine. Prepare anywhere with the CUDA toolkit (no GPU
# needed): scripts/make-device-bundle.sh builds the binaries into
# device-bundle/. Copy the repository with device-bundle/ to the GPU machine
# and run, from the repository root:
#
#   OUT=<results folder> tools/device-check.sh
#
# The machine needs an NVIDIA driver and the CUDA toolkit's libcublas; none of
# our build dependencies (the bundle carries them). Steps, in this order, each
# with its own time limit and logged as it ends, so a later step's failure or
# a kill never hides an earlier result:
#   1. the device and its cuBLAS GEMM rate, f32 and bf16 (cuda_gemm_peak);
#   2. the gpu tests; `ced gate --backend cuda` and `--backend cuda-bf16` over
#      every golden file;
#   3. compute-sanitizer memcheck, racecheck, synccheck, initcheck on every mode
#      of the CUDA backend on `tiny` (cuda_mode_tour); a tool the machine
#      refuses is reported as refused, never as clean;
#   4. `ced bench` on `bench` at N = 1024 and 8192 for cuda and cuda-bf16;
#   5. one Nsight Compute profile of the slowest kernel of a `bench` prefill
#      (found by a first timing pass over every kernel);
#   6. the PyTorch example engine's tests on the device, where it exists.
# Results under $OUT (at most 8 files): summary.json (every verdict and
# figure), device-check.log (every step's output), gemm-peak.json,
# bench-1024.json, bench-8192.json, ncu-kernels.csv, ncu-profile.txt.
# CED_DEVICE_BUDGET_S (default 480) bounds the whole run: a step whose time
# limit no longer fits is reported as "not run: out of time".
# Exit: 0 every verdict passed; 1 a verdict failed; 77 no CUDA device (every
# step reports skipped: this is the dry run on a machine without a GPU).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${CED_BUNDLE:-$root/device-bundle}
out=${OUT:-$root/device-out}
budget=${CED_DEVICE_BUDGET_S:-480}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH=$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CED_GOLDEN_DIR=$root/golden
export OMP_WAIT_POLICY=PASSIVE
ced=$bundle/bin/ced
log=$out/device-check.log
steps=$work/steps.tsv
: >"$log"
: >"$steps"
start=$SECONDS

if [ ! -x "$ced" ]; then
  echo "device-check: no bundle at $bundle: run scripts/make-device-bundle.sh first" >&2
  exit 2
fi

find_tool() {  # a CUDA tool on the PATH, in the toolkit, or in an Nsight install
  command -v "$1" 2>/dev/null && return
  for f in /usr/local/cuda/bin/"$1" /opt/nvidia/nsight-compute/*/"$1"; do
    [ -x "$f" ] && { echo "$f"; return; }
  done
}

# The summary is rewritten after every step, so it is complete up to the last
# step that ended even if the run is killed.
summarize() {
  python3 "$root/tools/device-summary.py" "$steps" "$out" >"$out/summary.json.tmp" 2>>"$log" &&
    mv "$out/summary.json.tmp" "$out/summary.json"
}

# step NAME LIMIT_S CLASSIFIER COMMAND...: runs COMMAND with a time limit,
# appends its output to the log and records NAME, verdict, rc and seconds.
# CLASSIFIER turns (rc, output file) into a verdict: pass | fail | skipped |
# refused | timeout.
step() {
  local name=$1 limit=$2 classify=$3
  shift 3
  local left=$((budget - (SECONDS - start)))
  if [ "$limit" -gt "$left" ]; then
    printf '%s\tnot-run\t-\t0\tout of time (%ss left, limit %ss)\n' "$name" "$left" "$limit" >>"$steps"
    printf '\n== %s: not run, out of time\n' "$name" >>"$log"
    summarize
    return
  fi
  local t0=$SECONDS rc
  printf '\n== %s (limit %ss): %s\n' "$name" "$limit" "$*" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >"$work/$name.out" 2>&1
  rc=$?
  cat "$work/$name.out" >>"$log"
  local verdict
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then verdict=timeout; else verdict=$($classify $rc "$work/$name.out"); fi
  local note
  note=$(grep -m1 -E 'FAIL|ERROR|error|refused|not supported|SKIP' "$work/$name.out" | tr '\t' ' ' | cut -c1-200)
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$verdict" "$rc" "$((SECONDS - t0))" "$note" >>"$steps"
  printf '== %s: %s (rc %s, %ss)\n' "$name" "$verdict" "$rc" "$((SECONDS - t0))" >>"$log"
  echo "device-check: $name: $verdict ($((SECONDS - t0)) s)"
  summarize
}

# Verdicts. 77 is the skip code of every program here ("SKIP: no CUDA device").
by_exit() { case $1 in 0) echo pass ;; 77) echo skipped ;; *) echo fail ;; esac; }
by_gate() {  # `ced gate` exits 2 with "not supported" / "no CUDA device" when it cannot run
  if grep -qiE 'no CUDA device|not supported' "$2"; then echo skipped; else by_exit "$1"; fi
}
by_sanitizer() {  # --error-exitcode 9: findings; a refusal is not a pass
  if grep -q '^SKIP: no CUDA device' "$2"; then echo skipped
  elif grep -qiE 'Device not supported|not supported on this|Unable to|LibraryNotLoaded|unrecognized option|error 999' "$2"; then echo refused
  elif [ "$1" -eq 0 ] && grep -qE 'ERROR SUMMARY: 0 errors' "$2"; then echo pass
  else echo fail; fi
}
by_python() { case $1 in 0) echo pass ;; 5) echo skipped ;; *) echo fail ;; esac; }

gpu=yes
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$work/smi" 2>&1 || gpu=no
"$bundle/bin/cuda_gemm_peak" >/dev/null 2>&1
[ $? -eq 77 ] && gpu=no
{ echo "device-check: $(date -u +%FT%TZ), budget ${budget}s, GPU: $gpu"; cat "$work/smi"; } | tee -a "$log"

# 1. The device's GEMM rate.
step gemm-peak 60 by_exit sh -c "'$bundle/bin/cuda_gemm_peak' > '$work/gemm-peak.json'"
[ -s "$work/gemm-peak.json" ] && grep -q '^{' "$work/gemm-peak.json" && cp "$work/gemm-peak.json" "$out/gemm-peak.json"

# 2. Correctness first: the gpu tests and the gates.
step cuda_backend_test 90 by_exit "$bundle/bin/cuda_backend_test"
step gate-cuda 90 by_gate "$ced" gate --golden "$root/golden" --backend cuda
step gate-cuda-bf16 90 by_gate "$ced" gate --golden "$root/golden" --backend cuda-bf16
step gpu_side_by_side_test 150 by_exit "$bundle/bin/gpu_side_by_side_test"

# 3. The sanitizers, one process through every mode per tool.
sanitizer=$(find_tool compute-sanitizer)
for tool in memcheck racecheck synccheck initcheck; do
  if [ -z "$sanitizer" ]; then
    printf 'sanitizer-%s\trefused\t-\t0\tcompute-sanitizer not found\n' "$tool" >>"$steps"
    continue
  fi
  step "sanitizer-$tool" 75 by_sanitizer "$sanitizer" --tool "$tool" --error-exitcode 9 --print-limit 20 \
    "$bundle/bin/cuda_mode_tour"
done
summarize

# 4. Throughput, with the ced/full time ratio beside the FLOP model's.
for n in 1024 8192; do
  step "bench-$n" 120 by_gate "$ced" bench --config bench --tokens "$n" --decode 16 --backend cuda \
    --backend cuda-bf16 --json "$out/bench-$n.json"
done

# 5. The slowest kernel of a bench prefill, then its profile.
ncu=$(find_tool ncu)
if [ -n "$ncu" ] && [ "$gpu" = yes ]; then
  prefill=("$ced" run --config bench --tokens 1024 --mode full --logits last --backend cuda --out "$work/p.h5")
  step ncu-timing 120 by_exit "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
    --log-file "$out/ncu-kernels.csv" "${prefill[@]}"
  slowest=$(python3 "$root/tools/device-summary.py" --slowest "$out/ncu-kernels.csv" 2>>"$log")
  if [ -n "$slowest" ]; then
    echo "slowest kernel (total time): $slowest" >>"$log"
    step ncu-profile 120 by_exit "$ncu" --clock-control none --kernel-name "$slowest" --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      --log-file "$out/ncu-profile.txt" "${prefill[@]}"
  fi
else
  printf 'ncu\t%s\t-\t0\t%s\n' "$([ "$gpu" = yes ] && echo refused || echo skipped)" \
    "$([ -n "$ncu" ] && echo 'no CUDA device' || echo 'ncu not found')" >>"$steps"
fi

# 6. The PyTorch example engine, where the repository has one.
if [ -d "$root/examples/torch_engine" ]; then
  step torch-engine 120 by_python env PYTHONPATH="$bundle/python:${PYTHONPATH:-}" CED_TORCH_DEVICE=cuda \
    python3 -m pytest -q "$root/examples/torch_engine"
else
  printf 'torch-engine\tskipped\t-\t0\tno examples/torch_engine in this repository\n' >>"$steps"
fi
summarize

echo "device-check: done in $((SECONDS - start)) s; summary in $out/summary.json" | tee -a "$log"
if grep -qP '\t(fail|timeout)\t' "$steps"; then exit 1; fi
[ "$gpu" = yes ] || exit 77
exit 0
