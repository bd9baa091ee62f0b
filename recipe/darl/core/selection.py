"""Which candidate groups a step trains on (docs/algorithm.md, 'Which groups a step trains on')."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import torch

if TYPE_CHECKING:
    from .buffer import Group
    from .config import ReplayConfig


@dataclass
class Selection:
    """Result of `select_groups`: indices into the candidate list, in training order."""

    selected: list[int]
    eligible: int  # candidates whose score passed the threshold (all of them when unscored)
    budget: int  # groups the step could take: B rounded down to the group multiple
    skipped: bool  # fewer eligible groups than the workers' minimum: no update this step
    reason: str = ""


def group_multiple(n: int, ppo_mini_batch_size: int, dp_size: int) -> int:
    """Smallest number of groups the workers accept: a multiple of it must be selected.

    verl splits a step's n * groups samples into mini-batches of `ppo_mini_batch_size * n` and
    shards them over `dp_size` ranks, so the group count must divide by `ppo_mini_batch_size`
    and n * groups by `dp_size`.
    """
    for name, value in (("n", n), ("ppo_mini_batch_size", ppo_mini_batch_size), ("dp_size", dp_size)):
        if value < 1:
            raise ValueError(f"group_multiple: {name} must be >= 1, got {value}")
    per_dp = dp_size // math.gcd(dp_size, n)
    return math.lcm(ppo_mini_batch_size, per_dp)


def select_groups(
    budget: int,
    versions: torch.Tensor,
    arrival: torch.Tensor,
    scores: Optional[torch.Tensor] = None,
    max_score: Optional[float] = None,
    multiple: int = 1,
    min_multiple: Optional[int] = None,
    order: Optional[str] = None,
    reuse: Optional[torch.Tensor] = None,
    fresh: Optional[torch.Tensor] = None,
    extra: Optional[int] = None,
    priority: Optional[torch.Tensor] = None,
    first: Optional[torch.Tensor] = None,
) -> Selection:
    """Fills the group budget.

    order: "chi2" (needs scores), "newest", "least_reused" (needs reuse: [G] times trained; ties:
    newer version, then arrival), or "variance" (prioritized replay of informative groups, needs
    priority: [G], highest first; ties: least reused, newer version, arrival). None: "chi2" when scores are given, else "newest" (the first design).
    Additive composition (`extra` not None, needs fresh: [G] bool): every fresh group first, then up to
    `extra` non-fresh groups in `order`; the total rounds down to `multiple`, or up with more replayed
    groups when rounding down would drop a fresh one and enough replayed groups exist. first: [G] bool, with
    `extra` only: non-fresh groups that take the `extra` slots before the others, in arrival order (per-prompt
    replay's history groups under `prompt_replay_budget: shared`). Without `extra` (fixed budget) all
    candidates compete for `budget` in `order`.

    versions, arrival: [G] ints (behavior version, arrival order); scores: [G] chi2 group scores.
    With scores: eligible = finite score <= max_score (any finite one when max_score is None), filled by
    ascending score, ties broken by newer version then earlier arrival. Without scores (`pmis: false`):
    newest version first, then arrival order. The count is rounded down to `multiple` (a full
    mini-batch); with fewer eligible groups than that, to `min_multiple` (what the workers accept as
    one smaller mini-batch; None: no smaller batch is accepted).
    """
    if budget < 1:
        raise ValueError(f"select_groups: budget must be >= 1, got {budget}")
    if multiple < 1:
        raise ValueError(f"select_groups: multiple must be >= 1, got {multiple}")
    if min_multiple is not None and not 1 <= min_multiple <= multiple:
        raise ValueError(f"select_groups: min_multiple must be in [1, multiple={multiple}], got {min_multiple}")
    if max_score is not None and not max_score > 0:
        raise ValueError(f"select_groups: max_score must be > 0, got {max_score}")
    num = versions.shape[0]
    if arrival.shape != (num,) or (scores is not None and scores.shape != (num,)):
        raise ValueError("select_groups: versions, arrival and scores must all be [G]")

    if order is None:
        order = "newest" if scores is None else "chi2"
    if order not in ("chi2", "newest", "least_reused", "variance"):
        raise ValueError(f"select_groups: order must be 'chi2', 'newest', 'least_reused' or 'variance', got {order!r}")
    if order == "variance" and (priority is None or priority.shape != (num,) or reuse is None or reuse.shape != (num,)):
        raise ValueError("select_groups: order 'variance' needs priority: [G] and reuse: [G]")
    if order == "chi2" and scores is None:
        raise ValueError("select_groups: order 'chi2' needs scores")
    if order == "least_reused" and (reuse is None or reuse.shape != (num,)):
        raise ValueError("select_groups: order 'least_reused' needs reuse: [G]")
    if max_score is not None and order != "chi2":
        raise ValueError("select_groups: max_score needs order 'chi2' (scores)")
    if extra is not None and (extra < 0 or fresh is None or fresh.shape != (num,)):
        raise ValueError("select_groups: additive composition needs extra >= 0 and fresh: [G] bool")
    if first is not None and (extra is None or first.shape != (num,) or bool((first.bool() & fresh.bool()).any())):
        raise ValueError("select_groups: first needs additive composition (extra) and is [G] bool, never fresh")

    keys_v = versions.tolist()
    keys_a = arrival.tolist()
    if order == "newest":
        ranked = sorted(range(num), key=lambda i: (-keys_v[i], keys_a[i]))
    elif order == "least_reused":
        keys_r = reuse.tolist()
        ranked = sorted(range(num), key=lambda i: (keys_r[i], -keys_v[i], keys_a[i]))
    elif order == "variance":
        keys_p, keys_r = priority.tolist(), reuse.tolist()
        ranked = sorted(range(num), key=lambda i: (-keys_p[i], keys_r[i], -keys_v[i], keys_a[i]))
    else:
        keys_s = scores.tolist()
        limit = math.inf if max_score is None else max_score
        ranked = sorted((i for i in range(num) if math.isfinite(keys_s[i]) and keys_s[i] <= limit),
                        key=lambda i: (keys_s[i], -keys_v[i], keys_a[i]))
    cap = (budget // multiple) * multiple
    small = cap  # what a smaller-than-one-mini-batch step may take
    if extra is not None:
        is_fresh = fresh.bool().tolist()
        new = sorted((i for i in range(num) if is_fresh[i]), key=lambda i: keys_a[i])
        replay = [i for i in ranked if not is_fresh[i]]
        if first is not None:
            is_first = first.bool().tolist()
            # eligible ones only (chi2's threshold applies to them too)
            replay = sorted((i for i in replay if is_first[i]), key=lambda i: keys_a[i]) + [
                i for i in replay if not is_first[i]]
        wanted = len(new) + min(extra, len(replay))
        cap = (wanted // multiple) * multiple
        up = -(-len(new) // multiple) * multiple
        if cap < len(new) and len(new) + len(replay) >= up:
            cap = up
        ranked = new + replay
        small = wanted
    take = (min(cap, len(ranked)) // multiple) * multiple
    if take == 0 and min_multiple is not None:
        take = (min(small, len(ranked)) // min_multiple) * min_multiple
    if take == 0:
        reason = f"{len(ranked)} eligible group(s), the workers need a multiple of {min_multiple or multiple}"
        return Selection([], len(ranked), cap, True, reason)
    return Selection(ranked[:take], len(ranked), cap, False)


def reward_variance(group: "Group") -> float:
    """Priority of a group under `order: variance`: the population variance of its rewards (for 0/1
    rewards p(1 - p), largest for groups solved half the time; 0 for groups with zero advantage)."""
    return float(group.rewards.double().var(unbiased=False)) if group.n > 1 else 0.0


def select_for_step(
    groups: "list[Group]",
    fresh: "list[Group]",
    replay: "ReplayConfig",
    budget: int,
    multiple: int,
    min_multiple: Optional[int],
    scores: Optional[list[float]] = None,
    history: Sequence["Group"] = (),
) -> Selection:
    """The step's selection as both trainers and the study harness make it: `select_groups` with the
    order, the additive ratio and the priorities `replay` resolves to, over `groups` (candidates;
    `fresh` are this step's, history groups included). history: the step's history groups (per-prompt
    replay); under `prompt_replay_budget: shared` they leave the fresh side and take the replay budget
    first. scores: chi2 group scores, needed only by order chi2."""
    order = replay.resolved("order")
    ratio = replay.resolved("ratio")
    shared = {id(g) for g in history} if replay.prompt_replay_budget == "shared" else set()
    fresh_ids = {id(g) for g in fresh} - shared
    return select_groups(
        budget=budget,
        versions=torch.tensor([g.version for g in groups]),
        arrival=torch.tensor([g.seq for g in groups]),
        scores=torch.tensor(scores, dtype=torch.float64) if order == "chi2" else None,
        max_score=replay.max_score,
        multiple=multiple,
        min_multiple=min_multiple,
        order=order,
        reuse=torch.tensor([g.times_trained for g in groups]),
        fresh=torch.tensor([id(g) in fresh_ids for g in groups], dtype=torch.bool) if ratio is not None else None,
        extra=int(round(ratio * budget)) if ratio is not None else None,
        priority=torch.tensor([reward_variance(g) for g in groups]) if order == "variance" else None,
        first=torch.tensor([id(g) in shared for g in groups], dtype=torch.bool) if shared else None,
    )
