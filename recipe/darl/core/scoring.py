"""Variance-guided chi-square score of candidate samples and groups (DESIGN.md section 3).

chi2(pi || mu) = Var_mu(pi / mu): the importance weight's variance, which an importance-sampled
gradient's variance grows with. A low score means the sample is distribution-matched.
"""

from __future__ import annotations

import torch

LOG_RATIO_BOUND = 20.0  # the same safety bound verl's rollout correction uses


def finite_samples(response_mask: torch.Tensor, *log_probs: torch.Tensor) -> torch.Tensor:
    """[B] bool: no NaN or +-inf in any of `log_probs` ([B, L]) at the sample's response tokens."""
    ok = torch.ones(response_mask.shape[0], dtype=torch.bool, device=response_mask.device)
    mask = response_mask.bool()
    for lp in log_probs:
        ok &= ~(mask & ~torch.isfinite(lp)).any(dim=-1)
    return ok


def sample_chi2(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] mean over each sample's response tokens of (w - 1)^2, w = exp(clamp(log pi_old - log mu, +-20)).

    All inputs [B, L]. Samples with no response token, or a non-finite log-prob at one, score +inf
    (never eligible) instead of NaN.
    """
    if not (old_log_probs.shape == rollout_log_probs.shape == response_mask.shape):
        raise ValueError(
            "sample_chi2: old_log_probs, rollout_log_probs and response_mask must share a shape, got "
            f"{tuple(old_log_probs.shape)}, {tuple(rollout_log_probs.shape)}, {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    delta = torch.nan_to_num(old_log_probs.float() - rollout_log_probs.float(), nan=0.0)
    w = torch.exp(delta.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    sq = torch.where(mask, (w - 1.0).square(), torch.zeros_like(w))
    count = mask.sum(dim=-1)
    score = sq.sum(dim=-1) / count.clamp(min=1)
    bad = (count == 0) | ~finite_samples(mask, old_log_probs, rollout_log_probs)
    return torch.where(bad, torch.full_like(score, float("inf")), score)


def group_scores(sample_scores: torch.Tensor, group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[G] mean of the sample scores of each group; group_index: [B] ints in [0, G)."""
    if sample_scores.shape != group_index.shape:
        raise ValueError(f"group_scores: sample_scores {tuple(sample_scores.shape)} and group_index {tuple(group_index.shape)} differ")
    sums = torch.zeros(num_groups, dtype=torch.float64, device=sample_scores.device)
    sums.index_add_(0, group_index, sample_scores.double())
    counts = torch.bincount(group_index, minlength=num_groups).clamp(min=1)
    return (sums / counts).to(sample_scores.dtype)
