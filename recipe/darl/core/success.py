"""Success replay (`replay.success`): a group with no correct response takes a past correct one.

Where informative samples are scarce, a prompt's group is often all wrong: GRPO gives it zero advantage
and the step learns nothing from it. AR3PO (arXiv 2509.25808) and RLEP (2507.07451) reuse verified
successes: here a group whose rewards are all <= 0 takes the most recent stored success for the same
prompt in place of its last response. That response keeps its own behavior version and rollout
log-probs, so the multi-behavior objective treats it as its own source (its version is older than the
group's) and the trust region and truncated IS weight it against its own behavior policy.

A success is a response with reward > 0 (verl's math rewards are 0/1 or -1/1). The store keeps, per
prompt (a digest of its token ids), the `per_prompt` most recent ones, each for at most `max_age` steps.
Plain PyTorch, no Ray: the buffer calls it, so the trainers and the study harness run the same code.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:  # the buffer imports this module
    from .buffer import Group

# non-tensor fields that describe the group, not the sample: a grafted sample keeps the group's
GROUP_FIELDS = ("uid",)
VERSION_FIELDS = ("min_global_steps", "max_global_steps")


@dataclass(eq=False)
class Success:
    """One stored correct response. T = its length in tokens."""

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


def sample_segment(group: Group, i: int) -> slice:
    """Token slice of response i in the group's packed tensors."""
    start = int(group.lengths[:i].sum())
    return slice(start, start + int(group.lengths[i]))


def graft(group: Group, i: int, success: Success) -> None:
    """Replaces response i of `group` with `success` in place (tokens, log-probs, reward, version, fields).

    Recorded proximal log-probs are dropped: they described the replaced response.
    """
    seg = sample_segment(group, i)

    def splice(packed: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return torch.cat([packed[:seg.start], new.to(packed.dtype), packed[seg.stop:]])

    versions = group.versions.clone()
    group.response_ids = splice(group.response_ids, success.response_ids)
    group.response_mask = splice(group.response_mask, success.response_mask)
    group.rollout_log_probs = splice(group.rollout_log_probs, success.rollout_log_probs)
    group.lengths = group.lengths.clone()
    group.lengths[i] = success.length
    group.rewards = group.rewards.clone()
    group.rewards[i] = success.reward
    versions[i] = success.version
    group.sample_versions = versions
    group.recorded = {}
    for key, values in group.non_tensors.items():
        if key in GROUP_FIELDS:
            continue
        values = values.copy()
        if key in VERSION_FIELDS:
            values[i] = success.version
        elif key in success.non_tensors:
            values[i] = success.non_tensors[key]
        group.non_tensors[key] = values


class SuccessStore:
    """Per prompt, the `per_prompt` most recent correct responses, usable for `max_age` steps."""

    only_correct = True  # what `add_from` keeps: correct responses (this store) or all of them (PromptStore)

    def __init__(self, per_prompt: int = 1, max_age: Optional[int] = None) -> None:
        self._check(per_prompt, max_age)
        self.per_prompt = per_prompt
        self.max_age = max_age
        self.store: dict[str, list[Success]] = {}  # prompt key -> newest last
        self.totals = {"stored": 0, "grafted": 0, "expired": 0}

    @staticmethod
    def _check(per_prompt: int, max_age: Optional[int]) -> None:
        from .config import ReplayConfig

        ReplayConfig(success=per_prompt, success_max_age=max_age)  # names the key of a bad value

    def __len__(self) -> int:
        return sum(len(v) for v in self.store.values())

    def graft_into(self, groups: list[Group], step: int) -> int:
        """Grafts a stored success into every group whose rewards are all <= 0 and that has one for its
        prompt (the newest within `max_age`). Returns how many groups took one."""
        grafted = 0
        for group in groups:
            if group.n < 2 or bool((group.rewards > 0).any()):
                continue
            usable = [s for s in self.store.get(group.prompt_key, []) if self._fresh_enough(s, step)]
            if usable:
                graft(group, group.n - 1, usable[-1])
                grafted += 1
        self.totals["grafted"] += grafted
        return grafted

    def add_from(self, groups: list[Group], step: int) -> int:
        """Stores the correct responses (all of them unless `only_correct`) the groups' own policy generated
        (grafted ones are already stored); drops those past `max_age`. Returns how many were stored."""
        stored = 0
        for group in groups:
            # grafted responses (another version) are already stored
            kept = (group.rewards > 0) if self.only_correct else torch.ones(group.n, dtype=torch.bool)
            own = (kept & (group.versions == group.version)).nonzero().flatten().tolist()
            if not own:
                continue
            entry = self.store.setdefault(group.prompt_key, [])
            for i in own:
                seg = sample_segment(group, i)
                entry.append(Success(
                    version=group.version, step=step, response_ids=group.response_ids[seg].clone(),
                    response_mask=group.response_mask[seg].clone(),
                    rollout_log_probs=group.rollout_log_probs[seg].clone(), reward=float(group.rewards[i]),
                    non_tensors={k: v[i] for k, v in group.non_tensors.items() if k not in GROUP_FIELDS}))
                del entry[:-self.per_prompt]
                stored += 1
        self.totals["stored"] += stored
        for key in list(self.store) if self.max_age is not None else ():
            kept = [s for s in self.store[key] if self._fresh_enough(s, step + 1)]
            self.totals["expired"] += len(self.store[key]) - len(kept)
            if kept:
                self.store[key] = kept
            else:
                del self.store[key]
        return stored

    def _fresh_enough(self, success: Success, step: int) -> bool:
        return self.max_age is None or step - success.step <= self.max_age

    def stats(self) -> dict[str, float]:
        # 9 bytes per token, as the buffer: int32 id, bool mask, float32 log-prob
        return {"prompts": len(self.store), "responses": len(self),
                "bytes": sum(s.length * 9 for v in self.store.values() for s in v)}

    def state_dict(self) -> dict[str, Any]:
        return {"store": {k: [copy.deepcopy(vars(s)) for s in v] for k, v in self.store.items()},
                "totals": dict(self.totals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.store = {k: [Success(**copy.deepcopy(s)) for s in v] for k, v in state["store"].items()}
        self.totals = dict(state["totals"])
