"""Replay buffer over whole GRPO groups from the K most recent behavior versions (docs/algorithm.md, 'Replay buffer').

A step uses it in two calls around the actor update:

    cands = buffer.begin_step(fresh_groups, step)   # window, warmup, zero-advantage filter
    ... recompute old log-probs of cands.candidates, record them, score, select, train ...
    buffer.end_step(cands, trained_groups)         # insert fresh, count reuse, evict

Groups are stored unpadded on CPU: int32 token ids, bool response mask and float32 log-probs,
the prompt once per group, so a stored response token costs 9 bytes plus 4 per recorded version.
"""

from __future__ import annotations

import copy
import hashlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from .config import ReplayConfig
from .packing import pack_rows, unpack_rows
from .prompt_replay import PromptStore
from .success import SuccessStore


@dataclass(eq=False)  # identity semantics: two groups are never "equal" by content
class Group:
    """One prompt's n responses: the unit of storage, selection and eviction.

    T = sum(lengths) response tokens packed end to end.
    """

    uid: str
    version: int  # behavior version v: the weights version that generated it
    prompt_ids: torch.Tensor  # [P] int32, unpadded; shared by the n responses
    response_ids: torch.Tensor  # [T] int32
    response_mask: torch.Tensor  # [T] bool: tokens the loss counts (verl's response_mask)
    lengths: torch.Tensor  # [n] int32: response lengths (attention span, not mask sum)
    rollout_log_probs: torch.Tensor  # [T] float32: log mu_v of each token
    rewards: torch.Tensor  # [n] float32: sequence-level scores
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)  # per-sample fields, arrays [n]
    recorded: dict[int, torch.Tensor] = field(default_factory=dict)  # version j -> [T] float32 log pi_old at step j
    arrival_step: int = -1
    seq: int = -1  # arrival order across the run, set by the buffer
    times_trained: int = 0
    score: Optional[float] = None  # last chi2 group score (`rescore: lazy` reuses it)
    # [n] int64 behavior version of each sample when they differ (a grafted success, `replay.success`);
    # None: every sample has `version`
    sample_versions: Optional[torch.Tensor] = None
    # the GRPO group its advantages are normalised in, when it is not its own (`prompt_replay_norm: mixed`: a
    # history group shares its fresh group's); None: `uid`
    advantage_uid: Optional[str] = None

    @property
    def n(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def versions(self) -> torch.Tensor:
        """[n] int64 behavior version of each sample (the multi-behavior objective's sources)."""
        if self.sample_versions is None:
            return torch.full((self.n,), self.version, dtype=torch.int64)
        return self.sample_versions

    @property
    def prompt_key(self) -> str:
        """The prompt's identity across steps and epochs (a digest of its token ids)."""
        return hashlib.sha1(self.prompt_ids.to(torch.int32).numpy().tobytes()).hexdigest()

    @property
    def num_tokens(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def advantage_index(self) -> str:
        """The index GRPO normalises this group's advantages under (verl's `uid`)."""
        return self.uid if self.advantage_uid is None else self.advantage_uid

    @property
    def zero_advantage(self) -> bool:
        """All rewards equal: GRPO gives every response advantage 0 (a group of one never is)."""
        return self.n > 1 and bool((self.rewards == self.rewards[0]).all())

    @classmethod
    def from_padded(
        cls,
        uid: str,
        version: int,
        prompt_ids: torch.Tensor,
        prompt_length: int,
        responses: torch.Tensor,
        response_lengths: torch.Tensor,
        response_mask: torch.Tensor,
        rollout_log_probs: torch.Tensor,
        rewards: torch.Tensor,
        non_tensors: Optional[dict[str, np.ndarray]] = None,
    ) -> "Group":
        """Packs one group from verl's padded layout.

        prompt_ids: [P_pad] left-padded prompt of the group (its last `prompt_length` entries are real);
        responses, response_mask, rollout_log_probs: [n, L] right-padded; response_lengths, rewards: [n].
        """
        n, width = responses.shape
        for name, t in (("response_mask", response_mask), ("rollout_log_probs", rollout_log_probs)):
            if tuple(t.shape) != (n, width):
                raise ValueError(f"Group.from_padded: {name} has shape {tuple(t.shape)}, expected {(n, width)}")
        for name, t in (("response_lengths", response_lengths), ("rewards", rewards)):
            if tuple(t.shape) != (n,):
                raise ValueError(f"Group.from_padded: {name} has shape {tuple(t.shape)}, expected {(n,)}")
        lengths = response_lengths.to(torch.int32).cpu()
        return cls(
            uid=str(uid),
            version=int(version),
            prompt_ids=prompt_ids[prompt_ids.shape[0] - prompt_length :].to(torch.int32).cpu().clone(),
            response_ids=pack_rows(responses.cpu(), lengths).to(torch.int32),
            response_mask=pack_rows(response_mask.cpu(), lengths).bool(),
            lengths=lengths.clone(),
            rollout_log_probs=pack_rows(rollout_log_probs.detach().cpu(), lengths).float(),
            rewards=rewards.detach().float().cpu().clone(),
            non_tensors={k: np.asarray(v, dtype=object) for k, v in (non_tensors or {}).items()},
        )

    def padded(self, name: str, width: int, pad_value: float | int = 0) -> torch.Tensor:
        """A packed per-token field (`response_ids`, `response_mask`, `rollout_log_probs`) as [n, width]."""
        return unpack_rows(getattr(self, name), self.lengths, width, pad_value)

    def record(self, version: int, log_probs: torch.Tensor) -> None:
        """Stores log pi_old of step `version` for the group's tokens; log_probs: [n, L] padded or [T] packed."""
        if log_probs.dim() == 2:
            log_probs = pack_rows(log_probs.detach().cpu(), self.lengths)
        if tuple(log_probs.shape) != (self.num_tokens,):
            raise ValueError(f"Group.record: expected {self.num_tokens} token log-probs, got shape {tuple(log_probs.shape)}")
        self.recorded[int(version)] = log_probs.detach().float().cpu().clone()

    def nbytes(self) -> int:
        """Bytes of the stored tensors (the non-tensor fields are not counted)."""
        tensors = [self.prompt_ids, self.response_ids, self.response_mask, self.lengths, self.rollout_log_probs, self.rewards]
        tensors += list(self.recorded.values())
        return sum(t.element_size() * t.numel() for t in tensors)


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
    grafted: int = 0  # fresh groups that took a stored success (`replay.success`)
    # history groups (`replay.prompt_replay`): in `fresh` and `candidates` (trained like fresh ones), never buffered
    history: list[Group] = field(default_factory=list)
    history_zero_adv: int = 0  # history groups dropped for equal rewards
    # fresh groups with equal rewards trained only for their history group (`prompt_replay_norm: mixed`); not buffered
    history_partners: list[Group] = field(default_factory=list)


@dataclass
class EvictionStats:
    window: int = 0
    max_reuse: int = 0
    max_groups: int = 0


class ReplayBuffer:
    """Whole groups from the K most recent behavior versions, with warmup, reuse and memory caps."""

    def __init__(
        self,
        k: int,
        warmup: int = 0,
        filter_zero_adv: bool = True,
        max_reuse: Optional[int] = None,
        max_groups: Optional[int] = None,
        success: int | bool = False,
        success_max_age: Optional[int] = None,
        prompt_replay: int | bool = False,
        prompt_replay_norm: str = "split",
        prompt_replay_when: str = "always",
        prompt_replay_max_age: Optional[int] = None,
    ) -> None:
        # ReplayConfig checks every value and names the key of any bad one
        ReplayConfig(k=k, warmup=warmup, filter_zero_adv=filter_zero_adv, max_reuse=max_reuse, max_groups=max_groups,
                     success=success, success_max_age=success_max_age, prompt_replay=prompt_replay,
                     prompt_replay_norm=prompt_replay_norm, prompt_replay_when=prompt_replay_when,
                     prompt_replay_max_age=prompt_replay_max_age)
        self.k = k
        self.warmup = warmup
        self.filter_zero_adv = filter_zero_adv
        self.max_reuse = max_reuse
        self.max_groups = max_groups
        self.successes: Optional[SuccessStore] = SuccessStore(success, success_max_age) if success else None
        self.prompts: Optional[PromptStore] = (
            PromptStore(prompt_replay, prompt_replay_norm, prompt_replay_when, prompt_replay_max_age)
            if prompt_replay else None)
        self.groups: list[Group] = []  # in arrival order
        self.recent_versions: list[int] = []  # the K most recent behavior versions seen, ascending
        self.steps_done = 0
        self.next_seq = 0
        self.totals = {"inserted": 0, "dropped_zero_adv": 0, "evicted_window": 0, "evicted_max_reuse": 0, "evicted_max_groups": 0}

    @classmethod
    def from_config(cls, config: ReplayConfig) -> "ReplayBuffer":
        per_prompt = config.resolved("prompt_replay")  # null follows pmis: the preset's 16, or off
        return cls(config.k, config.warmup, config.filter_zero_adv, config.resolved("max_reuse"), config.max_groups,
                   config.success, config.success_max_age, per_prompt or False, config.prompt_replay_norm,
                   config.resolved("prompt_replay_when") if per_prompt else "always", config.prompt_replay_max_age)

    def __len__(self) -> int:
        return len(self.groups)

    @property
    def in_warmup(self) -> bool:
        return self.steps_done < self.warmup

    def window_with(self, versions: list[int]) -> list[int]:
        """The K most recent versions among those seen and `versions`, ascending."""
        return sorted(set(self.recent_versions) | set(versions))[-self.k :]

    def begin_step(self, fresh: list[Group], step: int) -> StepCandidates:
        """Candidates of a step: buffered groups in the window (none during warmup) then the fresh ones.

        Stamps the fresh groups' arrival; with success replay, first grafts stored successes into fresh
        groups that have none (so they pass the zero-advantage filter). The buffer itself changes only
        in `end_step`. With per-prompt replay, fresh groups whose prompt came back bring a history group
        (core/prompt_replay.py), listed after the fresh ones; one with equal rewards is dropped.
        """
        grafted = self.successes.graft_into(fresh, step) if self.successes is not None else 0
        for i, group in enumerate(fresh):
            group.arrival_step = step
            group.seq = self.next_seq + i
        history = self.prompts.history_groups(fresh) if self.prompts is not None else []
        if self.prompts is not None and self.prompts.norm == "mixed":
            # one normalisation over 2n: a pair is informative unless all 2n rewards are equal
            by_uid = {g.uid: g for g in fresh}
            informative = [h for h in history if not _all_equal(h.rewards, by_uid[h.advantage_index].rewards)]
            partnered = {h.advantage_index for h in informative}
        else:
            informative = [h for h in history if not h.zero_advantage]
            partnered = set()
        kept: list[Group] = []
        partners: list[Group] = []
        dropped = 0
        for group in fresh:
            if not (self.filter_zero_adv and group.zero_advantage):
                kept.append(group)
            elif group.uid in partnered:
                kept.append(group)
                partners.append(group)
            else:
                dropped += 1
        kept += informative
        window = self.window_with([g.version for g in fresh])
        in_window = set(window)
        buffered = [] if self.in_warmup else [g for g in self.groups if g.version in in_window]
        return StepCandidates(buffered + kept, kept, window, self.in_warmup, dropped, step, list(fresh), grafted,
                              informative, len(history) - len(informative), partners)

    def end_step(self, cands: StepCandidates, trained: list[Group]) -> EvictionStats:
        """Counts reuse of `trained`, inserts the fresh groups, evicts by window, reuse and memory cap."""
        for group in trained:
            group.times_trained += 1
        # history groups are never buffered; nor are the equal-reward fresh groups trained only beside theirs
        skip = {id(h) for h in cands.history} | {id(g) for g in cands.history_partners}
        new = [g for g in cands.fresh if id(g) not in skip]
        self.groups.extend(new)
        self.next_seq += len(new) + len(cands.history_partners) + cands.dropped_zero_adv
        self.totals["inserted"] += len(new)
        self.totals["dropped_zero_adv"] += cands.dropped_zero_adv
        self.recent_versions = cands.window
        self.steps_done += 1
        if self.successes is not None:
            self.successes.add_from(cands.arrived, cands.step)
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
                for version in [j for j in group.recorded if j < self.recent_versions[0]]:
                    del group.recorded[version]  # no longer a source any selected sample can come from
                kept.append(group)
        if self.max_groups is not None and len(kept) > self.max_groups:
            oldest_first = sorted(kept, key=lambda g: (g.version, g.seq))
            evict = {id(g) for g in oldest_first[: len(kept) - self.max_groups]}
            stats.max_groups = len(evict)
            kept = [g for g in kept if id(g) not in evict]
        self.groups = kept
        self.totals["evicted_window"] += stats.window
        self.totals["evicted_max_reuse"] += stats.max_reuse
        self.totals["evicted_max_groups"] += stats.max_groups
        return stats

    def stats(self) -> dict[str, Any]:
        """Groups and tokens per version, reuse counts and bytes held."""
        per_version: dict[int, list[int]] = {}
        for g in self.groups:
            entry = per_version.setdefault(g.version, [0, 0])
            entry[0] += 1
            entry[1] += g.num_tokens
        reuse = [g.times_trained for g in self.groups]
        return {
            "groups": len(self.groups),
            "tokens": sum(v[1] for v in per_version.values()),
            "groups_per_version": {v: c[0] for v, c in sorted(per_version.items())},
            "tokens_per_version": {v: c[1] for v, c in sorted(per_version.items())},
            "reuse_mean": float(np.mean(reuse)) if reuse else 0.0,
            "reuse_max": max(reuse, default=0),
            "bytes": sum(g.nbytes() for g in self.groups),
            **({f"success_{k}": v for k, v in self.successes.stats().items()} if self.successes is not None else {}),
            **({f"history_{k}": v for k, v in self.prompts.stats().items()} if self.prompts is not None else {}),
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: settings, counters and every group with its recorded log-probs."""
        return {
            "settings": {"k": self.k, "warmup": self.warmup, "filter_zero_adv": self.filter_zero_adv,
                         "max_reuse": self.max_reuse, "max_groups": self.max_groups},
            "groups": [copy.deepcopy(vars(g)) for g in self.groups],
            "recent_versions": list(self.recent_versions),
            "steps_done": self.steps_done,
            "next_seq": self.next_seq,
            "totals": dict(self.totals),
            "successes": self.successes.state_dict() if self.successes is not None else None,
            "prompts": self.prompts.state_dict() if self.prompts is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores `state_dict()`; the buffer's own settings (from the current config) are kept."""
        self.groups = [Group(**copy.deepcopy(g)) for g in state["groups"]]
        self.recent_versions = list(state["recent_versions"])
        self.steps_done = int(state["steps_done"])
        self.next_seq = int(state["next_seq"])
        self.totals = dict(state["totals"])
        for store, name, key in ((self.successes, "successes", "success"), (self.prompts, "prompts", "prompt_replay")):
            if store is None:
                if state.get(name) is not None:
                    warnings.warn(f"the checkpoint's buffer has a {name} store, replay.{key} is off now: it is dropped")
                continue
            if state.get(name) is None:
                raise ValueError(f"replay.{key} is on but the checkpoint's buffer has no {name} store "
                                 f"(saved with replay.{key}=false, as the group-replay preset saves it): "
                                 f"resume with replay.{key}=false")
            store.load_state_dict(state[name])


def _all_equal(*rewards: torch.Tensor) -> bool:
    joined = torch.cat(rewards)
    return bool((joined == joined[0]).all())


def gather_recorded(groups: list[Group], width: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Recorded proximal log-probs of `groups` (samples in group order) per version j.

    Returns j -> (known [B] bool, log_probs [B, width]), the `recorded` input of `weights.batch_weights`.
    """
    versions = sorted({j for g in groups for j in g.recorded})
    sizes = [g.n for g in groups]
    out = {}
    for j in versions:
        known = torch.cat([torch.full((g.n,), j in g.recorded, dtype=torch.bool) for g in groups])
        rows = [unpack_rows(g.recorded[j], g.lengths, width) if j in g.recorded else torch.zeros(g.n, width) for g in groups]
        out[j] = (known, torch.cat(rows) if rows else torch.zeros(sum(sizes), width))
    return out
