"""``ced.v41.check``: the CED property suite (docs/v41.md §13.9) run on a port, each property's verdict named.

Each property compares the engine with itself: a CED prefill, a decode step after it or a resumed prompt
against the full prefill of the same prompt, where the release's exactness makes them equal. A port that
declares ``batch_invariant`` is judged bitwise (the reference is: the rows a layer computes do not depend on
how many it runs); any other under the policy's stated bound. A property that needs a capability the engine
lacks is *not supported*.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from .. import _core
from .engine import NotSupported, as_array, capabilities_of, prefill_of
from .golden import config_checkpoint


@dataclass
class CheckPolicy:
    """How a port that is not batch invariant is judged: two logits rows agree when their largest difference is
    at most ``rel`` of the larger row's largest |logit| and their top-1 agree. One rounding flip grows through
    these random checkpoints to up to 35 % of the logits' scale (docs/v41.md §9.4), so without batch invariance a
    property can only be held to that: the bitwise verdict is the one that catches a replay off by one row."""
    rel: float = 0.35


@dataclass
class Property:
    name: str
    verdict: str        # "pass" | "FAIL" | "not supported"
    detail: str

    def line(self) -> str:
        return f"{self.verdict:<13} {self.name}: {self.detail}"


@dataclass
class CheckReport:
    engine: str
    properties: list = field(default_factory=list)

    @property
    def failures(self) -> list:
        return [p for p in self.properties if p.verdict == "FAIL"]

    @property
    def passed(self) -> bool:
        return not self.failures and any(p.verdict == "pass" for p in self.properties)

    def __bool__(self) -> bool:
        return self.passed

    def verdict(self, name: str) -> str:
        return next(p.verdict for p in self.properties if p.name == name)

    def __str__(self) -> str:
        n = len(self.properties)
        head = (f"{'PASS' if self.passed else 'FAIL'}: {self.engine}: {n - len(self.failures)} of {n} properties "
                f"hold or are not supported, {len(self.failures)} fail")
        return "\n".join([p.line() for p in self.properties] + [head])


def _same(a: np.ndarray, b: np.ndarray, bitwise: bool, policy: CheckPolicy, what: str) -> str:
    """"" when the rows agree (bitwise, or under the policy), else where and by how much they do not."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape:
        return f"{what}: shapes {a.shape} and {b.shape}"
    nan = np.argwhere(np.isnan(a) | np.isnan(b))
    if nan.size:  # NaN agrees with nothing, itself included: the same NaN bits on both sides are no pass
        r, c = nan[0]
        return f"{what}: {len(nan)} values are NaN, the first at row {r} column {c} ({a[r, c]:.9g} vs {b[r, c]:.9g})"
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    if bitwise:
        if np.array_equal(a.view(np.uint32), b.view(np.uint32)):
            return ""
        r, c = np.unravel_index(int(np.nanargmax(np.where(np.isnan(diff), np.inf, diff))), diff.shape)
        return (f"{what}: not bitwise: {int(np.sum(a.view(np.uint32) != b.view(np.uint32)))} values differ, "
                f"the largest at row {r} column {c} ({a[r, c]:.9g} vs {b[r, c]:.9g})")
    for r in range(a.shape[0]):
        scale = max(np.max(np.abs(a[r])), np.max(np.abs(b[r])))
        if not np.all(np.isfinite(diff[r])) or np.max(diff[r]) > policy.rel * scale:
            return f"{what}: row {r} differs by {np.max(diff[r]):.4g} > {policy.rel} of {scale:.4g}"
        if np.argmax(a[r]) != np.argmax(b[r]):
            return f"{what}: row {r} top-1 {np.argmax(a[r])} vs {np.argmax(b[r])}"
    return ""


def _rows(p: Any, first: int, n: int) -> np.ndarray:
    """Rows first .. first + n - 1 of a prefill (:func:`prefill_of`'s)."""
    lo = first - p.first_row
    if lo < 0:
        raise NotSupported(f"the prefill returned rows from {p.first_row}; the property needs row {first}")
    return p.logits[lo:lo + n]


def _common(p: Any, q: Any) -> tuple:
    """The rows two prefills of one prompt both returned, from each (row i of one is row i of the other)."""
    first = max(p.first_row, q.first_row)
    last = min(p.first_row + p.logits.shape[0], q.first_row + q.logits.shape[0])
    if last <= first:
        raise NotSupported("the two prefills returned no row in common")
    return _rows(p, first, last - first), _rows(q, first, last - first)


def check(engine: Any, config: str = "v41-tiny", weight_seed: int = 0, token_seed: int = 0, n: int = 100,
          checkpoint: Optional[str] = None, policy: Optional[CheckPolicy] = None, quiet: bool = False) -> CheckReport:
    """Runs the CED properties on ``engine`` (its ``convention`` and ``encoder_replay`` name its replay rules)
    over a prompt of ``n`` tokens on ``config``'s checkpoint (exported into ``checkpoint``, a folder, or a
    temporary one), and prints the report unless ``quiet``. ``n`` must be past the convention's spans."""
    policy = policy or CheckPolicy()
    caps = capabilities_of(engine)
    bitwise = "batch_invariant" in caps
    conv = getattr(engine, "convention", None)
    rule = getattr(engine, "encoder_replay", None)
    folder = config_checkpoint(config, checkpoint, weight_seed, "check")
    spans = _core.v41_spans(str(folder), conv, 0) if conv else None
    if spans and n < spans["exact"]:
        raise ValueError(f"n = {n} is below the {conv} convention's exact span {spans['exact']} on {config}")
    engine.load(str(folder))
    plan = _core.v41_plan(str(folder))
    W = plan["W"]
    tokens = _core.v41_tokens(str(folder), n + 1, token_seed)
    prompt, step = tokens[:n], int(tokens[n])
    report = CheckReport(engine=getattr(engine, "name", type(engine).__name__))
    cache: dict = {}

    def full(k: int = n) -> Any:
        if k not in cache:
            cache[k] = prefill_of(engine.prefill(prompt[:k]), k)
        return cache[k]

    def ced(replay: int, k: int = n) -> Any:
        return prefill_of(engine.prefill_ced(prompt[:k], replay), k)

    def prop(name: str, needs: tuple, body: Callable[[], str]) -> None:
        missing = [c for c in needs if c not in caps]
        if missing:
            report.properties.append(Property(name, "not supported", f"the engine does not declare {missing}"))
            return
        try:
            why = body()
        except NotSupported as e:
            report.properties.append(Property(name, "not supported", str(e)))
            return
        judged = "bitwise" if bitwise else f"within {policy.rel} of the logits' scale, top-1 equal"
        report.properties.append(Property(name, "FAIL" if why else "pass", why or judged))

    prop("a prefix's prefill is the prompt's first rows", ("prefill",),
         lambda: _same(_rows(full(n // 2), n // 2 - 1, 1), _rows(full(), n // 2 - 1, 1), bitwise, policy,
                       f"row {n // 2 - 1}"))
    prop("every row replayed is the prefill", ("ced",),
         lambda: _same(*_common(ced(n), full()), bitwise, policy, "the rows both returned"))
    prop("a bounded replay of a prompt within the window is the prefill", ("ced",),
         lambda: _same(_rows(ced(W, W), W - 1, 1), _rows(full(W), W - 1, 1), bitwise,
                       policy, f"last row of {W}"))
    if spans:
        prop(f"the exact span ({spans['exact']} rows, {conv}) is the prefill", ("ced",),
             lambda: _same(_rows(ced(spans["exact"]), n - 1, 1), _rows(full(), n - 1, 1),
                           bitwise, policy, "last row"))

        def decode_after_ced() -> str:
            engine.prefill_ced(prompt, spans["decode"])
            after_ced = as_array(engine.decode(step)).reshape(1, -1)
            engine.prefill(prompt)
            after_full = as_array(engine.decode(step)).reshape(1, -1)
            return _same(after_ced, after_full, bitwise, policy, f"the step after a ced prefill of {spans['decode']}")
        prop(f"a decode step after a ced prefill of the decode span ({spans['decode']}) is the prefill's",
             ("ced", "decode"), decode_after_ced)
    else:
        for name in ("the exact span is the prefill", "a decode step after a ced prefill of the decode span is the "
                     "prefill's"):
            report.properties.append(Property(name, "not supported", "the engine names no replay convention"))
    if rule:
        prop(f"a resume after a hit of W = {W} tokens ({rule}) is the cold run", ("resume",),
             lambda: _same(_rows(prefill_of(engine.resume(prompt, W), n), n - 1, 1), _rows(full(), n - 1, 1),
                           bitwise, policy, "last row"))
    else:
        report.properties.append(Property("a resume after a hit of W tokens is the cold run", "not supported",
                                          "the engine names no encoder-replay rule"))
    if not quiet:
        print(report)
    return report
