#!/usr/bin/env bash
# Replays one input of fuzz/hdf5-crashes/ (input_fuzz format: the first byte
# picks the reader, the rest is the file) through the three commands that read
# a user's HDF5 file: `ced diff F F`, `ced gate --golden DIR` (DIR holding F
# and a policy) and `ced run ... --mode resume --cache-in F`. Each must refuse
# the file with exit 2 and exactly one line on stderr: no signal (a shell exit
# status above 128), no internal error (3), no hang (CED_READ_TIMEOUT_S bounds
# each read, CTest's TIMEOUT the whole). Prints one line per command.
#
#   fuzz/replay-hdf5-crash.sh CED INPUT POLICY
set -uo pipefail
[[ $# -eq 3 && -x $1 && -f $2 && -f $3 ]] || { echo "usage: $0 CED INPUT POLICY" >&2; exit 2; }
ced=$1 input=$2 policy=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/golden"
file=$work/golden/input.h5
tail -c +2 "$input" >"$file"
cp "$policy" "$work/golden/policy.toml"

failed=0
check() {
  local label=$1
  shift
  local t0=$SECONDS
  "$@" >"$work/stdout" 2>"$work/stderr"
  local rc=$?
  local secs=$((SECONDS - t0)) lines
  lines=$(wc -l <"$work/stderr")
  if ((rc == 2 && lines == 1)); then
    echo "ok   $label: exit 2 in ${secs}s: $(cat "$work/stderr")"
  else
    local why="exit $rc"
    ((rc > 128)) && why="killed by signal $((rc - 128))"
    echo "FAIL $label: $why in ${secs}s, $lines lines on stderr (want exit 2, one line)"
    head -c 2000 "$work/stderr"
    failed=1
  fi
}

echo "$(basename "$input") ($(stat -c %s "$file") bytes)"
check "ced diff" "$ced" diff "$file" "$file"
check "ced gate" "$ced" gate --golden "$work/golden"
check "ced run --cache-in" "$ced" run --config tiny --tokens 8 --mode resume --prefix 4 --cache-in "$file" \
  --out "$work/out.h5"
exit $failed
