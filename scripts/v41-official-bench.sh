#!/usr/bin/env bash
# docs/v41.md §12.6: the v41 reference against DeepSeek's official code on a CPU, the same checkpoint
# (`ced export --config v41-wide`), the same prompt length, the same thread count, the official's fp8
# run against our release regime, taken in turn RUNS times (default 5): prints each run's forward time
# and whole-process wall time and their medians, and the ratios official / ours.
#   scripts/v41-official-bench.sh OFFICIAL_DIR VENV_PYTHON [--n 1024] [--threads 1] [--runs 5] [--config v41-wide]
# Needs torch (not CI). BUILD (default build/) holds the built `ced`.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,7p' "$0" >&2; exit 2; }
official=$(cd "$1" && pwd) py=$2
shift 2
n=1024 threads=1 runs=5 config=v41-wide
while [[ $# -gt 0 ]]; do
  case $1 in
    --n) n=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    *) echo "v41-official-bench: unknown option $1" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
ced=${BUILD:-$root/build}/tools/ced
tmp=$(mktemp -d "${TMPDIR:-/tmp}/v41-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$ced" export --config "$config" --weight-seed 0 --out "$tmp/ckpt" > /dev/null
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $config, N = $n, $threads thread(s)"
now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
: > "$tmp/ours" ; : > "$tmp/theirs"
for i in $(seq "$runs"); do
  t0=$(now)
  out=$(OMP_NUM_THREADS=$threads "$ced" run --checkpoint "$tmp/ckpt" --tokens "$n" --regime release)
  t1=$(now)
  fwd=$(grep -o 'forward [0-9.]* s' <<<"$out" | awk '{print $2}')
  echo "$fwd $(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" >> "$tmp/ours"
  t0=$(now)
  line=$(cd "$official" && "$py" run_official.py --checkpoint "$tmp/ckpt" --n "$n" --mode fp8 --threads "$threads" \
    --no-hidden --out "$tmp/o.npz")
  t1=$(now)
  ofwd=$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["forward_s"])' "$line")
  echo "$ofwd $(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" >> "$tmp/theirs"
  echo "run $i: ours forward $fwd s, official forward $ofwd s"
done
of=$(cut -d' ' -f1 "$tmp/ours" | median) ow=$(cut -d' ' -f2 "$tmp/ours" | median)
tf=$(cut -d' ' -f1 "$tmp/theirs" | median) tw=$(cut -d' ' -f2 "$tmp/theirs" | median)
echo "median forward: ours $of s, official $tf s: official / ours = $(awk -v a="$tf" -v b="$of" 'BEGIN {printf "%.2f", a / b}')"
echo "median whole process: ours $ow s, official $tw s: official / ours = $(awk -v a="$tw" -v b="$ow" 'BEGIN {printf "%.2f", a / b}')"
