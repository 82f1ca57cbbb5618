#!/usr/bin/env bash
# docs/results/v41-bounds-power.md holds what v41_bounds_power prints now: its table, compared line by line.
#   scripts/check-bounds-power.sh BUILD/checks/v41/v41_bounds_power
set -euo pipefail
[[ $# -eq 1 && -x "$1" ]] || { echo "usage: scripts/check-bounds-power.sh PATH/TO/v41_bounds_power" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
table() { sed -n '/^| golden file/,/^$/p' | sed '/^$/d'; }
if ! diff <("$1" golden/v41/wide-fp8-n33.h5 golden/v41/wide-bf16-n33.h5 golden/v41/tiny-fp8-n17.h5 \
              golden/v41/tiny-bf16-n40.h5 golden/v41/tiny-fp8-n13-d8.h5 | table) <(table < docs/results/v41-bounds-power.md); then
  echo "docs/results/v41-bounds-power.md is not what v41_bounds_power prints: regenerate it (its header says how)" >&2
  exit 1
fi
