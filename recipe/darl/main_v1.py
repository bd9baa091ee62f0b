"""Entry point for verl's V1 trainer: `python -m recipe.darl.main_v1 [hydra overrides]` (config v1_trainer.yaml;
trainer.v1.trainer_mode colocate_async or separate_async). The config is checked before Ray starts."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from recipe.darl.main_one_step_off import prepare_config, rewrite_plus_overrides, run_or_print


@hydra.main(config_path="config", config_name="v1_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_or_print(prepare_config(config, v1=True), "DarlTaskRunnerV1")


if __name__ == "__main__":
    sys.argv[1:] = rewrite_plus_overrides(sys.argv[1:])
    main()
