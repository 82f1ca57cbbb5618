#!/usr/bin/env bash
# docs/sound-bounds.md §8: DeepSeek's own inference code, a correct implementation by definition, on
# weight and input seeds no golden file used, at lengths around the config's constants, judged by our
# gate; one line per case and per judged kind in TABLE.tsv. The kinds judged by derived bounds must
# never fail (the target is 0 outside); the kinds still judged by measured budgets are reported beside.
# Needs torch with FP8 dtypes (docs/v41.md §9.4): it runs where the official folder and a venv are.
#   scripts/v41-soundness-sweep.sh OFFICIAL_DIR VENV_PYTHON TABLE.tsv [--build build] [--cases FILE]
# FILE: lines "CONFIG MODE N WEIGHT_SEED INPUT_SEED" (default: the 40 cases below). Resumes: a case
# already in TABLE.tsv is skipped. Exit 0 when no bounded kind failed, 1 when one did, 2 on bad input.
set -euo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
official=$1 py=$2 table=$3
shift 3
build=build cases=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    *) echo "v41-soundness-sweep: unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
[[ -x "$here/$build/tools/ced" && -x "$here/$build/checks/v41/v41_agreement_summary" ]] ||
  { echo "v41-soundness-sweep: build ced and v41_agreement_summary in $build first" >&2; exit 2; }
[[ -f "$official/run_official.py" ]] || { echo "v41-soundness-sweep: no run_official.py in $official" >&2; exit 2; }
default_cases() {
  # Seeds from 7001 up: no golden file, test or study used them. v41-tiny: W = 16, index_topk x ratio = 16;
  # v41-wide: W = 128, index_topk x ratio = 128, the candidate pool 16 blocks of 8 = 128.
  local s=7001
  for n in 15 16 17 31 32 33 48 65 129 257; do
    for mode in bf16 fp8; do echo "v41-tiny $mode $n $s $((s + 500))"; s=$((s + 1)); done
  done
  for n in 1 33 127 128 129 200 255 256 257 300; do
    for mode in bf16 fp8; do echo "v41-wide $mode $n $s $((s + 500))"; s=$((s + 1)); done
  done
}
work=$(mktemp -d "${TMPDIR:-/tmp}/ced-v41-sweep.XXXXXX")
trap 'rm -rf "$work"' EXIT
[[ -f "$table" ]] || printf 'config\tmode\tN\tweight_seed\tinput_seed\tpass\tlayer\tkind\tjudged_by\tverdict\tdetail\n' > "$table"
bad=0
while read -r config mode n wseed iseed; do
  [[ -z "$config" || "$config" == \#* ]] && continue
  key=$(printf '%s\t%s\t%s\t%s\t%s\t' "$config" "$mode" "$n" "$wseed" "$iseed")
  grep -qF "$key" "$table" && continue
  "$here/$build/tools/ced" export --config "$config" --weight-seed "$wseed" --out "$work/ckpt" > /dev/null
  "$py" "$here/scripts/v41_official_capture.py" --official "$official" --checkpoint "$work/ckpt" \
    --config-name "$config" --weight-seed "$wseed" --mode "$mode" --n "$n" --input-seed "$iseed" --threads 1 \
    --out "$work/official.h5" > /dev/null
  rc=0
  "$here/$build/checks/v41/v41_agreement_summary" --tsv --every-row "$work/official.h5" > "$work/rows.tsv" || rc=$?
  [[ $rc -le 1 ]] || { echo "v41-soundness-sweep: the summary failed on $key (exit $rc)" >&2; exit 2; }
  while IFS= read -r row; do printf '%s%s\n' "$key" "$row"; done < "$work/rows.tsv" >> "$table"
  if awk -F'\t' '$4 == "bounds" && $5 == "FAIL"' "$work/rows.tsv" | grep -q .; then bad=1; fi
  rm -rf "$work/ckpt" "$work/official.h5"
  echo "$config $mode N=$n seeds $wseed/$iseed: $(awk -F'\t' '$5 == "FAIL"' "$work/rows.tsv" | wc -l) failing rows"
done < <(if [[ -n "$cases" ]]; then cat "$cases"; else default_cases; fi)
exit $bad
