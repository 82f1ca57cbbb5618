#!/usr/bin/env bash
# Cross-checks the v41 checkpoint writer and reader (docs/v41.md §11.6) with DeepSeek's official
# inference code, run by the oracle driver run_official.py of a copy of the v41-official folder:
#   (a) a folder `ced export` writes (v41-tiny and v41-wide, seed 0) loads unchanged in
#       `run_official.py --checkpoint DIR --n 17`: the official model.py loads it and runs a prefill
#       with finite logits and no warnings;
#   (b) a folder `run_official.py --preset P --export DIR` makes (P = tiny, wide) runs in
#       `ced run --checkpoint DIR` with finite logits, and our reader finds the config of the built-in
#       meant to equal P and the export's count of tensors;
#   and both directions again for tiny with two DSpark stages (mtp.*; written by the test-only probe,
#   `ced export` writes the built-ins as they are).
# Not part of CI (it needs torch with FP8 dtypes). Usage:
#   PYTHON=/path/to/venv/bin/python scripts/v41-official-checkpoint-check.sh OFFICIAL_DIR
# OFFICIAL_DIR holds run_official.py; BUILD (default build/) holds the built `ced` and the test-only
# v41_export_probe (cmake --build build --target ced v41_export_probe). Exit 0 when both pass, 1 when one fails, 2 on bad usage.
# With ULP=1 it also measures how one bf16-ulp change of one weight grows through the layers
# (compare_npz.py of the folder and a copy with layers.0.attn_norm.weight[0] one ulp up, N = 64).
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: PYTHON=... $0 OFFICIAL_DIR" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
official=$(cd "$1" && pwd) || exit 2
py=${PYTHON:-python3}
probe=${BUILD:-$root/build}/models/v41/v41_export_probe
ced=${BUILD:-$root/build}/tools/ced
[ -f "$official/run_official.py" ] || { echo "$0: no run_official.py in $official" >&2; exit 2; }
for b in "$probe" "$ced"; do
  [ -x "$b" ] || { echo "$0: no $b (cmake --build build --target ced v41_export_probe)" >&2; exit 2; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/v41-official-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "v41-official-checkpoint-check: FAIL: $*"; fail=1; }
run_official() { (cd "$official" && "$py" run_official.py "$@"); }

# Each official preset and the built-in meant to equal it.
for pair in "tiny v41-tiny" "wide v41-wide"; do
  set -- $pair
  preset=$1 builtin=$2
  echo "== (a) our $builtin folder in the official code"
  "$ced" export --config "$builtin" --weight-seed 0 --shard-bytes 2000000 --out "$tmp/ours-$builtin" || bad "(a) $builtin: ced export failed"
  line=$(run_official --checkpoint "$tmp/ours-$builtin" --n 17 --out "$tmp/ours-$builtin-n17.npz") || bad "(a) $builtin: run_official.py refused the folder"
  echo "$line"
  grep -q '"logits_finite": true' <<<"$line" || bad "(a) $builtin: the logits are not finite"
  grep -q '"warnings": \[\]' <<<"$line" || bad "(a) $builtin: run_official.py warned about the folder"

  echo "== (b) the official $preset folder in our reader"
  exported=$(run_official --preset "$preset" --export "$tmp/official-$preset") || bad "(b) $preset: run_official.py --export failed"
  echo "$exported" | cut -c1-400
  run=$("$ced" run --checkpoint "$tmp/official-$preset" --tokens 17) || bad "(b) $preset: ced run refused the official folder"
  echo "$run"
  grep -q "all finite: yes" <<<"$run" || bad "(b) $preset: ced run's logits are not finite"
  line=$("$probe" read "$tmp/official-$preset" --expect "$builtin") || bad "(b) $preset: our reader refused the official folder"
  echo "$line"
  grep -q "\"config_vs_$builtin\":\[\]" <<<"$line" || bad "(b) the official $preset config is not $builtin"
  n=$(grep -o '"tensors": [0-9]*' <<<"$exported" | grep -o '[0-9]*$')
  grep -q "\"tensors\":$n," <<<"$line" || bad "(b) $preset: our reader found another count of tensors than the export's $n"
done
# Two DSpark stages (block size 4, target layers 3, 4, 5) on tiny: the mtp.* tensors, both directions.
echo "== (a) our v41-tiny folder with two DSpark stages in the official code"
"$probe" write "$tmp/ours-dspark" --config v41-tiny --seed 0 --dspark-stages 2 --shard-bytes 2000000 || bad "(a) DSpark: the probe did not write"
line=$(run_official --checkpoint "$tmp/ours-dspark" --n 17 --out "$tmp/ours-dspark-n17.npz") || bad "(a) DSpark: run_official.py refused the folder"
echo "$line"
grep -q '"warnings": \[\]' <<<"$line" || bad "(a) DSpark: run_official.py warned about the folder"
echo "== (b) the official tiny folder with two DSpark stages in our reader"
exported=$(run_official --export "$tmp/official-dspark" --set n_mtp_layers=2 --set dspark_block_size=4 \
  --set 'dspark_target_layer_ids=[3,4,5]' --set 'compress_ratios=[0,2,2,1,1,1,0,0]') || bad "(b) DSpark: --export failed"
echo "$exported" | cut -c1-400
"$ced" run --checkpoint "$tmp/official-dspark" --tokens 17 | grep "all finite: yes" || bad "(b) DSpark: ced run refused the official folder"
line=$("$probe" read "$tmp/official-dspark") || bad "(b) DSpark: our reader refused the official folder"
echo "$line"
n=$(grep -o '"tensors": [0-9]*' <<<"$exported" | grep -o '[0-9]*$')
grep -q "\"tensors\":$n," <<<"$line" || bad "(b) DSpark: our reader found another count of tensors than the export's $n"

if [ "${ULP:-0}" = 1 ]; then
  echo "== one bf16 ulp of layers.0.attn_norm.weight[0], N = 64"
  "$probe" bump "$tmp/ours-v41-tiny" "$tmp/bumped" layers.0.attn_norm.weight 0 || bad "the probe did not bump"
  run_official --checkpoint "$tmp/ours-v41-tiny" --n 64 --out "$tmp/a.npz" >/dev/null || bad "run a"
  run_official --checkpoint "$tmp/bumped" --n 64 --out "$tmp/b.npz" >/dev/null || bad "run b"
  "$py" "$official/compare_npz.py" "$tmp/a.npz" "$tmp/b.npz" | grep -E "layer[0-9]+_in|final_|logits|EQUAL"
fi

[ $fail = 0 ] && echo "v41-official-checkpoint-check: PASSED" || echo "v41-official-checkpoint-check: FAILED"
exit $fail
