"""Behavior weights (own, pmis balance heuristic), truncation, ESS and alpha, by hand and against a scalar reference."""

import math

import pytest
import torch

from recipe.darl.core import batch_weights, behavior_log_denominator, truncated_log_rho


def test_balance_heuristic_by_hand():
    # samples 0, 1 from version 1, sample 2 from version 2: n_1 = 2, n_2 = 1
    versions = torch.tensor([1, 1, 2])
    rollout = torch.log(torch.tensor([[0.25], [0.25], [0.4]], dtype=torch.float64))
    # sample 0 was rescored at step 2 (log-prob 0.5); sample 1 was not
    recorded = {2: (torch.tensor([True, False, False]), torch.log(torch.tensor([[0.5], [0.9], [0.9]], dtype=torch.float64)))}
    denom = behavior_log_denominator(versions, rollout, recorded, "pmis").exp()
    # sample 0: beta = (2/3, 1/3): 2/3 * 0.25 + 1/3 * 0.5 = 1/3
    assert denom[0, 0].item() == pytest.approx(1 / 3, abs=1e-12)
    # sample 1: only its own version known: the own weight (R2)
    assert denom[1, 0].item() == pytest.approx(0.25, abs=1e-12)
    # sample 2: own version 2 comes from the rollout engine, not the recorded entry
    assert denom[2, 0].item() == pytest.approx(0.4, abs=1e-12)
    pi_old = torch.log(torch.tensor([[0.5], [0.5], [0.5]], dtype=torch.float64))
    rho = (pi_old - denom.log()).exp()
    assert rho[:, 0].tolist() == pytest.approx([1.5, 2.0, 1.25])


def test_r2_pmis_with_one_known_version_equals_own():
    g = torch.Generator().manual_seed(0)
    versions = torch.tensor([4, 4, 3, 2, 2])
    rollout = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 4
    recorded = {5: (torch.zeros(5, dtype=torch.bool), torch.randn(5, 7, dtype=torch.float64))}
    for rec in (None, recorded):
        pmis = behavior_log_denominator(versions, rollout, rec, "pmis")
        own = behavior_log_denominator(versions, rollout, rec, "own")
        torch.testing.assert_close(pmis, own, atol=1e-12, rtol=0)


def _scalar_reference_denominator(versions, rollout, recorded):
    """log sum_j beta_j q_j with plain Python floats, one token at a time."""
    counts = {}
    for v in versions:
        counts[v] = counts.get(v, 0) + 1
    out = []
    for i, v in enumerate(versions):
        row = []
        for l in range(len(rollout[i])):
            known = {v: math.exp(rollout[i][l])}
            for j, (mask, lp) in recorded.items():
                if mask[i] and j in counts and j != v:
                    known[j] = math.exp(lp[i][l])
            total_n = sum(counts[j] for j in known)
            row.append(math.log(sum(counts[j] / total_n * q for j, q in known.items())))
        out.append(row)
    return out


def test_pmis_matches_a_scalar_reference():
    g = torch.Generator().manual_seed(1)
    versions = torch.tensor([7, 7, 7, 6, 6, 5, 4])
    rollout = -torch.rand(7, 5, generator=g, dtype=torch.float64) * 3
    recorded = {
        6: (torch.tensor([0, 0, 0, 0, 0, 1, 1]).bool(), -torch.rand(7, 5, generator=g, dtype=torch.float64)),
        7: (torch.tensor([0, 0, 0, 1, 0, 1, 1]).bool(), -torch.rand(7, 5, generator=g, dtype=torch.float64)),
        8: (torch.ones(7).bool(), -torch.rand(7, 5, generator=g, dtype=torch.float64)),  # generated nothing: beta 0
    }
    ours = behavior_log_denominator(versions, rollout, recorded, "pmis")
    ref = _scalar_reference_denominator(
        versions.tolist(), rollout.tolist(), {j: (m.tolist(), lp.tolist()) for j, (m, lp) in recorded.items()}
    )
    torch.testing.assert_close(ours, torch.tensor(ref, dtype=torch.float64), atol=1e-12, rtol=0)


def test_truncation_at_threshold():
    log_target = torch.log(torch.tensor([0.5, 1.0, 3.0, 100.0]))
    log_rho = truncated_log_rho(log_target, torch.zeros(4), threshold=2.0)
    assert log_rho.exp().tolist() == pytest.approx([0.5, 1.0, 2.0, 2.0])
    assert truncated_log_rho(torch.tensor([-500.0]), torch.zeros(1), 2.0).item() == -20.0


def test_ess_and_alpha_by_hand():
    # source 1 (sample 0): rho_bar over tokens 1, 2, 1 -> ESS = 16 / 6; source 2 (sample 1): 1, 1 -> ESS = 2
    versions = torch.tensor([1, 2])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    old = torch.zeros(2, 3, dtype=torch.float64)
    rollout = torch.tensor([[0.0, -math.log(2.0), 0.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    for source_weight, expected_alpha in (("ess", [(16 / 6) / (16 / 6 + 2), 2 / (16 / 6 + 2)]), ("tokens", [0.6, 0.4])):
        w = batch_weights(mask, old, rollout, versions, "own", source_weight, threshold=2.0)
        assert w.sources == [1, 2]
        assert w.ess[0].tolist() == pytest.approx([16 / 6, 2.0])
        assert w.tokens[0].tolist() == [3.0, 2.0]
        assert w.alpha[0].tolist() == pytest.approx(expected_alpha)
        assert w.token_coef[0].tolist() == pytest.approx([expected_alpha[0] / 3] * 3)
        assert w.token_coef[1].tolist() == pytest.approx([expected_alpha[1] / 2] * 2 + [0.0])
        assert w.truncated_fraction == 0.0  # rho = 2 equals the threshold: not above it


def test_alpha_is_computed_per_mini_batch():
    versions = torch.tensor([1, 2, 1, 1])
    mask = torch.ones(4, 2, dtype=torch.float64)
    zeros = torch.zeros(4, 2, dtype=torch.float64)
    w = batch_weights(mask, zeros, zeros, versions, "own", "tokens", 2.0, minibatch_index=torch.tensor([0, 0, 1, 1]))
    assert w.alpha.tolist() == [[0.5, 0.5], [1.0, 0.0]]
    # every mini-batch's coefficients sum to 1: each is a weighted mean of its tokens
    assert w.token_coef[:2].sum().item() == pytest.approx(1.0)
    assert w.token_coef[2:].sum().item() == pytest.approx(1.0)
