"""`ReplayStep`, the step the trainers and the study harness share: a plan, its records, its loss inputs and its loss
by hand, against the core functions it composes."""

import pytest
import torch

from groups import group
from recipe.darl.core import ReplayConfig, ReplayStep, batch_weights, clip_ranges, darl_policy_loss


def _rows(groups, name, width=2):
    return torch.cat([g.padded(name, width) for g in groups])


def test_a_two_step_plan_replays_the_least_reused_group_and_records_pi_old():
    step = ReplayStep(ReplayConfig(enable=True, k=2, warmup=0, prompt_replay=False))
    a, b = group("a", 1, [1.0, 0.0], base=-1.0), group("b", 1, [0.0, 1.0], base=-1.0, prompt=(9, 9))
    first = step.plan([a, b], version=1, budget=2, multiple=1, min_multiple=1)
    assert first.trained == [a, b] and first.cands.candidates == [a, b]
    step.record(first, torch.full((4, 2), -0.5))
    assert a.recorded[1].tolist() == [-0.5] * 4 and b.recorded[1].tolist() == [-0.5] * 4  # packed: 2 x 2 tokens
    step.finish(first)
    assert step.buffer.groups == [a, b] and a.times_trained == 1

    c = group("c", 2, [1.0, 0.0], base=-2.0, prompt=(8, 8))
    second = step.plan([c], version=2, budget=2, multiple=1, min_multiple=1)
    # the preset's additive composition: c, then round(0.5 x 2) = 1 replayed group, a (same reuse, earlier arrival)
    assert second.trained == [a, c] and second.selection.eligible == 3
    mask = _rows(second.trained, "response_mask").bool()
    rollout = _rows(second.trained, "rollout_log_probs")
    old = rollout + 0.1
    step.record(second, old)
    inputs = step.loss_inputs(second, mask, old, rollout, threshold=2.0, clip_low=0.2, clip_high=0.3,
                              minibatch_index=torch.zeros(4, dtype=torch.long))
    versions = torch.tensor([1, 1, 2, 2])
    recorded = {1: (torch.tensor([True, True, False, False]), torch.cat([torch.full((2, 2), -0.5), torch.zeros(2, 2)])),
                2: (torch.ones(4, dtype=torch.bool), old)}
    direct = batch_weights(mask, old, rollout, versions, "pmis", "ess", 2.0, recorded=recorded, m2_budget=0.04)
    torch.testing.assert_close(inputs.weights.token_coef, direct.token_coef)
    torch.testing.assert_close(inputs.weights.log_denominator[mask], direct.log_denominator[mask])
    low, high = clip_ranges(versions, 2, 0.2, 0.3, 1.0)
    assert torch.equal(inputs.clip_low, low) and torch.equal(inputs.clip_high, high)

    # the loss of a mini-batch is darl_policy_loss with the config's stop_grad and trust region
    rows = torch.tensor([0, 1])
    log_prob = old[rows] + 0.05
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    got, _ = step.loss(log_prob, old[rows], adv, mask[rows], inputs, rows, threshold=2.0)
    want, _ = darl_policy_loss(log_prob, old[rows], adv, mask[rows], direct.log_denominator[rows],
                               direct.token_coef[rows], low[rows], high[rows], 2.0, stop_grad=True,
                               behavior_clip=(0.2, float("inf")))
    assert got.item() == pytest.approx(want.item())
    evicted = step.finish(second)
    assert evicted.max_reuse == 1 and [g.uid for g in step.buffer.groups] == ["b", "c"]  # a: trained twice


def test_without_replay_every_fresh_group_trains_against_its_own_behavior():
    step = ReplayStep(None)  # decoupled PPO, the study's baseline
    a, b = group("a", 3, [1.0, 0.0], base=-1.0), group("b", 3, [0.0, 1.0], base=-2.0)
    plan = step.plan([a, b], version=4, budget=2, multiple=2, min_multiple=None)
    assert plan.trained == [a, b] and plan.cands is None and not plan.selection.skipped
    mask = _rows(plan.trained, "response_mask").bool()
    rollout = _rows(plan.trained, "rollout_log_probs")
    old = rollout - 0.2
    step.record(plan, old)
    assert a.recorded == {}  # nothing is kept without a buffer
    inputs = step.loss_inputs(plan, mask, old, rollout, 2.0, 0.2, 0.2, torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(inputs.weights.log_denominator[mask], rollout[mask])  # own: log mu of the sample
    assert step.finish(plan) is None
    assert step.plan([], 5, 2, 2, None).selection.skipped


class _Plane:
    """A data plane that logs its calls: pi_old = the rollout log-probs + 0.1, one mini-batch."""

    def __init__(self):
        self.calls, self.inputs = [], None

    def old_log_probs(self, plan):
        self.calls.append(("old_log_probs", [g.uid for g in plan.trained]))
        self.rollout = _rows(plan.trained, "rollout_log_probs")
        self.mask = _rows(plan.trained, "response_mask").bool()
        return self.rollout + 0.1

    def loss_layout(self, plan):
        self.calls.append(("loss_layout", len(plan.trained)))
        return self.mask, self.rollout, torch.zeros(self.mask.shape[0], dtype=torch.long)

    def put_loss_inputs(self, plan, inputs):
        self.calls.append(("put_loss_inputs", len(plan.trained)))
        self.inputs = inputs


def test_begin_and_end_run_the_whole_step_through_a_plane():
    """`begin`: plan, the plane's pi_old forward of the trained groups, record, loss inputs handed to the plane (the
    same as `loss_inputs` by hand); `end`: reuse, insert; a step with nothing to train never calls the plane."""
    from recipe.darl.core import ClipSettings

    step = ReplayStep(ReplayConfig(enable=True, k=2, warmup=0, prompt_replay=False))
    a, b = group("a", 1, [1.0, 0.0], base=-1.0), group("b", 1, [0.0, 1.0], base=-1.0, prompt=(9, 9))
    plane = _Plane()
    state = step.begin(plane, [a, b], 1, 2, 1, 1, ClipSettings(2.0, 0.2, 0.3))
    assert plane.calls == [("old_log_probs", ["a", "b"]), ("loss_layout", 2), ("put_loss_inputs", 2)]
    assert plane.inputs is state.inputs
    torch.testing.assert_close(a.recorded[1], (plane.rollout[:2] + 0.1)[plane.mask[:2]])  # packed response tokens
    by_hand = step.loss_inputs(state.plan, plane.mask, state.old_log_probs, plane.rollout, 2.0, 0.2, 0.3,
                               torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(state.inputs.weights.token_coef, by_hand.weights.token_coef)
    assert torch.equal(state.inputs.clip_high, by_hand.clip_high)
    assert step.buffer.groups == []  # nothing inserted before `end`
    step.end(state)
    assert step.buffer.groups == [a, b] and a.times_trained == 1
    assert set(state.timing) == {"select", "recompute", "weights", "buffer"}

    empty = _Plane()
    skipped = ReplayStep(None).begin(empty, [], 2, 2, 1, 1, ClipSettings(2.0, 0.2, 0.3))
    assert skipped.plan.selection.skipped and empty.calls == [] and skipped.old_log_probs is None


def test_the_loss_inputs_are_declared_once_for_every_plane_and_the_loss():
    import inspect

    from recipe.darl.core import LossInputs
    from recipe.darl.workers.actor_loss import BATCH_KEYS

    params = inspect.signature(darl_policy_loss).parameters
    assert all(name in params for name in LossInputs.FIELDS)  # the loss takes each by name
    assert BATCH_KEYS == tuple(f"darl_{name}" for name in LossInputs.FIELDS)  # the actor reads each by its batch key
    weights = batch_weights(torch.ones(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0, 0]), "own",
                            "tokens", 2.0)
    inputs = LossInputs(weights, torch.tensor([0.2, 0.1]), torch.tensor([0.3, 0.25]))
    fields = inputs.batch_fields(3)
    assert list(fields) == list(BATCH_KEYS) and all(v.shape == (2, 3) for v in fields.values())
    assert torch.equal(fields["darl_clip_low"][1], torch.full((3,), 0.1))  # a sample's range along its response
    assert torch.equal(fields["darl_token_coef"], weights.token_coef.float())
