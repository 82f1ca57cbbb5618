"""The project's own v41 reference as an engine under the protocol: the adapter a port writes, for ours.

It is what CI gates through the protocol (with planted faults, each caught by name), and the model the gate
asks for index scores when it tells a near-tie from a bug.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .. import _core
from .engine import Engine, LayerOut, Prefill, Shared

_PUBLISHED = ("compress_kv", "index_k", "topk_idxs", "candidates")
_SHOWN = ("in", "attn_x", "attn_out", "ffn_x", "ffn_out", "experts", "expert_weights", "hash_ids", "attn_pre", "attn_post",
          "attn_comb", "ffn_post", "ffn_comb")
_ATTENTION = ("attn_q", "attn_kv", "attn_idx", "attn_o", "latent", "index_score") + _PUBLISHED


class ReferenceEngine(Engine):
    """``ced run --checkpoint DIR --regime R`` through the protocol. ``fault``: a planted port bug
    (:func:`ced.v41.faults`), for the negative controls."""
    capabilities = frozenset({"prefill", "selections", "layer", "sublayers", "ops", "decode", "ced", "resume",
                              "batch_invariant", "weights"})

    def __init__(self, regime: str = "release", fault: Optional[str] = None, convention: str = "sglang",
                 encoder_replay: str = "vllm"):
        self.regime, self.fault, self.convention, self.encoder_replay = regime, fault, convention, encoder_replay
        self.name = f"v41-reference ({regime}{', fault ' + fault if fault else ''})"
        self.model = None

    def load(self, checkpoint: str) -> None:
        self.folder = str(checkpoint)
        self.model = _core.V41Reference(str(checkpoint), self.regime)
        self.model.set_fault(self.fault or "none")
        self.model.set_captures(False)  # the selections, experts and mixes only: what a prefill returns

    def loaded_digests(self):
        # The reference dequantizes the checkpoint as it reads it: its loaded tensors are the folder's.
        return dict(_core.v41_loaded_digests(self.folder))

    def _prefill(self, r: dict) -> Prefill:
        layers = {c["layer"]: {"topk_idxs": c["topk_idxs"], "experts": c["experts"]} for c in r["layers"]}
        return Prefill(logits=r["logits"], first_row=r["first_row"], layers=layers)

    def prefill(self, tokens):
        return self._prefill(self.model.prefill(tokens))

    def prefill_ced(self, tokens, replay):
        return self._prefill(self.model.prefill_ced(tokens, int(replay), self.convention))

    def resume(self, tokens, hit):
        return self._prefill(self.model.resume(tokens, int(hit), self.encoder_replay, 0, None))

    def decode(self, token):
        return self.model.decode(int(token))["logits"][0]

    def layer(self, layer, streams, pre_mix, tokens, shared: Shared):
        cap, _ = self.model.run_layer(layer, streams, pre_mix, tokens, shared.as_dict())
        return LayerOut(out=cap["out"], ffn_pre=cap["ffn_pre"],
                        published={k: cap[k] for k in _PUBLISHED if cap[k] is not None},
                        captures={k: cap[k] for k in _SHOWN if cap[k] is not None})

    def attention(self, layer, x, shared: Shared):
        cap = self.model.attention(layer, x, shared.as_dict())
        return {k: cap[k] for k in _ATTENTION + ("attn_out",) if cap[k] is not None}

    def sparse_attn(self, layer, q, kv, idx):
        return self.model.attention_core(layer, q, kv, np.asarray(idx, dtype=np.int64))

    def attention_output(self, layer, o):
        return self.model.attention_output(layer, o)

    def moe(self, layer, x):
        cap = self.model.moe(layer, x)
        return {k: cap[k] for k in ("ffn_out", "experts", "expert_weights")}

    def head(self, collapsed):
        return self.model.head_collapsed(np.asarray(collapsed, dtype=np.float64))["logits"]
