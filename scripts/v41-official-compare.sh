#!/usr/bin/env bash
# docs/v41.md §9.4: run the official V4.1 code on a `ced export` checkpoint and judge our prefill against
# it layer by layer (teacher forced) and end to end, printing every tensor's row of the gate (docs/v41.md §12.4).
# Needs torch: runs where the official folder and a venv are.
#   scripts/v41-official-compare.sh OFFICIAL_DIR VENV_PYTHON [--config v41-tiny|v41-wide] [--mode bf16|fp8]
#       [--n 17] [--weight-seed 0] [--build build] [--accumulation fp32|tensor-core:BITS:INTERVAL] [--function-ulps K]
# Unlike the golden files it keeps sparse_attn's query and output. Exit 0 within every budget, 1 not.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,7p' "$0" >&2
  exit 2
fi
official=$1 py=$2
shift 2
config=v41-tiny mode=bf16 n=17 seed=0 build=build
bound_model=()  # the derived bounds' model (docs/sound-bounds.md §7), for a port that sums another way
while [[ $# -gt 0 ]]; do
  case $1 in
    --config) config=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --weight-seed) seed=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --accumulation|--function-ulps) bound_model+=("$1" "$2"); shift 2 ;;
    *) echo "v41-official-compare: unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ced-v41-official.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$here/$build/tools/ced" export --config "$config" --weight-seed "$seed" --out "$work/ckpt" > /dev/null
"$py" "$here/scripts/v41_official_capture.py" --official "$official" --checkpoint "$work/ckpt" \
  --config-name "$config" --weight-seed "$seed" --mode "$mode" --n "$n" --threads 1 --out "$work/official.h5" > /dev/null
"$here/$build/checks/v41/v41_agreement_summary" -v "${bound_model[@]}" "$work/official.h5"
