#!/usr/bin/env bash
# Cross-checks the v41 checkpoint writer and reader (docs/v41.md §8.6) with DeepSeek's official
# inference code, run by the oracle driver run_official.py of a copy of the v41-official folder:
#   (a) a folder our writer makes (v41-tiny, seed 0) loads unchanged in
#       `run_official.py --checkpoint DIR --n 17`: the official model.py loads it and runs a prefill
#       with finite logits and no warnings;
#   (b) a folder `run_official.py --export DIR` makes is read by our reader, with the config of
#       v41-tiny and 501 tensors.
# Not part of CI (it needs torch with FP8 dtypes). Usage:
#   PYTHON=/path/to/venv/bin/python scripts/v41-official-checkpoint-check.sh OFFICIAL_DIR
# OFFICIAL_DIR holds run_official.py; BUILD (default build/) holds the built v41_export_probe
# (ninja -C build v41_export_probe). Exit 0 when both pass, 1 when one fails, 2 on bad usage.
# With ULP=1 it also measures how one bf16-ulp change of one weight grows through the layers
# (compare_npz.py of the folder and a copy with layers.0.attn_norm.weight[0] one ulp up, N = 64).
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: PYTHON=... $0 OFFICIAL_DIR" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
official=$(cd "$1" && pwd) || exit 2
py=${PYTHON:-python3}
probe=${BUILD:-$root/build}/models/v41/v41_export_probe
[ -f "$official/run_official.py" ] || { echo "$0: no run_official.py in $official" >&2; exit 2; }
[ -x "$probe" ] || { echo "$0: no $probe (ninja -C build v41_export_probe)" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/v41-official-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "v41-official-checkpoint-check: FAIL: $*"; fail=1; }
run_official() { (cd "$official" && "$py" run_official.py "$@"); }

echo "== (a) our folder in the official code"
"$probe" write "$tmp/ours" --config v41-tiny --seed 0 --shard-bytes 2000000 || bad "(a) the probe did not write"
line=$(run_official --checkpoint "$tmp/ours" --n 17 --out "$tmp/ours-n17.npz") || bad "(a) run_official.py refused the folder"
echo "$line"
grep -q '"logits_finite": true' <<<"$line" || bad "(a) the logits are not finite"
grep -q '"warnings": \[\]' <<<"$line" || bad "(a) run_official.py warned about the folder"

echo "== (b) the official folder in our reader"
line=$(run_official --export "$tmp/official") || bad "(b) run_official.py --export failed"
echo "$line" | cut -c1-400
line=$("$probe" read "$tmp/official" --expect v41-tiny) || bad "(b) our reader refused the official folder"
echo "$line"
grep -q '"config_vs_v41-tiny":\[\]' <<<"$line" || bad "(b) the official tiny config is not v41-tiny"
grep -q '"tensors":501,' <<<"$line" || bad "(b) not the 501 tensors of v41-tiny"

if [ "${ULP:-0}" = 1 ]; then
  echo "== one bf16 ulp of layers.0.attn_norm.weight[0], N = 64"
  "$probe" bump "$tmp/ours" "$tmp/bumped" layers.0.attn_norm.weight 0 || bad "the probe did not bump"
  run_official --checkpoint "$tmp/ours" --n 64 --out "$tmp/a.npz" >/dev/null || bad "run a"
  run_official --checkpoint "$tmp/bumped" --n 64 --out "$tmp/b.npz" >/dev/null || bad "run b"
  "$py" "$official/compare_npz.py" "$tmp/a.npz" "$tmp/b.npz" | grep -E "layer[0-9]+_in|final_|logits|EQUAL"
fi

[ $fail = 0 ] && echo "v41-official-checkpoint-check: PASSED" || echo "v41-official-checkpoint-check: FAILED"
exit $fail
