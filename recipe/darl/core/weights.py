"""Behavior and source weights of the multi-behavior objective (docs/algorithm.md, 'Multi-behavior weights').

`batch_weights` runs once per step and gives per token the log of rho's denominator and alpha_v / tokens(S_v) of
the token's source in its mini-batch: constants, so the loss is a plain sum independent of micro-batch cuts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Mapping, Optional

import torch

from .scoring import LOG_RATIO_BOUND, finite_samples

# version j -> (known [B] bool: sample i has log-probs of version j, log_probs [B, L])
RecordedLogProbs = Mapping[int, tuple[torch.Tensor, torch.Tensor]]


@dataclass
class BatchWeights:
    """Per-token constants for the loss, and what they were made of."""

    log_denominator: torch.Tensor  # [B, L] log of rho's denominator (log mu_v for `own`)
    token_coef: torch.Tensor  # [B, L] alpha_v / tokens(S_v) in the token's mini-batch, 0 if masked or invalid
    valid: torch.Tensor  # [B] bool: finite log-probs at every response token
    sources: list[int]  # behavior versions present, ascending
    alpha: torch.Tensor  # [M, S] alpha of source s in mini-batch m (0 where absent)
    ess: torch.Tensor  # [M, S] effective sample size in tokens
    tokens: torch.Tensor  # [M, S] response tokens
    truncated_fraction: float  # share of valid tokens whose rho exceeded the threshold
    metrics: dict[str, float] = field(default_factory=dict)


def truncated_log_rho(log_target: torch.Tensor, log_denominator: torch.Tensor, threshold: float) -> torch.Tensor:
    """log min(rho, C), rho = exp(log_target - log_denominator), bounded below at -20 as verl does."""
    return (log_target - log_denominator).clamp(-LOG_RATIO_BOUND, math.log(threshold))


def behavior_log_denominator(versions: torch.Tensor, rollout_log_probs: torch.Tensor,
                             recorded: Optional[RecordedLogProbs], mode: Literal["own", "pmis"]) -> torch.Tensor:
    """[B, L] log sum_{j in A_i} beta_j q_j per token; `own` is log mu_{v_i} (A_i = {v_i}).

    versions: [B]; rollout_log_probs: [B, L] log mu_{v_i}; recorded: log-probs at later versions j. A_i = {v_i}
    plus the recorded versions that generated selected samples; beta_j = n_j / sum_{k in A_i} n_k (n_j selected).
    """
    if mode == "own":
        return rollout_log_probs
    if mode != "pmis":
        raise ValueError(f"behavior_log_denominator: mode must be 'own' or 'pmis', got {mode!r}")
    sources, counts = torch.unique(versions, return_counts=True)
    log_num = torch.full_like(rollout_log_probs, -math.inf)
    log_norm = torch.full((versions.shape[0], 1), -math.inf, dtype=rollout_log_probs.dtype, device=versions.device)
    for j, n_j in zip(sources.tolist(), counts.tolist()):
        own = versions == j
        if recorded is not None and j in recorded:
            known_j, lp_j = recorded[j]
            known = own | known_j.bool()
            q = torch.where(own.unsqueeze(-1), rollout_log_probs, lp_j)  # the engine's own log-probs win
        else:
            known, q = own, rollout_log_probs
        log_n = math.log(n_j)
        log_num = torch.where(known.unsqueeze(-1), torch.logaddexp(log_num, q + log_n), log_num)
        log_norm = torch.where(known.unsqueeze(-1), torch.logaddexp(log_norm, torch.full_like(log_norm, log_n)), log_norm)
    return log_num - log_norm


def m2_gate(log_w: torch.Tensor, keep: torch.Tensor, budget: float) -> torch.Tensor:
    """[B, L] bool: the fewest tokens, largest (log w)^2 first, whose removal brings the mean of (log w)^2
    over the remaining `keep` tokens to <= budget. log_w: [B, L] log pi_old - log denominator."""
    if not budget > 0:
        raise ValueError(f"m2_gate: budget (replay.m2_budget) must be > 0, got {budget}")
    m2 = torch.where(keep, log_w.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).double().square(), 0.0).flatten()
    idx = keep.flatten().nonzero().squeeze(-1)
    values, order = m2[idx].sort(descending=True)
    count = values.numel()
    # mean of the rest after removing the j largest, j = 0..count-1
    rest = values.sum() - torch.cat([values.new_zeros(1), values.cumsum(0)[:-1]])
    mean_rest = rest / torch.arange(count, 0, -1, dtype=torch.float64)
    ok = (mean_rest <= budget).nonzero()
    drop = int(ok[0]) if ok.numel() else count
    out = torch.zeros(keep.numel(), dtype=torch.bool)
    out[idx[order[:drop]]] = True
    return out.view(keep.shape)


def clip_ranges(versions: torch.Tensor, step: int, clip_low: float, clip_high: float,
                clip_decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[B] per-sample clip ranges: verl's clip_ratio_low/high times clip_decay ** (step - v)."""
    factor = torch.pow(torch.tensor(float(clip_decay), dtype=torch.float64), (step - versions).double()).float()
    return clip_low * factor, clip_high * factor


def batch_weights(
    response_mask: torch.Tensor, old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
    versions: torch.Tensor, behavior_weight: Literal["own", "pmis"], source_weight: Literal["ess", "tokens"],
    threshold: float, recorded: Optional[RecordedLogProbs] = None, minibatch_index: Optional[torch.Tensor] = None,
    m2_budget: Optional[float] = None,
) -> BatchWeights:
    """The loss's per-token constants for a selected batch.

    response_mask, old_log_probs (log pi_old), rollout_log_probs (log mu_v): [B, L]; versions, minibatch_index: [B]
    (None: one mini-batch). Samples with a non-finite log-prob at a response token get coefficient 0 (counted).
    m2_budget (M2PO's gate): the tokens of largest (log pi_old - log denominator)^2 get coefficient 0 until the
    mean over the rest is <= m2_budget.
    """
    shape = tuple(response_mask.shape)
    for name, t in (("old_log_probs", old_log_probs), ("rollout_log_probs", rollout_log_probs)):
        if tuple(t.shape) != shape:
            raise ValueError(f"batch_weights: {name} has shape {tuple(t.shape)}, response_mask has {shape}")
    if tuple(versions.shape) != shape[:1]:
        raise ValueError(f"batch_weights: versions has shape {tuple(versions.shape)}, expected {shape[:1]}")
    if minibatch_index is not None and tuple(minibatch_index.shape) != shape[:1]:
        raise ValueError(f"batch_weights: minibatch_index has shape {tuple(minibatch_index.shape)}, expected {shape[:1]}")
    if not threshold > 0:
        raise ValueError(f"batch_weights: threshold (rollout_is_threshold) must be > 0, got {threshold}")
    for j, (known, lp) in (recorded or {}).items():
        if tuple(known.shape) != shape[:1] or tuple(lp.shape) != shape:
            raise ValueError(f"batch_weights: recorded[{j}] has shapes {tuple(known.shape)}, {tuple(lp.shape)}")

    mask = response_mask.bool()
    valid = finite_samples(mask, old_log_probs, rollout_log_probs)
    for known, lp in (recorded or {}).values():
        valid &= ~known.bool() | finite_samples(mask, lp)
    keep = mask & valid.unsqueeze(-1)

    # zeros in place of the rejected entries, so no NaN reaches logsumexp or a gradient
    old = torch.where(keep, old_log_probs, 0.0)
    rollout = torch.where(keep, rollout_log_probs, 0.0)
    rec = {j: (k.bool() & valid, torch.where(keep, lp, 0.0)) for j, (k, lp) in (recorded or {}).items()}
    log_denominator = behavior_log_denominator(versions, rollout, rec, behavior_weight)
    log_denominator = torch.where(keep, log_denominator, old)
    gated = torch.zeros_like(keep)
    if m2_budget is not None:
        gated = m2_gate(old - log_denominator, keep, m2_budget)
        keep = keep & ~gated
    log_rho = truncated_log_rho(old, log_denominator, threshold)
    rho = torch.where(keep, log_rho.exp(), 0.0)
    truncated = ((old - log_denominator > math.log(threshold)) & keep).sum()

    sources, source_index = torch.unique(versions, return_inverse=True)
    num_sources = sources.shape[0]
    mb = torch.zeros_like(versions) if minibatch_index is None else minibatch_index.long()
    num_mb = int(mb.max()) + 1 if mb.numel() else 1
    cell = mb * num_sources + source_index
    cells = num_mb * num_sources

    def per_cell(values: torch.Tensor) -> torch.Tensor:
        # .double(): bincount of no samples is int64
        return torch.bincount(cell, weights=values.sum(dim=-1).double(), minlength=cells).double().view(num_mb, num_sources)

    tokens = per_cell(keep.double())
    sum_rho = per_cell(rho)
    sum_rho_sq = per_cell(rho.square())
    ess = torch.where(sum_rho_sq > 0, sum_rho.square() / sum_rho_sq.clamp(min=1e-300), 0.0)
    if source_weight == "ess":
        share = ess
    elif source_weight == "tokens":
        share = tokens
    else:
        raise ValueError(f"batch_weights: source_weight must be 'ess' or 'tokens', got {source_weight!r}")
    alpha = share / share.sum(dim=1, keepdim=True).clamp(min=1e-300)
    coef_cell = torch.where(tokens > 0, alpha / tokens.clamp(min=1), 0.0).view(-1)
    token_coef = torch.where(keep, coef_cell[cell].unsqueeze(-1), 0.0)

    valid_tokens = int(keep.sum())
    return BatchWeights(
        log_denominator=log_denominator, token_coef=token_coef.to(old_log_probs.dtype), valid=valid,
        sources=sources.tolist(), alpha=alpha.float(), ess=ess.float(), tokens=tokens.float(),
        truncated_fraction=float(truncated) / max(valid_tokens, 1),
        metrics={"invalid_samples": float((~valid).sum()), "valid_tokens": float(valid_tokens),
                 "m2_gated_fraction": float(gated.sum()) / max(valid_tokens + int(gated.sum()), 1)},
    )
