"""Per-prompt replay (`replay.prompt_replay`, RePO), by hand: which responses a returning prompt replays, how its
history group is built and weighted, and what the buffer does with it."""

import math

import pytest
import torch

from recipe.darl.core import PromptStore, ReplayBuffer, ReplayConfig, batch_weights, select_for_step
from groups import group


def _visit(buf: ReplayBuffer, groups, step):
    cands = buf.begin_step(groups, step)
    buf.end_step(cands, cands.fresh)
    return cands


def test_a_returning_prompt_replays_its_best_stored_responses_as_a_group_of_its_own():
    buf = ReplayBuffer(ReplayConfig(pmis=False, k=1, warmup=0, prompt_replay=4))
    # first visit (version 1): rewards 0, 1, 0; log-probs -1.1, -1.2, -1.3 (base -1)
    first = _visit(buf, [group("a", 1, [0.0, 1.0, 0.0], lengths=[2, 3, 2], base=-1.0)], 1)
    assert first.history == [] and len(buf.prompts) == 3
    # second visit (version 2), all wrong: its own group has no advantage; the 3 stored responses (n = 3) of
    # visit 1 make its history group
    second = group("b", 2, [0.0, 0.0, 0.0], base=-2.0)
    cands = buf.begin_step([second], 2)
    assert cands.dropped_zero_adv == 1
    (hist,) = cands.history
    # highest reward first, ties newest first: response 1 (reward 1), then 2, then 0 of visit 1
    assert hist.rewards.tolist() == [1.0, 0.0, 0.0]
    assert hist.versions.tolist() == [1, 1, 1] and hist.version == 1
    assert hist.lengths.tolist() == [3, 2, 2]
    assert hist.padded("response_ids", 3, -1).tolist() == [[10, 11, 12], [20, 21, -1], [0, 1, -1]]
    assert hist.padded("rollout_log_probs", 3)[:, 0].tolist() == pytest.approx([-1.2, -1.3, -1.1])
    assert hist.uid == "b:history" and list(hist.non_tensors["uid"]) == ["b:history"] * 3  # GRPO: its own group
    assert list(hist.non_tensors["min_global_steps"]) == [1, 1, 1]
    assert list(hist.non_tensors["acc"]) == [1.0, 0.0, 0.0]
    assert torch.equal(hist.prompt_ids, second.prompt_ids) and hist.seq == second.seq
    # it is trained like a fresh group, and never enters the buffer; visit 2's responses join the store (cap 4)
    assert cands.fresh == [hist] and cands.candidates == [hist]
    buf.end_step(cands, cands.fresh)
    assert buf.groups == [] and len(buf.prompts) == 4
    assert buf.prompts.totals["history_groups"] == 1


def test_mixed_versions_ties_equal_rewards_and_other_prompts():
    store = PromptStore(per_prompt=4)
    store.add_from([group("a", 1, [1.0, 0.0], base=-1.0)], step=1)
    store.add_from([group("b", 3, [1.0, 0.0], base=-3.0)], step=3)
    # stored, oldest first: (v1, r1), (v1, r0), (v3, r1), (v3, r0); n = 2: the two successes, newest first
    (hist,) = store.history_groups([group("c", 5, [0.0, 0.0])])
    assert hist.rewards.tolist() == [1.0, 1.0] and hist.versions.tolist() == [3, 1] and hist.version == 3
    assert hist.padded("rollout_log_probs", 2)[:, 0].tolist() == pytest.approx([-3.1, -1.1])
    assert hist.zero_advantage  # both replayed responses are right: the buffer drops it
    buf = ReplayBuffer(ReplayConfig(pmis=False, k=1, warmup=0, prompt_replay=4))
    buf.prompts.load_state_dict(store.state_dict())
    cands = buf.begin_step([group("c", 5, [0.0, 0.0])], 5)
    assert cands.history == [] and cands.history_zero_adv == 1
    assert store.history_groups([group("c", 5, [0.0, 1.0])]) == []  # an informative fresh group gets none
    # another prompt, or fewer than n stored: no history group
    assert store.history_groups([group("d", 5, [0.0, 0.0], prompt=(9, 9))]) == []
    assert PromptStore(per_prompt=4).history_groups([group("e", 5, [0.0, 0.0])]) == []
    assert store.history_groups([group("f", 5, [0.0] * 5)]) == []  # n = 5 > 4 stored


def test_history_groups_are_never_displaced_and_weighted_against_their_own_behavior():
    cfg = ReplayConfig(enable=True, k=2, warmup=0, prompt_replay=2)
    buf = ReplayBuffer(cfg)
    assert buf.prompts is not None and buf.prompts.per_prompt == 2
    _visit(buf, [group("a", 1, [1.0, 0.0], base=-1.0), group("x", 1, [1.0, 0.0], base=-1.0, prompt=(9, 9))], 1)
    fresh = group("b", 2, [1.0, 0.0], base=-2.0, prompt=(8, 8))  # a new prompt
    cands = buf.begin_step([fresh, group("c", 2, [0.0, 0.0], base=-2.0)], 2)  # c: a's prompt, all wrong
    (hist,) = cands.history
    # candidates: the two buffered groups of visit 1, then b, then c's history (c is dropped); budget 1 group,
    # ratio 0.5: both fresh-like groups are trained (additive composition), no buffered one fills a slot (0.5 -> 0)
    sel = select_for_step(cands.candidates, cands.fresh, cfg, budget=1, multiple=1, min_multiple=1)
    chosen = [cands.candidates[i] for i in sel.selected]
    assert chosen == [fresh, hist] and len(cands.candidates) == 4
    # each history response is weighted against its own behavior policy (mu_1 of visit 1), its own source
    rows = [fresh, hist]
    mask = torch.cat([g.padded("response_mask", 2) for g in rows])
    rollout = torch.cat([g.padded("rollout_log_probs", 2) for g in rows])
    versions = torch.cat([g.versions for g in rows])
    assert versions.tolist() == [2, 2, 1, 1]
    w = batch_weights(mask, torch.zeros_like(rollout), rollout, versions, "own", "tokens", threshold=2.0)
    assert w.sources == [1, 2]
    assert w.log_denominator[2:, 0].tolist() == pytest.approx([-1.1, -1.2])  # visit 1's responses 0 (reward 1), 1
    assert w.log_denominator[:2, 0].tolist() == pytest.approx([-2.1, -2.2])


def test_the_store_survives_a_checkpoint_and_a_mismatched_resume_is_an_error():
    buf = ReplayBuffer(ReplayConfig(pmis=False, k=1, warmup=0, prompt_replay=3))
    _visit(buf, [group("a", 1, [1.0, 0.0], base=-1.0)], 1)
    state = buf.state_dict()
    again = ReplayBuffer(ReplayConfig(pmis=False, k=1, warmup=0, prompt_replay=3))
    again.load_state_dict(state)
    assert len(again.prompts) == 2 and again.stats()["history_responses"] == 2
    (hist,) = again.begin_step([group("b", 2, [0.0, 0.0])], 2).history
    assert hist.rewards.tolist() == [1.0, 0.0]
    without = ReplayBuffer(ReplayConfig(pmis=False, k=1, warmup=0))
    with pytest.warns(UserWarning, match="replay.prompt_replay is off now: it is dropped"):
        without.load_state_dict(state)
    with pytest.raises(ValueError, match="replay.prompt_replay is on but the checkpoint"):
        ReplayBuffer(ReplayConfig(pmis=False, k=1, warmup=0, prompt_replay=3)).load_state_dict(without.state_dict())


@pytest.mark.parametrize("value", [1, 0, True, 2.5, "4"])
def test_bad_values_name_the_key(value):
    with pytest.raises(ValueError, match="replay.prompt_replay must be null, false or an integer >= 2"):
        ReplayConfig(prompt_replay=value)


def test_history_is_built_only_in_the_place_of_an_uninformative_fresh_group():
    buf = ReplayBuffer(ReplayConfig(pmis=False, k=1, warmup=0, prompt_replay=2))
    _visit(buf, [group("a", 1, [1.0, 0.0], base=-1.0), group("b", 1, [0.0, 1.0], base=-1.0, prompt=(9, 9))], 1)
    # both prompts come back: c's group is informative, d's all wrong
    c, d = group("c", 2, [1.0, 0.0]), group("d", 2, [0.0, 0.0], prompt=(9, 9))
    cands = buf.begin_step([c, d], 2)
    assert cands.dropped_zero_adv == 1
    # only d's prompt replays its past responses, in d's place: the step keeps two groups, as without history
    (hist,) = cands.history
    assert hist.uid == "d:history" and hist.rewards.tolist() == [1.0, 0.0] and cands.fresh == [c, hist]
    assert buf.prompts.totals["history_groups"] == 1


@pytest.mark.parametrize("max_age", [None, 2, 1])
def test_max_age_drops_stored_responses_a_given_number_of_steps_after_they_were_stored(max_age):
    buf = ReplayBuffer(ReplayConfig(pmis=False, k=1, warmup=0, prompt_replay=4, prompt_replay_max_age=max_age))
    _visit(buf, [group("a", 1, [1.0, 0.0], base=-1.0)], 1)  # prompt (5, 6, 7): 2 responses stored at step 1
    _visit(buf, [group("b", 2, [1.0, 0.0], prompt=(9, 9))], 2)  # another prompt
    # step 1's responses are 2 steps old at step 3: usable under no cap and max_age 2, gone under max_age 1
    assert len(buf.prompts.store.get(group("x", 0, [0.0]).prompt_key, [])) == (0 if max_age == 1 else 2)
    cands = buf.begin_step([group("c", 3, [0.0, 0.0])], 3)
    assert len(cands.history) == (0 if max_age == 1 else 1)
    buf.end_step(cands, cands.fresh)
    # after step 3 (usable at step 4: stored at step >= 4 - max_age): no cap keeps all 6; max_age 2 drops step 1's
    # 2 (steps 2 and 3 kept: 4); max_age 1 only step 3's 2 (step 1's were dropped after step 2)
    assert len(buf.prompts) == {None: 6, 2: 4, 1: 2}[max_age]
    assert buf.prompts.totals["expired"] == {None: 0, 2: 2, 1: 4}[max_age]
    assert buf.prompts.max_age == max_age


def test_max_age_bounds_the_store_where_prompts_do_not_come_back():
    # B = 2 new prompts a step, n = 2 responses each, max_age A = 3: at most A x B x n = 12 responses held
    buf = ReplayBuffer(ReplayConfig(pmis=False, k=1, warmup=0, prompt_replay=4, prompt_replay_max_age=3))
    held = []
    for step in range(1, 9):
        _visit(buf, [group(f"g{step}{j}", step, [1.0, 0.0], prompt=(step, j)) for j in range(2)], step)
        held.append((len(buf.prompts), buf.prompts.stats()["prompts"]))
    # steps 1-3 fill it (4, 8, 12 responses); from then on a step's 4 arrivals replace the 4 stored A steps earlier
    assert held == [(4, 2), (8, 4), (12, 6)] + [(12, 6)] * 5
    with pytest.raises(ValueError, match="replay.prompt_replay_max_age must be null or an integer >= 1, got 0"):
        ReplayConfig(prompt_replay=4, prompt_replay_max_age=0)
    with pytest.raises(ValueError, match="replay.prompt_replay_max_age is set but replay.prompt_replay is off"):
        ReplayConfig(prompt_replay=False, prompt_replay_max_age=8)


def test_the_preset_resolves_per_prompt_replay():
    preset = ReplayConfig(enable=True)
    assert preset.resolved("prompt_replay") == 16
    store = ReplayBuffer(preset).prompts
    assert (store.per_prompt, store.max_age) == (16, None)
    uniform = ReplayConfig(enable=True, pmis=False)  # null follows pmis false: off
    assert uniform.resolved("prompt_replay") is None and ReplayBuffer(uniform).prompts is None
    off = ReplayConfig(enable=True, prompt_replay=False)  # the group-replay preset
    assert off.resolved("prompt_replay") is None and ReplayBuffer(off).prompts is None
