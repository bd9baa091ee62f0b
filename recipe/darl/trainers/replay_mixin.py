"""The D-ARL replay step in both verl trainers (docs/algorithm.md, 'The replay step').

The step is `core.ReplayStep`'s (`begin` in `_fit_compute_log_prob`, `end` in `_fit_update_actor`); `DataProtoPlane`
moves its data (DataProto layouts, the workers' batch split, the actor's loss fields) and `ReplayStepMixin` hooks it
into verl's fit_step (and installs the loss in `_init_models`), so it sits before the verl trainer in the bases. With
`replay.enable=false` the hooks fall through.
"""

from __future__ import annotations

import math
import os
from functools import partial
from typing import Optional

import numpy as np
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
from verl.utils.config import omega_conf_to_dataclass

from recipe.darl.workers.actor_loss import darl_loss
from recipe.darl.robustness.checkpoint_files import read_checked, write_checked
from recipe.darl.trainer_mode import step_budget
from recipe.darl.probes import probe, swapped
from ..core import (ClipSettings, LossInputs, ReplayBuffer, ReplayConfig, ReplayStep, StepPlan, StepState,
                    group_multiple)
from recipe.darl.trainers.batches import batch_from_groups, groups_from_batch, loss_fields, minibatch_index, replay_metrics

BUFFER_FILE = "darl_replay.pt"


class DataProtoPlane:
    """The V0 trainers' data plane (`core.DataPlane`): the trained groups as one DataProto in verl's padded layout;
    pi_old by verl's own old-log-prob hook, the loss fields as batch keys the actor's loss reads."""

    def __init__(self, trainer: "ReplayStepMixin", fresh: DataProto) -> None:
        self.trainer, self.fresh = trainer, fresh
        self.chosen: Optional[DataProto] = None

    def old_log_probs(self, plan: StepPlan) -> torch.Tensor:
        # one batched forward over the trained groups only (the verl hook the mixin overrides); the group count
        # varies: padded to what the workers' split needs, as verl's dispatch would
        t = self.trainer
        widths = self.fresh.batch["prompts"].shape[1], self.fresh.batch["responses"].shape[1]
        merged = batch_from_groups(plan.trained, *widths, self.fresh.meta_info)
        merged.meta_info["global_token_num"] = merged.batch["attention_mask"].sum(-1).tolist()  # kept by (un)padding
        rollout = t.config.actor_rollout_ref.rollout
        divisor = t._dp_size()
        if not rollout.get("log_prob_use_dynamic_bsz", False):
            divisor *= int(rollout.log_prob_micro_batch_size_per_gpu or 1)
        padded, pad = pad_dataproto_to_divisor(merged, divisor)
        self.chosen = unpad_dataproto(super(ReplayStepMixin, t)._fit_compute_log_prob(padded), pad)
        return self.chosen.batch["old_log_probs"]

    def loss_layout(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t, data = self.trainer, self.chosen.batch
        samples = t._mini_batch_groups(plan) * int(t.config.actor_rollout_ref.rollout.n)
        return (data["response_mask"], data["rollout_log_probs"],
                minibatch_index(len(self.chosen), samples, t._dp_size()))

    def put_loss_inputs(self, plan: StepPlan, inputs: LossInputs) -> None:
        self.chosen.batch.update(loss_fields(inputs, self.chosen.batch["response_mask"].shape[1]))


class ReplayStepMixin:
    """D-ARL replay over a verl trainer's fit_step hooks; call `_init_replay(config)` after its __init__."""

    def _replay_version(self) -> int:
        """pi_old's version, in the rollout's `min_global_steps` unit: staleness is measured against it."""
        return self.global_steps

    def _replay_budget(self) -> int:
        """B: the groups a step trains on without replay (`trainer_mode.step_budget`)."""
        return step_budget(self.config)

    def _init_replay(self, config) -> None:
        self.replay = ReplayConfig.from_dict(OmegaConf.to_container(config.replay, resolve=True))
        self.replay_step: Optional[ReplayStep] = ReplayStep(self.replay) if self.replay.enable else None
        self._step_state: Optional[StepState] = None  # between the old-log-prob and the update hooks

    @property
    def buffer(self) -> Optional[ReplayBuffer]:
        return self.replay_step.buffer if self.replay_step is not None else None

    def _init_models(self):
        super()._init_models()
        self._install_loss(self.actor_wg)

    def _install_loss(self, worker_group) -> None:
        """The D-ARL loss in the actor's workers (replay only; otherwise verl's own loss stays)."""
        if self.replay.enable:
            actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
            worker_group.set_loss_fn(partial(
                darl_loss, config=actor_config, threshold=self._threshold(), stop_grad=self.replay.stop_grad,
                behavior_clip=self.replay.behavior_clip_range(),
            ))

    def _threshold(self) -> float:
        return float(self.config.algorithm.rollout_correction.rollout_is_threshold)

    def _dp_size(self) -> int:
        sp = self.config.actor_rollout_ref.actor.get("ulysses_sequence_parallel_size", 1) or 1
        return self.actor_rollout_wg.world_size // sp

    def _fit_compute_log_prob(self, batch: DataProto) -> DataProto:
        if not self.replay.enable:
            return super()._fit_compute_log_prob(batch)
        for key, values in self.reward_extra_infos_dict.items():  # stored with the groups, like the rewards
            batch.non_tensor_batch.setdefault(key, np.asarray(values))
        fresh = groups_from_batch(batch, self.reward_tensor)
        self.metrics["replay/fresh_version"] = max(g.version for g in fresh)  # the rollout's version stamp
        plane = DataProtoPlane(self, batch)
        state = self.replay_step.begin(plane, fresh, self._replay_version(), self._replay_budget(),
                                       *self._group_multiples(), self._clip_settings())
        self._step_state = state
        if state.plan.selection.skipped:
            # no update: verl's own forward of the fresh batch, which the later hooks read
            print(f"[D-ARL] step {state.plan.version}: no update ({state.plan.selection.reason})")
            return super()._fit_compute_log_prob(batch)
        chosen = plane.chosen
        # the step's rewards, read by `_fit_compute_advantage`, are those of the trained rows
        self.reward_tensor = chosen.batch["token_level_scores"]
        self.reward_extra_infos_dict = {k: chosen.non_tensor_batch[k] for k in self.reward_extra_infos_dict}
        return chosen

    def _clip_settings(self) -> ClipSettings:
        return ClipSettings(self._threshold(), self._clip("clip_ratio_low"), self._clip("clip_ratio_high"))

    def _group_multiples(self) -> tuple[int, Optional[int]]:
        """(groups of a full mini-batch, the fewest groups one smaller mini-batch may hold; None: none fits)."""
        n = self.config.actor_rollout_ref.rollout.n
        actor = self.config.actor_rollout_ref.actor
        dp = self._dp_size()
        per_step = dp if actor.get("use_dynamic_bsz", False) else dp * int(actor.ppo_micro_batch_size_per_gpu or 1)
        full = group_multiple(n, actor.ppo_mini_batch_size, dp)
        smallest = per_step // math.gcd(per_step, n)
        return full, (smallest if smallest <= full else None)

    def _clip(self, key: str) -> float:
        actor = self.config.actor_rollout_ref.actor
        value = actor.get(key)
        return float(actor.clip_ratio if value is None else value)

    def _fit_update_actor(self, batch: DataProto) -> DataProto:
        probe("update", self.global_steps)  # trainer step (fully-async: the rollouter keeps generating meanwhile)
        if not self.replay.enable:
            return super()._fit_update_actor(batch)
        state, self._step_state = self._step_state, None
        if not state.plan.selection.skipped:
            # fewer groups than a mini-batch: one smaller
            with swapped(self.config.actor_rollout_ref.actor, "ppo_mini_batch_size", self._mini_batch_groups(state.plan)):
                batch = super()._fit_update_actor(batch)
        evicted = self.replay_step.end(state)
        self.metrics.update(replay_metrics(state, self.buffer.stats(), vars(evicted)))
        return batch

    def _mini_batch_groups(self, plan: StepPlan) -> int:
        return min(len(plan.trained), self.config.actor_rollout_ref.actor.ppo_mini_batch_size)

    def save_replay(self, folder: str, step: int = -1) -> None:
        """Writes the buffer into a checkpoint folder (atomic, checksummed) of step `step` (the fault hook's key).
        Call before verl writes its tracker, so a checkpoint that resume can find always holds the buffer."""
        if self.buffer is None:
            return
        write_checked(os.path.join(folder, BUFFER_FILE), {"replay": self.buffer.state_dict(), "config": vars(self.replay)},
                      before_replace=lambda: probe("buffer_write", step))

    def load_replay(self, folder: str) -> None:
        """Restores the buffer from the folder verl resumed from; a torn file raises `CorruptCheckpointError`."""
        if self.buffer is None:
            return
        path = os.path.join(folder, BUFFER_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"resuming with replay.enable=true from {folder}, which has no {BUFFER_FILE}: "
                "the checkpoint was written without replay; resume with replay.enable=false or start fresh"
            )
        self.buffer.load_state_dict(read_checked(path)["replay"])
        b = self.buffer
        print(f"[D-ARL] restored the replay buffer: {len(b)} groups, versions {sorted({g.version for g in b.groups})}, "
              f"steps_done {b.steps_done}, next_seq {b.next_seq}, from {path}")
