"""D-ARL core: replay buffer, variance-guided selection and the multi-behavior loss.

Plain PyTorch: no Ray, no verl workers or trainer. The trainers, the tests and the study call these.
"""

from .buffer import EvictionStats, Group, ReplayBuffer, StepCandidates, gather_recorded
from .config import ReplayConfig
from .loss import darl_policy_loss
from .prompt_replay import PromptStore, history_group
from .scoring import finite_samples, group_scores, sample_chi2
from .selection import Selection, group_multiple, reward_variance, select_for_step, select_groups
from .success import Success, SuccessStore, graft
from .weights import BatchWeights, batch_weights, behavior_log_denominator, clip_ranges, m2_gate, truncated_log_rho

__all__ = [
    "BatchWeights",
    "EvictionStats",
    "Group",
    "ReplayBuffer",
    "ReplayConfig",
    "Selection",
    "StepCandidates",
    "batch_weights",
    "behavior_log_denominator",
    "clip_ranges",
    "darl_policy_loss",
    "finite_samples",
    "gather_recorded",
    "group_multiple",
    "group_scores",
    "m2_gate",
    "PromptStore",
    "history_group",
    "sample_chi2",
    "reward_variance",
    "select_for_step",
    "select_groups",
    "Success",
    "SuccessStore",
    "graft",
    "truncated_log_rho",
]
