"""The CED properties of docs/spec.md §4.4 as checks on an Engine (tests/test_properties.py runs
them); each returns a list of problems (empty when the property holds), so a test can show it
failing on a planted engine."""
from __future__ import annotations

import math
import os
import tomllib

import torch

from ced_torch import config, weights
from ced_torch.model import Engine

# The golden requests' prompt lengths (golden/README.md): past R so that bounded and exact differ.
GOLDEN_N = {"tiny": 17, "small": 61}
GOLDEN_WEIGHT_SEED, GOLDEN_TOKEN_SEED = 1, 2


def engine(name: str, dtype=torch.float32) -> Engine:
    cfg = config.builtin(name)
    return Engine(cfg, weights.generate(cfg, GOLDEN_WEIGHT_SEED, dtype), dtype=dtype)


def golden_tokens(eng: Engine, n: int) -> list[int]:
    return weights.token_stream(eng.cfg, n, GOLDEN_TOKEN_SEED)


def rel_l2(t: torch.Tensor, r: torch.Tensor) -> float:
    t, r = t.double(), r.double()
    return float(torch.linalg.norm(t - r) / torch.linalg.norm(r))


def calibrated_bound(golden_dir: str, file: str, tensor: str) -> float:
    """max_rel_l2 of golden/policy-calibrated.toml's rule for `tensor` (docs/spec.md §8.4):
    alpha · rel_l2 of the f32 reference on it (golden/calibration.toml) + floor."""
    with open(os.path.join(golden_dir, "policy-calibrated.toml"), "rb") as f:
        rule = next(r for r in tomllib.load(f)["rule"] if r["pattern"] == "runs/*/logits")
    with open(os.path.join(golden_dir, "calibration.toml"), "rb") as f:
        entry = next(x for x in tomllib.load(f)["file"] if x["name"] == file)
    ref = next(t for t in entry["tensors"] if t["name"] == tensor)
    return rule["alpha"] * ref["rel_l2"] + rule["floor"]


def replay_full_equals_full(eng: Engine, n: int) -> list[str]:
    """ced with replay = full is the full prefill: every logit, layer output and selection bitwise."""
    toks = golden_tokens(eng, n)
    a, b = eng.run(toks, mode="ced", replay="full"), eng.run(toks, mode="full")
    problems = []
    if a.replay_start != 0 or not torch.equal(a.positions, b.positions):
        problems.append(f"positions differ (replay start {a.replay_start})")
    elif not torch.equal(a.logits, b.logits):
        problems.append(f"logits differ, rel L2 {rel_l2(a.logits, b.logits):.3e}")
    for l in sorted(b.layers):
        for key in ("out", "topk"):
            if key in b.layers[l] and not torch.equal(a.layers[l][key], b.layers[l][key]):
                problems.append(f"layer {l} {key} differs")
    return problems


def last_logits_drift(eng: Engine, n: int, replay) -> float:
    """rel L2 of the last position's logits of ced(replay) against full (docs/spec.md §4.4)."""
    toks = golden_tokens(eng, n)
    ced = eng.run(toks, mode="ced", replay=replay, logits="last")
    full = eng.run(toks, mode="full", logits="last")
    return rel_l2(ced.logits, full.logits)


def exact_replay_within(eng: Engine, n: int, bound: float) -> list[str]:
    drift = last_logits_drift(eng, n, "exact")
    return [] if drift <= bound else [f"exact replay drifts {drift:.3e} > {bound:.3e}"]


def bounded_drift_visible(eng: Engine, n: int, exact_bound: float) -> tuple[float, list[str]]:
    """Bounded replay (B = W < R) is an approximation: its last-position drift is finite and larger
    than the bound that exact replay meets, or the engine is not truncating the replay."""
    drift = last_logits_drift(eng, n, "bounded")
    if not math.isfinite(drift) or drift <= exact_bound:
        return drift, [f"bounded drift {drift:.3e} not above the exact bound {exact_bound:.3e}"]
    return drift, []


def cone_holds(eng: Engine, n: int, replay, inside: float = 1e-12, outside: float = 1e-9) -> list[str]:
    """docs/spec.md §4.4 on an f64 engine: decoder layer E + k at p equals full iff
    s = 0 or p − (k + 1)(W − 1) ≥ s. "Equal" is rel error ≤ `inside` (the engine's batches
    differ, so not bitwise); "differs" is > `outside`, three orders above."""
    cfg = eng.cfg
    toks = golden_tokens(eng, n)
    ced, full = eng.run(toks, mode="ced", replay=replay), eng.run(toks, mode="full")
    s, W, problems = ced.replay_start, cfg.window, []
    for k in range(cfg.D):
        l = cfg.E + k
        for i, p in enumerate(ced.layers[l]["positions"].tolist()):
            err = rel_l2(ced.layers[l]["out"][i], full.layers[l]["out"][p])
            exact = s == 0 or p - (k + 1) * (W - 1) >= s
            if exact and err > inside:
                problems.append(f"layer {l} position {p}: inside the cone, error {err:.1e}")
            if not exact and err <= outside:
                problems.append(f"layer {l} position {p}: outside the cone, error only {err:.1e}")
    return problems
