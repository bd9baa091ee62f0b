"""The table and plots of docs/darts.md from `benchmarks/darts/run.sh`'s runs.

    python benchmarks/darts/summary.py runs/darts [--plot docs/evidence/darts/curves.png]
    python benchmarks/darts/summary.py docs/evidence/darts          # the committed raw logs (metrics.jsonl.gz)

Per run (medians over steps 2..T: step 1 waits for the first batch): generation time per step
(`rollout_shaping/generation_s`: from submitting the step's requests to the last kept response's finish; runs logged
before that metric existed fall back to verl's `timing_s/agent_loop/generate_sequences/max`, the slowest kept
request, marked `*`), tokens decoded and kept per step, p50/p95 of kept response lengths, responses generated per
prompt, share aborted, step time; the training reward (digit share) over the last 3 steps; the wall time (sum of
step times) until the training reward first reaches the same seed's `base` run's final reward.

The one-step-off trainer generates the next batch while it trains on this one, so a step lasts max(generation,
training): generation shorter than training is hidden, and only generation time shows what DARTS changes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from recipe.darl.plot import read_log  # noqa: E402

REWARD = "critic/score/mean"


def _values(series, key, first=2):
    return [v for s, v in series.get(key, []) if s >= first]


def summarize(log: Path) -> dict[str, float]:
    m = read_log(log)
    rewards = [v for _, v in m[REWARD]]
    steps = [v for _, v in m["timing_s/step"]]
    gen = "rollout_shaping/generation_s" if "rollout_shaping/generation_s" in m else (
        "timing_s/agent_loop/generate_sequences/max")
    decoded, kept = (_values(m, f"rollout_shaping/tokens_{k}") for k in ("decoded", "kept"))
    out = {"gen_s": statistics.median(_values(m, gen)), "gen_metric": "" if gen.startswith("rollout_") else "*",
           "decoded": statistics.median(decoded) if decoded else float("nan"),
           "kept_tokens": statistics.median(kept) if kept else float("nan"),
           "step_s": statistics.median(_values(m, "timing_s/step")),
           "p50": statistics.median(_values(m, "rollout_shaping/kept_length_p50", 1)),
           "p95": statistics.median(_values(m, "rollout_shaping/kept_length_p95", 1)),
           "r_per_prompt": statistics.mean(_values(m, "rollout_shaping/responses_per_prompt", 1)),
           "aborted": sum(_values(m, "rollout_shaping/aborted", 1)) / sum(_values(m, "rollout_shaping/generated", 1)),
           "final_reward": statistics.mean(rewards[-3:]), "steps": len(rewards)}
    out["curve"] = list(zip(steps, rewards))
    return out


def time_to(curve: list[tuple[float, float]], target: float) -> float:
    """Seconds (sum of step times) until the training reward first reaches `target`; inf if never."""
    wall = 0.0
    for step_s, reward in curve:
        wall += step_s
        if reward >= target:
            return wall
    return float("inf")


def _cell(vals: list[float]) -> str:
    """mean ± std over seeds; values that never happened (inf) are counted apart."""
    vals = [v for v in vals if v == v]  # NaN: not logged by this run
    if not vals:
        return "-"
    finite = [v for v in vals if v != float("inf")]
    never = f" (never in {len(vals) - len(finite)} of {len(vals)})" if len(finite) < len(vals) else ""
    if not finite:
        return "never" + never[6:] if len(vals) > 1 else "never"
    mean = statistics.mean(finite)
    return (f"{mean:.3f} ± {statistics.stdev(finite):.3f}" if len(finite) > 1 else f"{mean:.3f}") + never


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=15, help="runs with fewer logged steps (unfinished) are left out")
    args = parser.parse_args()
    runs = {}
    for log in sorted([*args.root.glob("preset_*/seed*/*/metrics.jsonl"), *args.root.glob("preset_*/seed*/*/metrics.jsonl.gz")]):
        preset, seed, cfg = log.parts[-4], log.parts[-3], log.parts[-2]
        summary = summarize(log)
        if summary["steps"] >= args.steps:
            runs[(preset, cfg, seed)] = summary
    for (preset, cfg, seed), r in runs.items():
        base = runs.get((preset, "base", seed))
        r["time_to_base"] = time_to(r["curve"], base["final_reward"]) if base else float("nan")
    keys = ["gen_s", "decoded", "kept_tokens", "step_s", "p50", "p95", "r_per_prompt", "aborted", "final_reward",
            "time_to_base"]
    print("| preset | config | seeds | " + " | ".join(keys) + " |\n|" + "---|" * (len(keys) + 3))
    groups: dict[tuple[str, str], list[dict]] = {}
    for (preset, cfg, seed), r in runs.items():
        groups.setdefault((preset, cfg), []).append(r)
    for (preset, cfg), rs in groups.items():
        cells = []
        for k in keys:
            cells.append(_cell([r[k] for r in rs]) + (rs[0]["gen_metric"] if k == "gen_s" else ""))
        print(f"| {preset} | {cfg} | {len(rs)} | " + " | ".join(cells) + " |")
    for (preset, cfg), rs in groups.items():
        base = groups.get((preset, "base"))
        if base and cfg != "base":
            ratio = statistics.mean(r["gen_s"] for r in base) / statistics.mean(r["gen_s"] for r in rs)
            print(f"generation time per step, {preset} {cfg}: base / {cfg} = {ratio:.2f}x")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        colors = dict(zip(["base", "fixed0", "adapt0", "fixed1", "adapt1"], ["k", "C0", "C3", "C2", "C1"]))
        labelled = set()
        for (preset, cfg, seed), r in sorted(runs.items()):
            wall, xs = 0.0, []
            for step_s, _ in r["curve"]:
                wall += step_s
                xs.append(wall)
            style = dict(color=colors.get(cfg, "C4"), linestyle="-" if preset == "preset_on" else "--", linewidth=1)
            label = None if (preset, cfg) in labelled else f"{cfg} ({preset.replace('_', ' ')})"
            labelled.add((preset, cfg))
            ax1.plot(range(1, len(r["curve"]) + 1), [v for _, v in r["curve"]], label=label, **style)
            ax2.plot(xs, [v for _, v in r["curve"]], **style)
        ax1.set_xlabel("trainer step"); ax2.set_xlabel("wall time (s, sum of step times)")
        for ax in (ax1, ax2):
            ax.set_ylabel("training reward (digit share)")
        ax1.legend(fontsize=7)
        fig.suptitle("DARTS on the long-tail CPU example (one line per seed)", fontsize=9)
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
