"""An independent PyTorch implementation of the CED model of docs/spec.md (see ../README.md)."""
from .config import Config, builtin  # noqa: F401
from .model import Engine, RunResult  # noqa: F401
