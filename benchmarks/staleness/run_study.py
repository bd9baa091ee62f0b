"""The controlled-staleness study: methods x staleness x seeds, curves, plots and tables.

    OMP_NUM_THREADS=1 python -m benchmarks.staleness.run_study --out runs/scarce --task scarce --lr 1e-4 \\
        --staleness 4 --methods decoupled darl --seeds 0 1 2 --steps 50 --eval-every 10 --val-size 500 --minibatches 2
    python -m benchmarks.staleness.run_study --quick --out runs/staleness-quick     # minutes
    python -m benchmarks.staleness.run_study --report-only --out runs/staleness     # plots and tables again
    python -m benchmarks.staleness.run_study --report-only --results docs/evidence/stress/results.jsonl.gz \
        --out runs/report/stress                                                     # an archived study's report

Each run appends one JSON line to OUT/results.jsonl (its config, evaluation curve, per-step metrics, and its
provenance: commit, dirty tree, host, CPU, cores, dates, command line);
runs already in the file are skipped, so an interrupted study resumes. `--jobs J` runs J processes
side by side, one thread each. The report writes OUT/accuracy_vs_samples_s{S}.png, OUT/accuracy_vs_wall_s{S}.png
and OUT/summary.md (mean +- std over seeds of final and best accuracy, samples to reach the same seed's decoupled
final accuracy, step time, grad norm, clipped fraction, chi2, ESS, collapse events).

Methods are the names of METHODS below: the preset (`darl`), the group-replay preset and the baselines.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads (the harness imports it)

from benchmarks.staleness import attempts  # noqa: E402
from benchmarks.staleness.attempts import run_key  # noqa: E402
from benchmarks.staleness.harness import TASKS, preset_overrides  # noqa: E402
from recipe.darl.config import presets  # noqa: E402

# name -> HarnessConfig overrides ("staleness" pins a method's staleness whatever the cell's): the named configurations
# of recipe/darl/config/preset/, the files the trainers select with preset=<name> (docs/config.md#configurations);
# archived runs of earlier designs carry the names of names.py.
METHODS: dict[str, dict[str, Any]] = {name: preset_overrides(name) for name in presets.names()}


def cell_staleness(method: str, staleness: int) -> int:
    """The staleness a method runs at in a cell of staleness `staleness` (sync always runs at 0)."""
    return METHODS.get(method, {}).get("staleness", staleness)


def record_attempt(spec: dict[str, Any], event: str, **extra: Any) -> None:
    """The run's start, finish or failure in OUT/attempts.jsonl, when the spec names the file (`attempts.py`)."""
    if spec.get("attempts"):
        attempts.record(spec["attempts"], event, method_name=spec["method_name"], staleness=spec["staleness"],
                        seed=spec["seed"], common=spec["common"], **extra)


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from benchmarks.staleness.harness import HarnessConfig, run

    overrides = dict(METHODS[spec["method_name"]])
    overrides.pop("staleness", None)
    overrides.update(spec["common"])
    config = HarnessConfig(staleness=spec["staleness"], seed=spec["seed"], label=spec["method_name"], **overrides)
    record_attempt(spec, "started", pid=os.getpid(), provenance=spec.get("origin"))
    try:
        result = run(config, log=lambda msg: print(msg, flush=True))
    except BaseException as e:
        record_attempt(spec, "failed", error=repr(e)[:500])
        raise
    result.update(method_name=spec["method_name"], staleness=spec["staleness"], seed=spec["seed"])
    return result


def planned_runs(methods: list[str], stalenesses: list[int], seeds: list[int], common: dict[str, Any],
                 done: set[str]) -> list[dict[str, Any]]:
    """The runs still to do, seed by seed (all of a seed's runs one after another, so its pairs run side by side on
    one machine), then staleness, then method; each once (sync runs at s = 0 whatever s is asked)."""
    specs, seen = [], set(done)
    for seed in seeds:
        for s in stalenesses:
            for m in methods:
                key = run_key(m, cell_staleness(m, s), seed, common)
                if key not in seen:
                    seen.add(key)
                    specs.append({"method_name": m, "staleness": cell_staleness(m, s), "seed": seed, "common": common})
    return specs


def load_results(path: Path) -> list[dict[str, Any]]:
    """The runs in OUT/results.jsonl, or in OUT/results.jsonl.gz (how docs/evidence keeps them)."""
    packed = path if path.suffix == ".gz" else path.with_name(path.name + ".gz")
    if path.exists() and path != packed:
        text = path.read_text()
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def study_results(folder: Path) -> list[dict[str, Any]]:
    """The runs of a study folder, for the report commands: a folder without results.jsonl(.gz) is an error naming
    it, where load_results (which a study resuming from nothing also calls) returns no runs."""
    if not (folder / "results.jsonl").exists() and not (folder / "results.jsonl.gz").exists():
        raise SystemExit(f"{folder}: no results.jsonl or results.jsonl.gz here; pass a study's folder "
                         "(for example runs/protocol/scarce/replay_heldout)")
    return load_results(folder / "results.jsonl")


# ---- report ---------------------------------------------------------------------------------

def _mean_std(values: list[float]) -> str:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return "-"
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return f"{mean:.3f} ± {std:.3f}" if abs(mean) < 100 else f"{mean:.0f} ± {std:.0f}"


def samples_to_reach(evals: list[dict[str, Any]], target: float) -> float | None:
    """Generated samples at the first evaluation at or above `target`; None if none is."""
    for e in evals:
        if e["accuracy"] >= target:
            return e["samples"]
    return None


def reach_target(reference: dict[str, Any]) -> float | None:
    """A reference run's final accuracy as a target to reach, or None where that run ends at or below
    where it started: every run would "reach" such a final at step 0, so it gives no figure."""
    evals = reference["evals"]
    return reference["final_accuracy"] if evals and reference["final_accuracy"] > evals[0]["accuracy"] else None


def step_mean(result: dict[str, Any], key: str) -> float:
    vals = [s[key] for s in result["steps"] if s.get(key) is not None and isinstance(s.get(key), (int, float))
            and math.isfinite(s[key])]
    return sum(vals) / len(vals) if vals else float("nan")


def steady_step_time(result: dict[str, Any]) -> float:
    """Median seconds per step (generation + training) over the second half of the run, once the
    replay buffer is full."""
    times = sorted(s["time_gen"] + s["time_train"] for s in result["steps"][len(result["steps"]) // 2:])
    return times[len(times) // 2] if times else float("nan")


def collapse_events(evals: list[dict[str, Any]], drop: float = 0.15) -> int:
    """Evaluations whose accuracy fell more than `drop` below the best one before them."""
    best, events = -1.0, 0
    for e in evals:
        if best >= 0 and e["accuracy"] < best - drop:
            events += 1
        best = max(best, e["accuracy"])
    return events


def report(results: list[dict[str, Any]], out: Path) -> str:
    by_cell: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in results:
        by_cell.setdefault((r["staleness"], r["method_name"]), []).append(r)
    stalenesses = sorted({s for s, _ in by_cell})
    # the study's names first, then the archived names of earlier designs (names.py)
    methods = [m for m in METHODS if any(m == k for _, k in by_cell)]
    methods += sorted({k for _, k in by_cell} - set(methods))
    accuracy = ["| s | method | seeds | start acc | final acc | best acc | samples to decoupled's final | step s |",
                "|---|---|---|---|---|---|---|---|"]
    stability = ["| s | method | grad norm | clip frac | chi2 trained | ESS frac | trained staleness | reuse | pmis mixed | collapses |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
    for s in stalenesses:
        ref_target = {r["seed"]: reach_target(r) for r in by_cell.get((s, "decoupled"), [])}
        for m in methods:
            runs = by_cell.get((s, m), [])
            if not runs:
                continue
            targets = [(r, ref_target[r["seed"]]) for r in runs if ref_target.get(r["seed"]) is not None]
            reached = [x for x in (samples_to_reach(r["evals"], t) for r, t in targets) if x is not None]
            if not targets:
                reach_txt = "- (decoupled ends at or below its start)" if ref_target else "-"
            elif reached:
                partial = f" ({len(reached)}/{len(targets)})" if len(reached) < len(targets) else ""
                reach_txt = _mean_std(reached) + partial
            else:
                reach_txt = "not reached"
            mean = lambda key: _mean_std([step_mean(r, key) for r in runs])  # noqa: E731
            accuracy.append(
                f"| {s} | {m} | {len(runs)} | {_mean_std([r['initial_accuracy'] for r in runs])} | "
                f"{_mean_std([r['final_accuracy'] for r in runs])} | {_mean_std([r['best_accuracy'] for r in runs])} | "
                f"{reach_txt} | {_mean_std([steady_step_time(r) for r in runs])} |")
            stability.append(
                f"| {s} | {m} | {mean('grad_norm')} | {mean('clip_fraction')} | {mean('chi2_trained')} | "
                f"{mean('ess_fraction')} | {mean('trained_staleness')} | {mean('trained_reuse')} | "
                f"{mean('pmis_mixed_fraction')} | {sum(collapse_events(r['evals']) for r in runs)} |")
    lines = ["Accuracy (greedy, validation) and cost; step s is the median seconds per step over the "
             "second half of each run.", "", *accuracy, "",
             "Stability and replay, per-step means over the run, then mean ± std over seeds.", "", *stability]
    table = "\n".join(lines) + "\n"
    (out / "summary.md").write_text("# Controlled-staleness study\n\nMean ± std over seeds.\n\n" + table)
    try:
        _plots(by_cell, stalenesses, methods, out)
    except ImportError as exc:  # matplotlib missing: tables only
        print(f"no plots: {exc}", file=sys.stderr)
    return table


# the curves of accuracy_vs_*: the study's names, and the archived presets of earlier designs where a study ran them
MAIN_METHODS = ("sync", "naive", "decoupled", "equal_update", "gates_only", "darl_chi2", "darl_v2", "darl_no_prompt", "darl")


def _curve(runs: list[dict[str, Any]], axis: str):
    """Mean x, and mean and std of accuracy over seeds, cut to the shortest run."""
    import numpy as np

    length = min(len(r["evals"]) for r in runs)
    x = np.mean([[e[axis] for e in r["evals"][:length]] for r in runs], axis=0)
    y = np.array([[e["accuracy"] for e in r["evals"][:length]] for r in runs])
    return x, y.mean(0), y.std(0)


def _step_series(runs: list[dict[str, Any]], key: str):
    """Per-step mean over seeds of a step metric (NaN where missing)."""
    import numpy as np

    length = min(len(r["steps"]) for r in runs)
    vals = np.array([[float(s[key]) if isinstance(s.get(key), (int, float)) else np.nan for s in r["steps"][:length]]
                     for r in runs])
    return np.arange(length), np.nanmean(vals, axis=0) if np.isfinite(vals).any() else vals[0]


def _plots(by_cell, stalenesses, methods, out: Path) -> None:
    """accuracy_vs_{samples,wall}_s{S}.png (the three methods), ablations_s{S}.png and replay_s{S}.png
    (D-ARL and its ablations, where run), final_vs_staleness.png (one point per method and s)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    warnings.filterwarnings("ignore", message="Mean of empty slice")

    def curves(ax, s, names, axis):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # more methods than the default cycle's 10 colors
        for m in names:
            runs = by_cell.get((cell_staleness(m, s) if m in METHODS else s, m), [])
            if runs:
                x, mean, std = _curve(runs, axis)
                style = {"color": "black", "lw": 2.2} if m == "darl" else {}  # the preset of the studies before the protocol
                (line,) = ax.plot(x, mean, label=f"{m} (n={len(runs)})", **style)
                ax.fill_between(x, mean - std, mean + std, alpha=0.15, color=line.get_color())
        ax.set_ylabel("greedy validation accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    for s in [s for s in stalenesses if s > 0]:  # sync (s = 0) is drawn in every staleness's figure
        for axis in ("samples", "wall"):
            fig, ax = plt.subplots(figsize=(6, 4))
            main = [m for m in MAIN_METHODS if m in methods]
            if "darl" in main:  # a study of the earlier preset: the presets before it stay in ablations_s{S}.png
                main = [m for m in main if m not in ("darl_chi2", "darl_v2")]
            curves(ax, s, main, axis)
            ax.set_xlabel("generated samples" if axis == "samples" else "wall time, generation + training (s)")
            ax.set_title(f"staleness s = {s} (mean ± std over seeds)")
            fig.tight_layout()
            fig.savefig(out / f"accuracy_vs_{axis}_s{s}.png", dpi=110)
            plt.close(fig)
        ablations = [m for m in methods if m not in ("naive", "decoupled", "sync", "equal_update") and (s, m) in by_cell]
        if len(ablations) < 2:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        curves(ax, s, ["decoupled"] + ablations, "samples")
        ax.set_xlabel("generated samples")
        ax.set_title(f"D-ARL ablations, s = {s}")
        fig.tight_layout()
        fig.savefig(out / f"ablations_s{s}.png", dpi=110)
        plt.close(fig)
        keys = [("trained_staleness", "staleness of trained groups"), ("history_groups", "history groups trained"),
                ("m2_gated_fraction", "m2-gated token fraction"), ("behavior_clip_fraction", "behavior-clipped fraction")]
        fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.4))
        for ax, (key, title) in zip(axes, keys):
            for m in ["decoupled"] + ablations:
                runs = by_cell.get((s, m), [])
                if runs:
                    x, y = _step_series(runs, key)
                    ax.plot(x, y, label=m, lw=1)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=6)
        fig.suptitle(f"replay metrics per step, s = {s} (mean over seeds)", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / f"replay_s{s}.png", dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    if (0, "sync") in by_cell:
        ax.axhline(np.mean([r["final_accuracy"] for r in by_cell[(0, "sync")]]), color="black", ls="--", lw=1,
                   label="sync (s = 0)")
    stalenesses = [s for s in stalenesses if s > 0]
    for m in MAIN_METHODS:
        pts = [(s, [r["final_accuracy"] for r in by_cell[(s, m)]]) for s in stalenesses if (s, m) in by_cell]
        if pts:
            xs = [p[0] for p in pts]
            ax.errorbar(xs, [np.mean(p[1]) for p in pts], yerr=[np.std(p[1]) for p in pts], marker="o", capsize=3,
                        label=m)
    starts = [r["initial_accuracy"] for runs in by_cell.values() for r in runs]
    if starts:
        ax.axhline(sum(starts) / len(starts), color="gray", ls=":", label="start")
    ax.set_xscale("log", base=2)
    ax.set_xticks(stalenesses, [str(s) for s in stalenesses])
    ax.set_xlabel("staleness s (versions)")
    ax.set_ylabel("final greedy validation accuracy")
    ax.set_title("final accuracy (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "final_vs_staleness.png", dpi=110)
    plt.close(fig)


# ---- CLI ------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--methods", nargs="+", default=["naive", "decoupled", "darl"], choices=list(METHODS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--val-size", type=int, default=500)
    p.add_argument("--prompts", type=int, default=32, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--minibatches", type=int, default=1)
    p.add_argument("--task", choices=list(TASKS), default="arithmetic",
                   help="scarce: a fixed pool of hard problems revisited for epochs (the scarce regime); chains: the "
                        "second testbed, chains worked line by line on a 2.3M-parameter model")
    p.add_argument("--jobs", type=int, default=1, help="runs side by side, one thread each")
    p.add_argument("--quick", action="store_true", help="1 seed, s in {1, 4}, 40 steps, val 200: minutes")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--results", type=Path, help="with --report-only: report these runs (a results.jsonl[.gz], "
                   "e.g. an archive under docs/evidence) instead of OUT's")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.eval_every, args.val_size = [0], 40, 10, 200
        if args.staleness == [1, 2, 4, 8]:
            args.staleness = [1, 4]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results_file = args.out / "results.jsonl"
    common = {"steps": args.steps, "eval_every": args.eval_every, "val_size": args.val_size,
              "prompts_per_step": args.prompts, "n": args.n, "lr": args.lr, "minibatches": args.minibatches}
    if args.task != "arithmetic":  # older runs' keys have no task: they stay found
        common["task"] = args.task
    if not args.report_only:
        done = {run_key(r["method_name"], r["staleness"], r["seed"], r["common"]) for r in load_results(results_file)
                if "common" in r}
        specs = planned_runs(args.methods, args.staleness, args.seeds, common, done)
        print(f"{len(specs)} run(s) to do, results in {results_file}", flush=True)
        if specs:
            # build the cached example model once, before any worker needs it
            from benchmarks.staleness.harness import example_settings
            from recipe.darl.example.build import build_example
            build_example(settings=example_settings(args.task))

        from benchmarks.staleness.provenance import provenance, utc_now

        origin = provenance()  # read once, before any run: the code the runs execute is the code at this point
        for spec in specs:
            spec.update(attempts=str(args.out / attempts.NAME), origin=origin)

        def save(result: dict[str, Any]) -> None:
            record_attempt({**result, "common": common, "attempts": str(args.out / attempts.NAME)}, "finished",
                           provenance=origin)
            result["provenance"] = {**origin, "finished": utc_now()}
            with results_file.open("a") as f:
                f.write(json.dumps(result) + "\n")
            print(f"done {result['method_name']} s={result['staleness']} seed={result['seed']}: "
                  f"final {result['final_accuracy']:.3f} best {result['best_accuracy']:.3f} "
                  f"({result['wall']:.0f} s, {result['step_time_mean']:.2f} s/step)", flush=True)

        if args.jobs > 1:
            with ProcessPoolExecutor(args.jobs) as pool:
                for result in pool.map(run_one, specs):
                    result["common"] = common
                    save(result)
        else:
            for spec in specs:
                result = run_one(spec)
                result["common"] = common
                save(result)
    if args.results and not args.report_only:
        raise SystemExit("--results reports an archive and runs nothing: give it with --report-only")
    results = load_results(args.results or results_file)
    if args.results and not results:
        raise SystemExit(f"--results {args.results}: no runs there")
    print(report(results, args.out))
    if not args.results:
        print(attempts.summary(args.out / attempts.NAME))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
