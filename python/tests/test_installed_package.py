"""The package as a port installs it (README "Install"): one version everywhere, the `ced` command inside it
computing the bits of the CMake build's binary, and the golden runs found as package data."""
from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ced


def ced_command() -> list:
    """The installed console script beside this interpreter (pip puts it there), else `python -m ced`."""
    beside = Path(sys.executable).parent / "ced"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "ced"]


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CED_GOLDEN_DIR"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, **kw)


def test_the_version_is_one_the_package_the_command_and_the_wheel_metadata_agree():
    assert re.fullmatch(r"\d+\.\d+\.\d+", ced.__version__)
    assert importlib.metadata.version("ced-harness") == ced.__version__
    for cmd in (ced_command(), [sys.executable, "-m", "ced"]):
        out = run(cmd + ["--version"])
        assert (out.returncode, out.stdout.strip()) == (0, f"ced {ced.__version__}"), (cmd, out.stderr)


def test_the_command_keeps_the_binarys_exit_codes_and_one_line_errors():
    out = run([sys.executable, "-m", "ced", "no-such-command"])
    assert out.returncode == 2
    assert out.stderr.startswith("ced: error: unknown command 'no-such-command'"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = run([sys.executable, "-m", "ced", "run", "--config", "v41-tiny", "--tokens", "0"])
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr


def test_the_golden_runs_are_package_data_found_without_a_checkout():
    package = Path(ced.__file__).resolve().parent
    golden = Path(run([sys.executable, "-c", "import ced; print(ced._core.default_golden_dir())"]).stdout.strip())
    assert golden == package / "data" / "golden"
    assert (golden / "policy.toml").is_file() and (golden / "tiny.h5").is_file()
    assert len(list((golden / "v41").glob("*.h5"))) >= 15
    # CED_GOLDEN_DIR still overrides it.
    env = dict(os.environ, CED_GOLDEN_DIR="/somewhere/else")
    assert subprocess.run([sys.executable, "-c", "import ced; print(ced._core.default_golden_dir())"],
                          capture_output=True, text=True, env=env).stdout.strip() == "/somewhere/else"


def digest_lines(text: str) -> list:
    return [line for line in text.splitlines() if "digest" in line]


@pytest.mark.parametrize("args", [["run", "--config", "v41-tiny", "--tokens", "17"],
                                  ["run", "--config", "v41-wide", "--tokens", "5", "--regime", "bf16"],
                                  ["export", "--config", "v41-tiny", "--weight-seed", "3", "--out", "{tmp}/ck"]],
                         ids=["v41-tiny-n17", "v41-wide-bf16-n5", "v41-export"])
def test_the_package_command_computes_the_cmake_binarys_bits(args, tmp_path):
    """The wheel's module is another build of the same C++ (the portable link: fmt and toml++ from their headers,
    a static C++ runtime); the logits' and the weights' digests must be the binary's, bit for bit."""
    binary = os.environ.get("CED_BINARY")
    if not binary or not os.access(binary, os.X_OK):
        pytest.skip("CED_BINARY names no `ced` binary of the CMake build (scripts/test-python.sh sets it)")
    ours, theirs = tmp_path / "pkg", tmp_path / "bin"
    ours.mkdir(), theirs.mkdir()
    a = run(ced_command() + [x.format(tmp=ours) for x in args])
    b = run([binary] + [x.format(tmp=theirs) for x in args])
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert digest_lines(a.stdout) and digest_lines(a.stdout) == digest_lines(b.stdout.replace(str(theirs), str(ours)))


def test_the_package_is_typed_and_its_public_api_documented():
    import ced.v41
    assert (Path(ced.__file__).parent / "py.typed").is_file()
    for module in (ced, ced.v41):
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj) and not name.endswith("Error"):
                assert (obj.__doc__ or "").strip(), f"{module.__name__}.{name} has no docstring"
