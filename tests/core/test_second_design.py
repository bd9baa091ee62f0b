"""The second design's switches (docs/algorithm.md): m2 gate, behavior trust region, additive composition,
replay order and the preset's resolution; each against a hand-computed case."""

import math

import pytest
import torch

from recipe.darl.core import ReplayBuffer, ReplayConfig, batch_weights, darl_policy_loss, m2_gate, select_groups


def test_m2_gate_removes_the_fewest_largest_tokens():
    # (log w)^2 = 0.25, 0.01, 0, 0.09 (masked: 4.0): mean 0.0875 > 0.04; without the 0.25 token 0.1/3 <= 0.04
    log_w = torch.tensor([[0.5, 0.1, 0.0, -0.3, 2.0]])
    keep = torch.tensor([[True, True, True, True, False]])
    assert m2_gate(log_w, keep, 0.04).tolist() == [[True, False, False, False, False]]
    # 0.1/3 = 0.0333 <= 0.034: still one token; 0.03 needs the 0.09 token too
    assert m2_gate(log_w, keep, 0.034).sum() == 1
    assert m2_gate(log_w, keep, 0.03).tolist() == [[True, False, False, True, False]]  # rest: 0.01/2 = 0.005
    assert not m2_gate(log_w, keep, 0.1).any()  # already within budget
    with pytest.raises(ValueError, match="m2_budget"):
        m2_gate(log_w, keep, 0.0)


def test_batch_weights_m2_gate_zeroes_coefficients_and_recounts_tokens():
    mask = torch.ones(2, 2, dtype=torch.bool)
    rollout = torch.full((2, 2), -1.0)
    old = rollout + torch.tensor([[0.5, 0.1], [0.0, -0.3]])
    versions = torch.tensor([3, 3])
    w = batch_weights(mask, old, rollout, versions, "own", "tokens", 2.0, m2_budget=0.04)
    # one source, 3 tokens left: coefficient 1/3 each, 0 on the gated token
    assert w.token_coef.flatten().tolist() == pytest.approx([0.0, 1 / 3, 1 / 3, 1 / 3])
    assert w.tokens.tolist() == [[3.0]]
    assert w.metrics["m2_gated_fraction"] == pytest.approx(0.25)
    # R5: pi_old = mu gates nothing
    same = batch_weights(mask, rollout, rollout, versions, "own", "tokens", 2.0, m2_budget=0.04)
    assert same.metrics["m2_gated_fraction"] == 0.0 and same.tokens.tolist() == [[4.0]]


def test_behavior_clip_stops_the_gradient_of_tokens_outside_the_behavior_trust_region():
    # q = pi_theta / mu per token: 1.5 (A>0: outside), 1.1 (A>0: inside), 0.5 (A<0: outside), 1.5 (A<0: inside)
    mu = torch.full((1, 4), -1.0, dtype=torch.float64)
    log_q = torch.tensor([[math.log(1.5), math.log(1.1), math.log(0.5), math.log(1.5)]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    coef = torch.full((1, 4), 0.25, dtype=torch.float64)

    def run(behavior_clip):
        log_prob = (mu + log_q).clone().requires_grad_(True)
        old = log_prob.detach().clone()  # pi_old = pi_theta: ratio 1, rho = q truncated at C = 2
        loss, stats = darl_policy_loss(log_prob, old, adv, mask, mu, coef, 0.2, 0.2, 2.0, behavior_clip=behavior_clip)
        loss.backward()
        return loss.item(), log_prob.grad[0].tolist(), stats["behavior_clipped"][0].tolist()

    loss_off, grad_off, clipped_off = run(None)
    loss_on, grad_on, clipped_on = run(0.2)
    assert loss_on == pytest.approx(loss_off)  # the value is kept, only the gradient stops
    assert clipped_off == [False] * 4 and clipped_on == [True, False, True, False]
    # ratio 1: d/dlogp of -rho A r = -rho A; rho = q (truncated at 2), times 0.25
    assert grad_off == pytest.approx([-0.25 * 1.5, -0.25 * 1.1, 0.25 * 0.5, 0.25 * 1.5])
    assert grad_on == pytest.approx([0.0, -0.25 * 1.1, 0.0, 0.25 * 1.5])
    # (0.2, inf): only the A < 0 side is bounded; the A > 0 token at q = 1.5 keeps its gradient
    loss_low, grad_low, clipped_low = run((0.2, math.inf))
    assert loss_low == pytest.approx(loss_off) and clipped_low == [False, False, True, False]
    assert grad_low == pytest.approx([-0.25 * 1.5, -0.25 * 1.1, 0.0, 0.25 * 1.5])
    # (0.6, 0.4): q = 1.5 > 1.4 clipped along A > 0; q = 0.5 < 0.4? no: inside for A < 0
    _, grad_wide, clipped_wide = run((0.6, 0.4))
    assert clipped_wide == [True, False, False, False]
    assert grad_wide == pytest.approx([0.0, -0.25 * 1.1, 0.25 * 0.5, 0.25 * 1.5])
    with pytest.raises(ValueError, match="eps_high"):
        run((0.2, 0.0))


def test_additive_selection_keeps_every_fresh_group_and_adds_least_reused():
    # 5 candidates: 2 replayed (reuse 1, 0), 3 fresh; mini-batches of 2 groups
    versions = torch.tensor([1, 1, 3, 3, 3])
    arrival = torch.tensor([0, 1, 2, 3, 4])
    reuse = torch.tensor([1, 0, 0, 0, 0])
    fresh = torch.tensor([False, False, True, True, True])
    # extra 1: 3 fresh + 1 replayed = 4, the least reused (index 1)
    sel = select_groups(4, versions, arrival, multiple=2, order="least_reused", reuse=reuse, fresh=fresh, extra=1)
    assert sel.selected == [2, 3, 4, 1]
    # extra 0: 3 fresh round down to 2 would drop a fresh group; a replayed one rounds it up to 4
    sel = select_groups(4, versions, arrival, multiple=2, order="least_reused", reuse=reuse, fresh=fresh, extra=0)
    assert sel.selected == [2, 3, 4, 1]
    # extra 2 with 5 candidates: 5 rounds down to 4, fresh first
    sel = select_groups(4, versions, arrival, multiple=2, order="newest", fresh=fresh, extra=2)
    assert sel.selected == [2, 3, 4, 0]
    # fixed budget, least reused: ties by newer version then arrival
    sel = select_groups(2, versions, arrival, multiple=1, order="least_reused", reuse=reuse)
    assert sel.selected == [2, 3]
    with pytest.raises(ValueError, match="reuse"):
        select_groups(2, versions, arrival, order="least_reused")
    with pytest.raises(ValueError, match="chi2"):
        select_groups(2, versions, arrival, order="chi2")


def test_preset_resolution_and_off_switches():
    preset = ReplayConfig(enable=True)
    assert [preset.resolved(k) for k in ("order", "ratio", "m2_budget", "behavior_clip", "max_reuse")] == \
        ["least_reused", 0.5, 0.04, 0.2, 2]
    uniform = ReplayConfig(enable=True, pmis=False)
    assert [uniform.resolved(k) for k in ("order", "ratio", "m2_budget", "behavior_clip", "max_reuse")] == \
        ["newest", None, None, None, None]
    off = ReplayConfig(enable=True, ratio=False, m2_budget=False, behavior_clip=False, max_reuse=False, order="newest")
    assert [off.resolved(k) for k in ("order", "ratio", "m2_budget", "behavior_clip", "max_reuse")] == \
        ["newest", None, None, None, None]
    assert ReplayBuffer(preset).max_reuse == 2 and ReplayBuffer(off).max_reuse is None
    assert off.behavior_clip_range() is None and uniform.behavior_clip_range() is None
    assert preset.behavior_clip_range() == (0.2, math.inf)  # the preset bounds A < 0 only
    assert ReplayConfig(enable=True, behavior_clip_high=0.2).behavior_clip_range() == (0.2, 0.2)  # the two-sided trust region
    assert ReplayConfig(enable=True, behavior_clip_high=False).behavior_clip_range() == (preset.resolved("behavior_clip"), math.inf)
    assert ReplayConfig(enable=True, behavior_clip=0.3, behavior_clip_high=1.0).behavior_clip_range() == (0.3, 1.0)


@pytest.mark.parametrize("values,key", [
    ({"order": "oldest"}, "replay.order"),
    ({"ratio": -0.5}, "replay.ratio"),
    ({"ratio": True}, "replay.ratio"),
    ({"m2_budget": 0}, "replay.m2_budget"),
    ({"behavior_clip": 1.5}, "replay.behavior_clip"),
    ({"behavior_clip_high": 0}, "replay.behavior_clip_high"),
    ({"behavior_clip_high": 0.5, "behavior_clip": False}, "replay.behavior_clip_high"),
    ({"behavior_clip_high": 0.5, "pmis": False}, "replay.behavior_clip_high"),
    ({"max_reuse": True}, "replay.max_reuse"),
    ({"order": "chi2"}, "replay.order"),  # a retired design is an error, not a silent default
    ({"success": 1}, "unknown replay key"),
])
def test_bad_second_design_values_name_their_key(values, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        ReplayConfig.from_dict(values)
