"""Beyond the golden runs: the engine in f64 equals `reference-f64` under the golden policy
(rtol 1e-11, identical selections) on the awkward sizes where replay and caches break (N = 1,
W − 1, W, W + 1, R − 1, R, R + 1; integer replays; a resume prefix at, inside and across a
compression block; tied decoder kv; a ratio of 3; no candidate pool; no routed experts).
Found by running both from docs/ alone: every case agrees, so docs/spec.md pins the model."""
import pytest
import torch

ced = pytest.importorskip("ced", reason="the ced package (pip install .) is not installed")

from ced_torch import config, harness, weights  # noqa: E402
from ced_torch.layer import Layer  # noqa: E402
from ced_torch.model import Engine  # noqa: E402

WEIGHT_SEED, TOKEN_SEED = 3, 5
R3 = dict(compress_ratios=[0, 3, 3, 3, 3, 3, 3, 3], kv_source_layers=[1, 4, 6])
# (config, overrides, N, mode, replay, prefix, decode); tiny: W = 4, R = 13, r = 2 in the encoder
CASES = [
    ("tiny", {}, 1, "full", None, None, 2),
    ("tiny", {}, 1, "ced", "bounded", None, 2),
    ("tiny", {}, 3, "ced", "exact", None, 2),
    ("tiny", {}, 5, "ced", "bounded", None, 3),
    ("tiny", {}, 12, "ced", "exact", None, 2),
    ("tiny", {}, 14, "ced", 7, None, 2),
    ("tiny", {}, 30, "ced", "full", None, 1),
    ("tiny", {}, 5, "resume", "bounded", 5, 3),
    ("tiny", {}, 20, "resume", "bounded", 9, 3),
    ("tiny", {}, 20, "resume", "exact", 13, 3),
    ("tiny", {}, 30, "resume", 3, 17, 2),
    ("tiny", {}, 20, "resume", "bounded", 20, 2),
    ("tiny", {"tie_decoder_kv": True, "kv_source_layers": [1, 4, 6]}, 25, "ced", "bounded", None, 2),
    ("tiny", R3, 25, "resume", "bounded", 13, 4),
    ("tiny", {"candidate_source_layer": -1}, 25, "ced", "exact", None, 2),
    ("tiny", {"n_routed_experts": 0, "n_active_experts": 0}, 25, "full", None, None, 2),
    ("small", {}, 44, "ced", "exact", None, 3),
    ("small", {}, 80, "resume", "bounded", 50, 2),
    ("v41-shape", {}, 300, "ced", "bounded", None, 2),
]


def _ids(case):
    name, over, n, mode, replay, prefix, decode = case
    extra = ",".join(f"{k}={v}" for k, v in over.items()).replace(" ", "")
    return f"{name}{'[' + extra + ']' if extra else ''}-N{n}-{mode}-{replay}-P{prefix}-K{decode}"


def _judge(case) -> "ced.CompareReport":
    name, over, n, mode, replay, prefix, decode = case
    cfg = ced.config(name, **over)
    ref = ced.run(cfg, n, mode=mode, replay=None if replay is None else str(replay), prefix=prefix, decode=decode,
                  backend="reference-f64", capture=True, weight_seed=WEIGHT_SEED, token_seed=TOKEN_SEED)
    mine_cfg = config.from_json(cfg.to_json())
    eng = Engine(mine_cfg, weights.generate(mine_cfg, WEIGHT_SEED, torch.float64), dtype=torch.float64)
    toks = weights.token_stream(mine_cfg, n + decode, TOKEN_SEED)
    res = eng.run(toks, mode=mode, replay=replay, prefix=prefix, decode=decode)
    return ced.compare(harness.to_ced_result(res, cfg, toks, dtype="f64"), ref, policy="golden")


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_engine_in_f64_equals_reference_f64_under_the_golden_policy(case):
    report = _judge(case)
    assert report.passed, str(report)


def test_agreement_check_fails_on_a_broken_layer(monkeypatch):
    original = Layer.attention_scale
    monkeypatch.setattr(Layer, "attention_scale",
                        lambda self, like: original(self, like) * (1 + 1e-9 if self.l == 6 else 1.0))
    report = _judge(CASES[4])
    assert not report.passed and report.first_divergent_layer == 6
