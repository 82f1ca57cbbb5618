"""What an engine loaded is what the checkpoint holds (docs/v41.md §12.9): the canonical digest of a tensor, the
checkpoint's own digests, and the gate's comparison of an engine's report with them, before any forward pass."""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from .. import _core
from .engine import as_array


def tensor_digest(values: Any, shape: Optional[Sequence[int]] = None) -> str:
    """The canonical digest of a tensor as a port holds it: its values in the checkpoint's logical row-major shape
    (``shape``, default the array's), as float32 (a bf16 or float32 value is exact there; a dequantized FP8 or FP4
    weight too), FNV-1a 64 over the shape's int64s and then the values' little-endian bytes."""
    v = as_array(values, np.float32)
    return _core.v41_tensor_digest(v.reshape(-1), list(v.shape if shape is None else shape))


def config_switches(config: str) -> dict:
    """``{KEY: value}``: the switches of a v41 config (a built-in or a checkpoint folder) a port reports as
    ``config.KEY`` (``tensor_digest([value])``)."""
    return dict(_core.v41_config_switches(os.fspath(config)))


def checkpoint_digests(folder: Union[str, "os.PathLike[str]"]) -> dict:
    """``{name: digest}`` of every weight of a checkpoint folder (scales folded in) and ``config.KEY`` of each switch,
    in the checkpoint's order."""
    return dict(_core.v41_loaded_digests(os.fspath(folder)))


def compare_digests(reported: Mapping[str, str], expected: Mapping[str, str]) -> tuple:
    """(the names whose digests differ, in the checkpoint's order, with those reported that the checkpoint does not
    hold; the names the engine did not report)."""
    differ = [n for n, d in expected.items() if n in reported and reported[n] != d]
    differ += [n for n in reported if n not in expected]
    missing = [n for n in expected if n not in reported]
    return differ, missing
