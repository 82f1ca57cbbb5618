#!/usr/bin/env bash
# The mutation pass over the judge (docs/mutation.md): samples source mutants of the scope
# (tools/mutate/scope.txt: compare/, golden/, checks/, io/, oracle/, tools/, the model's validation and
# the Python package), builds each in a dedicated build directory, runs the default tier's tests (CTest,
# then pytest) and writes the kill table to BUILD/mutation/kill-table.{csv,md}. Long: not in the default tier.
#
#   scripts/mutate.sh [--count N] [--seed S] [--build DIR] [--stage 'CTEST SELECTION']...
#                     [--test-timeout S] [--only ID,ID] [--equivalent FILE] [--scope FILE]
#   scripts/mutate.sh list [--count N] [--seed S]      # the sample, without running it
#
# The source is mutated in place and always restored (a journal in BUILD/mutation restores it after a
# crash too): do not edit or build the tree from elsewhere while it runs. CED_MUTATE_JOBS sets the
# build parallelism (default 2).
set -euo pipefail
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
root=$(cd "$(dirname "$0")/.." && pwd)
cmd=run
if [ "${1:-}" = list ] || [ "${1:-}" = selftest ] || [ "${1:-}" = table ]; then cmd=$1; shift; fi
if [ "$cmd" != run ]; then exec python3 "$root/tools/mutate/mutate.py" "$cmd" "$@"; fi

build=$root/build-mutate
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --build) build=${args[i + 1]} ;;
    --build=*) build=${args[i]#--build=} ;;
  esac
done
# Shared libraries, so that a mutant recompiles one file and relinks one library; executables are not
# relinked when a library they use changes (LINK_DEPENDS_NO_SHARED); no debug info (faster compiles).
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCED_ENABLE_CUDA=OFF \
        -DBUILD_SHARED_LIBS=ON -DCMAKE_LINK_DEPENDS_NO_SHARED=ON -DCED_BUILD_BENCH=OFF \
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" >/dev/null
fi
# The Python stage's venv (tools/mutate/mutate.py --python-cmd): the one scripts/test-python.sh uses,
# under the mutation build; the package is installed into it before the pass starts.
"$root/scripts/python-venv.sh" "$build/venv"
exec nice python3 "$root/tools/mutate/mutate.py" run --build "$build" \
     --build-args="-j${CED_MUTATE_JOBS:-2}" "$@"
