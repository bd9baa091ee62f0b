"""Success replay (`replay.success`) and prioritized replay (`replay.order=variance`), by hand."""

import numpy as np
import pytest
import torch

from recipe.darl.core import (
    Group,
    ReplayBuffer,
    ReplayConfig,
    SuccessStore,
    batch_weights,
    reward_variance,
    select_for_step,
    select_groups,
)


def group(uid: str, version: int, rewards: list[float], prompt=(5, 6, 7), lengths=None, base=0.0) -> Group:
    """A group of len(rewards) responses; response i has tokens 10 * i + j and log-probs base - 0.1 * (i + 1)."""
    n = len(rewards)
    lengths = lengths or [2] * n
    width = max(lengths)
    responses = torch.tensor([[10 * i + j for j in range(width)] for i in range(n)])
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()
    lp = torch.tensor([[base - 0.1 * (i + 1)] * width for i in range(n)])
    return Group.from_padded(
        uid=uid, version=version, prompt_ids=torch.tensor(prompt), prompt_length=len(prompt), responses=responses,
        response_lengths=torch.tensor(lengths), response_mask=mask, rollout_log_probs=lp,
        rewards=torch.tensor(rewards),
        non_tensors={"uid": np.array([uid] * n, dtype=object), "min_global_steps": np.array([version] * n, dtype=object),
                     "acc": np.array(rewards, dtype=object)})


def test_an_all_wrong_group_takes_the_stored_success_with_its_own_version_and_log_probs():
    buf = ReplayBuffer(k=1, warmup=0, success=1)
    first = group("a", 3, [0.0, 1.0, 0.0], lengths=[2, 3, 2], base=-1.0)
    cands = buf.begin_step([first], 3)
    assert cands.grafted == 0
    buf.end_step(cands, cands.fresh)
    assert len(buf.successes) == 1  # response 1 of group "a": tokens 10, 11, 12

    wrong = group("b", 5, [0.0, 0.0, 0.0], lengths=[2, 2, 1])
    cands = buf.begin_step([wrong], 5)
    assert cands.grafted == 1 and cands.fresh == [wrong]  # no longer zero-advantage: it passes the filter
    assert wrong.rewards.tolist() == [0.0, 0.0, 1.0]
    assert wrong.versions.tolist() == [5, 5, 3]
    assert wrong.lengths.tolist() == [2, 2, 3]
    assert wrong.padded("response_ids", 3, -1)[2].tolist() == [10, 11, 12]
    assert wrong.padded("rollout_log_probs", 3)[2].tolist() == pytest.approx([-1.2] * 3)  # mu_3 of that response
    assert wrong.padded("rollout_log_probs", 3)[0].tolist() == pytest.approx([-0.1, -0.1, 0.0])  # untouched
    assert list(wrong.non_tensors["uid"]) == ["b"] * 3  # the group's uid: GRPO groups it with the others
    assert list(wrong.non_tensors["min_global_steps"]) == [5, 5, 3]
    assert list(wrong.non_tensors["acc"]) == [0.0, 0.0, 1.0]
    # a grafted response is not stored a second time
    buf.end_step(cands, cands.fresh)
    assert buf.successes.totals == {"stored": 1, "grafted": 1, "expired": 0}


def test_groups_with_a_success_other_prompts_and_expired_successes_are_left_alone():
    store = SuccessStore(per_prompt=1, max_age=2)
    store.add_from([group("a", 1, [1.0, 0.0])], step=1)
    ok = group("b", 2, [1.0, 0.0])  # has its own success
    other = group("c", 3, [0.0, 0.0], prompt=(9, 9))  # another prompt
    assert store.graft_into([ok, other], 3) == 0
    assert ok.sample_versions is None and other.sample_versions is None
    assert store.graft_into([group("d", 3, [0.0, 0.0])], 3) == 1  # age 2 <= max_age
    assert store.graft_into([group("e", 4, [0.0, 0.0])], 4) == 0  # age 3 > max_age
    store.add_from([], step=4)
    assert len(store) == 0 and store.totals["expired"] == 1


def test_the_store_keeps_the_newest_successes_per_prompt_and_survives_a_checkpoint():
    store = SuccessStore(per_prompt=2)
    store.add_from([group("a", 1, [1.0, 1.0, 0.0], base=-1.0)], step=1)  # two successes (responses 0, 1)
    store.add_from([group("b", 2, [0.0, 0.0, 1.0], base=-2.0)], step=2)  # one more: the oldest goes
    kept = store.store[group("x", 0, [0.0]).prompt_key]
    assert [(s.version, s.rollout_log_probs[0].item()) for s in kept] == [(1, pytest.approx(-1.2)), (2, pytest.approx(-2.3))]
    restored = SuccessStore(per_prompt=2)
    restored.load_state_dict(store.state_dict())
    target, twin = group("c", 3, [0.0, 0.0]), group("c", 3, [0.0, 0.0])
    store.graft_into([target], 3)
    restored.graft_into([twin], 3)
    assert twin.versions.tolist() == target.versions.tolist() == [3, 2]  # the newest success
    assert torch.equal(twin.rollout_log_probs, target.rollout_log_probs)


def test_the_buffer_checkpoint_holds_the_store_and_refuses_a_mismatched_resume():
    buf = ReplayBuffer(k=2, warmup=0, success=1)
    cands = buf.begin_step([group("a", 1, [1.0, 0.0])], 1)
    buf.end_step(cands, cands.fresh)
    state = buf.state_dict()
    again = ReplayBuffer(k=2, warmup=0, success=1)
    again.load_state_dict(state)
    assert len(again.successes) == 1
    plain = ReplayBuffer(k=2, warmup=0).state_dict()
    with pytest.raises(ValueError, match="replay.success"):
        ReplayBuffer(k=2, warmup=0, success=1).load_state_dict(plain)


def test_a_grafted_response_is_its_own_source_in_the_multi_behavior_weights():
    g = group("b", 5, [0.0, 0.0])
    g.sample_versions = torch.tensor([5, 3])
    mask = torch.ones(2, 2, dtype=torch.bool)
    rollout = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]])
    old = torch.tensor([[-1.0, -1.0], [-1.5, -1.0]])
    w = batch_weights(mask, old, rollout, g.versions, "own", "tokens", threshold=2.0)
    assert w.sources == [3, 5]
    # own weights: rho = pi_old / mu_v, truncated at C = 2: exp(0.5) = 1.65 and exp(1.0) -> 2 on the grafted row
    rho = (old - w.log_denominator).exp().clamp(max=2.0)
    assert rho[1].tolist() == pytest.approx([1.6487, 2.0], abs=1e-4)
    # tokens source weights: alpha = 2/4 each, so every token's coefficient is 1/4 (= the plain token mean)
    assert w.token_coef.flatten().tolist() == pytest.approx([0.25] * 4)


def test_config_keys_are_checked_and_name_the_key():
    assert ReplayConfig(enable=True, success=2, success_max_age=10).success == 2
    for bad in ({"success": 0}, {"success": True}, {"success": "yes"}):
        with pytest.raises(ValueError, match="replay.success must be"):
            ReplayConfig(**bad)
    with pytest.raises(ValueError, match="replay.success_max_age"):
        ReplayConfig(success=1, success_max_age=0)
    with pytest.raises(ValueError, match="replay.success is off"):
        ReplayConfig(success_max_age=5)
    with pytest.raises(ValueError, match="'variance'"):
        ReplayConfig(order="priority")


def test_variance_order_ranks_groups_solved_half_the_time_first():
    # reward variances: 0.25 (2 of 4), 0.1875 (3 of 4), 0 (all wrong), 0.25 but trained once before
    groups = [group("a", 4, [1, 0, 1, 0]), group("b", 4, [1, 1, 1, 0]), group("c", 4, [0, 0, 0, 0]),
              group("d", 4, [0, 1, 0, 1])]
    groups[3].times_trained = 1
    assert [reward_variance(g) for g in groups] == pytest.approx([0.25, 0.1875, 0.0, 0.25])
    for i, g in enumerate(groups):
        g.seq = i
    sel = select_for_step(groups, [], ReplayConfig(order="variance", ratio=False), budget=3, multiple=1, min_multiple=1)
    assert sel.selected == [0, 3, 1]  # ties on variance: the less reused first
    # additive composition: the fresh group comes first whatever its priority, then one replayed group
    fresh = [groups[2]]
    sel = select_for_step(groups, fresh, ReplayConfig(order="variance", ratio=0.5), budget=2, multiple=1, min_multiple=1)
    assert sel.selected == [2, 0]
    with pytest.raises(ValueError, match="priority"):
        select_groups(2, torch.tensor([1, 1]), torch.tensor([0, 1]), order="variance", reuse=torch.tensor([0, 0]))


def test_a_bad_store_setting_names_its_key():
    with pytest.raises(ValueError, match="replay.success must be"):
        SuccessStore(per_prompt=0)
    with pytest.raises(ValueError, match="replay.success_max_age"):
        SuccessStore(per_prompt=1, max_age=0)
