"""Which trainer a config is for, and what follows from it, in one place: `TrainerMode`.

The launch decides the mode once (each entry point, `main_*.py`, names its trainer; V1's from
`trainer.v1.trainer_mode`) and hands it down: the fix-ups, checks and preflight take it, each trainer class holds its
own, the dry run prints it for the estimate, and each DARTS manager class belongs to one trainer kind.
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


DRY_RUN_MODE = "# trainer mode: "  # the dry run's first line: the mode the launch decided (read by the estimate)


def mode_of_dry_run(text: str) -> TrainerMode:
    """The mode a launch's dry run printed (`DRY_RUN_MODE` line) ahead of its resolved config."""
    for line in text.splitlines():
        if line.startswith(DRY_RUN_MODE):
            return TrainerMode(line[len(DRY_RUN_MODE):].strip())
    raise ValueError(f"no '{DRY_RUN_MODE.strip()}' line in the dry run's output")
