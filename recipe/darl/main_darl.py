"""Entry point: `python -m recipe.darl.main_darl [hydra overrides]`. The config is checked before Ray starts; the
original scripts' `+replay.*` and `+algorithm.rollout_is*` overrides are read as Hydra's `++` (set or add)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import hydra
import ray
from omegaconf import DictConfig, OmegaConf

from recipe.darl.checks.config_check import validate_or_raise
from recipe.darl.robustness.run_records import keep_run_records
from recipe.darl.robustness.stop_request import install_stop_signal
from recipe.darl.checks.preflight import preflight

PLUS_KEYS = ("+replay.", "+algorithm.rollout_is=", "+algorithm.rollout_is_threshold=")


def rewrite_plus_overrides(argv: list[str]) -> list[str]:
    """`+replay.k=4` -> `++replay.k=4`: the original D-ARL repository had no replay section in its config."""
    return ["+" + a if a.startswith(PLUS_KEYS) else a for a in argv]


@ray.remote(num_cpus=1, max_concurrency=100)
class DarlTaskRunner:
    """Builds verl's pieces (tokenizer, datasets, workers) and runs `DarlTrainer.fit`."""

    def run(self, config: DictConfig) -> None:
        from verl.experimental.separation.utils import create_resource_pool_manager, create_role_worker_mapping
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy
        from verl.utils import hf_processor, hf_tokenizer
        from verl.utils.config import validate_config
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.utils.fs import copy_to_local

        from .trainers.one_step_off import DarlTrainer

        print(f"DarlTaskRunner on {socket.gethostname()}, pid {os.getpid()}")
        OmegaConf.resolve(config)
        role_worker_mapping, ray_worker_group_cls = create_role_worker_mapping(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
        local_path = copy_to_local(config.actor_rollout_ref.model.path, use_shm=config.actor_rollout_ref.model.get("use_shm", False))
        trust = config.data.get("trust_remote_code", False)
        tokenizer = hf_tokenizer(local_path, trust_remote_code=trust)
        processor = hf_processor(local_path, trust_remote_code=trust, use_fast=True)
        train_dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor,
                                          max_samples=config.data.get("train_max_samples", -1))
        val_dataset = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor,
                                        max_samples=config.data.get("val_max_samples", -1))
        trainer = DarlTrainer(
            config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=role_worker_mapping,
            resource_pool_manager=create_resource_pool_manager(config, role_worker_mapping.keys()),
            ray_worker_group_cls=ray_worker_group_cls, train_dataset=train_dataset, val_dataset=val_dataset,
            collate_fn=collate_fn, train_sampler=create_rl_sampler(config.data, train_dataset),
            device_name=config.trainer.device,
        )
        trainer.init_workers()
        asyncio.run(trainer.fit())


def prepare_config(config: DictConfig) -> DictConfig:
    """Aliases, checks (raising `ConfigError` before Ray starts), the attention fallback and the rollout resource
    copy both trainers make."""
    from verl.utils.device import auto_set_device

    problems, lines = preflight(config)  # wandb credentials; sdpa when flash_attn cannot be imported
    for line in lines:
        print(line, file=sys.stderr)
    validate_or_raise(config, extra=problems)
    auto_set_device(config)
    config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
    config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    return config


def run_or_print(config: DictConfig, task_runner_class) -> None:
    """verl's run_ppo with the given task runner (DARL_DRY_RUN: the resolved config only). The SIGUSR1 stop request
    and the run records (a relaunch keeps the metrics file and wandb run) are set up before Ray starts."""
    from verl.trainer.main_ppo import run_ppo

    if os.environ.get("DARL_DRY_RUN"):
        print(OmegaConf.to_yaml(config, resolve=True))
        return
    keep_run_records(config)
    install_stop_signal(config.trainer.default_local_dir)
    run_ppo(config, task_runner_class=task_runner_class)


@hydra.main(config_path="config", config_name="darl_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_or_print(prepare_config(config), DarlTaskRunner)


if __name__ == "__main__":
    sys.argv[1:] = rewrite_plus_overrides(sys.argv[1:])
    main()
