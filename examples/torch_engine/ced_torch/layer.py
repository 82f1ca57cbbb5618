"""One layer with its state (docs/spec.md §3): local entries, and for a Full layer the kv source
that consumes tokens into global entries (§3.3)."""
from __future__ import annotations

import torch

from . import steps


class KvSource:
    """The compressor state of a Full layer (docs/spec.md §3.3, §6.1): the rows c_t, z_t of every
    consumed token (blocks are pooled as they complete) and the completed entries g_j, ik_j."""

    def __init__(self, cfg, w: dict, r: int):
        self.cfg, self.w, self.r = cfg, w, r
        hd, ihd = cfg.head_dim, cfg.index_head_dim
        dt, dev = w["comp_wkv"].dtype, w["comp_wkv"].device
        self.c = torch.zeros((0, hd), dtype=dt, device=dev)       # [n_tokens, hd]
        self.z = torch.zeros((0, hd), dtype=dt, device=dev)       # [n_tokens, hd] (r ≥ 2)
        self.g = torch.zeros((0, hd), dtype=dt, device=dev)       # [n_entries, hd]
        self.ik = torch.zeros((0, ihd), dtype=dt, device=dev)     # [n_entries, ihd]

    @property
    def n_tokens(self) -> int:
        return self.c.shape[0]

    def consume(self, pos: torch.Tensor, xh: torch.Tensor) -> None:
        """Consume the rows xh [n, d] at positions pos [n] that are not consumed yet (in order)."""
        first = int(pos[0])
        if first > self.n_tokens:
            raise RuntimeError(f"kv source: token {self.n_tokens} was never consumed")
        new = xh[self.n_tokens - first:]
        if new.shape[0] == 0:
            return
        self.c = torch.cat([self.c, new @ self.w["comp_wkv"]])
        if self.r >= 2:
            self.z = torch.cat([self.z, new @ self.w["comp_wgate"]])
        done, complete = self.g.shape[0], self.n_tokens // self.r
        if complete == done:
            return
        blocks = slice(done * self.r, complete * self.r)
        c = self.c[blocks].reshape(complete - done, self.r, -1)
        z = self.z[blocks].reshape(complete - done, self.r, -1) if self.r >= 2 else None
        entry_pos = torch.arange(done, complete, device=c.device) * self.r
        g, ik = steps.global_entry(steps.compress(c, z), self.w, self.cfg, entry_pos)
        self.g, self.ik = torch.cat([self.g, g]), torch.cat([self.ik, ik])


class Layer:
    """Layer l evaluated over contiguous runs of positions, keeping its local entries from the first
    position it evaluated (so lo(p) = max(first, p − W + 1), docs/spec.md §4, §5)."""

    def __init__(self, cfg, l: int, w: dict, kv: KvSource | None):
        self.cfg, self.l, self.w, self.kv = cfg, l, w, kv
        self.r = cfg.ratio(l)
        self.first = None                                            # first evaluated position
        self.local = None                                            # [n_evaluated, hd]
        self.selection: dict[int, torch.Tensor] = {}                 # p -> S_l(p) [k]
        self.pool: dict[int, torch.Tensor] = {}                      # p -> pool mask (candidate source)

    def evaluate(self, model, pos: torch.Tensor, x: torch.Tensor, xh_E: torch.Tensor | None):
        """X [n, d] at positions pos -> X after the layer [n, d]; selections [n, k] or None."""
        cfg, w = self.cfg, self.w
        xh = steps.rms_norm(x, w["attn_norm"], cfg.rms_eps)
        q_lat, q = steps.query(xh, w, cfg, pos)
        k_new = steps.local_entry(xh, w, cfg, pos)
        if self.first is None:
            self.first, self.local = int(pos[0]), k_new
        else:
            if int(pos[0]) != self.first + self.local.shape[0]:
                raise RuntimeError(f"layer {self.l}: positions must continue the evaluated run")
            self.local = torch.cat([self.local, k_new])
        if self.kv is not None:
            # docs/spec.md §3.3: encoder kv sources consume their own x̂, decoder ones x̂_E
            self.kv.consume(pos, xh if self.l < cfg.E else xh_E)

        keys, valid = self._local_keys(pos)
        sel = None
        if self.r > 0:
            sel = self._select(model, pos, q_lat, xh)
            src = model.layers[cfg.kv_src(self.l)].kv
            ne = src.g.shape[0]                                          # −1 reads a zero row at ne
            g = torch.cat([src.g, src.g.new_zeros((1, src.g.shape[1]))])
            gk = g[torch.where(sel >= 0, sel, torch.full_like(sel, ne))]     # [n, k, hd]
            keys, valid = torch.cat([keys, gk], 1), torch.cat([valid, sel >= 0], 1)
        o = steps.attention(q, keys, valid, w["attn_sink"], self.attention_scale(q), cfg, pos)
        x = x + steps.output(o, w, cfg)
        x = x + steps.ffn(x, w, cfg)
        return x, sel

    def attention_scale(self, like: torch.Tensor) -> torch.Tensor:
        """One method per layer, so that a test can break a single layer's scale."""
        return steps.attention_scale(self.cfg, like)

    def _local_keys(self, pos: torch.Tensor):
        """docs/spec.md §3.5: the local entries j = lo(p)..p, as [n, W, hd] with a validity mask."""
        W = self.cfg.window
        j = pos[:, None] - W + 1 + torch.arange(W, device=pos.device)[None, :]   # [n, W]
        valid = j >= self.first
        idx = (j - self.first).clamp_min(0)
        return self.local[idx], valid

    def _select(self, model, pos, q_lat, xh) -> torch.Tensor:
        """docs/spec.md §3.4: S_l(p) for every p [n, k] (Reuse layers take idx_src(l)'s)."""
        cfg = self.cfg
        if not cfg.is_index_source(self.l):
            src = model.layers[cfg.idx_src(self.l)].selection
            sel = torch.stack([src[int(p)] for p in pos])
        else:
            kv = model.layers[cfg.kv_src(self.l)].kv
            scores = steps.index_scores(q_lat, xh, self.w, cfg, pos, kv.ik)        # [n, ne]
            ne = scores.shape[1]
            n_visible = torch.clamp((pos + 1).div(self.r, rounding_mode="floor"), max=ne)
            eligible = torch.arange(ne, device=pos.device)[None, :] < n_visible[:, None]
            cs = cfg.candidate_source_layer
            if cs == self.l:
                eligible = steps.candidate_pool(scores, eligible, n_visible, cfg.candidate_block_size,
                                                cfg.candidate_topk_blocks)
                for i, p in enumerate(pos.tolist()):
                    self.pool[p] = eligible[i]
            elif 0 <= cs < self.l:
                pools = model.layers[cs].pool
                eligible = eligible & torch.stack([_fit(pools[p], ne) for p in pos.tolist()])
            sel = steps.rank(scores, eligible, cfg.index_topk)
        for i, p in enumerate(pos.tolist()):
            self.selection[p] = sel[i]
        return sel


def _fit(mask: torch.Tensor, n: int) -> torch.Tensor:
    """A pool mask cut or padded (False) to n entries: a later source may have completed more."""
    if mask.shape[0] >= n:
        return mask[:n]
    return torch.cat([mask, torch.zeros(n - mask.shape[0], dtype=torch.bool, device=mask.device)])
