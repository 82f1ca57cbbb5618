"""``ced.v41.gate``: an engine against DeepSeek's official code, layer by layer and end to end (docs/v41-ports.md).

Teacher forced where the engine can (capability ``layer``): every block is fed the official run's input
streams, ``pre_mix``, tokens and what the official layers below it published, so one rounding flip stays in
its layer; with ``sublayers`` each sublayer is also fed the official's own input, with ``ops`` sparse_attn and
the output projection too. The engine's answers are judged by the project's C++ judge, the one its own gate
against the official code uses: every tensor against the results some legitimate order of evaluation could
give from the official's input to its op (docs/sound-bounds.md), every selection against its score intervals.
End to end always: the logits, the top-1 with a near-tie excuse, and (with ``selections``) the first layer
whose selection or expert choice differs.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import numpy as np

from .. import _core
from .engine import NotSupported, Shared, as_array, capabilities_of, layer_out_of, prefill_of
from .golden import GoldenRun, checkpoint_for, golden_files, read_golden
from .loaded import checkpoint_digests, compare_digests
from .record import Recorder
from .reference import ReferenceEngine


@dataclass
class Policy:
    """The bounds the gate adds to the per-kind budgets, each with its reason.

    ``tie_ulps``: (a blocks-only engine's selections; with ``sublayers`` the score intervals judge) a selection
    row that differs is a near-tie, excused and named, when every position only one
    side selected scores within this many bf16 spacings of the row's boundary score under the reference
    (release index scores are bf16 values: two positions a spacing apart swap on a one-ulp flip of a query).
    ``top1_margin``: an end-to-end top-1 flip at the last row is excused when the official top-1/top-2 margin is
    below this fraction of the row's largest |logit| (on these random checkpoints one-ulp flips grow to up to
    35 % of the logits' scale end to end: the logits budget's own bound).
    """
    tie_ulps: float = 2.0
    top1_margin: float = 0.35


@dataclass
class Verdict:
    """One judged tensor (or an excused near-tie): where, how far, and against which budget."""
    file: str
    pass_: str          # "teacher forced" | "end to end" | "decode e2e"
    layer: int          # -1: not a layer's
    kind: str
    ok: bool
    failure: str        # why not, with the budget's reason; "" when ok
    where: str          # the element, row and position of the largest difference
    max_ulp16: float
    bitwise: float
    budget: str
    notes: list = field(default_factory=list)   # rows that differ; near-ties excused, with their scores

    def line(self) -> str:
        at = f"layer {self.layer}" if self.layer >= 0 else "-"
        status = "FAIL" if not self.ok else "info" if self.budget.startswith("reported") else "ok  "
        head = f"{status} {self.file} {self.pass_:<14} {at:<9} {self.kind:<28}"
        tail = f" bitwise {self.bitwise:.4f}, max {self.max_ulp16:.3g} bf16 ulps"
        return head + tail + ("" if self.ok else f": {self.failure} at {self.where}")


@dataclass
class GateReport:
    """What :func:`gate` found. ``passed`` only when something was judged and nothing failed."""
    engine: str
    files: list
    verdicts: list
    not_supported: list     # "what: why" for every check the engine could not take

    @property
    def failures(self) -> list:
        return [v for v in self.verdicts if not v.ok]

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and not self.failures

    def __bool__(self) -> bool:
        return self.passed

    @property
    def first_failure(self) -> Optional[Verdict]:
        return self.failures[0] if self.failures else None

    def first_divergent_layer(self, file: Optional[str] = None) -> int:
        """The first layer with a failing tensor under teacher forcing (-1: none)."""
        ls = [v.layer for v in self.failures if v.pass_ == "teacher forced" and v.layer >= 0
              and (file is None or v.file == file)]
        return min(ls) if ls else -1

    @property
    def near_ties(self) -> list:
        return [n for v in self.verdicts for n in v.notes if n.startswith("near-tie")]

    def summary(self) -> str:
        f = self.first_failure
        head = (f"{'PASS' if self.passed else 'FAIL'}: {self.engine}: {len(self.verdicts)} tensors judged over "
                f"{len(self.files)} golden files, {len(self.failures)} failed, {len(self.near_ties)} near-ties "
                f"excused, {len(self.not_supported)} not supported")
        if f is not None:
            head += (f"\nfirst failure: {f.file} {f.pass_} layer {f.layer} {f.kind}: {f.failure} at {f.where}"
                     f"\nfirst divergent layer (teacher forced): {self.first_divergent_layer(f.file)}")
        elif not self.verdicts:
            head += "\nnothing was judged"
        return head

    def __str__(self) -> str:
        lines = [v.line() for v in self.verdicts]
        lines += [f"near-tie: {n}" for n in self.near_ties]
        lines += [f"not supported: {n}" for n in self.not_supported]
        return "\n".join(lines + [self.summary()])


def _placed(where: str, shape: tuple) -> str:
    """The judge's flat element index ("layer 3[1234] ours ...") as its position and index within the row."""
    m = re.search(r"\[(\d+)\]", where)
    if not m or not shape or int(m.group(1)) >= int(np.prod(shape)):
        return where
    idx = [int(i) for i in np.unravel_index(int(m.group(1)), shape)]
    inner = "" if len(idx) == 1 else f", column {idx[1]}" if len(idx) == 2 else f", index {tuple(idx[1:])}"
    return where[:m.start()] + f" position {idx[0]}{inner}:" + where[m.end():]


def _official_input(run: GoldenRun, plan: dict, layers: list, l: int):
    c = layers[l]
    return c["engram_in"] if plan["layers"][l]["engram"] else c["in"]


def _shared_below(plan: dict, layers: list, l: int) -> Shared:
    """What the official layers below ``l`` published (the latest of each kind)."""
    s = Shared()
    for k in range(l):
        lp, c = plan["layers"][k], layers[k]
        if lp["owns_compressor"] and c["compress_kv"] is not None:
            s.compress_kv, s.ratio = c["compress_kv"], lp["ratio"]
        if lp["owns_index_k"] and c["index_k"] is not None:
            s.index_k = c["index_k"]
        if lp["owns_indexer"] and c["topk_idxs"] is not None:
            s.topk_idxs = c["topk_idxs"]
        if lp["candidate_source"] and c["candidates"] is not None:
            s.candidates = c["candidates"]
    return s


class _Judge:
    """Collects verdicts for one golden file."""

    def __init__(self, run: GoldenRun, policy: Policy, reference: ReferenceEngine):
        self.run, self.policy, self.reference = run, policy, reference
        self.verdicts: list = []
        self.not_supported: list = []  # a call inside a pass the engine refused, the pass's other verdicts kept
        self.pass_ = ""

    def _add(self, d: dict, notes: Iterable[str] = ()) -> None:
        self.verdicts.append(Verdict(file=self.run.name, pass_=self.pass_, layer=d["layer"], kind=d["kind"],
                                     ok=not d["failure"], failure=d["failure"], where=d["where"],
                                     max_ulp16=d["max_ulp16"], bitwise=d["bitwise"], budget=d["budget"],
                                     notes=list(notes) + list(d["notes"])))

    def values(self, layer: int, kind: str, ours: Any, official: Any, row_len: int = 0) -> None:
        """Judged when both sides have it: the official run captured it and the engine showed it."""
        if official is None or ours is None:
            return
        at = f"layer {layer}" if layer >= 0 else ""
        off = as_array(official)
        d = _core.v41_judge_values(self.pass_, layer, kind, as_array(ours).ravel(), off.ravel(), at, row_len)
        d["where"] = _placed(d["where"], off.shape)
        self._add(d)

    def router(self, layer: int, ffn_x: Any, experts: Any, weights: Any, official_experts: Any,
               official_weights: Any) -> None:
        """The routed experts and their weights on the official's MoE input, judged by the bounds derived from
        the computation (docs/sound-bounds.md §9): a selection some scores inside their intervals make the top k
        (near-ties admitted), weights inside their intervals under the engine's own selection. Budgets judge
        where the bounds do not apply (the f64 regime, another router)."""
        if official_experts is None or experts is None:
            return
        mine = as_array(experts, np.int64).ravel()
        mine_w = np.zeros(0) if weights is None else as_array(weights).ravel()
        off_w = np.zeros(0) if official_weights is None else as_array(official_weights).ravel()
        judged = _core.v41_judge_router(self.reference.model, self.pass_, layer, as_array(ffn_x).ravel(), mine,
                                        mine_w, np.asarray(official_experts, dtype=np.int64).ravel(), off_w,
                                        f"layer {layer}")
        if judged is None:
            self.rows(layer, "experts (forced x)", experts, official_experts)
            self.values(layer, "expert_weights (forced x)", weights, official_weights)
            return
        self._add(judged[0])
        if judged[1] is not None:
            self._add(judged[1])

    def head(self, collapsed: Any, logits: Any, official: Any, vocab: int) -> None:
        """The engine's logits on the official's final collapse, judged by bounds derived through the final
        norm and the projection (docs/sound-bounds.md §5-§7); the budget in the f64 regime."""
        if official is None or logits is None:
            return
        d = _core.v41_judge_head(self.reference.model, self.pass_, as_array(collapsed).ravel(),
                                 as_array(logits).ravel(), as_array(official).ravel())
        if d is None:
            self.values(-1, "logits (forced collapsed)", logits, official, vocab)
            return
        d["where"] = _placed(d["where"], as_array(official).shape)
        self._add(d)

    def rows(self, layer: int, kind: str, ours: Any, official: Any, offset: int = 0,
             scores: Optional[Callable[[], Optional[np.ndarray]]] = None) -> None:
        """Index lists row by row; with the reference's scores (asked for at the first row that differs), a
        differing row that is a near-tie under the policy is excused (counted equal, named in the notes)."""
        if official is None or ours is None:
            return
        off = np.asarray(official, dtype=np.int64)
        mine = as_array(ours, np.int64)
        if mine.size == off.size:
            mine = mine.reshape(off.shape).copy()
        excused, row_scores = [], None
        if scores is not None and mine.shape == off.shape:
            for t in range(off.shape[0]):
                if np.array_equal(mine[t], off[t]):
                    continue
                if row_scores is None:
                    row_scores = scores()
                if row_scores is None:
                    break
                why = self._near_tie(mine[t], off[t], row_scores[t], offset)
                if why:
                    excused.append(f"near-tie {kind} layer {layer} row {t}: {why}")
                    mine[t] = off[t]
        rows = off.shape[0] if off.ndim == 2 else 1
        self._add(_core.v41_judge_rows(self.pass_, layer, kind, mine.ravel(), off.ravel(), rows,
                                       np.zeros(0), offset), excused)

    def _near_tie(self, mine: np.ndarray, off: np.ndarray, scores: np.ndarray, offset: int) -> str:
        only = sorted(set(mine.tolist()) ^ set(off.tolist()))
        if not only or any(i < offset or i - offset >= scores.shape[0] for i in only):
            return ""  # the same set in another order, or a window row: not a tie of scores
        chosen = [s for s in (scores[i - offset] for i in off.tolist() if i >= offset) if np.isfinite(s)]
        if not chosen:
            return ""
        boundary = min(chosen)
        spacing = 2.0 ** (np.frexp(max(abs(boundary), 2.0 ** -126))[1] - 8)
        gaps = [abs(scores[i - offset] - boundary) / spacing for i in only]
        if max(gaps) > self.policy.tie_ulps:
            return ""
        return (f"positions {[i - offset for i in only]} score within {max(gaps):.2g} bf16 ulps of the boundary "
                f"{boundary:.6g} (tie bound {self.policy.tie_ulps})")

    def top1(self, ours: np.ndarray, official: np.ndarray) -> None:
        """The last row's top-1, a flip excused only below the policy's margin (the margin printed)."""
        o, r = ours[-1], official[-1]
        special = np.flatnonzero(~np.isfinite(o))
        if special.size:  # no rank, no margin: np.argmax would take a NaN for the top-1, and a margin might excuse it
            c = int(special[0])
            why = (f"{special.size} logits of the last row are NaN or infinite, the first {float(o[c])!r} at "
                   f"column {c}: no top-1")
            self.verdicts.append(Verdict(file=self.run.name, pass_=self.pass_, layer=-1, kind="top-1 (last row)",
                                         ok=False, failure=why, where=f"position {official.shape[0] - 1}",
                                         max_ulp16=0.0, bitwise=0.0, budget="policy top1_margin"))
            return
        a, b = int(np.argmax(o)), int(np.argmax(r))
        top2 = np.sort(r)[-2:]
        margin, scale = float(top2[1] - top2[0]), float(np.max(np.abs(r)))
        ok = a == b or margin < self.policy.top1_margin * scale
        why = "" if ok else (f"top-1 {a} here, {b} official; official top-1/top-2 margin {margin:.4g} = "
                             f"{margin / scale:.3g} of max |logit|, not below the near-tie bound "
                             f"{self.policy.top1_margin}")
        notes = []
        if a != b and ok:
            notes.append(f"near-tie top-1 flip {a} vs {b}: margin {margin:.4g} ({margin / scale:.3g} of max |logit|) "
                         f"below {self.policy.top1_margin}")
        self.verdicts.append(Verdict(file=self.run.name, pass_=self.pass_, layer=-1, kind="top-1 (last row)", ok=ok,
                                     failure=why, where=f"position {official.shape[0] - 1}", max_ulp16=0.0,
                                     bitwise=float(a == b), budget="policy top1_margin", notes=notes))


def _arrays(d: Any) -> dict:
    """An engine's answer as numpy arrays by name (None kept: not shown)."""
    return {k: as_array(v, np.int64 if k in _INDEX_KINDS else np.float64) for k, v in dict(d or {}).items()
            if k in _CAPTURE_KINDS}


_INDEX_KINDS = frozenset({"hash_ids", "topk_idxs", "candidates", "attn_idx", "experts"})
_CAPTURE_KINDS = _INDEX_KINDS | frozenset({
    "engram_in", "in", "attn_pre", "attn_post", "attn_comb", "ffn_pre", "ffn_post", "ffn_comb", "compress_kv", "index_k",
    "attn_x", "attn_out", "ffn_x", "ffn_out", "latent", "attn_q", "attn_kv", "attn_o", "expert_weights", "out"})


def _shape_of(kind: str, layer: int, run: GoldenRun, plan: dict, layers: list) -> tuple:
    """The official tensor a kind of the C++ judge compares, for placing its flat element index."""
    name = kind.split(" (")[0].replace(" window", "")
    if name == "out" and layer + 1 < len(layers):
        return np.shape(_official_input(run, plan, layers, layer + 1))
    if name == "final_collapsed":
        return np.shape(run.result["final_collapsed"])
    c = layers[layer].get(name) if 0 <= layer < len(layers) else None
    return () if c is None else np.shape(c)


def _teacher_forced(j: _Judge, engine: Any, caps: frozenset, plan: dict) -> None:
    """Every layer fed the official's inputs and judged by the C++ gate's own judge (docs/sound-bounds.md): the
    block's streams, mixes and the final collapse by bounds from each side's own captures; with ``sublayers``
    each sublayer's ops (the query and window KV, the compressor, the selection, the router and the MoE) by
    bounds from the official's input to them; with ``ops`` sparse_attn and the output projection alone. A
    blocks-only engine's publications and experts come from its own sublayer inputs, which the bounds of the
    official's do not cover: they keep their budgets."""
    j.pass_ = "teacher forced"
    run, res = j.run, j.run.result
    layers, N = res["layers"], len(run.tokens)
    blocks_only: dict = {}

    def layer(l: int, before: dict) -> dict:
        shared = Shared(**before)
        o = layers[l]
        out = layer_out_of(engine.layer(l, _official_input(run, plan, layers, l), o["pre_mix"], run.tokens, shared))
        block = _arrays(out.captures)
        block["out"], block["ffn_pre"] = as_array(out.out), as_array(out.ffn_pre)
        d = {"block": block, "hash_ids": block.get("hash_ids")}
        if "sublayers" in caps:
            a = dict(engine.attention(l, o["attn_x"], shared))
            m = dict(engine.moe(l, o["ffn_x"]))
            d.update(attention=_arrays(a), attn_out=as_array(a.get("attn_out")), moe=_arrays(m),
                     ffn_out=as_array(m.get("ffn_out")))
        else:
            blocks_only[l] = (dict(out.published), out.captures.get("experts"))
        if "ops" in caps:
            if all(o.get(k) is not None for k in ("attn_q", "attn_kv", "attn_idx")):
                d["attn_o"] = as_array(engine.sparse_attn(l, o["attn_q"], o["attn_kv"], o["attn_idx"]))
            if o.get("attn_o") is not None:
                d["attn_out_of_o"] = as_array(engine.attention_output(l, o["attn_o"]))
        return d

    for d in _core.v41_judge_teacher_forced(j.reference.model, str(run.path), layer):
        d["where"] = _placed(d["where"], _shape_of(d["kind"], d["layer"], run, plan, layers))
        j._add(d)
    for l, (published, experts) in sorted(blocks_only.items()):  # by budgets (see above)
        lp, o = plan["layers"][l], layers[l]
        j.rows(l, "experts (forced x)", experts, o["experts"])
        if lp["owns_indexer"]:
            j.rows(l, "topk_idxs (forced x)", published.get("topk_idxs"), o["topk_idxs"], N,
                   lambda l=l: j.reference.attention(l, o["attn_x"], _shared_below(plan, layers, l)).get("index_score"))
        if lp["owns_compressor"]:
            j.values(l, "compress_kv (forced x)", published.get("compress_kv"), o["compress_kv"])
        if lp["owns_index_k"]:
            j.values(l, "index_k (forced x)", published.get("index_k"), o["index_k"])
        if lp["candidate_source"]:
            j.rows(l, "candidates (forced x)", published.get("candidates"), o["candidates"])
    try:
        logits = engine.head(res["final_collapsed"])
        j.head(res["final_collapsed"], logits, res["logits"], plan["vocab_size"])
    except NotSupported as e:
        j.not_supported.append(f"{run.name} head: {e}")


def _end_to_end(j: _Judge, engine: Any, caps: frozenset, plan: dict) -> None:
    j.pass_ = "end to end"
    res = j.run.result
    p = prefill_of(engine.prefill(j.run.tokens), len(j.run.tokens))
    rows = p.logits.shape[0]
    official = res["logits"][p.first_row:p.first_row + rows]
    j.values(-1, "logits (end to end)", p.logits, official)
    j.top1(p.logits, official)
    if "selections" in caps:
        for l, c in sorted(p.layers.items()):
            o = res["layers"][l]
            if plan["layers"][l]["owns_indexer"] and c.get("topk_idxs") is not None:
                j.rows(l, "topk_idxs (end to end)", c["topk_idxs"], o["topk_idxs"], len(j.run.tokens))
            if c.get("experts") is not None:
                j.rows(l, "experts (end to end)", c["experts"], o["experts"])
    d = j.run.decode
    if d is not None and "decode" in caps:
        j.pass_ = "decode e2e"
        for s, t in enumerate(d["tokens"]):
            j.values(-1, "decode logits (end to end)", engine.decode(int(t)), d["steps"][s]["logits"][0])


def _loaded_weights(engine: Any, folder: Path, file: str) -> Verdict:
    """The engine's digests of what it loaded against the checkpoint's: one verdict naming the first tensor that
    differs (docs/v41.md §12.9)."""
    expected = checkpoint_digests(folder)
    differ, missing = compare_digests(dict(engine.loaded_digests()), expected)
    checked = len(expected) - len(missing)
    v = Verdict(file=file, pass_="loaded weights", layer=-1, kind="every tensor" if not differ else differ[0],
                ok=not differ and checked > 0, failure="", where="", max_ulp16=0.0,
                bitwise=(checked - len([n for n in differ if n in expected])) / max(checked, 1),
                budget="the checkpoint's digest (docs/v41.md §12.9)")
    if differ:
        first = differ[0]
        v.failure = (f"{first} {'is not a tensor of the checkpoint' if first not in expected else 'differs from the checkpoint'}"
                     f"{'' if len(differ) == 1 else f' (and {len(differ) - 1} more)'}")
        v.where = "before any forward pass"
    elif checked == 0:
        v.failure, v.where = "the engine reported no tensor of the checkpoint", "before any forward pass"
    if missing:
        v.notes.append(f"{len(missing)} of {len(expected)} tensors not reported (not checked)")
    return v


def gate(engine: Any, golden: Union[None, str, os.PathLike, Iterable] = None, policy: Optional[Policy] = None,
         checkpoints: Optional[Union[str, os.PathLike]] = None, record: Optional[Union[str, os.PathLike]] = None,
         quiet: bool = False) -> GateReport:
    """Judges ``engine`` against the official code's golden files of its regime (or the files named).

    ``engine`` follows :class:`ced.v41.Engine`; its ``load`` is called with each golden file's checkpoint folder
    (exported once into ``checkpoints``). ``record=DIR`` saves every call and answer (:mod:`ced.v41.record`), so
    ``gate(ced.v41.replay(DIR))`` reproduces the verdicts without the engine. Prints the report unless ``quiet``.
    """
    policy = policy or Policy()
    caps = capabilities_of(engine)
    name = getattr(engine, "name", type(engine).__name__)
    if record is not None:
        engine = Recorder(engine, record)
    if golden is None:
        paths = golden_files(getattr(engine, "regime", "release"))
    elif isinstance(golden, (str, os.PathLike)):
        paths = [Path(golden)] if Path(golden).is_file() else golden_files(getattr(engine, "regime", "release"), golden)
    else:
        paths = [Path(p) for p in golden]
    verdicts, unsupported, loaded, referenced = [], [], None, None
    for path in paths:
        run = read_golden(path)
        folder = checkpoint_for(run, checkpoints)
        if folder != loaded:
            engine.load(str(folder))
            plan = _core.v41_plan(str(folder))
            loaded = folder
            if "weights" in caps:  # what it loaded, before any forward pass (docs/v41.md §12.9)
                try:
                    verdicts.append(_loaded_weights(engine, folder, run.name))
                except NotSupported as e:
                    unsupported.append(f"{run.name} loaded weights: {e}")

        if (folder, run.regime) != referenced:  # the near-tie scores and the final collapse in the file's regime
            reference = ReferenceEngine(run.regime)
            reference.load(str(folder))
            referenced = (folder, run.regime)
        j = _Judge(run, policy, reference)
        for what, need, step in (("teacher forced", "layer", _teacher_forced), ("end to end", "prefill", _end_to_end)):
            if need not in caps:
                unsupported.append(f"{run.name} {what}: the engine does not declare '{need}'")
                continue
            try:
                step(j, engine, caps, plan)
            except NotSupported as e:
                unsupported.append(f"{run.name} {what}: {e}")
        verdicts += j.verdicts
        unsupported += j.not_supported
    rep = GateReport(engine=name, files=[p.name for p in paths], verdicts=verdicts, not_supported=unsupported)
    if not quiet:
        print(rep.summary() if rep.passed else str(rep))
    return rep
