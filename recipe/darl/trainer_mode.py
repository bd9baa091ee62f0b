"""Which trainer a config is for, and what follows from it, in one place: `TrainerMode`.

Each trainer class holds its mode; code that has only the config (the checks, the workers, the estimate) asks
`trainer_mode(cfg, v1)`, v1 for main_v1's config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

ONE_STEP_OFF, FULLY_ASYNC = "one_step_off", "fully_async"
V0_MODES = (ONE_STEP_OFF, FULLY_ASYNC)
V1_MODES = ("colocate_async", "separate_async")  # verl's V1 trainer modes D-ARL runs on


@dataclass(frozen=True)
class TrainerMode:
    """A trainer and what follows from it: the step budget B, the version unit, the data-parallel size; the rule table
    (checks/rules.py) is keyed by `name`."""

    name: str  # one_step_off, fully_async, or V1's trainer.v1.trainer_mode as written

    @property
    def fully_async(self) -> bool:
        return self.name == FULLY_ASYNC

    @property
    def v1(self) -> bool:
        return self.name not in V0_MODES

    @property
    def version_unit(self) -> str:
        """What one version counts: staleness is measured in it (a sample's `min_global_steps` stamp)."""
        return {ONE_STEP_OFF: "global_steps", FULLY_ASYNC: "current_param_version"}.get(self.name, "global_steps - 1")

    def version(self, trainer: Any) -> int:
        """pi_old's version at a trainer's step: one-step-off counts steps, fully-async weight syncs; V1 syncs the
        weights of step t at the end of step t, stamped t, so step t's pi_old is version t - 1."""
        if self.fully_async:
            return int(trainer.current_param_version)
        return int(trainer.global_steps) - (1 if self.v1 else 0)

    def step_budget(self, cfg: DictConfig) -> int:
        """B, the groups a step trains on without replay: `data.train_batch_size` (one-step-off, V1) or, in the
        fully-async trainer, `ppo_mini_batch_size * async_training.require_batches` prompts from the queue."""
        if self.fully_async:  # (item access: a DictConfig or its plain container, as the estimate reads)
            actor = cfg["actor_rollout_ref"]["actor"]
            return int(actor["ppo_mini_batch_size"]) * int(cfg["async_training"]["require_batches"])
        return int(cfg["data"]["train_batch_size"])

    def dp_size(self, cfg: DictConfig) -> int:
        """The actor's data-parallel ranks the config asks for: the trainer's GPUs over Ulysses' sequence-parallel
        size (at run time, the actor's worker group gives it: `DarlRun.dp_size`)."""
        sp = int(cfg.actor_rollout_ref.actor.get("ulysses_sequence_parallel_size", 1) or 1)
        return max(1, int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes) // sp)


def trainer_mode(cfg: DictConfig, v1: bool = False) -> TrainerMode:
    """The mode of a composed config (fully-async: it has verl's `async_training` group); v1: verl's V1 trainer's."""
    if v1:
        return TrainerMode(str(cfg.trainer.v1.trainer_mode))
    return TrainerMode(FULLY_ASYNC if cfg.get("async_training") is not None else ONE_STEP_OFF)


def step_budget(cfg: DictConfig) -> int:
    """B of a V0 config, or of a plain container of one (the workers and the estimate have only the config)."""
    return trainer_mode(cfg).step_budget(cfg)
