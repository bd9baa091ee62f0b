"""The `replay:` config section (docs/config.md, `replay.*`), typed and validated."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

BehaviorWeight = Literal["own", "pmis"]
SourceWeight = Literal["ess", "tokens"]
Order = Literal["newest", "least_reused"]

# What null keys resolve to with `pmis: true` (the preset) and `pmis: false` (uniform replay); false turns a control
# off. behavior_clip_high false: a bound on A > 0 cost 24 points in the scarce regime (docs/evidence.md).
PRESET = {"order": "least_reused", "ratio": 0.5, "m2_budget": 0.04, "behavior_clip": 0.2, "behavior_clip_high": False,
          "max_reuse": 2, "prompt_replay": 16}
UNIFORM = {"order": "newest", "ratio": False, "m2_budget": False, "behavior_clip": False, "behavior_clip_high": False,
           "max_reuse": False, "prompt_replay": False}


@dataclass
class ReplayConfig:
    """Every key of `replay.*`. Build with `ReplayConfig.from_dict` to reject unknown keys."""

    enable: bool = False
    k: int = 4
    pmis: bool = True
    warmup: int = 5
    filter_zero_adv: bool = True
    max_reuse: Optional[int | bool] = None
    max_groups: Optional[int] = None
    behavior_weight: Optional[BehaviorWeight] = None
    source_weight: Optional[SourceWeight] = None
    clip_decay: float = 1.0
    stop_grad: bool = True
    order: Optional[Order] = None
    ratio: Optional[float | bool] = None
    m2_budget: Optional[float | bool] = None
    behavior_clip: Optional[float | bool] = None  # the trust region's eps for A < 0
    behavior_clip_high: Optional[float | bool] = None  # its eps for A > 0; false: no bound there; null: the preset's (false)
    prompt_replay: Optional[int | bool] = None  # per-prompt replay (RePO): responses kept per prompt; false: off
    prompt_replay_max_age: Optional[int] = None  # steps a stored response stays usable; null: no limit

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("invalid replay config:\n  " + "\n  ".join(problems))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "ReplayConfig":
        """Builds from a plain mapping; unknown keys are an error (a typo must not run the baseline)."""
        problems = cls.problems_of(values)
        if problems:
            raise ValueError("invalid replay config:\n  " + "\n  ".join(problems))
        return cls(**dict(values))

    @classmethod
    def problems_of(cls, values: Mapping[str, Any]) -> list[str]:
        """Every problem of a plain mapping of replay keys: unknown keys, then bad values."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        problems = []
        if unknown:
            problems.append(f"unknown replay key(s): {', '.join('replay.' + u for u in unknown)}; "
                            f"known keys: {', '.join(sorted(known))}")
        unchecked = object.__new__(cls)  # skips __post_init__: collect problems instead of raising the first
        for f in dataclasses.fields(cls):
            setattr(unchecked, f.name, values.get(f.name, f.default))
        return problems + unchecked.problems()

    def problems(self) -> list[str]:
        """Every problem with the values, each naming its key (empty when valid)."""
        out: list[str] = []
        for name in ("enable", "pmis", "filter_zero_adv", "stop_grad"):
            if not isinstance(getattr(self, name), bool):
                out.append(f"replay.{name} must be a bool, got {getattr(self, name)!r}")
        if not is_int(self.k) or self.k < 1:
            out.append(f"replay.k must be an integer >= 1, got {self.k!r}")
        if not is_int(self.warmup) or self.warmup < 0:
            out.append(f"replay.warmup must be an integer >= 0, got {self.warmup!r}")
        if self.max_groups is not None and (not is_int(self.max_groups) or self.max_groups < 1):
            out.append(f"replay.max_groups must be null or an integer >= 1, got {self.max_groups!r}")
        if not (self.max_reuse is None or self.max_reuse is False) and (not is_int(self.max_reuse) or self.max_reuse < 1):
            out.append(f"replay.max_reuse must be null, false or an integer >= 1, got {self.max_reuse!r}")
        if self.order not in (None, "newest", "least_reused"):
            out.append(f"replay.order must be null, 'newest' or 'least_reused', got {self.order!r}")
        age = self.prompt_replay_max_age
        if age is not None and (not is_int(age) or age < 1):
            out.append(f"replay.prompt_replay_max_age must be null or an integer >= 1, got {age!r}")
        elif age is not None and self.resolved("prompt_replay") is None:  # null follows pmis
            out.append("replay.prompt_replay_max_age is set but replay.prompt_replay is off: set "
                       "replay.prompt_replay=16 to use it")
        if (self.prompt_replay is not None and self.prompt_replay is not False
                and (not is_int(self.prompt_replay) or self.prompt_replay < 2)):
            out.append(f"replay.prompt_replay must be null, false or an integer >= 2 (responses kept per prompt), "
                       f"got {self.prompt_replay!r}")
        for name, low, high in (("ratio", 0.0, math.inf), ("m2_budget", 0.0, math.inf), ("behavior_clip", 0.0, 1.0)):
            value = getattr(self, name)
            if value is None or value is False:
                continue
            if not is_number(value) or not low < value < high:
                out.append(f"replay.{name} must be null, false or a number in ({low:g}, {high:g}), got {value!r}")
        high = self.behavior_clip_high
        if high is not None and high is not False and (not is_number(high) or not high > 0):
            out.append(f"replay.behavior_clip_high must be null, false or a number > 0, got {high!r}")
        elif high is not None and (self.behavior_clip is False or (self.behavior_clip is None and not self.pmis)):
            out.append("replay.behavior_clip_high is set but the trust region is off (replay.behavior_clip is false, "
                       "or null with replay.pmis=false): set replay.behavior_clip too")
        if self.behavior_weight not in (None, "own", "pmis"):
            out.append(f"replay.behavior_weight must be null, 'own' or 'pmis', got {self.behavior_weight!r}")
        if self.source_weight not in (None, "ess", "tokens"):
            out.append(f"replay.source_weight must be null, 'ess' or 'tokens', got {self.source_weight!r}")
        if not is_number(self.clip_decay) or not 0.0 < self.clip_decay <= 1.0:
            out.append(f"replay.clip_decay must be in (0, 1], got {self.clip_decay!r}")
        return out

    def resolved(self, name: str) -> Any:
        """A key of PRESET: the value set, else PRESET's (`pmis: true`) or UNIFORM's; False (off) is None."""
        value = getattr(self, name)
        if value is None:
            value = (PRESET if self.pmis else UNIFORM)[name]
        return None if value is False else value

    def behavior_clip_range(self) -> Optional[tuple[float, float]]:
        """(eps for A < 0, eps for A > 0) of the behavior trust region, inf for an unbounded side; None: off."""
        low = self.resolved("behavior_clip")
        if low is None:
            return None
        high = self.resolved("behavior_clip_high")
        return float(low), (math.inf if high is None else float(high))

    @property
    def resolved_behavior_weight(self) -> BehaviorWeight:
        """`behavior_weight`, or what the `pmis` preset implies when it is null."""
        if self.behavior_weight is not None:
            return self.behavior_weight
        return "pmis" if self.pmis else "own"

    @property
    def resolved_source_weight(self) -> SourceWeight:
        """`source_weight`, or "tokens" when it is null: sources weighted by their tokens, as in the preset the
        held-out seeds support (docs/evidence.md); "ess" weights them by their effective sample size."""
        return self.source_weight if self.source_weight is not None else "tokens"


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_list(value: Any) -> list:
    """A config value given as one string or as a list (`data.train_files`, `trainer.logger`) as a list; [] for None."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)
