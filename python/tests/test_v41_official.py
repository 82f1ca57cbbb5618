"""DeepSeek's official inference/model.py through the engine protocol (ced.v41.official): the gate judges it against
its own golden files and it must pass, with every choice it made there made again; a planted difference must fail
at its layer; free-running decode must agree with the reference.

Runs only where the environment names the user's copy of the release's inference/ folder and a CPU port of its
kernel module, and torch has the FP8/FP4 dtypes model.py stores its weights in::

    CED_V41_OFFICIAL_INFERENCE=DIR CED_V41_OFFICIAL_KERNEL=FILE pytest -m official python/tests

Otherwise each test is skipped, saying what is missing. Differences from the golden files are fp32 summation
orders: MKL and oneDNN pick their GEMM kernels by CPU, so a machine other than the one that wrote the files sums in
another order (within a budget of the gate's; the selections stay the same row for row, teacher forced).
"""
from __future__ import annotations

import os

import pytest

import ced.v41 as v41
from ced import _core

INFERENCE = os.environ.get("CED_V41_OFFICIAL_INFERENCE")
KERNEL = os.environ.get("CED_V41_OFFICIAL_KERNEL")
FP8_DTYPES = ("float8_e4m3fn", "float8_e8m0fnu", "float4_e2m1fn_x2")


def _missing() -> str:
    if not INFERENCE or not KERNEL:
        return ("the official code is not named: set CED_V41_OFFICIAL_INFERENCE=DIR (the release's inference/) and "
                "CED_V41_OFFICIAL_KERNEL=FILE (a CPU port of its kernel.py)")
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    lacks = [d for d in FP8_DTYPES if not hasattr(torch, d)]
    return f"torch {torch.__version__} lacks {', '.join(lacks)}" if lacks else ""


pytestmark = [pytest.mark.official, pytest.mark.skipif(bool(_missing()), reason=_missing())]

MODES = {"fp8": "release", "bf16": "bf16"}
SELECTIONS = ("topk_idxs (forced x)", "candidates (forced x)", "experts (forced x)")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tmp_path_factory.mktemp("v41-official-checkpoints")


def official(mode: str):
    from ced.v41.official import OfficialEngine
    return OfficialEngine(INFERENCE, KERNEL, mode=mode, threads=1)


@pytest.fixture(scope="module")
def reports(checkpoints):
    """The gate of each mode over every golden file of its regime, run once."""
    return {mode: v41.gate(official(mode), checkpoints=checkpoints, quiet=True) for mode in MODES}


@pytest.mark.parametrize("mode", list(MODES))
def test_the_official_code_passes_the_gate_on_its_own_golden_files(mode, reports):
    rep = reports[mode]
    print(rep.summary())
    assert rep.passed, str(rep)
    assert rep.files == [p.name for p in v41.golden_files(MODES[mode])]
    assert not rep.not_supported, rep.not_supported
    kinds = {v.kind for v in rep.verdicts}
    assert {"out", "ffn_pre", "attn_out (forced x)", "latent (forced x)", "logits (end to end)",
            "decode logits (end to end)"} <= kinds


@pytest.mark.parametrize("mode", list(MODES))
def test_teacher_forced_the_official_code_makes_every_choice_of_its_golden_files_again(mode, reports):
    picks = [v for v in reports[mode].verdicts if v.kind in SELECTIONS]
    assert picks and all(v.bitwise == 1.0 for v in picks), [v.line() for v in picks if v.bitwise != 1.0]


def test_the_official_code_without_fp8_activation_rounding_fails_the_release_gate_at_layer_0(checkpoints):
    # bf16 mode judged as the release: what a port that forgets act_quant before the FP8 linears computes
    engine = official("bf16")
    engine.regime = "release"
    rep = v41.gate(engine, [v41.golden_dir() / "tiny-fp8-n17.h5"], checkpoints=checkpoints, quiet=True)
    f = rep.first_failure
    assert f is not None, "the planted difference passed the gate"
    # wq_a is the first FP8 linear: the query, which the golden files now carry, is where it shows
    assert (f.pass_, f.layer, f.kind) == ("teacher forced", 0, "attn_q (forced x)"), f.line()


@pytest.mark.skipif(not all(hasattr(_core, f) for f in ("greedy_divergence", "greedy_agreement", "kl_distribution")),
                    reason="ced._core lacks the generation verdict's bindings (greedy_divergence, greedy_agreement, "
                           "kl_distribution)")
@pytest.mark.parametrize("mode", list(MODES))
def test_free_running_decode_of_the_official_code_agrees_with_the_reference(mode, tmp_path):
    from ced.v41.generation import generation
    rep = generation(official(mode), prompts=2, steps=6, checkpoint=str(tmp_path / "v41-tiny"), quiet=True)
    print(rep)
    assert rep.passed, str(rep)
