"""Entry point for verl's V1 trainer: `python -m recipe.darl.main_v1 [hydra overrides]` (config v1_trainer.yaml;
trainer.v1.trainer_mode colocate_async or separate_async). The config is checked before Ray starts."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from recipe.darl.main_one_step_off import prepare_config, rewrite_plus_overrides, run_or_print
from recipe.darl.trainer_mode import TrainerMode


def launch_mode(config: DictConfig) -> TrainerMode:
    """The V1 mode this launch runs: trainer.v1.trainer_mode (checked against V1_MODES before Ray starts)."""
    return TrainerMode(str(config.trainer.v1.trainer_mode))


@hydra.main(config_path="config", config_name="v1_trainer", version_base=None)
def main(config: DictConfig) -> None:
    mode = launch_mode(config)
    run_or_print(prepare_config(config, mode), mode, "DarlTaskRunnerV1")


if __name__ == "__main__":
    sys.argv[1:] = rewrite_plus_overrides(sys.argv[1:])
    main()
