"""Conversion between verl V1's TransferQueue rows and the D-ARL core's groups (V1's counterpart of converters.py).

A V1 trajectory is one row per response, keyed `{uid}_{session}_{index}`, its token fields unpadded (prompt [P],
response [L]) and its other fields verbatim. A step's trained groups, fresh and replayed alike, are written back under
new keys `{uid}-r{step}_{i}_0`, so every row of the step has the same field set (TransferQueue returns only the fields
all requested keys hold) and verl's own sampler never sees them (no prompt marker).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core import Group

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
