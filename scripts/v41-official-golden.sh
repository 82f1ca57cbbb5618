#!/usr/bin/env bash
# Regenerates the v41 golden files (golden/v41/, docs/v41.md §12.2): DeepSeek's official inference code
# run on checkpoints `ced export` writes, every layer captured, as v41 run files. Needs torch with FP8
# dtypes, so not part of CI; CI reads the committed files (unit-tests/v41_golden_test.cpp).
#   scripts/v41-official-golden.sh OFFICIAL_DIR VENV_PYTHON [OUT_DIR]
# OFFICIAL_DIR holds run_official.py with the release's inference/ folder and a CPU kernel port
# (docs/v41.md §9.4); CED names the `ced` binary (default BUILD/tools/ced, BUILD default build/); `ced golden
# regenerate --dir golden/v41 --official O --python PY` runs this script. OUT_DIR defaults to golden/v41.
# The prompt is run_official.py's --input-seed 0 draw; torch runs on one thread (its results depend on
# the thread count). Exit 0 when every file is written, else the failing step's status.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
official=$(cd "$1" && pwd)
py=$2
out=${3:-$root/golden/v41}
ced=${CED:-${BUILD:-$root/build}/tools/ced}
[ -x "$ced" ] || { echo "$0: no $ced (cmake --build build --target ced)" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/v41-golden.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
# golden/v41-long: the lengths where ports broke (docs/v41.md §12.2), past the window, the candidate pool and
# the top-k, in the release regime, with every capture (a file without sparse_attn's query and output is judged
# there by budgets, not bounds); apart from golden/v41 because the default tier reads every file of that.
if [ "$(basename "$out")" = v41-long ]; then
  "$ced" export --config v41-tiny --weight-seed 0 --out "$tmp/v41-tiny" --shard-bytes 2000000 > /dev/null
  "$ced" export --config v41-wide --weight-seed 0 --out "$tmp/v41-wide" --shard-bytes 2000000 > /dev/null
  # v41-tiny (W = 16, index_topk 8, a candidate pool of 12 groups, original_seq_len 32, exact spans 31, 46, 91):
  # each constant + 1; v41-wide (W = 128, index_topk 64): W + 1 and 2W + 1.
  for spec in "v41-tiny:9 13 33 47 92" "v41-wide:129 257"; do
    config=${spec%%:*}
    for n in ${spec#*:}; do
      "$py" "$root/scripts/v41_official_capture.py" --official "$official" --checkpoint "$tmp/$config" \
        --config-name "$config" --weight-seed 0 --mode fp8 --n "$n" --threads 1 --input-seed 0 \
        --out "$out/${config#v41-}-fp8-n$n.h5"
    done
  done
  # The bf16 regime at the same boundaries of v41-tiny (its files weigh little; wide's past W follows below).
  for n in 9 13 47 92; do
    "$py" "$root/scripts/v41_official_capture.py" --official "$official" --checkpoint "$tmp/v41-tiny" \
      --config-name v41-tiny --weight-seed 0 --mode bf16 --n "$n" --threads 1 --input-seed 0 \
      --out "$out/tiny-bf16-n$n.h5"
  done
  # v41-wide's decode across its window: a prefill of 127, then 3 steps (positions 127 .. 129: the 128-slot
  # ring wraps at 128, and a ratio-2 group completes at 127 and 129).
  "$py" "$root/scripts/v41_official_capture.py" --official "$official" --checkpoint "$tmp/v41-wide" \
    --config-name v41-wide --weight-seed 0 --mode fp8 --n 127 --decode-steps 3 --threads 1 --input-seed 0 \
    --out "$out/wide-fp8-n127-d3.h5"
  # v41-tiny's decode after a prompt of W + 1 = 17, in both regimes: the ring the prefill hands over has wrapped.
  for mode in fp8 bf16; do
    "$py" "$root/scripts/v41_official_capture.py" --official "$official" --checkpoint "$tmp/v41-tiny" \
      --config-name v41-tiny --weight-seed 0 --mode "$mode" --n 17 --decode-steps 4 --threads 1 --input-seed 0 \
      --out "$out/tiny-$mode-n17-d4.h5"
  done
  # The bf16 regime past the window and the candidate pool (2W + 1 = 33).
  "$py" "$root/scripts/v41_official_capture.py" --official "$official" --checkpoint "$tmp/v41-tiny" \
    --config-name v41-tiny --weight-seed 0 --mode bf16 --n 33 --threads 1 --input-seed 0 \
    --out "$out/tiny-bf16-n33.h5"
  # ... and past v41-wide's window (W + 1 = 129), lean: sparse_attn's query and output, 60 % of the file at
  # head_dim 512, left out (the gate judges those two ops by budgets there).
  "$py" "$root/scripts/v41_official_capture.py" --official "$official" --checkpoint "$tmp/v41-wide" \
    --config-name v41-wide --weight-seed 0 --mode bf16 --n 129 --threads 1 --input-seed 0 --lean \
    --out "$out/wide-bf16-n129.h5"
  # Prompts that make ties likely (docs/v41.md §13.12, `ced spans --stress`): one token repeated in both regimes
  # past 2W, two tokens alternating past the exact span 46, a period of the compress ratio past the span 91.
  "$ced" spans --config v41-tiny --stress 92 --stress-out "$tmp/stress" > /dev/null
  for spec in one-token:33:fp8 one-token:33:bf16 two-alternating:47:fp8 period-ratio:92:fp8; do
    IFS=: read -r name n mode <<< "$spec"
    "$py" "$root/scripts/v41_official_capture.py" --official "$official" --checkpoint "$tmp/v41-tiny" \
      --config-name v41-tiny --weight-seed 0 --mode "$mode" --n "$n" --threads 1 --tokens "$tmp/stress/$name.txt" \
      --out "$out/tiny-$mode-n$n-$name.h5"
  done
  exit 0
fi
# config : the prompt lengths (N = 1; odd; below and above the window W = 16 of tiny; below the W = 128
# of wide, whose files above it would weigh 8 MB each)
for spec in "v41-tiny:1 5 17 40" "v41-wide:1 33"; do
  config=${spec%%:*}
  "$ced" export --config "$config" --weight-seed 0 --out "$tmp/$config" --shard-bytes 2000000 > /dev/null
  for n in ${spec#*:}; do
    for mode in bf16 fp8; do
      file=$out/${config#v41-}-$mode-n$n.h5
      "$py" "$root/scripts/v41_official_capture.py" --official "$official" --checkpoint "$tmp/$config" \
        --config-name "$config" --weight-seed 0 --mode "$mode" --n "$n" --threads 1 --input-seed 0 --out "$file"
    done
  done
done
# Decode steps after a prefill (docs/v41.md §12.3): tiny's 13 tokens (odd: a ratio-2 group open across the
# hand-off), then 8 steps (positions 13 .. 20: the ring of 16 wraps, and from position 18 more groups exist
# than index_topk picks, so the index keys a step reads decide its selection).
for mode in bf16 fp8; do
  "$py" "$root/scripts/v41_official_capture.py" --official "$official" --checkpoint "$tmp/v41-tiny" \
    --config-name v41-tiny --weight-seed 0 --mode "$mode" --n 13 --decode-steps 8 --threads 1 --input-seed 0 \
    --out "$out/tiny-$mode-n13-d8.h5"
done
# The negative control of the SwiGLU clamp needs pre-activations above swiglu_limit, which the random
# weights never reach: layer 0's shared expert made hot (docs/v41.md §12.4).
boost=(--boost layers.0.ffn.shared_experts.w1.weight=3 --boost layers.0.ffn.shared_experts.w3.weight=5)
"$ced" export --config v41-tiny --weight-seed 0 --out "$tmp/v41-tiny-hot" --shard-bytes 2000000 "${boost[@]}" > /dev/null
"$py" "$root/scripts/v41_official_capture.py" --official "$official" --checkpoint "$tmp/v41-tiny-hot" \
  --config-name v41-tiny --weight-seed 0 "${boost[@]}" --mode fp8 --n 17 --threads 1 --input-seed 0 \
  --out "$out/tiny-fp8-n17-hot.h5"
