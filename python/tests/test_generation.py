"""The generation-level verdicts of docs/spec.md §8.7 from Python (ced._core, the C++
functions `ced diff` uses): each shown failing on a planted difference."""
import numpy as np
import pytest

import ced
from ced import _core

V = 12


def logits(rows, seed=0):
    return np.random.default_rng(seed).normal(size=(rows, V))


def test_kl_distribution_names_the_one_perturbed_row_at_p99_and_is_zero_without_it():
    ref = logits(50)
    same = _core.kl_distribution(ref, ref.copy())
    assert same["count"] == 50 and same["max"] == 0.0 and same["p99"] == 0.0
    planted = ref.copy()
    planted[31, 4] += 3.0
    d = _core.kl_distribution(ref, planted)
    # nearest rank: p99 of 50 rows is rank 50, the largest; p50 is rank 25, a zero
    assert d["p99"] > 1e-3 and d["p99_row"] == 31 and d["max_row"] == 31
    assert d["p50"] == 0.0 and d["quantile_rule"] == "nearest-rank"
    assert d["mean"] == pytest.approx(d["max"] / 50)


def test_kl_distribution_is_kl_of_ref_against_test_in_that_order():
    ref, test = logits(1, 1), logits(1, 2)
    p, q = np.exp(ref - ref.max()), np.exp(test - test.max())
    p, q = p / p.sum(), q / q.sum()
    assert _core.kl_distribution(ref, test)["max"] == pytest.approx(float((p * np.log(p / q)).sum()), rel=1e-12)


def test_kl_distribution_refuses_arrays_that_are_not_matching_2d():
    with pytest.raises(ced.InputError, match="2-D"):
        _core.kl_distribution(np.zeros(V), np.zeros(V))
    with pytest.raises(ced.InputError, match=r"\[2, 12\]"):
        _core.kl_distribution(logits(2), logits(3))


def ranked(order):
    """One step whose ranking is `order` (first = top-1): logits 10, 9, 8, ..."""
    row = np.zeros(V)
    for i, tok in enumerate(order):
        row[tok] = 10.0 - i
    return row


def test_greedy_divergence_passes_identical_sequences_with_step_minus_one():
    lg = logits(6)
    toks = lg.argmax(axis=1)
    g = _core.greedy_divergence(toks, lg, toks, lg, 5)
    assert g["passed"] and g["step"] == -1 and g["steps"] == 6


def test_greedy_divergence_fails_a_token_outside_the_others_top_n_and_reports_step_and_margins():
    a = np.stack([ranked([4, 1]), ranked([7, 2])])
    b_inside = np.stack([ranked([4, 1]), ranked([2, 7])])         # a's 7 is b's 2nd
    b_outside = np.stack([ranked([4, 1]), ranked([2, 0, 1, 3, 5, 6, 7])])  # a's 7 is b's 7th
    ta, tb = np.array([4, 7]), np.array([4, 2])
    ok = _core.greedy_divergence(ta, a, tb, b_inside, 5)
    assert ok["passed"] and ok["step"] == 1 and (ok["token_a"], ok["token_b"]) == (7, 2)
    assert (ok["rank_a_in_b"], ok["rank_b_in_a"]) == (2, 2)
    assert (ok["gap_a"], ok["gap_b"], ok["top2_margin_a"], ok["top2_margin_b"]) == (1.0, 1.0, 1.0, 1.0)
    bad = _core.greedy_divergence(ta, a, tb, b_outside, 5)
    assert not bad["passed"] and bad["step"] == 1 and bad["rank_a_in_b"] == 7 and bad["gap_b"] == 6.0
    assert _core.greedy_divergence(ta, a, tb, b_outside, top_n=7)["passed"]


def test_greedy_divergence_refuses_malformed_input():
    lg = logits(2)
    with pytest.raises(ced.InputError, match="top_n"):
        _core.greedy_divergence([0, 1], lg, [0, 1], lg, 0)
    with pytest.raises(ced.InputError, match="outside"):
        _core.greedy_divergence([0, V], lg, [0, 1], lg, 5)
    with pytest.raises(ced.InputError, match="integer"):
        _core.greedy_divergence(np.array([0.0, 1.5]), lg, [0, 1], lg, 5)
    with pytest.raises(ced.InputError, match="steps"):
        _core.greedy_divergence([0], lg[:1], [0, 1], lg, 5)


def test_greedy_agreement_counts_exact_agreement_and_the_shared_prefix():
    g = _core.greedy_agreement([(np.array([1, 2, 3]), np.array([1, 2, 3])),
                                ([1, 2, 3], [1, 9, 3]),       # a planted divergence at step 1
                                ([5, 6], [5, 6, 7])])         # a prefix is not agreement
    assert g["prompts"] == 3 and g["agreeing"] == 1 and g["first_disagreeing"] == 1
    assert g["rate"] == pytest.approx(1 / 3) and g["mean_prefix"] == pytest.approx((3 + 1 + 2) / 3)
    assert _core.greedy_agreement([([1], [1])])["rate"] == 1.0
    with pytest.raises(ced.InputError, match="not a pair"):
        _core.greedy_agreement([([1], [1], [1])])
