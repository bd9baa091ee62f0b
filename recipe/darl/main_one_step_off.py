"""Entry point: `python -m recipe.darl.main_one_step_off [hydra overrides]`. The config is checked before Ray starts; the
original scripts' `+replay.*` and `+algorithm.rollout_is*` overrides are read as Hydra's `++` (set or add)."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

import hydra
from omegaconf import DictConfig, OmegaConf

from recipe.darl.checks.config_check import validate_or_raise
from recipe.darl.checks.fixups import apply_fixups
from recipe.darl.robustness.run_records import keep_run_records
from recipe.darl.robustness.stop_request import install_stop_signal
from recipe.darl.checks.preflight import preflight
from recipe.darl.trainer_mode import DRY_RUN_MODE, ONE_STEP_OFF, TrainerMode

MODE = TrainerMode(ONE_STEP_OFF)
PLUS_KEYS = ("+replay.", "+algorithm.rollout_is=", "+algorithm.rollout_is_threshold=")


def rewrite_plus_overrides(argv: list[str]) -> list[str]:
    """`+replay.k=4` -> `++replay.k=4`: the original D-ARL repository had no replay section in its config."""
    return ["+" + a if a.startswith(PLUS_KEYS) else a for a in argv]


def prepare_config(config: DictConfig, mode: TrainerMode) -> DictConfig:
    """The fix-ups (checks/fixups.py), checks (raising `ConfigError` before Ray starts), the rollout resource copy
    every trainer makes, and verl's own `validate_config`, which the one-step-off and V1 task runners run only after
    Ray starts (the fully-async task runner runs none); `mode`: the trainer the entry point launches."""
    from verl.trainer.main_ppo import need_critic, need_reference_policy, validate_config
    from verl.utils.device import auto_set_device

    contradictions, changes = apply_fixups(config, mode)  # the only place D-ARL changes the composed config
    problems, lines = preflight(config, mode)  # wandb credentials, the data, the per-prompt store's bound
    for line in changes + lines:
        print(line, file=sys.stderr)
    validate_or_raise(config, mode, extra=contradictions + problems)
    auto_set_device(config)
    if not mode.v1:  # the V0 trainers' rollout GPUs (V1 reads actor_rollout_ref.rollout's own)
        config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
        config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    if not mode.fully_async:  # the fully-async trainer's train_batch_size of 0 fails verl's batch checks
        # its report and notes ("Disabled critic ...") to stderr, or silenced: they would break a dry run's config
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            validate_config(config=config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
    return config


def run_or_print(config: DictConfig, mode: TrainerMode, task_runner: str) -> None:
    """verl's run_ppo with the task runner of that name in `trainers.task_runners` (DARL_DRY_RUN: the mode's line and
    the resolved config only, without importing the trainers). The SIGUSR1 stop request and the run records (a relaunch keeps the metrics
    file and wandb run) are set up before Ray starts."""
    if os.environ.get("DARL_DRY_RUN"):
        print(DRY_RUN_MODE + mode.name)
        print(OmegaConf.to_yaml(config, resolve=True))
        return
    from verl.trainer.main_ppo import run_ppo

    from .trainers import task_runners

    keep_run_records(config)
    install_stop_signal(config.trainer.default_local_dir)
    run_ppo(config, task_runner_class=getattr(task_runners, task_runner))


@hydra.main(config_path="config", config_name="one_step_off_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_or_print(prepare_config(config, MODE), MODE, "DarlTaskRunner")


if __name__ == "__main__":
    sys.argv[1:] = rewrite_plus_overrides(sys.argv[1:])
    main()
