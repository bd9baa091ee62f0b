"""DARTS' core (recipe/darl/core/darts.py) on hand-computed cases."""

from __future__ import annotations

import pytest

from recipe.darl.core.darts import DartsConfig, LengthSpreadEma, allocate, dual_end_keep, normalise, split_counts


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
    assert ema.update("a", [2, 4]) == pytest.approx(2 ** 0.5)  # sample std: sqrt(((2-3)^2 + (4-3)^2) / 1)
    assert ema.update("a", [0, 6]) == pytest.approx(0.3 * 18 ** 0.5 + 0.7 * 2 ** 0.5)
    assert ema.update("single", [5]) == 0.0
    restored = LengthSpreadEma(0.3, ema.state_dict())
    assert restored.get("a") == pytest.approx(0.3 * 18 ** 0.5 + 0.7 * 2 ** 0.5) and restored.get("b") is None


def test_ema_recency_follows_the_latest_update():
    ema = LengthSpreadEma(alpha=0.3)
    for key in ("a", "b", "c"):
        ema.update(key, [1, 2])
    ema.update("a", [1, 3])  # updated again: now the most recent
    assert ema.recent(2) == ["c", "a"] and ema.recent(0) == []
    assert LengthSpreadEma(0.3, ema.state_dict()).recent(3) == ["b", "c", "a"]  # the order survives a checkpoint


def test_split_counts_in_proportion_to_the_parts():
    assert split_counts(4, [8]) == [4]
    assert split_counts(4, [6, 2]) == [3, 1]  # a group split 6 + 2 across two workers: each part gets slack
    assert split_counts(1, [7, 1]) == [1, 0] and split_counts(1, [4, 4]) == [1, 0]  # ties: the first part
    assert split_counts(5, [3, 3, 2]) == [2, 2, 1] and sum(split_counts(7, [5, 2, 1])) == 7


def test_config_problems_name_their_keys():
    problems = DartsConfig.problems_of({"enable": True, "responses": 3, "keep_last": 4, "ema_alpha": 0.0,
                                          "typo": 1}, n=4)
    text = "\n".join(problems)
    assert "rollout_shaping.typo" in text and "rollout_shaping.responses must be null or an integer >= " in text
    assert "rollout_shaping.keep_last (L) must be null or an integer in [0, rollout.n=4)" in text
    assert "rollout_shaping.ema_alpha must be in (0, 1]" in text
    bounds = DartsConfig.problems_of({"adaptive": True, "min_responses": 6, "max_responses": 5}, n=4)
    assert bounds == ["rollout_shaping.min_responses=6 exceeds rollout_shaping.max_responses=5"]
    mean = DartsConfig.problems_of({"adaptive": True, "mean_ratio": 2.5}, n=4)
    assert mean and "outside [min_responses, max_responses] = [5, 8]" in mean[0]
    assert DartsConfig.problems_of({"adaptive": True, "responses": 5}, n=4)  # one of them
    assert DartsConfig.problems_of({"enable": True, "adaptive": True}, n=8) == []
    with pytest.raises(ValueError, match="invalid rollout_shaping config"):
        DartsConfig.from_dict({"keep_last": -1}, n=4)


def test_released_defaults():
    # the released streaming trainer, n = 8: r_i in [10, 16] with mean 12, L_i = (16 - r_i) // 2, 10 warm-up steps
    c = DartsConfig(adaptive=True)
    assert c.bounds(8) == (10, 16) and c.mean_ratio * 8 == 12 and c.warmup_steps == 10
    assert [c.keep_last_for(r, 8) for r in (10, 12, 13, 15, 16)] == [3, 2, 1, 0, 0]
    assert DartsConfig(keep_last=0).keep_last_for(10, 8) == 0  # a set L holds for every group
    assert c.keep_last_for(4, 2) == 0  # at most n - 1
    assert DartsConfig(adaptive=True, max_responses=40).keep_last_for(8, 8) == 7
    # fixed r in ray_trainer_stream_dapo.py (the warm-up and reset paths): r = 12, every tail cut once n finish
    fixed = DartsConfig()
    assert fixed.fixed_responses(8) == 12 and fixed.keep_last_for(12, 8) == 0
    assert DartsConfig(responses=5).fixed_responses(4) == 5
    # ray_trainer_darts.py (the script the released README runs): r = 10 for every prompt, L = min((16 - r) // 2, 1)
    stream = DartsConfig(variant="stream")
    assert stream.fixed_responses(8) == 10 and stream.keep_last_for(10, 8) == 1 and stream.keep_last_for(15, 8) == 0
    assert DartsConfig(variant="stream", keep_last=0).keep_last_for(10, 8) == 0
    assert "variant=stream has no adaptive" in DartsConfig.problems_of({"variant": "stream", "adaptive": True}, 8)[0]
    assert "rollout_shaping.variant must be one of" in DartsConfig.problems_of({"variant": "dapo"}, 8)[0]
    assert DartsConfig.problems_of({"warmup_steps": -1}, n=8) == [
        "rollout_shaping.warmup_steps must be an integer >= 0, got -1"]
