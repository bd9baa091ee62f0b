"""Entry point of the fully-async trainer: `python -m recipe.darl.main_fully_async [hydra overrides]`; the config
is read and checked as in `main_one_step_off`, the fully-async keys included."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from recipe.darl.checks.config_check import fully_async_findings
from recipe.darl.trainer_mode import FULLY_ASYNC, TrainerMode
from .main_one_step_off import prepare_config, rewrite_plus_overrides, run_or_print

MODE = TrainerMode(FULLY_ASYNC)


def prepare_fully_async_config(config: DictConfig) -> DictConfig:
    """`prepare_config`, the fully-async warnings, and verl's reward-config migration its task runner expects."""
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    prepare_config(config, MODE)
    for warning in fully_async_findings(config)[1]:
        print(f"[D-ARL] warning: {warning}")
    return migrate_legacy_reward_impl(config)


@hydra.main(config_path="config", config_name="fully_async_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_or_print(prepare_fully_async_config(config), MODE, "DarlFullyAsyncTaskRunner")


if __name__ == "__main__":
    sys.argv[1:] = rewrite_plus_overrides(sys.argv[1:])
    main()
