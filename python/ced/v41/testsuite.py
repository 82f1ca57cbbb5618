"""The tests a port's suite imports (``from ced.v41.testsuite import *``), run on the engine that
``pytest --ced-engine MODULE:FACTORY`` names (the `ced` pytest plugin). Each failure's message names the golden
file, the pass, the layer, the tensor and the position; a capability the engine lacks is a skip with its reason.
"""
from __future__ import annotations

from typing import Any

import pytest

from .check import check
from .gate import gate
from .generation import generation

__all__ = ["test_gate", "test_ced_property", "test_generation"]

PROPERTIES = (
    "a prefix's prefill is the prompt's first rows",
    "every row replayed is the prefill",
    "a bounded replay of a prompt within the window is the prefill",
    "the exact span",
    "a decode step after a ced prefill",
    "a resume after a hit",
)

_checks: dict = {}


def test_gate(ced_engine: Any, ced_golden_file: Any, ced_checkpoints: Any, ced_record: Any) -> None:
    """The engine agrees with DeepSeek's official code on this golden file, layer by layer and end to end."""
    record = None if ced_record is None else ced_record / ced_golden_file.name
    rep = gate(ced_engine, [ced_golden_file], checkpoints=ced_checkpoints, record=record, quiet=True)
    if rep.failures:
        f = rep.first_failure
        pytest.fail(f"{f.file}: {f.pass_}, layer {f.layer}, {f.kind}: {f.failure} at {f.where} "
                    f"(first divergent layer {rep.first_divergent_layer(f.file)}; {len(rep.failures)} tensors failed)",
                    pytrace=False)
    if not rep.verdicts:
        pytest.skip("; ".join(rep.not_supported) or "nothing judged")


def test_ced_property(ced_engine: Any, ced_property: str, ced_checkpoints: Any) -> None:
    """The CED property holds on the engine (bitwise where it declares batch invariance)."""
    key = id(ced_engine)
    if key not in _checks:
        _checks[key] = check(ced_engine, checkpoint=str(ced_checkpoints / "v41-tiny"), quiet=True)
    found = [p for p in _checks[key].properties if p.name.startswith(ced_property)]
    assert found, f"no property named {ced_property!r}"
    p = found[0]
    if p.verdict == "not supported":
        pytest.skip(p.detail)
    if p.verdict != "pass":
        pytest.fail(f"{p.name}: {p.detail}", pytrace=False)


def test_generation(ced_engine: Any, ced_checkpoints: Any) -> None:
    """Free-running greedy decode agrees with the reference under vLLM's rule."""
    rep = generation(ced_engine, checkpoint=str(ced_checkpoints / "v41-tiny"), quiet=True)
    if rep.not_supported:
        pytest.skip(rep.not_supported)
    if not rep.passed:
        pytest.fail(str(rep), pytrace=False)
