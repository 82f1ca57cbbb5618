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
# The same prompt on two checkpoints (plain and hot), and decode steps: a request's key must tell them apart.
FILES = [v41.golden_dir() / f for f in ("tiny-fp8-n17.h5", "tiny-fp8-n17-hot.h5", "tiny-fp8-n13-d8.h5")]


def verdicts(rep):
    return [(v.pass_, v.layer, v.kind, v.ok, v.where, v.max_ulp16) for v in rep.verdicts]


def test_a_failing_gate_reproduces_from_its_recording_without_the_engine(tmp_path, checkpoints):
    live = v41.gate(v41.ReferenceEngine(fault="v4-q-norm"), FILES, checkpoints=checkpoints, record=tmp_path / "rec",
                    quiet=True)
    assert not live.passed
    index = json.loads((tmp_path / "rec" / "index.json").read_text())
    assert index["name"].startswith("v41-reference") and index["calls"][0]["method"] == "load"
    again = v41.gate(v41.replay(tmp_path / "rec"), FILES, checkpoints=checkpoints, quiet=True)
    assert verdicts(again) == verdicts(live)
    assert (again.first_failure.layer, again.first_failure.kind) == (0, "attn_q (forced x)")


def test_a_replay_answers_a_clean_engine_as_recorded_and_refuses_what_was_not(tmp_path, checkpoints):
    live = v41.gate(v41.ReferenceEngine(), FILES, checkpoints=checkpoints, record=tmp_path / "rec", quiet=True)
    assert live.passed and any(v.kind == "decode logits (end to end)" for v in live.verdicts)
    assert verdicts(v41.gate(v41.replay(tmp_path / "rec"), FILES, checkpoints=checkpoints, quiet=True)) == \
        verdicts(live)
    engine = v41.replay(tmp_path / "rec")
    with pytest.raises(KeyError, match="was not loaded in the recording"):
        engine.load("/nowhere/v41-wide-s0-plain")
    engine.load(str(checkpoints / "v41-tiny-s0-plain"))
    with pytest.raises(KeyError, match="prefill with these arguments was not recorded"):
        engine.prefill(np.arange(5, dtype=np.int64))


def test_a_folder_without_a_recording_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="no index.json"):
        v41.replay(tmp_path)


def test_a_decode_step_replays_the_answer_of_its_place_in_the_sequence(tmp_path, checkpoints):
    """The same token decoded twice, after two prompts: four answers, each replayed in its place."""
    folder = str(v41.checkpoint_for(v41.read_golden(FILE[0]), checkpoints))
    live = v41.Recorder(v41.ReferenceEngine(), tmp_path / "rec")
    live.load(folder)
    answers = []
    for prompt in (np.arange(5, dtype=np.int64), np.arange(1, 6, dtype=np.int64)):
        live.prefill(prompt)
        answers += [np.array(live.decode(7)), np.array(live.decode(7))]
    assert not np.array_equal(answers[0], answers[1]) and not np.array_equal(answers[0], answers[2])
    again = v41.replay(tmp_path / "rec")
    again.load(folder)
    for k, prompt in enumerate((np.arange(5, dtype=np.int64), np.arange(1, 6, dtype=np.int64))):
        again.prefill(prompt)
        assert np.array_equal(again.decode(7), answers[2 * k]) and np.array_equal(again.decode(7), answers[2 * k + 1])
