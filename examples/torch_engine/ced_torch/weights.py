"""The weights: loaded from an exported safetensors file, or rebuilt with the generator of
docs/spec.md §2.1 (numpy, vectorised), the two checked equal bitwise by the tests."""
from __future__ import annotations

import math

import numpy as np
import torch

from .config import Config

M64 = (1 << 64) - 1


def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def fnv1a64(s: str) -> int:
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def _splitmix64_array(z: np.ndarray) -> np.ndarray:
    """splitmix64 over a uint64 array; numpy's uint64 arithmetic wraps as §2.1 requires."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def generate_tensor(weight_seed: int, name: str, shape, center: float, scale: float) -> np.ndarray:
    """docs/spec.md §2.1: element i = center + scale·(2u − 1), u from splitmix64(key + i); double."""
    key = fnv1a64(name) ^ splitmix64(weight_seed)
    n = int(np.prod(shape))
    with np.errstate(over="ignore"):
        z = np.uint64(key) + np.arange(n, dtype=np.uint64)
    u = (_splitmix64_array(z) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return (center + scale * (2.0 * u - 1.0)).reshape(shape)


def tensor_table(cfg: Config):
    """docs/spec.md §2.2: (name, shape, center, scale, generated-under name) of every tensor."""
    d, V, H, hd = cfg.d_model, cfg.vocab_size, cfg.n_heads, cfg.head_dim
    proj = lambda shape: (0.0, math.sqrt(3.0 / shape[0]))  # noqa: E731
    rows = [("embed", (V, d), 0.0, math.sqrt(3.0))]
    for l in range(cfg.L):
        p = f"layers.{l}."
        add = lambda n, shape, cs=None, under=None: rows.append(  # noqa: E731
            (p + n, shape, *(cs or proj(shape)), under))
        add("attn_norm", (d,), (1.0, 0.1))
        add("ffn_norm", (d,), (1.0, 0.1))
        add("wq_a", (d, cfg.q_lora_rank))
        add("q_norm", (cfg.q_lora_rank,), (1.0, 0.1))
        add("wq_b", (cfg.q_lora_rank, H * hd))
        add("wkv", (d, hd))
        add("kv_norm", (hd,), (1.0, 0.1))
        add("attn_sink", (H,), (0.0, 1.0))
        if cfg.role(l) == "Full":
            # tie_decoder_kv: a decoder kv source above E takes layer E's five tensors (§2.2)
            tied = cfg.tie_decoder_kv and l > cfg.E
            under = (lambda n: f"layers.{cfg.E}.{n}") if tied else (lambda n: None)
            add("comp_wkv", (d, hd), None, under("comp_wkv"))
            if cfg.ratio(l) >= 2:
                add("comp_wgate", (d, hd), None, under("comp_wgate"))
            add("comp_norm", (hd,), (1.0, 0.1), under("comp_norm"))
            add("idx_wk", (hd, cfg.index_head_dim), None, under("idx_wk"))
            add("idx_knorm", (cfg.index_head_dim,), (1.0, 0.1), under("idx_knorm"))
        if cfg.is_index_source(l):
            add("idx_wq", (cfg.q_lora_rank, cfg.index_n_heads * cfg.index_head_dim))
            add("idx_wweights", (d, cfg.index_n_heads))
        for g in range(cfg.o_groups):
            add(f"wo_a.{g}", ((H // cfg.o_groups) * hd, cfg.o_lora_rank))
        add("wo_b", (cfg.o_groups * cfg.o_lora_rank, d))
        if cfg.n_routed_experts > 0:
            add("router", (d, cfg.n_routed_experts))
            add("router_bias", (cfg.n_routed_experts,), (0.0, 0.1))
        for kind, count in (("expert", cfg.n_routed_experts), ("shared", cfg.n_shared_experts)):
            for e in range(count):
                add(f"{kind}.{e}.w1", (d, cfg.moe_dim))
                add(f"{kind}.{e}.w3", (d, cfg.moe_dim))
                add(f"{kind}.{e}.w2", (cfg.moe_dim, d))
    rows.append(("final_norm", (d,), 1.0, 0.1, None))
    rows.append(("lm_head", (d, V), *proj((d, V)), None))
    return [r if len(r) == 5 else (*r, None) for r in rows]


def generate(cfg: Config, weight_seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of docs/spec.md §2.2, rebuilt from (weight_seed, name); f32 rounds the doubles."""
    out = {}
    for name, shape, center, scale, under in tensor_table(cfg):
        values = generate_tensor(weight_seed, under or name, shape, center, scale)
        out[name] = torch.from_numpy(values).to(dtype)
    return out


def load_safetensors(path: str, dtype=torch.float32, device="cpu") -> dict[str, torch.Tensor]:
    """An exported weights file (`ced export`), one call of the `safetensors` package."""
    from safetensors.torch import load_file

    return {k: v.to(device=device, dtype=dtype) for k, v in load_file(path).items()}


def safetensors_metadata(path: str) -> dict:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return dict(f.metadata() or {})


def token_stream(cfg: Config, n: int, token_seed: int) -> list[int]:
    """docs/spec.md §2.3: tokens[i] = splitmix64((fnv1a64("tokens") xor splitmix64(seed)) + i) mod V."""
    base = fnv1a64("tokens") ^ splitmix64(token_seed)
    return [splitmix64((base + i) & M64) % cfg.vocab_size for i in range(n)]
