"""DARTS' core (recipe/darl/core/darts.py) on hand-computed cases."""

from __future__ import annotations

import pytest

from recipe.darl.core.darts import DartsConfig, LengthSpreadEma, allocate, dual_end_keep, normalise


def test_normalise_is_darts_min_max_with_plus_one():
    assert normalise([1.0, 4.0]) == pytest.approx([1 / 3, 4 / 3])  # (v - 1 + 1) / (4 - 1)
    assert normalise([2.0, 2.0, 2.0]) == [1.0, 1.0, 1.0]
    assert normalise([]) == []


def test_allocate_greedy_by_hand():
    # v' = [1/3, 4/3], the unseen prompt takes their mean 5/6; r starts at n = 4, 15 - 12 = 3 extra responses.
    # v/(r(r+1)) at r = 4: 1/60, 4/60, 2.5/60 -> prompt 1 (5); then 4/90 = 0.0444 > 2.5/60 = 0.0417 -> prompt 1 (6);
    # then 2.5/60 > 4/126 = 0.0317 -> prompt 2 (5)
    assert allocate([1.0, 4.0, None], n=4, mean_ratio=1.25, low=4, high=8) == [4, 6, 5]


def test_allocate_respects_bounds_and_total():
    counts = allocate([0.0, 100.0, 50.0, None], n=4, mean_ratio=1.5, low=4, high=6)
    assert sum(counts) == 24 and max(counts) <= 6 and min(counts) >= 4
    assert counts[1] == 6  # the widest spread saturates first
    assert allocate([None, None], n=8, mean_ratio=1.25, low=8, high=16) == [10, 10]  # nothing known: even split


def test_dual_end_keeps_first_and_last_finishers():
    assert dual_end_keep([5, 2, 7, 1, 0], n=3, keep_last=1) == [5, 2, 0]
    assert dual_end_keep([5, 2, 7, 1, 0], n=3, keep_last=0) == [5, 2, 7]
    with pytest.raises(ValueError, match="fewer than the n=3"):
        dual_end_keep([1, 2], n=3, keep_last=0)


def test_length_spread_ema():
    ema = LengthSpreadEma(alpha=0.3)
    assert ema.update("a", [2, 4]) == pytest.approx(1.0)  # population std
    assert ema.update("a", [0, 6]) == pytest.approx(0.3 * 3 + 0.7 * 1)
    restored = LengthSpreadEma(0.3, ema.state_dict())
    assert restored.get("a") == pytest.approx(1.6) and restored.get("b") is None


def test_config_problems_name_their_keys():
    problems = DartsConfig.problems_of({"enable": True, "responses": 3, "keep_last": 4, "ema_alpha": 0.0,
                                          "typo": 1}, n=4)
    text = "\n".join(problems)
    assert "rollout_shaping.typo" in text and "rollout_shaping.responses must be null or an integer >= " in text
    assert "rollout_shaping.keep_last (L) must be an integer in [0, rollout.n=4)" in text
    assert "rollout_shaping.ema_alpha must be in (0, 1]" in text
    bounds = DartsConfig.problems_of({"adaptive": True, "min_responses": 6, "max_responses": 5}, n=4)
    assert bounds == ["rollout_shaping.min_responses=6 exceeds rollout_shaping.max_responses=5"]
    mean = DartsConfig.problems_of({"adaptive": True, "mean_ratio": 2.5}, n=4)
    assert mean and "outside [min_responses, max_responses] = [4, 8]" in mean[0]
    assert DartsConfig.problems_of({"adaptive": True, "responses": 5}, n=4)  # one of them
    assert DartsConfig.problems_of({"enable": True, "adaptive": True}, n=8) == []
    with pytest.raises(ValueError, match="invalid rollout_shaping config"):
        DartsConfig.from_dict({"keep_last": -1}, n=4)


def test_fixed_responses_default_from_mean_ratio():
    assert DartsConfig().fixed_responses(8) == 10  # the released default: r = 10 for n = 8
    assert DartsConfig(responses=5).fixed_responses(4) == 5
    assert DartsConfig().bounds(4) == (4, 8)
