"""One function per step of docs/spec.md §3, batched over the evaluated positions (the first axis).

Shapes: n positions, H heads, hd head width, ih/ihd indexer heads and width, ne global entries,
k = index_topk. Every function runs in the dtype of its inputs (f32 for the engine; f64 when a
test wants to see the engine's own rounding apart from its modelling)."""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


def scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """A constant computed in double and rounded to the model's type (docs/spec.md §3, §3.4, §3.5)."""
    return torch.tensor(value, dtype=torch.float64).to(dtype=like.dtype, device=like.device)


def rms_norm(v: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """docs/spec.md §3: (v_i · (1 / sqrt(Σ v_i² / n + rms_eps))) · w_i over the last axis."""
    inv = 1.0 / torch.sqrt((v * v).mean(dim=-1, keepdim=True) + scalar(eps, v))
    return (v * inv) * w


def rope(v: torch.Tensor, pos: torch.Tensor, rope_dim: int, theta: float,
         inverse: bool = False) -> torch.Tensor:
    """docs/spec.md §3: rotate the trailing rope_dim dims of v [n, ..., dim] in pairs at positions pos [n].
    θ, cos θ and sin θ in double, then rounded; the rotation in v's type."""
    dim = v.shape[-1]
    o = dim - rope_dim
    i = torch.arange(rope_dim // 2, dtype=torch.float64, device=v.device)
    inv_freq = theta ** (-2.0 * i / rope_dim)                           # [rope_dim/2]
    ang = pos.to(torch.float64)[:, None] * inv_freq[None, :]            # [n, rope_dim/2]
    cos, sin = torch.cos(ang).to(v.dtype), torch.sin(ang).to(v.dtype)
    if inverse:
        sin = -sin
    shape = (v.shape[0],) + (1,) * (v.dim() - 2) + (rope_dim // 2,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    a, b = v[..., o::2], v[..., o + 1::2]
    out = v.clone()
    out[..., o::2] = a * cos - b * sin
    out[..., o + 1::2] = a * sin + b * cos
    return out


def query(xh: torch.Tensor, w: dict, cfg, pos: torch.Tensor):
    """docs/spec.md §3.1: q_lat [n, q_lora_rank] and q [n, H, hd] (each head rotated)."""
    q_lat = rms_norm(xh @ w["wq_a"], w["q_norm"], cfg.rms_eps)
    q = (q_lat @ w["wq_b"]).reshape(xh.shape[0], cfg.n_heads, cfg.head_dim)
    return q_lat, rope(q, pos, cfg.rope_dim, cfg.rope_theta)


def local_entry(xh: torch.Tensor, w: dict, cfg, pos: torch.Tensor) -> torch.Tensor:
    """docs/spec.md §3.2: k_p [n, hd], key and value of the local window."""
    return rope(rms_norm(xh @ w["wkv"], w["kv_norm"], cfg.rms_eps), pos, cfg.rope_dim, cfg.rope_theta)


def compress(c: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
    """docs/spec.md §3.3: raw entries from whole blocks. c, z [n_blocks, r, hd] -> raw [n_blocks, hd];
    r = 1 has no gate (raw = c)."""
    if z is None:
        return c[:, 0, :]
    e = torch.exp(z - z.max(dim=1, keepdim=True).values)
    return ((e / e.sum(dim=1, keepdim=True)) * c).sum(dim=1)


def global_entry(raw: torch.Tensor, w: dict, cfg, pos: torch.Tensor):
    """docs/spec.md §3.3: from raw [ne, hd] at entry positions pos [ne]: g [ne, hd], ik [ne, ihd]."""
    lat = rms_norm(raw, w["comp_norm"], cfg.rms_eps)
    ik = rope(rms_norm(lat @ w["idx_wk"], w["idx_knorm"], cfg.rms_eps), pos, cfg.rope_dim, cfg.rope_theta)
    g = rope(lat, pos, cfg.rope_dim, cfg.rope_theta)
    return g, ik


def index_scores(q_lat, xh, w: dict, cfg, pos, ik) -> torch.Tensor:
    """docs/spec.md §3.4: I(p, j) = Σ_h w_h · max(0, iq_h · ik_j), scores [n, ne]."""
    n, ih, ihd = xh.shape[0], cfg.index_n_heads, cfg.index_head_dim
    iq = rope((q_lat @ w["idx_wq"]).reshape(n, ih, ihd), pos, cfg.rope_dim, cfg.rope_theta)
    wts = (xh @ w["idx_wweights"]) * scalar(1.0 / (ihd * ih) ** 0.5, xh)       # [n, ih]
    dots = torch.einsum("nhi,ei->nhe", iq, ik).clamp_min(0)                    # [n, ih, ne]
    return torch.einsum("nh,nhe->ne", wts, dots)


def rank(scores: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
    """docs/spec.md §3.4 ranking: the k best eligible ids per row, higher score first, equal scores
    (−0 = +0) the larger id first; −1 padded. scores, eligible [n, m] -> [n, k] int64."""
    n, m = scores.shape
    if m == 0:
        return torch.full((n, k), -1, dtype=torch.int64, device=scores.device)
    vals = torch.where(eligible, scores + 0.0, torch.full_like(scores, NEG_INF)).flip(1)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices
    ids = (m - 1 - order)[:, :k]
    valid = torch.arange(ids.shape[1], device=ids.device)[None, :] < eligible.sum(dim=1, keepdim=True)
    ids = torch.where(valid, ids, torch.full_like(ids, -1))
    if ids.shape[1] < k:
        ids = torch.cat([ids, torch.full((n, k - ids.shape[1]), -1, dtype=ids.dtype, device=ids.device)], 1)
    return ids


def candidate_pool(scores, visible, n_visible, bs: int, topk_blocks: int) -> torch.Tensor:
    """docs/spec.md §3.4 candidate pool: the newest visible entry's block, then the best
    topk_blocks − 1 other blocks (block score = max of its visible entries). -> mask [n, ne]."""
    n, ne = scores.shape
    nb = -(-ne // bs)
    padded = torch.full((n, nb * bs), NEG_INF, dtype=scores.dtype, device=scores.device)
    padded[:, :ne] = torch.where(visible, scores, torch.full_like(scores, NEG_INF))
    block_score = padded.reshape(n, nb, bs).max(dim=2).values                  # [n, nb]
    newest = (n_visible - 1).div(bs, rounding_mode="floor")                    # [n], −1: none visible
    others = torch.arange(nb, device=scores.device)[None, :] < newest[:, None]
    best = rank(block_score, others, topk_blocks - 1)                          # [n, topk_blocks − 1]
    chosen = torch.zeros((n, nb + 1), dtype=torch.bool, device=scores.device)  # column nb: padding sink
    chosen.scatter_(1, torch.where(best >= 0, best, torch.full_like(best, nb)), True)
    rows = torch.arange(n, device=scores.device)
    chosen[rows, torch.where(newest >= 0, newest, torch.full_like(newest, nb))] = True
    entry_block = torch.arange(ne, device=scores.device) // bs
    return chosen[:, entry_block] & visible


def attention_scale(cfg, like: torch.Tensor) -> torch.Tensor:
    """docs/spec.md §3.5: s = 1/sqrt(hd) in double, rounded to the model's type."""
    return scalar(1.0 / cfg.head_dim ** 0.5, like)


def attention(q, keys, key_valid, sink, scale, cfg, pos) -> torch.Tensor:
    """docs/spec.md §3.5 over the entry list keys [n, e, hd] (local window, then the selected global
    entries; key_valid [n, e] marks the real ones): softmax with the sink in the denominator, then
    RoPE⁻¹ at p. q [n, H, hd] -> o [n, H, hd]."""
    logit = torch.einsum("nhd,ned->nhe", q, keys) * scale
    logit = logit.masked_fill(~key_valid[:, None, :], NEG_INF)
    sink_col = sink.reshape(1, -1, 1).expand(q.shape[0], -1, 1)
    weight = torch.softmax(torch.cat([sink_col, logit], dim=2), dim=2)[:, :, 1:]
    o = torch.einsum("nhe,ned->nhd", weight, keys)
    return rope(o, pos, cfg.rope_dim, cfg.rope_theta, inverse=True)


def output(o: torch.Tensor, w: dict, cfg) -> torch.Tensor:
    """docs/spec.md §3.6: grouped low-rank output projection, o [n, H, hd] -> attn_out [n, d]."""
    G = cfg.o_groups
    grouped = o.reshape(o.shape[0], G, (cfg.n_heads // G) * cfg.head_dim)
    u = torch.cat([grouped[:, g, :] @ w[f"wo_a.{g}"] for g in range(G)], dim=1)
    return u @ w["wo_b"]


def swiglu(v: torch.Tensor, w: dict, prefix: str) -> torch.Tensor:
    a = v @ w[prefix + "w1"]
    return ((a / (1 + torch.exp(-a))) * (v @ w[prefix + "w3"])) @ w[prefix + "w2"]


def ffn(x: torch.Tensor, w: dict, cfg) -> torch.Tensor:
    """docs/spec.md §3.7: the MoE feed-forward, x [n, d] (after attention) -> ffn_out [n, d]."""
    f = rms_norm(x, w["ffn_norm"], cfg.rms_eps)
    out = torch.zeros_like(f)
    if cfg.n_routed_experts > 0:
        a = f @ w["router"]
        s = torch.sqrt(a.clamp_min(0) + torch.log1p(torch.exp(-a.abs())))      # sqrt(softplus)
        # the largest s + bias; a stable descending sort puts the lower e first among equals
        chosen = torch.sort(s + w["router_bias"], dim=1, descending=True, stable=True).indices
        chosen = chosen[:, : cfg.n_active_experts]
        mask = torch.zeros_like(s, dtype=torch.bool).scatter_(1, chosen, True)
        total = torch.where(mask, s, torch.zeros_like(s)).sum(dim=1, keepdim=True)
        weight = (s / total) * scalar(cfg.routed_scaling_factor, s)
        for e in range(cfg.n_routed_experts):
            rows = mask[:, e].nonzero(as_tuple=True)[0]
            if rows.numel():
                out[rows] += weight[rows, e : e + 1] * swiglu(f[rows], w, f"expert.{e}.")
    for e in range(cfg.n_shared_experts):
        out = out + swiglu(f, w, f"shared.{e}.")
    return out
