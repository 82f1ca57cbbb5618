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


class Counting(Engine):
    """The reference, counting its decode steps."""
    capabilities = frozenset({"prefill", "decode"})

    def __init__(self):
        self.inner, self.decodes = v41.ReferenceEngine(), 0

    def load(self, checkpoint):
        self.inner.load(checkpoint)

    def prefill(self, tokens):
        return self.inner.prefill(tokens)

    def decode(self, token):
        self.decodes += 1
        return self.inner.decode(token)


def test_each_prompt_generates_steps_tokens_the_first_from_the_prefill_and_steps_minus_1_decoded(checkpoint):
    """``steps`` tokens per prompt: the prefill's greedy choice and steps - 1 decode steps after it, so the agreeing
    prefix of an engine that agrees everywhere is ``steps`` long, not one more."""
    engine = Counting()
    rep = v41.generation(engine, checkpoint=checkpoint, prompts=2, steps=3, quiet=True, stress=False)
    assert rep.passed, str(rep)
    assert engine.decodes == 2 * (3 - 1)
    assert rep.agreement["mean_prefix"] == 3, str(rep)


def test_the_reference_agrees_with_itself_at_every_step(checkpoint):
    rep = v41.generation(v41.ReferenceEngine(), checkpoint=checkpoint, prompts=2, steps=4, quiet=True)
    assert rep.passed, str(rep)
    assert rep.agreement["rate"] == 1.0 and all(d["step"] == -1 for d in rep.divergences)
    # the two seeded prompts, then the five stress prompts (docs/v41.md §13.12), each named in the report
    assert rep.prompts == 7 and rep.names[2:] == ["one-token", "two-alternating", "period-ratio", "period-window",
                                                  "single"], rep.names
    assert rep.kl["max"] == 0.0 and rep.kl["count"] == 7 * 4
    assert "prompt 2 (one-token): the same tokens at every step" in str(rep)


def test_a_port_that_breaks_ties_the_other_way_passes_the_stress_prompts(checkpoint):
    # Our reference with the index top-k's other tie order: on the repeated token its selections differ, yet a
    # correct engine; vLLM's rule passes it.
    class OtherTies(v41.ReferenceEngine):
        def load(self, folder):
            super().load(folder)
            self.model.set_options("lowest-index", "bf16", "official")

    rep = v41.generation(OtherTies(), checkpoint=checkpoint, prompts=1, steps=4, quiet=True)
    assert rep.passed, str(rep)


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
    rep = v41.generation(Steered(3, nudge), checkpoint=checkpoint, prompts=2, steps=5, quiet=True, stress=False)
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


# --- Issue 35: the divergent step is in the KL statistics; a NaN or an infinity is never a pass. ---


def swap_top2_and_sharpen(logits):
    """The step's top-1 and top-2 swapped and the row sharpened: the engine picks the runner-up (within the top-5,
    so the greedy rule passes) with a KL from the reference far above any rounding."""
    order = np.argsort(-logits)
    out = logits.copy()
    out[order[0]], out[order[1]] = logits[order[1]], logits[order[0]]
    return out * 3.0


def _kl(r, t):
    lp, lq = r - np.logaddexp.reduce(r), t - np.logaddexp.reduce(t)
    return max(float(np.sum(np.exp(lp) * (lp - lq))), 0.0)


def test_the_kl_statistics_include_the_divergent_step(checkpoint):
    """Steps 0 and 1 agree bit for bit (KL 0); step 2 diverges. Its context was still shared, so its KL counts, and
    it is the largest: 3 positions, the max at position 2 and equal to the KL computed here."""
    rep = v41.generation(Steered(2, swap_top2_and_sharpen), checkpoint=checkpoint, prompts=1, steps=4, quiet=True, stress=False)
    assert rep.passed and rep.divergences[0]["step"] == 2, str(rep)
    ref = v41.ReferenceEngine()
    ref.load(checkpoint)
    logits = [ref.prefill(v41._core.v41_tokens(checkpoint, 16, 1000)).logits[-1]]
    for _ in range(2):
        logits.append(np.asarray(ref.decode(int(np.argmax(logits[-1])))))
    kl2 = _kl(logits[2], swap_top2_and_sharpen(logits[2]))
    assert kl2 > 0.1
    assert rep.kl["count"] == 3, rep.kl
    assert rep.kl["max"] == pytest.approx(kl2, rel=1e-9) and rep.kl["max_row"] == 2, rep.kl
    assert rep.kl["mean"] == pytest.approx(kl2 / 3, rel=1e-9), rep.kl


def special_at_top1(value):
    """One logit NaN or infinite at the step's own top-1 column: np.argmax still picks that column, so the tokens
    stay the reference's and the greedy rule alone sees no divergence."""
    def plant(logits):
        logits = logits.copy()
        logits[int(np.argmax(logits))] = float(value)
        return logits
    return plant


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("at_step", [2, 3], ids=["shared context", "after a divergence"])
def test_a_nan_or_inf_in_the_engines_logits_fails_generation(value, at_step, checkpoint):
    """Wherever it appears: at a step both sides saw the same context, or after the tokens parted (step 2 diverges
    there, and the greedy rule and the KL look no further)."""
    plants = {2: special_at_top1(value)} if at_step == 2 else {2: swap_top2_and_sharpen, 3: special_at_top1(value)}

    class Planted(Steered):
        def decode(self, token):
            self.step += 1
            logits = np.array(self.inner.decode(token))
            return plants[self.step](logits) if self.step in plants else logits
    rep = v41.generation(Planted(0, None), checkpoint=checkpoint, prompts=1, steps=5, quiet=True)
    assert not rep.passed and not rep, str(rep)
    assert any(f"step {at_step}" in f and value in f for f in rep.failures), rep.failures
