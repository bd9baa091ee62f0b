"""chi2 scores by hand (the `replay/chi2_*` metrics); selection: order, ties, budget and divisibility."""

import math

import pytest
import torch

from recipe.darl.core import group_multiple, group_scores, sample_chi2, select_groups


def test_chi2_by_hand():
    # sample 0: w = 2, 0.5 -> ((2-1)^2 + (0.5-1)^2) / 2 = 0.625; sample 1: w = 1 at its one token -> 0
    old = torch.tensor([[math.log(2.0), math.log(0.5), 9.0], [0.3, 7.0, 7.0]])
    rollout = torch.tensor([[0.0, 0.0, 0.0], [0.3, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert sample_chi2(old, rollout, mask).tolist() == pytest.approx([0.625, 0.0])


def test_chi2_clamps_and_rejects_bad_samples():
    old = torch.tensor([[100.0], [float("nan")], [0.0], [float("-inf")]])
    rollout = torch.zeros(4, 1)
    mask = torch.tensor([[1], [1], [0], [1]])
    scores = sample_chi2(old, rollout, mask)
    assert scores[0].item() == pytest.approx((math.exp(20.0) - 1) ** 2, rel=1e-5)  # clamped at 20, finite
    assert scores[1:].tolist() == [math.inf] * 3  # NaN, no response token, -inf: never eligible
    with pytest.raises(ValueError, match="rollout_log_probs"):
        sample_chi2(old, rollout[:2], mask)


def test_group_score_is_the_mean_of_its_samples():
    scores = torch.tensor([1.0, 3.0, 10.0, 0.5, 0.5, 2.0])
    index = torch.tensor([0, 0, 1, 2, 2, 1])
    assert group_scores(scores, index, 3).tolist() == pytest.approx([2.0, 6.0, 0.5])


def test_least_reused_first_then_newer_version_then_earlier_arrival():
    versions = torch.tensor([1, 2, 2, 1, 2])
    arrival = torch.tensor([0, 5, 4, 1, 2])
    reuse = torch.tensor([0, 0, 0, 0, 1])
    assert select_groups(5, versions, arrival, order="least_reused", reuse=reuse).selected == [2, 1, 0, 3, 4]
    with pytest.raises(ValueError, match="needs reuse"):
        select_groups(5, versions, arrival, order="least_reused")


def test_selection_rounds_down_to_the_group_multiple_or_skips():
    versions = torch.zeros(5, dtype=torch.long)
    arrival = torch.arange(5)
    sel = select_groups(8, versions, arrival, multiple=2)
    assert sel.selected == [0, 1, 2, 3] and sel.budget == 8 and sel.eligible == 5  # 5 groups -> 4
    sel = select_groups(8, versions[:1], arrival[:1], multiple=2)
    assert sel.skipped and sel.selected == [] and "multiple of 2" in sel.reason


def test_fewer_than_a_mini_batch_trains_a_smaller_one_when_allowed():
    versions = torch.zeros(5, dtype=torch.long)
    arrival = torch.arange(5)
    assert select_groups(16, versions, arrival, multiple=8).skipped
    sel = select_groups(16, versions, arrival, multiple=8, min_multiple=2)
    assert sel.selected == [0, 1, 2, 3] and not sel.skipped
    sel = select_groups(16, versions[:1], arrival[:1], multiple=8, min_multiple=2)
    assert sel.skipped and "multiple of 2" in sel.reason
    with pytest.raises(ValueError, match="min_multiple"):
        select_groups(16, versions, arrival, multiple=8, min_multiple=9)


def test_uniform_mode_takes_newest_first():
    versions = torch.tensor([3, 5, 4, 5, 3])
    arrival = torch.tensor([0, 6, 3, 5, 1])
    assert select_groups(3, versions, arrival).selected == [3, 1, 2]
    with pytest.raises(ValueError, match="order"):
        select_groups(3, versions, arrival, order="chi2")


def test_group_multiple():
    assert group_multiple(n=8, ppo_mini_batch_size=4, dp_size=2) == 4
    assert group_multiple(n=1, ppo_mini_batch_size=4, dp_size=8) == 8
    assert group_multiple(n=3, ppo_mini_batch_size=2, dp_size=4) == 4
    with pytest.raises(ValueError, match="dp_size"):
        group_multiple(n=8, ppo_mini_batch_size=4, dp_size=0)


@pytest.mark.parametrize("kwargs,name", [({"budget": 0}, "budget"), ({"multiple": 0}, "multiple"),
                                         ({"arrival": torch.arange(2)}, "arrival")])
def test_selection_rejects_bad_parameters(kwargs, name):
    args = {"budget": 2, "versions": torch.zeros(3), "arrival": torch.arange(3)} | kwargs
    with pytest.raises(ValueError, match=name):
        select_groups(**args)
