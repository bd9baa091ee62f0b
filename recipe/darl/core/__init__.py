"""D-ARL core in plain PyTorch (no Ray, no verl workers): the group record, the replay buffer, selection, the
per-source weights, the multi-behavior loss and the step that ties them together."""

from .buffer import EvictionStats, ReplayBuffer, StepCandidates
from .config import ReplayConfig
from .group import Group, gather_recorded
from .loss import darl_policy_loss
from .prompt_replay import PromptStore, history_group
from .scoring import finite_samples, group_scores, sample_chi2
from .selection import Selection, group_multiple, select_for_step, select_groups
from .step import ClipSettings, DataPlane, LossInputs, ReplayStep, StepPlan, StepState
from .weights import BatchWeights, batch_weights, behavior_log_denominator, clip_ranges, m2_gate, truncated_log_rho

__all__ = [
    "BatchWeights", "EvictionStats", "Group", "LossInputs", "PromptStore", "ReplayBuffer", "ReplayConfig",
    "ReplayStep", "Selection", "StepCandidates", "StepPlan", "batch_weights", "behavior_log_denominator",
    "clip_ranges", "darl_policy_loss", "finite_samples", "gather_recorded", "group_multiple", "group_scores",
    "history_group", "m2_gate", "sample_chi2", "select_for_step", "select_groups", "truncated_log_rho",
]
