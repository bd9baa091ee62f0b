"""Per-prompt replay (`replay.prompt_replay`, after RePO, arXiv 2506.09340): in the place of a fresh group with equal
rewards, a history group of its prompt's n best-rewarded stored responses (ties: newest), each with its own
behavior version and log-probs; it trains like a fresh group and is never buffered."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .group import Group

HISTORY_SUFFIX = ":history"  # appended to the fresh group's uid
# non-tensor fields that describe the group, not the sample; version stamps that describe each sample's behavior
GROUP_FIELDS = ("uid",)
VERSION_FIELDS = ("min_global_steps", "max_global_steps")


@dataclass(eq=False)
class StoredResponse:
    """One stored response. T = its length in tokens."""

    version: int  # behavior version that generated it
    step: int  # the step it arrived at
    response_ids: torch.Tensor  # [T] int32
    response_mask: torch.Tensor  # [T] bool
    rollout_log_probs: torch.Tensor  # [T] float32, log mu_version
    reward: float
    non_tensors: dict[str, Any] = field(default_factory=dict)  # its per-sample fields (reward extras, stamps)

    @property
    def length(self) -> int:
        return int(self.response_ids.shape[0])


class PromptStore:
    """Per prompt (a digest of its token ids), the `per_prompt` most recent responses, usable for `max_age` steps."""

    def __init__(self, per_prompt: int, max_age: Optional[int] = None) -> None:
        self.per_prompt = per_prompt
        self.max_age = max_age
        self.store: dict[str, list[StoredResponse]] = {}  # prompt key -> newest last
        self.totals = {"stored": 0, "expired": 0, "history_groups": 0}

    def __len__(self) -> int:
        return sum(len(v) for v in self.store.values())

    def history_groups(self, fresh: list[Group]) -> list[Group]:
        """A history group per fresh group with equal rewards and at least n stored responses, stamped with its
        arrival. Call before this step's `add_from`, so only earlier steps' responses are used."""
        out = []
        for group in fresh:
            stored = self.store.get(group.prompt_key, [])
            if group.n < 2 or len(stored) < group.n or not group.zero_advantage:
                continue
            picks = sorted(reversed(stored), key=lambda s: -s.reward)[: group.n]  # stable: ties stay newest first
            out.append(history_group(group, picks))
        self.totals["history_groups"] += len(out)
        return out

    def add_from(self, groups: list[Group], step: int) -> None:
        """Stores the responses the groups' own policy generated, drops those past `max_age`."""
        for group in groups:
            own = (group.versions == group.version).nonzero().flatten().tolist()
            if not own:
                continue
            entry = self.store.setdefault(group.prompt_key, [])
            ids, mask, log_probs = (t.split(group.lengths.tolist())
                                    for t in (group.response_ids, group.response_mask, group.rollout_log_probs))
            for i in own:
                entry.append(StoredResponse(
                    version=group.version, step=step, response_ids=ids[i].clone(), response_mask=mask[i].clone(),
                    rollout_log_probs=log_probs[i].clone(), reward=float(group.rewards[i]),
                    non_tensors={k: v[i] for k, v in group.non_tensors.items() if k not in GROUP_FIELDS}))
                del entry[:-self.per_prompt]
                self.totals["stored"] += 1
        for key in list(self.store) if self.max_age is not None else ():
            kept = [s for s in self.store[key] if step + 1 - s.step <= self.max_age]
            self.totals["expired"] += len(self.store[key]) - len(kept)
            if kept:
                self.store[key] = kept
            else:
                del self.store[key]

    def stats(self) -> dict[str, float]:
        # 9 bytes per token, as the buffer: int32 id, bool mask, float32 log-prob
        return {"prompts": len(self.store), "responses": len(self),
                "bytes": sum(s.length * 9 for v in self.store.values() for s in v)}

    def state_dict(self) -> dict[str, Any]:
        return {"store": {k: [copy.deepcopy(vars(s)) for s in v] for k, v in self.store.items()},
                "totals": dict(self.totals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.store = {k: [StoredResponse(**copy.deepcopy(s)) for s in v] for k, v in state["store"].items()}
        self.totals = {**self.totals, **{k: v for k, v in state["totals"].items() if k in self.totals}}


def history_group(fresh: Group, picks: list[StoredResponse]) -> Group:
    """The group of stored `picks` ([n]) under fresh's prompt and uid + `:history`, each with its own fields."""
    versions = torch.tensor([s.version for s in picks], dtype=torch.int64)
    uid = fresh.uid + HISTORY_SUFFIX
    non_tensors = {}
    for key, values in fresh.non_tensors.items():
        values = values.copy()
        for i, s in enumerate(picks):
            if key in GROUP_FIELDS:
                values[i] = uid
            elif key in VERSION_FIELDS:
                values[i] = s.version
            elif key in s.non_tensors:
                values[i] = s.non_tensors[key]
        non_tensors[key] = values
    return Group(
        uid=uid, version=int(versions.max()), prompt_ids=fresh.prompt_ids.clone(),
        response_ids=torch.cat([s.response_ids for s in picks]).to(torch.int32),
        response_mask=torch.cat([s.response_mask for s in picks]).bool(),
        lengths=torch.tensor([s.length for s in picks], dtype=torch.int32),
        rollout_log_probs=torch.cat([s.rollout_log_probs for s in picks]).float(),
        rewards=torch.tensor([s.reward for s in picks], dtype=torch.float32),
        non_tensors=non_tensors, arrival_step=fresh.arrival_step, seq=fresh.seq, sample_versions=versions,
    )
