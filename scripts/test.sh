#!/usr/bin/env bash
# The test suite: set up, build, then CTest's default tier (everything but the
# `long` label; `gpu` tests report skipped without a device). Pass a label
# expression to choose another tier: scripts/test.sh smoke | default | long.
set -euo pipefail
# OpenMP threads sleep rather than spin at barriers: CTest runs tests side by
# side, and spinning threads on a shared core slow the reference tenfold.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${CED_BUILD_DIR:-$root/build}
# The long tier's Slurm test (unit-tests/replay_budget_slurm_test.sh) needs a local Slurm.
[ "${1:-default}" = long ] && export CED_SETUP_EXTRA="slurm-wlm munge"
"$root/scripts/setup.sh"
tier=${1:-default}
case "$tier" in
  smoke) args=(-L smoke) ;;
  default) args=(-LE long) ;;
  long) args=() ;;
  *) echo "test.sh: tier must be smoke, default or long" >&2; exit 2 ;;
esac
# The default and long tiers also run each libFuzzer target (clang, ASan,
# UBSan) for CED_FUZZ_SECONDS (default 60; 0 skips) with a fixed seed; without
# clang's libFuzzer runtime the script prints SKIP. CTest runs last, so its
# summary closes the output.
if [ "$tier" != smoke ] && [ "${CED_FUZZ_SECONDS:-60}" -gt 0 ]; then
  FUZZ_SEED=${FUZZ_SEED:-1} "$root/fuzz/run-fuzzers.sh" "${CED_FUZZ_SECONDS:-60}"
fi
# The Python package and its tests (scripts/test-python.sh), then CTest; both
# always run, and the script fails when either does.
python_rc=0
if [ "$tier" != smoke ]; then
  "$root/scripts/test-python.sh" || python_rc=$?
fi
cd "$build"
ctest_rc=0
# A per-test timeout: a hang fails its test instead of stalling the whole run.
ctest --output-on-failure --timeout "${CED_TEST_TIMEOUT:-600}" -j "$(nproc)" "${args[@]}" || ctest_rc=$?
if [ "$python_rc" -ne 0 ]; then echo "test.sh: the Python tests failed (exit $python_rc)" >&2; fi
if [ "$python_rc" -ne 0 ] || [ "$ctest_rc" -ne 0 ]; then exit 1; fi
