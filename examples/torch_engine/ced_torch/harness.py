"""The engine as the harness sees it: loaded from an exported weights file (`ced export`), and as the
callable that `ced.gate` asks for every golden run request."""
from __future__ import annotations

import json
import os
import tempfile

import torch

from . import config as config_mod
from . import weights as weights_mod
from .model import Engine, RunResult


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load(path: str, device: str | None = None, dtype=torch.float32) -> Engine:
    """An engine from a safetensors file written by `ced export` (its config rides in the metadata)."""
    meta = weights_mod.safetensors_metadata(path)
    if "config" not in meta:
        raise ValueError(f"{path}: no config in the safetensors metadata (not written by `ced export`?)")
    cfg = config_mod.from_json(meta["config"])
    w = weights_mod.load_safetensors(path, dtype=dtype)
    w.pop("tokens", None)                       # `ced export --tokens N` also stores the prompt
    return Engine(cfg, w, device=device or default_device(), dtype=dtype)


def as_gate_output(res: RunResult) -> dict:
    """A run's outputs in the form `ced.gate` and `ced.result` take (arrays moved to the CPU)."""
    layers = {l: {"positions": c["positions"].cpu(), "out": c["out"].cpu(), "topk": c.get("topk")}
              for l, c in res.layers.items()}
    for c in layers.values():
        if c["topk"] is not None:
            c["topk"] = c["topk"].cpu()
    return {"logits": res.logits.cpu(), "positions": res.positions.cpu(), "layers": layers,
            "replay_start": res.replay_start, "n_replay": res.n_replay}


def to_ced_result(res: RunResult, ced_config, tokens, logits: str = "all", dtype: str = "f32"):
    """A run of the engine as a `ced.RunResult` (for `ced.write_run` and `ced.compare`), its request
    attributes (docs/spec.md §9.1) set from the run."""
    import ced
    import numpy as np

    req = ced.RunRequest()
    req.mode, req.replay = res.mode, res.replay
    req.tokens = np.asarray(tokens, dtype=np.int64)
    req.n_prompt, req.decode_steps, req.prefix_len = res.n_prompt, res.decode_steps, res.prefix_len
    req.capture_layers, req.logits = bool(res.layers), logits
    out = as_gate_output(res)
    return ced.result(req, out["logits"], out["positions"], out["layers"], config=ced_config,
                      replay_start=res.replay_start, n_replay=res.n_replay, backend="torch-engine",
                      dtype=dtype)


def run_request(engine: Engine, request) -> RunResult:
    """One `ced.Request` (docs/spec.md §9.1 attributes) on the engine."""
    replay = None if request.replay == "none" else request.replay
    return engine.run(request.tokens, mode=request.mode, replay=replay,
                      prefix=None if request.prefix_len < 0 else request.prefix_len,
                      decode=request.decode_steps, logits=request.logits,
                      capture=request.capture_layers)


class GateEngine:
    """The callable for `ced.gate`: per (config, weight seed) it exports the weights once with
    `ced.export`, loads them with `safetensors` into an Engine, and answers each request."""

    def __init__(self, device: str | None = None, dtype=torch.float32, workdir: str | None = None):
        self.device, self.dtype = device or default_device(), dtype
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="ced-torch-")
        self.workdir = workdir or self._tmp.name
        self.engines: dict = {}

    def engine_for(self, cfg, weight_seed: int) -> Engine:
        import ced

        key = (cfg.to_json(), int(weight_seed))
        if key not in self.engines:
            name = json.loads(cfg.to_json()).get("name", "config")
            path = os.path.join(self.workdir, f"{name}-seed{weight_seed}-{self.dtype}.safetensors")
            ced.export(path, cfg, weight_seed=int(weight_seed),
                       dtype="f64" if self.dtype == torch.float64 else "f32")
            self.engines[key] = load(path, self.device, self.dtype)
        return self.engines[key]

    def __call__(self, request) -> dict:
        return as_gate_output(run_request(self.engine_for(request.config, request.weight_seed), request))
