"""The V1 trainer's data plane (`core.DataPlane`): verl V1's TransferQueue rows as groups and back (`groups_from_rows`,
`rows_from_groups`), the trained groups written as the step's rows, pi_old by verl's stages, the loss inputs beside.

A V1 trajectory is one row per response, keyed `{uid}_{session}_{index}`, its token fields unpadded (prompt [P],
response [L]) and its other fields verbatim. A step's trained groups, fresh and replayed alike, are written back under
new keys `{uid}-r{step}_{i}_0`, so every row of the step has the same field set (TransferQueue returns only the fields
all requested keys hold) and verl's own sampler never sees them (no prompt marker).
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.utils.debug import marked_timer
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.utils.padding import response_to_nested

from ..core import Group, LossInputs, StepPlan
from ..core.packing import minibatch_index
from ..probes import swapped

PARTITION = "train"  # verl V1's TransferQueue partition of the training rows

# token fields a group rebuilds; another tensor field is an error, not a silent drop
REBUILT_FIELDS = {"prompts", "responses", "response_mask", "loss_mask", "input_ids", "position_ids",
                  "rollout_log_probs", "rm_scores"}
DROPPED_FIELDS = {"dummy_tensor"}  # verl's RLHFDataset placeholder, which nothing downstream reads


def rows_of(td) -> list[dict[str, Any]]:
    """A TransferQueue TensorDict (`kv_batch_get`) as one dict per row: tensors unpadded, other values as stored."""
    values = {name: td[name] for name in td.keys()}
    columns = {name: list(v.unbind(0)) if isinstance(v, torch.Tensor) else list(v) for name, v in values.items()}
    return [{name: column[i] for name, column in columns.items()} for i in range(int(td.batch_size[0]))]


def groups_from_rows(rows: list[dict[str, Any]], tags: list[dict[str, Any]]) -> list[Group]:
    """Groups of a sampled batch by the `uid` field, in order of first appearance; a group's version is the
    smallest `min_global_steps` tag of its rows (the weights its oldest token came from)."""
    if len(rows) != len(tags):
        raise ValueError(f"groups_from_rows: {len(rows)} rows but {len(tags)} tags")
    rows_of_uid: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        if extra := sorted(k for k, v in row.items()
                           if isinstance(v, torch.Tensor) and k not in REBUILT_FIELDS | DROPPED_FIELDS):
            raise ValueError(f"replay cannot store fields {extra} (multi-modal or MoE routing data are not supported)")
        if "rollout_log_probs" not in row:
            raise KeyError("replay needs rollout_log_probs: set actor_rollout_ref.rollout.calculate_log_probs=true")
        if tags[i].get("min_global_steps") is None:
            raise ValueError("a trajectory has no min_global_steps tag: the rollout server must return version stamps")
        rows_of_uid.setdefault(str(row["uid"]), []).append(i)
    groups = []
    for uid, idx in rows_of_uid.items():
        members = [rows[i] for i in idx]
        responses = [r["responses"] for r in members]
        non_tensor_names = [k for k, v in members[0].items() if not isinstance(v, torch.Tensor)]
        groups.append(Group(
            uid=uid, version=min(int(tags[i]["min_global_steps"]) for i in idx),
            prompt_ids=members[0]["prompts"].to(torch.int32).clone(),
            response_ids=torch.cat(responses).to(torch.int32),
            response_mask=torch.cat([r["response_mask"] for r in members]).bool(),
            lengths=torch.tensor([t.shape[0] for t in responses], dtype=torch.int32),
            rollout_log_probs=torch.cat([r["rollout_log_probs"] for r in members]).float(),
            rewards=torch.stack([r["rm_scores"].float().sum() for r in members]),
            # element by element (np.array would make a list value a column): a list value stays one element
            non_tensors={k: np.fromiter((r[k] for r in members), dtype=object, count=len(members))
                         for k in non_tensor_names},
        ))
    return groups


def rows_from_groups(groups: list[Group], step: int) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """(keys, rows, tags) of `groups` as step `step` writes them: the layout verl's agent loop writes (reward at
    the last response token, text position ids), each group under the uid `{uid}-r{step}`."""
    keys, rows, tags = [], [], []
    for g in groups:
        uid = f"{g.uid.replace('_', '-')}-r{step}"
        prompt = g.prompt_ids.long()
        responses = g.padded("response_ids", int(g.lengths.max())).long()
        masks = g.padded("response_mask", int(g.lengths.max())).long()
        log_probs = g.padded("rollout_log_probs", int(g.lengths.max()))
        versions = g.versions
        for i in range(g.n):
            length = int(g.lengths[i])
            response, mask = responses[i, :length], masks[i, :length]
            scores = torch.zeros(length)
            scores[max(length - 1, 0):] = g.rewards[i]
            input_ids = torch.cat([prompt, response])
            row = {k: v[i] for k, v in g.non_tensors.items()}
            row.update(uid=uid, session_id=i, prompts=prompt, responses=response, response_mask=mask, loss_mask=mask,
                       input_ids=input_ids, position_ids=torch.arange(input_ids.shape[0]),
                       rollout_log_probs=log_probs[i, :length], rm_scores=scores)
            extra = row.get("extra_fields") if isinstance(row.get("extra_fields"), dict) else {}
            keys.append(f"{uid}_{i}_0")
            rows.append(row)
            tags.append({"status": "success", "prompt_len": prompt.shape[0], "response_len": length,
                         "seq_len": input_ids.shape[0], "global_steps": row.get("global_steps", step),
                         "min_global_steps": int(versions[i]),
                         "max_global_steps": int(extra.get("max_global_steps", versions[i]))})
    return keys, rows, tags


class TransferQueuePlane:
    """The V1 trainer's data plane (`core.DataPlane`): the trained groups written to TransferQueue as the step's rows
    (the fresh rows cleared), pi_old by verl's balance and old-log-prob stages, the loss fields put beside them."""

    def __init__(self, trainer: Any, fresh: KVBatchMeta, metrics: dict, timing_raw: dict,
                 stack: contextlib.ExitStack) -> None:
        self.trainer, self.fresh, self.metrics, self.timing_raw, self.stack = trainer, fresh, metrics, timing_raw, stack
        self.batch: Optional[KVBatchMeta] = None
        self.rows = torch.zeros(0, dtype=torch.long)  # the trained rows' positions in the balanced order
        self.data: dict[str, torch.Tensor] = {}  # the trained rows' old, rollout log-probs and mask, [B, L] padded
        self.nested_mask = None  # the balanced rows' jagged response mask, when TransferQueue returns one
        self.mini_batch_groups = 0

    def old_log_probs(self, plan: StepPlan) -> torch.Tensor:
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

    def loss_layout(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = int(self.trainer.config.actor_rollout_ref.rollout.n)
        balanced = minibatch_index(len(self.batch), self.mini_batch_groups * n, self.trainer.darl.dp_size())
        return self.data["response_mask"], self.data["rollout_log_probs"], balanced[self.rows]

    def put_loss_inputs(self, plan: StepPlan, inputs: LossInputs) -> None:
        """Every row of the balanced batch gets the fields (padding rows with zeros)."""
        fields = {}
        for name, value in inputs.batch_fields(self.data["response_mask"].shape[1]).items():
            full = torch.zeros(len(self.batch), value.shape[1])
            full[self.rows] = value
            fields[name] = response_to_nested(full, self.nested_mask) if self.nested_mask is not None else full
        tq.kv_batch_put(keys=self.batch.keys, partition_id=PARTITION,
                        fields=TensorDict(fields, batch_size=[len(self.batch)]))
