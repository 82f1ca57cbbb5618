"""The CED properties (docs/spec.md §4.4) hold on the PyTorch engine; each check is also shown
failing on a planted engine."""
import pytest
import torch

from ced_torch import properties as prop
from ced_torch.config import Config
from ced_torch.model import Engine

CONFIGS = ["tiny", "small"]


@pytest.fixture
def plant_source_only_write(monkeypatch):
    """A bug: the source-only write (docs/spec.md §4.2 step 2) reads H_E + 2^-20 (not a scaling,
    which the RMSNorm would undo)."""
    original = Engine._source_only_write

    def planted(self, state, pos, h_E):
        return original(self, state, pos, h_E + 2.0**-20)

    monkeypatch.setattr(Engine, "_source_only_write", planted)


@pytest.fixture
def plant_exact_is_bounded(monkeypatch):
    """A bug: replay `exact` replays only W positions."""
    original = Config.n_replay
    monkeypatch.setattr(Config, "n_replay", lambda self, r: self.window if r == "exact" else original(self, r))


@pytest.fixture
def plant_bounded_replays_all(monkeypatch):
    """A bug: replay `bounded` replays the whole prompt (no truncation at all)."""
    original = Config.n_replay
    monkeypatch.setattr(Config, "n_replay", lambda self, r: 10**9 if r == "bounded" else original(self, r))


@pytest.mark.parametrize("name", CONFIGS)
def test_replay_full_equals_full_bitwise(name):
    assert prop.replay_full_equals_full(prop.engine(name), prop.GOLDEN_N[name]) == []


@pytest.mark.parametrize("name", CONFIGS)
def test_replay_full_check_fails_on_a_perturbed_source_only_write(name, plant_source_only_write):
    assert prop.replay_full_equals_full(prop.engine(name), prop.GOLDEN_N[name]) != []


def _exact_bound(golden_dir, name):
    return prop.calibrated_bound(golden_dir, f"{name}.h5", "runs/ced-exact/logits")


@pytest.mark.parametrize("name", CONFIGS)
def test_exact_replay_equals_full_at_the_last_position_within_the_calibrated_bound(name, golden_dir):
    # bound: golden/policy-calibrated.toml on runs/ced-exact/logits, 8x the f32 reference's own error
    assert prop.exact_replay_within(prop.engine(name), prop.GOLDEN_N[name], _exact_bound(golden_dir, name)) == []


@pytest.mark.parametrize("name", CONFIGS)
def test_exact_replay_check_fails_when_exact_replays_only_the_window(name, golden_dir, plant_exact_is_bounded):
    assert prop.exact_replay_within(prop.engine(name), prop.GOLDEN_N[name], _exact_bound(golden_dir, name)) != []


@pytest.mark.parametrize("name", CONFIGS)
def test_bounded_replay_drift_is_reported_and_above_the_exact_bound(name, golden_dir, capsys):
    drift, problems = prop.bounded_drift_visible(prop.engine(name), prop.GOLDEN_N[name],
                                                 _exact_bound(golden_dir, name))
    with capsys.disabled():
        print(f"\n[torch engine] {name} N={prop.GOLDEN_N[name]}: bounded replay drift of the last "
              f"logits (rel L2 against full) {drift:.3e}")
    assert problems == []


@pytest.mark.parametrize("name", CONFIGS)
def test_bounded_drift_check_fails_when_bounded_replays_everything(name, golden_dir, plant_bounded_replays_all):
    _, problems = prop.bounded_drift_visible(prop.engine(name), prop.GOLDEN_N[name], _exact_bound(golden_dir, name))
    assert problems != []


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("replay", ["bounded", 9])
def test_decoder_outputs_are_exact_inside_the_cone_and_only_there(name, replay):
    assert prop.cone_holds(prop.engine(name, torch.float64), prop.GOLDEN_N[name], replay) == []


def test_cone_check_fails_on_a_perturbed_source_only_write(plant_source_only_write):
    assert prop.cone_holds(prop.engine("tiny", torch.float64), prop.GOLDEN_N["tiny"], "bounded") != []
