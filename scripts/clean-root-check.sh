#!/usr/bin/env bash
# The wheel where a port's maintainer is (README "Install"): a minimal Debian root with no development package
# (`debootstrap --variant=minbase`, plus python3-venv), the wheel installed into a fresh venv there from local
# files only (`pip install --no-index`: the Python dependencies' wheels are downloaded outside the root first),
# then, from a folder outside any checkout, once with numpy 1.x and once with numpy 2.x:
#   ced --version and python -m ced --version; ced export; ced run on a golden run's prompt and ced diff
#   against that run; ced gate on the v41 golden set; the tutorial's gate (ced.v41.gate on the example port);
#   the pytest plugin's whole suite on the example port, passing, and its gate failing on the port's planted
#   bug at the layer where it lives.
# Needs root (chroot, mounts) and network for debootstrap and pip download; exits 77 (CTest's skip) without
# them, after saying which. The root is kept for the next run (CED_CLEAN_ROOT, default /var/tmp/ced-clean-root).
#   scripts/clean-root-check.sh WHEEL
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
wheel=$(realpath "${1:?usage: scripts/clean-root-check.sh WHEEL}")
chroot_dir=${CED_CLEAN_ROOT:-/var/tmp/ced-clean-root}
mirror=${CED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
skip() { echo "clean-root-check: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null 2>&1 || skip "no debootstrap"
if [ ! -x "$chroot_dir/usr/bin/python3" ] || [ ! -f "$chroot_dir/.ced-complete" ]; then
  rm -rf "$chroot_dir"
  debootstrap --variant=minbase --include=python3-venv bookworm "$chroot_dir" "$mirror" >/tmp/ced-debootstrap.log 2>&1 ||
    skip "debootstrap failed (network?), see /tmp/ced-debootstrap.log"
  touch "$chroot_dir/.ced-complete"
fi
echo "clean-root-check: root $chroot_dir: $(chroot "$chroot_dir" dpkg-query -W -f '${binary:Package}\n' | wc -l) packages," \
  "$(chroot "$chroot_dir" dpkg-query -W -f '${binary:Package}\n' | grep -c -- '-dev$' || true) of them -dev;" \
  "libhdf5: $(chroot "$chroot_dir" sh -c 'ls /usr/lib/x86_64-linux-gnu/ | grep -c libhdf5' || true) files"

# Everything the root installs, fetched here: the wheel, numpy 1.x and 2.x, safetensors and pytest for the root's
# own Python (bookworm's 3.11, as this machine's).
wheels="$chroot_dir/opt/wheels"
rm -rf "$wheels" "$chroot_dir/opt/work" "$chroot_dir"/opt/venv-*
mkdir -p "$wheels" "$chroot_dir/opt/work"
cp "$wheel" "$wheels/"
pyver=$(chroot "$chroot_dir" python3 -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
for spec in 'numpy<2' 'numpy>=2' safetensors pytest; do
  python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version "$pyver" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$wheels" "$spec" || skip "pip download $spec failed (network?)"
done
# The example port, copied out of the checkout: the run below sees only the installed package.
cp "$root_dir/examples/v41_port/engine.py" "$root_dir/examples/v41_port/test_ced.py" "$chroot_dir/opt/work/"

mount --bind /proc "$chroot_dir/proc"
mount --bind /dev "$chroot_dir/dev"
trap 'umount "$chroot_dir/proc" "$chroot_dir/dev" 2>/dev/null || true' EXIT
for numpy in 'numpy<2' 'numpy>=2'; do
  echo "clean-root-check: ===== $numpy ====="
  venv_name=venv-numpy$([ "$numpy" = 'numpy<2' ] && echo 1 || echo 2)
  chroot "$chroot_dir" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 OMP_WAIT_POLICY=PASSIVE \
    NUMPY="$numpy" VENV="/opt/$venv_name" /bin/bash -euo pipefail -c '
    v=$VENV
    python3 -m venv "$v"
    "$v/bin/pip" install -q --disable-pip-version-check --no-index --find-links /opt/wheels ced-harness "$NUMPY" pytest
    export PATH="$v/bin:$PATH"
    cd /opt/work
    t=$(mktemp -d)
    set -x
    python -c "import numpy, ced; print(\"numpy\", numpy.__version__, \"| ced\", ced.__version__, \"| golden\", ced._core.default_golden_dir())"
    ced --version
    python -m ced --version
    golden=$(python -c "import ced; print(ced._core.default_golden_dir())")
    ced export --config v41-tiny --weight-seed 0 --out $t/v41-tiny
    # Our reference on the official run'"'"'s prompt, then judged against it op by op.
    python -c "import ced.v41 as v; print(*v.read_golden(\"$golden/v41/tiny-fp8-n17.h5\").tokens)" > $t/prompt17.txt
    ced run --config v41-tiny --token-file $t/prompt17.txt --out $t/ours17.h5 | tail -n 2
    ced diff $t/ours17.h5 "$golden/v41/tiny-fp8-n17.h5" | tail -n 1
    ced gate --golden "$golden/v41" | tail -n 1
    python -c "import engine, ced.v41 as v41; r = v41.gate(engine.make()); print(\"tutorial gate passed:\", r.passed); raise SystemExit(0 if r.passed else 1)" | tail -n 2
    python -m pytest -q -p no:cacheprovider --ced-engine engine:make test_ced.py 2>&1 | tail -n 1
    if python -m pytest -q -p no:cacheprovider --ced-engine engine:make_buggy test_ced.py -k "test_gate and tiny-fp8-n17.h5" >$t/buggy.log 2>&1; then
      echo "the planted bug passed the plugin"; exit 1
    fi
    grep -m 1 "teacher forced, layer" $t/buggy.log | cut -c 1-120
    tail -n 1 $t/buggy.log
  '
done
echo "clean-root-check: PASS (numpy 1.x and 2.x)"
