"""Which trainer a config is for, and what follows from it, in one place.

The entry points fix the trainer (main_one_step_off, main_fully_async, main_v1 with `v1=True`); code that has only
the config (the checks, the workers, the estimate) asks here. The fully-async config is the one with an
`async_training` group (verl's fully_async_ppo_trainer.yaml); V1's mode is its `trainer.v1.trainer_mode`.
"""

from __future__ import annotations

from omegaconf import DictConfig

ONE_STEP_OFF, FULLY_ASYNC = "one_step_off", "fully_async"
V0_MODES = (ONE_STEP_OFF, FULLY_ASYNC)
V1_MODES = ("colocate_async", "separate_async")  # verl's V1 trainer modes D-ARL runs on


def trainer_mode(cfg: DictConfig, v1: bool = False) -> str:
    """one_step_off, fully_async, or (v1: the config of verl's V1 trainer) its `trainer.v1.trainer_mode` as written."""
    if v1:
        return str(cfg.trainer.v1.trainer_mode)
    return FULLY_ASYNC if is_fully_async(cfg) else ONE_STEP_OFF


def is_fully_async(cfg: DictConfig) -> bool:
    """The config is the fully-async trainer's (its `async_training` group)."""
    return cfg.get("async_training") is not None


def step_budget(cfg: DictConfig) -> int:
    """B, the groups a step trains on without replay: `data.train_batch_size` (one-step-off, V1) or, in the fully-async
    trainer, `ppo_mini_batch_size * async_training.require_batches` prompts from the queue."""
    if is_fully_async(cfg):  # (item access: a DictConfig or its plain container, as the estimate reads)
        return int(cfg["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"]) * int(cfg["async_training"]["require_batches"])
    return int(cfg["data"]["train_batch_size"])
