"""Per-prompt replay (`replay.prompt_replay`, RePO): a returning prompt's past responses form a group of their own.

RePO (Li et al. 2025, arXiv 2506.09340) keeps each prompt's most recent responses; when the prompt comes back,
the best of them are trained beside its fresh group. Its released recipe (Qwen3-1.7B, 8 fresh + 8 replayed per
prompt, `highest_k`, `adv_norm_mode=split`) normalises the replayed responses' advantages among themselves.
Here, with fixed group size n: the store keeps the `per_prompt` most recent responses the prompt's own policy
generated; a fresh group whose prompt has at least n stored gets a history group: the n stored responses with
the highest reward (ties: newest first), each with its own behavior version and rollout log-probs, under its own
uid, so GRPO normalises it alone (RePO's "split"); with `prompt_replay_norm: mixed` it carries its fresh group's
uid as its advantage index instead, so GRPO normalises the 2n responses together (RePO's "mixed"), and a fresh
group whose own rewards are all equal is trained beside its history group when the 2n are not. With
`prompt_replay_when: zero_adv` only a fresh group whose rewards are all equal gets one (in its place); with
`prompt_replay_max_age: A` a stored response is dropped A steps after it was stored, which bounds the store where
prompts do not come back (at most A x B x n responses for B prompts a step). The step trains a history group like
a fresh group (replayed groups never displace it); it is not put in the buffer (its responses are in
the store already), and one whose rewards are all equal (all 2n, under mixed) is dropped (no advantage). The
multi-behavior objective weighs each response against its own behavior policy, as for a grafted success. Plain
PyTorch, no Ray: the buffer calls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from .success import GROUP_FIELDS, VERSION_FIELDS, Success, SuccessStore

if TYPE_CHECKING:  # the buffer imports this module
    from .buffer import Group

HISTORY_SUFFIX = ":history"  # appended to the fresh group's uid


class PromptStore(SuccessStore):
    """Per prompt, the `per_prompt` most recent responses of any reward (the success store's bookkeeping)."""

    only_correct = False

    def __init__(self, per_prompt: int, norm: str = "split", when: str = "always",
                 max_age: Optional[int] = None) -> None:
        self.norm = norm  # split | mixed (`replay.prompt_replay_norm`)
        self.when = when  # always | zero_adv (`replay.prompt_replay_when`)
        super().__init__(per_prompt, max_age)  # `replay.prompt_replay_max_age`
        self.totals["history_groups"] = 0

    def _check(self, per_prompt: int, max_age: Optional[int]) -> None:
        from .config import ReplayConfig

        # names the key of a bad value
        ReplayConfig(prompt_replay=per_prompt, prompt_replay_norm=self.norm, prompt_replay_when=self.when,
                     prompt_replay_max_age=max_age)

    def history_groups(self, fresh: list[Group]) -> list[Group]:
        """One history group per fresh group whose prompt has at least n responses stored (from earlier
        steps: call before `add_from` of this step; under `when: zero_adv` only for a fresh group whose rewards are
        all equal), each stamped with its fresh group's arrival."""
        out = []
        for group in fresh:
            stored = self.store.get(group.prompt_key, [])
            if group.n < 2 or len(stored) < group.n or (self.when == "zero_adv" and not group.zero_advantage):
                continue
            newest_first = list(reversed(stored))
            picks = sorted(newest_first, key=lambda s: -s.reward)[: group.n]  # stable: ties stay newest first
            out.append(history_group(group, picks, mixed=self.norm == "mixed"))
        self.totals["history_groups"] += len(out)
        return out


def history_group(fresh: Group, picks: list[Success], mixed: bool = False) -> Group:
    """A group of the stored responses `picks` ([n]) to the prompt of `fresh`: fresh's prompt and per-prompt
    fields, each response's own tokens, log-probs, reward, version and per-sample fields, uid `fresh.uid:history`.
    mixed: its advantage index (and the `uid` field verl's GRPO groups rows by) is `fresh.uid`."""
    from .buffer import Group

    versions = torch.tensor([s.version for s in picks], dtype=torch.int64)
    uid = fresh.uid + HISTORY_SUFFIX
    index = fresh.uid if mixed else uid
    non_tensors = {}
    for key, values in fresh.non_tensors.items():
        values = values.copy()
        for i, s in enumerate(picks):
            if key in GROUP_FIELDS:
                values[i] = index
            elif key in VERSION_FIELDS:
                values[i] = s.version
            elif key in s.non_tensors:
                values[i] = s.non_tensors[key]
        non_tensors[key] = values
    return Group(
        uid=uid,
        version=int(versions.max()),
        prompt_ids=fresh.prompt_ids.clone(),
        response_ids=torch.cat([s.response_ids for s in picks]).to(torch.int32),
        response_mask=torch.cat([s.response_mask for s in picks]).bool(),
        lengths=torch.tensor([s.length for s in picks], dtype=torch.int32),
        rollout_log_probs=torch.cat([s.rollout_log_probs for s in picks]).float(),
        rewards=torch.tensor([s.reward for s in picks], dtype=torch.float32),
        non_tensors=non_tensors,
        arrival_step=fresh.arrival_step,
        seq=fresh.seq,
        sample_versions=versions,
        advantage_uid=fresh.uid if mixed else None,
    )
