"""The observed range of the metrics docs/troubleshooting.md gives healthy ranges for, in verl's jsonl logs or the
study's archived pipeline runs: per metric the steps seen, min, 5th percentile, median, 95th percentile and max.

    python benchmarks/metric_ranges.py docs/evidence/demo/results.jsonl.gz docs/evidence/pipeline_scarce/results.jsonl.gz
    python benchmarks/metric_ranges.py --archive outputs/demo/metrics.jsonl docs/evidence/demo/results.jsonl.gz --name demo

A file is verl's file logger ({"step", "data"} per line) or a study archive (one run per line, its `records` a file
logger's lines, its `provenance` where and on what code it ran), gzipped or not. `--archive` writes a file logger's
run as such an archive, with the provenance of this tree: refused when the tree is dirty or its last commit is newer
than the log (the run would not be this code's).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

# the metrics of the healthy-ranges table (a `sK` suffix stands for every staleness)
WATCHED = ("replay/staleness_mean", "replay/staleness_max", "replay/selected", "replay/replayed_trained",
           "replay/skipped_update", "replay/invalid_samples", "replay/truncated_fraction", "replay/m2_gated_fraction",
           "replay/alpha/sK", "replay/ess_fraction/sK", "actor/rho_bar_mean", "actor/behavior_clipfrac",
           "actor/pg_clipfrac", "actor/grad_norm", "training/rollout_probs_diff_mean",
           "training/rollout_probs_diff_max", "rollout_corr/kl", "rollout_corr/rollout_is_mean",
           "rollout_corr/rollout_is_eff_sample_size", "rollout_corr/rollout_is_ratio_fraction_high",
           "faults/nonfinite_rewards", "faults/reward_failed")


def sources(path: Path) -> dict[str, list[dict]]:
    """The step records ({"step", "data"}) of a file logger's jsonl (under the file's name), or of a study archive's
    runs (under each run's trainer); either may be gzipped."""
    text = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    if lines and "records" not in lines[0]:
        return {path.name: lines}
    found: dict[str, list[dict]] = {}
    for run in lines:
        found.setdefault(run.get("trainer", path.name), []).extend(run["records"])
    return found


def ranges(steps: list[dict]) -> dict[str, dict[str, float]]:
    """{metric: {"steps", "min", "p5", "p50", "p95", "max"}} over the steps that log it (`sK` keys pooled)."""
    values: dict[str, list[float]] = {}
    for record in steps:
        for key, value in record["data"].items():
            name = re.sub(r"/s\d+$", "/sK", key)
            if name in WATCHED and isinstance(value, (int, float)) and np.isfinite(value):
                values.setdefault(name, []).append(float(value))
    out = {}
    for name in WATCHED:
        if name in values:
            v = np.array(values[name])
            p5, p50, p95 = np.percentile(v, [5, 50, 95]).tolist()
            out[name] = {"steps": len(v), "min": float(v.min()), "p5": p5, "p50": p50, "p95": p95, "max": float(v.max())}
    return out


def table(found: dict[str, dict[str, float]]) -> str:
    lines = ["| metric | steps | min | p5 | median | p95 | max |", "|---|---|---|---|---|---|---|"]
    for name, r in found.items():
        lines.append(f"| `{name}` | {r['steps']} | " + " | ".join(f"{r[k]:.3g}" for k in ("min", "p5", "p50", "p95", "max"))
                     + " |")
    return "\n".join(lines)


def archive(log: Path, out: Path, name: str) -> None:
    """`log` (a file logger's run of this tree's HEAD) as a one-run archive with its provenance."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.staleness.provenance import provenance

    origin = provenance()
    committed = int(subprocess.run(["git", "log", "-1", "--format=%ct"], capture_output=True, text=True,
                                   cwd=Path(__file__).parent, check=True).stdout)
    if origin["dirty"] or log.stat().st_mtime < committed:
        raise SystemExit(f"{log}: not archived: the tree is dirty or its last commit is newer than the log")
    run = {"trainer": name, "provenance": origin, "records": sources(log)[log.name]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.compress((json.dumps(run) + "\n").encode(), mtime=0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", type=Path, nargs="+")
    ap.add_argument("--archive", action="store_true", help="LOG OUT: write LOG's run as an archive with provenance")
    ap.add_argument("--name", default="demo", help="the archived run's name (--archive)")
    args = ap.parse_args()
    if args.archive:
        archive(*args.logs, name=args.name)
        return
    for path in args.logs:
        for name, steps in sources(path).items():
            print(f"{path} ({name})\n\n{table(ranges(steps))}\n")


if __name__ == "__main__":
    main()
