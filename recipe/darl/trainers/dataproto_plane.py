"""The V0 trainers' data plane (`core.DataPlane`): verl's generated DataProto as groups and back
(`groups_from_batch`, `batch_from_groups`), the trained groups as one DataProto in verl's padded layout, pi_old by
verl's own old-log-prob hook, the loss inputs as batch keys the actor's loss reads."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
from verl.utils.model import compute_position_id_with_mask

from recipe.darl.core import Group, LossInputs, StepPlan
from recipe.darl.core.packing import minibatch_index

# tensor keys of a generated batch that groups can rebuild; any other key is an error, not a silent drop
REBUILT_KEYS = {"prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids",
                "rollout_log_probs", "rm_scores", "token_level_scores"}
# placeholders verl's RLHFDataset adds, which nothing downstream reads: not stored
DROPPED_KEYS = {"dummy_tensor"}
VERSION_KEY = "min_global_steps"


def groups_from_batch(batch: DataProto, scores: torch.Tensor) -> list[Group]:
    """Groups of a generated batch by `uid`, in order of first appearance; scores: [B, L] token-level rewards."""
    if extra := sorted(set(batch.batch.keys()) - REBUILT_KEYS - DROPPED_KEYS):
        raise ValueError(f"replay cannot store batch keys {extra} (multi-modal or MoE routing data are not supported)")
    for key in ("uid", VERSION_KEY):
        if key not in batch.non_tensor_batch:
            raise KeyError(f"replay needs the non-tensor field {key!r} in the generated batch")
    if "rollout_log_probs" not in batch.batch.keys():
        raise KeyError("replay needs rollout_log_probs: set actor_rollout_ref.rollout.calculate_log_probs=true")
    if batch.batch["position_ids"].dim() != 2:
        raise ValueError("replay supports text models only (position_ids must be [batch, seq])")

    prompts = batch.batch["prompts"]
    width_p = prompts.shape[1]
    attention = batch.batch["attention_mask"]
    prompt_lengths = attention[:, :width_p].sum(-1)
    response_lengths = attention[:, width_p:].sum(-1)
    versions = batch.non_tensor_batch[VERSION_KEY]
    if any(v is None for v in versions):
        raise ValueError(f"some samples have no {VERSION_KEY}: the rollout server must return version stamps")

    rows_of: dict[str, list[int]] = {}
    for i, uid in enumerate(batch.non_tensor_batch["uid"]):
        rows_of.setdefault(str(uid), []).append(i)
    groups = []
    for uid, rows in rows_of.items():
        idx = torch.tensor(rows)
        groups.append(Group.from_padded(
            uid=uid, version=int(min(versions[r] for r in rows)), prompt_ids=prompts[rows[0]],
            prompt_length=int(prompt_lengths[rows[0]]), responses=batch.batch["responses"][idx],
            response_lengths=response_lengths[idx], response_mask=batch.batch["response_mask"][idx],
            rollout_log_probs=batch.batch["rollout_log_probs"][idx], rewards=scores[idx].sum(-1),
            non_tensors={k: v[rows] for k, v in batch.non_tensor_batch.items()},
        ))
    return groups


def batch_from_groups(groups: list[Group], prompt_width: int, response_width: int,
                      meta_info: Optional[dict] = None) -> DataProto:
    """Rebuilds verl's padded layout: prompts left-padded, responses right-padded, rewards at the last token."""
    if not groups:
        raise ValueError("batch_from_groups: no groups")
    keys = set(groups[0].non_tensors)
    for g in groups:
        if set(g.non_tensors) != keys:
            raise ValueError(f"group {g.uid} has non-tensor fields {sorted(g.non_tensors)}, expected {sorted(keys)}")
    prompts, prompt_mask, responses, response_mask, rollout, scores = [], [], [], [], [], []
    for g in groups:
        start = prompt_width - g.prompt_ids.shape[0]
        p = torch.zeros(prompt_width, dtype=torch.long)
        p[start:] = g.prompt_ids.long()
        prompts.append(p.expand(g.n, -1))
        prompt_mask.append((torch.arange(prompt_width) >= start).long().expand(g.n, -1))
        responses.append(g.padded("response_ids", response_width).long())
        response_mask.append(g.padded("response_mask", response_width).long())
        rollout.append(g.padded("rollout_log_probs", response_width))
        s = torch.zeros(g.n, response_width)
        s[torch.arange(g.n), (g.lengths.long() - 1).clamp(min=0)] = g.rewards
        scores.append(s)
    lengths = torch.cat([g.lengths for g in groups]).long()
    response_attention = (torch.arange(response_width).unsqueeze(0) < lengths.unsqueeze(1)).long()
    prompts_t = torch.cat(prompts)
    responses_t = torch.cat(responses)
    attention = torch.cat([torch.cat(prompt_mask), response_attention], dim=1)
    tensors = {
        "prompts": prompts_t,
        "responses": responses_t,
        "response_mask": torch.cat(response_mask),
        "input_ids": torch.cat([prompts_t, responses_t], dim=1),
        "attention_mask": attention,
        "position_ids": compute_position_id_with_mask(attention),
        "rollout_log_probs": torch.cat(rollout),
        "token_level_scores": torch.cat(scores),
    }
    non_tensors = {k: np.concatenate([g.non_tensors[k] for g in groups]) for k in keys}
    # per-row arrays of the fresh batch (fully-async's trajectory_param_versions) do not describe these rows
    meta = {k: v for k, v in (meta_info or {}).items() if not isinstance(v, (np.ndarray, torch.Tensor))}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


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
        self.chosen.batch.update(inputs.batch_fields(self.chosen.batch["response_mask"].shape[1]))
