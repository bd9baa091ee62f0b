"""The console a run prints: one compact line per step, where verl's console logger prints every metric.

`console: compact` (the default of the D-ARL configs) swaps the console backend of verl's `Tracking` for
`CompactConsole`; `console: full` leaves verl's line. The file, tensorboard and wandb backends get every metric either
way. A line reads

    [darl] step 12/40 | reward 0.531 | val 0.412 | trained 32 groups, 8 replayed | staleness 1.2 | 3.1 s/step | ETA 0:01:27
"""

from __future__ import annotations

import datetime
import statistics
from typing import Any, Callable, Optional

from tqdm import tqdm

MODES = ("compact", "full")
REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")


def _first(data: dict[str, Any], keys) -> Optional[float]:
    for key in keys:
        if isinstance(data.get(key), (int, float)):
            return float(data[key])
    return None


def validation_accuracy(data: dict[str, Any]) -> Optional[float]:
    """The mean of verl's `val-core/<source>/<metric>/mean@<k>` values (one per data source), if the step validated."""
    values = [float(v) for k, v in data.items() if k.startswith("val-core/") and "/mean@" in k
              and isinstance(v, (int, float))]
    return statistics.fmean(values) if values else None


class CompactConsole:
    """A `Tracking` backend: `log(data, step)` prints one line; `total_steps()` gives the schedule for the ETA."""

    def __init__(self, total_steps: Callable[[], Optional[int]], write: Callable[[str], None] = print) -> None:
        self.total_steps, self.write = total_steps, write
        self.step_times: list[float] = []

    def line(self, data: dict[str, Any], step: int) -> str:
        total = self.total_steps()
        parts = [f"step {step}" + (f"/{total}" if total else "")]
        if (reward := _first(data, REWARD_KEYS)) is not None:
            parts.append(f"reward {reward:.3f}")
        if (val := validation_accuracy(data)) is not None:
            parts.append(f"val {val:.3f}")
        trained, replayed = _first(data, ("replay/selected",)), _first(data, ("replay/replayed_trained",))
        if trained is not None:
            parts.append(f"trained {trained:.0f} groups" + (f", {replayed:.0f} replayed" if replayed is not None else ""))
        if (staleness := _first(data, ("replay/staleness_mean",))) is not None:
            parts.append(f"staleness {staleness:.1f}")
        if (seconds := _first(data, ("timing_s/step",))) is not None:
            self.step_times.append(seconds)
            parts.append(f"{seconds:.1f} s/step")
            if total and step < total:
                eta = (total - step) * statistics.fmean(self.step_times[-20:])
                parts.append(f"ETA {datetime.timedelta(seconds=round(eta))}")
        return "[darl] " + " | ".join(parts)

    def log(self, data: dict[str, Any], step: int) -> None:
        write = tqdm.write if self.write is print else self.write  # under verl's progress bar: write above it
        write(self.line(data, step))


def compact_console(tracking: Any, config: Any, total_steps: Callable[[], Optional[int]]) -> Any:
    """`tracking` with its console backend replaced by `CompactConsole` when `console` is compact (a no-op without a
    console backend, or for anything that is not verl's Tracking)."""
    mode = (config.get("console", "compact") if config is not None else "compact") or "compact"
    backends = getattr(tracking, "logger", None)
    if mode == "compact" and isinstance(backends, dict) and "console" in backends:
        backends["console"] = CompactConsole(total_steps)
    return tracking


class CompactTracking:
    """A trainer's `logger` attribute (`logger = CompactTracking()` in the class): every verl trainer keeps its
    Tracking there, assigned in fit or __init__; it is stored with its console backend made compact (`compact_console`;
    `console: full` keeps verl's)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.key = name, f"_darl_{name}"

    def __get__(self, trainer: Any, owner: Optional[type] = None) -> Any:
        if trainer is None:
            return self
        try:
            return trainer.__dict__[self.key]
        except KeyError:
            raise AttributeError(self.name) from None

    def __set__(self, trainer: Any, tracking: Any) -> None:
        trainer.__dict__[self.key] = compact_console(
            tracking, getattr(trainer, "config", None), lambda: getattr(trainer, "total_training_steps", None))
