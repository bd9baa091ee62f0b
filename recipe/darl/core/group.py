"""A GRPO group: one prompt's n responses, the unit the buffer stores, the step selects and the loss weighs.
Stored unpadded on CPU, the prompt once per group: a response token costs 9 bytes plus 4 per recorded version."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from .packing import pack_rows, unpack_rows


@dataclass(eq=False)  # identity semantics: two groups are never "equal" by content
class Group:
    """One prompt's n responses, T = sum(lengths) tokens packed end to end."""

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
    # [n] int64 per-sample behavior versions (a history group of per-prompt replay); None: all are `version`
    sample_versions: Optional[torch.Tensor] = None

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
    def zero_advantage(self) -> bool:
        """All rewards equal: GRPO gives every response advantage 0 (a group of one never is)."""
        return self.n > 1 and bool((self.rewards == self.rewards[0]).all())

    @classmethod
    def from_padded(cls, uid: str, version: int, prompt_ids: torch.Tensor, prompt_length: int, responses: torch.Tensor,
                    response_lengths: torch.Tensor, response_mask: torch.Tensor, rollout_log_probs: torch.Tensor,
                    rewards: torch.Tensor, non_tensors: Optional[dict[str, np.ndarray]] = None) -> "Group":
        """Packs one group from verl's padded layout. prompt_ids: [P_pad] left-padded (the last `prompt_length` are
        real); responses, response_mask, rollout_log_probs: [n, L] right-padded; response_lengths, rewards: [n]."""
        n, width = responses.shape
        for name, t in (("response_mask", response_mask), ("rollout_log_probs", rollout_log_probs)):
            if tuple(t.shape) != (n, width):
                raise ValueError(f"Group.from_padded: {name} has shape {tuple(t.shape)}, expected {(n, width)}")
        for name, t in (("response_lengths", response_lengths), ("rewards", rewards)):
            if tuple(t.shape) != (n,):
                raise ValueError(f"Group.from_padded: {name} has shape {tuple(t.shape)}, expected {(n,)}")
        lengths = response_lengths.to(torch.int32).cpu()
        return cls(
            uid=str(uid), version=int(version),
            prompt_ids=prompt_ids[prompt_ids.shape[0] - prompt_length :].to(torch.int32).cpu().clone(),
            response_ids=pack_rows(responses.cpu(), lengths).to(torch.int32),
            response_mask=pack_rows(response_mask.cpu(), lengths).bool(), lengths=lengths.clone(),
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

    def state_dict(self) -> dict[str, Any]:
        return copy.deepcopy(vars(self))

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "Group":
        """Restores `state_dict()`; fields of earlier releases that no field holds any more are dropped."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: copy.deepcopy(v) for k, v in state.items() if k in known})

    def nbytes(self) -> int:
        """Bytes of the stored tensors (the non-tensor fields are not counted)."""
        tensors = [self.prompt_ids, self.response_ids, self.response_mask, self.lengths, self.rollout_log_probs, self.rewards]
        tensors += list(self.recorded.values())
        return sum(t.element_size() * t.numel() for t in tensors)


def gather_recorded(groups: list[Group], width: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Recorded log-probs of `groups` (samples in order): j -> (known [B] bool, log_probs [B, width]), the
    `recorded` input of `weights.batch_weights`."""
    versions = sorted({j for g in groups for j in g.recorded})
    out = {}
    for j in versions:
        known = torch.cat([torch.full((g.n,), j in g.recorded, dtype=torch.bool) for g in groups])
        rows = [unpack_rows(g.recorded[j], g.lengths, width) if j in g.recorded else torch.zeros(g.n, width) for g in groups]
        out[j] = (known, torch.cat(rows))
    return out
