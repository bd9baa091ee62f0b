"""What D-ARL adds to a verl trainer, held by it as `trainer.darl` (docs/trainer.md): the replay step, checkpoints,
the stop request, the reward guard and DARTS' trainer side. verl's state (steps, metrics, worker groups) stays on the
trainer, read through `self.trainer`.

Checkpoints are written in a fixed order: the replay buffer and DARTS' EMA first (atomic, checksummed), then verl's
files, verl's tracker last, so a kill anywhere leaves the previous checkpoint the one resume takes.
"""

from __future__ import annotations

import math
import os
from functools import partial
from typing import Any, Callable, Optional

import numpy as np
import ray
from omegaconf import OmegaConf

from recipe.darl.core import ClipSettings, ReplayBuffer, ReplayConfig, ReplayStep, StepPlan, StepState, group_multiple
from recipe.darl.core.darts import DartsConfig
from recipe.darl.probes import probe, swapped
from recipe.darl.robustness.checkpoint_files import check_resume, guarded_verl_save, read_checked, write_checked
from recipe.darl.robustness.reward_guard import FAILED_KEY, sanitize_rewards
from recipe.darl.robustness.stop_request import request_path
from recipe.darl.trainer_mode import TrainerMode
from recipe.darl.trainers.replay_metrics import replay_metrics
from recipe.darl.trainers.dataproto_plane import DataProtoPlane, groups_from_batch
from recipe.darl.workers.actor_loss import darl_loss
from recipe.darl.workers.darts_rollout import darts_config, install_in_rollouter

BUFFER_FILE = "darl_replay.pt"
DARTS_FILE = "darts_state.pt"


class DarlRun:
    """D-ARL's part of one trainer of mode `mode` (its version unit and step budget: trainer_mode.py)."""

    def __init__(self, trainer: Any, config, mode: TrainerMode) -> None:
        self.trainer, self.config, self.mode = trainer, config, mode
        self.replay = ReplayConfig.from_dict(OmegaConf.to_container(config.replay, resolve=True))
        self.step: Optional[ReplayStep] = ReplayStep(self.replay) if self.replay.enable else None
        self.state: Optional[StepState] = None  # between the old-log-prob and the update hooks
        self.darts: DartsConfig = darts_config(config)

    @property
    def buffer(self) -> Optional[ReplayBuffer]:
        return self.step.buffer if self.step is not None else None

    # the replay step's settings, from the config and the actor's worker group

    def install_loss(self, worker_group) -> None:
        """The D-ARL loss in the actor's workers (replay only; otherwise verl's own loss stays)."""
        if self.replay.enable:
            from verl.utils.config import omega_conf_to_dataclass  # here: the driver imports this module before verl

            worker_group.set_loss_fn(partial(
                darl_loss, config=omega_conf_to_dataclass(self.config.actor_rollout_ref.actor),
                threshold=self.clip_settings().threshold, stop_grad=self.replay.stop_grad,
                behavior_clip=self.replay.behavior_clip_range()))

    def dp_size(self) -> int:
        sp = self.config.actor_rollout_ref.actor.get("ulysses_sequence_parallel_size", 1) or 1
        return self.trainer.actor_rollout_wg.world_size // sp

    def clip_settings(self) -> ClipSettings:
        actor = self.config.actor_rollout_ref.actor  # an unset low or high clip ratio is clip_ratio
        low, high = (float(actor.clip_ratio if actor.get(k) is None else actor.get(k))
                     for k in ("clip_ratio_low", "clip_ratio_high"))
        return ClipSettings(float(self.config.algorithm.rollout_correction.rollout_is_threshold), low, high)

    def group_multiples(self) -> tuple[int, Optional[int]]:
        """(groups of a full mini-batch, the fewest groups one smaller mini-batch may hold; None: none fits)."""
        n = self.config.actor_rollout_ref.rollout.n
        actor = self.config.actor_rollout_ref.actor
        dp = self.dp_size()
        per_step = dp if actor.get("use_dynamic_bsz", False) else dp * int(actor.ppo_micro_batch_size_per_gpu or 1)
        full = group_multiple(n, actor.ppo_mini_batch_size, dp)
        smallest = per_step // math.gcd(per_step, n)
        return full, (smallest if smallest <= full else None)

    def mini_batch_groups(self, plan: StepPlan) -> int:
        """Fewer groups than a mini-batch: one smaller."""
        return min(len(plan.trained), self.config.actor_rollout_ref.actor.ppo_mini_batch_size)

    def begin(self, plane, fresh: list, metrics: dict) -> StepState:
        """`ReplayStep.begin` at the trainer's version (pi_old's, in the mode's unit), budget B and settings."""
        metrics["replay/fresh_version"] = max(g.version for g in fresh)  # the rollout's version stamp
        return self.step.begin(plane, fresh, self.mode.version(self.trainer), self.mode.step_budget(self.config),
                               *self.group_multiples(), self.clip_settings())

    def end(self, state: StepState, metrics: dict) -> None:
        evicted = self.step.end(state)
        metrics.update(replay_metrics(state, self.buffer.stats(), vars(evicted)))

    # the V0 trainers' hooks (DataProto)

    def compute_log_prob(self, batch, verl_forward: Callable):
        """`_fit_compute_log_prob`: `ReplayStep.begin` over the fresh batch; returns the trained rows."""
        if not self.replay.enable:
            return verl_forward(batch)
        t = self.trainer
        for key, values in t.reward_extra_infos_dict.items():  # stored with the groups, like the rewards
            batch.non_tensor_batch.setdefault(key, np.asarray(values))
        plane = DataProtoPlane(self, batch, verl_forward)
        self.state = self.begin(plane, groups_from_batch(batch, t.reward_tensor), t.metrics)
        if self.state.plan.selection.skipped:
            # no update: verl's own forward of the fresh batch, which the later hooks read
            print(f"[D-ARL] step {self.state.plan.version}: no update ({self.state.plan.selection.reason})")
            return verl_forward(batch)
        chosen = plane.chosen
        # the step's rewards, read by `_fit_compute_advantage`, are those of the trained rows
        t.reward_tensor = chosen.batch["token_level_scores"]
        t.reward_extra_infos_dict = {k: chosen.non_tensor_batch[k] for k in t.reward_extra_infos_dict}
        return chosen

    def update_actor(self, batch, verl_update: Callable):
        """`_fit_update_actor`: the `update` probe, verl's update with the mini-batch sized to the selection, then
        `ReplayStep.end` and the `replay/` metrics."""
        probe("update", self.trainer.global_steps)  # trainer step (fully-async: the rollouter keeps generating)
        if not self.replay.enable:
            return verl_update(batch)
        state, self.state = self.state, None
        if not state.plan.selection.skipped:
            with swapped(self.config.actor_rollout_ref.actor, "ppo_mini_batch_size", self.mini_batch_groups(state.plan)):
                batch = verl_update(batch)
        self.end(state, self.trainer.metrics)
        return batch

    def guard_rewards(self, batch):
        """`_fit_compute_reward`, after verl's: DARTS' `rollout_shaping/` metrics; failed rewards counted
        (`faults/reward_failed`) and their column dropped; NaN/inf rewards scored 0.0 (`faults/nonfinite_rewards`)."""
        t = self.trainer  # verl's hook set `reward_tensor` and `reward_extra_infos_dict`; fit_step set `metrics`
        if self.darts.enable:
            t.metrics.update(self.darts_call("pop_metrics"))
        # counted, then removed: buffered groups must keep the non-tensor fields of runs saved without the flag
        failed = t.reward_extra_infos_dict.pop(FAILED_KEY, None)
        batch.non_tensor_batch.pop(FAILED_KEY, None)
        keys = batch.meta_info.get("reward_extra_keys")
        if isinstance(keys, list) and FAILED_KEY in keys:
            batch.meta_info["reward_extra_keys"] = [k for k in keys if k != FAILED_KEY]
        if failed is not None:
            t.metrics["faults/reward_failed"] = float(sum(float(x) for x in failed))
        n = sanitize_rewards(t.reward_tensor)
        t.metrics["faults/nonfinite_rewards"] = float(n)
        if n:
            print(f"[D-ARL] step {getattr(t, 'global_steps', '?')}: {n} sample(s) with a NaN or infinite reward "
                  "scored 0.0 (faults/nonfinite_rewards)", flush=True)
        return batch

    # checkpoints

    def save_then(self, folder: str, step: int, verl_save: Callable[[], Any],
                  extra: Callable[[str], Any] = lambda folder: None) -> Any:
        """Writes the buffer, DARTS' EMA and `extra(folder)`, then runs `verl_save` with rotation after its tracker."""
        self.save_replay(folder, step)
        if self.darts.enable:
            write_checked(os.path.join(folder, DARTS_FILE), self.darts_call("state"))
        extra(folder)
        probe("after_buffer", step)
        return guarded_verl_save(self.trainer, verl_save, step)

    def save_step_checkpoint(self, verl_save: Callable[[], Any]) -> Any:
        """A trainer's `_save_checkpoint` whose folder is `global_step_<global_steps>` (one-step-off, V1)."""
        step = self.trainer.global_steps
        return self.save_then(os.path.join(self.config.trainer.default_local_dir, f"global_step_{step}"), step, verl_save)

    def load_step_checkpoint(self, verl_load: Callable[[], Any]) -> Any:
        """A trainer's `_load_checkpoint`: tracker check, verl's resume, then the buffer and DARTS's EMA from the
        folder it resumed from; a stop request left by an earlier job removed."""
        self.check_resume()
        result = verl_load()
        if self.trainer.global_steps > 0:
            self.restore(self.resume_folder(self.trainer.global_steps))
        self.clear_stale_stop_request()
        return result

    def check_resume(self) -> None:
        if self.config.trainer.resume_mode == "auto":
            check_resume(self.config.trainer.default_local_dir)  # a torn tracker repaired, a dangling one refused

    def resume_folder(self, step: int) -> str:
        """The folder verl's load_checkpoint just resumed from."""
        if self.config.trainer.resume_mode == "resume_path":
            return os.path.abspath(self.config.trainer.resume_from_path)
        return os.path.join(os.path.abspath(self.config.trainer.default_local_dir), f"global_step_{step}")

    def restore(self, folder: str) -> None:
        """The buffer and DARTS' EMA from the folder verl resumed from (no EMA file: the EMA starts empty)."""
        self.load_replay(folder)
        path = os.path.join(folder, DARTS_FILE)
        if self.darts.enable and os.path.exists(path):
            state = read_checked(path)
            self.darts_call("load_state", state)
            print(f"[D-ARL] rollout_shaping: restored the length-spread EMA of {len(state['ema'])} prompts from {path}")
        elif self.darts.enable:
            print(f"[D-ARL] rollout_shaping: {folder} has no {DARTS_FILE}; the length-spread EMA starts empty")

    def save_replay(self, folder: str, step: int = -1) -> None:
        """Writes the buffer into a checkpoint folder (atomic, checksummed); `step` keys the `buffer_write` probe."""
        if self.buffer is not None:
            state = {"replay": self.buffer.state_dict(), "config": vars(self.replay)}
            write_checked(os.path.join(folder, BUFFER_FILE), state, before_replace=lambda: probe("buffer_write", step))

    def load_replay(self, folder: str) -> None:
        """Restores the buffer from the folder verl resumed from; a torn file raises `CorruptCheckpointError`."""
        if self.buffer is None:
            return
        path = os.path.join(folder, BUFFER_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"resuming with replay.enable=true from {folder}, which has no {BUFFER_FILE}: "
                "the checkpoint was written without replay; resume with replay.enable=false or start fresh")
        self.buffer.load_state_dict(read_checked(path)["replay"])
        b = self.buffer
        print(f"[D-ARL] restored the replay buffer: {len(b)} groups, versions {sorted({g.version for g in b.groups})}, "
              f"steps_done {b.steps_done}, next_seq {b.next_seq}, from {path}")

    # the stop request (robustness/stop_request.py)

    def stop_request_path(self) -> str:
        return request_path(self.config.trainer.default_local_dir)

    def clear_stale_stop_request(self) -> None:
        # after the resume, before the first step: a request still here was made for an earlier job and would stop
        # this one at once (one made during start-up is lost too: USR1 comes 10 min before the limit)
        path = self.stop_request_path()
        if os.path.exists(path):
            os.remove(path)
            print(f"[D-ARL] removed a stop request left by an earlier job: {path}")

    def stop_requested(self) -> bool:
        return os.path.exists(self.stop_request_path())

    def save_for_stop(self, step: str, saved: bool = False) -> None:
        """A checkpoint here whatever `trainer.save_freq` says (unless `saved`), then the request removed."""
        if not saved:
            from verl.utils.debug import marked_timer  # here: the driver imports this module before verl

            if self.config.trainer.save_freq <= 0:
                print(f"[D-ARL] trainer.save_freq={self.config.trainer.save_freq} saves no checkpoints; saving one "
                      "anyway for the stop request")
            with marked_timer("save_checkpoint", self.trainer.timing_raw, color="green"):
                self.trainer._save_checkpoint()
        if self.stop_requested():
            os.remove(self.stop_request_path())
        print(f"[D-ARL] stop request: checkpoint saved at {step} "
              f"({os.path.abspath(self.config.trainer.default_local_dir)}); training ends", flush=True)

    # DARTS' trainer side: its EMA in checkpoints, its metrics

    def darts_call(self, name: str, *args) -> Any:
        """One of the DARTS planner's calls; the fully-async trainer reaches its rollouter's manager through Ray."""
        if not self.mode.fully_async:
            return getattr(self.trainer.async_rollout_manager.planner, name)(*args)
        return ray.get(self.trainer.rollouter.__ray_call__.remote(_planner_call, name, *args))

    def install_darts(self) -> None:
        """Fully-async: puts the DARTS manager into the rollouter; before its checkpoint is loaded and it generates."""
        if self.darts.enable:  # verl's task runner sets the rollouter before it loads the checkpoint
            ray.get(self.trainer.rollouter.__ray_call__.remote(install_in_rollouter))


def _planner_call(rollouter, name: str, *args) -> Any:
    """Run in the rollouter through __ray_call__: verl's FullyAsyncRollouter exposes no call into its manager."""
    return getattr(rollouter.async_rollout_manager.planner, name)(*args)
