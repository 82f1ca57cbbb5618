"""The ``ced`` command of the installed package: the same command line as the CMake build's ``build/tools/ced``
(its C++ ``cli_main``, run in this process through ``ced._core``). ``ced --help`` lists the subcommands;
``python -m ced`` is the same command."""
from __future__ import annotations

import os
import shutil
import sys
from typing import Optional, Sequence

from . import _core


def _self_command() -> Optional[str]:
    """The ``ced`` executable that runs this process, for commands that run ``ced`` again (the official-code
    golden capture exports its checkpoints with it)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "ced" and os.access(argv0, os.X_OK):
        return os.path.abspath(argv0)
    beside = os.path.join(os.path.dirname(sys.executable), "ced")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("ced")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``ced`` on ``argv`` (default: this process's arguments) and returns its exit code: 0 pass, 1 a check
    failed, 2 bad usage or input, 3 an internal error."""
    args = list(sys.argv[1:] if argv is None else argv)
    self_command = _self_command()
    if self_command and "CED_SELF" not in os.environ:
        os.environ["CED_SELF"] = self_command
    sys.stdout.flush()
    sys.stderr.flush()
    return int(_core.cli_main(["ced", *args]))


def run() -> None:
    """The console entry point: exits with ``main()``'s code."""
    sys.exit(main())
