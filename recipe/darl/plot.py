"""Plots a run's curves from verl's jsonl log (`trainer.logger` with "file"): reward, validation
accuracy and the preset's own metrics against the training step, into one PNG.

    python -m recipe.darl.plot RUN.jsonl [--out RUN.png]
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

PANELS = [
    ("reward (training batch)", ["critic/score/mean"]),
    ("validation accuracy", "val-core/"),
    ("groups trained per step", ["replay/selected", "replay/replayed_trained", "replay/history_trained"]),
    ("staleness of trained samples", ["replay/staleness_mean", "replay/staleness_max"]),
    ("buffer and candidates", ["replay/buffer_groups", "replay/candidates", "replay/dropped_zero_adv"]),
    # shares of the trained tokens: the m2 gate, the behavior trust region, rho truncated at C
    ("tokens gated / behavior-clipped / truncated",
     ["replay/m2_gated_fraction", "actor/behavior_clipfrac", "replay/truncated_fraction"]),
]


def read_log(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] from verl's FileLogger lines {"step": s, "data": {...}} (a .gz file: gzipped)."""
    series: dict[str, list[tuple[int, float]]] = {}
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for record in (json.loads(line) for line in text.splitlines() if line.strip()):
        for key, value in record["data"].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(key, []).append((int(record["step"]), float(value)))
    return series


def plot(series: dict[str, list[tuple[int, float]]], out: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (name, keys) in zip(axes.flat, PANELS):
        if isinstance(keys, str):  # a prefix: every validation accuracy verl logged
            keys = sorted(k for k in series if k.startswith(keys) and k.endswith("mean@1"))
        drawn = [key for key in keys if key in series]
        for key in drawn:
            steps, values = zip(*series[key])
            ax.plot(steps, values, marker="o" if len(steps) < 12 else None, label=key.split("/", 1)[-1])
        ax.set_title(name)
        ax.set_xlabel("step")
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or args.log.with_suffix(".png")
    print(plot(read_log(args.log), out, title=args.log.stem))


if __name__ == "__main__":
    main()
