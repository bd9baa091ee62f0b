"""D-ARL on verl's V1 trainer (`trainer.use_v1=true`): `colocate_async` and `separate_async`.

With replay on, `_step_once` (verl's one local update) reads the fresh groups verl's sampler hands over out of
TransferQueue into the replay step (whose buffer keeps its own copies: verl's `fit` deletes a step's rows) and writes
the groups it trains (fresh and buffered) back as the step's rows; verl's own balance, old-log-prob, advantage and
update stages run on them, with the D-ARL loss fields put beside them.
"""

from __future__ import annotations

import contextlib

import torch
import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer

from recipe.darl.probes import probe, swapped
from recipe.darl.robustness.job_ports import JobPortWorkerGroup, port_clash_named
from recipe.darl.robustness.reward_guard import sanitize_rewards
from recipe.darl.trainer_mode import TrainerMode
from recipe.darl.trainers.console import CompactTracking
from recipe.darl.trainers.darl_run import DarlRun
from recipe.darl.trainers.transferqueue_plane import PARTITION, TransferQueuePlane, groups_from_rows, rows_of


def darl_v1_trainer(base: type, name: str, mode: str) -> type:
    """verl's V1 trainer `base` of `mode` (trainer.v1.trainer_mode) holding D-ARL's run as `self.darl`, class `name`;
    the same hooks for every mode."""

    class DarlV1Trainer(base):
        logger = CompactTracking()

        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            self.darl = DarlRun(self, config, TrainerMode(mode))

        def _setup(self):
            # V1 builds its worker groups from the module's RayWorkerGroup (no class hook): ports from the job's range
            with swapped(trainer_base, "RayWorkerGroup", JobPortWorkerGroup), port_clash_named():
                super()._setup()
            self.darl.install_loss(self.actor_rollout_wg)

        def _save_checkpoint(self):
            return self.darl.save_step_checkpoint(super()._save_checkpoint)

        def _load_checkpoint(self):
            return self.darl.load_step_checkpoint(super()._load_checkpoint)

        def on_step_end(self):
            super().on_step_end()
            if self.darl.stop_requested():  # save (unless this step just did) and let `fit` end after this step
                self.darl.save_for_stop(f"step {self.global_steps}",
                                        saved=self.global_steps in self.__dict__.get("_darl_saved_steps", []))
                self.total_training_steps = self.global_steps

        def _guard_rewards(self, batch: KVBatchMeta, metrics: dict) -> None:
            """NaN/inf rewards of `batch`'s rows scored 0.0 in TransferQueue before anything reads them (one would turn
            its group's advantages, then the update, into NaN); counted in faults/nonfinite_rewards."""
            scores = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["rm_scores"])
            scores = scores["rm_scores"]
            rows = int((~torch.isfinite(scores.to_padded_tensor(0.0) if scores.is_nested else scores)).any(-1).sum())
            metrics["faults/nonfinite_rewards"] = float(rows)
            if rows:
                sanitize_rewards(scores.values() if scores.is_nested else scores)  # jagged rows share one buffer
                tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                                fields=tu.get_tensordict({"rm_scores": scores}))
                print(f"[D-ARL] step {self.global_steps}: {rows} sample(s) with a NaN or infinite reward scored 0.0 "
                      "(faults/nonfinite_rewards)", flush=True)

        def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
            if not self.darl.replay.enable:  # with replay, `_step_once` guarded the fresh rows before they became groups
                self._guard_rewards(batch, metrics)
            return super()._compute_advantage(batch, metrics)

        def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
            probe("update", self.global_steps)
            return super()._update_actor(batch, metrics)

        def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
            if not self.darl.replay.enable:
                return super()._step_once(metrics, timing_raw, sample_batch_size)
            with marked_timer("gen", timing_raw, color="red"):
                self.on_sample_begin()
                fresh_meta, off_policy = self.replay_buffer.sample(self.global_steps, PARTITION, sample_batch_size)
                metrics.update(off_policy)
                self.on_sample_end()
            if self.reward_loop_manager.reward_loop_worker_handles is None:
                fresh_meta = self._compute_reward_colocate(fresh_meta, metrics=metrics)
            self._guard_rewards(fresh_meta, metrics)  # before the groups (and the buffer) take the rewards

            fresh = groups_from_rows(rows_of(tq.kv_batch_get(keys=fresh_meta.keys, partition_id=PARTITION)),
                                     fresh_meta.tags)
            with contextlib.ExitStack() as stack:
                plane = TransferQueuePlane(self, fresh_meta, metrics, timing_raw, stack)
                state = self.darl.begin(plane, fresh, metrics)
                if state.plan.selection.skipped:
                    # no update: verl's stages (bar the update) on the fresh rows, whose advantages `fit`'s metrics read
                    print(f"[D-ARL] step {self.global_steps}: no update ({state.plan.selection.reason})")
                    batch = self._balance_batch(fresh_meta, metrics=metrics)
                    batch = self._compute_old_log_prob(batch, metrics=metrics)
                    batch = self._compute_advantage(batch, metrics=metrics)
                else:
                    with marked_timer("adv", timing_raw, color="brown"):
                        batch = self._compute_advantage(plane.batch, metrics=metrics)
                    if self.config.trainer.critic_warmup <= self.global_steps:
                        with marked_timer("update_actor", timing_raw, color="red"):
                            batch = self._update_actor(batch, metrics=metrics)
            self.darl.end(state, metrics)
            return batch

    DarlV1Trainer.__name__ = DarlV1Trainer.__qualname__ = name  # found by name when pickled
    return DarlV1Trainer


# V1 `colocate_async` (rollout and trainer share the GPUs, partial rollouts), `separate_async` (rollout on its own GPUs)
DarlColocateAsyncTrainer = darl_v1_trainer(PPOTrainerColocateAsync, "DarlColocateAsyncTrainer", "colocate_async")
DarlSeparateAsyncTrainer = darl_v1_trainer(PPOTrainerSeparateAsync, "DarlSeparateAsyncTrainer", "separate_async")


TRAINERS = {"colocate_async": DarlColocateAsyncTrainer, "separate_async": DarlSeparateAsyncTrainer}
