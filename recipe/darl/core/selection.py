"""Which candidate groups a step trains on (docs/algorithm.md, 'Which groups a step trains on')."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from .config import ReplayConfig
    from .group import Group


@dataclass
class Selection:
    """Result of `select_groups`: indices into the candidate list, in training order."""

    selected: list[int]
    eligible: int  # candidates the selection could take
    budget: int  # groups the step could take: B rounded down to the group multiple
    skipped: bool  # fewer eligible groups than the workers' minimum: no update this step
    reason: str = ""


def group_multiple(n: int, ppo_mini_batch_size: int, dp_size: int) -> int:
    """The group count must be a multiple of this: verl cuts n * groups samples into mini-batches of
    `ppo_mini_batch_size * n` and shards them over `dp_size` ranks."""
    for name, value in (("n", n), ("ppo_mini_batch_size", ppo_mini_batch_size), ("dp_size", dp_size)):
        if value < 1:
            raise ValueError(f"group_multiple: {name} must be >= 1, got {value}")
    per_dp = dp_size // math.gcd(dp_size, n)
    return math.lcm(ppo_mini_batch_size, per_dp)


def select_groups(budget: int, versions: torch.Tensor, arrival: torch.Tensor, multiple: int = 1,
                  min_multiple: Optional[int] = None, order: str = "newest", reuse: Optional[torch.Tensor] = None,
                  fresh: Optional[torch.Tensor] = None, extra: Optional[int] = None) -> Selection:
    """Fills the group budget. versions, arrival: [G]. order: "newest" (version, then arrival) or "least_reused"
    (reuse: [G] times trained; ties: newer version, then arrival). With `extra` (fresh: [G] bool): every fresh
    group, then up to `extra` others in `order`, rounded up with more replayed groups when rounding down would drop
    a fresh one; else all compete for `budget`. The count rounds down to `multiple`, or when that is 0 to
    `min_multiple` (one smaller mini-batch; None: not accepted)."""
    if budget < 1:
        raise ValueError(f"select_groups: budget must be >= 1, got {budget}")
    if multiple < 1:
        raise ValueError(f"select_groups: multiple must be >= 1, got {multiple}")
    if min_multiple is not None and not 1 <= min_multiple <= multiple:
        raise ValueError(f"select_groups: min_multiple must be in [1, multiple={multiple}], got {min_multiple}")
    num = versions.shape[0]
    if arrival.shape != (num,):
        raise ValueError("select_groups: versions and arrival must both be [G]")
    if order not in ("newest", "least_reused"):
        raise ValueError(f"select_groups: order must be 'newest' or 'least_reused', got {order!r}")
    if order == "least_reused" and (reuse is None or reuse.shape != (num,)):
        raise ValueError("select_groups: order 'least_reused' needs reuse: [G]")
    if extra is not None and (extra < 0 or fresh is None or fresh.shape != (num,)):
        raise ValueError("select_groups: additive composition needs extra >= 0 and fresh: [G] bool")

    keys_v = versions.tolist()
    keys_a = arrival.tolist()
    if order == "newest":
        ranked = sorted(range(num), key=lambda i: (-keys_v[i], keys_a[i]))
    else:
        keys_r = reuse.tolist()
        ranked = sorted(range(num), key=lambda i: (keys_r[i], -keys_v[i], keys_a[i]))
    cap = (budget // multiple) * multiple
    small = cap  # what a smaller-than-one-mini-batch step may take
    if extra is not None:
        is_fresh = fresh.bool().tolist()
        new = sorted((i for i in range(num) if is_fresh[i]), key=lambda i: keys_a[i])
        replay = [i for i in ranked if not is_fresh[i]]
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


def select_for_step(groups: "list[Group]", fresh: "list[Group]", replay: "ReplayConfig", budget: int, multiple: int,
                    min_multiple: Optional[int]) -> Selection:
    """`select_groups` over the candidates `groups` with `replay`'s order and ratio (`fresh`: this step's)."""
    ratio = replay.resolved("ratio")
    fresh_ids = {id(g) for g in fresh}
    return select_groups(
        budget=budget, versions=torch.tensor([g.version for g in groups]),
        arrival=torch.tensor([g.seq for g in groups]), multiple=multiple, min_multiple=min_multiple,
        order=replay.resolved("order"), reuse=torch.tensor([g.times_trained for g in groups]),
        fresh=torch.tensor([id(g) in fresh_ids for g in groups], dtype=torch.bool) if ratio is not None else None,
        extra=int(round(ratio * budget)) if ratio is not None else None,
    )
