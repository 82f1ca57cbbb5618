#!/usr/bin/env bash
# The main job: set up, build, then `ced verify` on the embedded default config.
set -euo pipefail
# OpenMP threads sleep rather than spin at barriers: CTest runs tests side by
# side, and spinning threads on a shared core slow the reference tenfold.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
exec "${CED_BUILD_DIR:-$root/build}/tools/ced" verify "$@"
