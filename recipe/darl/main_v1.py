"""Entry point for verl's V1 trainer: `python -m recipe.darl.main_v1 [hydra overrides]` (config darl_v1_trainer.yaml;
trainer.v1.trainer_mode colocate_async or separate_async). The config is checked before Ray starts."""

from __future__ import annotations

import contextlib
import sys

import hydra
from omegaconf import DictConfig

from recipe.darl.main_darl import prepare_config, rewrite_plus_overrides, run_or_print


def prepare_v1_config(config: DictConfig) -> DictConfig:
    """`prepare_config` for V1, then verl's own check of the config, as verl's V1 entry point runs it."""
    from verl.trainer.main_ppo import need_critic, need_reference_policy, validate_config

    prepare_config(config, v1=True)
    with contextlib.redirect_stdout(sys.stderr):  # its report would break a dry run's printed config
        validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return config


@hydra.main(config_path="config", config_name="darl_v1_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_or_print(prepare_v1_config(config), "DarlTaskRunnerV1")


if __name__ == "__main__":
    sys.argv[1:] = rewrite_plus_overrides(sys.argv[1:])
    main()
