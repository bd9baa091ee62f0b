"""D-ARL on verl's fully-async trainer: `RunGuardMixin` and `ReplayStepMixin` over `FullyAsyncTrainer`.

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
  reference (it swaps a global of verl's module), lives in `fully_async_runner`.

Resume: verl saves the actor and the rollouter's dataloader at `global_step_{current_param_version}`. The
replay buffer is written there too, and so are the samples waiting in the MessageQueue (generated, not yet
trained): drained before verl saves the dataloader, written to `darl_queue.pt`, put back. `load_checkpoint`
restores the buffer and puts the saved samples back in the queue before the rollouter starts, so they are
trained first. Samples still being generated at the checkpoint are lost, as in verl: their prompts were
already drawn, and the restored dataloader resumes after them.

Stop request (robustness/stop_request.py): at the next weight sync the trainer saves, logs the step, and ends its fit;
it then ends the rollouter's fit, which would otherwise wait for the trainer (paused at its staleness limit), so
that verl's task runner, waiting for both, returns.
"""

from __future__ import annotations

import os
import sys
import time

import ray
from ray import cloudpickle
from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer as _RemoteFullyAsyncTrainer

from recipe.darl.robustness.checkpoint_files import read_checked, write_checked
from recipe.darl.probes import probe
from recipe.darl.robustness.rollout_watch import (RolloutServerError, generation_timeout, guard_generation, guard_weight_sync_async,
                                  server_error, server_states)
from recipe.darl.trainers.replay_mixin import ReplayStepMixin
from recipe.darl.trainers.run_guard import RunGuardMixin

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FullyAsyncTrainerBase = _RemoteFullyAsyncTrainer.__ray_metadata__.modified_class.__ray_actor_class__
QUEUE_FILE = "darl_queue.pt"


class StopRequested(Exception):
    """Ends `fit` after a stop checkpoint. Not verl's TrainingStopException: its path syncs weights once more."""


class DarlFullyAsyncTrainerImpl(RunGuardMixin, ReplayStepMixin, FullyAsyncTrainerBase):
    """Fully-async PPO/GRPO with D-ARL replay and the multi-behavior loss (the plain class; the Ray actor
    is `DarlFullyAsyncTrainer`)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self._init_replay(config)
        self._init_run_guard(config)
        self._requeued = 0  # samples put back by a resume, not yet counted by the rollouter
        self._stopping = False

    def _replay_version(self) -> int:
        return int(self.current_param_version)

    def _replay_budget(self) -> int:
        return int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size) * int(self.require_batches)

    def _checkpoint_folder(self) -> str:
        root = os.path.abspath(self.config.trainer.default_local_dir)
        return os.path.join(root, f"global_step_{self.current_param_version}")

    def _save_checkpoint(self):
        # buffer, EMA and queue first (atomic, checksummed), then verl's files and its tracker (docs/faults.md)
        return self._save_state_then(self._checkpoint_folder(), int(self.current_param_version),
                                     super()._save_checkpoint, extra=self.save_queue)

    def save_queue(self, folder: str) -> int:
        """Writes the MessageQueue's samples (cloudpickled RolloutSamples, in queue order) to `folder` and
        puts them back; returns how many. A finish signal (None) is put back, not saved."""
        client = self.message_queue_client
        items = [client.get_sample_sync()[0] for _ in range(client.get_queue_size_sync())]
        for item in items:
            ray.get(client.queue_actor.put_sample.remote(item))
        samples = [x for x in items if x is not None]
        os.makedirs(folder, exist_ok=True)
        write_checked(os.path.join(folder, QUEUE_FILE), {"samples": samples})
        print(f"[D-ARL] saved {len(samples)} generated but untrained sample(s) to {folder}/{QUEUE_FILE}")
        return len(samples)

    async def requeue(self, folder: str) -> int:
        """Puts the samples `save_queue` wrote in `folder` back into the MessageQueue; returns how many."""
        path = os.path.join(folder, QUEUE_FILE)
        if not os.path.exists(path):
            return 0
        samples = read_checked(path)["samples"]
        for sample in samples:
            await self.message_queue_client.put_sample(sample)
        self._requeued = len(samples)
        print(f"[D-ARL] requeued {len(samples)} generated but untrained sample(s) from {path}")
        return len(samples)

    async def _fit_update_weights(self):
        if not getattr(self, "_watching", False):  # the first call: before the rollouter starts
            await self.rollouter.__ray_call__.remote(_watch_generation)
            self._install_darts()  # idempotent: load_checkpoint installed it already
            self._watching = True
        if self._requeued:
            # verl's rollouter resumes its sample count at the trained samples; the requeued ones were generated
            # too, else it would generate as many again and the run would end with more samples than configured.
            # The task runner calls this once after both load_checkpoints and before the rollouter starts.
            n, self._requeued = self._requeued, 0
            await self.rollouter.__ray_call__.remote(_count_as_generated, n)
        handles, addresses = self._rollout_servers()
        what = (f"syncing weights to the rollout at trainer step {self.global_steps} (parameter version "
                f"{self.current_param_version})")
        try:  # a server killed inside the sync leaves verl's sender waiting forever: the guard watches the servers
            return await guard_weight_sync_async(super()._fit_update_weights(), what=what, handles=handles,
                                                 addresses=addresses, timeout_s=generation_timeout(self.config))
        except ray.exceptions.RayActorError as e:  # a rollout server died: the sync's abort call finds it first
            print(f"[D-ARL] rollout failure detected at {time.time():.3f}: a server died during the weight sync", flush=True)
            states = await server_states(handles, addresses)
            raise server_error(what, f"a rollout server died ({type(e).__name__})", states) from e

    async def load_checkpoint(self):
        self._check_resume()  # before the rollouter reads the tracker too
        self._install_darts()  # DARTS' manager in the rollouter, before its EMA is restored
        version = await super().load_checkpoint()
        if self.current_param_version > 0:
            folder = self._resume_folder(int(self.current_param_version))
            self._restore_state(folder)
            await self.requeue(folder)
        self._clear_stale_stop_request()
        return version

    async def _get_samples_from_queue(self):
        # no sample for faults.generation_timeout_s (a hung rollout server; the rollouter's own failures are raised by
        # _check_rollouter_finished and the weight sync): an error naming the servers' states and the step
        handles, addresses = self._rollout_servers()
        return await guard_generation(
            super()._get_samples_from_queue(),
            what=f"collecting the samples of trainer step {self.global_steps} (parameter version "
                 f"{self.current_param_version})",
            timeout_s=generation_timeout(self.config), handles=handles, addresses=addresses)

    def _fit_update_actor(self, batch):
        probe("update", self.global_steps)  # trainer step; the rollouter keeps generating meanwhile
        return super()._fit_update_actor(batch)

    def _fit_save_checkpoint(self, force=False):
        super()._fit_save_checkpoint(force)
        # only right after a weight sync (local_trigger_step back to 1), where verl checkpoints: a checkpoint is
        # named by the parameter version, and between syncs the actor holds updates that version does not name
        if force or self.local_trigger_step != 1 or not self._stop_requested():
            return
        saved = self.last_ckpt_version == self.current_param_version  # verl's periodic save just ran
        self._save_for_stop(f"parameter version {self.current_param_version} (trainer step {self.global_steps})",
                            saved=saved)
        self.last_ckpt_version = self.current_param_version
        self._stopping = True

    def _fit_postprocess_step(self):
        super()._fit_postprocess_step()  # raised after verl's whole step: the sync cycle's metrics are logged
        if self._stopping:
            raise StopRequested

    async def fit(self):
        try:
            result = await super().fit()
        except StopRequested:
            # verl logs a step's metrics at the next step (its aggregator takes them in _fit_postprocess_step), and
            # the last step's after its loop: log them here, or the stop's own update goes unrecorded
            self._fit_log_aggregated_training_metrics({})
            # verl's fit ends when the rollouter's finish signal reaches it through the queue; here the trainer
            # ends first, and the rollouter would wait for it (paused at its staleness limit) forever
            if getattr(self, "progress_bar", None) is not None:
                self.progress_bar.close()
            await self.rollouter.__ray_call__.remote(_end_generation)
            return None
        await self._check_rollouter_finished()
        return result

    def _rollout_servers(self) -> tuple[list, list]:
        """(actor handles, addresses) of the rollout servers: the replicas the trainer syncs weights to."""
        replicas = list(getattr(getattr(self, "checkpoint_manager", None), "replicas", None) or [])
        return ([r._server_handle for r in replicas if getattr(r, "_server_handle", None) is not None],
                [str(getattr(r, "_server_address", "?")) for r in replicas if getattr(r, "_server_handle", None) is not None])

    async def _check_rollouter_finished(self) -> None:
        """verl's rollouter sends its finish signal also when its generation failed (a dead rollout server: it prints
        `Streaming process exception` and swallows the exception), and the trainer then saved a checkpoint and ended
        as if the run were complete, exit code 0. `_watch_generation` recorded the failure in the rollouter: raise
        it here, naming the servers' states (docs/faults.md). verl's final checkpoint has been saved by then."""
        state = await self.rollouter.__ray_call__.remote(_rollouter_state)
        if not state["error"]:
            return
        states = await server_states(*self._rollout_servers())
        raise RolloutServerError(
            f"the rollouter's generation failed ({state['error'][:300]}) after feeding {state['fed']} of {state['total']} "
            f"prompts; the trainer stopped at step {self.global_steps}, parameter version {self.current_param_version}. "
            "Rollout servers:\n  " + "\n  ".join(states)
            + "\nA checkpoint of this version was saved: resume with trainer.resume_mode=auto")


def _watch_generation(rollouter) -> None:
    """Records an exception that ends the rollouter's generation (verl prints and swallows it) in the rollouter, for
    `_check_rollouter_finished`. Installed before the rollouter's fit starts."""
    original = getattr(rollouter, "_streaming_generation_main", None)
    if original is None or getattr(rollouter, "_darl_watched", False):
        return

    async def watched():
        try:
            return await original()
        except Exception as e:  # not CancelledError: a stop request cancels the generation on purpose
            rollouter._darl_generation_error = f"{type(e).__name__}: {e}"
            raise

    rollouter._streaming_generation_main = watched
    rollouter._darl_watched = True


def _rollouter_state(rollouter) -> dict:
    return {"error": getattr(rollouter, "_darl_generation_error", None),
            "fed": int(rollouter.global_steps), "total": int(rollouter.total_rollout_steps)}


def _count_as_generated(rollouter, n: int) -> None:
    rollouter.global_steps += n


def _end_generation(rollouter) -> None:
    """Ends the rollouter's fit: cancelling its feed and processor tasks takes verl's own exit path (the finish
    signal into the queue, `running` set false, which its monitor loop sees within 10 s, fit returns). Samples
    being generated are dropped with them. Scheduled thread-safe in the tasks' loop, wherever Ray runs this call."""
    for task in (getattr(rollouter, "feed_task", None), getattr(rollouter, "processor_task", None),
                 *list(getattr(rollouter, "active_tasks", ()))):
        if task is not None:
            task.get_loop().call_soon_threadsafe(task.cancel)


# the resources verl's @ray.remote gives FullyAsyncTrainer (num_cpus=10 in verl 0.9.1)
DarlFullyAsyncTrainer = ray.remote(**_RemoteFullyAsyncTrainer._default_options)(DarlFullyAsyncTrainerImpl)
