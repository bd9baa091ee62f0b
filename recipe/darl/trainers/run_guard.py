"""What keeps a D-ARL run alive and resumable, for both trainers (docs/faults.md): checkpoints, the stop request,
the reward guard and DARTS' trainer side.

Checkpoints are written in a fixed order: the replay buffer and DARTS' EMA first (atomic, checksummed), then verl's
files, verl's tracker last, so a kill anywhere leaves the previous checkpoint the one resume takes.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import ray

from recipe.darl.core.darts import DartsConfig
from recipe.darl.probes import probe
from recipe.darl.robustness.checkpoint_files import check_resume, guarded_verl_save, read_checked, write_checked
from recipe.darl.robustness.job_ports import JobPortWorkerGroup, port_clash_named
from recipe.darl.robustness.reward_guard import FAILED_KEY, sanitize_rewards
from recipe.darl.robustness.stop_request import request_path
from recipe.darl.trainers.console import compact_console
from recipe.darl.workers.darts_rollout import darts_config, install_in_rollouter

DARTS_FILE = "darts_state.pt"


class RunGuardMixin:
    """Before `ReplayStepMixin` in a verl trainer's bases; call `_init_run_guard(config)` in its __init__."""

    # every verl trainer keeps its Tracking in `self.logger` (set in fit or __init__): the assignment passes through
    # here, where the console backend becomes the compact one (trainers/console.py; `console: full` keeps verl's)
    @property
    def logger(self):
        try:
            return self.__dict__["_darl_tracking"]
        except KeyError:
            raise AttributeError("logger") from None

    @logger.setter
    def logger(self, tracking) -> None:
        self.__dict__["_darl_tracking"] = compact_console(
            tracking, getattr(self, "config", None), lambda: getattr(self, "total_training_steps", None))

    def _init_run_guard(self, config) -> None:
        self.darts: DartsConfig = darts_config(config)
        # verl's worker-group hook: torch.distributed ports from the job's own range (robustness/job_ports.py)
        self.ray_worker_group_cls = JobPortWorkerGroup

    def _init_worker_groups(self):
        with port_clash_named():  # no free port in the job's range: an error naming the setting
            return super()._init_worker_groups()

    def _init_models(self):
        with port_clash_named():  # rank 0 of each worker group binds its port here
            return super()._init_models()

    def _save_state_then(self, folder: str, step: int, verl_save: Callable[[], Any],
                         extra: Callable[[str], Any] = lambda folder: None) -> Any:
        """Writes the buffer, DARTS' EMA and `extra(folder)`, then runs `verl_save` with rotation after its tracker."""
        self.save_replay(folder, step)
        self.save_darts(folder)
        extra(folder)
        probe("after_buffer", step)
        return guarded_verl_save(self, verl_save, step)

    def _save_step_checkpoint(self, verl_save: Callable[[], Any]) -> Any:
        """A trainer's `_save_checkpoint` whose folder is `global_step_<global_steps>` (one-step-off, V1)."""
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        return self._save_state_then(folder, self.global_steps, verl_save)

    def _load_step_checkpoint(self, verl_load: Callable[[], Any]) -> Any:
        """A trainer's `_load_checkpoint`: tracker check, verl's resume, then the buffer and DARTS's EMA from the
        folder it resumed from; a stop request left by an earlier job removed."""
        self._check_resume()
        result = verl_load()
        if self.global_steps > 0:
            self._restore_state(self._resume_folder(self.global_steps))
        self._clear_stale_stop_request()
        return result

    def _check_resume(self) -> None:
        if self.config.trainer.resume_mode == "auto":
            check_resume(self.config.trainer.default_local_dir)  # a torn tracker repaired, a dangling one refused

    def _resume_folder(self, step: int) -> str:
        """The folder verl's load_checkpoint just resumed from."""
        if self.config.trainer.resume_mode == "resume_path":
            return os.path.abspath(self.config.trainer.resume_from_path)
        return os.path.join(os.path.abspath(self.config.trainer.default_local_dir), f"global_step_{step}")

    def _restore_state(self, folder: str) -> None:
        self.load_replay(folder)
        self.load_darts(folder)

    def _stop_request_path(self) -> str:
        return request_path(self.config.trainer.default_local_dir)

    def _clear_stale_stop_request(self) -> None:
        # after the resume, before the first step: a request still here was made for an earlier job and would stop
        # this one at once (one made during start-up is lost too: USR1 comes 10 min before the limit)
        path = self._stop_request_path()
        if os.path.exists(path):
            os.remove(path)
            print(f"[D-ARL] removed a stop request left by an earlier job: {path}")

    def _stop_requested(self) -> bool:
        return os.path.exists(self._stop_request_path())

    def _save_for_stop(self, step: str, saved: bool = False) -> None:
        """A checkpoint here whatever `trainer.save_freq` says (unless `saved`), then the request removed."""
        if not saved:
            from verl.utils.debug import marked_timer  # here: the driver imports this module before verl

            if self.config.trainer.save_freq <= 0:
                print(f"[D-ARL] trainer.save_freq={self.config.trainer.save_freq} saves no checkpoints; saving one "
                      "anyway for the stop request")
            with marked_timer("save_checkpoint", self.timing_raw, color="green"):
                self._save_checkpoint()
        path = self._stop_request_path()
        if os.path.exists(path):
            os.remove(path)
        print(f"[D-ARL] stop request: checkpoint saved at {step} "
              f"({os.path.abspath(self.config.trainer.default_local_dir)}); training ends", flush=True)

    def _fit_compute_reward(self, batch):
        # verl's hook set `reward_tensor` (the batch's rm_scores) and `reward_extra_infos_dict`; fit_step set `metrics`
        batch = super()._fit_compute_reward(batch)
        if self.darts.enable:  # the step's rollout_shaping/ metrics, from the manager
            self.metrics.update(self._darts_call("pop_metrics"))
        # counted, then removed: buffered groups must keep the non-tensor fields of runs saved without the flag
        failed = self.reward_extra_infos_dict.pop(FAILED_KEY, None)
        batch.non_tensor_batch.pop(FAILED_KEY, None)
        keys = batch.meta_info.get("reward_extra_keys")
        if isinstance(keys, list) and FAILED_KEY in keys:
            batch.meta_info["reward_extra_keys"] = [k for k in keys if k != FAILED_KEY]
        if failed is not None:
            self.metrics["faults/reward_failed"] = float(sum(float(x) for x in failed))
        n = sanitize_rewards(self.reward_tensor)
        self.metrics["faults/nonfinite_rewards"] = float(n)
        if n:
            print(f"[D-ARL] step {getattr(self, 'global_steps', '?')}: {n} sample(s) with a NaN or infinite reward "
                  "scored 0.0 (faults/nonfinite_rewards)", flush=True)
        return batch

    def _darts_call(self, name: str, *args) -> Any:
        """One of the DARTS manager's calls; the fully-async trainer reaches its rollouter's manager through Ray."""
        rollouter = getattr(self, "rollouter", None)
        if rollouter is None:
            return getattr(self.async_rollout_manager, name)(*args)
        return ray.get(rollouter.__ray_call__.remote(_manager_call, name, *args))

    def _install_darts(self) -> None:
        """Fully-async: puts the DARTS manager into the rollouter; before its checkpoint is loaded and it generates."""
        if self.darts.enable and getattr(self, "rollouter", None) is not None:
            ray.get(self.rollouter.__ray_call__.remote(install_in_rollouter))

    def save_darts(self, folder: str) -> None:
        if self.darts.enable:
            write_checked(os.path.join(folder, DARTS_FILE), self._darts_call("darts_state"))

    def load_darts(self, folder: str) -> Optional[int]:
        """Restores the EMA saved in `folder`; returns how many prompts it holds (None: DARTS off, or no file: the
        EMA starts empty)."""
        if not self.darts.enable:
            return None
        path = os.path.join(folder, DARTS_FILE)
        if not os.path.exists(path):
            print(f"[D-ARL] rollout_shaping: {folder} has no {DARTS_FILE}; the length-spread EMA starts empty")
            return None
        state = read_checked(path)
        self._darts_call("load_darts_state", state)
        print(f"[D-ARL] rollout_shaping: restored the length-spread EMA of {len(state['ema'])} prompts from {path}")
        return len(state["ema"])


def _manager_call(rollouter, name: str, *args) -> Any:
    """Run in the rollouter through __ray_call__: verl's FullyAsyncRollouter exposes no call into its manager."""
    return getattr(rollouter.async_rollout_manager, name)(*args)
