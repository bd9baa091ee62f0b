"""chi2(pi || mu) = Var_mu(pi / mu) scores of samples and groups (docs/algorithm.md, 'the chi2 score'): the
importance weight's variance, which an importance-sampled gradient's variance grows with."""

from __future__ import annotations

import torch

LOG_RATIO_BOUND = 20.0  # the same safety bound verl's rollout correction uses


def finite_samples(response_mask: torch.Tensor, *log_probs: torch.Tensor) -> torch.Tensor:
    """[B] bool: no NaN or +-inf in any of `log_probs` ([B, L]) at the sample's response tokens."""
    padding = ~response_mask.bool()
    return torch.stack([(torch.isfinite(lp) | padding).all(dim=-1) for lp in log_probs]).all(dim=0)


def sample_chi2(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor,
                chunk_rows: int = 64) -> torch.Tensor:
    """[B] mean over each sample's response tokens of (w - 1)^2, w = exp(clamp(log pi_old - log mu, +-20)).

    Inputs [B, L]. A sample with no response token or a non-finite log-prob scores +inf, not NaN. Works in place
    on `chunk_rows` rows at a time so the working set stays in cache (candidates are up to K training batches).
    """
    if not (old_log_probs.shape == rollout_log_probs.shape == response_mask.shape):
        raise ValueError(
            "sample_chi2: old_log_probs, rollout_log_probs and response_mask must share a shape, got "
            f"{tuple(old_log_probs.shape)}, {tuple(rollout_log_probs.shape)}, {tuple(response_mask.shape)}"
        )
    rows = old_log_probs.shape[0]
    scores = torch.empty(rows, dtype=torch.float32, device=old_log_probs.device)
    counts = response_mask.sum(dim=-1)
    for start in range(0, rows, chunk_rows):
        part = slice(start, start + chunk_rows)
        mask = response_mask[part].bool()
        # a difference is non-finite exactly when one of its log-probs is (or both are absurd)
        delta = torch.where(mask, old_log_probs[part].float() - rollout_log_probs[part].float(), 0.0)
        finite = torch.isfinite(delta.sum(dim=-1))
        # padding has delta 0, so (w - 1)^2 = 0 there: no second mask needed
        sq_sum = delta.clamp_(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp_().sub_(1.0).square_().sum(dim=-1)
        scores[part] = torch.where(finite, sq_sum, float("inf"))
    return torch.where(counts > 0, scores / counts.clamp(min=1), float("inf"))


def group_scores(sample_scores: torch.Tensor, group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[G] mean of the sample scores of each group; group_index: [B] ints in [0, G)."""
    if sample_scores.shape != group_index.shape:
        raise ValueError(f"group_scores: sample_scores {tuple(sample_scores.shape)} and group_index {tuple(group_index.shape)} differ")
    sums = torch.bincount(group_index, weights=sample_scores.double(), minlength=num_groups)
    counts = torch.bincount(group_index, minlength=num_groups).clamp(min=1)
    return (sums / counts).to(sample_scores.dtype)
