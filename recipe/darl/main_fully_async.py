"""Entry point of the fully-async trainer: `python -m recipe.darl.main_fully_async [hydra overrides]`.

The same `replay.*` keys, seed aliases and `+replay.*` spelling as `main_darl`; the config is checked
before Ray starts, the fully-async keys included (warnings are printed, problems raise).
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from .config_check import fully_async_findings, validate_or_raise
from .main_darl import rewrite_seed_overrides


def prepare_config(config: DictConfig) -> DictConfig:
    """Aliases and checks (raising `ConfigError` before Ray starts), then verl's fully-async resource copy."""
    from verl.utils.device import auto_set_device

    validate_or_raise(config)
    for warning in fully_async_findings(config)[1]:
        print(f"[D-ARL] warning: {warning}")
    auto_set_device(config)
    config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
    config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    return config


@hydra.main(config_path="config", config_name="darl_fully_async_trainer", version_base=None)
def main(config: DictConfig) -> None:
    from verl.trainer.main_ppo import run_ppo
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    from .trainer_fully_async import DarlFullyAsyncTaskRunner

    prepare_config(config)
    config = migrate_legacy_reward_impl(config)
    if os.environ.get("DARL_DRY_RUN"):
        print(OmegaConf.to_yaml(config, resolve=True))
        return
    run_ppo(config, task_runner_class=DarlFullyAsyncTaskRunner)


if __name__ == "__main__":
    sys.argv[1:] = rewrite_seed_overrides(sys.argv[1:])
    main()
