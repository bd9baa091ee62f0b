"""Replay buffer over whole GRPO groups from the K most recent behavior versions (docs/algorithm.md).

`core/step.py` calls `begin_step` (the step's candidates) before the actor update and `end_step` (insert the
fresh groups, count reuse, evict) after it; the buffer changes only in `end_step`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .config import ReplayConfig
from .group import Group
from .prompt_replay import PromptStore


@dataclass
class StepCandidates:
    """What `ReplayBuffer.begin_step` hands the step: candidates are buffered (in window) then fresh."""

    candidates: list[Group]
    fresh: list[Group]  # fresh groups that passed the zero-advantage filter
    window: list[int]  # behavior versions in the window, ascending
    warmup: bool
    dropped_zero_adv: int
    step: int = -1  # the trainer step of `begin_step`
    arrived: list[Group] = field(default_factory=list)  # every fresh group, filtered or not
    # per-prompt replay's history groups: also in `fresh` and `candidates`, never buffered
    history: list[Group] = field(default_factory=list)
    history_zero_adv: int = 0  # history groups dropped for equal rewards


@dataclass
class EvictionStats:
    window: int = 0
    max_reuse: int = 0
    max_groups: int = 0


class ReplayBuffer:
    """Whole groups from the K most recent behavior versions, with warmup, reuse and memory caps."""

    def __init__(self, config: ReplayConfig) -> None:
        self.k = config.k
        self.warmup = config.warmup
        self.filter_zero_adv = config.filter_zero_adv
        self.max_reuse: Optional[int] = config.resolved("max_reuse")
        self.max_groups = config.max_groups
        per_prompt = config.resolved("prompt_replay")  # null follows pmis: the preset's 16, or off
        self.prompts: Optional[PromptStore] = (
            PromptStore(per_prompt, config.prompt_replay_max_age) if per_prompt else None)
        self.groups: list[Group] = []  # in arrival order
        self.recent_versions: list[int] = []  # the K most recent behavior versions seen, ascending
        self.steps_done = 0
        self.next_seq = 0
        self.totals = {"inserted": 0, "dropped_zero_adv": 0, "evicted_window": 0, "evicted_max_reuse": 0, "evicted_max_groups": 0}

    def __len__(self) -> int:
        return len(self.groups)

    def begin_step(self, fresh: list[Group], step: int) -> StepCandidates:
        """Buffered groups in the window (none during warmup), then the fresh ones, then the history groups of
        per-prompt replay (those with equal rewards dropped). Stamps the fresh groups' arrival."""
        for i, group in enumerate(fresh):
            group.arrival_step = step
            group.seq = self.next_seq + i
        history = self.prompts.history_groups(fresh) if self.prompts is not None else []
        informative = [h for h in history if not h.zero_advantage]
        kept = [g for g in fresh if not (self.filter_zero_adv and g.zero_advantage)]
        dropped = len(fresh) - len(kept)
        kept += informative
        # the K most recent versions among those seen and the fresh groups', ascending
        window = sorted(set(self.recent_versions) | {g.version for g in fresh})[-self.k :]
        warmup = self.steps_done < self.warmup
        buffered = [] if warmup else [g for g in self.groups if g.version in window]
        return StepCandidates(buffered + kept, kept, window, warmup, dropped, step, list(fresh),
                              informative, len(history) - len(informative))

    def end_step(self, cands: StepCandidates, trained: list[Group]) -> EvictionStats:
        """Counts reuse of `trained`, inserts the fresh groups, evicts by window, reuse and memory cap."""
        for group in trained:
            group.times_trained += 1
        history = {id(h) for h in cands.history}  # never buffered
        new = [g for g in cands.fresh if id(g) not in history]
        self.groups.extend(new)
        self.next_seq += len(new) + cands.dropped_zero_adv
        self.totals["inserted"] += len(new)
        self.totals["dropped_zero_adv"] += cands.dropped_zero_adv
        self.recent_versions = cands.window
        self.steps_done += 1
        if self.prompts is not None:
            self.prompts.add_from(cands.arrived, cands.step)

        stats = EvictionStats()
        in_window = set(self.recent_versions)
        kept = []
        for group in self.groups:
            if group.version not in in_window:
                stats.window += 1
            elif self.max_reuse is not None and group.times_trained >= self.max_reuse:
                stats.max_reuse += 1
            else:
                # older versions are no longer a source any selected sample can come from
                group.recorded = {j: lp for j, lp in group.recorded.items() if j >= self.recent_versions[0]}
                kept.append(group)
        if self.max_groups is not None and len(kept) > self.max_groups:
            oldest_first = sorted(kept, key=lambda g: (g.version, g.seq))
            evict = {id(g) for g in oldest_first[: len(kept) - self.max_groups]}
            stats.max_groups = len(evict)
            kept = [g for g in kept if id(g) not in evict]
        self.groups = kept
        for name, count in vars(stats).items():
            self.totals[f"evicted_{name}"] += count
        return stats

    def stats(self) -> dict[str, Any]:
        """Groups and tokens per version, reuse counts and bytes held."""
        versions = sorted({g.version for g in self.groups})
        reuse = [g.times_trained for g in self.groups]
        return {
            "groups": len(self.groups),
            "tokens": sum(g.num_tokens for g in self.groups),
            "groups_per_version": {v: sum(g.version == v for g in self.groups) for v in versions},
            "tokens_per_version": {v: sum(g.num_tokens for g in self.groups if g.version == v) for v in versions},
            "reuse_mean": float(np.mean(reuse)) if reuse else 0.0,
            "reuse_max": max(reuse, default=0),
            "bytes": sum(g.nbytes() for g in self.groups),
            **({f"history_{k}": v for k, v in self.prompts.stats().items()} if self.prompts is not None else {}),
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: settings, counters and every group with its recorded log-probs."""
        return {
            "settings": {"k": self.k, "warmup": self.warmup, "filter_zero_adv": self.filter_zero_adv,
                         "max_reuse": self.max_reuse, "max_groups": self.max_groups},
            "groups": [g.state_dict() for g in self.groups],
            "recent_versions": list(self.recent_versions),
            "steps_done": self.steps_done,
            "next_seq": self.next_seq,
            "totals": dict(self.totals),
            "prompts": self.prompts.state_dict() if self.prompts is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores `state_dict()`; the buffer's own settings (from the current config) are kept."""
        self.groups = [Group.from_state_dict(g) for g in state["groups"]]
        self.recent_versions = list(state["recent_versions"])
        self.steps_done = int(state["steps_done"])
        self.next_seq = int(state["next_seq"])
        self.totals = dict(state["totals"])
        if self.prompts is None:
            if state.get("prompts") is not None:
                warnings.warn("the checkpoint's buffer has a per-prompt store, replay.prompt_replay is off now: "
                              "it is dropped")
            return
        if state.get("prompts") is None:
            raise ValueError("replay.prompt_replay is on but the checkpoint's buffer has no per-prompt store "
                             "(saved with replay.prompt_replay=false, as the group-replay preset saves it): "
                             "resume with replay.prompt_replay=false")
        self.prompts.load_state_dict(state["prompts"])
