"""ced.v41.check: the CED properties on an engine, each verdict named; the replay bugs the ports had, planted in
the reference, each fail the property that names them, and only a capability the engine lacks is not supported.
"""
from __future__ import annotations

import numpy as np
import pytest

import ced.v41 as v41
from ced.v41.engine import Engine, NotSupported


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v41-check") / "v41-tiny"
    v41.export("v41-tiny", folder)
    return str(folder)


@pytest.mark.parametrize("convention,rule", [("sglang", "vllm"), ("vllm", "trtllm"), ("ascend", "sglang")])
def test_every_property_holds_bitwise_on_the_reference(convention, rule, checkpoint):
    rep = v41.check(v41.ReferenceEngine(convention=convention, encoder_replay=rule), checkpoint=checkpoint, quiet=True)
    assert rep.passed, str(rep)
    assert [p.verdict for p in rep.properties] == ["pass"] * 6, str(rep)
    assert all(p.detail == "bitwise" for p in rep.properties)


# Each port's replay bug (docs/v41.md §13.6) and the property that must name it.
FAULTS = [
    ("ced-ring-slot-of-row", "sglang", "a decode step after a ced prefill"),
    ("ced-floor-on-row-index", "sglang", "the exact span"),
    ("ced-cut-floor-flipped", "vllm", "the exact span"),
    ("resume-start-off-by-one", "sglang", "a resume after a hit"),
]


@pytest.mark.parametrize("fault,convention,prop", FAULTS)
def test_a_planted_replay_bug_fails_the_property_that_names_it(fault, convention, prop, checkpoint):
    rep = v41.check(v41.ReferenceEngine(fault=fault, convention=convention, encoder_replay="vllm"),
                    checkpoint=checkpoint, quiet=True)
    failed = [p.name for p in rep.failures]
    assert any(n.startswith(prop) for n in failed), str(rep)
    assert not rep.passed
    assert "not bitwise" in rep.failures[0].detail


class FullPrefillOnly(Engine):
    capabilities = frozenset({"prefill", "batch_invariant"})

    def __init__(self):
        self.inner = v41.ReferenceEngine()

    def load(self, checkpoint):
        self.inner.load(checkpoint)

    def prefill(self, tokens):
        return self.inner.prefill(tokens)


def test_a_port_without_ced_has_its_ced_properties_not_supported(checkpoint):
    rep = v41.check(FullPrefillOnly(), checkpoint=checkpoint, quiet=True)
    assert rep.passed, str(rep)
    assert [p.verdict for p in rep.properties].count("not supported") == 5


class ReplayPlanted(Engine):
    """Batch invariant by declaration; the reference, with `plant(logits)` changing a CED replay's rows."""
    capabilities = frozenset({"prefill", "ced", "batch_invariant"})
    convention = "sglang"

    def __init__(self, plant):
        self.inner, self.plant = v41.ReferenceEngine(), plant

    def load(self, checkpoint):
        self.inner.load(checkpoint)

    def prefill(self, tokens):
        return self.inner.prefill(tokens)

    def prefill_ced(self, tokens, replay):
        p = self.inner.prefill_ced(tokens, replay)
        p.logits = self.plant(np.array(p.logits, dtype=np.float64))
        return p


class Jittery(ReplayPlanted):
    """A port that is not batch invariant: a CED replay's rows differ from the prefill's by a rounding flip."""
    capabilities = frozenset({"prefill", "ced"})

    def __init__(self, scale):
        super().__init__(lambda logits: logits * (1 + scale))


def test_without_batch_invariance_a_property_is_judged_under_the_stated_policy(checkpoint):
    assert v41.check(Jittery(1e-6), checkpoint=checkpoint, quiet=True).passed
    rep = v41.check(Jittery(1.0), checkpoint=checkpoint, quiet=True)
    assert rep.verdict("every row replayed is the prefill") == "FAIL", str(rep)
    assert "0.35 of" in str(rep)


class FirstRowOff(Jittery):
    """A replay of every row whose first row alone differs: the last row, all a span check reads, is right."""

    def prefill_ced(self, tokens, replay):
        p = self.inner.prefill_ced(tokens, replay)
        p.logits = p.logits.copy()
        p.logits[0] *= 2.0
        return p


def test_every_row_replayed_is_compared_not_only_the_last(checkpoint):
    rep = v41.check(FirstRowOff(0.0), checkpoint=checkpoint, quiet=True)
    assert rep.verdict("every row replayed is the prefill") == "FAIL", str(rep)
    assert "row 0" in str(rep)


class Refuses(Engine):
    """Declares a prefill it then refuses: nothing can be judged."""
    capabilities = frozenset({"prefill"})

    def load(self, checkpoint):
        pass

    def prefill(self, tokens):
        raise NotSupported("not yet")


def test_a_check_that_judged_nothing_does_not_pass(checkpoint):
    rep = v41.check(Refuses(), checkpoint=checkpoint, quiet=True)
    assert not rep.failures and not rep.passed, str(rep)


# --- Issue 35: bitwise means bitwise, each property compares two different runs, and a NaN never holds. ---


def _one_ulp_up(x):
    """The next fp32 value above x: the smallest difference a bitwise verdict exists to see."""
    return float(np.nextafter(np.float32(x), np.float32(np.inf)))


def test_a_batch_invariant_replay_one_fp32_ulp_off_fails_bitwise(checkpoint):
    """Row 0 of every replay is one ulp off in one logit: well within np.allclose's tolerance, not bitwise."""
    def ulp(logits):
        logits[0, 3] = _one_ulp_up(logits[0, 3])
        return logits
    a = ReplayPlanted(ulp)
    rep = v41.check(a, checkpoint=checkpoint, quiet=True)
    assert rep.verdict("every row replayed is the prefill") == "FAIL", str(rep)
    f = next(p for p in rep.failures if p.name == "every row replayed is the prefill")
    assert "not bitwise: 1 values differ, the largest at row 0 column 3" in f.detail, f.detail
    assert not rep.passed


class PrefixOff(FullPrefillOnly):
    """A prefill of a shorter prompt whose last row differs from the full prompt's row there (state leaking from
    one request into the next, or a non-causal mask): only the prefix property compares those two runs."""

    def prefill(self, tokens):
        p = self.inner.prefill(tokens)
        if len(tokens) == 50:  # check()'s prefix: n // 2 of its n = 100
            p.logits = np.array(p.logits, dtype=np.float64)
            p.logits[-1] *= 1.5
        return p


def test_the_prefix_property_compares_the_prefix_with_the_full_prompt(checkpoint):
    rep = v41.check(PrefixOff(), checkpoint=checkpoint, n=100, quiet=True)
    assert rep.verdict("a prefix's prefill is the prompt's first rows") == "FAIL", str(rep)
    assert "row 49: not bitwise" in rep.failures[0].detail, str(rep)


@pytest.mark.parametrize("value", ["nan", "-inf"])
@pytest.mark.parametrize("invariant", [True, False], ids=["bitwise", "under the policy"])
def test_a_nan_or_inf_in_a_replayed_row_fails_the_property(invariant, value, checkpoint):
    """Under the policy a -inf makes the row's scale inf too (inf > 0.35 * inf is false) and leaves the top-1 as it
    was: only the finiteness test stops it."""
    def special(logits):
        logits[0, 5] = float(value)
        return logits
    eng = ReplayPlanted(special)
    if not invariant:
        eng.capabilities = frozenset({"prefill", "ced"})
    rep = v41.check(eng, checkpoint=checkpoint, quiet=True)
    assert rep.verdict("every row replayed is the prefill") == "FAIL", str(rep)
    assert value.lstrip("-") in str(rep).lower() and not rep.passed, str(rep)


class NanEverywhere(ReplayPlanted):
    """A port whose logits hold a NaN at the same place in every run: it agrees with itself bit for bit."""

    def __init__(self):
        super().__init__(self._nan)

    @staticmethod
    def _nan(logits):
        logits[:, 5] = np.nan
        return logits

    def prefill(self, tokens):
        p = self.inner.prefill(tokens)
        p.logits = self._nan(np.array(p.logits, dtype=np.float64))
        return p


def test_a_nan_on_both_sides_is_not_agreement(checkpoint):
    """NaN is not equal to NaN: the same NaN in the prefill and its replay is no pass (the C++ judge's rule too)."""
    rep = v41.check(NanEverywhere(), checkpoint=checkpoint, quiet=True)
    assert [p.verdict for p in rep.properties if p.verdict != "not supported"] == ["FAIL"] * 4, str(rep)
    assert all("nan" in p.detail.lower() for p in rep.failures), str(rep)


def test_a_check_report_with_no_property_does_not_pass():
    rep = v41.CheckReport(engine="e")
    assert not rep.passed and not rep and "0 of 0" in str(rep)


class Loaded(Exception):
    """Raised by StopsAtLoad: check() got past its refusals to the engine's load."""


class StopsAtLoad(v41.ReferenceEngine):
    def load(self, checkpoint):
        raise Loaded(checkpoint)


def test_a_prompt_one_token_short_of_the_conventions_exact_span_is_refused_and_one_at_it_is_not(checkpoint):
    """The properties need the prompt past the convention's exact span (46 for sglang on v41-tiny): 45 tokens is
    refused before anything runs, 46 goes on to load the engine."""
    with pytest.raises(ValueError, match="n = 45 is below the sglang convention's exact span 46 on v41-tiny"):
        v41.check(StopsAtLoad(convention="sglang"), checkpoint=checkpoint, n=45, quiet=True)
    with pytest.raises(Loaded):
        v41.check(StopsAtLoad(convention="sglang"), checkpoint=checkpoint, n=46, quiet=True)
