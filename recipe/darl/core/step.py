"""One D-ARL step, the same in every verl trainer and the study harness.

    state = step.begin(plane, fresh, version, budget, multiple, min_multiple, clip)
        # plan (candidates, selection, training order); the plane's pi_old forward of the trained groups;
        # record pi_old per group; the loss inputs (per-source weights, clip ranges), handed to the plane
    ... the host's advantages and update (verl's stages, or the harness's loop with step.loss) ...
    step.end(state)  # reuse counts, insert the fresh groups, evict

The plane is where a step's samples live: verl's DataProto (the V0 trainers), TransferQueue rows (the V1 trainer),
plain tensors (the harness). `begin` and `end` are the only sequence of the step; the planes only move data.

`ReplayStep(None)` is decoupled PPO: no buffer, each sample weighed against its own behavior policy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Protocol

import torch

from .buffer import EvictionStats, ReplayBuffer, StepCandidates
from .config import ReplayConfig
from .group import Group, gather_recorded
from .loss import darl_policy_loss
from .selection import Selection, select_for_step
from .weights import BatchWeights, batch_weights, clip_ranges


@dataclass
class StepPlan:
    """What a step trains: `trained` are the selected groups in arrival order (mini-batches mix versions)."""

    version: int  # pi_old's version: staleness is measured against it
    selection: Selection
    trained: list[Group]
    cands: Optional[StepCandidates] = None  # None without replay


@dataclass
class LossInputs:
    """The per-sample inputs of the D-ARL loss for the B trained samples (L response tokens each).

    `per_token` is the one list of them: each plane hands them to the update under `darl_<name>` (`batch_fields`) and
    the loss (`core.darl_policy_loss`) takes them by name, so a new input is a field here and its use in the loss."""

    weights: BatchWeights  # log_denominator, token_coef: [B, L]; per-source alpha / ESS for the metrics
    clip_low: torch.Tensor  # [B] PPO clip range below 1, by staleness
    clip_high: torch.Tensor  # [B] above 1

    FIELDS = ("log_denominator", "token_coef", "clip_low", "clip_high")  # darl_policy_loss's keyword names
    PREFIX = "darl_"  # their batch keys: darl_log_denominator, ...

    def per_token(self, width: int) -> dict[str, torch.Tensor]:
        """{name: [B, L]} of FIELDS, L = width (float32; per-sample values repeated along the response)."""
        per_sample = {"clip_low": self.clip_low, "clip_high": self.clip_high}
        out = {"log_denominator": self.weights.log_denominator.float(), "token_coef": self.weights.token_coef.float(),
               **{k: v.float().unsqueeze(1).expand(-1, width).contiguous() for k, v in per_sample.items()}}
        return {k: out[k] for k in self.FIELDS}

    def batch_fields(self, width: int) -> dict[str, torch.Tensor]:
        """`per_token` under the batch keys the actor's loss reads (`darl_<name>`)."""
        return {self.PREFIX + k: v for k, v in self.per_token(width).items()}


@dataclass(frozen=True)
class ClipSettings:
    """The loss's settings the weights depend on: C of truncated IS, PPO's eps below and above 1."""

    threshold: float
    clip_low: float
    clip_high: float


class DataPlane(Protocol):
    """Where a step's samples live; it runs the pi_old forward and hands the loss inputs to its update."""

    def old_log_probs(self, plan: StepPlan) -> torch.Tensor:
        """[N, L] log pi_old of `plan.trained`'s samples in order (the forward under the current weights)."""

    def loss_layout(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(response_mask [N, L], rollout_log_probs [N, L], optimizer mini-batch of each sample [N])."""

    def put_loss_inputs(self, plan: StepPlan, inputs: LossInputs) -> None:
        """Hands the loss inputs to the update (the actor's batch, TransferQueue, the harness's loop)."""


@dataclass
class StepState:
    """A step between `begin` and `end`; timing in seconds (`replay/time_*_s`)."""

    plan: StepPlan
    old_log_probs: Optional[torch.Tensor] = None  # [N, L]; None when the step skips its update
    response_mask: Optional[torch.Tensor] = None  # [N, L]
    rollout_log_probs: Optional[torch.Tensor] = None  # [N, L]
    minibatch: Optional[torch.Tensor] = None  # [N] each sample's optimizer mini-batch
    inputs: Optional[LossInputs] = None
    timing: dict[str, float] = field(default_factory=dict)


class ReplayStep:
    """One object per run: the buffer (with replay) and the step's decisions over it."""

    def __init__(self, config: Optional[ReplayConfig]) -> None:
        self.config = config
        self.buffer: Optional[ReplayBuffer] = ReplayBuffer(config) if config is not None else None
        # the loss settings; without replay, decoupled PPO's (`pmis=False`): each sample's own behavior,
        # token-weighted sources, no m2 budget, no clip decay, no behavior trust region
        self.weighting = config if config is not None else ReplayConfig(pmis=False)

    def begin(self, plane: DataPlane, fresh: list[Group], version: int, budget: int, multiple: int,
              min_multiple: Optional[int], clip: ClipSettings) -> StepState:
        """Plans the step over `fresh` and, unless it skips its update, gets pi_old of the trained groups from the
        plane, records it and hands the plane the loss inputs."""
        t0 = time.perf_counter()
        state = StepState(self.plan(fresh, version, budget, multiple, min_multiple))
        state.timing["select"] = time.perf_counter() - t0
        if state.plan.selection.skipped:
            return state
        t0 = time.perf_counter()
        state.old_log_probs = plane.old_log_probs(state.plan)
        state.timing["recompute"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.record(state.plan, state.old_log_probs)
        state.response_mask, state.rollout_log_probs, state.minibatch = plane.loss_layout(state.plan)
        state.inputs = self.loss_inputs(state.plan, state.response_mask, state.old_log_probs, state.rollout_log_probs,
                                        clip.threshold, clip.clip_low, clip.clip_high, state.minibatch)
        plane.put_loss_inputs(state.plan, state.inputs)
        state.timing["weights"] = time.perf_counter() - t0
        return state

    def end(self, state: StepState) -> Optional[EvictionStats]:
        """Counts reuse of the trained groups, inserts the fresh ones, evicts (None without replay)."""
        t0 = time.perf_counter()
        evicted = self.finish(state.plan)
        state.timing["buffer"] = time.perf_counter() - t0
        return evicted

    def plan(self, fresh: list[Group], version: int, budget: int, multiple: int,
             min_multiple: Optional[int]) -> StepPlan:
        """Candidates and selection: whole mini-batches of `multiple` groups, or one of `min_multiple` when fewer are
        eligible. budget: B, the groups a step trains without replay."""
        if self.buffer is None:
            picked = list(range(len(fresh)))
            return StepPlan(version, Selection(picked, len(fresh), budget, not fresh, "" if fresh else "no groups"),
                            list(fresh))
        cands = self.buffer.begin_step(fresh, version)
        if not cands.candidates:
            return StepPlan(version, Selection([], 0, 0, True, "no candidate groups"), [], cands)
        selection = select_for_step(cands.candidates, cands.fresh, self.config, budget, multiple, min_multiple)
        order = sorted(selection.selected, key=lambda i: cands.candidates[i].seq)
        return StepPlan(version, selection, [cands.candidates[i] for i in order], cands)

    def record(self, plan: StepPlan, old_log_probs: torch.Tensor) -> None:
        """Stores log pi_old ([N, L], trained samples in order) in each group for later steps' pmis denominators."""
        if self.buffer is None:
            return
        for g, log_probs in zip(plan.trained, old_log_probs.split([g.n for g in plan.trained])):
            g.record(plan.version, log_probs)

    def loss_inputs(self, plan: StepPlan, response_mask: torch.Tensor, old_log_probs: torch.Tensor,
                    rollout_log_probs: torch.Tensor, threshold: float, clip_low: float, clip_high: float,
                    minibatch_index: torch.Tensor) -> LossInputs:
        """Weights of the trained samples ([B, L], `plan.trained` order; minibatch_index: [B]). threshold: C of
        truncated IS; clip_low/high: PPO's eps."""
        versions = torch.cat([g.versions for g in plan.trained])
        c = self.weighting
        behavior = c.resolved_behavior_weight
        weights = batch_weights(
            response_mask, old_log_probs, rollout_log_probs, versions, behavior, c.resolved_source_weight, threshold,
            recorded=gather_recorded(plan.trained, response_mask.shape[1]) if behavior == "pmis" else None,
            minibatch_index=minibatch_index, m2_budget=c.resolved("m2_budget"))
        low, high = clip_ranges(versions, plan.version, clip_low, clip_high, c.clip_decay)
        return LossInputs(weights, low, high)

    def loss(self, log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
             response_mask: torch.Tensor, inputs: LossInputs, rows: torch.Tensor, threshold: float,
             clip_ratio_c: float = 3.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The D-ARL loss of one mini-batch (as the trainers' actor computes it); rows: [b], other tensors [b, L]."""
        fields = {k: v[rows] for k, v in inputs.per_token(response_mask.shape[1]).items()}
        return darl_policy_loss(
            log_prob, old_log_prob, advantages, response_mask, threshold=threshold, clip_ratio_c=clip_ratio_c,
            stop_grad=self.weighting.stop_grad, behavior_clip=self.weighting.behavior_clip_range(), **fields)

    def finish(self, plan: StepPlan) -> Optional[EvictionStats]:
        """Counts reuse of the trained groups, inserts the fresh ones, evicts (None without replay)."""
        if self.buffer is None:
            return None
        return self.buffer.end_step(plan.cands, plan.trained if not plan.selection.skipped else [])
