"""Runs of the v41 reference and v41 run files from Python: what ``ced run --config v41-...`` computes, and the
run file (docs/v41.md §12) a port writes of its own engine's captures so that ``ced diff`` and ``ced gate`` judge
them beside ours or the official code's."""
from __future__ import annotations

import functools
from dataclasses import dataclass
import os
from typing import Any, Mapping, Optional, Union

import numpy as np

from .. import _core
from .golden import GoldenRun, config_checkpoint, read_golden

PathLike = Union[str, "os.PathLike[str]"]


def is_config(config: Any) -> bool:
    """Whether ``config`` names the v41 family: one of its built-ins, or a release-layout checkpoint folder."""
    if not isinstance(config, (str, os.PathLike)):
        return False
    c = os.fspath(config)
    return c in _core.v41_builtin_names() or os.path.isfile(os.path.join(c, "config.json"))


@functools.lru_cache(maxsize=None)
def _builtin_checkpoint(config: str, weight_seed: int) -> str:
    """A built-in's checkpoint of a weight seed, exported once per process (every run of it reads that folder)."""
    return str(config_checkpoint(config, weight_seed=weight_seed, purpose="run"))


def run(config: str, tokens: Union[Any, int], mode: str = "full", replay: Optional[Union[str, int]] = None,
        prefix: Optional[int] = None, decode: int = 0, regime: str = "release", weight_seed: int = 0,
        token_seed: int = 0, convention: str = "sglang", encoder_replay: str = "vllm",
        capture: bool = True) -> dict:
    """One run of the v41 reference, as ``ced run --config C`` does it on the family's modes.

    Args:
      config: a v41 built-in (random weights of ``weight_seed``, as ``ced export`` writes them) or a
        release-layout checkpoint folder.
      tokens: the prompt's ids, or an int N: the first N of the built-in's token stream for ``token_seed``.
      mode: ``"full"`` (the prefill), ``"ced"`` (the layers below the convention's cut on every row, those
        above on the last ``replay`` rows) or ``"resume"`` (after a prefix-cache hit of ``prefix`` tokens,
        rebuilt under ``encoder_replay``'s rule).
      replay: ``"bounded"`` (default in ``ced``), ``"exact"`` or a row count; ``resume`` without one resumes a
        full prefill.
      decode: greedy decode steps after the prefill; their results under ``"decode"``.
      capture: keep every layer's captures (else the selections, experts and mixes only).

    Returns the result dict of docs/v41.md §9.3: ``first_row``, ``logits`` [rows, vocab], ``final_collapsed``,
    ``final_normed``, ``layers`` (capture dicts), with ``tokens`` and, with decode steps, ``decode`` (a list of
    step results). :class:`ced.InputError` with one line for a request the family refuses.
    """
    folder = os.fspath(config) if os.path.isdir(os.fspath(config)) else _builtin_checkpoint(str(config), int(weight_seed))
    ref = _core.V41Reference(folder, regime)
    ref.set_captures(bool(capture))
    if isinstance(tokens, (int, np.integer)):
        tokens = _core.v41_tokens(config, int(tokens), int(token_seed))
    toks = np.asarray(tokens, dtype=np.int64)
    spans = _core.v41_spans(config, convention, 0)
    rows = {"bounded": spans["bounded"], "exact": spans["exact"], None: spans["bounded"]}
    R = rows[replay] if replay in rows else int(replay)
    if mode == "full":
        if replay is not None:
            raise _core.InputError("--replay: a full prefill replays nothing (modes ced and resume take it)")
        out = ref.prefill(toks)
    elif mode == "ced":
        out = ref.prefill_ced(toks, int(R), convention)
    elif mode == "resume":
        if prefix is None:
            raise _core.InputError("resume: the cached prefix (prefix=H) is required")
        # without a replay, every layer on the recomputed rows (a full prefill resumed); with one, a CED tail
        out = ref.resume(toks, int(prefix), encoder_replay, 0, None) if replay is None else \
            ref.resume(toks, int(prefix), encoder_replay, int(R), convention)
    else:
        raise _core.InputError(f"mode {mode!r}: the v41 family runs full, ced or resume")
    out = dict(out)
    out["tokens"] = toks
    # what ced.write_run records of the run (docs/v41.md §12.8): the file `ced run --mode ... --out` writes
    request: dict = {"mode": mode}
    if mode != "full":
        tail = mode == "ced" or replay is not None
        request.update(replay=str(replay if replay is not None else ("bounded" if mode == "ced" else "full")),
                       n_replay=int(toks.shape[0] - out["first_row"]), convention=convention if tail else "")
    if mode == "resume":
        request.update(prefix_len=int(prefix), rule=encoder_replay, rebuilt=int(spans["window"]))
    out["request"] = request
    if decode:
        steps, token = [], int(np.argmax(out["logits"][-1]))
        for _ in range(int(decode)):
            step = dict(ref.decode(token))
            steps.append(step)
            token = int(np.argmax(step["logits"][-1]))
        out["decode"] = steps
    return out


def write_run(path: PathLike, config: str, tokens: Any, result: Mapping[str, Any], regime: str = "release",
              weight_seed: Optional[int] = None, weights_digest: str = "", generator: str = "ced.v41.write_run (Python)",
              provenance: Optional[Mapping[str, str]] = None, request: Optional[Mapping[str, Any]] = None) -> None:
    """Writes a v41 run file of one prefill (docs/v41.md §12), atomically: a port's own captures in the layout
    ``ced diff`` and ``ced gate`` read.

    ``result`` holds ``logits`` [N, vocab] and whatever of ``final_collapsed``, ``final_normed`` and ``layers``
    (one capture dict per layer, names and shapes of docs/v41.md §9.3; a missing or None capture is not
    written, so not judged) the engine has. ``weight_seed``: the ``ced export --weight-seed`` of its checkpoint,
    so ``ced diff`` can rebuild the model the judge needs; ``weights_digest`` its ``ced run`` digest (computed
    for a built-in with a seed when not given).

    A CED or resumed prefill: ``request`` names it (``mode`` "ced" | "resume", ``replay``, ``n_replay``,
    ``convention``; a resume's ``prefix_len``, ``rule``, ``rebuilt``; default ``result["request"]``, which
    :func:`run` sets), ``result["first_row"]`` is its logits' first position and each layer dict's ``first_row``
    the position of its first row (docs/v41.md §12.8).
    """
    if request is None:
        request = result.get("request")
    _core.v41_write_run_file(os.fspath(path), os.fspath(config), regime, np.asarray(tokens, dtype=np.int64),
                             dict(result), generator, weights_digest, weight_seed, dict(provenance or {}),
                             dict(request) if request is not None else None)


def read_run(path: PathLike) -> GoldenRun:
    """A v41 run file, read strictly (as :func:`ced.v41.read_golden`)."""
    return read_golden(path)


@dataclass
class DiffReport:
    """What ``ced diff A B`` says of two v41 run files: ``passed`` and the report's text (``str(report)``)."""
    passed: bool
    text: str

    def __str__(self) -> str:
        return self.text

    def __bool__(self) -> bool:
        return self.passed


def compare_files(test: PathLike, reference: PathLike, checkpoint: Optional[PathLike] = None,
                  verbose: bool = False) -> DiffReport:
    """``ced diff test reference`` on two v41 run files (docs/v41.md §12.7, §12.8): full prefills judged op by op by
    the sound gate's bounds where ``test``'s inputs are ``reference``'s; a CED or resumed file compared bit for bit
    where both hold a position, the family's claim judged. ``checkpoint``: the weights' folder, else the
    reference's weight seed."""
    passed, text = _core.v41_diff(os.fspath(test), os.fspath(reference),
                                  os.fspath(checkpoint) if checkpoint is not None else "", bool(verbose))
    return DiffReport(bool(passed), text)
