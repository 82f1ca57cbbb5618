"""Record and replay: every request the judge makes of an engine and the engine's answer, saved in a folder, so
that a failure reproduces (and is debugged) without the engine, its GPU or its build.

``ced.v41.gate(engine, record=DIR)`` wraps the engine in a :class:`Recorder`; ``ced.v41.replay(DIR)`` is an
engine that answers every recorded request with the recorded answer and refuses any other by name. The folder:
``index.json`` (the engine's name, regime, capabilities, conventions, and one entry per call: method, key, file)
and ``calls/NNNNN-METHOD.npz`` (the answer's arrays). A request's key is a SHA-256 over the method and every
argument's bytes, shape and dtype, so a replay answers only the request that was made.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .engine import LayerOut, NotSupported, Prefill, Shared, as_array

_METHODS = ("prefill", "prefill_ced", "resume", "decode", "layer", "head", "attention", "moe", "sparse_attn",
            "attention_output", "loaded_digests")
_ATTRS = ("name", "regime", "capabilities", "convention", "encoder_replay")


class _Keys:
    """A request's key: its method and arguments, the checkpoint loaded, and for a decode step the request that
    began its sequence and its place in it (a step's answer depends on the state before it)."""

    def __init__(self) -> None:
        self.checkpoint, self.sequence, self.steps = "", "", 0

    def load(self, checkpoint: str) -> None:
        self.checkpoint, self.sequence, self.steps = Path(checkpoint).name, "", 0

    def __call__(self, method: str, args: tuple) -> str:
        if method == "decode":
            self.steps += 1
            return _key(method, (self.checkpoint, self.sequence, self.steps) + tuple(args))
        key = _key(method, (self.checkpoint,) + tuple(args))
        if method in ("prefill", "prefill_ced", "resume"):
            self.sequence, self.steps = key, 0
        return key


def _key(method: str, args: tuple) -> str:
    h = hashlib.sha256(method.encode())

    def feed(x: Any) -> None:
        if isinstance(x, Shared):
            for k, v in sorted(x.as_dict().items()):
                h.update(k.encode())
                feed(v)
        elif x is None or isinstance(x, (int, float, str, np.integer)):
            h.update(repr(x if not isinstance(x, np.integer) else int(x)).encode())
        else:
            a = as_array(x, None)
            h.update(f"{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())
    for a in args:
        feed(a)
    return h.hexdigest()


def _flatten(answer: Any) -> tuple[str, dict]:
    """An answer as (its type, arrays by flat name)."""
    if isinstance(answer, Prefill):
        arrays = {"logits": as_array(answer.logits), "first_row": np.array(answer.first_row)}
        for l, c in dict(answer.layers).items():
            for k, v in dict(c).items():
                if v is not None:
                    arrays[f"layers/{l}/{k}"] = as_array(v)
        return "Prefill", arrays
    if isinstance(answer, LayerOut):
        arrays = {"out": as_array(answer.out), "ffn_pre": as_array(answer.ffn_pre)}
        for group in ("published", "captures"):
            for k, v in dict(getattr(answer, group)).items():
                if v is not None:
                    arrays[f"{group}/{k}"] = as_array(v)
        return "LayerOut", arrays
    if isinstance(answer, dict):
        return "dict", {k: as_array(v) for k, v in answer.items() if v is not None}
    return "array", {"value": as_array(answer)}


def _unflatten(kind: str, arrays: dict) -> Any:
    if kind == "Prefill":
        layers: dict = {}
        for k, v in arrays.items():
            if k.startswith("layers/"):
                _, l, name = k.split("/")
                layers.setdefault(int(l), {})[name] = v
        return Prefill(logits=arrays["logits"], first_row=int(arrays["first_row"]), layers=layers)
    if kind == "LayerOut":
        group = lambda g: {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(g + "/")}
        return LayerOut(out=arrays["out"], ffn_pre=arrays["ffn_pre"], published=group("published"),
                        captures=group("captures"))
    if kind == "dict":
        return dict(arrays)
    return arrays["value"]


class Recorder:
    """An engine that passes every call to ``engine`` and saves the request's key and the answer in ``folder``."""

    def __init__(self, engine: Any, folder: Any):
        self._engine, self._dir = engine, Path(folder)
        (self._dir / "calls").mkdir(parents=True, exist_ok=True)
        self._index = {a: getattr(engine, a, None) for a in _ATTRS}
        self._index["capabilities"] = sorted(self._index["capabilities"] or [])
        self._index["calls"] = []
        self._keys = _Keys()
        for a in _ATTRS:
            setattr(self, a, getattr(engine, a, None))
        self._save_index()

    def _save_index(self) -> None:
        tmp = self._dir / "index.json.tmp"
        tmp.write_text(json.dumps(self._index, indent=1))
        os.replace(tmp, self._dir / "index.json")  # atomic: a reader never sees half an index

    def load(self, checkpoint: str) -> None:
        self._engine.load(checkpoint)
        self._keys.load(checkpoint)
        self._index["calls"].append({"method": "load", "checkpoint": Path(checkpoint).name})
        self._save_index()

    def __getattr__(self, method: str) -> Any:
        if method not in _METHODS:
            raise AttributeError(method)
        call = getattr(self._engine, method)

        def recorded(*args: Any) -> Any:
            entry = {"method": method, "key": self._keys(method, args)}
            try:
                answer = call(*args)
            except NotSupported as e:
                entry["not_supported"] = str(e)
                self._index["calls"].append(entry)
                self._save_index()
                raise
            if method == "loaded_digests":  # text, not arrays: kept in the index itself
                entry["answer"], entry["digests"] = "digests", dict(answer)
                self._index["calls"].append(entry)
                self._save_index()
                return dict(answer)
            kind, arrays = _flatten(answer)
            entry["answer"] = kind
            entry["file"] = f"calls/{len(self._index['calls']):05d}-{method}.npz"
            with open(self._dir / (entry["file"] + ".tmp"), "wb") as f:
                np.savez_compressed(f, **arrays)
            os.replace(self._dir / (entry["file"] + ".tmp"), self._dir / entry["file"])
            self._index["calls"].append(entry)
            self._save_index()
            return _unflatten(kind, arrays)
        return recorded


class Replay:
    """An engine that answers from a recording: the recorded answer of each request made again, a
    ``KeyError`` naming any request that was not recorded."""

    def __init__(self, folder: Any):
        self._dir = Path(folder)
        index_path = self._dir / "index.json"
        if not index_path.is_file():
            raise ValueError(f"{folder}: no index.json: not a recording of ced.v41.gate(..., record=DIR)")
        index = json.loads(index_path.read_text())
        for a in _ATTRS:
            setattr(self, a, index.get(a))
        self.name = f"replay of {index.get('name')}"
        self.capabilities = frozenset(index.get("capabilities") or [])
        self._calls = {c["key"]: c for c in index["calls"] if "key" in c}
        self._loaded = {c["checkpoint"] for c in index["calls"] if c["method"] == "load"}
        self._keys = _Keys()

    def load(self, checkpoint: str) -> None:
        if Path(checkpoint).name not in self._loaded:
            raise KeyError(f"{self._dir}: checkpoint {Path(checkpoint).name} was not loaded in the recording")
        self._keys.load(checkpoint)

    def __getattr__(self, method: str) -> Any:
        if method not in _METHODS:
            raise AttributeError(method)

        def replayed(*args: Any) -> Any:
            c = self._calls.get(self._keys(method, args))
            if c is None:
                raise KeyError(f"{self._dir}: {method} with these arguments was not recorded")
            if "not_supported" in c:
                raise NotSupported(c["not_supported"])
            if c["answer"] == "digests":
                return dict(c["digests"])
            with np.load(self._dir / c["file"]) as z:
                return _unflatten(c["answer"], {k: z[k] for k in z.files})
        return replayed


def replay(folder: Any) -> Replay:
    """The engine a recording answers for (see :class:`Replay`)."""
    return Replay(folder)
