"""ced.v41.gate through the engine protocol: the project's reference passes against DeepSeek's official code, and
each port bug planted in it fails at its layer and tensor; a port's near-ties are excused only within the policy.
"""
from __future__ import annotations

import numpy as np
import pytest

import ced.v41 as v41
from ced.v41.engine import Engine, LayerOut, NotSupported


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tmp_path_factory.mktemp("v41-checkpoints")


def golden(name):
    return v41.golden_dir() / name


@pytest.mark.parametrize("regime", ["release", "bf16"])
def test_the_reference_through_the_protocol_passes_every_golden_file_of_its_regime(regime, checkpoints):
    rep = v41.gate(v41.ReferenceEngine(regime), checkpoints=checkpoints, quiet=True)
    assert rep.passed, str(rep)
    assert len(rep.files) >= 7 and not rep.not_supported
    assert all({"release": "-fp8-", "bf16": "-bf16-"}[regime] in f for f in rep.files), rep.files  # its regime's only
    kinds = {v.kind for v in rep.verdicts}
    assert {"in", "attn_x", "attn_q (forced x)", "attn_kv window (forced x)", "attn_o (forced q, kv, idx)",
            "attn_out (forced o)", "latent (forced x)", "compress_kv (forced x)", "index_k (forced x)",
            "topk_idxs (forced x)", "candidates (forced x)", "experts (forced x)", "expert_weights (forced x)",
            "ffn_out (forced x)", "attn_pre", "ffn_x", "out", "ffn_pre", "final_collapsed", "logits (forced collapsed)",
            "logits (end to end)", "top-1 (last row)", "decode logits (end to end)"} <= kinds
    # Every teacher-forced kind but the Sinkhorn's (reported) and the exact lists by the C++ gate's bounds.
    budgets = {v.kind for v in rep.verdicts if v.pass_ == "teacher forced" and not v.budget.startswith("derived bounds")}
    assert budgets <= {"attn_comb", "ffn_comb", "hash_ids", "attn_idx (forced x)", "next pre_mix"}, budgets


# The ports' real bugs (docs/v41.md §12.5), each first failing at the layer and tensor the C++ gate names.
CONTROLS = [
    # the query's norm and its rotation fail at the query, now that the golden files carry it
    ("v4-q-norm", "tiny-fp8-n17.h5", 0, "attn_q (forced x)"),
    ("one-rope-theta", "tiny-fp8-n17.h5", 1, "attn_q (forced x)"),
    ("unrotated-compressed-keys", "tiny-fp8-n17.h5", 1, "compress_kv (forced x)"),
    ("unclamped-shared-expert", "tiny-fp8-n17-hot.h5", 0, "ffn_out (forced x)"),
    ("mhc-same-sublayer", "tiny-fp8-n17.h5", 0, "attn_x"),
    ("v4-q-norm", "wide-bf16-n33.h5", 0, "attn_q (forced x)"),
]


@pytest.mark.parametrize("fault,file,layer,kind", CONTROLS)
def test_a_planted_port_bug_fails_at_its_layer_and_tensor(fault, file, layer, kind, checkpoints):
    regime = "bf16" if "-bf16-" in file else "release"
    rep = v41.gate(v41.ReferenceEngine(regime, fault=fault), [golden(file)], checkpoints=checkpoints, quiet=True)
    f = rep.first_failure
    assert f is not None, f"{fault} passed the gate"
    assert (f.pass_, f.layer, f.kind) == ("teacher forced", layer, kind), f.line()
    assert rep.first_divergent_layer() == layer
    assert f.where.startswith(f"layer {layer} position "), f.where  # the element by its position and column


class LayerOnly(Engine):
    """A port that can run a block on given inputs but shows nothing inside it (no sublayers, no captures)."""
    capabilities = frozenset({"prefill", "layer"})

    def __init__(self, inner):
        self.inner, self.regime, self.name = inner, inner.regime, "layer-only " + inner.name

    def load(self, checkpoint):
        self.inner.load(checkpoint)

    def prefill(self, tokens):
        return self.inner.prefill(tokens).logits[-1:]  # the last row only, as bare logits

    def layer(self, layer, streams, pre_mix, tokens, shared):
        o = self.inner.layer(layer, streams, pre_mix, tokens, shared)
        return {"out": o.out, "ffn_pre": o.ffn_pre}


def test_a_port_without_sublayers_is_judged_on_its_block_outputs_and_a_bug_still_fails_at_its_layer(checkpoints):
    rep = v41.gate(LayerOnly(v41.ReferenceEngine()), [golden("tiny-fp8-n17.h5")], checkpoints=checkpoints, quiet=True)
    assert rep.passed, str(rep)
    assert {v.kind for v in rep.verdicts} >= {"out", "ffn_pre", "logits (end to end)", "final_collapsed"}
    bad = v41.gate(LayerOnly(v41.ReferenceEngine(fault="v4-q-norm")), [golden("tiny-fp8-n17.h5")],
                   checkpoints=checkpoints, quiet=True)
    assert (bad.first_failure.layer, bad.first_failure.kind) == (0, "out"), str(bad)


class PrefillOnly(Engine):
    capabilities = frozenset({"prefill"})

    def __init__(self, inner):
        self.inner, self.regime = inner, inner.regime

    def load(self, checkpoint):
        self.inner.load(checkpoint)

    def prefill(self, tokens):
        return self.inner.prefill(tokens)


class PlantedInput(PrefillOnly):
    """The reference with one value of one layer's captured input ("in", the stream after its Engram) moved by 1:
    nothing else differs, since a capture is not handed on."""
    capabilities = frozenset({"prefill", "layer"})

    def __init__(self, inner, layer):
        super().__init__(inner)
        self.at = layer

    def layer(self, layer, streams, pre_mix, tokens, shared):
        o = self.inner.layer(layer, streams, pre_mix, tokens, shared)
        if layer == self.at:
            x = np.array(o.captures["in"], dtype=np.float64)
            x.flat[5] += 1.0
            o = LayerOut(o.out, o.ffn_pre, o.published, {**o.captures, "in": x})
        return o


def test_an_engram_layers_input_is_judged_and_a_value_changed_in_it_fails_there(checkpoints):
    """v41-tiny's Engram layers are 0 and 2: the input of layer 2 with one value changed fails the gate at layer 2,
    "in", and nowhere before it."""
    rep = v41.gate(PlantedInput(v41.ReferenceEngine(), 2), [golden("tiny-fp8-n17.h5")], checkpoints=checkpoints,
                   quiet=True)
    f = rep.first_failure
    assert f is not None, str(rep)
    assert (f.pass_, f.layer, f.kind) == ("teacher forced", 2, "in"), f.line()
    assert any(v.layer == 0 and v.kind == "in" and v.ok for v in rep.verdicts), str(rep)


def test_a_capability_not_declared_is_reported_not_supported_never_failed(checkpoints):
    rep = v41.gate(PrefillOnly(v41.ReferenceEngine()), [golden("tiny-fp8-n17.h5")], checkpoints=checkpoints,
                   quiet=True)
    assert rep.passed
    assert any("teacher forced" in n and "'layer'" in n for n in rep.not_supported)


class SwapSelection(PrefillOnly):
    """Plants a selection that differs from the official in one row: its boundary position swapped for the best
    position it left out."""
    capabilities = frozenset({"prefill", "layer"})

    def __init__(self, inner, layer, row):
        super().__init__(inner)
        self.at, self.row = layer, row

    def layer(self, layer, streams, pre_mix, tokens, shared):
        o = self.inner.layer(layer, streams, pre_mix, tokens, shared)
        if layer == self.at:
            t = np.array(o.published["topk_idxs"])
            chosen = [i for i in t[self.row] if i >= 0]
            visible = range(len(tokens), len(tokens) + (self.row + 1) // 2)  # the ratio-2 groups row `row` sees
            left = [i for i in visible if i not in chosen]
            t[self.row, list(t[self.row]).index(chosen[-1])] = left[0]
            o = LayerOut(o.out, o.ffn_pre, {**o.published, "topk_idxs": t}, o.captures)
        return o


def test_a_selection_flip_is_a_near_tie_only_within_the_policys_bound(checkpoints):
    file = [golden("tiny-fp8-n40.h5")]
    strict = v41.gate(SwapSelection(v41.ReferenceEngine(), 1, 39), file, checkpoints=checkpoints,
                      policy=v41.Policy(tie_ulps=0.0), quiet=True)
    f = strict.first_failure
    assert (f.layer, f.kind) == (1, "topk_idxs (forced x)"), str(strict)
    assert "row 39" in f.where
    loose = v41.gate(SwapSelection(v41.ReferenceEngine(), 1, 39), file, checkpoints=checkpoints,
                     policy=v41.Policy(tie_ulps=1e9), quiet=True)
    assert not any(v.kind == "topk_idxs (forced x)" and not v.ok for v in loose.verdicts), str(loose)
    assert any("near-tie topk_idxs (forced x) layer 1 row 39" in n for n in loose.near_ties), loose.near_ties


class FlipTop1(PrefillOnly):
    """Raises the official runner-up of the last row just above the top-1: a flip by a margin it chose."""

    def prefill(self, tokens):
        p = self.inner.prefill(tokens)
        logits = np.array(p.logits)
        order = np.argsort(logits[-1])
        logits[-1, order[-2]] = logits[-1, order[-1]] + 1e-3
        return v41.Prefill(logits=logits, first_row=p.first_row)


def test_a_top1_flip_is_excused_only_below_the_policys_margin_and_the_margin_is_printed(checkpoints):
    file = [golden("tiny-fp8-n17.h5")]
    tight = v41.gate(FlipTop1(v41.ReferenceEngine()), file, checkpoints=checkpoints, policy=v41.Policy(top1_margin=0),
                     quiet=True)
    f = tight.first_failure
    assert f.kind == "top-1 (last row)" and "margin" in f.failure, str(tight)
    loose = v41.gate(FlipTop1(v41.ReferenceEngine()), file, checkpoints=checkpoints, policy=v41.Policy(top1_margin=1),
                     quiet=True)
    assert loose.passed and any("top-1 flip" in n and "margin" in n for n in loose.near_ties), str(loose)


def test_an_engine_declaring_an_unknown_capability_is_refused():
    class Typo(PrefillOnly):
        capabilities = frozenset({"prefill", "layers"})
    with pytest.raises(ValueError, match="unknown capabilities"):
        v41.gate(Typo(v41.ReferenceEngine()), [golden("tiny-fp8-n17.h5")], quiet=True)


def test_a_gate_that_judged_nothing_does_not_pass():
    rep = v41.GateReport(engine="e", files=[], verdicts=[], not_supported=["x"])
    assert not rep.passed


def test_not_supported_raised_inside_a_declared_capability_is_reported(checkpoints):
    class Refuses(LayerOnly):
        def layer(self, *a):
            raise NotSupported("this port cannot run one block alone yet")
    rep = v41.gate(Refuses(v41.ReferenceEngine()), [golden("tiny-fp8-n5.h5")], checkpoints=checkpoints, quiet=True)
    assert any("cannot run one block alone" in n for n in rep.not_supported)


def test_ced_gate_and_ced_check_judge_a_v41_engine_as_the_v41_package_does(checkpoints):
    import ced
    rep = ced.gate(v41.ReferenceEngine(fault="v4-q-norm"), str(golden("tiny-fp8-n5.h5")), quiet=True)
    assert isinstance(rep, v41.GateReport) and (rep.first_failure.layer, rep.first_failure.kind) == \
        (0, "attn_q (forced x)")
    assert ced.check(v41.ReferenceEngine(fault="ced-ring-slot-of-row"), quiet=True).failures


def test_a_head_the_engine_cannot_run_is_reported_not_supported(checkpoints):
    rep = v41.gate(LayerOnly(v41.ReferenceEngine()), [golden("tiny-fp8-n5.h5")], checkpoints=checkpoints, quiet=True)
    assert rep.passed
    assert any(n.startswith("tiny-fp8-n5.h5 head:") for n in rep.not_supported), rep.not_supported


# --- Issue 35: each verdict judged on the right side, and never against a NaN or an infinity. ---


def _index_scores(file, layer, row, checkpoints):
    """The reference's index scores of one row on the official's input: the scores the gate's near-tie test reads."""
    from ced.v41.gate import _shared_below
    run = v41.read_golden(golden(file))
    folder = v41.checkpoint_for(run, checkpoints)
    plan = v41._core.v41_plan(str(folder))
    ref = v41.ReferenceEngine(run.regime)
    ref.load(str(folder))
    layers = run.result["layers"]
    scores = ref.attention(layer, layers[layer]["attn_x"], _shared_below(plan, layers, layer))["index_score"]
    return np.asarray(scores[row], np.float64), np.asarray(layers[layer]["topk_idxs"][row]), len(run.tokens)


def _bf16_ulps(gap, boundary):
    """|gap| in bf16 spacings at the boundary score: the near-tie test's unit (gate.py's _near_tie)."""
    return abs(gap) / 2.0 ** (np.frexp(max(abs(boundary), 2.0 ** -126))[1] - 8)


class Reselect(LayerOnly):
    """One published selection row with the given swaps (index sources out, index sources in), everything else the
    reference's, so only that row of topk_idxs can fail."""

    def __init__(self, inner, layer, row, swaps):
        super().__init__(inner)
        self.at, self.row, self.swaps = layer, row, swaps

    def layer(self, layer, streams, pre_mix, tokens, shared):
        o = self.inner.layer(layer, streams, pre_mix, tokens, shared)
        if layer != self.at:
            return o
        t = np.array(o.published["topk_idxs"])
        for out, into in self.swaps:
            t[self.row, list(t[self.row]).index(out)] = into
        return LayerOut(o.out, o.ffn_pre, {**o.published, "topk_idxs": t}, o.captures)


def test_a_selection_row_with_one_near_tie_and_one_far_swap_is_not_excused(checkpoints):
    """The farthest position decides a near-tie: a row is excused only when EVERY position one side alone chose is
    within tie_ulps of the boundary. Row 39 of layer 1 (tiny-fp8-n40) gets two swaps: its boundary position for the
    best position it left out (a near-tie at the bound set below), and its best position for its worst finite one
    (far). The bound is set between the two gaps, so judging by the closest gap would excuse the row."""
    file, layer, row = "tiny-fp8-n40.h5", 1, 39
    scores, off, N = _index_scores(file, layer, row, checkpoints)
    chosen = [int(i) for i in off if i >= 0]
    score = {i: scores[i - N] for i in chosen}
    boundary_pos, best_pos = min(chosen, key=score.get), max(chosen, key=score.get)
    boundary = score[boundary_pos]
    left = [i + N for i in range(scores.shape[0]) if i + N not in chosen and np.isfinite(scores[i])]
    near, far = max(left, key=lambda i: scores[i - N]), min(left, key=lambda i: scores[i - N])
    near_gap = _bf16_ulps(scores[near - N] - boundary, boundary)
    far_gap = min(_bf16_ulps(scores[far - N] - boundary, boundary), _bf16_ulps(score[best_pos] - boundary, boundary))
    assert near_gap < far_gap, (near_gap, far_gap)  # the row has a near and a far position to swap in
    policy = v41.Policy(tie_ulps=(near_gap + far_gap) / 2)
    # Control: the near swap alone is excused under this bound (so what fails below is the far swap).
    alone = v41.gate(Reselect(v41.ReferenceEngine(), layer, row, [(boundary_pos, near)]), [golden(file)],
                     checkpoints=checkpoints, policy=policy, quiet=True)
    assert alone.passed and any(f"layer {layer} row {row}" in n for n in alone.near_ties), str(alone)
    both = v41.gate(Reselect(v41.ReferenceEngine(), layer, row, [(boundary_pos, near), (best_pos, far)]),
                    [golden(file)], checkpoints=checkpoints, policy=policy, quiet=True)
    f = both.first_failure
    assert f is not None and (f.layer, f.kind) == (layer, "topk_idxs (forced x)"), str(both)
    assert f"row {row}" in f.where and not both.near_ties, str(both)


def test_a_near_tie_exactly_at_the_bound_is_excused_and_one_just_past_it_is_not(checkpoints):
    """tie_ulps is inclusive: row 39 of layer 1 (tiny-fp8-n40) with its boundary position swapped for the best one it
    left out is excused under a bound equal to that position's gap, and fails under the next float below it."""
    file, layer, row = "tiny-fp8-n40.h5", 1, 39
    scores, off, N = _index_scores(file, layer, row, checkpoints)
    chosen = [int(i) for i in off if i >= 0]
    score = {i: scores[i - N] for i in chosen}
    boundary_pos = min(chosen, key=score.get)
    boundary = score[boundary_pos]
    left = [i + N for i in range(scores.shape[0]) if i + N not in chosen and np.isfinite(scores[i])]
    near = max(left, key=lambda i: scores[i - N])
    gap = _bf16_ulps(scores[near - N] - boundary, boundary)
    assert gap > 0, gap
    engine = Reselect(v41.ReferenceEngine(), layer, row, [(boundary_pos, near)])
    at = v41.gate(engine, [golden(file)], checkpoints=checkpoints, policy=v41.Policy(tie_ulps=gap), quiet=True)
    assert at.passed and any(f"layer {layer} row {row}" in n for n in at.near_ties), str(at)
    past = v41.gate(engine, [golden(file)], checkpoints=checkpoints, policy=v41.Policy(tie_ulps=np.nextafter(gap, 0)),
                    quiet=True)
    f = past.first_failure
    assert f is not None and (f.layer, f.kind) == (layer, "topk_idxs (forced x)"), str(past)


def test_a_verdicts_line_names_its_layer_from_layer_0_and_a_dash_for_none():
    from ced.v41.gate import Verdict

    def line(layer):
        return Verdict(file="f.h5", pass_="teacher forced", layer=layer, kind="attn_x", ok=True, failure="", where="",
                       max_ulp16=0.0, bitwise=1.0, budget="bf16").line()

    assert line(0).split()[:6] == ["ok", "f.h5", "teacher", "forced", "layer", "0"], line(0)
    assert line(5).split()[:6] == ["ok", "f.h5", "teacher", "forced", "layer", "5"], line(5)
    assert line(-1).split()[:6] == ["ok", "f.h5", "teacher", "forced", "-", "attn_x"], line(-1)


def _official_margin(file):
    """The official last row's top-1/top-2 margin as a fraction of its largest |logit| (what top1_margin bounds)."""
    r = np.asarray(v41.read_golden(golden(file)).result["logits"][-1], np.float64)
    top2 = np.sort(r)[-2:]
    return float(top2[1] - top2[0]) / float(np.max(np.abs(r)))


def test_the_top1_margin_is_measured_on_the_official_logits_not_the_engines(checkpoints):
    """FlipTop1 leaves its own top-1/top-2 margin at 1e-3 (far below any bound) while the official margin is what it
    is: with the bound at half the official margin the flip is not a near-tie and must fail; measuring the margin on
    the engine's logits would excuse it. The same bound at twice the official margin excuses it."""
    file = "tiny-fp8-n17.h5"
    m = _official_margin(file)
    assert m > 0
    strict = v41.gate(FlipTop1(v41.ReferenceEngine()), [golden(file)], checkpoints=checkpoints,
                      policy=v41.Policy(top1_margin=m / 2), quiet=True)
    f = strict.first_failure
    assert f is not None and f.kind == "top-1 (last row)", str(strict)
    assert f"= {m:.3g} of max |logit|" in f.failure, f.failure  # the official's margin, printed
    loose = v41.gate(FlipTop1(v41.ReferenceEngine()), [golden(file)], checkpoints=checkpoints,
                     policy=v41.Policy(top1_margin=2 * m), quiet=True)
    assert loose.passed and any(f"({m:.3g} of max |logit|)" in n for n in loose.near_ties), str(loose)


def test_a_gate_given_no_golden_file_judges_nothing_and_does_not_pass(tmp_path, checkpoints):
    """Zero files judged is no verdict: an empty list, and a folder that holds no golden file of the regime."""
    for given in ([], tmp_path):
        rep = v41.gate(v41.ReferenceEngine(), given, checkpoints=checkpoints, quiet=True)
        assert rep.files == [] and rep.verdicts == [] and not rep.passed and not rep, str(rep)
        assert "nothing was judged" in rep.summary()


# A NaN or an infinity is never within a budget and never a near-tie (STYLE: special values are never excused).
# The values are judged by the C++ judge (_core.v41_judge_values: any NaN or one-sided infinity fails before a
# budget) and, for the last row's top-1, by the gate itself.
NONFINITE = ["nan", "inf"]


def _planted(logits, row, col, value):
    logits = np.array(logits, dtype=np.float64)
    logits[row, col] = float(value)
    return logits


class SpecialInBlock(LayerOnly):
    """Layer 0's output streams with one element NaN or infinite."""

    def __init__(self, inner, value):
        super().__init__(inner)
        self.value = value

    def layer(self, layer, streams, pre_mix, tokens, shared):
        o = self.inner.layer(layer, streams, pre_mix, tokens, shared)
        if layer != 0:
            return o
        out = np.array(o.out, dtype=np.float64)
        out[0, 0, 0] = float(self.value)
        return {"out": out, "ffn_pre": o.ffn_pre}


@pytest.mark.parametrize("value", NONFINITE)
def test_a_nan_or_inf_in_a_teacher_forced_tensor_fails_it(value, checkpoints):
    rep = v41.gate(SpecialInBlock(v41.ReferenceEngine(), value), [golden("tiny-fp8-n5.h5")], checkpoints=checkpoints,
                   quiet=True)
    f = rep.first_failure
    assert f is not None and (f.pass_, f.layer, f.kind) == ("teacher forced", 0, "out"), str(rep)
    assert f"ours {value} official" in f.failure + f.where, f.line()  # the element named, its value shown


class SpecialInPrefill(PrefillOnly):
    """The prefill's logits with one value NaN or infinite, at (row, the official runner-up's column of that row)."""

    def __init__(self, inner, value, row):
        super().__init__(inner)
        self.value, self.row = value, row

    def prefill(self, tokens):
        p = self.inner.prefill(tokens)
        col = int(np.argsort(np.asarray(p.logits)[self.row])[-2])
        return v41.Prefill(logits=_planted(p.logits, self.row, col, self.value), first_row=p.first_row)


@pytest.mark.parametrize("value", NONFINITE)
def test_a_nan_or_inf_in_the_end_to_end_logits_fails_them(value, checkpoints):
    rep = v41.gate(SpecialInPrefill(v41.ReferenceEngine(), value, 0), [golden("tiny-fp8-n5.h5")],
                   checkpoints=checkpoints, quiet=True)
    bad = [v for v in rep.failures if v.kind == "logits (end to end)"]
    assert bad and f"ours {value} official" in bad[0].failure, str(rep)
    assert not rep.passed


@pytest.mark.parametrize("value", NONFINITE)
def test_a_nan_or_inf_in_the_last_row_is_no_top1_near_tie(value, checkpoints):
    """The planted value sits at the official runner-up's column, so np.argmax picks it (a NaN, or +inf) as the
    top-1: a flip that a margin bound of 1 (every finite flip excused) would wave through as a near-tie."""
    rep = v41.gate(SpecialInPrefill(v41.ReferenceEngine(), value, -1), [golden("tiny-fp8-n5.h5")],
                   checkpoints=checkpoints, policy=v41.Policy(top1_margin=1.0), quiet=True)
    top1 = [v for v in rep.verdicts if v.kind == "top-1 (last row)"]
    assert len(top1) == 1 and not top1[0].ok, str(rep)
    assert value in top1[0].failure.lower() and not rep.near_ties, top1[0].line()
    assert not rep.passed


class SpecialInDecode(PrefillOnly):
    """Decodes as the reference does, the third step's logits with one value NaN or infinite."""
    capabilities = frozenset({"prefill", "decode"})

    def __init__(self, inner, value):
        super().__init__(inner)
        self.value, self.step = value, 0

    def prefill(self, tokens):
        self.step = 0
        return self.inner.prefill(tokens)

    def decode(self, token):
        self.step += 1
        logits = np.asarray(self.inner.decode(token), np.float64)
        return _planted(logits[None, :], 0, 0, self.value)[0] if self.step == 3 else logits


@pytest.mark.parametrize("value", NONFINITE)
def test_a_nan_or_inf_in_a_decode_steps_logits_fails_that_step(value, checkpoints):
    rep = v41.gate(SpecialInDecode(v41.ReferenceEngine(), value), [golden("tiny-fp8-n13-d8.h5")],
                   checkpoints=checkpoints, quiet=True)
    steps = [v for v in rep.verdicts if v.kind == "decode logits (end to end)"]
    assert len(steps) >= 3 and [v.ok for v in steps[:3]] == [True, True, False], str(rep)
    assert f"ours {value} official" in steps[2].failure and not rep.passed, str(rep)


class Rerouted(v41.ReferenceEngine):
    """A port whose router changes what the reference's chose, at one layer and row: `swap` replaces the first
    expert with one outside the selection; `scale` multiplies that row's first route weight."""

    def __init__(self, regime="release", layer=2, row=5, swap=False, scale=1.0):
        super().__init__(regime)
        self.at, self.row, self.swap, self.scale = layer, row, swap, scale

    def moe(self, layer, x):
        m = super().moe(layer, x)
        if layer != self.at:
            return m
        experts, weights = np.array(m["experts"]), np.array(m["expert_weights"], dtype=np.float64)
        if self.swap:
            chosen = set(experts[self.row].tolist())
            experts[self.row, 0] = min(e for e in range(64) if e not in chosen)
            experts[self.row] = np.sort(experts[self.row])
        weights[self.row, 0] *= self.scale
        return {**m, "experts": experts, "expert_weights": weights}


def test_the_router_is_judged_by_derived_bounds_a_far_swap_and_a_heavy_weight_fail_a_rounding_passes(checkpoints):
    files = [golden("tiny-fp8-n17.h5")]
    ok = v41.gate(Rerouted(scale=1 + 2.0 ** -22), files, checkpoints=checkpoints, quiet=True)
    assert ok.passed, str(ok)  # one fp32 rounding of a weight: some legitimate order's result
    kinds = {(v.kind, v.budget.startswith("derived bounds")) for v in ok.verdicts}
    assert ("experts (forced x)", True) in kinds and ("expert_weights (forced x)", True) in kinds
    heavy = v41.gate(Rerouted(scale=1.01), files, checkpoints=checkpoints, quiet=True)
    f = heavy.first_failure
    assert (f.layer, f.kind) == (2, "expert_weights (forced x)"), str(heavy)
    assert "outside their admissible interval" in f.failure
    swapped = v41.gate(Rerouted(swap=True), files, checkpoints=checkpoints, quiet=True)
    f = swapped.first_failure
    assert f is not None and (f.layer, f.kind) == (2, "experts (forced x)"), str(swapped)
    assert "row 5" in f.failure, f.failure


def test_the_head_on_the_final_collapse_is_judged_by_derived_bounds(checkpoints):
    class Tilted(v41.ReferenceEngine):
        def head(self, collapsed):
            logits = np.array(super().head(collapsed))
            logits[-1, 3] *= 1.01
            return logits

    files = [golden("tiny-fp8-n17.h5")]
    ok = v41.gate(v41.ReferenceEngine(), files, checkpoints=checkpoints, quiet=True)
    head = [v for v in ok.verdicts if v.kind == "logits (forced collapsed)"]
    assert head and head[0].ok and head[0].budget.startswith("derived bounds"), head
    bad = v41.gate(Tilted(), files, checkpoints=checkpoints, quiet=True)
    assert any(v.kind == "logits (forced collapsed)" and not v.ok and "outside their admissible interval" in v.failure
               for v in bad.verdicts), str(bad)


class OpOff:
    """The reference with one output of one attention op moved by 5 % at one element of layer 1 (about 13 of its
    bf16 steps): sparse_attn's (op "sparse_attn") or the output projection's (op "attention_output")."""

    def __init__(self, inner, op):
        self.inner, self.op = inner, op
        self.name = f"{inner.name} with {op} off"

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _off(self, op, layer, x):
        x = np.array(x, dtype=np.float64)
        if op == self.op and layer == 1:
            x.flat[7] = x.flat[7] * 1.05 if x.flat[7] != 0 else 1.0
        return x

    def sparse_attn(self, layer, q, kv, idx):
        return self._off("sparse_attn", layer, self.inner.sparse_attn(layer, q, kv, idx))

    def attention_output(self, layer, o):
        return self._off("attention_output", layer, self.inner.attention_output(layer, o))


@pytest.mark.parametrize("op,kind", [("sparse_attn", "attn_o (forced q, kv, idx)"),
                                     ("attention_output", "attn_out (forced o)")])
def test_an_attention_op_off_fails_at_its_op_by_the_c_gates_bounds(op, kind, checkpoints):
    rep = v41.gate(OpOff(v41.ReferenceEngine(), op), [golden("tiny-fp8-n17.h5")], checkpoints=checkpoints, quiet=True)
    f = rep.first_failure
    assert f is not None and (f.layer, f.kind) == (1, kind), str(rep)
    assert f.budget.startswith("derived bounds") and "outside their admissible interval" in f.failure, f.line()


class NoOps(OpOff):
    """The reference without the ``ops`` capability: its attention is judged whole, by its budget."""
    capabilities = v41.ReferenceEngine.capabilities - {"ops"}

    def __init__(self, inner):
        super().__init__(inner, "")


def test_an_engine_without_ops_has_its_attention_judged_whole_by_the_budget(checkpoints):
    rep = v41.gate(NoOps(v41.ReferenceEngine()), [golden("tiny-fp8-n17.h5")], checkpoints=checkpoints, quiet=True)
    assert rep.passed, str(rep)
    kinds = {v.kind: v.budget for v in rep.verdicts if v.pass_ == "teacher forced"}
    assert "attn_out (forced x)" in kinds and not kinds["attn_out (forced x)"].startswith("derived bounds"), kinds
    assert "attn_out (forced o)" not in kinds and "attn_q (forced x)" in kinds
