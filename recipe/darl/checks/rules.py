"""The checks that are data: in some trainer modes, when a condition key has a value, a key must take one of a few
values. One table, read by `rule_problems`; the checks that compute (batch splits, GPUs, paths) stay code in
config_check.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from ..trainer_mode import FULLY_ASYNC, V0_MODES, V1_MODES
from ..trainers.console import MODES as CONSOLE_MODES

ALL_MODES = V0_MODES + V1_MODES
# group-relative advantage estimators of verl 0.9.1: replay stores whole groups for them
GROUP_ESTIMATORS = ("grpo", "rloo", "grpo_passk", "opo", "gpg", "rloo_vectorized", "grpo_vectorized",
                    "optimal_token_baseline")
REPLAY, DARTS = ("replay.enable", True), ("rollout_shaping.enable", True)


@dataclass(frozen=True)
class Rule:
    """In trainer modes `modes`, when the key `when[0]` is `when[1]`, `key` must be one of `allowed`; `why` says
    what breaks otherwise."""

    key: str
    allowed: tuple
    why: str = ""
    when: Optional[tuple[str, Any]] = None
    modes: tuple[str, ...] = ALL_MODES


RULES = (
    Rule("actor_rollout_ref.rollout.mode", ("async",), "verl's asynchronous trainers generate through rollout servers"),
    Rule("actor_rollout_ref.hybrid_engine", (False,), "the one-step-off and fully-async trainers run rollout on their "
         "own GPUs", modes=V0_MODES),
    Rule("actor_rollout_ref.hybrid_engine", (True,), "verl 0.9.1's V1 trainer needs it (colocate_async runs the "
         "rollout in the trainer's workers; separate_async's false path fails before the first step)", modes=V1_MODES),
    Rule("algorithm.rollout_correction.rollout_is", (None, "token", "sequence")),
    Rule("algorithm.rollout_correction.bypass_mode", (False,), "decoupled mode: replayed samples need old log-probs "
         "recomputed by the current weights", when=REPLAY),
    Rule("algorithm.rollout_correction.rollout_is", (None, "token"), "replay uses token-level weights", when=REPLAY),
    Rule("algorithm.rollout_correction.rollout_rs", (None,), "rejection sampling would change the masks of selected "
         "samples", when=REPLAY),
    Rule("algorithm.adv_estimator", GROUP_ESTIMATORS, "replay stores whole groups for a group-relative estimator",
         when=REPLAY),
    Rule("actor_rollout_ref.actor.shuffle", (False,), "D-ARL's per-mini-batch source weights need verl's sequential "
         "mini-batches", when=REPLAY),
    Rule("trainer.v1.separate_async.parameter_sync_step", (1,), "D-ARL takes one replay step per weight sync",
         when=REPLAY, modes=("separate_async",)),
    # the V1 replay step runs verl's balance, old-log-prob, advantage and update stages, not its reference stage
    Rule("actor_rollout_ref.actor.use_kl_loss", (False,), "on verl's V1 trainer the replay step computes no reference "
         "log-probs, which the loss's KL term reads", when=REPLAY, modes=V1_MODES),
    Rule("algorithm.use_kl_in_reward", (False,), "on verl's V1 trainer the replay step computes no reference "
         "log-probs, which verl's KL penalty in the reward reads", when=REPLAY, modes=V1_MODES),
    Rule("rollout_shaping.enable", (False,), "DARTS runs on the one-step-off and fully-async trainers "
         "(recipe.darl.main_one_step_off, main_fully_async), not on V1", modes=V1_MODES),
    Rule("actor_rollout_ref.rollout.full_determinism", (False,), "verl then names every request of a priority alike, "
         "so one tail cut would abort other groups' requests", when=DARTS),
    Rule("data.train_batch_size", (0,), "the fully-async trainer reads ppo_mini_batch_size * require_batches prompts "
         "per step", modes=(FULLY_ASYNC,)),
    Rule("data.gen_batch_size", (1,), "the fully-async rollouter generates one prompt at a time", modes=(FULLY_ASYNC,)),
    Rule("trainer.resume_mode", ("auto", "disable", "resume_path")),
    Rule("faults.reward_errors", ("raise", "zero")),
    Rule("console", CONSOLE_MODES),
)


def shown(value: Any) -> str:
    """A config value as one writes it in a Hydra override."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def rule_problems(cfg: DictConfig, mode: str, rules: tuple[Rule, ...] = RULES) -> list[str]:
    """Every rule of `rules` that applies in trainer mode `mode` and that `cfg` breaks, as a line naming the key,
    its value, the condition and what it must be. A key the config does not have reads as null."""
    problems = []
    for rule in rules:
        if mode not in rule.modes or (rule.when and OmegaConf.select(cfg, rule.when[0]) != rule.when[1]):
            continue
        value = OmegaConf.select(cfg, rule.key)
        if any(type(value) is type(a) and value == a for a in rule.allowed):  # True is not 1 here
            continue
        choices = shown(rule.allowed[0]) if len(rule.allowed) == 1 else "one of " + ", ".join(map(shown, rule.allowed))
        condition = f" with {rule.when[0]}={shown(rule.when[1])}" if rule.when else ""
        problems.append(f"{rule.key}={shown(value)}{condition}: must be {choices}" + (f" ({rule.why})" if rule.why else ""))
    return problems
