#!/usr/bin/env bash
# Tests device-bundle/ (scripts/make-device-bundle.sh) on this machine, as far
# as a machine without a GPU allows:
#   - its size is under 60 MiB;
#   - every shared library each binary loads resolves inside the bundle, to the
#     C library family, or to CUDA's own (driver, cuBLAS), which a GPU machine
#     provides: nothing of our Debian build dependencies is needed there;
#   - every binary starts with only the bundle on the library path and, without
#     a GPU, reports it cleanly (exit 77 "SKIP: no CUDA device" for the test
#     programs, exit 2 with one line for `ced gate --backend cuda`);
#   - tools/device-check.sh's dry run ends with exit 77 and a summary.json
#     whose every step is skipped or refused, none passed.
# On a machine with a GPU the "no device" expectations do not apply: the
# script says so and checks only the first two points.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${CED_BUNDLE:-$root/device-bundle}
fail=0
bad() { echo "check-device-bundle: FAIL: $*"; fail=1; }
[ -x "$bundle/bin/ced" ] || { echo "check-device-bundle: no bundle at $bundle (run scripts/make-device-bundle.sh)" >&2; exit 2; }

size=$(du -sm "$bundle" | cut -f1)
echo "bundle: ${size} MiB, $(ls "$bundle/bin" | wc -l) binaries, $(ls "$bundle/lib" | wc -l) libraries"
[ "$size" -le 60 ] || bad "bundle is ${size} MiB (limit 60)"

export LD_LIBRARY_PATH=$bundle/lib:/usr/local/cuda/lib64
for exe in "$bundle"/bin/*; do
  while read -r lib path; do
    case "$lib" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|linux-vdso*|libcuda.so*|libcublas*|libcublasLt*) ;;
      *) case "$path" in "$bundle"/lib/*) ;; *) bad "$(basename "$exe") loads $lib from $path, outside the bundle" ;; esac ;;
    esac
  done < <(ldd "$exe" | awk '/=>/ {print $1, $3}')
  ldd "$exe" | grep -q 'not found' && bad "$(basename "$exe"): $(ldd "$exe" | grep 'not found' | head -1)"
done

if command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1; then
  echo "check-device-bundle: a GPU is present; the no-device checks do not apply"
  exit $fail
fi

expect() {  # expect RC PATTERN COMMAND...: exit code and a line of output
  local want=$1 pattern=$2
  shift 2
  local got text
  text=$(timeout 60 "$@" 2>&1)
  got=$?
  if [ "$got" -ne "$want" ] || ! grep -qE "$pattern" <<<"$text"; then
    bad "$(basename "$1") ${*:2}: exit $got (want $want), output: $(head -c 300 <<<"$text")"
  else
    echo "ok   $(basename "$1") ${*:2}: exit $got, $(grep -m1 -E "$pattern" <<<"$text")"
  fi
}
expect 0 'ced' "$bundle/bin/ced" --help
for t in cuda_backend_test gpu_side_by_side_test cuda_gemm_peak cuda_mode_tour; do
  expect 77 '^SKIP: no CUDA device' "$bundle/bin/$t"
done
expect 2 'no CUDA device' "$bundle/bin/ced" gate --golden "$root/golden" --backend cuda
lines=$("$bundle/bin/ced" gate --golden "$root/golden" --backend cuda 2>&1 >/dev/null | wc -l)
[ "$lines" -eq 1 ] || bad "ced gate --backend cuda without a device printed $lines lines on stderr (want 1)"

out=$(mktemp -d)
OUT=$out CED_BUNDLE=$bundle "$root/tools/device-check.sh" >"$out/stdout" 2>&1
rc=$?
[ "$rc" -eq 77 ] || bad "device-check.sh dry run exited $rc (want 77); $(tail -3 "$out/stdout")"
if python3 - "$out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
verdicts = {st["step"]: st["verdict"] for st in s["steps"]}
print("dry run:", ", ".join(f"{k} {v}" for k, v in verdicts.items()))
assert s["overall"] == "skipped", s["overall"]
assert verdicts and all(v in ("skipped", "refused") for v in verdicts.values()), verdicts
PY
then echo "ok   device-check.sh dry run: exit 77, every step skipped or refused"
else bad "device-check.sh dry run summary: $(cat "$out/summary.json" 2>/dev/null | head -c 400)"; fi
rm -rf "$out"
[ $fail -eq 0 ] && echo "check-device-bundle: pass" || echo "check-device-bundle: FAIL"
exit $fail
