"""D-ARL on verl's V1 trainer (`trainer.use_v1=true`): `colocate_async` and `separate_async`.

With replay on, `_step_once` (verl's one local update) reads the fresh groups verl's sampler hands over out of
TransferQueue into the replay step (whose buffer keeps its own copies: verl's `fit` deletes a step's rows) and writes
the groups it trains (fresh and buffered) back as the step's rows; verl's own balance, old-log-prob, advantage and
update stages run on them, with the D-ARL loss fields put beside them.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.utils.padding import response_to_nested

from recipe.darl.probes import probe, swapped
from recipe.darl.robustness.job_ports import JobPortWorkerGroup, port_clash_named
from recipe.darl.robustness.reward_guard import sanitize_rewards
from recipe.darl.trainer_mode import trainer_mode
from recipe.darl.trainers.console import CompactTracking
from recipe.darl.trainers.converters import loss_fields, minibatch_index
from recipe.darl.trainers.darl_run import DarlRun
from recipe.darl.trainers.tq_rows import groups_from_rows, rows_from_groups, rows_of

PARTITION = "train"


def darl_v1_trainer(base: type, name: str) -> type:
    """verl's V1 trainer `base` (one per mode) holding D-ARL's run as `self.darl`; the same hooks for every mode."""

    class DarlV1Trainer(base):
        logger = CompactTracking()

        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            self.darl = DarlRun(self, config, trainer_mode(config, v1=True))

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


class TransferQueuePlane:
    """The V1 trainer's data plane (`core.DataPlane`): the trained groups written to TransferQueue as the step's rows
    (the fresh rows cleared), pi_old by verl's balance and old-log-prob stages, the loss fields put beside them."""

    def __init__(self, trainer: PPOTrainerColocateAsync, fresh: KVBatchMeta, metrics: dict, timing_raw: dict,
                 stack: contextlib.ExitStack) -> None:
        self.trainer, self.fresh, self.metrics, self.timing_raw, self.stack = trainer, fresh, metrics, timing_raw, stack
        self.batch: Optional[KVBatchMeta] = None
        self.rows = torch.zeros(0, dtype=torch.long)  # the trained rows' positions in the balanced order
        self.data: dict[str, torch.Tensor] = {}  # the trained rows' old, rollout log-probs and mask, [B, L] padded
        self.nested_mask = None  # the balanced rows' jagged response mask, when TransferQueue returns one
        self.mini_batch_groups = 0

    def old_log_probs(self, plan) -> torch.Tensor:
        t = self.trainer
        tq.kv_clear(keys=self.fresh.keys, partition_id=PARTITION)
        keys, rows, tags = rows_from_groups(plan.trained, t.global_steps)
        tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=list_of_dict_to_tensordict(rows), tags=tags)
        batch = KVBatchMeta(keys=keys, tags=tags, partition_id=PARTITION)
        batch.extra_info["temperature"] = t.config.actor_rollout_ref.rollout.temperature
        self.mini_batch_groups = t.darl.mini_batch_groups(plan)
        # fewer groups than a mini-batch: one smaller, from the balance (which pads to it) to the update
        self.stack.enter_context(swapped(t.config.actor_rollout_ref.actor, "ppo_mini_batch_size",
                                         self.mini_batch_groups))
        batch = t._balance_batch(batch, metrics=self.metrics)
        with marked_timer("old_log_prob", self.timing_raw, color="blue"):
            self.batch = t._compute_old_log_prob(batch, metrics=self.metrics)
        data = tq.kv_batch_get(keys=self.batch.keys, partition_id=PARTITION,
                               select_fields=["old_log_probs", "rollout_log_probs", "response_mask"])
        self.nested_mask = data["response_mask"] if data["response_mask"].is_nested else None
        # the trained rows in plan order; verl splits the balanced order into contiguous dp shards of mini-batches
        position = {key: p for p, key in enumerate(self.batch.keys)}
        self.rows = torch.tensor([position[k] for k in keys])
        # [B, L] right-padded with zeros: TransferQueue returns a per-token field as a jagged tensor, or as a plain
        # one when every row of the partition has the same length
        self.data = {k: (data[k].to_padded_tensor(0.0) if data[k].is_nested else data[k])[self.rows] for k in data.keys()}
        return self.data["old_log_probs"]

    def loss_layout(self, plan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = int(self.trainer.config.actor_rollout_ref.rollout.n)
        balanced = minibatch_index(len(self.batch), self.mini_batch_groups * n, self.trainer.darl.dp_size())
        return self.data["response_mask"], self.data["rollout_log_probs"], balanced[self.rows]

    def put_loss_inputs(self, plan, inputs) -> None:
        """Every row of the balanced batch gets the fields (padding rows with zeros)."""
        fields = {}
        for name, value in loss_fields(inputs, self.data["response_mask"].shape[1]).items():
            full = torch.zeros(len(self.batch), value.shape[1])
            full[self.rows] = value
            fields[name] = response_to_nested(full, self.nested_mask) if self.nested_mask is not None else full
        tq.kv_batch_put(keys=self.batch.keys, partition_id=PARTITION,
                        fields=TensorDict(fields, batch_size=[len(self.batch)]))


# V1 `colocate_async` (rollout and trainer share the GPUs, partial rollouts), `separate_async` (rollout on its own GPUs)
DarlColocateAsyncTrainer = darl_v1_trainer(PPOTrainerColocateAsync, "DarlColocateAsyncTrainer")
DarlSeparateAsyncTrainer = darl_v1_trainer(PPOTrainerSeparateAsync, "DarlSeparateAsyncTrainer")


TRAINERS = {"colocate_async": DarlColocateAsyncTrainer, "separate_async": DarlSeparateAsyncTrainer}
