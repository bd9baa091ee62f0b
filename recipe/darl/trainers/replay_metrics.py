"""The `replay/` metrics of one step (docs/metrics.md), from the step's state and the buffer's statistics."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core import StepState, group_scores, sample_chi2


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
