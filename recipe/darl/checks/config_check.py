"""Checks of a composed D-ARL config, run before Ray starts; every problem is reported at once. They read the
config and never change it: what D-ARL changes is in checks/fixups.py, applied first.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..core import group_multiple
from ..core.config import ReplayConfig, as_list, is_int, is_number
from ..core.darts import DartsConfig
from ..rewards.code_reward import SANDBOXES
from ..trainer_mode import FULLY_ASYNC, ONE_STEP_OFF, V1_MODES, TrainerMode
from .rules import rule_problems


class ConfigError(ValueError):
    """A config the D-ARL trainer cannot run; the message lists every problem, one per line."""


def check_config(cfg: DictConfig, mode: TrainerMode) -> list[str]:
    """Every problem of a composed config (after `fixups.apply_fixups`) for the trainer `mode` the launch decided,
    each naming its key."""
    replay_values: dict[str, Any] = OmegaConf.to_container(cfg.get("replay", {}) or {}, resolve=True)
    problems = ReplayConfig.problems_of(replay_values)
    enabled = bool(replay_values.get("enable", False))
    arr = cfg.actor_rollout_ref
    corr = cfg.algorithm.rollout_correction

    problems += rule_problems(cfg, mode.name)
    threshold = corr.rollout_is_threshold
    if is_number(threshold) and float(threshold) <= 0:
        problems.append(f"algorithm.rollout_correction.rollout_is_threshold must be > 0, got {threshold}")
    if mode.v1:
        problems += _v1_problems(cfg, mode, enabled)
    if not arr.rollout.get("name"):
        problems.append("actor_rollout_ref.rollout.name is required (e.g. vllm)")

    bypass = bool(corr.get("bypass_mode", False))
    users = [user for on, user in ((enabled, "replay.enable=true (behavior log-probs for the scores and weights)"),
                                   (bypass, "bypass_mode=true (the rollout's log-probs stand for pi_old)"),
                                   (mode.fully_async, "verl's fully-async rollouter")) if on]
    if users and not arr.rollout.get("calculate_log_probs", False):
        problems.append(f"{users[0]} needs actor_rollout_ref.rollout.calculate_log_probs=true")
    if enabled and not is_number(threshold):
        problems.append(f"replay needs a float algorithm.rollout_correction.rollout_is_threshold (C), got {threshold!r}")
    if not enabled and (value := replay_values.get("prompt_replay")) is not None and value is not False:
        problems.append(f"replay.prompt_replay={value!r} needs replay.enable=true (the store lives in the replay "
                        "buffer); with replay.enable=false it would be ignored")
    if not enabled and bypass and (corr.get("rollout_is") is not None or corr.get("rollout_rs") is not None or corr.get("loss_type", "ppo_clip") != "ppo_clip"):
        problems.append("algorithm.rollout_correction.bypass_mode=true with rollout_is/rollout_rs/loss_type set: verl 0.9.1 "
                        "binds the worker's loss at init and would silently ignore them; use bypass_mode=false (decoupled)")

    if mode.fully_async:
        problems += fully_async_findings(cfg)[0]
    return (problems + _batch_problems(cfg, mode, replay_values if enabled else None) + _launch_problems(cfg, mode)
            + _path_problems(cfg) + _fault_problems(cfg) + _darts_problems(cfg, mode) + _preset_problems(cfg, mode))


def _preset_problems(cfg: DictConfig, mode: TrainerMode) -> list[str]:
    """`preset=sync` is on-policy training: only verl's fully-async rollouter can be held to staleness 0."""
    if cfg.get("preset") != "sync":
        return []
    if not mode.fully_async:
        return [f"preset=sync (on-policy training) holds verl's fully-async rollouter to staleness 0; the {mode.name} "
                "trainer always trains on rollouts one step stale: run it with a fully_async script"]
    run = cfg.async_training
    return [f"preset=sync needs async_training.{key}={want}, got {run.get(key)} (set by a flag or STALENESS_THRESHOLD / "
            f"PARTIAL_ROLLOUT after the preset)" for key, want in (("staleness_threshold", 0), ("partial_rollout", False))
            if run.get(key) != want]


SHAPING_MANAGER = "recipe.darl.workers.darts_rollout.DartsAgentLoopManager"
NO_REQUEST_ABORT = ("sglang", "trtllm")  # verl 0.9.1's servers without a per-request abort_request


def _darts_problems(cfg: DictConfig, mode: TrainerMode) -> list[str]:
    """`rollout_shaping.*` (DARTS); when on, the one-step-off trainer's rollout manager must be DARTS' (set by
    `fixups.install_darts_manager`; the fully-async trainer installs it in its rollouter, trainers/darl_run.py)."""
    rollout = cfg.actor_rollout_ref.rollout
    values: dict[str, Any] = OmegaConf.to_container(cfg.get("rollout_shaping", {}) or {}, resolve=True)
    problems = DartsConfig.problems_of(values, int(rollout.n))
    if problems or not values.get("enable", False):
        return problems
    if rollout.get("name") in NO_REQUEST_ABORT:
        problems.append(f"rollout_shaping.enable=true with actor_rollout_ref.rollout.name={rollout.name}: DARTS cuts a "
                        f"group's tail by aborting single requests, and verl 0.9.1's {rollout.name} server has no "
                        "per-request abort (only abort_all_requests); use rollout.name=vllm")
    current = rollout.agent.get("agent_loop_manager_class")
    if mode.fully_async:
        if current:
            problems.append(f"rollout_shaping.enable=true with actor_rollout_ref.rollout.agent.agent_loop_manager_class="
                            f"{current}: the fully-async rollouter ignores that key; DARTS installs its own manager there")
    elif current != SHAPING_MANAGER:
        problems.append(f"rollout_shaping.enable=true needs DARTS' rollout manager, but actor_rollout_ref.rollout.agent."
                        f"agent_loop_manager_class={current}")
    return problems


def _v1_problems(cfg: DictConfig, v1: TrainerMode, replay: bool) -> list[str]:
    problems = []
    mode = v1.name
    if mode not in V1_MODES:
        problems.append(f"trainer.v1.trainer_mode={mode!r}: D-ARL runs on verl's V1 modes {', '.join(V1_MODES)}")
    sync_step = cfg.trainer.v1.separate_async.parameter_sync_step
    batch, mini = cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    if mode == "separate_async" and is_int(sync_step) and batch != sync_step * mini:  # verl asserts it after Ray starts
        problems.append(f"data.train_batch_size={batch} must equal trainer.v1.separate_async.parameter_sync_step "
                        f"({sync_step}) * actor_rollout_ref.actor.ppo_mini_batch_size ({mini}) in separate_async")
    if mode == "separate_async" and cfg.actor_rollout_ref.rollout.checkpoint_engine.get("backend") == "naive":
        problems.append("actor_rollout_ref.rollout.checkpoint_engine.backend=naive: separate_async syncs weights "
                        "between processes; choose nccl (GPUs) or ray_object_store (CPU)")
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    micro, step_micro = rollout.get("log_prob_micro_batch_size_per_gpu"), actor.get("ppo_micro_batch_size_per_gpu")
    if (replay and not rollout.get("log_prob_use_dynamic_bsz", False) and not actor.get("use_dynamic_bsz", False)
            and is_int(micro) and is_int(step_micro) and step_micro % micro):
        problems.append(f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro} must divide "
                        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={step_micro}: V1 recomputes the old "
                        "log-probs of a replay step's groups in whole micro-batches")
    return problems


def validate_or_raise(cfg: DictConfig, mode: TrainerMode, extra: list[str] | tuple[str, ...] = ()) -> None:
    """Raises `ConfigError` listing every problem of `check_config` and `extra` (found by the caller: the fix-ups'
    contradictions, preflight)."""
    problems = check_config(cfg, mode) + list(extra)
    if problems:
        raise ConfigError("the D-ARL config has {} problem(s):\n  - {}".format(len(problems), "\n  - ".join(problems)))


def fully_async_findings(cfg: DictConfig) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the fully-async keys with replay on. The rollouter may run ahead of the
    trainer by (1 + staleness_threshold) syncs' worth of samples, so a trained sample can be up to
    S = 1 + ceil(staleness_threshold) versions old (more when a partial rollout spans syncs)."""
    at = cfg.async_training
    problems, warnings = [], []
    threshold, trigger = float(at.staleness_threshold), int(at.trigger_parameter_sync_step)
    if threshold < 0:
        problems.append(f"async_training.staleness_threshold must be >= 0, got {threshold}")
    if trigger < 1 or int(at.require_batches) < 1:
        problems.append("async_training.trigger_parameter_sync_step and require_batches must be >= 1, got "
                        f"{trigger} and {at.require_batches}")
    replay = cfg.get("replay") or {}
    if not replay.get("enable", False) or problems:
        return problems, warnings
    k = int(replay.get("k", 4))
    reach = 1 + math.ceil(threshold)
    if k < reach + 1:
        warnings.append(f"replay.k={k} keeps fewer versions than the fresh samples can span: with "
                        f"async_training.staleness_threshold={threshold:g} a sample can be {reach} versions old, so the "
                        f"window needs k >= {reach + 1} to hold a fresh sample's version and replay anything older")
    total, budget = cfg.rollout.get("total_rollout_steps"), TrainerMode(FULLY_ASYNC).step_budget(cfg)
    if total is not None and budget > 0:
        steps = int(total) // (budget * trigger)  # verl's total_train_steps, counted in syncs
        warmup = int(replay.get("warmup", 5))
        if k > 1 and warmup >= steps * trigger:
            problems.append(f"replay.warmup={warmup} steps is not shorter than the run ({steps * trigger} trainer steps "
                            f"from rollout.total_rollout_steps={total}): the buffer would never be replayed")
    return problems, warnings


def resolved_replay_key(replay_values: dict, key: str) -> Any:
    """A preset key of `replay_values` as `ReplayConfig.resolved` gives it (None when off or not valid)."""
    try:
        return ReplayConfig.from_dict(replay_values).resolved(key)
    except ValueError:  # its problems are reported by ReplayConfig.problems_of
        return None


def _batch_problems(cfg: DictConfig, mode: TrainerMode, replay_values: dict | None) -> list[str]:
    problems, arr = [], cfg.actor_rollout_ref
    n, budget = int(arr.rollout.n), mode.step_budget(cfg)
    mini, dp = int(arr.actor.ppo_mini_batch_size), mode.dp_size(cfg)
    if mini < 1 or budget < 1 or n < 1:
        return [f"data.train_batch_size ({budget}), actor_rollout_ref.actor.ppo_mini_batch_size ({mini}) and "
                f"actor_rollout_ref.rollout.n ({n}) must be >= 1"]
    if budget % mini:
        problems.append(f"data.train_batch_size={budget} must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size={mini}")
    if (mini * n) % dp:
        problems.append(f"actor_rollout_ref.actor.ppo_mini_batch_size * rollout.n = {mini * n} samples must divide over {dp} data-parallel ranks")
    micro = arr.actor.get("ppo_micro_batch_size_per_gpu")
    if not arr.actor.get("use_dynamic_bsz", False) and micro and ((mini * n) // dp) % int(micro):
        problems.append(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro} must divide the per-rank mini-batch "
                        f"(ppo_mini_batch_size * rollout.n / dp = {(mini * n) // dp} samples)")
    if replay_values is not None:
        multiple = group_multiple(n, mini, dp)
        if multiple > budget:
            problems.append(f"the selection must take a multiple of {multiple} groups (mini-batch {mini}, n {n}, dp {dp}) "
                            f"but the step's budget of {budget} groups is smaller")
        per_prompt = resolved_replay_key(replay_values, "prompt_replay")
        if per_prompt is not None and per_prompt < n:  # resolved from a valid config: an int >= 2
            problems.append(f"replay.prompt_replay={per_prompt} (responses kept per prompt; null follows the preset's "
                            f"16) is below actor_rollout_ref.rollout.n={n}: no history group could ever form; set "
                            "replay.prompt_replay >= n, or false")
        max_groups = replay_values.get("max_groups")
        if is_int(max_groups) and max_groups < budget:
            problems.append(f"replay.max_groups={max_groups} is below the batch budget of {budget} groups a step "
                            "trains on: the buffer could never hold a full batch")
    return problems


def _launch_problems(cfg: DictConfig, mode: TrainerMode) -> list[str]:
    """Values verl 0.9.1 refuses only once Ray, the workers and the models have started (resume, rollout GPUs,
    batch splits, dynamic batch sizes)."""
    from verl.trainer.ppo.utils import need_critic, need_reward_model

    problems = []
    trainer, arr = cfg.trainer, cfg.actor_rollout_ref
    v1, resume = mode.v1, trainer.get("resume_mode", "auto")
    if resume == "resume_path" and "global_step_" not in str(trainer.get("resume_from_path") or ""):
        problems.append("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint dir>/global_step_<N>, "
                        f"got {trainer.get('resume_from_path')!r}")
    if resume != "disable" and trainer.get("default_hdfs_dir") is not None:
        problems.append("trainer.default_hdfs_dir is set: verl 0.9.1 cannot resume from HDFS; set it null")
    if bool(arr.actor.get("use_dynamic_bsz", False)) != bool(arr.rollout.get("log_prob_use_dynamic_bsz", False)):
        problems.append("actor_rollout_ref.actor.use_dynamic_bsz and actor_rollout_ref.rollout.log_prob_use_dynamic_bsz "
                        "must be equal (verl's worker asserts it)")
    rollout = arr.rollout
    width = math.prod(int(rollout.get(k) or 1) for k in ("tensor_model_parallel_size", "data_parallel_size",
                                                           "pipeline_model_parallel_size"))
    pool = arr.rollout if v1 else cfg.get("rollout")
    separate = mode.name == "separate_async"  # V1's rollout on GPUs of its own
    if (separate or not v1) and pool is not None:
        prefix = "actor_rollout_ref.rollout" if v1 else "rollout"
        nodes, gpus = int(pool.get("nnodes") or 0), int(pool.get("n_gpus_per_node") or 0)
        if nodes < 1 or gpus < 1 or nodes * gpus < width:
            problems.append(f"{prefix}.nnodes={nodes} x {prefix}.n_gpus_per_node={gpus} GPUs cannot hold one rollout "
                            f"replica of tensor x data x pipeline parallel size {width}")
    elif v1 and (int(trainer.n_gpus_per_node) * int(trainer.nnodes)) % width:
        problems.append(f"colocate_async: the trainer's {trainer.n_gpus_per_node} x {trainer.nnodes} GPUs do not divide "
                        f"into rollout replicas of tensor x data x pipeline parallel size {width}")
    with warnings.catch_warnings():  # need_critic's "Disabled critic ..." note (action=: Python 3.11 only)
        warnings.simplefilter("ignore", UserWarning)
        uses_critic = need_critic(cfg)
    if not v1 and uses_critic and cfg.critic.get("strategy") != "fsdp":  # verl's separated trainers build no other
        problems.append(f"critic.strategy={cfg.critic.get('strategy')!r}: verl 0.9.1's one-step-off and fully-async "
                        "trainers build the critic only with strategy fsdp (its FSDP2 engine); set critic.strategy=fsdp")
    if ((mode.fully_async or separate) and need_reward_model(cfg)
            and not cfg.reward.reward_model.get("enable_resource_pool")):
        problems.append("reward.reward_model.enable=true needs reward.reward_model.enable_resource_pool=true here: the "
                        "rollout never pauses for a reward model on the rollout's GPUs")
    workers = int(rollout.agent.get("num_workers") or 1)
    if mode.name == ONE_STEP_OFF and (mode.step_budget(cfg) * int(rollout.n)) % workers:
        problems.append(f"data.train_batch_size x actor_rollout_ref.rollout.n = {mode.step_budget(cfg) * int(rollout.n)} "
                        f"responses must split evenly over actor_rollout_ref.rollout.agent.num_workers={workers}")
    return problems


def _path_problems(cfg: DictConfig) -> list[str]:
    problems = []
    model_path = cfg.actor_rollout_ref.model.get("path")
    if not model_path:
        problems.append("actor_rollout_ref.model.path is not set")
    elif model_path.startswith(("/", "~", ".")) and not os.path.exists(os.path.expanduser(model_path)):
        problems.append(f"actor_rollout_ref.model.path={model_path} does not exist")
    for key in ("train_files", "val_files"):
        files = cfg.data.get(key)
        if files is None:
            problems.append(f"data.{key} is not set")
        for f in as_list(files):
            if "://" not in f and not os.path.exists(os.path.expanduser(f)):
                problems.append(f"data.{key}: {f} does not exist")
    return problems


def _fault_problems(cfg: DictConfig) -> list[str]:
    faults = cfg.get("faults") or {}
    problems = []
    for key in ("generation_timeout_s", "reward_timeout_s"):
        value = faults.get(key)
        if value is not None and not (is_number(value) and value > 0):
            problems.append(f"faults.{key} must be null (no limit) or seconds > 0, got {value!r}")
    kwargs = OmegaConf.select(cfg, "reward.custom_reward_function.reward_kwargs") or {}
    if kwargs.get("code_sandbox", "auto") not in SANDBOXES:
        problems.append(f"reward.custom_reward_function.reward_kwargs.code_sandbox must be one of {', '.join(SANDBOXES)}, "
                        f"got {kwargs.get('code_sandbox')!r}")
    return problems
