#!/usr/bin/env bash
# docs/v41.md §9.4: run the official V4.1 code on a preset and compare our prefill with it layer by
# layer (teacher forced) and end to end. Needs torch: runs where the official folder and a venv are.
#   scripts/v41-official-compare.sh OFFICIAL_DIR VENV_PYTHON [--preset tiny|wide] [--mode bf16] [--n 17]
#       [--regime bf16|f64|release] [--build build]   (the default regime: bf16, or release for --mode fp8)
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,5p' "$0" >&2
  exit 2
fi
official=$1 py=$2
shift 2
preset=tiny mode=bf16 n=17 regime="" build=build
while [[ $# -gt 0 ]]; do
  case $1 in
    --preset) preset=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --regime) regime=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "v41-official-compare: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ -z $regime ]]; then
  regime=$([[ $mode == fp8 ]] && echo release || echo bf16)  # the official fp8 run is our release regime
fi
here=$(cd "$(dirname "$0")/.." && pwd)
work=${TMPDIR:-/tmp}/ced-v41-official
mkdir -p "$work"
capture=$work/$preset-$mode-n$n.safetensors
"$py" "$here/scripts/v41_official_capture.py" --official "$official" --preset "$preset" --mode "$mode" --n "$n" \
  --threads 1 --out "$capture" > "$work/capture.json"
weights=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights"])' "$work/capture.json")
"$here/$build/models/v41/v41_official_compare" --config "v41-$preset" --weights "$weights" --capture "$capture" \
  --regime "$regime"
