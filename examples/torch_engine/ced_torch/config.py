"""The model config (docs/spec.md §1) and its layer plan (§1.3), read from docs/ alone."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

INT_KEYS = (
    "vocab_size", "d_model", "n_layers", "n_encoder_layers", "n_heads", "head_dim", "rope_dim",
    "q_lora_rank", "window", "index_n_heads", "index_head_dim", "index_topk",
    "candidate_source_layer", "candidate_block_size", "candidate_topk_blocks", "o_groups",
    "o_lora_rank", "n_routed_experts", "n_active_experts", "n_shared_experts", "moe_dim",
)
FLOAT_KEYS = ("routed_scaling_factor", "rms_eps", "rope_theta")
LIST_KEYS = ("compress_ratios", "kv_source_layers", "index_source_layers")

# The built-ins of docs/spec.md §1.1, transcribed from its table.
_V41_SCHEDULE = dict(
    n_layers=40, n_encoder_layers=20, window=128,
    compress_ratios=[0] * 2 + [2] * 18 + [1] * 20,
    kv_source_layers=[2, 8, 14, 20], index_source_layers=[2, 8, 14, 20, 24, 28, 32, 36],
    candidate_source_layer=20, candidate_block_size=8,
)
_COMMON = dict(n_shared_experts=1, routed_scaling_factor=1.5, rms_eps=1e-6, rope_theta=10000.0,
               tie_decoder_kv=False)
BUILTINS = {
    "tiny": dict(_COMMON, vocab_size=97, d_model=32, n_layers=8, n_encoder_layers=4, n_heads=4,
                 head_dim=16, rope_dim=8, q_lora_rank=16, window=4,
                 compress_ratios=[0, 2, 2, 2, 1, 1, 1, 1], kv_source_layers=[1, 4],
                 index_source_layers=[1, 2, 4, 6], index_n_heads=2, index_head_dim=8,
                 index_topk=3, candidate_source_layer=4, candidate_block_size=2,
                 candidate_topk_blocks=3, o_groups=2, o_lora_rank=8, n_routed_experts=4,
                 n_active_experts=2, moe_dim=16),
    "small": dict(_COMMON, vocab_size=211, d_model=64, n_layers=12, n_encoder_layers=6, n_heads=4,
                  head_dim=16, rope_dim=8, q_lora_rank=32, window=8,
                  compress_ratios=[0] + [2] * 5 + [1] * 6, kv_source_layers=[1, 6],
                  index_source_layers=[1, 3, 6, 8, 10], index_n_heads=2, index_head_dim=16,
                  index_topk=8, candidate_source_layer=6, candidate_block_size=4,
                  candidate_topk_blocks=4, o_groups=2, o_lora_rank=16, n_routed_experts=4,
                  n_active_experts=2, moe_dim=32),
    "v41-shape": dict(_COMMON, **_V41_SCHEDULE, vocab_size=1021, d_model=64, n_heads=4,
                      head_dim=32, rope_dim=16, q_lora_rank=32, index_n_heads=2,
                      index_head_dim=16, index_topk=32, candidate_topk_blocks=16, o_groups=2,
                      o_lora_rank=32, n_routed_experts=8, n_active_experts=2, moe_dim=32),
    "bench": dict(_COMMON, **_V41_SCHEDULE, vocab_size=8191, d_model=1024, n_heads=8,
                  head_dim=64, rope_dim=32, q_lora_rank=256, index_n_heads=4,
                  index_head_dim=64, index_topk=128, candidate_topk_blocks=64, o_groups=4,
                  o_lora_rank=128, n_routed_experts=8, n_active_experts=2, moe_dim=256),
}


@dataclass(frozen=True)
class Config:
    """Every key of docs/spec.md §1.1, plus the plan of §1.3 derived from them."""

    name: str
    keys: dict = field(repr=False)

    def __getattr__(self, key):
        try:
            return self.__dict__["keys"][key]
        except KeyError:
            raise AttributeError(key) from None

    # --- the layer plan, docs/spec.md §1.3 ---
    @property
    def L(self) -> int:
        return self.keys["n_layers"]

    @property
    def E(self) -> int:
        return self.keys["n_encoder_layers"]

    @property
    def D(self) -> int:
        return self.L - self.E

    @property
    def R(self) -> int:
        """The exact replay span of docs/spec.md §4.4: R = 1 + D(W − 1)."""
        return 1 + self.D * (self.window - 1)

    def ratio(self, l: int) -> int:
        return self.compress_ratios[l]

    def is_kv_source(self, l: int) -> bool:
        return l in self.kv_source_layers

    def is_index_source(self, l: int) -> bool:
        return l in self.index_source_layers

    def kv_src(self, l: int) -> int:
        return max(s for s in self.kv_source_layers if s <= l)

    def idx_src(self, l: int) -> int:
        return max(s for s in self.index_source_layers if s <= l)

    def role(self, l: int) -> str:
        if self.ratio(l) == 0:
            return "SWA-only"
        if self.is_kv_source(l):
            return "Full"
        if self.is_index_source(l):
            return "Reindex"
        return "Reuse"

    def n_replay(self, replay) -> int:
        """docs/spec.md §4.3: the replay policy as n_replay (N for `full` is given by the caller)."""
        if replay == "bounded":
            return self.window
        if replay == "exact":
            return self.R
        if isinstance(replay, int) or (isinstance(replay, str) and replay.isdigit()):
            k = int(replay)
            if k < 1:
                raise ValueError(f"replay: {replay} is not a positive integer")
            return k
        raise ValueError(f"replay: unknown policy {replay!r}")


def _normalise(keys: dict) -> dict:
    out = {}
    for k in INT_KEYS:
        out[k] = int(keys[k])
    for k in FLOAT_KEYS:
        out[k] = float(keys[k])
    for k in LIST_KEYS:
        out[k] = [int(v) for v in keys[k]]
    out["tie_decoder_kv"] = bool(int(keys.get("tie_decoder_kv", 0)))
    return out


def builtin(name: str) -> Config:
    if name not in BUILTINS:
        raise ValueError(f"config: unknown built-in {name!r} (one of {', '.join(BUILTINS)})")
    return Config(name, _normalise(BUILTINS[name]))


def from_dict(keys: dict, name: str | None = None) -> Config:
    return Config(name or str(keys.get("name", "custom")), _normalise(keys))


def from_json(text: str) -> Config:
    return from_dict(json.loads(text))


def from_h5(group) -> Config:
    """The /config group of a run or cache file (docs/spec.md §9.1)."""
    keys = {k: group.attrs[k] for k in group.attrs}
    for k in LIST_KEYS:
        keys[k] = group[k][()].tolist()
    name = keys.pop("name", "custom")
    if isinstance(name, bytes):
        name = name.decode()
    return from_dict(keys, str(name))
