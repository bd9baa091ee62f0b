"""Tables and figures of the study through the verl pipeline (benchmarks/staleness/pipeline_check.sh).

    python -m benchmarks.staleness.pipeline_report runs/pipeline-scarce                 # summary into the run folder
    python -m benchmarks.staleness.pipeline_report runs/pipeline-scarce --archive docs/evidence/pipeline_scarce
    python -m benchmarks.staleness.pipeline_report docs/evidence/pipeline_scarce/results.jsonl.gz \\
        --out runs/report/pipeline_scarce                                               # again from the raw results
    python -m benchmarks.staleness.pipeline_report docs/evidence/pipeline_scarce/results.jsonl.gz runs/pipeline-sync \\
        --archive docs/evidence/pipeline_scarce                                         # add a later study's runs
    python -m benchmarks.staleness.pipeline_report docs/evidence/pipeline_scarce/results.jsonl.gz \\
        --restore runs/pipeline-scarce                                                  # resume a study elsewhere

A source is a run folder (TRAINER/seedS/CONFIG/metrics.jsonl, verl's file logger) or the archive
`results.jsonl.gz` that `--archive` writes (several sources are merged; a run of a later source replaces one with
the same trainer, config and seed): one line per run, {"trainer", "config", "seed", "records": [verl's
logged steps, trimmed to the keys in KEEP], "launches": [each launch's provenance and versions], "provenance" (the
first launch's), "resolved_config"} (the last three where the run recorded its launches); an archive holds runs,
never their report. A pair counts as side by side when both runs ran every launch from one clean commit on one
machine. The report (printed, and written as summary.md and accuracy_vs_{samples,wall}_TRAINER.png into --out or the
first run folder; an archive alone is printed):
per trainer, greedy validation accuracy per seed, mean ± std, the paired difference to each configuration of
`--versus` (decoupled PPO and `gates_only` unless told; mean and 95% interval over paired seeds), generated samples
to reach the same seed's decoupled final accuracy, and the median step time over the second half of the run against
decoupled's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.staleness.paired import paired
from benchmarks.staleness.provenance import same_origin
from benchmarks.staleness.run_study import _curve, _mean_std, collapse_events, reach_target, samples_to_reach
from recipe.darl.example.arithmetic import VAL_KEY
from recipe.darl.robustness.run_records import LAUNCHES_FILE

STEP_TIME = "timing_s/step"
KEEP = (VAL_KEY, STEP_TIME, "timing_s/gen", "critic/score/mean", "response_length/mean", "actor/pg_clipfrac",
        "actor/grad_norm", "replay/", "fully_async/", "training/")
PER_SOURCE = re.compile(r"/s\d+$")  # replay/*/sV: one key per behavior version, left out of the archive
ORDER = ("sync", "async", "decoupled", "equal_update", "gates_only", "pmis_sg_no_prompt", "pmis_sg")
NAMES = {"async": "naive async (PPO against mu)", "sync": "sync (decoupled, staleness 0)", "decoupled": "decoupled PPO",
         "equal_update": "decoupled, two passes", "gates_only": "the preset's controls, no replay",
         "pmis_sg_no_prompt": "the group-replay preset", "pmis_sg": "the preset"}
# archived configurations of earlier designs (benchmarks/staleness/names.py) are reported under their own names


def _trim(record: dict[str, Any]) -> dict[str, Any]:
    data = {k: v for k, v in record["data"].items()
            if any(k == p or (p.endswith("/") and k.startswith(p)) for p in KEEP) and not PER_SOURCE.search(k)}
    return {"step": record["step"], "data": data}


def load_runs(source: Path) -> list[dict[str, Any]]:
    """Runs as {"trainer", "config", "seed", "records"} from a run folder or a results.jsonl.gz archive."""
    source = Path(source)
    if source.is_file():
        return [json.loads(line) for line in gzip.decompress(source.read_bytes()).decode().splitlines() if line.strip()]
    runs = []
    for log in sorted(source.glob("*/seed*/*/metrics.jsonl")):
        cfg_dir = log.parent
        records = [_trim(json.loads(line)) for line in log.read_text().splitlines() if line.strip()]
        runs.append({"trainer": cfg_dir.parent.parent.name, "config": cfg_dir.name,
                     "seed": int(cfg_dir.parent.name[len("seed"):]), "records": records, **_launches(cfg_dir)})
    if not runs:
        raise FileNotFoundError(f"pipeline_report: no TRAINER/seedS/CONFIG/metrics.jsonl under {source}")
    return runs


def _launches(cfg_dir: Path) -> dict[str, Any]:
    """The run's launch records (recipe/darl/robustness/run_records.py): each launch's provenance and versions, and
    the first launch's provenance (where the run started, as the harness's records carry it) and resolved config;
    {} for runs made before launches were recorded."""
    path = cfg_dir / "checkpoints" / LAUNCHES_FILE
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {"launches": [{k: x[k] for k in ("provenance", "versions")} for x in lines],
            "provenance": lines[0]["provenance"], "resolved_config": lines[0]["config"]} if lines else {}


def origin(run: dict[str, Any]) -> dict[str, Any] | None:
    """The run's provenance when every launch of it ran from one clean commit on one machine, else None."""
    launches = [x["provenance"] for x in run.get("launches", [])]
    if not launches or not all(same_origin(launches[0], x) for x in launches):
        return None
    return launches[0]


def merge_runs(sources: list[Path]) -> list[dict[str, Any]]:
    """The runs of every source; a later source's run replaces an earlier one of the same trainer, config and seed."""
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    for source in sources:
        for run in load_runs(source):
            runs[(run["trainer"], run["config"], run["seed"])] = run
    return list(runs.values())


def prompts_per_step(cfg: dict[str, Any]) -> int:
    """Prompts a trainer step trains on, from a launch's resolved config: data.train_batch_size, or for fully-async
    (whose train_batch_size is 0) require_batches mini-batches."""
    actor = cfg["actor_rollout_ref"]["actor"]
    return int(cfg["data"]["train_batch_size"] or actor["ppo_mini_batch_size"] * cfg["async_training"]["require_batches"])


def samples_per_step(run: dict[str, Any], default: int) -> int:
    """Generated samples a trainer step (prompts x group size), from the run's resolved config; DEFAULT for runs
    without a launch record."""
    cfg = run.get("resolved_config")
    if not cfg:
        return default
    return prompts_per_step(cfg) * int(cfg["actor_rollout_ref"]["rollout"]["n"])


def as_result(run: dict[str, Any], default_samples: int) -> dict[str, Any]:
    """One run as run_study's result shape: evals [{step, samples, wall, accuracy}], step times, finals; samples a
    step from the run's config (DEFAULT_SAMPLES for runs without one)."""
    per_step = samples_per_step(run, default_samples)
    wall, step_times, evals = 0.0, [], []
    for rec in sorted(run["records"], key=lambda r: r["step"]):
        t = rec["data"].get(STEP_TIME)
        if isinstance(t, (int, float)):
            wall += t
            step_times.append(float(t))
        if VAL_KEY in rec["data"]:
            evals.append({"step": rec["step"], "samples": rec["step"] * per_step, "wall": wall,
                          "accuracy": float(rec["data"][VAL_KEY])})
    late = sorted(step_times[len(step_times) // 2:])
    return {**{k: run[k] for k in ("trainer", "config", "seed")}, "evals": evals, "origin": origin(run),
            "samples_per_step": per_step,
            "initial_accuracy": evals[0]["accuracy"] if evals else float("nan"),
            "final_accuracy": evals[-1]["accuracy"] if evals else float("nan"),
            "step_time": late[len(late) // 2] if late else float("nan")}


def _paired(a: dict[int, float], b: dict[int, float], side_by_side: int = 0) -> str:
    """a - b over the seeds both have, in points: mean [95% interval], the per-seed differences, and how many of
    the pairs ran side by side (one clean commit, one machine)."""
    diff = paired(a, b)
    if diff.n < 2:
        return diff.points()
    seeds = sorted(set(a) & set(b))
    return (f"{100 * diff.mean:+.1f} [{100 * diff.low:+.1f}, {100 * diff.high:+.1f}] "
            f"({', '.join(f'{100 * (a[s] - b[s]):+.1f}' for s in seeds)}; {side_by_side} of {len(seeds)} side by side)")


def _side_by_side(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> int:
    return sum(same_origin(a[s]["origin"], b[s]["origin"]) for s in set(a) & set(b))


VERSUS = ("decoupled", "gates_only")  # the paired comparisons of every row, unless told others


def report(runs: list[dict[str, Any]], out: Path | None, samples_per_step: int = 128, versus: tuple[str, ...] = VERSUS) -> str:
    results = [as_result(r, samples_per_step) for r in runs]
    # a run still going (or cut short) has not reached the study's last evaluation: left out, and named
    last = max((r["evals"][-1]["step"] for r in results if r["evals"]), default=0)
    partial = [r for r in results if not r["evals"] or r["evals"][-1]["step"] < last]
    results = [r for r in results if r not in partial]
    trainers = sorted({r["trainer"] for r in results})
    per_step = "/".join(map(str, sorted({r["samples_per_step"] for r in results})))
    lines = ["# The study through the verl pipeline", "",
             f"Greedy validation accuracy; {per_step} generated samples a step; finals at the last evaluation "
             f"(step {last})."
             + (" Not finished, left out: " + ", ".join(f"{r['trainer']}/{r['config']}/seed {r['seed']}" for r in partial)
                + "." if partial else ""), ""]
    for trainer in trainers:
        cell = {}
        for r in results:
            if r["trainer"] == trainer:
                cell.setdefault(r["config"], {})[r["seed"]] = r
        configs = [c for c in ORDER if c in cell] + sorted(c for c in cell if c not in ORDER)
        final = {c: {s: r["final_accuracy"] for s, r in cell[c].items()} for c in configs}
        base = cell.get("decoupled", {})
        base_time = statistics.median(r["step_time"] for r in base.values()) if base else None
        lines += [f"## {trainer}", "",
                  "| config | what | final per seed | final, mean ± std | best, mean | lowest after start | "
                  + " | ".join(f"minus {v}" + (", points (paired, [95% interval])" if i == 0 else "")
                               for i, v in enumerate(versus))
                  + " | samples to decoupled's final (per seed; n/a: it ends at or below its start)"
                  + " | step time (s, median) / decoupled's |",
                  "|---|---|---|---|---|---|" + "---|" * (len(versus) + 2)]
        for c in configs:
            seeds = sorted(cell[c])
            reach = []
            for s in seeds:
                if s in base and base[s]["evals"] and base[s]["evals"][-1]["samples"]:
                    target = reach_target(base[s])
                    if target is None:  # that seed's decoupled run ends at or below its start
                        reach.append("n/a")
                        continue
                    got = samples_to_reach(cell[c][s]["evals"], target)
                    total = base[s]["evals"][-1]["samples"]
                    reach.append("-" if got is None else f"{got / total:.2f}x")
            times = [cell[c][s]["step_time"] for s in seeds]
            lines.append(
                f"| `{c}` | {NAMES.get(c, c)} | {', '.join(f'{final[c][s]:.3f}' for s in seeds)} | "
                f"{_mean_std(list(final[c].values()))} | "
                f"{statistics.mean(max(e['accuracy'] for e in cell[c][s]['evals']) for s in seeds):.3f} | "
                f"{statistics.mean(min(e['accuracy'] for e in cell[c][s]['evals'][1:] or cell[c][s]['evals']) for s in seeds):.3f} | "
                + "".join(f"{_paired(final[c], final.get(v, {}), _side_by_side(cell[c], cell.get(v, {}))) if c != v else '-'} | "
                          for v in versus) +
                f"{', '.join(reach) or '-'} | "
                f"{statistics.median(times):.2f} / "
                + (f"{statistics.median(times) / base_time:.2f}x |" if base else "- |"))
        starts = sorted({round(r["initial_accuracy"], 4) for c in configs for r in cell[c].values()})
        collapses = {c: sum(collapse_events(r["evals"]) for r in cell[c].values()) for c in configs}
        lines += ["", f"Start accuracy (step 0): {', '.join(f'{s:.3f}' for s in starts)}. "
                  f"Collapses (an evaluation 0.15 below an earlier best): "
                  + ", ".join(f"{c} {n}" for c, n in collapses.items()) + ".", ""]
        if out is not None:
            _plot(trainer, {c: list(cell[c].values()) for c in configs}, out)
    text = "\n".join(lines)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.md").write_text(text + "\n")
    return text


def _plot(trainer: str, by_config: dict[str, list[dict[str, Any]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    for axis, label in (("samples", "generated samples"), ("wall", "trainer time, sum of timing_s/step (s)")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for c, runs in by_config.items():
            runs = [r for r in runs if r["evals"]]
            if runs:
                x, mean, std = _curve(runs, axis)
                (line,) = ax.plot(x, mean, marker=".", label=f"{c} (n={len(runs)})")
                ax.fill_between(x, mean - std, mean + std, alpha=0.12, color=line.get_color())
        ax.set_xlabel(label)
        ax.set_ylabel("greedy validation accuracy")
        ax.set_title(f"verl pipeline, {trainer} (mean ± std over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"accuracy_vs_{axis}_{trainer}.png", dpi=110)
        plt.close(fig)


def archive(runs: list[dict[str, Any]], dest: Path) -> Path:
    """Writes the runs (trimmed to KEEP) as dest/results.jsonl.gz; mtime 0, so a rewrite of the same runs is byte-identical."""
    dest.mkdir(parents=True, exist_ok=True)
    runs = sorted(runs, key=lambda r: (r["trainer"], r["config"], r["seed"]))
    body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in runs).encode()
    path = dest / "results.jsonl.gz"
    path.write_bytes(gzip.compress(body, mtime=0))
    return path


def restore(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    """Archived runs back as run folders (OUT/TRAINER/seedS/CONFIG: metrics.jsonl, checkpoints/launches.jsonl) where
    OUT has no such run, so that pipeline_check.sh counts them as done and its report includes them."""
    written = []
    for run in runs:
        folder = out / run["trainer"] / f"seed{run['seed']}" / run["config"]
        if (folder / "metrics.jsonl").exists():
            continue
        (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run["records"]))
        launches = list(run.get("launches", []))
        if launches:  # launches.jsonl's lines; the first holds the resolved config (`_launches` reads it there)
            launches[0] = {**launches[0], "config": run.get("resolved_config")}
            (folder / "checkpoints" / LAUNCHES_FILE).write_text("".join(json.dumps(x) + "\n" for x in launches))
        written.append(folder)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, nargs="+",
                   help="pipeline_check.sh output folders or results.jsonl.gz archives (merged; later ones win)")
    p.add_argument("--out", type=Path, help="where summary.md and the figures go [the first source, if a run folder]")
    p.add_argument("--archive", type=Path, help="also write the runs as ARCHIVE/results.jsonl.gz")
    p.add_argument("--samples-per-step", type=int, default=128,
                   help="generated samples a step for runs without a launch record (others: their resolved config)")
    p.add_argument("--versus", nargs="+", default=list(VERSUS), help="configurations every row is compared with")
    p.add_argument("--restore", type=Path, metavar="OUT", help="only write the runs back as run folders under OUT")
    args = p.parse_args(argv)
    runs = merge_runs(args.source)
    if args.restore:
        print(f"restored {len(restore(runs, args.restore))} of {len(runs)} archived runs into {args.restore}")
        return 0
    if args.archive:
        print(f"archived {len(runs)} runs: {archive(runs, args.archive)}")
    first = args.source[0]
    out = args.out or (first if first.is_dir() else None)
    print(report(runs, out, args.samples_per_step, tuple(args.versus)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
