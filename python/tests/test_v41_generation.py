"""ced.v41.generation: free-running greedy decode on an engine against the reference, judged by vLLM's rule, with
the exact-agreement rate and the per-position KL distribution; each verdict shown failing on a planted engine."""
from __future__ import annotations

import numpy as np
import pytest

import ced.v41 as v41
from ced.v41.engine import Engine


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v41-generation") / "v41-tiny"
    v41.export("v41-tiny", folder)
    return str(folder)


class Steered(Engine):
    """The reference, with the logits of one decode step changed by `plant(logits)`."""
    capabilities = frozenset({"prefill", "decode"})

    def __init__(self, at_step, plant):
        self.inner, self.at_step, self.plant, self.step = v41.ReferenceEngine(), at_step, plant, 0

    def load(self, checkpoint):
        self.inner.load(checkpoint)

    def prefill(self, tokens):
        self.step = 0
        return self.inner.prefill(tokens)

    def decode(self, token):
        self.step += 1
        logits = np.array(self.inner.decode(token))
        return self.plant(logits) if self.step == self.at_step else logits


def demote_top1_to(rank):
    """The step's top-1 moved to the given rank: the engine's greedy choice becomes the old runner-up."""
    def plant(logits):
        order = np.argsort(-logits)
        logits = logits.copy()
        logits[order[0]] = logits[order[rank]] - 1e-3
        return logits
    return plant


def test_the_reference_agrees_with_itself_at_every_step(checkpoint):
    rep = v41.generation(v41.ReferenceEngine(), checkpoint=checkpoint, prompts=2, steps=4, quiet=True)
    assert rep.passed, str(rep)
    assert rep.agreement["rate"] == 1.0 and all(d["step"] == -1 for d in rep.divergences)
    assert rep.kl["max"] == 0.0 and rep.kl["count"] == 2 * 4


def test_a_divergence_within_the_top_n_passes_and_names_the_step(checkpoint):
    rep = v41.generation(Steered(2, demote_top1_to(1)), checkpoint=checkpoint, prompts=1, steps=4, quiet=True)
    assert rep.passed, str(rep)
    assert rep.divergences[0]["step"] == 2 and rep.agreement["rate"] == 0.0
    assert "first divergent step 2" in str(rep)


def test_a_divergence_outside_the_top_n_fails_with_both_ranks_and_margins(checkpoint):
    rep = v41.generation(Steered(2, demote_top1_to(9)), checkpoint=checkpoint, prompts=1, steps=4, top_n=5,
                         quiet=True)
    assert not rep.passed
    d = rep.divergences[0]
    assert d["step"] == 2 and d["rank_a_in_b"] > 5, d
    assert "outside the top-5" in str(rep) and "margins" in str(rep)


def test_a_kl_quantile_bound_gates(checkpoint):
    def nudge(logits):
        return logits * 0.5  # the same argmax, another distribution
    kwargs = dict(checkpoint=checkpoint, prompts=1, steps=4, quiet=True)
    assert v41.generation(Steered(1, nudge), kl_bound=("max", 10.0), **kwargs).passed
    rep = v41.generation(Steered(1, nudge), kl_bound=("max", 1e-6), **kwargs)
    assert not rep.passed and "KL max" in str(rep), str(rep)


def test_an_engine_without_decode_is_not_supported(checkpoint):
    class PrefillOnly(Steered):
        capabilities = frozenset({"prefill"})
    rep = v41.generation(PrefillOnly(1, None), checkpoint=checkpoint, quiet=True)
    assert not rep.passed and "needs the capabilities" in rep.not_supported


def test_nothing_to_judge_is_refused_not_passed(checkpoint):
    for bad in (dict(prompts=0), dict(steps=0), dict(prompt_len=0)):
        with pytest.raises(ValueError, match="nothing judged is no verdict"):
            v41.generation(v41.ReferenceEngine(), checkpoint=checkpoint, quiet=True, **bad)
    assert not v41.GenerationReport(engine="e", prompts=0, steps=1, top_n=5).passed


def test_the_kl_statistics_are_the_plain_numpy_ones(checkpoint):
    """Mean and nearest-rank quantiles (the value of rank ceil(q n)) of per-row KL(ref || engine), recomputed."""
    def nudge(logits):
        return logits * 0.7
    rep = v41.generation(Steered(3, nudge), checkpoint=checkpoint, prompts=2, steps=5, quiet=True)
    ref = v41.ReferenceEngine()
    ref.load(checkpoint)
    kls = []
    for p in range(2):
        prompt = v41._core.v41_tokens(checkpoint, 16, 1000 + p)
        logits = [ref.prefill(prompt).logits[-1]]
        for _ in range(4):
            logits.append(np.asarray(ref.decode(int(np.argmax(logits[-1])))))
        for s, r in enumerate(logits):
            t = nudge(r) if s == 3 else r
            lp, lq = r - np.logaddexp.reduce(r), t - np.logaddexp.reduce(t)
            kls.append(max(float(np.sum(np.exp(lp) * (lp - lq))), 0.0))
    srt = sorted(kls)
    rank = lambda q: srt[int(np.ceil(q * len(srt))) - 1]  # noqa: E731
    assert rep.kl["count"] == len(kls) == 10
    assert rep.kl["mean"] == pytest.approx(np.mean(kls), rel=1e-9)
    assert rep.kl["max"] == pytest.approx(max(kls), rel=1e-9) and rep.kl["max"] > 0
    for key, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999)):
        assert rep.kl[key] == pytest.approx(rank(q), rel=1e-9, abs=1e-15), key
