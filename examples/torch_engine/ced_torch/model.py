"""The model and its modes: full prefill (docs/spec.md §4.1), ced with every replay policy (§4.2,
§4.3), decode (§5) and resume from a persisted cache (§6)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import steps
from .layer import KvSource, Layer


@dataclass
class LayerCapture:
    positions: list = field(default_factory=list)
    out: list = field(default_factory=list)         # rows [d]
    topk: list = field(default_factory=list)        # rows [k] (layers with r > 0)


@dataclass
class RunResult:
    """What one run produces, in the terms of docs/spec.md §9.1."""
    mode: str
    replay: str
    n_prompt: int
    n_replay: int
    replay_start: int
    prefix_len: int
    decode_steps: int
    positions: torch.Tensor            # int64 [P]
    logits: torch.Tensor               # [P, V]
    layers: dict                       # l -> {"positions": [P_l], "out": [P_l, d], "topk": [P_l, k]}


class _State:
    """Every layer of one pass; `layers[l].kv` is the kv source state of Full layers."""

    def __init__(self, engine, kv: dict[int, KvSource] | None = None):
        cfg = engine.cfg
        kv = kv if kv is not None else {
            l: KvSource(cfg, engine.layer_weights[l], cfg.ratio(l))
            for l in range(cfg.L) if cfg.role(l) == "Full"}
        self.kv = kv
        self.layers = [Layer(cfg, l, engine.layer_weights[l], kv.get(l)) for l in range(cfg.L)]


class Engine:
    """A PyTorch engine for the CED model of docs/spec.md, from its weights (dict name -> tensor)."""

    def __init__(self, cfg, weights: dict, device="cpu", dtype=torch.float32):
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        w = {k: v.to(device=self.device, dtype=dtype) for k, v in weights.items()}
        self.embed, self.final_norm, self.lm_head = w["embed"], w["final_norm"], w["lm_head"]
        self.layer_weights = []
        for l in range(cfg.L):
            prefix = f"layers.{l}."
            self.layer_weights.append({k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)})

    # --- pieces shared by the modes ---
    def _xh_E(self, h_E: torch.Tensor) -> torch.Tensor:
        """docs/spec.md §3.3: x̂_E = RMSNorm(H_E) ⊙ layers.E.attn_norm."""
        return steps.rms_norm(h_E, self.layer_weights[self.cfg.E]["attn_norm"], self.cfg.rms_eps)

    def _layers(self, state, lo: int, hi: int, pos, x, capture, xh_E=None):
        """Layers lo..hi−1 over positions pos; returns X after them and x̂_E if layer E was crossed."""
        for l in range(lo, hi):
            if l == self.cfg.E:
                xh_E = self._xh_E(x)
            x, sel = state.layers[l].evaluate(state, pos, x, xh_E)
            if capture is not None:
                cap = capture.setdefault(l, LayerCapture())
                cap.positions.append(pos)
                cap.out.append(x)
                if sel is not None:
                    cap.topk.append(sel)
        return x, xh_E

    def _source_only_write(self, state, pos, h_E):
        """docs/spec.md §4.2 step 2: every decoder kv source consumes x̂_E at pos (no attention)."""
        xh_E = self._xh_E(h_E)
        for l, kv in state.kv.items():
            if l >= self.cfg.E:
                kv.consume(pos, xh_E)

    def _logits(self, x):
        """docs/spec.md §3.8."""
        return steps.rms_norm(x, self.final_norm, self.cfg.rms_eps) @ self.lm_head

    def _positions(self, a, b):
        return torch.arange(a, b, dtype=torch.int64, device=self.device)

    def _embed(self, tokens, a, b):
        return self.embed[tokens[a:b]]

    # --- the run ---
    @torch.no_grad()
    def run(self, tokens, mode: str = "full", replay=None, prefix: int | None = None,
            decode: int = 0, logits: str = "all", capture: bool = True,
            resume_replay: int | None = None) -> RunResult:
        """One run of docs/spec.md §4–§6. tokens: the prompt followed by the decode steps' tokens
        (at least N + decode of them, N = len(tokens) − decode)."""
        cfg = self.cfg
        tokens = torch.as_tensor(tokens, dtype=torch.int64, device=self.device)
        N = tokens.shape[0] - decode
        if N < 1:
            raise ValueError("run: a prompt needs at least one token")
        if mode not in ("full", "ced", "resume"):
            raise ValueError(f"run: unknown mode {mode!r}")
        if mode == "full":
            replay_name, n_replay = "none", -1
        else:
            replay = "bounded" if replay is None else replay
            replay_name = str(replay)
            n_replay = N if replay == "full" else cfg.n_replay(replay)
        if mode == "resume" and (prefix is None or not 0 <= prefix <= N):
            raise ValueError(f"run: resume needs 0 <= prefix <= N ({N}), got {prefix}")
        E, L = cfg.E, cfg.L
        caps = {} if capture else None

        if mode == "full":
            state, s = _State(self), 0
            pos = self._positions(0, N)
            x, _ = self._layers(state, 0, L, pos, self._embed(tokens, 0, N), caps)
        elif mode == "ced":
            state, s = _State(self), N - min(N, n_replay)
            pos = self._positions(0, N)
            h_E, _ = self._layers(state, 0, E, pos, self._embed(tokens, 0, N), caps)
            self._source_only_write(state, pos, h_E)
            x, _ = self._layers(state, E, L, pos[s:], h_E[s:], caps)
        else:
            P = prefix
            cache = _State(self)                        # docs/spec.md §6.1: the persisted cache
            if P > 0:
                ppos = self._positions(0, P)
                h_E, _ = self._layers(cache, 0, E, ppos, self._embed(tokens, 0, P), None)
                self._source_only_write(cache, ppos, h_E)
            state = _State(self, kv=cache.kv)           # no local entries survive
            s_r = max(0, P - (cfg.window if resume_replay is None else resume_replay))
            pos = self._positions(s_r, N)
            h_E, _ = self._layers(state, 0, E, pos, self._embed(tokens, s_r, N), caps)
            if P < N:
                self._source_only_write(state, pos[P - s_r:], h_E[P - s_r:])
            s = max(N - min(N, n_replay), s_r)
            x, _ = self._layers(state, E, L, pos[s - s_r:], h_E[s - s_r:], caps)

        out_pos = self._positions(s, N) if logits == "all" else self._positions(N - 1, N)
        out_logits = [self._logits(x[out_pos[0] - s:])]
        out_pos = [out_pos]
        for t in range(decode):                          # docs/spec.md §5: teacher-forced steps
            p = self._positions(N + t, N + t + 1)
            xd, _ = self._layers(state, 0, L, p, self._embed(tokens, N + t, N + t + 1), caps)
            out_pos.append(p)
            out_logits.append(self._logits(xd))

        layers = {}
        for l, cap in (caps or {}).items():
            layers[l] = {"positions": torch.cat(cap.positions), "out": torch.cat(cap.out)}
            if cap.topk:
                layers[l]["topk"] = torch.cat(cap.topk)
        return RunResult(mode=mode, replay=replay_name, n_prompt=N, n_replay=n_replay,
                         replay_start=s, prefix_len=prefix if mode == "resume" else -1,
                         decode_steps=decode, positions=torch.cat(out_pos),
                         logits=torch.cat(out_logits), layers=layers)
