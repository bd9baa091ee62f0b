"""D-ARL on verl's fully-async trainer: `ReplayStepMixin` over `FullyAsyncTrainer`.

Samples stream from the rollouter through verl's MessageQueue; a step takes `ppo_mini_batch_size *
require_batches` groups, each stamped with the parameter versions that generated it (`min_global_steps`,
the behavior version; `max_global_steps` when a partial rollout spans a sync). Versions are verl's
`current_param_version`, the unit `_fit_update_weights` stamps the rollout with, so staleness here is
measured in syncs, not in trainer steps. With `trigger_parameter_sync_step > 1` verl recomputes old
log-probs under the parameters of the last sync (its `_compute_old_log_prob`), which is the version
`current_param_version` names: the replay step records them as that version.

Two things verl 0.9.1 does not make easy, and how they are handled:

- `FullyAsyncTrainer` is a Ray actor class (`@ray.remote`), which Ray forbids subclassing: the plain class
  behind it (`__ray_metadata__.modified_class.__ray_actor_class__`) is subclassed and wrapped in
  `ray.remote` again with the same resources.
- Ray wraps every inherited method into the actor class and ships those wrappers by value; verl's methods
  then carry a by-value copy of `FullyAsyncTrainer` in their zero-argument `super()` cells. This module is
  therefore pickled by value as well, so the copy is also the base class the worker builds (else `super()`
  fails there: "obj must be an instance or subtype of type"). The task runner, which must be pickled by
  reference (it swaps a global of verl's module), lives in `task_runner_fully_async`.

Resume: verl saves the actor and the rollouter's dataloader at `global_step_{current_param_version}`; the
replay buffer is written there too and restored by `load_checkpoint`. Samples in flight or in the queue at
a preemption are lost, as in verl (its rollouter says so): the dataloader resumes after them.
"""

from __future__ import annotations

import os
import sys

import ray
from ray import cloudpickle
from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer as _RemoteFullyAsyncTrainer

from .replay_mixin import ReplayStepMixin

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FullyAsyncTrainerBase = _RemoteFullyAsyncTrainer.__ray_metadata__.modified_class.__ray_actor_class__
TRAINER_NUM_CPUS = 10  # what verl's @ray.remote gives FullyAsyncTrainer


class DarlFullyAsyncTrainerImpl(ReplayStepMixin, FullyAsyncTrainerBase):
    """Fully-async PPO/GRPO with D-ARL replay and the multi-behavior loss (the plain class; the Ray actor
    is `DarlFullyAsyncTrainer`)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self._init_replay(config)

    def _replay_version(self) -> int:
        return int(self.current_param_version)

    def _replay_budget(self) -> int:
        return int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size) * int(self.require_batches)

    def _checkpoint_folder(self) -> str:
        root = os.path.abspath(self.config.trainer.default_local_dir)
        return os.path.join(root, f"global_step_{self.current_param_version}")

    def _save_checkpoint(self):
        self.save_replay(self._checkpoint_folder())
        return super()._save_checkpoint()

    async def load_checkpoint(self):
        version = await super().load_checkpoint()
        if self.buffer is not None and self.current_param_version > 0:
            if self.config.trainer.resume_mode == "resume_path":
                folder = os.path.abspath(self.config.trainer.resume_from_path)
            else:
                folder = self._checkpoint_folder()
            self.load_replay(folder)
        return version


DarlFullyAsyncTrainer = ray.remote(num_cpus=TRAINER_NUM_CPUS)(DarlFullyAsyncTrainerImpl)
