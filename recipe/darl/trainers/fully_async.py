"""D-ARL on verl's fully-async trainer: `FullyAsyncTrainer` holding D-ARL's run (`self.darl`, trainers/darl_run.py).

Versions are verl's `current_param_version`: staleness counts weight syncs, and old log-probs (computed under the
last sync's parameters) are recorded as that version. Checkpoints also hold the MessageQueue's waiting samples
(`darl_queue.pt`), requeued on resume so they are trained first.
"""

from __future__ import annotations

import os
import sys
import time

import ray
from ray import cloudpickle
from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer as _RemoteFullyAsyncTrainer

from recipe.darl.robustness.checkpoint_files import read_checked, write_checked
from recipe.darl.robustness.rollout_watch import (RolloutServerError, generation_timeout, guard_generation,
                                                  guard_weight_sync_async, server_error, server_states)
from recipe.darl.trainer_mode import FULLY_ASYNC, TrainerMode
from recipe.darl.trainers import v0

# Ray ships the inherited methods by value with the base in their super() cells: this module must travel with them
# (else super() fails in the worker); the task runner, which must go by reference, lives in `task_runners`
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(v0)  # the shared hooks, defined there, travel with the class

# Ray refuses a subclass of the actor class verl's runner builds: the plain class behind it
FullyAsyncTrainerBase = _RemoteFullyAsyncTrainer.__ray_metadata__.modified_class.__ray_actor_class__
QUEUE_FILE = "darl_queue.pt"


class StopRequested(Exception):
    """Ends `fit` after a stop checkpoint. Not verl's TrainingStopException: its path syncs weights once more."""


@v0.darl_v0_hooks(TrainerMode(FULLY_ASYNC))
class DarlFullyAsyncTrainerImpl(FullyAsyncTrainerBase):
    """Fully-async PPO/GRPO with D-ARL replay; the plain class of the Ray actor `DarlFullyAsyncTrainer`."""

    _requeued = 0  # samples put back by a resume, not yet counted by the rollouter (set per instance by `requeue`)
    _stopping = False

    def _checkpoint_folder(self) -> str:
        root = os.path.abspath(self.config.trainer.default_local_dir)
        return os.path.join(root, f"global_step_{self.current_param_version}")

    def _save_checkpoint(self):
        # buffer, EMA and queue first, then verl's files and its tracker (docs/faults.md)
        return self.darl.save_then(self._checkpoint_folder(), int(self.current_param_version),
                                   super()._save_checkpoint, extra=self.save_queue)

    def save_queue(self, folder: str) -> None:
        """Writes the MessageQueue's samples (not a finish signal None) to `folder` in order and puts them back."""
        client = self.message_queue_client
        items = [client.get_sample_sync()[0] for _ in range(client.get_queue_size_sync())]
        for item in items:
            ray.get(client.queue_actor.put_sample.remote(item))
        samples = [x for x in items if x is not None]
        write_checked(os.path.join(folder, QUEUE_FILE), {"samples": samples})
        print(f"[D-ARL] saved {len(samples)} generated but untrained sample(s) to {folder}/{QUEUE_FILE}")

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
            self._watching = True
        if self._requeued:
            # the rollouter's count resumes at the trained samples: count the requeued ones as generated too,
            # else it generates them again (first call: after both load_checkpoints, before the rollouter starts)
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
        self.darl.check_resume()  # before the rollouter reads the tracker too
        self.darl.install_darts()  # DARTS' manager in the rollouter, before its EMA is restored
        version = await super().load_checkpoint()
        if self.current_param_version > 0:
            folder = self.darl.resume_folder(int(self.current_param_version))
            self.darl.restore(folder)
            await self.requeue(folder)
        self.darl.clear_stale_stop_request()
        return version

    async def _get_samples_from_queue(self):
        # no sample for faults.generation_timeout_s (a hung server): an error naming the servers' states and the step
        handles, addresses = self._rollout_servers()
        return await guard_generation(
            super()._get_samples_from_queue(),
            what=f"collecting the samples of trainer step {self.global_steps} (parameter version "
                 f"{self.current_param_version})",
            timeout_s=generation_timeout(self.config), handles=handles, addresses=addresses)

    def _fit_save_checkpoint(self, force=False):
        super()._fit_save_checkpoint(force)
        # only right after a weight sync: a checkpoint is named by the parameter version, which between syncs does
        # not name the actor's updates
        if force or self.local_trigger_step != 1 or not self.darl.stop_requested():
            return
        saved = self.last_ckpt_version == self.current_param_version  # verl's periodic save just ran
        self.darl.save_for_stop(f"parameter version {self.current_param_version} (trainer step {self.global_steps})",
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
            # verl logs a step's metrics at the next step: log them here, or the stop's own update goes unrecorded
            self._fit_log_aggregated_training_metrics({})
            # the trainer ends first here: the rollouter would wait for it (at its staleness limit) forever
            self.progress_bar.close()  # set: verl's _fit_postprocess_step updated it right before the stop
            await self.rollouter.__ray_call__.remote(_end_generation)
            return None
        await self._check_rollouter_finished()
        return result

    def _rollout_servers(self) -> tuple[list, list]:
        """(actor handles, addresses) of the rollout servers: the replicas the trainer syncs weights to."""
        replicas = [r for r in getattr(getattr(self, "checkpoint_manager", None), "replicas", None) or []
                    if getattr(r, "_server_handle", None) is not None]
        return [r._server_handle for r in replicas], [str(getattr(r, "_server_address", "?")) for r in replicas]

    async def _check_rollouter_finished(self) -> None:
        """Raises the rollouter's generation failure `_watch_generation` recorded: verl swallows it and sends its
        finish signal, so the run would end as complete with exit code 0 (docs/faults.md)."""
        state = await self.rollouter.__ray_call__.remote(_rollouter_state)
        if not state["error"]:
            return
        states = await server_states(*self._rollout_servers())
        raise RolloutServerError(
            f"the rollouter's generation failed ({state['error'][:300]}) after feeding {state['fed']} of {state['total']} "
            f"prompts; the trainer stopped at step {self.global_steps}, parameter version {self.current_param_version}. "
            "Rollout servers:\n  " + "\n  ".join(states)
            + "\nA checkpoint of this version was saved: resume with trainer.resume_mode=auto")


# verl's FullyAsyncRollouter is a Ray actor without methods for these: they run in it through Ray's __ray_call__

def _watch_generation(rollouter) -> None:
    """Records the exception ending the rollouter's generation, which verl swallows, for `_check_rollouter_finished`."""
    original = rollouter._streaming_generation_main

    async def watched():
        try:
            return await original()
        except Exception as e:  # not CancelledError: a stop request cancels the generation on purpose
            rollouter._darl_generation_error = f"{type(e).__name__}: {e}"
            raise

    rollouter._streaming_generation_main = watched


def _rollouter_state(rollouter) -> dict:
    return {"error": getattr(rollouter, "_darl_generation_error", None),
            "fed": int(rollouter.global_steps), "total": int(rollouter.total_rollout_steps)}


def _count_as_generated(rollouter, n: int) -> None:
    rollouter.global_steps += n


def _end_generation(rollouter) -> None:
    """Ends the rollouter's fit by cancelling its tasks (verl's own exit path; samples in generation are dropped),
    thread-safe in the tasks' loop wherever Ray runs this call."""
    for task in (getattr(rollouter, "feed_task", None), getattr(rollouter, "processor_task", None),
                 *list(getattr(rollouter, "active_tasks", ()))):
        if task is not None:
            task.get_loop().call_soon_threadsafe(task.cancel)


# the resources verl's @ray.remote gives FullyAsyncTrainer (num_cpus=10 in verl 0.9.1)
DarlFullyAsyncTrainer = ray.remote(**_RemoteFullyAsyncTrainer._default_options)(DarlFullyAsyncTrainerImpl)
