"""DeepSeek's official ``inference/model.py`` as an engine under the protocol: the code the golden files ran,
judged by the gate against its own golden files (a check of the judge and of the files), and an outside engine
a port can be compared with.

Nothing of the official code lives in this repository (its licence, and our rule): ``inference_dir`` names the
user's copy of the release's ``inference/`` folder (model.py, engram.py, vision.py, image_processor.py) and
``kernel_module`` a Python file standing in for its tilelang ``kernel`` module (the user's CPU port: act_quant,
fp4_act_quant, fp4_gemm, fp8_gemm, hc_split_sinkhorn, sparse_attn); without it, ``kernel`` is whatever
``inference_dir`` holds (the official kernel.py, on a GPU with tilelang). The kernel file is put in
``sys.modules["kernel"]`` before model.py is imported; no official file is edited or patched. The GEMMs of a CPU
port return torch's default dtype, so every call runs under bf16 as generate.py sets it.

Capabilities: ``prefill`` (the logits of every row: model.py's head over every position, as the golden files
hold them), ``selections`` (forward hooks on each Indexer and Gate), ``layer`` (one Block teacher forced: the
given streams through its Engram and Block.forward, with model.py's ``shared_attn`` set to what the layers below
published), ``sublayers`` (Attention and MoE alone), ``decode`` (Transformer.forward at start_pos N, N + 1, ...).
Not ``ced``, ``resume`` nor ``batch_invariant``: model.py has no CED prefill or prefix cache, and its GEMMs are
not batch invariant.

model.py keeps module-level state (world size, default dtype, ``shared_attn``): one official module is imported
per process, and engines of both modes share it (the globals are read when a model is built, and every forward
writes ``shared_attn`` before it reads it).
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch

from .engine import Engine, LayerOut, Prefill, Shared

_RUNTIME = ("max_batch_size", "max_seq_len", "temperature")  # set per run, as generate.py does
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_imported: dict = {}


def _bf16(x, *shape):
    """An array of bf16 values as model.py's activations: bf16, one batch row (reshaped when a shape is given)."""
    t = torch.as_tensor(np.asarray(x, dtype=np.float32)).to(torch.bfloat16)
    return t.reshape(1, *shape) if shape else t[None]


def _np(t):
    return t.float().numpy()


def import_official(inference_dir, kernel_module=None):
    """model.py with ``kernel_module`` as its ``kernel``; once per process (model.py's globals are per module)."""
    key = (str(Path(inference_dir).resolve()), str(Path(kernel_module).resolve()) if kernel_module else None)
    if _imported:
        if key not in _imported:
            raise RuntimeError(f"official model.py already imported from {next(iter(_imported))}; one per process")
        return _imported[key]
    clash = [m for m in ("kernel", "engram", "vision", "image_processor") if m in sys.modules]
    if clash:
        raise RuntimeError(f"modules {clash} already imported: model.py's imports would bind those")
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # leave the user's folder as it is
    try:
        if kernel_module:
            spec = importlib.util.spec_from_file_location("kernel", key[1])
            sys.modules["kernel"] = kernel = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(kernel)
        sys.path.insert(0, key[0])  # engram, vision, image_processor (and kernel, without a port)
        spec = importlib.util.spec_from_file_location("ced_v41_official_model", Path(key[0]) / "model.py")
        sys.modules[spec.name] = M = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(M)
    finally:
        sys.dont_write_bytecode = dont_write
    _imported[key] = M
    return M


class _TokenizerFile:
    """What engram.build_compressed_token_map reads of a HF tokenizer (len, backend_tokenizer), from
    tokenizer.json; len counts added tokens, as transformers' PreTrainedTokenizerFast does."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer
        self.backend_tokenizer = Tokenizer.from_file(str(path))

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)


def _fp8_to_bf16(w, s):
    """An e4m3 weight with one e8m0 scale per 32x32 tile, dequantized (exactly) as convert.py does for bf16."""
    r, c = w.shape
    return (w.float() * s.float().repeat_interleave(32, 0)[:r].repeat_interleave(32, 1)[:, :c]).to(torch.bfloat16)


def _fp4_to_bf16(w, s):
    """Packed e2m1 (low nibble the even element) with one e8m0 scale per 32 along K, dequantized exactly."""
    table = torch.tensor(_E2M1 + tuple(-v for v in _E2M1))
    b = w.view(torch.uint8).long()
    v = torch.stack([table[b & 15], table[b >> 4]], -1).flatten(-2)
    return (v * s.float().repeat_interleave(32, -1)).to(torch.bfloat16)


def _load_weights(model, tensors: dict) -> None:
    """The release's tensors into model.py's modules with convert.py's load-time casts; strict both ways."""
    params, owners, taken = model.state_dict(keep_vars=True), dict(model.named_modules()), set()
    with torch.no_grad():
        for name, p in params.items():
            base = name.rpartition(".")[0]
            if base not in owners or (name.endswith(".scale") and p.dtype == torch.float8_e8m0fnu):
                continue  # a tied module's second name; a quantized tensor's scale, taken with it
            if name not in tensors:
                raise KeyError(f"checkpoint lacks {name}")
            src, scale = tensors[name], tensors.get(base + ".scale")
            taken |= {name, base + ".scale"}
            if p.dtype in (torch.float8_e4m3fn, torch.float4_e2m1fn_x2):  # kept as stored (I8 = packed FP4)
                pairs = [(name, p.view(torch.uint8), src.view(torch.uint8)),
                         (base + ".scale", params[base + ".scale"], scale)]
            else:  # FP8: wo_a, and the dense linears in bf16 mode; I8: the experts in bf16 mode; bf16 -> fp32: the
                # head and the ratio > 1 compressors
                pairs = [(name, p, _fp8_to_bf16(src, scale) if src.dtype == torch.float8_e4m3fn
                          else _fp4_to_bf16(src, scale) if src.dtype == torch.int8 else src.to(p.dtype))]
            for what, dst, v in pairs:
                if v is None or v.shape != dst.shape:  # copy_ would broadcast a mis-shaped tensor
                    raise ValueError(f"{what}: {None if v is None else list(v.shape)} in the checkpoint, "
                                     f"{list(dst.shape)} in model.py")
                dst.copy_(v)
    left = sorted(n for n in set(tensors) - taken if not n.endswith("ffn.gate.bias_vl"))  # bias_vl: vision only
    if left:
        raise KeyError(f"checkpoint tensors model.py did not take: {left[:3]} ({len(left)})")


class OfficialEngine(Engine):
    """model.py on a release-layout folder, read the official code's way: ``ModelArgs(**json.load(f))`` of
    ``inference/config.json`` (lists as tuples), the shards ``model.safetensors.index.json`` names, and
    ``tokenizer.json`` for Engram's token map. ``mode``: ``"fp8"`` (the release's dtype fp8 + fp4 experts:
    regime ``release``) or ``"bf16"`` (weights dequantized). ``max_seq_len`` sizes its caches (results do not
    depend on it); ``threads`` sets torch's, for the process."""
    capabilities = frozenset({"prefill", "selections", "layer", "sublayers", "decode"})

    def __init__(self, inference_dir, kernel_module=None, mode: str = "fp8", threads: int = 1,
                 max_seq_len: int = 4096):
        if mode not in ("fp8", "bf16"):
            raise ValueError(f"mode {mode!r}: 'fp8' or 'bf16'")
        self.M = import_official(inference_dir, kernel_module)
        self.mode, self.threads, self.max_seq_len = mode, threads, max_seq_len
        self.regime = "release" if mode == "fp8" else "bf16"
        self.name = f"official model.py ({mode})"
        self.model, self.pos, self._seen = None, 0, {}

    def load(self, checkpoint: str) -> None:
        from safetensors.torch import load_file
        torch.set_num_threads(self.threads)
        folder, M = Path(checkpoint), self.M
        fields = {k: v for k, v in json.loads((folder / "inference" / "config.json").read_text()).items()
                  if k not in _RUNTIME}
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        fields.update(max_batch_size=1, max_seq_len=self.max_seq_len, temperature=0.0,
                      dtype=self.mode, expert_dtype="fp4" if self.mode == "fp8" else None)
        args = M.ModelArgs(**fields)
        tokenizer = _TokenizerFile(folder / "tokenizer.json") if args.engram_layer_ids else None
        shards = sorted(set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values()))
        tensors = {k: v for s in shards for k, v in load_file(str(folder / s)).items()}
        with M.set_dtype(torch.bfloat16):
            self.model = M.Transformer(args, tokenizer).eval()
            _load_weights(self.model, tensors)
        self.args, self.pos = args, 0

    # --- hooks: what the golden files capture, gathered per layer into self._seen ---------------------------
    def _watch(self, blocks):
        """Forward hooks on the given blocks' Attention, Indexer, Compressor, MoE and Gate; returns their handles."""
        seen, hs = self._seen, []

        def keep(l, name, f):
            return lambda mod, inp, out: seen.setdefault(l, {}).__setitem__(name, f(inp, out))

        for b in blocks:
            l, a = b.layer_id, b.attn
            hs.append(a.register_forward_hook(keep(l, "attn", lambda i, o: (i[0][0], o[0]))))
            hs.append(b.ffn.register_forward_hook(keep(l, "ffn", lambda i, o: (i[0][0], o[0]))))
            hs.append(b.ffn.gate.register_forward_hook(keep(l, "gate", lambda i, o: o)))
            if a.indexer is not None:
                hs.append(a.indexer.register_forward_hook(keep(l, "topk_idxs", lambda i, o: o[0])))
            if a.compressor is not None:  # the latent before Attention rotates it in place
                hs.append(a.compressor.register_forward_hook(
                    keep(l, "latent", lambda i, o: None if o is None else o[0].float().clone())))
        return hs

    def _run(self, blocks, call):
        self._seen.clear()
        hs = self._watch(blocks)
        try:
            with torch.inference_mode(), self.M.set_dtype(torch.bfloat16):
                return call()
        finally:
            for h in hs:
                h.remove()

    def _experts(self, l):
        w, idx = self._seen[l]["gate"]
        order = idx.argsort(dim=-1)  # ascending expert id, as the golden files hold them
        return idx.gather(-1, order).numpy(), _np(w.gather(-1, order))

    def _share(self, s: Shared, n: int) -> None:
        """model.py's shared_attn as the layers below left it, from the given arrays."""
        sa = self.M.shared_attn

        # None: nothing published (a prompt shorter than the ratio) where model.py's source leaves an empty slice
        def t(x, dtype, empty):
            v = torch.as_tensor(np.asarray(x)).to(dtype) if x is not None else torch.zeros(empty, dtype=dtype)
            return v.reshape(1, n, -1) if dtype in (torch.int32, torch.bool) else v.reshape(1, -1, empty[-1])
        a = self.args
        sa.compress_kv = t(s.compress_kv, torch.bfloat16, (0, a.head_dim))
        sa.index_k = t(s.index_k, torch.bfloat16, (0, a.index_head_dim))
        sa.topk_idxs = t(s.topk_idxs, torch.int32, (n, 0))
        sa.candidates = None if s.candidates is None else t(s.candidates, torch.bool, (n, 0))

    def _published(self, l: int, n: int) -> dict:
        a, sa, out = self.model.layers[l].attn, self.M.shared_attn, {}
        if a.is_kv_source and n >= a.compress_ratio:
            out["compress_kv"] = _np(a.compress_kv_cache[0, : n // a.compress_ratio])
            if a.indexer is not None and a.indexer.owns_k:
                out["index_k"] = _np(a.indexer.k_cache[0, : n // a.compress_ratio])
        if "topk_idxs" in self._seen.get(l, {}):
            out["topk_idxs"] = self._seen[l]["topk_idxs"].numpy()
        if a.indexer is not None and a.indexer.is_candidate_source and sa.candidates is not None:
            out["candidates"] = sa.candidates[0].numpy().astype(np.uint8)
        return out

    # --- the protocol ------------------------------------------------------------------------------------------
    def _fits(self, n: int) -> None:
        if n > self.max_seq_len:  # model.py would index past its caches
            raise ValueError(f"{n} positions: past max_seq_len {self.max_seq_len} (OfficialEngine(max_seq_len=...))")

    def prefill(self, tokens):
        self._fits(len(tokens))
        m, ids = self.model, torch.as_tensor(np.asarray(tokens, dtype=np.int64))[None]
        normed = []
        h = m.norm.register_forward_hook(lambda mod, i, o: normed.append(o))
        try:
            self._run(m.layers, lambda: m(ids, 0))
        finally:
            h.remove()
        self.pos = ids.shape[1]
        with torch.inference_mode():  # the head over every row, as the golden files hold it
            logits = m.head(normed[0], full_logits=True)[0]
        layers = {l: {"experts": self._experts(l)[0], **({"topk_idxs": c["topk_idxs"].numpy()}
                                                         if "topk_idxs" in c else {})} for l, c in self._seen.items()}
        return Prefill(logits=_np(logits), first_row=0, layers=layers)

    def decode(self, token):
        self._fits(self.pos + 1)
        logits = self._run([], lambda: self.model(torch.tensor([[int(token)]]), self.pos)[1])
        self.pos += 1
        return _np(logits[0])

    def layer(self, layer, streams, pre_mix, tokens, shared: Shared):
        b, n = self.model.layers[layer], len(tokens)
        self._fits(n)
        x = _bf16(streams, n, b.hc_mult, -1)
        pm = torch.as_tensor(np.asarray(pre_mix, dtype=np.float32)).reshape(1, n, b.hc_mult)
        ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64))[None]
        self._share(shared, n)

        def block():
            y = x
            if b.engram is not None:  # Transformer.forward's Engram step for this block
                y = b.engram(y, self.model.engram_hash(ids, 0)[:, :, b.engram.layer_hash_index, :])
            return y, b(y, 0, pm, None)
        y, (out, ffn_pre) = self._run([b], block)
        seen = self._seen[layer]
        experts, weights = self._experts(layer)
        captures = {"in": _np(y[0]), "attn_x": _np(seen["attn"][0]), "attn_out": _np(seen["attn"][1]),
                    "ffn_x": _np(seen["ffn"][0]), "ffn_out": _np(seen["ffn"][1]), "experts": experts,
                    "expert_weights": weights}
        return LayerOut(out=_np(out[0]), ffn_pre=_np(ffn_pre[0]),
                        published=self._published(layer, n), captures=captures)

    def attention(self, layer, x, shared: Shared):
        a, n = self.model.layers[layer].attn, len(x)
        self._share(shared, n)
        out = self._run([self.model.layers[layer]], lambda: a(_bf16(x), 0))
        got = {"attn_out": _np(out[0]), **self._published(layer, n)}
        if self._seen[layer].get("latent") is not None:
            got["latent"] = self._seen[layer]["latent"].numpy()
        return got

    def moe(self, layer, x):
        f = self.model.layers[layer].ffn
        out = self._run([self.model.layers[layer]], lambda: f(_bf16(x)))
        experts, weights = self._experts(layer)
        return {"ffn_out": _np(out[0]), "experts": experts, "expert_weights": weights}

    def head(self, collapsed):
        with torch.inference_mode(), self.M.set_dtype(torch.bfloat16):
            return self.model.head(self.model.norm(_bf16(collapsed)), full_logits=True)[0].numpy()
