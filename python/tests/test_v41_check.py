"""ced.v41.check: the CED properties on an engine, each verdict named; the replay bugs the ports had, planted in
the reference, each fail the property that names them, and only a capability the engine lacks is not supported.
"""
from __future__ import annotations

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


class Jittery(Engine):
    """A port that is not batch invariant: a CED replay's rows differ from the prefill's by a rounding flip."""
    capabilities = frozenset({"prefill", "ced"})
    convention = "sglang"

    def __init__(self, scale):
        self.inner, self.scale = v41.ReferenceEngine(), scale

    def load(self, checkpoint):
        self.inner.load(checkpoint)

    def prefill(self, tokens):
        return self.inner.prefill(tokens)

    def prefill_ced(self, tokens, replay):
        p = self.inner.prefill_ced(tokens, replay)
        p.logits = p.logits * (1 + self.scale)
        return p


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
