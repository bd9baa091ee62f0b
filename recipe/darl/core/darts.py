"""DARTS (PKU-DAIR/DARTS, ICML'26; docs/darts.md) in plain Python: r >= n responses per prompt, n kept.

The kept ones are the n - L that finish first and the L that finish last; with L = 0 the rest are aborted once n
have finished, which cuts the group's long tail. r_i adapts to an EMA of each prompt's response-length spread.
By default every prompt gets r = ceil(1.5 n) with L = 0 (the released streaming trainer's fixed path); with
`adaptive` the defaults are that trainer's adaptive path: r_i in [floor(1.25 n), 2n], mean 1.5 n,
L_i = (2n - r_i) // 2, and r = 1.5 n with L = 0 for the first 10 steps while the EMA fills.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from .config import is_int, is_number


VARIANTS = ("stream_dapo", "stream")  # the released trainers whose rules the null keys follow


@dataclass
class DartsConfig:
    """Every key of `rollout_shaping.*`; n is `actor_rollout_ref.rollout.n`. Build with `from_dict`."""

    enable: bool = False
    responses: Optional[int] = None  # r per prompt without adaptive; null: ceil(mean_ratio * n)
    adaptive: bool = False  # per-prompt r_i from the length-spread EMA, mean r_i = mean_ratio * n
    mean_ratio: float = 1.5
    min_responses: Optional[int] = None  # bound of r_i; null: floor(1.25 n)
    max_responses: Optional[int] = None  # bound of r_i; null: 2n
    keep_last: Optional[int] = None  # L: kept from the end of the finishing order; 0 aborts; null: (max - r) // 2
    warmup_steps: int = 10  # adaptive: steps with r = mean_ratio * n and L = 0 before the EMA sizes prompts
    ema_alpha: float = 0.3
    # which released trainer the null keys follow: "stream_dapo" (ray_trainer_stream_dapo.py: adaptive r_i with
    # L_i = (max - r_i) // 2; fixed r aborts once n finish, L = 0) or "stream" (ray_trainer_darts.py, the script the
    # released README runs: r = floor(1.25 n) for every prompt, L = min((max - r) // 2, 1), no warm-up)
    variant: str = "stream_dapo"

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], n: int) -> "DartsConfig":
        problems = cls.problems_of(values, n)
        if problems:
            raise ValueError("invalid rollout_shaping config:\n  " + "\n  ".join(problems))
        return cls(**dict(values))

    @classmethod
    def problems_of(cls, values: Mapping[str, Any], n: int) -> list[str]:
        """Every problem of a mapping of `rollout_shaping` keys for groups of n responses, each naming its key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        out = [f"unknown rollout_shaping key(s): {', '.join('rollout_shaping.' + u for u in unknown)}; known keys: "
               f"{', '.join(sorted(known))}"] if unknown else []
        c = cls(**{k: v for k, v in values.items() if k in known})
        for name in ("enable", "adaptive"):
            if not isinstance(getattr(c, name), bool):
                out.append(f"rollout_shaping.{name} must be a bool, got {getattr(c, name)!r}")
        if c.responses is not None and (not is_int(c.responses) or c.responses < n):
            out.append(f"rollout_shaping.responses must be null or an integer >= actor_rollout_ref.rollout.n={n}, "
                       f"got {c.responses!r}")
        if c.keep_last is not None and (not is_int(c.keep_last) or not 0 <= c.keep_last < n):
            out.append(f"rollout_shaping.keep_last (L) must be null or an integer in [0, rollout.n={n}), "
                       f"got {c.keep_last!r}")
        if not is_int(c.warmup_steps) or c.warmup_steps < 0:
            out.append(f"rollout_shaping.warmup_steps must be an integer >= 0, got {c.warmup_steps!r}")
        if not is_number(c.ema_alpha) or not 0 < c.ema_alpha <= 1:  # rejects nan and inf too
            out.append(f"rollout_shaping.ema_alpha must be in (0, 1], got {c.ema_alpha!r}")
        if not is_number(c.mean_ratio) or not 1 <= c.mean_ratio < math.inf:  # rejects nan too
            out.append(f"rollout_shaping.mean_ratio must be a number >= 1, got {c.mean_ratio!r}")
        for name in ("min_responses", "max_responses"):
            value = getattr(c, name)
            if value is not None and (not is_int(value) or value < n):
                out.append(f"rollout_shaping.{name} must be null or an integer >= rollout.n={n}, got {value!r}")
        if out:
            return out
        low, high = c.bounds(n)
        if low > high:
            out.append(f"rollout_shaping.min_responses={low} exceeds rollout_shaping.max_responses={high}")
        elif c.adaptive and not low <= c.mean_ratio * n <= high:
            out.append(f"rollout_shaping.mean_ratio={c.mean_ratio} asks for {c.mean_ratio * n:g} responses per prompt "
                       f"on average, outside [min_responses, max_responses] = [{low}, {high}]")
        if c.variant not in VARIANTS:
            out.append(f"rollout_shaping.variant must be one of {', '.join(VARIANTS)}, got {c.variant!r}")
        elif c.variant == "stream" and c.adaptive:
            out.append("rollout_shaping.variant=stream has no adaptive redundancy (ray_trainer_darts.py gives every "
                       "prompt the same r): set rollout_shaping.adaptive=false or variant=stream_dapo")
        if c.adaptive and c.responses is not None:
            out.append("rollout_shaping.responses is set with rollout_shaping.adaptive=true: adaptive redundancy sizes "
                       "each prompt from mean_ratio; drop one of them")
        return out

    def bounds(self, n: int) -> tuple[int, int]:
        return (self.min_responses or math.floor(1.25 * n), self.max_responses or 2 * n)

    def mean_responses(self, n: int) -> int:
        """ceil(mean_ratio * n): r of the warm-up, and of every prompt when `responses` is null."""
        return math.ceil(self.mean_ratio * n - 1e-9)

    def fixed_responses(self, n: int) -> int:
        """r of every prompt without adaptive redundancy: `responses`, else the variant's (ceil(mean_ratio * n), or
        floor(1.25 n) for "stream")."""
        if self.responses is not None:
            return self.responses
        return self.bounds(n)[0] if self.variant == "stream" else self.mean_responses(n)

    def keep_last_for(self, r: int, n: int) -> int:
        """L for r responses keeping n: the configured L, else the released rule of the variant, capped at n - 1:
        adaptive "stream_dapo" (max_responses - r) // 2 (only groups within one of the upper bound abort their tail),
        fixed "stream_dapo" 0 (its fixed paths abort once n finish), "stream" min((max_responses - r) // 2, 1)."""
        if self.keep_last is not None:
            return self.keep_last
        rule = (self.bounds(n)[1] - r) // 2
        if self.variant == "stream":
            rule = min(rule, 1)
        elif not self.adaptive:
            rule = 0
        return max(0, min(rule, n - 1))


def split_counts(total: int, sizes: Sequence[int]) -> list[int]:
    """`total` split over parts in proportion to their sizes (largest remainder; ties: the first part)."""
    whole = sum(sizes)
    exact = [total * s / whole for s in sizes]
    counts = [math.floor(e) for e in exact]
    order = sorted(range(len(sizes)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def normalise(spreads: Sequence[float]) -> list[float]:
    """DARTS' v' = (v - min + 1) / (max - min), all 1 when equal; v' > 0 gives every prompt a claim on extras."""
    if not spreads:
        return []
    low, high = min(spreads), max(spreads)
    if high - low <= 1e-12:
        return [1.0] * len(spreads)
    return [(v - low + 1.0) / (high - low) for v in spreads]


def allocate(spreads: Sequence[Optional[float]], n: int, mean_ratio: float, low: int, high: int) -> list[int]:
    """r_i in [low, high] summing to round(mean_ratio * n * B) that greedily minimise sum_i v_i / r_i: each extra
    goes to the largest v_i / (r_i (r_i + 1)) (ties: the first). v_i: normalised spreads; None takes their mean."""
    known = [v for v in spreads if v is not None]
    norm = iter(normalise(known))
    values = [next(norm) if v is not None else None for v in spreads]
    mean = sum(v for v in values if v is not None) / len(known) if known else 1.0
    values = [mean if v is None else v for v in values]
    total = min(max(round(mean_ratio * n * len(values)), low * len(values)), high * len(values))
    counts = [low] * len(values)
    heap = [(-v / (low * (low + 1)), i) for i, v in enumerate(values) if low < high]
    heapq.heapify(heap)
    for _ in range(total - low * len(values)):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        if counts[i] < high:
            heapq.heappush(heap, (-values[i] / (counts[i] * (counts[i] + 1)), i))
    return counts


def dual_end_keep(finish_order: Sequence[int], n: int, keep_last: int) -> list[int]:
    """Of a group's responses listed in the order they finished, the n - L first and the L last (as given)."""
    if len(finish_order) < n:
        raise ValueError(f"{len(finish_order)} responses finished, fewer than the n={n} a group keeps")
    return list(finish_order[: n - keep_last]) + list(finish_order[len(finish_order) - keep_last:])


class LengthSpreadEma:
    """Per-prompt EMA of the sample std of kept response lengths (tokens); a dict, least recently updated first."""

    def __init__(self, alpha: float, state: Optional[dict[str, float]] = None) -> None:
        self.alpha = alpha
        self.values: dict[str, float] = dict(state or {})

    def update(self, key: str, lengths: Sequence[float]) -> float:
        """Folds one group's kept lengths into the prompt's EMA (the first observation is taken as is)."""
        m = sum(lengths) / len(lengths)
        std = math.sqrt(sum((x - m) ** 2 for x in lengths) / (len(lengths) - 1)) if len(lengths) > 1 else 0.0
        old = self.values.pop(key, None)  # re-inserted: the dict's order is the order of the latest updates
        self.values[key] = std if old is None else self.alpha * std + (1 - self.alpha) * old
        return self.values[key]

    def recent(self, count: int) -> list[str]:
        """The `count` most recently updated prompts."""
        return list(self.values)[-count:] if count > 0 else []

    def get(self, key: str) -> Optional[float]:
        return self.values.get(key)

    def state_dict(self) -> dict[str, float]:
        return dict(self.values)
