"""The headline table of docs/evidence/before_protocol.md: the preset against each baseline, paired over seeds,
target met or missed.

    python -m benchmarks.staleness.targets docs/evidence/scarce [--out FILE]
    python -m benchmarks.staleness.targets --pipeline docs/evidence/pipeline_scarce    # through verl's trainers

For every staleness s and baseline that ran beside the preset (`darl`): the seeds both have, each method's final
accuracy (mean ± std), the preset minus the baseline in points with its 95% interval (Student's t over the paired
seeds) and the seeds where the preset ended above. The target is the same everywhere: the interval lies above 0
("met"); a mean above 0 whose interval reaches below it is "within noise". Sync runs at s = 0 and pairs with every s.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.staleness.paired import mean_std, paired
from benchmarks.staleness.run_study import study_results

PRESET = "darl"
BASELINES = ("decoupled", "naive", "sync", "gates_only", "equal_update", "darl_no_prompt")


def finals(results: list[dict[str, Any]]) -> dict[tuple[int, str], dict[int, float]]:
    """(staleness, method) -> {seed: final accuracy}."""
    out: dict[tuple[int, str], dict[int, float]] = {}
    for r in results:
        out.setdefault((r["staleness"], r["method_name"]), {})[r["seed"]] = r["final_accuracy"]
    return out


def compare(preset: dict[int, float], other: dict[int, float], **label: Any) -> dict[str, Any]:
    """One row: the label, paired seeds, both finals over those seeds, the difference and its verdict."""
    diff = paired(preset, other)
    seeds = sorted(set(preset) & set(other))
    verdict = "met" if diff.supported else ("within noise" if diff.n > 1 and diff.mean > 0 else "missed")
    return {**label, "seeds": diff.n, "diff": diff, "verdict": verdict,
            "preset": mean_std([preset[x] for x in seeds]) if seeds else "-",
            "other": mean_std([other[x] for x in seeds]) if seeds else "-"}


def headline(results: list[dict[str, Any]], min_seeds: int = 1) -> list[dict[str, Any]]:
    """One row per (s, baseline) with at least `min_seeds` paired seeds."""
    cells = finals(results)
    rows = [compare(cells[(s, PRESET)], cells.get((0 if base == "sync" else s, base), {}), s=s, baseline=base)
            for s in sorted({s for s, m in cells if m == PRESET}) for base in BASELINES]
    return [r for r in rows if r["seeds"] >= max(min_seeds, 1)]


def table(rows: list[dict[str, Any]], first: str = "s") -> str:
    """Markdown; `first` names the key of the first column (s, or trainer)."""
    lines = [f"| {first} | baseline | paired seeds | preset final | baseline final | preset minus baseline, points "
             "[95% interval], seeds above | interval above 0 |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r[first]} | {r['baseline']} | {r['seeds']} | {r['preset']} | {r['other']} | {r['diff'].points()} | "
              f"{'yes' if r['verdict'] == 'met' else '**no**'} ({r['verdict']}) |" for r in rows]
    return "\n".join(lines) + "\n"


PIPELINE_PRESET, PIPELINE_BASELINES = "pmis_sg", ("decoupled", "async", "gates_only", "pmis_sg_no_prompt")


def pipeline_headline(runs: list[dict[str, Any]], samples_per_step: int = 128) -> list[dict[str, Any]]:
    """The same rows through verl's trainers (pipeline_check.sh runs): one per trainer and baseline."""
    from benchmarks.staleness.pipeline_report import as_result

    cells: dict[tuple[str, str], dict[int, float]] = {}
    for run in runs:
        r = as_result(run, samples_per_step)
        cells.setdefault((r["trainer"], r["config"]), {})[r["seed"]] = r["final_accuracy"]
    rows = [compare(cells[(t, PIPELINE_PRESET)], cells.get((t, base), {}), trainer=t, baseline=base)
            for t in sorted({t for t, c in cells if c == PIPELINE_PRESET}) for base in PIPELINE_BASELINES]
    return [r for r in rows if r["seeds"] > 0]


def pipeline_table(rows: list[dict[str, Any]]) -> str:
    return table(rows, first="trainer")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study", type=Path, help="a study folder with results.jsonl or results.jsonl.gz")
    p.add_argument("--pipeline", action="store_true", help="the study is pipeline_check.sh's (its results.jsonl.gz)")
    p.add_argument("--min-seeds", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.pipeline:
        from benchmarks.staleness.pipeline_report import load_runs

        source = args.study / "results.jsonl.gz" if (args.study / "results.jsonl.gz").exists() else args.study
        text = pipeline_table(pipeline_headline(load_runs(source)))
    else:
        text = table(headline(study_results(args.study), args.min_seeds))
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
