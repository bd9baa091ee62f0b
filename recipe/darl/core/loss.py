"""The multi-behavior clipped objective, per micro-batch (docs/algorithm.md, 'Loss').

l = -rho_bar * min(r A, clip(r, 1 - eps_low_v, 1 + eps_high_v) A) with verl's dual clip for A < 0, L = sum of
token_coef * l. token_coef = alpha_v / tokens(S_v) is normalized over the whole mini-batch, so any cut of it into
micro-batches gives the same value and gradient.
"""

from __future__ import annotations

import math
from typing import Union

import torch

from .scoring import LOG_RATIO_BOUND
from .weights import truncated_log_rho

ClipRange = Union[float, torch.Tensor]  # a float, or [B] per sample (clip decay per source)


def darl_policy_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
    log_denominator: torch.Tensor, token_coef: torch.Tensor, clip_low: ClipRange, clip_high: ClipRange,
    threshold: float, clip_ratio_c: float = 3.0, stop_grad: bool = True,
    behavior_clip: float | tuple[float, float] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar loss of one micro-batch and detached per-token statistics.

    Tensors [B, L] (clip_low/high: [B] or float); log_prob: log pi_theta, old_log_prob: log pi_old.
    rho_bar = min(exp(log_target - log_denominator), threshold), log_target = log pi_old (stop_grad) or log pi_theta.
    Tokens with coefficient 0 contribute nothing; their inputs are replaced first, so a NaN there cannot reach the
    gradient. behavior_clip eps_b (or a pair for A < 0, A > 0; inf: unbounded): a token whose q = pi_theta /
    denominator left [1 - eps_b, 1 + eps_b] in its advantage's direction keeps its loss value but no gradient.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"darl_policy_loss: clip_ratio_c must be > 1, got {clip_ratio_c}")
    shape = log_prob.shape
    for name, t in (("old_log_prob", old_log_prob), ("advantages", advantages), ("response_mask", response_mask),
                    ("log_denominator", log_denominator), ("token_coef", token_coef)):
        if t.shape != shape:
            raise ValueError(f"darl_policy_loss: {name} has shape {tuple(t.shape)}, log_prob has {tuple(shape)}")
    keep = response_mask.bool() & (token_coef != 0)
    safe_lp = torch.where(keep, log_prob, log_prob.detach())
    old = torch.where(keep, old_log_prob, safe_lp.detach())
    adv = torch.where(keep, advantages, 0.0)
    denom = torch.where(keep, log_denominator, old)
    coef = torch.where(keep, token_coef, 0.0)

    log_ratio = (safe_lp - old).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()
    low = _per_token(clip_low, shape, ratio)
    high = _per_token(clip_high, shape, ratio)

    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    pg = torch.maximum(unclipped, clipped)
    pg = torch.where(adv < 0, torch.minimum(-adv * clip_ratio_c, pg), pg)

    behavior_clipped = torch.zeros_like(keep)
    if behavior_clip is not None:
        eps_low, eps_high = behavior_clip if isinstance(behavior_clip, tuple) else (behavior_clip, behavior_clip)
        if not 0.0 < eps_low < 1.0 or not eps_high > 0.0:
            raise ValueError(f"darl_policy_loss: behavior_clip needs eps_low in (0, 1) and eps_high > 0, got {behavior_clip}")
        log_q = (safe_lp - denom).detach()
        behavior_clipped = keep & (((adv > 0) & (log_q > math.log1p(eps_high)))
                                   | ((adv < 0) & (log_q < math.log1p(-eps_low))))
        pg = torch.where(behavior_clipped, pg.detach(), pg)

    log_target = old if stop_grad else safe_lp
    rho_bar = truncated_log_rho(log_target, denom, threshold).exp()
    if stop_grad:
        rho_bar = rho_bar.detach()
    loss = (coef * rho_bar * pg).sum()

    stats = {"clipped": (clipped > unclipped) & keep, "rho_bar": rho_bar.detach(), "neg_approx_kl": log_ratio.detach(),
             "keep": keep, "behavior_clipped": behavior_clipped}
    return loss, stats


def _per_token(value: ClipRange, shape: torch.Size, like: torch.Tensor) -> torch.Tensor | float:
    if isinstance(value, torch.Tensor):
        if value.dim() == 1:
            if value.shape[0] != shape[0]:
                raise ValueError(f"darl_policy_loss: per-sample clip range has {value.shape[0]} rows, batch has {shape[0]}")
            return value.to(like).unsqueeze(-1)
        if value.shape != shape:
            raise ValueError(f"darl_policy_loss: clip range shape {tuple(value.shape)} does not match {tuple(shape)}")
        return value.to(like)
    return value
