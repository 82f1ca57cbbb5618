#!/usr/bin/env bash
# The venv the Python tests run in (scripts/test-python.sh, the mutation pass): Debian's python3
# seeing Debian's numpy, torch and pytest (--system-site-packages), with scikit-build-core (to build
# the `ced` package without build isolation: no download per install) and safetensors (how the
# PyTorch example loads the weights `ced export` writes) from PyPI, each installed once.
#   scripts/python-venv.sh VENV
set -euo pipefail
venv=${1:?usage: scripts/python-venv.sh VENV}
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -c 'import scikit_build_core' 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check 'scikit-build-core>=0.8'
"$venv/bin/python" -c 'import safetensors' 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check safetensors
