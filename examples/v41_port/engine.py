"""The adapter a DeepSeek-V4.1 port writes to be judged by `ced.v41` (docs/v41-ports.md §2), as a worked example.

A port's adapter has this shape: `load` reads the checkpoint folder with the port's own loader, and each call
runs the port's model. So that this example runs anywhere, its model is the harness's own reference
(`ced.v41.ReferenceEngine`); its loader step is a census of the folder with safetensors, as a port's loader
starts (every tensor the index names, found in its shard, with the release's dtypes). Replace the calls to
`self.model` with your model's.

    pytest --ced-engine engine:make test_ced.py          # the whole suite on this engine
    pytest --ced-engine engine:make_buggy test_ced.py    # V4's per-head q norm left in: caught at layer 0
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from safetensors import safe_open

import ced.v41 as v41


def census(folder: str) -> Counter:
    """Every tensor of the index in its shard; the count of each dtype (F8_E4M3, F8_E8M0, I8, BF16, F32)."""
    index = json.loads((Path(folder) / "model.safetensors.index.json").read_text())
    dtypes: Counter = Counter()
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(Path(folder) / shard), framework="numpy") as f:
            for name in f.keys():
                if index["weight_map"].get(name) != shard:
                    raise ValueError(f"{shard}: {name} is not the index's")
                dtypes[f.get_slice(name).get_dtype()] += 1
    if sum(dtypes.values()) != len(index["weight_map"]):
        raise ValueError(f"{folder}: the shards hold {sum(dtypes.values())} tensors, the index names "
                         f"{len(index['weight_map'])}")
    return dtypes


class MyEngine(v41.Engine):
    name = "my-port"
    regime = "release"            # the official dtype="fp8" numerics
    convention = "sglang"         # layer 20 floored, the tail from layer 20
    encoder_replay = "vllm"       # hits below W run cold
    capabilities = frozenset({"prefill", "selections", "layer", "sublayers", "decode", "ced", "resume",
                              "batch_invariant"})

    def __init__(self, fault=None):
        self.model = v41.ReferenceEngine(self.regime, fault=fault, convention=self.convention,
                                         encoder_replay=self.encoder_replay)

    def load(self, checkpoint):
        census(checkpoint)
        self.model.load(checkpoint)

    def prefill(self, tokens):
        return self.model.prefill(tokens)

    def prefill_ced(self, tokens, replay):
        return self.model.prefill_ced(tokens, replay)

    def resume(self, tokens, hit):
        return self.model.resume(tokens, hit)

    def decode(self, token):
        return self.model.decode(token)

    def layer(self, layer, streams, pre_mix, tokens, shared):
        return self.model.layer(layer, streams, pre_mix, tokens, shared)

    def head(self, collapsed):
        return self.model.head(collapsed)

    def attention(self, layer, x, shared):
        return self.model.attention(layer, x, shared)

    def moe(self, layer, x):
        return self.model.moe(layer, x)


def make():
    return MyEngine()


def make_buggy():
    return MyEngine(fault="v4-q-norm")
