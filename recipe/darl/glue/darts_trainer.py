"""DARTS on the trainer side, for both trainers: `rollout_shaping/` metrics each step, the length-spread EMA in
checkpoints (`darts_state.pt`, atomic and checksummed like the buffer). The manager doing the shaping lives with
the rollout (glue/darts_rollout.py): in the one-step-off trainer's process, in the fully-async rollouter's actor."""

from __future__ import annotations

import os
from typing import Any, Optional

import ray

from ..core.darts import ShapingConfig
from .darts_rollout import install_in_rollouter, shaping_config
from .fault_files import read_checked, write_checked

SHAPING_FILE = "darts_state.pt"


class ShapingTrainerMixin:
    """Call `_init_shaping_trainer(config)` in the trainer's __init__."""

    def _init_shaping_trainer(self, config) -> None:
        self.shaping: ShapingConfig = shaping_config(config)

    # the manager's three calls; the fully-async trainer reaches its rollouter's manager through Ray
    def _shaping_call(self, name: str, *args) -> Any:
        rollouter = getattr(self, "rollouter", None)
        if rollouter is None:
            return getattr(self.async_rollout_manager, name)(*args)
        return ray.get(rollouter.__ray_call__.remote(_manager_call, name, *args))

    def _install_shaping(self) -> None:
        """Fully-async: puts the DARTS manager into the rollouter; before its checkpoint is loaded and it generates."""
        if self.shaping.enable and getattr(self, "rollouter", None) is not None:
            ray.get(self.rollouter.__ray_call__.remote(install_in_rollouter))

    def _fit_compute_log_prob(self, batch):
        if self.shaping.enable:
            self.metrics.update(self._shaping_call("pop_metrics"))
        return super()._fit_compute_log_prob(batch)

    def save_shaping(self, folder: str) -> None:
        if self.shaping.enable:
            os.makedirs(folder, exist_ok=True)
            write_checked(os.path.join(folder, SHAPING_FILE), self._shaping_call("shaping_state"))

    def load_shaping(self, folder: str) -> Optional[int]:
        """Restores the EMA saved in `folder`; returns how many prompts it holds (None: shaping off or no file, a
        checkpoint written without shaping: the EMA starts empty, said on the console)."""
        if not self.shaping.enable:
            return None
        path = os.path.join(folder, SHAPING_FILE)
        if not os.path.exists(path):
            print(f"[D-ARL] rollout_shaping: {folder} has no {SHAPING_FILE}; the length-spread EMA starts empty")
            return None
        state = read_checked(path)
        self._shaping_call("load_shaping_state", state)
        print(f"[D-ARL] rollout_shaping: restored the length-spread EMA of {len(state['ema'])} prompts from {path}")
        return len(state["ema"])


def _manager_call(rollouter, name: str, *args) -> Any:
    return getattr(rollouter.async_rollout_manager, name)(*args)
