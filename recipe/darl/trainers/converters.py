"""Converters between verl's DataProto and the D-ARL core (groups, the actor loss's fields, `replay/` metrics)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask

from ..core import Group, LossInputs, StepState, group_scores, sample_chi2

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


def minibatch_index(num_samples: int, mini_batch_samples: int, dp_size: int) -> torch.Tensor:
    """[num_samples] optimizer mini-batch of each sample as verl splits an unshuffled batch: dp_size contiguous
    shards, each walked in mini-batches of mini_batch_samples / dp_size; m is every rank's m-th."""
    if num_samples % dp_size or mini_batch_samples % dp_size or num_samples % mini_batch_samples:
        raise ValueError(f"minibatch_index: {num_samples} samples, mini-batches of {mini_batch_samples}, dp {dp_size} do not divide")
    shard = num_samples // dp_size
    local = torch.arange(num_samples) % shard
    return local // (mini_batch_samples // dp_size)


def loss_fields(inputs: LossInputs, width: int) -> dict[str, torch.Tensor]:
    """The [B, L] batch keys `darl_loss` reads, from the step's loss inputs (B trained samples, L = width)."""
    return {"darl_log_denominator": inputs.weights.log_denominator.float(),
            "darl_token_coef": inputs.weights.token_coef.float(),
            "darl_clip_low": inputs.clip_low.unsqueeze(1).expand(-1, width).contiguous(),
            "darl_clip_high": inputs.clip_high.unsqueeze(1).expand(-1, width).contiguous()}


def replay_metrics(state: StepState, buffer_stats: dict[str, Any], evicted: dict[str, int]) -> dict[str, float]:
    """The `replay/` metrics of one step (docs/metrics.md), scalars."""
    plan, cands, selection = state.plan, state.plan.cands, state.plan.selection
    step, groups, sel_groups = plan.version, cands.candidates, plan.trained
    trained = {id(g) for g in sel_groups}
    history = {id(g) for g in cands.history}
    fresh = {id(g) for g in cands.fresh}  # history groups included
    m: dict[str, float] = {
        "replay/candidates": len(groups),
        "replay/selected": len(sel_groups),
        "replay/eligible": selection.eligible,
        "replay/skipped_update": float(selection.skipped),
        "replay/warmup": float(cands.warmup),
        "replay/dropped_zero_adv": cands.dropped_zero_adv,
        # left out by the rounding: buffered untrained, so least-reused order replays them first
        "replay/fresh_deferred": sum(1 for g in cands.fresh if id(g) not in trained and id(g) not in history),
        "replay/history_groups": len(cands.history),
        "replay/history_zero_adv": cands.history_zero_adv,
        "replay/history_trained": sum(1 for g in sel_groups if id(g) in history),
        "replay/replayed_trained": sum(1 for g in sel_groups if id(g) not in fresh),
        "replay/buffer_groups": buffer_stats["groups"],
        "replay/buffer_tokens": buffer_stats["tokens"],
        "replay/buffer_bytes": buffer_stats["bytes"],
        "replay/reuse_mean": buffer_stats["reuse_mean"],
        "replay/reuse_max": buffer_stats["reuse_max"],
    }
    for key in ("history_prompts", "history_responses", "history_bytes"):
        if key in buffer_stats:
            m[f"replay/{key}"] = buffer_stats[key]
    for name, count in evicted.items():
        m[f"replay/evicted_{name}"] = count
    for version, count in buffer_stats["groups_per_version"].items():
        m[f"replay/buffer_groups/s{step - version}"] = count
        m[f"replay/buffer_tokens/s{step - version}"] = buffer_stats["tokens_per_version"][version]
    if sel_groups:
        staleness = np.concatenate([step - g.versions.numpy() for g in sel_groups])
        m["replay/staleness_mean"] = float(staleness.mean())
        m["replay/staleness_max"] = float(staleness.max())
        for s, c in zip(*np.unique(staleness, return_counts=True)):
            m[f"replay/staleness_hist/s{int(s)}"] = float(c) / len(staleness)
    per_version: dict[int, list[int]] = {}
    for g in groups:
        per_version.setdefault(g.version, [0, 0])[int(id(g) in trained)] += 1
    for version, (rejected, taken) in per_version.items():
        m[f"replay/selected_fraction/s{step - version}"] = taken / (taken + rejected)
    if state.inputs is not None:  # the step trained: pi_old and the loss inputs of its groups
        sample = sample_chi2(state.old_log_probs, state.rollout_log_probs, state.response_mask)
        index = torch.cat([torch.full((g.n,), i) for i, g in enumerate(sel_groups)])
        chi2 = [s for s in group_scores(sample, index, len(sel_groups)).tolist() if np.isfinite(s)]
        if chi2:
            m["replay/chi2_selected_mean"] = float(np.mean(chi2))
            m["replay/chi2_selected_max"] = float(np.max(chi2))
        weights = state.inputs.weights
        m["replay/truncated_fraction"] = weights.truncated_fraction
        m["replay/m2_gated_fraction"] = weights.metrics["m2_gated_fraction"]
        m["replay/invalid_samples"] = weights.metrics["invalid_samples"]
        present = weights.tokens > 0
        for s, version in enumerate(weights.sources):
            col = present[:, s]
            if col.any():
                m[f"replay/alpha/s{step - version}"] = float(weights.alpha[col, s].mean())
                m[f"replay/ess_fraction/s{step - version}"] = float((weights.ess[col, s] / weights.tokens[col, s]).mean())
    for name, seconds in state.timing.items():
        m[f"replay/time_{name}_s"] = seconds
    return m
