"""Record and replay: a gate's requests and answers saved in a folder reproduce its verdicts without the engine."""
from __future__ import annotations

import json

import numpy as np
import pytest

import ced.v41 as v41


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tmp_path_factory.mktemp("v41-record-checkpoints")


FILE = [v41.golden_dir() / "tiny-fp8-n17.h5"]


def verdicts(rep):
    return [(v.pass_, v.layer, v.kind, v.ok, v.where, v.max_ulp16) for v in rep.verdicts]


def test_a_failing_gate_reproduces_from_its_recording_without_the_engine(tmp_path, checkpoints):
    live = v41.gate(v41.ReferenceEngine(fault="v4-q-norm"), FILE, checkpoints=checkpoints, record=tmp_path / "rec",
                    quiet=True)
    assert not live.passed
    index = json.loads((tmp_path / "rec" / "index.json").read_text())
    assert index["name"].startswith("v41-reference") and index["calls"][0]["method"] == "load"
    again = v41.gate(v41.replay(tmp_path / "rec"), FILE, checkpoints=checkpoints, quiet=True)
    assert verdicts(again) == verdicts(live)
    assert (again.first_failure.layer, again.first_failure.kind) == (0, "attn_out (forced x)")


def test_a_replay_refuses_a_request_that_was_not_recorded(tmp_path, checkpoints):
    v41.gate(v41.ReferenceEngine(), FILE, checkpoints=checkpoints, record=tmp_path / "rec", quiet=True)
    engine = v41.replay(tmp_path / "rec")
    with pytest.raises(KeyError, match="prefill with these arguments was not recorded"):
        engine.prefill(np.arange(5, dtype=np.int64))


def test_a_folder_without_a_recording_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="no index.json"):
        v41.replay(tmp_path)
