"""The engine protocol: what a DeepSeek-V4.1-Flash port implements, around its own model, to be judged.

A port subclasses :class:`Engine` (or writes any object with the same attributes) in a few lines: it loads a
checkpoint folder with *its own* loader and answers the calls its ``capabilities`` name. A check that needs a
capability the engine does not declare is reported *not supported*, never failed; a declared capability that
raises :class:`NotSupported` is reported the same way, with the engine's reason.

Shapes (docs/v41.md §9.3): ``N`` rows, ``hc`` = ``hc_mult`` streams, ``dim`` the model width, ``V`` the vocabulary.
Arrays may be numpy arrays or torch tensors (any float dtype; bf16 is read as fp32); every value the
reference compares is an fp32 or bf16 value in the ``release`` and ``bf16`` regimes.

Capabilities:

``prefill``
    :meth:`Engine.prefill`: a full prefill of a prompt, the logits of every row. Every engine has it.
``selections``
    the prefill's result also holds, per layer, the selection it published (``topk_idxs``) and the routed
    experts (``experts``): the end-to-end comparison names the first layer whose choices differ.
``layer``
    :meth:`Engine.layer`: one block run on given input streams, ``pre_mix``, tokens and what the layers below
    published (teacher forcing): the gate's layer-by-layer comparison, which keeps a rounding flip in its layer.
``sublayers``
    :meth:`Engine.attention` and :meth:`Engine.moe`: each sublayer alone on the official's own input.
``ops``
    :meth:`Engine.sparse_attn` and :meth:`Engine.attention_output`: the attention's last two ops alone, each on
    the official's own input to it, so each is judged by bounds derived from that input (with ``sublayers``
    only, the attention's output is judged whole, by its measured budget).
``decode``
    :meth:`Engine.decode`: decode steps after the last prefill (or CED prefill, or resume).
``ced``
    :meth:`Engine.prefill_ced`: a CED prefill replaying the last ``replay`` rows under ``Engine.convention``.
``resume``
    :meth:`Engine.resume`: a prompt resumed after a prefix-cache hit under ``Engine.encoder_replay``.
``batch_invariant``
    the engine's rows do not depend on how many rows it runs: :func:`ced.v41.check` judges its CED
    properties bitwise (else under the policy's stated bound).
``weights``
    :meth:`Engine.loaded_digests`: a digest of each tensor as the port holds it after its own loading, and of
    the config switches it applies, in the canonical form of docs/v41.md §12.9 (:func:`ced.v41.tensor_digest`);
    the gate compares them with the checkpoint's before any forward pass and names the first that differs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import numpy as np

CAPABILITIES = ("prefill", "selections", "layer", "sublayers", "ops", "decode", "ced", "resume", "batch_invariant",
                "weights")


class NotSupported(Exception):
    """Raised by an engine for a call it cannot make: reported as *not supported*, never as a failure."""


def as_array(x: Any, dtype: Any = np.float64) -> Optional[np.ndarray]:
    """numpy from numpy, lists or torch tensors (detached, on the CPU, bf16 widened); None stays None."""
    if x is None:
        return None
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        x = x.numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=dtype))


@dataclass
class Prefill:
    """What a prefill (full, CED or resumed) returns.

    ``logits`` [rows, V] are the positions ``first_row`` .. ``first_row + rows - 1``; without ``first_row``, the
    prompt's last ``rows`` positions (every row of a full prefill, the tail of a CED replay, or only the last).
    ``layers`` (capability ``selections``) maps a layer to ``{"topk_idxs": [rows, k] (index sources),
    "experts": [rows, n_activated]}`` over the same rows the layer ran.
    """
    logits: np.ndarray
    first_row: Optional[int] = None
    layers: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)


@dataclass
class LayerOut:
    """What one block returns under teacher forcing (:meth:`Engine.layer`).

    ``out`` [N, hc, dim]: the streams leaving the block; ``ffn_pre`` [N, hc]: the next block's collapse weights
    (the staggered mHC's pre, consumed by the next sublayer). ``published``: what the block hands up the stack,
    where it owns it: ``compress_kv`` [N / ratio, head_dim], ``index_k`` [N / ratio, index_head_dim],
    ``topk_idxs`` [N, k] (offset by N, -1 for none), ``candidates`` [N, N / ratio] (0/1). ``captures``:
    anything else it can show (``attn_x``, ``attn_out``, ``ffn_x``, ``ffn_out`` [N, dim]; ``experts``,
    ``expert_weights`` [N, n_activated]); each present one is judged, each absent one is not.
    """
    out: Any
    ffn_pre: Any
    published: Mapping[str, Any] = field(default_factory=dict)
    captures: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Shared:
    """What the layers below a block published, as the official run left it (model.py's shared_attn):
    the latest kv source's ``compress_kv`` and ``index_k`` (with its ``ratio``), the latest index source's
    ``topk_idxs``, the candidate source's ``candidates``; None where no layer below has published one."""
    ratio: int = 0
    compress_kv: Optional[np.ndarray] = None
    index_k: Optional[np.ndarray] = None
    topk_idxs: Optional[np.ndarray] = None
    candidates: Optional[np.ndarray] = None

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "compress_kv": self.compress_kv, "index_k": self.index_k,
                "topk_idxs": self.topk_idxs, "candidates": self.candidates}


class Engine:
    """Base class of an engine under test. Override what your port can do and list it in ``capabilities``.

    ``regime``: the numerics the port computes, which picks the golden files it is judged against:
    ``"release"`` (the official ``dtype="fp8"`` run: FP8 activation rounding of every FP8/FP4 linear's input,
    block-scaled products) or ``"bf16"`` (weights dequantized, no activation rounding).
    ``convention``: its CED replay convention (one of :func:`ced.v41.conventions`: ``"sglang"``, ``"trtllm"``,
    ``"vllm"``, ``"atom"``, ``"ascend"``), ``encoder_replay`` its prefix-hit rule (``"vllm"``, ``"trtllm"``,
    ``"sglang"``), for :func:`ced.v41.check`.
    """
    name: str = "engine"
    regime: str = "release"
    capabilities: frozenset = frozenset({"prefill"})
    convention: Optional[str] = None
    encoder_replay: Optional[str] = None

    def load(self, checkpoint: str) -> None:
        """Loads a release-layout checkpoint folder (config.json, inference/config.json, sharded
        safetensors and index, tokenizer) with the port's own loader."""
        raise NotSupported("load")

    def prefill(self, tokens: np.ndarray) -> Prefill:
        """A full prefill of ``tokens`` [N] from position 0: the logits of every row (or the last)."""
        raise NotSupported("prefill")

    def loaded_digests(self) -> Mapping[str, str]:
        """After :meth:`load`: ``{checkpoint tensor name: digest}`` of each weight as the port holds it, put back in
        the checkpoint's logical shape and dequantized (a quantized weight times its scales, exact in float32; a
        scale is folded into its weight, not listed), each ``ced.v41.tensor_digest(values)``; and
        ``{"config.KEY": ced.v41.tensor_digest([value])}`` for each switch of :func:`ced.v41.config_switches` the
        port applies. A tensor the port does not list is reported not checked, never failed."""
        raise NotSupported("weights")

    def prefill_ced(self, tokens: np.ndarray, replay: int) -> Prefill:
        """A CED prefill under ``self.convention``: the layers below the cut on every row, the rest on the
        last ``replay`` rows; the logits of the replayed rows."""
        raise NotSupported("ced")

    def resume(self, tokens: np.ndarray, hit: int) -> Prefill:
        """The prompt resumed after a prefix-cache hit of its first ``hit`` tokens (the hit's compressed KV and
        index keys cached; windows rebuilt under ``self.encoder_replay``), a full prefill of the rest."""
        raise NotSupported("resume")

    def decode(self, token: int) -> Any:
        """One decode step after the last prefill: ``token`` at the next position; its logits [V]."""
        raise NotSupported("decode")

    def layer(self, layer: int, streams: np.ndarray, pre_mix: np.ndarray, tokens: np.ndarray,
              shared: Shared) -> LayerOut:
        """Block ``layer`` on ``streams`` [N, hc, dim] (before its Engram, if it has one), ``pre_mix`` [N, hc],
        the prompt ``tokens`` [N] (its Engram's n-grams) and ``shared``, at positions 0 .. N - 1."""
        raise NotSupported("layer")

    def head(self, collapsed: np.ndarray) -> Any:
        """The final norm and head alone on the last collapse [N, dim] (with ``layer``): logits [N, V]."""
        raise NotSupported("head")

    def attention(self, layer: int, x: np.ndarray, shared: Shared) -> Mapping[str, Any]:
        """The attention of ``layer`` alone on ``x`` [N, dim] (attn_norm's output): ``{"attn_out": [N, dim]}``
        and what it can show of ``topk_idxs``, ``compress_kv``, ``index_k``, ``candidates``."""
        raise NotSupported("sublayers")

    def sparse_attn(self, layer: int, q: np.ndarray, kv: np.ndarray, idx: np.ndarray) -> Any:
        """sparse_attn of ``layer`` alone: the query ``q`` [N, n_heads, head_dim] (after the RoPE), the rows ``kv``
        (window KV, then compressed KV) and the index lists ``idx`` [N, k] into them (-1: none), with the layer's
        sink: its output [N, n_heads, head_dim], before the inverse RoPE."""
        raise NotSupported("ops")

    def attention_output(self, layer: int, o: np.ndarray) -> Any:
        """The attention's output projection of ``layer`` alone on sparse_attn's output ``o`` [N, n_heads,
        head_dim] at positions 0 .. N - 1: the inverse RoPE, wo_a by groups, wo_b; [N, dim]."""
        raise NotSupported("ops")

    def moe(self, layer: int, x: np.ndarray) -> Mapping[str, Any]:
        """The MoE of ``layer`` alone on ``x`` [N, dim] (ffn_norm's output): ``{"ffn_out": [N, dim],
        "experts": [N, n_activated]}`` (experts ascending per row)."""
        raise NotSupported("sublayers")


def capabilities_of(engine: Any) -> frozenset:
    """The engine's declared capabilities, checked against the known ones (a typo is an error, not a skip)."""
    caps = frozenset(getattr(engine, "capabilities", frozenset({"prefill"})))
    unknown = sorted(caps - set(CAPABILITIES))
    if unknown:
        raise ValueError(f"engine {getattr(engine, 'name', engine)!r}: unknown capabilities {unknown}; "
                         f"the known ones are {list(CAPABILITIES)}")
    return caps


def prefill_of(x: Any, n: int) -> Prefill:
    """A :class:`Prefill` of a prompt of ``n`` tokens from an engine's answer: a Prefill, a mapping with its
    fields, or bare logits (the last rows); ``first_row`` always set."""
    if isinstance(x, Prefill):
        p = x
    elif isinstance(x, Mapping):
        p = Prefill(logits=x["logits"], first_row=x.get("first_row"), layers=x.get("layers") or {})
    else:
        p = Prefill(logits=x)
    logits = as_array(p.logits)
    if logits.ndim == 1:
        logits = logits[None, :]
    first = n - logits.shape[0] if p.first_row is None else int(p.first_row)
    if first < 0 or first + logits.shape[0] > n:
        raise ValueError(f"an engine's prefill returned rows {first} .. {first + logits.shape[0] - 1} of a prompt "
                         f"of {n} tokens")
    layers = {int(l): dict(c) for l, c in dict(p.layers).items()}
    return Prefill(logits=logits, first_row=first, layers=layers)


def layer_out_of(x: Any) -> LayerOut:
    """A :class:`LayerOut` from an engine's answer: a LayerOut or a mapping with its fields."""
    if isinstance(x, LayerOut):
        return x
    if isinstance(x, Mapping):
        return LayerOut(out=x["out"], ffn_pre=x["ffn_pre"], published=x.get("published") or {},
                        captures=x.get("captures") or {})
    raise TypeError(f"an engine's layer() returned {type(x).__name__}; want a ced.v41.LayerOut or a dict")
