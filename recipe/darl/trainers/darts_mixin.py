"""DARTS on the trainer side, for both trainers: `rollout_shaping/` metrics each step, the length-spread EMA in
checkpoints (`darts_state.pt`, atomic and checksummed like the buffer). DARTS' rollout manager lives with
the rollout (workers/darts_rollout.py): in the one-step-off trainer's process, in the fully-async rollouter's actor."""

from __future__ import annotations

import os
from typing import Any, Optional

import ray

from ..core.darts import DartsConfig
from recipe.darl.workers.darts_rollout import darts_config, install_in_rollouter
from recipe.darl.robustness.checkpoint_files import read_checked, write_checked

DARTS_FILE = "darts_state.pt"


class DartsTrainerMixin:
    """Call `_init_darts_trainer(config)` in the trainer's __init__."""

    def _init_darts_trainer(self, config) -> None:
        self.darts: DartsConfig = darts_config(config)

    # the manager's three calls; the fully-async trainer reaches its rollouter's manager through Ray
    def _darts_call(self, name: str, *args) -> Any:
        rollouter = getattr(self, "rollouter", None)
        if rollouter is None:
            return getattr(self.async_rollout_manager, name)(*args)
        return ray.get(rollouter.__ray_call__.remote(_manager_call, name, *args))

    def _install_darts(self) -> None:
        """Fully-async: puts the DARTS manager into the rollouter; before its checkpoint is loaded and it generates."""
        if self.darts.enable and getattr(self, "rollouter", None) is not None:
            ray.get(self.rollouter.__ray_call__.remote(install_in_rollouter))

    def _fit_compute_log_prob(self, batch):
        if self.darts.enable:
            self.metrics.update(self._darts_call("pop_metrics"))
        return super()._fit_compute_log_prob(batch)

    def save_darts(self, folder: str) -> None:
        if self.darts.enable:
            os.makedirs(folder, exist_ok=True)
            write_checked(os.path.join(folder, DARTS_FILE), self._darts_call("darts_state"))

    def load_darts(self, folder: str) -> Optional[int]:
        """Restores the EMA saved in `folder`; returns how many prompts it holds (None: DARTS off or no file, a
        checkpoint written without DARTS: the EMA starts empty, said on the console)."""
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
    return getattr(rollouter.async_rollout_manager, name)(*args)
