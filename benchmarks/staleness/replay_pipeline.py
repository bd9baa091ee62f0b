"""Section 5 through verl's fully-async trainer (docs/evidence/protocol.md): the preset, replay off and per-prompt
replay alone through the fully-async CPU launch script, on section 5's held-out seeds, at the threshold section 6
supports.

    python -m benchmarks.staleness.replay_pipeline threshold runs/protocol/scarce/threshold_heldout   # where it runs
    python -m benchmarks.staleness.replay_pipeline report runs/protocol/scarce/replay_pipeline         # the table

The stage's folder has section 6's layout (`t<threshold>/fully_async/seedS/CONFIG/...`), so its runs are read, archived
and restored by threshold_sweep's functions. The family is the preset minus replay off and per-prompt replay alone
minus replay off, Holm's correction across the two.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.staleness import threshold_sweep as sweep
from benchmarks.staleness.protocol import (REPLAY_CONFIGS, REPLAY_HELDOUT_SEEDS, complete_seeds, finals_by_cell,
                                           headline_table, holm_verdicts, paired_row)

FALLBACK = 4  # where the pipeline stage (section 4) supported the preset, if section 6 supports no threshold


def threshold(sweep_runs: list[dict[str, Any]]) -> float | None:
    """The smallest threshold from which section 6 supports the preset's gain (FALLBACK if none is supported), once
    every one of its held-out seeds has its launches; None before that."""
    seeds = sweep.HELDOUT_SEEDS
    keys = [(t, c) for t in sweep.THRESHOLDS for c in sweep.CONFIGS]
    if len(complete_seeds(finals_by_cell(sweep_runs, seeds), seeds, keys)) < len(seeds):
        return None
    start = sweep.pays_from(sweep.family(sweep_runs, seeds)[0])
    return FALLBACK if start is None else start


def report(runs: list[dict[str, Any]]) -> str:
    """The two comparisons with their Holm verdicts at the stage's threshold, once every held-out seed has its three
    launches; before that, only how many seeds have them."""
    thresholds = sorted({r["staleness"] for r in runs})
    if len(thresholds) > 1:
        raise ValueError(f"replay_pipeline: one threshold per stage, found {thresholds}")
    t = thresholds[0] if thresholds else None
    cells = finals_by_cell(runs, REPLAY_HELDOUT_SEEDS)
    whole = complete_seeds(cells, REPLAY_HELDOUT_SEEDS, [(t, c) for c in REPLAY_CONFIGS])
    head = f"{len(whole)} of {len(REPLAY_HELDOUT_SEEDS)} held-out seeds have their three launches"
    if len(whole) < len(REPLAY_HELDOUT_SEEDS):  # no interim table: the family is read once, whole
        return head + "; the table follows once all have them.\n"
    preset, off, prompt_only = REPLAY_CONFIGS
    family = holm_verdicts([{**paired_row(cells, t, a, off), "threshold": t} for a in (preset, prompt_only)])
    return f"{head} (staleness_threshold {t:g}).\n\n" + headline_table(family, [], first="threshold")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["threshold", "report"])
    p.add_argument("stage", type=Path, help="threshold: section 6's held-out stage (or archive); report: this stage's")
    args = p.parse_args(argv)
    if args.command == "report":
        print(report(sweep.results(args.stage)), end="")
        return 0
    t = threshold(sweep.results(args.stage))
    if t is None:
        print("section 6 has not reported yet: its held-out seeds lack launches", file=sys.stderr)
        return 1
    print(format(t, "g"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
