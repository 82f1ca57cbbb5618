#!/usr/bin/env bash
# scripts/bench-numpy.py validates before it times: on tiny its numpy model
# agrees with reference-f64 and the ratio table is printed; with a planted
# modelling fault (the attention sink dropped from numpy's softmax) it exits 1
# and prints no timing. Skipped (77) without Debian's numpy and h5py.
# Usage: bench_numpy_test.sh CED SCRIPT
set -uo pipefail
ced=$1 script=$2
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if ! "$py" -c 'import numpy, h5py' 2>/dev/null; then
  echo "SKIP: $py has no numpy or h5py (Debian: python3-numpy python3-h5py)"
  exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
args=(--ced "$ced" --config tiny --tokens 24 --core 0)

out=$("$py" "$script" "${args[@]}" 2>&1) || fail "clean run exited $?: $out"
for want in "numpy-f64: last-position logits vs reference-f64" "reference-f64 / numpy-f64" "reference / numpy-f32"; do
  grep -qF "$want" <<<"$out" || fail "clean run lacks '$want': $out"
done

out=$("$py" "$script" "${args[@]}" --plant sink-dropped 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "planted run exited $rc, not 1: $out"
grep -qF "numpy-f64 disagrees with reference-f64; no timings" <<<"$out" || fail "planted run not reported: $out"
if grep -qF "reference-f64 / numpy-f64" <<<"$out"; then fail "planted run printed timings: $out"; fi
echo "PASS: validated before timing; the planted fault exits 1 with no timings"
