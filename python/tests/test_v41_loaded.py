"""What an engine loaded is what the checkpoint holds (docs/v41.md §12.9): the gate compares an engine's digests of its
loaded tensors and switches with the checkpoint's before any forward pass, names the first that differs, and a
port can compute the canonical digest on its own."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import ced.v41 as v41


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tmp_path_factory.mktemp("v41-loaded")


def golden(name):
    return v41.golden_dir() / name


class Planted(v41.ReferenceEngine):
    """The reference with one entry of its report replaced: what a port whose loading lost something reports."""

    def __init__(self, name, value, shape=None):
        super().__init__("release")
        self.entry, self.value, self.shape = name, value, shape

    def loaded_digests(self):
        d = super().loaded_digests()
        d[self.entry] = v41.tensor_digest(self.value, self.shape)
        return d


def loaded_verdict(rep):
    return [v for v in rep.verdicts if v.pass_ == "loaded weights"]


def test_the_reference_reports_what_the_checkpoint_holds(checkpoints):
    rep = v41.gate(v41.ReferenceEngine("release"), [golden("tiny-fp8-n5.h5")], checkpoints=checkpoints, quiet=True)
    assert rep.passed, str(rep)
    [v] = loaded_verdict(rep)
    assert v.ok and v.kind == "every tensor" and not v.notes, v


@pytest.mark.parametrize("entry,value,shape", [
    # an RL trainer's weight sync: the routing table reached the engine as zeros (here the router of layer 0)
    ("layers.0.ffn.gate.weight", np.zeros((16, 64)), None),
    # and a switch lost on the way: the shared expert's clamp (swiglu_limit) dropped
    ("config.swiglu_limit", np.zeros(1), None),
])
def test_a_loading_bug_is_named_before_any_forward_pass(checkpoints, entry, value, shape):
    rep = v41.gate(Planted(entry, value, shape), [golden("tiny-fp8-n5.h5")], checkpoints=checkpoints, quiet=True)
    assert not rep.passed
    first = rep.first_failure
    assert first.pass_ == "loaded weights" and first.kind == entry, str(rep)
    assert rep.verdicts.index(first) == 0  # before every verdict of a forward pass
    assert "differs from the checkpoint" in first.failure and "before any forward pass" in first.where


def test_a_name_the_checkpoint_does_not_hold_fails_and_an_unreported_one_is_not_checked(checkpoints):
    rep = v41.gate(Planted("layers.0.ffn.gate.weights", np.zeros(3)), [golden("tiny-fp8-n5.h5")],
                   checkpoints=checkpoints, quiet=True)
    assert rep.first_failure.kind == "layers.0.ffn.gate.weights"
    assert "is not a tensor of the checkpoint" in rep.first_failure.failure

    class Partial(v41.ReferenceEngine):
        def loaded_digests(self):
            d = super().loaded_digests()
            return {k: d[k] for k in list(d)[:10]}

    rep = v41.gate(Partial("release"), [golden("tiny-fp8-n5.h5")], checkpoints=checkpoints, quiet=True)
    [v] = loaded_verdict(rep)
    assert v.ok and "not reported (not checked)" in v.notes[0], v


def _safetensors_tensor(folder, name):
    """A tensor of a checkpoint folder read with nothing but the file format: (dtype, shape, raw bytes)."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    raw = (folder / index["weight_map"][name]).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    meta = json.loads(raw[8:8 + n])[name]
    a, b = meta["data_offsets"]
    return meta["dtype"], meta["shape"], raw[8 + n + a:8 + n + b]


def test_a_port_reproduces_the_canonical_digest_from_the_file_alone(checkpoints):
    folder = v41.checkpoint_for(v41.read_golden(golden("tiny-fp8-n5.h5")), checkpoints)
    expected = v41.checkpoint_digests(folder)
    # a bf16 tensor widened to float32, and a float32 one as it is
    dtype, shape, raw = _safetensors_tensor(folder, "layers.0.attn_norm.weight")
    assert dtype == "BF16"
    widened = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    assert v41.tensor_digest(widened) == expected["layers.0.attn_norm.weight"]
    dtype, shape, raw = _safetensors_tensor(folder, "layers.0.hc_attn_base")
    assert dtype == "F32"
    assert v41.tensor_digest(np.frombuffer(raw, dtype=np.float32).reshape(shape)) == expected["layers.0.hc_attn_base"]
    # an FP8 weight: e4m3 codes times the e8m0 scale of each 32 x 32 tile
    dtype, shape, raw = _safetensors_tensor(folder, "layers.0.attn.wq_a.weight")
    _, sshape, sraw = _safetensors_tensor(folder, "layers.0.attn.wq_a.scale")
    codes = np.frombuffer(raw, dtype=np.uint8).reshape(shape)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e, m = (codes >> 3) & 0xF, (codes & 7).astype(np.float64)
    value = sign * np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e.astype(np.float64) - 7))
    scale = 2.0 ** (np.frombuffer(sraw, dtype=np.uint8).reshape(sshape).astype(np.float64) - 127)
    tiles = np.repeat(np.repeat(scale, 32, axis=0), 32, axis=1)[:shape[0], :shape[1]]
    assert v41.tensor_digest(value * tiles) == expected["layers.0.attn.wq_a.weight"]
    # the switches a port applies
    switches = v41.config_switches(str(folder))
    assert v41.tensor_digest([switches["swiglu_limit"]]) == expected["config.swiglu_limit"]


def test_a_report_of_no_tensor_is_a_failure_not_a_pass(checkpoints):
    # 0 of 0 checked is no verdict: an engine that reports nothing fails the loaded-weights check.
    class Empty(v41.ReferenceEngine):
        def loaded_digests(self):
            return {}

    rep = v41.gate(Empty("release"), [golden("tiny-fp8-n5.h5")], checkpoints=checkpoints, quiet=True)
    [v] = loaded_verdict(rep)
    assert not v.ok and "reported no tensor" in v.failure and not rep.passed
