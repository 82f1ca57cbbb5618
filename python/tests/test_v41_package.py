"""ced.v41's helpers that a port calls or meets directly: the built-in configs, as_array on torch tensors, and
checkpoint_for's cache of the golden files' checkpoints."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

import ced.v41 as v41
from ced.v41.engine import as_array
from ced.v41.golden import GoldenRun


def test_the_builtin_configs_are_listed_runnable_ones_first():
    assert v41.builtin_configs() == ["v41-tiny", "v41-wide", "v41-ced", "v41-flash"]


class FakeTensor:
    """What as_array reads of a torch tensor, without torch: detach() and cpu(), a dtype whose str is torch's,
    float() widening to fp32, and numpy() refused for bf16 and fp16 as torch refuses bf16."""

    def __init__(self, values, dtype):
        self.values, self.dtype = values, dtype

    def detach(self):
        return self

    def cpu(self):
        return self

    def float(self):
        return FakeTensor(self.values, "torch.float32")

    def numpy(self):
        if self.dtype != "torch.float32":
            raise TypeError(f"Got unsupported ScalarType {self.dtype}")
        return np.array(self.values, np.float32)


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
def test_as_array_widens_a_half_precision_tensor_before_asking_numpy(dtype):
    got = as_array(FakeTensor([1.5, -2.0, 0.25], dtype))
    assert got.dtype == np.float64
    assert got.tolist() == [1.5, -2.0, 0.25]


def _golden(weight_seed, boost="", digest="0" * 64):
    return GoldenRun(path=Path("planted.h5"), config_name="v41-tiny", regime="release", weight_seed=weight_seed,
                     weights_digest=digest, provenance={"boost": boost}, tokens=None, result={})


def test_a_boosted_checkpoint_is_cached_under_the_first_8_hex_digits_of_its_boosts_sha256(tmp_path):
    """The cache folder's name is CONFIG-sSEED-KEY, KEY the first 8 hex digits of the sha256 of the boosts joined
    by commas ("plain" without): a folder of that name holding a checkpoint is taken as it is."""
    boost = "layers.0.ffn.experts.0.w1.weight=64,layers.1.attn.wq_a.weight=8"
    key = hashlib.sha256(boost.encode()).hexdigest()[:8]
    folder = tmp_path / f"v41-tiny-s0-{key}"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text("{}")
    assert v41.checkpoint_for(_golden(0, boost), tmp_path) == folder
    plain = tmp_path / "v41-tiny-s0-plain"  # without boosts
    plain.mkdir()
    (plain / "model.safetensors.index.json").write_text("{}")
    assert v41.checkpoint_for(_golden(0), tmp_path) == plain


def test_a_checkpoint_made_again_with_another_digest_than_the_files_is_refused(tmp_path):
    """checkpoint_for exports the file's config and seed and compares the digest with the one the golden file
    records: a file recording another digest (here all zeros) is refused, naming both."""
    with pytest.raises(ValueError, match=r"planted.h5: its checkpoint made again has digest [0-9a-f]+, the file's is "
                                         r"0{64}"):
        v41.checkpoint_for(_golden(0), tmp_path)
