"""ReplayConfig: bad values name their key, every problem is reported, presets resolve."""

import pytest

from recipe.darl.core import ReplayBuffer, ReplayConfig


@pytest.mark.parametrize(
    "values,key",
    [
        ({"k": 0}, "replay.k"),
        ({"k": 2.5}, "replay.k"),
        ({"warmup": -1}, "replay.warmup"),
        ({"max_score": 1.0}, "unknown replay key"),  # a retired design's key
        ({"max_reuse": 0}, "replay.max_reuse"),
        ({"max_groups": 0}, "replay.max_groups"),
        ({"behavior_weight": "mis"}, "replay.behavior_weight"),
        ({"source_weight": "mean"}, "replay.source_weight"),
        ({"clip_decay": 0.0}, "replay.clip_decay"),
        ({"clip_decay": 1.5}, "replay.clip_decay"),
        ({"order": "variance"}, "replay.order"),
        ({"stop_grad": "yes"}, "replay.stop_grad"),
    ],
)
def test_bad_value_names_its_key(values, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        ReplayConfig.from_dict(values)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ValueError) as err:
        ReplayConfig(k=0, warmup=-2, clip_decay=2.0)
    text = str(err.value)
    assert "replay.k" in text and "replay.warmup" in text and "replay.clip_decay" in text


def test_unknown_key_is_an_error():
    with pytest.raises(ValueError, match=r"replay\.pmsi"):
        ReplayConfig.from_dict({"enable": True, "pmsi": True})


def test_presets_follow_pmis_unless_overridden():
    """Behavior weights follow `pmis`; source weights are by tokens under either unless set."""
    assert (ReplayConfig(pmis=True).resolved_behavior_weight, ReplayConfig(pmis=True).resolved_source_weight) == ("pmis", "tokens")
    assert (ReplayConfig(pmis=False).resolved_behavior_weight, ReplayConfig(pmis=False).resolved_source_weight) == ("own", "tokens")
    cfg = ReplayConfig(pmis=True, behavior_weight="own", source_weight="ess")
    assert (cfg.resolved_behavior_weight, cfg.resolved_source_weight) == ("own", "ess")


def test_buffer_rejects_bad_parameters_by_name():
    with pytest.raises(ValueError, match=r"replay\.k"):
        ReplayBuffer(ReplayConfig(pmis=False, k=0))
    with pytest.raises(ValueError, match=r"replay\.warmup"):
        ReplayBuffer(ReplayConfig(pmis=False, k=2, warmup=-1))
    with pytest.raises(ValueError, match=r"replay\.max_groups"):
        ReplayBuffer(ReplayConfig(pmis=False, k=2, max_groups=0))
