"""Where the preset starts to pay through verl's fully-async trainer (docs/evidence/protocol.md, section 6): the
preset, decoupled PPO and the strongest simple alternative through the fully-async CPU launch script at
`staleness_threshold` 0.5, 1, 2 and 4.

    python -m benchmarks.staleness.threshold_sweep power runs/protocol/scarce/threshold_dev     # held-out seed count
    python -m benchmarks.staleness.threshold_sweep report runs/protocol/scarce/threshold_heldout # the table, verdicts
    python -m benchmarks.staleness.threshold_sweep archive runs/protocol/scarce/threshold_heldout \\
        docs/evidence/protocol/scarce/threshold_heldout                                        # raw runs, kept
    python -m benchmarks.staleness.threshold_sweep restore docs/evidence/protocol/scarce/threshold_heldout \\
        runs/protocol/scarce/threshold_heldout                                                 # and back, to resume

A stage's folder holds one pipeline_check.sh output per threshold (`t0.5/fully_async/seedS/CONFIG/...`); its
archive, one results.jsonl.gz per threshold. The family is the preset minus decoupled PPO at each threshold (Holm's
correction across the four); the preset minus the alternative follows, secondary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

from benchmarks.staleness import attempts, pipeline_report
from benchmarks.staleness.paired import detectable_effect, seeds_for_power
from benchmarks.staleness.protocol import complete_seeds, finals_by_cell, paired_row, holm_verdicts, headline_table

PRESET, BASELINE, ALTERNATIVE = "darl_tokens_e2", "decoupled", "decoupled_prompt_e2"
CONFIGS = (BASELINE, PRESET, ALTERNATIVE)
THRESHOLDS = (0.5, 1, 2, 4)
DEV_THRESHOLDS = (0.5, 1, 2)  # threshold 4 has the pipeline stage's 12 held-out seeds already
# drawn at random from 10000-99999 before any of their runs
DEV_SEEDS = (50549, 74533)
# drawn at random from 100000-999999 after the development block, before any of their runs (section 6)
HELDOUT_SEEDS: tuple[int, ...] = (253536, 297790, 344205, 353025, 680432, 688551, 733248, 780002, 806915, 869486,
                                  875508, 978386)
MIN_SEEDS, MAX_SEEDS = 6, 12  # a held-out seed is 12 launches, about 2 h on 2 cores
STEPS = 50  # a run counts once its last step is logged


def folder(threshold: float) -> str:
    """The sub-folder of a stage holding one threshold's runs: t0.5, t1, t2, t4."""
    return f"t{threshold:g}"


def results(stage: Path) -> list[dict[str, Any]]:
    """The stage's finished runs (a folder of pipeline_check.sh outputs or of archives) in the harness's result shape,
    with the threshold as `staleness`; provenance only where every launch of a run ran from one clean commit on one
    machine."""
    out = []
    for t in THRESHOLDS:
        source = stage / folder(t)
        packed = source / "results.jsonl.gz"
        if not packed.exists() and not any(source.glob("*/seed*/*/metrics.jsonl")):
            continue  # no launch yet, or (archived) only the attempts of a launch that had not finished
        for run in pipeline_report.load_runs(packed if packed.exists() else source):
            if not any(r.get("step") == STEPS for r in run["records"]):
                continue  # unfinished: a run in flight or a failed launch
            r = pipeline_report.as_result(run, 0)
            out.append({"seed": run["seed"], "method_name": run["config"], "staleness": t,
                        "final_accuracy": r["final_accuracy"], "provenance": pipeline_report.origin(run)})
    return out


def family(runs: list[dict[str, Any]], seeds: Iterable[int], thresholds: Iterable[float] = THRESHOLDS):
    """(the preset minus decoupled PPO at each threshold, Holm-adjusted; the preset minus the alternative, secondary),
    each paired over the seeds both sides have."""
    cells = finals_by_cell(runs, seeds)
    rows = [{**paired_row(cells, t, PRESET, BASELINE), "threshold": t} for t in thresholds]
    secondary = [{**paired_row(cells, t, PRESET, ALTERNATIVE), "threshold": t} for t in thresholds]
    return holm_verdicts(rows), [r for r in secondary if r["diff"].n > 0]


def pays_from(rows: list[dict[str, Any]]) -> float | None:
    """The smallest threshold from which the preset's gain over decoupled PPO is supported at it and at every larger
    threshold of the sweep; None when it is not supported at the largest."""
    start = None
    for row in sorted(rows, key=lambda r: r["threshold"], reverse=True):
        if row["verdict"] != "supported":
            break
        start = row["threshold"]
    return start


def power(runs: list[dict[str, Any]], effect: float = 0.03) -> str:
    """The development block: the preset minus decoupled PPO at each development threshold, the differences' largest
    standard deviation, and the held-out seeds that give a paired t test 80% power for `effect` (in [MIN_SEEDS,
    MAX_SEEDS]; at the cap, the difference that count detects)."""
    cells = finals_by_cell(runs, DEV_SEEDS)
    lines = ["| threshold | comparison | development seeds | difference, points [95% interval] | sd, points |",
             "|---|---|---|---|---|"]
    sds = []
    for t in DEV_THRESHOLDS:
        row = paired_row(cells, t, PRESET, BASELINE)
        a, b = cells.get((t, PRESET), {}), cells.get((t, BASELINE), {})
        diffs = [a[s]["final_accuracy"] - b[s]["final_accuracy"] for s in sorted(set(a) & set(b))]
        sds.append(statistics.stdev(diffs) if len(diffs) > 1 else float("nan"))
        lines.append(f"| {t:g} | {PRESET} - {BASELINE} | {row['diff'].n} | {row['diff'].points()} | {100 * sds[-1]:.1f} |")
    text = "\n".join(lines) + "\n\n"
    if any(sd != sd for sd in sds):  # nan: a development run is missing
        return text + "held-out seeds: not yet (a development run is missing)\n"
    sd = max(sds)
    n = seeds_for_power(sd, effect, low=MIN_SEEDS, high=MAX_SEEDS)
    return text + (f"largest sd {100 * sd:.1f} points: held-out seeds {n}; 80% power at "
                   f"{100 * detectable_effect(sd, n):.1f} points\n")


def report(runs: list[dict[str, Any]], seeds: Iterable[int] = HELDOUT_SEEDS) -> str:
    """The held-out table with its verdicts, and where the preset starts to pay, once every seed has its launches
    (three configurations at four thresholds); before that, only how many seeds have them."""
    seeds = list(seeds)
    whole = complete_seeds(finals_by_cell(runs, seeds), seeds, [(t, c) for t in THRESHOLDS for c in CONFIGS])
    head = f"{len(whole)} of {len(seeds)} held-out seeds have their {len(THRESHOLDS) * len(CONFIGS)} launches"
    if len(whole) < len(seeds):  # no interim table: the family is read once, whole
        return head + "; the table follows once all have them.\n"
    rows, secondary = family(runs, seeds)
    start = pays_from(rows)
    where = (f"the preset's gain over decoupled PPO is supported from staleness_threshold {start:g} up"
             if start is not None else "the preset's gain over decoupled PPO is not supported at the largest threshold")
    return f"{head}.\n\n" + headline_table(rows, secondary, first="threshold") + f"\n{where}\n"


def archive(stage: Path, dest: Path) -> list[Path]:
    """Each threshold's runs of STAGE as DEST/t<threshold>/results.jsonl.gz (finished runs only), and its launch
    attempts (attempts.jsonl, every launch: finished, failed or interrupted) beside them."""
    written = []
    for t in THRESHOLDS:
        if (stage / folder(t) / attempts.NAME).exists():
            written.append(attempts.pack(stage / folder(t) / attempts.NAME, dest / folder(t) / (attempts.NAME + ".gz")))
        if (stage / folder(t)).exists():
            runs = [r for r in pipeline_report.load_runs(stage / folder(t))
                    if any(x.get("step") == STEPS for x in r["records"])]
            if runs:  # a threshold whose first launch is still running has nothing to keep yet
                written.append(pipeline_report.archive(runs, dest / folder(t)))
    return written


def restore(dest: Path, stage: Path) -> int:
    """The archived runs STAGE lacks, back as run folders (pipeline_check.sh then counts them as done)."""
    n = 0
    for t in THRESHOLDS:
        if (dest / folder(t) / (attempts.NAME + ".gz")).exists():
            attempts.unpack(dest / folder(t) / (attempts.NAME + ".gz"), stage / folder(t) / attempts.NAME)
        packed = dest / folder(t) / "results.jsonl.gz"
        if packed.exists():
            n += len(pipeline_report.restore(pipeline_report.load_runs(packed), stage / folder(t)))
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["power", "report", "archive", "restore"])
    p.add_argument("source", type=Path, nargs="?", help="a stage's folder, or its archive folder")
    p.add_argument("dest", type=Path, nargs="?", help="archive: where to; restore: the stage's folder")
    args = p.parse_args(argv)
    if args.command in ("power", "report") and not any((args.source / folder(t)).is_dir() for t in THRESHOLDS):
        p.error(f"{args.source} holds no threshold folder ({', '.join(folder(t) for t in THRESHOLDS)}): pass the "
                "stage's folder, for example runs/protocol/scarce/threshold_heldout")
    if args.command == "power":
        print(power(results(args.source)))
    elif args.command == "report":
        print(report(results(args.source)))
    elif args.command == "archive":
        print("\n".join(map(str, archive(args.source, args.dest))))
    else:
        print(f"restored {restore(args.source, args.dest)} runs into {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
