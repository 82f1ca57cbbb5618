"""The released DeepSeek-V4.1-Flash for ports: tiny release-layout checkpoints, golden runs of DeepSeek's own code,
and the judge a port drops into its test suite (docs/v41-ports.md).

>>> import ced.v41 as v41
>>> class MyEngine(v41.Engine): ...                 # a few lines around the port's own model
>>> v41.gate(MyEngine())                            # against the official code, layer by layer and end to end
>>> v41.check(MyEngine())                           # the CED properties on the port
>>> v41.generation(MyEngine(), prompts=4, steps=8)  # free-running greedy decode against the reference
"""
from __future__ import annotations

from .. import _core
from .check import CheckPolicy, CheckReport, Property, check
from .engine import CAPABILITIES, Engine, LayerOut, NotSupported, Prefill, Shared
from .gate import GateReport, Policy, Verdict, gate
from .generation import GenerationReport, generation
from .golden import GoldenRun, checkpoint_for, export, golden_dir, golden_files, read_golden
from .record import Recorder, Replay, replay
from .reference import ReferenceEngine
from .loaded import checkpoint_digests, config_switches, tensor_digest
from .runs import DiffReport, compare_files, is_config, read_run, run, write_run

__all__ = [
    "CAPABILITIES", "Engine", "LayerOut", "NotSupported", "Prefill", "Shared", "ReferenceEngine",
    "gate", "GateReport", "Policy", "Verdict", "generation", "GenerationReport",
    "check", "CheckReport", "CheckPolicy", "Property",
    "GoldenRun", "golden_dir", "golden_files", "read_golden", "export", "checkpoint_for",
    "Recorder", "Replay", "replay", "run", "write_run", "read_run", "compare_files", "DiffReport", "tensor_digest", "checkpoint_digests", "config_switches", "is_config", "builtin_configs", "conventions", "encoder_replay_rules", "faults",
]


def builtin_configs() -> list[str]:
    """The v41 built-ins: v41-tiny, v41-wide, v41-ced (runnable), v41-flash (the release's sizes)."""
    return list(_core.v41_builtin_names())


def conventions() -> list[dict]:
    """The engines' CED replay conventions (docs/v41.md §13.1), each with the engine code it follows."""
    return list(_core.v41_conventions())


def encoder_replay_rules() -> list[str]:
    """The engines' rules for rebuilding the encoder's windows after a prefix-cache hit (docs/v41.md §13.8)."""
    return list(_core.v41_encoder_replay_rules())


def faults() -> list[str]:
    """The ports' real bugs the reference can plant (``ReferenceEngine(fault=...)``), for negative controls."""
    return [f for f in _core.v41_faults() if f != "none"]
