"""The V0 trainers' data plane (`core.DataPlane`): the trained groups as one DataProto in verl's padded layout; pi_old
by verl's own old-log-prob hook, the loss fields as batch keys the actor's loss reads."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto

from recipe.darl.core import LossInputs, StepPlan
from recipe.darl.trainers.converters import batch_from_groups, loss_fields, minibatch_index


class DataProtoPlane:
    """One step's plane: `fresh` is verl's generated batch, `verl_forward` verl's `_fit_compute_log_prob`."""

    def __init__(self, run: Any, fresh: DataProto, verl_forward: Callable[[DataProto], DataProto]) -> None:
        self.run, self.fresh, self.verl_forward = run, fresh, verl_forward
        self.chosen: Optional[DataProto] = None

    def old_log_probs(self, plan: StepPlan) -> torch.Tensor:
        # one batched forward over the trained groups only; the group count varies: padded to what the workers'
        # split needs, as verl's dispatch would
        widths = self.fresh.batch["prompts"].shape[1], self.fresh.batch["responses"].shape[1]
        merged = batch_from_groups(plan.trained, *widths, self.fresh.meta_info)
        merged.meta_info["global_token_num"] = merged.batch["attention_mask"].sum(-1).tolist()  # kept by (un)padding
        rollout = self.run.config.actor_rollout_ref.rollout
        divisor = self.run.dp_size()
        if not rollout.get("log_prob_use_dynamic_bsz", False):
            divisor *= int(rollout.log_prob_micro_batch_size_per_gpu or 1)
        padded, pad = pad_dataproto_to_divisor(merged, divisor)
        self.chosen = unpad_dataproto(self.verl_forward(padded), pad)
        return self.chosen.batch["old_log_probs"]

    def loss_layout(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        data = self.chosen.batch
        samples = self.run.mini_batch_groups(plan) * int(self.run.config.actor_rollout_ref.rollout.n)
        return data["response_mask"], data["rollout_log_probs"], minibatch_index(len(self.chosen), samples,
                                                                                  self.run.dp_size())

    def put_loss_inputs(self, plan: StepPlan, inputs: LossInputs) -> None:
        self.chosen.batch.update(loss_fields(inputs, self.chosen.batch["response_mask"].shape[1]))
