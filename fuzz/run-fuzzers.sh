#!/usr/bin/env bash
# Builds the libFuzzer targets with the `fuzz` preset (clang, build-fuzz/) and
# runs each for SECONDS, one after another, on a scratch copy of its seed
# corpus (new inputs never go into the committed fuzz/corpus/).
#
#   fuzz/run-fuzzers.sh SECONDS [TARGET...]     (default: all five targets)
#
# Prints each target's execs/s from libFuzzer's final stats (-print_final_stats=1:
# the executed units over the time fuzzed, summed over restarts).
# Crash, timeout and OOM inputs are kept in build-fuzz/fuzz-artifacts/<target>/,
# logs in build-fuzz/fuzz-logs/<target>.log. A crash inside the HDF5 C library
# (a corrupt file it does not survive; not ours to fix) is set aside in
# fuzz-artifacts/<target>/hdf5-library/, copied into the replay corpus
# fuzz/hdf5-crashes/ (when at most 64 KiB), listed, and fuzzing goes on. Exit 0
# when no fuzzer found anything in our code, 1 when one did, 2 on bad usage or
# a failed build. Without clang (or its libFuzzer runtime, Debian:
# libclang-rt-14-dev) it prints SKIP and exits 0.
#
# FUZZ_SEED fixes libFuzzer's seed (CI uses 1, so a run is repeatable).
# JOBS sets the build parallelism (default 2). KEEP_GOING=1: a finding in our
# code is set aside too (in fuzz-artifacts/<target>/ours/, tallied by kind and
# stack frame) and fuzzing goes on for the whole time; the exit is still 1.
set -uo pipefail

usage() { echo "usage: $0 SECONDS [replay_fuzz|input_fuzz|compare_fuzz|v41_replay_fuzz|v41_input_fuzz ...]" >&2; exit 2; }
[[ $# -ge 1 && $1 =~ ^[0-9]+$ && $1 -gt 0 ]] || usage
seconds=$1
shift
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(replay_fuzz input_fuzz compare_fuzz v41_replay_fuzz v41_input_fuzz)
for t in "${targets[@]}"; do
  case $t in replay_fuzz | input_fuzz | compare_fuzz | v41_replay_fuzz | v41_input_fuzz) ;; *) echo "unknown target '$t'" >&2; usage ;; esac
done

if ! command -v clang++ >/dev/null 2>&1; then
  echo "SKIP: clang not found"
  exit 0
fi
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe_dir/probe.cpp"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cpp" -o "$probe_dir/probe" >/dev/null 2>&1; then
  echo "SKIP: clang++ cannot link -fsanitize=fuzzer (libFuzzer runtime missing; Debian: apt-get install libclang-rt-14-dev)"
  exit 0
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 2
build=build-fuzz
cmake --preset fuzz >/dev/null || { echo "FAIL: cmake --preset fuzz" >&2; exit 2; }
cmake --build "$build" -j "${JOBS:-2}" --target "${targets[@]}" || { echo "FAIL: building the fuzz targets" >&2; exit 2; }

mkdir -p "$build/fuzz-logs"
# One thread per fuzzer (the reference's OpenMP); every sanitizer report is fatal.
export OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# Prints "hdf5 FRAME" when the first stack frame of the report in log $1 that
# is not the sanitizer, libFuzzer, libc or an allocator is in the HDF5 C
# library, else "ours FRAME". Frames of the fuzz binary without a source line
# are the sanitizer and libFuzzer runtimes (our code is built with -g).
classify() {
  awk '
    /^ *#[0-9]+ 0x[0-9a-f]+ / {
      if ($0 ~ /__interceptor_|__asan|__sanitizer|__ubsan|__lsan|fuzzer::|libc\.so|libpthread|libstdc\+\+|libgcc_s/) next
      if ($0 ~ / in (malloc|calloc|realloc|free|operator new|operator delete|raise|abort|gsignal|__GI_|__libc_|__pthread_kill)/) next
      if ($0 ~ /sysdeps\/|nptl\/|csu\/|stdlib\/|string\/\.\.\//) next
      if ($0 ~ /\(\/[^ ]*\/fuzz\/[a-z_]+\+0x[0-9a-f]+\)/) next
      sub(/^ *#[0-9]+ 0x[0-9a-f]+ (in )?/, "")
      sub(/ \(BuildId: [0-9a-f]+\)/, "")
      print (($0 ~ /libhdf5/) ? "hdf5 " : "ours ") $0
      found = 1
      exit
    }
    END { if (!found) print "ours (no stack)" }' "$1"
}

# Copies a set-aside HDF5-library crash input $1 (site $2) into the replay
# corpus fuzz/hdf5-crashes/ (CTest's fuzz.hdf5-crash.* run every input there
# through ced diff, ced gate and ced run --cache-in: exit 2, one line, no
# signal, no hang), named by its site and content hash, so the same input
# found twice is one file. Inputs over 64 KiB stay in the artifacts only (the
# corpus is committed). New files are listed: commit them.
new_crashes=()
keep_hdf5_crash() {
  local size slug sum dest
  size=$(stat -c %s "$1")
  ((size <= 65536)) || return 0
  # A leak on HDF5's error path is no crash or hang without LeakSanitizer
  # (the harness exits 2 on such a file in-process), and libFuzzer pins it on
  # whichever input ran last (even an empty one): not worth a corpus entry.
  [[ $2 == *"detected memory leaks"* ]] && return 0
  slug=$(printf '%s' "$2" | sed -E 's/^[A-Za-z]*Sanitizer: //; s/^libFuzzer: //; s/ in /-/; s/[^A-Za-z0-9_]+/-/g; s/^-+|-+$//g')
  sum=$(sha1sum "$1" | cut -c1-12)
  dest="fuzz/hdf5-crashes/${slug:-crash}-$sum"
  [[ -e $dest ]] && return 0
  cp "$1" "$dest" && new_crashes+=("$dest")
}

failed=()
summary=()
for t in "${targets[@]}"; do
  scratch=$(mktemp -d)
  cp -r "fuzz/corpus/$t/." "$scratch/"
  # input_fuzz's temporary HDF5 file (fs::temp_directory_path, i.e. $TMPDIR):
  # a crash inside HDF5 leaves it behind, so each target gets its own.
  tmp=$(mktemp -d)
  artifacts="$build/fuzz-artifacts/$t"
  mkdir -p "$artifacts"
  log="$build/fuzz-logs/$t.log"
  : >"$log"
  extra=()
  [[ -f fuzz/$t.dict ]] && extra+=("-dict=fuzz/$t.dict")
  echo "== $t: ${seconds}s on a copy of fuzz/corpus/$t ($(ls "$scratch" | wc -l) seeds); log $log"
  # The HDF5 C library (not ours to fix) crashes on some corrupt files: such a
  # crash is set aside in $artifacts/hdf5-library/ and fuzzing resumes for the
  # time left, with the corpus grown so far. Anything else ends the target
  # (unless KEEP_GOING=1).
  left=$seconds execs=0 fuzzed=0 hdf5=0 ours=0 rc=0 added=0 rss=0 cov= report= artifact= who= frame=
  declare -A hdf5_sites=() ours_sites=()
  while ((left > 0)); do
    segment=$(mktemp)
    from=$(($(wc -l <"$log") + 1))
    t0=$SECONDS
    # -timeout: one input running 10 s is a finding (they take milliseconds).
    # (braces: the shell's "Aborted" notice goes to the log too)
    # -malloc_limit_mb below the RSS limit: one huge allocation is reported with
    # its own stack (an RSS overrun shows only where the process was).
    { TMPDIR=$tmp "$build/fuzz/$t" "$scratch" -max_total_time="$left" -timeout=10 -malloc_limit_mb=1024 \
      -print_final_stats=1 -print_funcs=0 ${FUZZ_SEED:+-seed=$FUZZ_SEED} \
      -artifact_prefix="$artifacts/" "${extra[@]}"; } >>"$log" 2>&1
    rc=$?
    elapsed=$((SECONDS - t0))
    tail -n +"$from" "$log" >"$segment"
    execs=$((execs + $(sed -n 's/^stat::number_of_executed_units: *//p' "$segment" | tail -1 | grep . || echo 0)))
    added=$((added + $(sed -n 's/^stat::new_units_added: *//p' "$segment" | tail -1 | grep . || echo 0)))
    seg_rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$segment" | tail -1)
    ((${seg_rss:-0} > rss)) && rss=$seg_rss
    seg_cov=$(grep -o 'cov: [0-9]*' "$segment" | tail -1)
    [[ -n $seg_cov ]] && cov=$seg_cov
    fuzzed=$((fuzzed + (elapsed > 0 ? elapsed : 1)))  # a crash at once still uses up time
    left=$((seconds - fuzzed))
    if ((rc == 0)); then rm -f "$segment"; break; fi
    artifact=$(sed -n 's/.*Test unit written to //p' "$segment" | tail -1)
    read -r who frame < <(classify "$segment")
    # what went wrong and the innermost named HDF5 function, for the tally
    kind=$(grep -m1 -oE 'ERROR: [A-Za-z]+: [A-Za-z-]+( [a-z-]+)*|deadly signal' "$segment" | sed 's/ERROR: //')
    report=$(grep -m1 -E 'ERROR: |PROPERTY VIOLATED|FINDING' "$segment")
    fn=$(grep -m1 -oE ' in H5[A-Za-z0-9_]+' "$segment" | sed 's/ in //')
    site="${kind:-crash} in ${fn:-an unnamed HDF5 function}"
    rm -f "$segment"
    if [[ -n $artifact && -f $artifact ]] && [[ $who == hdf5 || ${KEEP_GOING:-0} == 1 ]]; then
      if [[ $who == hdf5 ]]; then
        mkdir -p "$artifacts/hdf5-library"
        mv "$artifact" "$artifacts/hdf5-library/"
        hdf5=$((hdf5 + 1))
        hdf5_sites[$site]=$((${hdf5_sites[$site]:-0} + 1))
        keep_hdf5_crash "$artifacts/hdf5-library/$(basename "$artifact")" "$site"
      else
        mkdir -p "$artifacts/ours"
        mv "$artifact" "$artifacts/ours/"
        ours=$((ours + 1))
        ours_sites["${kind:-crash} at $frame"]=$((${ours_sites["${kind:-crash} at $frame"]:-0} + 1))
      fi
      rc=0
      continue
    fi
    break
  done
  ((ours > 0 && rc == 0)) && rc=1
  corpus_now=$(ls "$scratch" | wc -l)
  rm -rf "$scratch" "$tmp"
  rate=$((fuzzed > 0 ? execs / fuzzed : execs))
  line="$t: $execs execs in ${fuzzed}s, $rate execs/s, ${cov:-cov: ?}, $added new units (corpus $corpus_now), peak RSS ${rss} MB"
  ((hdf5 > 0)) && line="$line; $hdf5 HDF5-library crashes set aside in $artifacts/hdf5-library/"
  if ((ours > 0)); then
    line="$line -- $ours FINDINGS, inputs in $artifacts/ours/; see $log"
    failed+=("$t")
  elif ((rc != 0)); then
    line="$line -- FINDING (exit $rc): ${artifact:-no artifact}; ${who:-?} ${frame:-}; see $log"
    failed+=("$t")
    echo "   $report"
  fi
  echo "$line"
  for site in "${!ours_sites[@]}"; do echo "   finding: $site (${ours_sites[$site]}x)"; done
  for site in "${!hdf5_sites[@]}"; do echo "   HDF5 crash site: $site (${hdf5_sites[$site]}x)"; done
  unset hdf5_sites ours_sites
  summary+=("$line")
done

echo "== summary"
printf '%s\n' "${summary[@]}"
if ((${#new_crashes[@]} > 0)); then
  echo "${#new_crashes[@]} new HDF5-library crash inputs in fuzz/hdf5-crashes/ (replayed by CTest; commit them):"
  printf '   %s\n' "${new_crashes[@]}"
fi
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAIL: ${failed[*]} found something; replay an artifact with: $build/fuzz/<target> <artifact>"
  exit 1
fi
echo "PASS: no finding in our code in ${seconds}s per target"
