"""``ced.v41.generation``: free-running greedy decode on the port against the reference (docs/v41-ports.md).

Each prompt is prefilled and decoded greedily for ``steps`` steps on both sides, each side feeding its own
choices. vLLM's rule judges a divergence: at the first step where the tokens differ, each side's token must be
in the other's top-N (the step and both margins reported). Over the prompts: the exact-agreement rate, and the
per-position KL(reference || engine) distribution (mean, p99, p99.9, max) over the steps both sides saw the
same context. The statistics are the harness's C++ ones (compare/generation.hpp), as ``ced diff`` prints them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .. import _core
from .engine import as_array, capabilities_of, prefill_of
from .golden import config_checkpoint
from .reference import ReferenceEngine


@dataclass
class GenerationReport:
    engine: str
    prompts: int
    steps: int
    top_n: int
    divergences: list = field(default_factory=list)  # per prompt: the greedy rule's dict
    agreement: dict = field(default_factory=dict)     # exact-agreement rate, mean agreeing prefix
    kl: dict = field(default_factory=dict)            # the per-position KL distribution
    kl_bound: Optional[tuple] = None                  # (quantile key, bound) the policy gates, or None
    not_supported: str = ""
    special: list = field(default_factory=list)       # "prompt P step S: ..." where the engine's logits are not finite
    names: list = field(default_factory=list)         # each prompt's: "seeded S" or a stress prompt's name

    @property
    def failures(self) -> list:
        bad = [f"prompt {self._name(i)}: {_divergence(d)}" for i, d in enumerate(self.divergences) if not d["passed"]]
        bad += self.special
        if self.kl_bound and self.kl and self.kl[self.kl_bound[0]] > self.kl_bound[1]:
            bad.append(f"KL {self.kl_bound[0]} {self.kl[self.kl_bound[0]]:.3g} > {self.kl_bound[1]:.3g}")
        return bad

    def _name(self, i: int) -> str:
        return f"{i} ({self.names[i]})" if i < len(self.names) else str(i)

    @property
    def passed(self) -> bool:
        return not self.not_supported and bool(self.divergences) and not self.failures

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        if self.not_supported:
            return f"not supported: {self.engine}: {self.not_supported}"
        lines = []
        for i, d in enumerate(self.divergences):
            lines.append(f"prompt {self._name(i)}: " + ("the same tokens at every step" if d["step"] < 0 else _divergence(d)))
        k = self.kl
        lines.append(f"greedy exact agreement {self.agreement['rate']:.3f} of {self.prompts} prompts, mean agreeing "
                     f"prefix {self.agreement['mean_prefix']:.2f} of {self.steps} steps")
        if k:
            lines.append(f"KL(reference || engine) per position over {k['count']} positions: mean {k['mean']:.3g}, "
                         f"p99 {k['p99']:.3g}, p99.9 {k['p999']:.3g}, max {k['max']:.3g} "
                         f"(position {k['max_row']} of those)")
        verdict = "PASS" if self.passed else "FAIL: " + "; ".join(self.failures)
        return "\n".join(lines + [f"{verdict} ({self.engine}, vLLM's rule with top-{self.top_n})"])


def _divergence(d: dict) -> str:
    """The greedy rule's finding at the first divergent step, in words (a: the reference, b: the engine)."""
    return (f"first divergent step {d['step']}: reference {d['token_a']} (rank {d['rank_a_in_b']} on the engine), "
            f"engine {d['token_b']} (rank {d['rank_b_in_a']} on the reference); logit gaps {d['gap_a']:.4g} / "
            f"{d['gap_b']:.4g}, top-1/top-2 margins {d['top2_margin_a']:.4g} / {d['top2_margin_b']:.4g}: "
            f"{'within' if d['passed'] else 'outside'} the top-{d['top_n']}")


def _greedy(engine: Any, prompt: np.ndarray, steps: int) -> tuple[list, list]:
    logits = [prefill_of(engine.prefill(prompt), len(prompt)).logits[-1]]
    tokens = [int(np.argmax(logits[-1]))]
    for _ in range(steps - 1):
        logits.append(as_array(engine.decode(tokens[-1])).reshape(-1))
        tokens.append(int(np.argmax(logits[-1])))
    return tokens, logits


def generation(engine: Any, config: str = "v41-tiny", prompts: int = 4, prompt_len: int = 16, steps: int = 8,
               top_n: int = 5, weight_seed: int = 0, checkpoint: Optional[str] = None,
               kl_bound: Optional[tuple] = None, quiet: bool = False, stress: bool = True) -> GenerationReport:
    """Free-running greedy decode of ``prompts`` seeded prompts of ``prompt_len`` tokens, ``steps`` tokens each, on
    the engine and on the reference (in the engine's regime), judged by vLLM's rule with ``top_n``; ``kl_bound``,
    e.g. ``("p99", 0.05)``, also gates a quantile of the per-position KL. With ``stress`` (the default) the prompts
    that make ties likely follow the seeded ones (docs/v41.md §13.12: a token repeated, two alternating, a period of
    the compress ratio and of the window, each of ``prompt_len`` tokens, and one token), named in the report."""
    if prompts < 1 or steps < 1 or prompt_len < 1:
        raise ValueError(f"generation: prompts {prompts}, steps {steps}, prompt_len {prompt_len}: each must be at "
                         f"least 1 (nothing judged is no verdict)")
    name = getattr(engine, "name", type(engine).__name__)
    rep = GenerationReport(engine=name, prompts=prompts, steps=steps, top_n=top_n, kl_bound=kl_bound)
    rep.names = [f"seeded {1000 + p}" for p in range(prompts)]
    if not {"prefill", "decode"} <= capabilities_of(engine):
        rep.not_supported = "free-running decode needs the capabilities 'prefill' and 'decode'"
        if not quiet:
            print(rep)
        return rep
    folder = config_checkpoint(config, checkpoint, weight_seed, "generation")
    engine.load(str(folder))
    reference = ReferenceEngine(getattr(engine, "regime", "release"))
    reference.load(str(folder))
    pairs, ref_rows, eng_rows = [], [], []
    prompt_set = [_core.v41_tokens(str(folder), prompt_len, 1000 + p) for p in range(prompts)]
    if stress:
        for stress_name, ids, _ in _core.v41_stress_prompts(str(folder), prompt_len):
            prompt_set.append(np.asarray(ids))
            rep.names.append(stress_name)
    rep.prompts = len(prompt_set)
    for p, prompt in enumerate(prompt_set):
        ta, la = _greedy(reference, prompt, steps)
        tb, lb = _greedy(engine, prompt, steps)
        for s, row in enumerate(lb):  # at any step, shared context or not: the rule and the KL see only some
            bad = np.flatnonzero(~np.isfinite(row))
            if bad.size:
                rep.special.append(f"prompt {p} step {s}: {bad.size} of the engine's logits are NaN or infinite, "
                                   f"the first {float(row[bad[0]])!r} at token {int(bad[0])}")
        d = dict(_core.greedy_divergence(np.array(ta), np.array(la), np.array(tb), np.array(lb), top_n))
        rep.divergences.append(d)
        pairs.append((np.array(ta), np.array(tb)))
        same = steps if d["step"] < 0 else d["step"] + 1  # the steps whose context both sides shared
        ref_rows += la[:same]
        eng_rows += lb[:same]
    rep.agreement = dict(_core.greedy_agreement(pairs))
    rep.kl = dict(_core.kl_distribution(np.array(ref_rows), np.array(eng_rows)))
    if not quiet:
        print(rep)
    return rep
