"""DarlOneStepOffTrainer's replay hooks on real DataProto batches through verl's own fit-step code.

The actor worker group is replaced by a stand-in whose old-log-prob forward returns chosen values
(so every log-ratio is known by hand) and whose update records the batch it was given; verl's
reward extraction, rollout correction, GRPO advantages and checkpoint logic run as shipped.
The loss inside the real FSDP2 engine is tested in tests/workers.
"""

from __future__ import annotations

import copy
import math
import os
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto

from recipe.darl.checks.config_check import validate_or_raise
from recipe.darl.checks.fixups import apply_fixups
from recipe.darl.main_one_step_off import MODE
from recipe.darl.trainers.darl_run import DarlRun
from recipe.darl.trainers.one_step_off import BUFFER_FILE, DarlOneStepOffTrainer


class StandInActor:
    """Worker-group stand-in: world size, checkpoint calls, and a record of what was trained."""

    world_size = 1

    def __init__(self):
        self.saved, self.loaded = [], []

    def save_checkpoint(self, local_path, remote_path, step, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        self.saved.append((local_path, step))

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded.append(local_path)


def make_trainer(cfg, deltas: dict[str, float], mode=MODE) -> DarlOneStepOffTrainer:
    """A DarlOneStepOffTrainer without Ray: old log-probs = rollout log-probs + deltas[uid] on response tokens."""
    trainer = DarlOneStepOffTrainer.__new__(DarlOneStepOffTrainer)
    trainer.config = cfg
    trainer.darl = DarlRun(trainer, cfg, mode)  # rollout_shaping off: no manager
    trainer.actor_rollout_wg = trainer.actor_wg = StandInActor()
    trainer.use_rm = trainer.use_critic = False
    trainer.global_steps = 1
    trainer.trained = []
    trainer.train_dataloader = StatefulDataLoader(list(range(64)), batch_size=4)

    def old_log_prob(batch: DataProto):
        delta = torch.tensor([deltas[u] for u in batch.non_tensor_batch["uid"]]).unsqueeze(1)
        old = batch.batch["rollout_log_probs"] + delta * batch.batch["response_mask"]
        out = DataProto.from_dict(tensors={"old_log_probs": old, "entropys": torch.ones_like(old)})
        return out, 0.0

    def update_actor(batch: DataProto):
        trainer.trained.append(batch)
        return DataProto.from_single_dict(data={}, meta_info={"metrics": {"actor/pg_loss": [0.0]}})

    trainer._compute_old_log_prob = old_log_prob
    trainer._update_actor = update_actor
    return trainer


def run_step(trainer: DarlOneStepOffTrainer, batch: DataProto, save: bool = False) -> DataProto:
    """The hooks of verl's fit_step that D-ARL touches, in verl's order."""
    trainer.metrics, trainer.timing_raw = {}, {}
    batch = trainer._fit_compute_reward(batch)
    batch = trainer._fit_compute_log_prob(batch)
    batch = trainer._fit_compute_advantage(batch)
    batch = trainer._fit_update_actor(batch)
    if save:
        trainer._save_checkpoint()
    trainer.global_steps += 1
    return batch


# uniform selection (newest first, a fixed budget of B groups, no gate): the hand-computed cases below use it
UNIFORM = ("replay.order=newest", "replay.ratio=false", "replay.m2_budget=false", "replay.behavior_clip=false",
           "replay.max_reuse=false")


@pytest.fixture
def replay_cfg(compose_config):
    def _cfg(*extra, design=UNIFORM):
        cfg = compose_config(
            "replay.enable=true", "replay.k=4", "replay.warmup=0", "algorithm.rollout_correction.bypass_mode=false",
            "algorithm.rollout_is=true", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.agent.num_workers=1", *design, *extra,
        )
        validate_or_raise(cfg, MODE, extra=apply_fixups(cfg, MODE)[0])
        return cfg
    return _cfg


def uids(batch: DataProto) -> list[str]:
    return list(dict.fromkeys(batch.non_tensor_batch["uid"]))


def test_merge_select_advantage_and_metrics_by_hand(replay_cfg, batch_maker):
    step1 = batch_maker(versions=[0, 0, 0], rewards=[[1, 0], [0, 1], [1, 1]], seed=1)  # the third has zero advantage
    a, b, c = uids(step1)
    step2 = batch_maker(versions=[1], rewards=[[1, 0]], seed=2)
    (d,) = uids(step2)
    deltas = {a: 0.3, b: 0.5, c: 0.0, d: 1.0}
    trainer = make_trainer(replay_cfg(), deltas)

    out1 = run_step(trainer, step1)
    assert set(uids(out1)) == {a, b} and trainer.metrics["replay/dropped_zero_adv"] == 1

    deltas.update({a: 0.1, b: 0.2})  # the weights moved: the step-2 forward gives new deltas
    out2 = run_step(trainer, step2)
    # candidates a, b (buffered, v0) + d (fresh, v1); B = 2 newest first: d, then a (arrived before b)
    assert set(uids(out2)) == {a, d}
    trained = trainer.trained[-1]
    assert trained is out2 and len(trained) == 4
    # advantages only on the selected groups: GRPO on rewards (1, 0) -> +-0.7071
    adv = trained.batch["advantages"].sum(-1) / trained.batch["response_mask"].sum(-1)  # constant per response
    assert adv.abs().tolist() == pytest.approx([1 / math.sqrt(2)] * 4, rel=1e-4)
    assert torch.equal(trained.batch["token_level_scores"].sum(-1), torch.tensor([1.0, 0.0, 1.0, 0.0]))
    # trained in arrival order: a (step 1) before d (step 2)
    assert uids(trained) == [a, d]

    m = trainer.metrics
    chi = lambda x: (math.exp(x) - 1) ** 2
    assert m["replay/candidates"] == 3 and m["replay/selected"] == 2 and m["replay/replayed_trained"] == 1
    assert m["replay/chi2_selected_mean"] == pytest.approx((chi(0.1) + chi(1.0)) / 2, rel=1e-5)
    assert m["replay/staleness_mean"] == pytest.approx(1.5) and m["replay/staleness_max"] == 2
    assert m["replay/selected_fraction/s1"] == 1.0 and m["replay/selected_fraction/s2"] == 0.5
    assert m["replay/buffer_groups"] == 3 and m["replay/buffer_groups/s1"] == 1

    # pmis: a's samples (v0) were also scored at step 1 (version 1, which generated e): balance heuristic
    mask = trained.batch["response_mask"].bool()
    rollout = trained.batch["rollout_log_probs"]
    expected = rollout[:2] + math.log((1 + math.exp(0.3)) / 2)
    torch.testing.assert_close(trained.batch["darl_log_denominator"][:2][mask[:2]], expected[mask[:2]])
    torch.testing.assert_close(trained.batch["darl_log_denominator"][2:][mask[2:]], rollout[2:][mask[2:]])
    assert trained.batch["darl_token_coef"].sum().item() == pytest.approx(1.0)
    assert "replay/alpha/s1" in m and "replay/alpha/s2" in m
    assert m["replay/alpha/s1"] + m["replay/alpha/s2"] == pytest.approx(1.0)


def test_a_step_without_a_candidate_skips_the_update(replay_cfg, batch_maker):
    batch = batch_maker(versions=[0, 0], rewards=[[1, 1], [0, 0]])  # no advantage anywhere
    trainer = make_trainer(replay_cfg(), {u: 0.5 for u in uids(batch)})
    run_step(trainer, batch)
    assert trainer.trained == [] and trainer.metrics["replay/skipped_update"] == 1.0
    assert trainer.metrics["replay/dropped_zero_adv"] == 2 and len(trainer.darl.buffer) == 0


def test_replay_disabled_is_plain_one_step_off(compose_config, batch_maker):
    cfg = compose_config("algorithm.rollout_correction.bypass_mode=false", "algorithm.rollout_is=true",
                         "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=2",
                         "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.agent.num_workers=1")
    validate_or_raise(cfg, MODE, extra=apply_fixups(cfg, MODE)[0])
    batch = batch_maker(versions=[0, 0, 0], rewards=[[1, 0], [0, 1], [1, 1]])
    trainer = make_trainer(cfg, {u: 0.2 for u in uids(batch)})
    assert trainer.darl.buffer is None and not trainer.darl.replay.enable
    out = run_step(trainer, batch)
    assert len(out) == 6 and not any(k.startswith("darl_") for k in out.batch.keys())
    assert "rollout_is_weights" in out.batch.keys()  # verl's own decoupled correction ran
    assert not any(k.startswith("replay/") for k in trainer.metrics)


def test_checkpoint_resume_restores_the_buffer(replay_cfg, batch_maker, state_equal):
    cfg = replay_cfg("trainer.resume_mode=auto")
    deltas: dict[str, float] = {}
    trainer = make_trainer(cfg, deltas)
    for step in (1, 2, 3):
        batch = batch_maker(versions=[step - 1, step - 1], rewards=[[1, 0], [0, 1]], seed=step)
        deltas.update({u: 0.1 * step for u in uids(batch)})
        run_step(trainer, batch, save=(step == 2))
        if step == 2:
            saved = copy.deepcopy(trainer.darl.buffer.state_dict())
    folder = os.path.join(cfg.trainer.default_local_dir, "global_step_2")
    assert os.path.exists(os.path.join(folder, BUFFER_FILE))
    assert len(saved["groups"]) == 4 and any(g["recorded"] for g in saved["groups"])

    resumed = make_trainer(cfg, {})
    resumed.global_steps = 0
    resumed._load_checkpoint()
    assert resumed.global_steps == 2 and resumed.actor_rollout_wg.loaded == [os.path.join(folder, "actor")]
    assert state_equal(resumed.darl.buffer.state_dict(), saved)
    assert not state_equal(trainer.darl.buffer.state_dict(), saved)  # step 3 moved the live buffer on


def test_resume_without_a_saved_buffer_is_an_error(replay_cfg, compose_config):
    cfg = replay_cfg("trainer.resume_mode=auto")
    folder = os.path.join(cfg.trainer.default_local_dir, "global_step_3")
    os.makedirs(folder)
    with open(os.path.join(cfg.trainer.default_local_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("3")
    trainer = make_trainer(cfg, {})
    with pytest.raises(FileNotFoundError, match=BUFFER_FILE):
        trainer._load_checkpoint()


def test_fewer_groups_than_a_mini_batch_train_as_one_smaller_mini_batch(replay_cfg, batch_maker):
    batch = batch_maker(versions=[0, 0], rewards=[[1, 0], [1, 1]])  # one group survives the zero-advantage filter
    trainer = make_trainer(replay_cfg(), {u: 0.1 for u in uids(batch)})
    seen = []
    inner = trainer._update_actor
    trainer._update_actor = lambda b: (seen.append(trainer.config.actor_rollout_ref.actor.ppo_mini_batch_size), inner(b))[1]
    run_step(trainer, batch)
    assert len(trainer.trained) == 1 and len(trainer.trained[0]) == 2
    assert seen == [1] and trainer.config.actor_rollout_ref.actor.ppo_mini_batch_size == 2
    assert trainer.trained[0].batch["darl_token_coef"].sum().item() == pytest.approx(1.0)


def test_preset_keeps_fresh_groups_adds_least_reused_and_recomputes_only_what_it_trains(replay_cfg, batch_maker):
    step1 = batch_maker(versions=[0, 0, 0], rewards=[[1, 0], [0, 1], [1, 0]], seed=6)
    a, b, c = uids(step1)
    step2 = batch_maker(versions=[1, 1], rewards=[[1, 0], [0, 1]], seed=7)
    d, e = uids(step2)
    step3 = batch_maker(versions=[2, 2], rewards=[[1, 0], [0, 1]], seed=8)
    f, g = uids(step3)
    deltas = {u: 0.0 for u in (a, b, c, d, e, f, g)}
    # the preset with ratio 1: every fresh group plus up to B = 2 replayed groups, mini-batches of 2 groups
    trainer = make_trainer(replay_cfg("replay.ratio=1.0", design=()), deltas)
    assert trainer.darl.replay.resolved("order") == "least_reused" and trainer.darl.buffer.max_reuse == 2
    calls = []
    inner = trainer._compute_old_log_prob
    trainer._compute_old_log_prob = lambda batch: (calls.append(list(dict.fromkeys(batch.non_tensor_batch["uid"]))),
                                                   inner(batch))[1]
    run_step(trainer, step1)
    # 3 fresh groups: rounding down drops one (no replayed group to round up with); only they are recomputed
    assert uids(trainer.trained[-1]) == [a, b] and calls == [[a, b]]
    assert trainer.metrics["replay/fresh_deferred"] == 1  # said, not silent: c waits in the buffer
    assert trainer.metrics["replay/replayed_trained"] == 0
    run_step(trainer, step2)
    # fresh d, e, then the 2 least reused: c (0), then a before b (same reuse and version, earlier arrival); one
    # forward over them, in the order they train (arrival)
    assert calls[-1] == [a, c, d, e] and uids(trainer.trained[-1]) == [a, c, d, e]
    assert trainer.metrics["replay/fresh_deferred"] == 0
    assert trainer.metrics["replay/candidates"] == 5 and trainer.metrics["replay/selected"] == 4
    assert trainer.metrics["replay/replayed_trained"] == 2 and trainer.metrics["replay/history_trained"] == 0
    # the demo's plot draws replay/ metrics this step logs (actor/ ones come from the actor's loss)
    from recipe.darl.plot import PANELS

    plotted = {k for _, keys in PANELS if not isinstance(keys, str) for k in keys if k.startswith("replay/")}
    assert plotted <= set(trainer.metrics), plotted - set(trainer.metrics)
    # a was trained twice (max_reuse 2): evicted
    assert {grp.uid for grp in trainer.darl.buffer.groups} == {b, c, d, e}
    run_step(trainer, step3)
    # b, c, d, e were each trained once: the newer version wins the tie
    assert uids(trainer.trained[-1]) == [d, e, f, g] and trainer.metrics["replay/replayed_trained"] == 2
    assert trainer.metrics["replay/m2_gated_fraction"] == 0.0  # pi_old = mu: nothing to gate (R5)


def test_preset_m2_gate_masks_the_drifted_tokens(replay_cfg, batch_maker):
    batch = batch_maker(versions=[0, 0], rewards=[[1, 0], [0, 1]], seed=9)
    a, b = uids(batch)
    trainer = make_trainer(replay_cfg(design=()), {a: 0.0, b: 1.0})  # log w = 1 on every token of b
    run_step(trainer, batch)
    trained = trainer.trained[-1]
    coef = trained.batch["darl_token_coef"]
    mask = trained.batch["response_mask"].bool()
    # (log w)^2 = 1 on b's tokens and 0 on a's: the budget 0.04 holds only once every b token is masked
    assert (coef[2:][mask[2:]] == 0).all() and (coef[:2][mask[:2]] > 0).all()
    assert coef.sum().item() == pytest.approx(1.0)
    share = mask[2:].sum().item() / mask.sum().item()
    assert trainer.metrics["replay/m2_gated_fraction"] == pytest.approx(share)


def _same_prompt_twice(batch_maker):
    """Step 1: one group with rewards (1, 0) from version 0; step 2: the same prompt one step later, both responses
    wrong, a new group (uid "b") from version 1. Returns step 1, its uid, step 2."""
    import numpy as np

    step1 = batch_maker(versions=[0], rewards=[[1, 0]], seed=11)
    step2 = batch_maker(versions=[1], rewards=[[0, 0]], seed=11)
    step2.non_tensor_batch["uid"] = np.array(["b", "b"], dtype=object)
    step2.non_tensor_batch["min_global_steps"] = np.array([1, 1], dtype=object)
    return step1, uids(step1)[0], step2


@pytest.mark.parametrize("when", ["explicit", "preset"])
def test_prompt_replay_replays_only_in_the_place_of_an_uninformative_group(replay_cfg, batch_maker, when):
    """"preset": replay.prompt_replay unset, so it follows `pmis` (16 kept per prompt): the trainers' preset."""
    import numpy as np

    step1 = batch_maker(versions=[0, 0], rewards=[[1, 0], [0, 1]], seed=12)
    a, b = uids(step1)
    step2 = batch_maker(versions=[1, 1], rewards=[[1, 0], [0, 0]], seed=12)  # same prompts; e's responses all wrong
    step2.non_tensor_batch["uid"] = np.array(["d", "d", "e", "e"], dtype=object)
    step2.non_tensor_batch["min_global_steps"] = np.array([1, 1, 1, 1], dtype=object)
    keys = () if when == "preset" else ("replay.prompt_replay=2",)
    trainer = make_trainer(replay_cfg("replay.k=1", *keys, "actor_rollout_ref.actor.ppo_mini_batch_size=1", design=()),
                           {u: 0.0 for u in (a, b, "d", "e", "d:history", "e:history")})
    assert trainer.darl.buffer.prompts.per_prompt == (16 if when == "preset" else 2)
    run_step(trainer, step1)
    run_step(trainer, step2)
    trained = uids(trainer.trained[-1])
    # e is dropped (no advantage) and only e's prompt replays its past responses, in e's place
    assert trained == ["d", "e:history"]
    assert trainer.metrics["replay/history_groups"] == 1


@pytest.mark.parametrize("max_age", ["null", 1])
def test_prompt_replay_max_age_bounds_the_trainers_store(replay_cfg, batch_maker, max_age):
    steps = [batch_maker(versions=[v, v], rewards=[[1, 0], [0, 1]], seed=20 + v) for v in range(3)]  # new prompts
    trainer = make_trainer(replay_cfg("replay.k=1", "replay.prompt_replay=2", f"replay.prompt_replay_max_age={max_age}",
                                      "actor_rollout_ref.actor.ppo_mini_batch_size=1", design=()),
                           {u: 0.0 for batch in steps for u in uids(batch)})
    held = []
    for batch in steps:
        run_step(trainer, batch)
        held.append(trainer.metrics["replay/history_responses"])
    # 4 responses arrive a step; max_age 1 keeps only the last step's (usable one step later)
    assert held == ([4, 8, 12] if max_age == "null" else [4, 4, 4])
    assert trainer.darl.buffer.prompts.max_age == (None if max_age == "null" else 1)
