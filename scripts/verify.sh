#!/usr/bin/env bash
# The main job: set up, build, then `ced verify` on the embedded default config.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
exec "${CED_BUILD_DIR:-$root/build}/tools/ced" verify "$@"
