"""The multi-behavior loss: hand-computed values and gradients, reductions R1, R3, R4, R5, numerical safety."""

import math

import pytest
import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
from verl.workers.config.actor import ActorConfig

from recipe.darl.core import batch_weights, clip_ranges, darl_policy_loss


def _loss(log_prob, old, adv, mask, weights, clip=0.2, threshold=2.0, stop_grad=True, clip_low=None, clip_high=None):
    return darl_policy_loss(
        log_prob, old, adv, mask, weights.log_denominator, weights.token_coef,
        clip if clip_low is None else clip_low, clip if clip_high is None else clip_high,
        threshold, stop_grad=stop_grad,
    )[0]


def test_loss_value_and_gradient_by_hand():
    # four tokens, one per case: clipped above, clipped below, unclipped, dual-clipped
    log_ratio = torch.tensor([[math.log(1.5), math.log(0.5), 0.0, math.log(4.0)]], dtype=torch.float64)
    old = torch.full((1, 4), -1.0, dtype=torch.float64)
    log_prob = (old + log_ratio).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 2.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    rho = torch.tensor([[3.0, 1.0, 1.5, 0.5]], dtype=torch.float64)  # pi_old / mu; the first is truncated to 2
    log_denominator = old - rho.log()
    coef = torch.full((1, 4), 0.25, dtype=torch.float64)
    loss, stats = darl_policy_loss(log_prob, old, adv, mask, log_denominator, coef, 0.2, 0.2, threshold=2.0)
    # token losses: -2*1.2, +1*0.8, -1.5*2, +0.5*3 (dual clip at c=3)
    expected = 0.25 * (-2.4 + 0.8 - 3.0 + 1.5)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    loss.backward()
    # only the unclipped token has a gradient: d/dlogp of -rho*A*exp(logp-old) = -1.5*2*1, times 0.25
    assert log_prob.grad[0].tolist() == pytest.approx([0.0, 0.0, -0.75, 0.0], abs=1e-12)
    assert stats["clipped"].tolist() == [[True, True, False, False]]  # as verl counts pg_clipfrac


def test_stop_grad_false_sends_gradient_through_rho():
    old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    log_prob = torch.tensor([[-0.95, -2.05]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    log_denominator = torch.tensor([[-1.2, -2.1]], dtype=torch.float64)  # rho = e^0.25, e^0.05: not truncated
    coef = torch.full((1, 2), 0.5, dtype=torch.float64)
    loss, _ = darl_policy_loss(log_prob, old, adv, mask, log_denominator, coef, 0.2, 0.2, 2.0, stop_grad=False)
    loss.backward()
    # l = -exp(logp - denom) * A * exp(logp - old): d l / d logp = 2 * l for unclipped tokens
    lp = log_prob.detach()
    token_loss = -torch.exp(lp - log_denominator) * adv * torch.exp(lp - old)
    assert loss.item() == pytest.approx((0.5 * token_loss).sum().item(), abs=1e-12)
    assert log_prob.grad[0].tolist() == pytest.approx((0.5 * 2 * token_loss)[0].tolist(), abs=1e-12)


def _random_batch(seed, batch=6, length=9, dtype=torch.float64, versions=(3, 3, 2, 2, 1, 1)):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, length, generator=g) > 0.25).to(dtype)
    mask[:, 0] = 1
    old = -torch.rand(batch, length, generator=g, dtype=dtype) * 3
    rollout = old + torch.randn(batch, length, generator=g, dtype=dtype) * 0.6
    log_prob = old + torch.randn(batch, length, generator=g, dtype=dtype) * 0.3
    adv = torch.randn(batch, 1, generator=g, dtype=dtype).expand(batch, length).clone()
    return mask, old, rollout, log_prob, adv, torch.tensor(versions)


def test_r1_single_source_own_tokens_equals_verl_vanilla_with_token_tis():
    mask, old, rollout, log_prob, adv, _ = _random_batch(0, versions=(5,) * 6)
    versions = torch.full((6,), 5)
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                         clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean")
    is_weights, _ = compute_rollout_correction_weights(old - rollout, mask, rollout_is="token", rollout_is_threshold=2.0)
    lp_verl = log_prob.clone().requires_grad_(True)
    verl_loss, _ = compute_policy_loss_vanilla(old, lp_verl, adv, mask, "token-mean", config, rollout_is_weights=is_weights)
    verl_loss.backward()

    weights = batch_weights(mask, old, rollout, versions, "own", "tokens", threshold=2.0)
    lp_ours = log_prob.clone().requires_grad_(True)
    ours = _loss(lp_ours, old, adv, mask, weights, clip_low=0.2, clip_high=0.28)
    ours.backward()
    assert ours.item() == pytest.approx(verl_loss.item(), abs=1e-6)
    torch.testing.assert_close(lp_ours.grad, lp_verl.grad, atol=1e-6, rtol=0)
    assert ours.item() != 0.0


def test_r3_one_source_ess_equals_tokens():
    mask, old, rollout, log_prob, adv, _ = _random_batch(1)
    versions = torch.full((6,), 4)
    recorded = {5: (torch.tensor([True, False, True, False, True, False]), old + 0.1)}
    losses = []
    for source_weight in ("ess", "tokens"):
        w = batch_weights(mask, old, rollout, versions, "pmis", source_weight, 2.0, recorded=recorded)
        losses.append(_loss(log_prob, old, adv, mask, w).item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-12)


@pytest.mark.parametrize("behavior,source", [("pmis", "ess"), ("own", "tokens"), ("pmis", "tokens")])
def test_r4_micro_batch_cuts_give_the_same_gradient(behavior, source):
    mask, old, rollout, log_prob, adv, versions = _random_batch(2)
    recorded = {3: (versions < 3, old - 0.2), 2: (versions < 2, old + 0.3)}
    w = batch_weights(mask, old, rollout, versions, behavior, source, 2.0, recorded=recorded)
    low, high = clip_ranges(versions, step=4, clip_low=0.2, clip_high=0.28, clip_decay=0.8)
    grads = []
    for cuts in ([6], [1, 5], [2, 2, 2], [3, 1, 1, 1]):
        lp = log_prob.clone().requires_grad_(True)
        start = 0
        for size in cuts:
            sl = slice(start, start + size)
            loss, _ = darl_policy_loss(lp[sl], old[sl], adv[sl], mask[sl], w.log_denominator[sl], w.token_coef[sl],
                                       low[sl], high[sl], 2.0)
            loss.backward()
            start += size
        grads.append(lp.grad)
    for g in grads[1:]:
        torch.testing.assert_close(g, grads[0], atol=1e-12, rtol=0)
    assert grads[0].abs().sum() > 0


def test_r5_matched_policies_give_rho_one_and_plain_ppo():
    mask, old, _, log_prob, adv, versions = _random_batch(3)
    w = batch_weights(mask, old, old.clone(), versions, "pmis", "tokens", 2.0)
    torch.testing.assert_close(w.log_denominator * mask, old * mask)
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                         clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode="token-mean")
    plain, _ = compute_policy_loss_vanilla(old, log_prob, adv, mask, "token-mean", config)
    assert _loss(log_prob, old, adv, mask, w).item() == pytest.approx(plain.item(), abs=1e-12)


def test_clip_decay_shrinks_the_clip_range_per_source():
    low, high = clip_ranges(torch.tensor([9, 8, 6]), step=10, clip_low=0.2, clip_high=0.3, clip_decay=0.5)
    assert low.tolist() == pytest.approx([0.1, 0.05, 0.0125])
    assert high.tolist() == pytest.approx([0.15, 0.075, 0.01875])
    # ratio 1.1 with A > 0 is inside the fresh clip (0.15) but outside the stale one (0.05)
    log_prob = torch.full((2, 1), math.log(1.1), dtype=torch.float64, requires_grad=True)
    zeros = torch.zeros(2, 1, dtype=torch.float64)
    ones = torch.ones(2, 1, dtype=torch.float64)
    loss, _ = darl_policy_loss(log_prob, zeros, ones, ones, zeros, ones, low[:2], high[:2], 2.0)
    loss.backward()
    assert log_prob.grad[0, 0].item() == pytest.approx(-1.1)
    assert log_prob.grad[1, 0].item() == 0.0
    assert loss.item() == pytest.approx(-1.1 - 1.075)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("where", ["old", "rollout", "recorded"])
def test_non_finite_log_probs_are_masked_and_counted(bad, where):
    mask, old, rollout, log_prob, adv, versions = _random_batch(4)
    recorded = {3: (versions < 3, old - 0.1)}
    target = {"old": old, "rollout": rollout, "recorded": recorded[3][1]}[where]
    target[4, 1] = bad  # sample 4 has version 1, so its recorded version-3 log-probs are read
    mask[4, 1] = 1
    w = batch_weights(mask, old, rollout, versions, "pmis", "ess", 2.0, recorded=recorded)
    assert w.metrics["invalid_samples"] == 1.0
    assert not w.valid[4] and w.valid[[0, 1, 2, 3, 5]].all()
    assert (w.token_coef[4] == 0).all()
    lp = log_prob.clone().requires_grad_(True)
    loss = _loss(lp, old, adv, mask, w, stop_grad=(where != "old"))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert (lp.grad[4] == 0).all() and lp.grad.abs().sum() > 0


def test_log_prob_differences_of_hundreds_stay_finite():
    mask, old, rollout, log_prob, adv, versions = _random_batch(5)
    rollout[0] = old[0] - 300.0  # rho = e^300: truncated
    rollout[1] = old[1] + 300.0  # rho = e^-300
    log_prob[2] = old[2] + 200.0
    w = batch_weights(mask, old, rollout, versions, "pmis", "ess", 2.0)
    assert w.metrics["invalid_samples"] == 0.0
    assert w.truncated_fraction > 0
    for stop_grad in (True, False):
        lp = log_prob.clone().requires_grad_(True)
        loss = _loss(lp, old, adv, mask, w, stop_grad=stop_grad)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()


def test_shape_mismatch_names_the_argument():
    mask, old, rollout, log_prob, adv, versions = _random_batch(6)
    with pytest.raises(ValueError, match="rollout_log_probs"):
        batch_weights(mask, old, rollout[:, :-1], versions, "own", "tokens", 2.0)
    with pytest.raises(ValueError, match="versions"):
        batch_weights(mask, old, rollout, versions[:-1], "own", "tokens", 2.0)
    with pytest.raises(ValueError, match="threshold"):
        batch_weights(mask, old, rollout, versions, "own", "tokens", 0.0)
    w = batch_weights(mask, old, rollout, versions, "own", "tokens", 2.0)
    with pytest.raises(ValueError, match="advantages"):
        darl_policy_loss(log_prob, old, adv[:, :-1], mask, w.log_denominator, w.token_coef, 0.2, 0.2, 2.0)
