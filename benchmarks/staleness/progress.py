"""How far the studies of docs/evidence/protocol.md sections 5-7 have come: runs finished of runs planned.

    python -m benchmarks.staleness.progress docs/evidence/protocol   # the archive (the table docs/evidence.md holds)
    python -m benchmarks.staleness.progress runs/protocol            # a study folder, while its stages run

A run counts once it is finished and belongs to its stage's plan (its configuration, staleness and seed); the plan is
the stage's constants, so the table says how much is left before each held-out report prints its table. A whole chains
validation in which staleness does not hurt ends section 7 there: its later stages are listed as not run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Iterable

from benchmarks.staleness import chains_study as chains
from benchmarks.staleness import protocol, threshold_sweep
from benchmarks.staleness import validation as regime
from benchmarks.staleness.run_study import cell_staleness, load_results


def _cells(names: Iterable[str], stalenesses: Iterable[float], seeds: Iterable[int]) -> set[tuple]:
    """(configuration, staleness, seed) of every planned run; sync once a seed, at s = 0, as run_study plans it."""
    return {(n, cell_staleness(n, s), seed) for n in names for s in stalenesses for seed in seeds}


def _finished(results: Iterable[dict], plan: set[tuple] | None = None, seeds: Iterable[int] = ()) -> int:
    """The distinct finished runs in `plan` (or, with no plan, on `seeds`)."""
    keys = {(r["method_name"], r["staleness"], r["seed"]) for r in results}
    return len(keys & plan) if plan is not None else sum(k[2] in set(seeds) for k in keys)


def rows(root: Path) -> list[tuple[str, int, int]]:
    """(study, finished runs, planned runs) for each stage of sections 5-7, read from ROOT (a study folder or its
    archive)."""
    replay = _cells(protocol.REPLAY_CONFIGS, protocol.STALENESS, protocol.REPLAY_HELDOUT_SEEDS)
    # through fully-async at one threshold (any of the sweep's), each held-out seed's three launches
    replay_leg = _cells(protocol.REPLAY_CONFIGS, threshold_sweep.THRESHOLDS, protocol.REPLAY_HELDOUT_SEEDS)
    sweep = _cells(threshold_sweep.CONFIGS, threshold_sweep.THRESHOLDS, threshold_sweep.HELDOUT_SEEDS)
    # validation: sync at every rate over its seeds, then sync, decoupled PPO and naive async at s = 4 and 8 over the
    # stale seeds at sync's best rate, where sync's first seeds have run already
    sync_runs = len(chains.LRS) * len(chains.SYNC_SEEDS)
    stale_runs = len(_cells(("sync", "decoupled", "naive"), protocol.STALENESS, chains.STALE_SEEDS))
    validation = sync_runs + stale_runs - len(set(chains.SYNC_SEEDS) & set(chains.STALE_SEEDS))
    chains_validation = root / "validation" / "chains"
    validation_done = {(r["common"]["lr"], r["method_name"], r["staleness"], r["seed"])
                       for folder in sorted(chains_validation.glob("lr*"))
                       for r in load_results(folder / "results.jsonl")}
    # protocol.md, section 7: where staleness does not hurt, no method comparison runs on the testbed
    chains_stopped = len(validation_done) >= validation and not regime.validated(chains_validation)
    dev = _cells(chains.DEV_CONFIGS, protocol.STALENESS, chains.DEV_SEEDS)
    # held out: sync once a seed; decoupled PPO, replay off and the two chosen at s = 4 and 8
    heldout = len(chains.HELDOUT_SEEDS) * (1 + 4 * len(protocol.STALENESS))
    scarce, chain = root / "scarce", root / "chains"
    out = [
        ("section 5, replay's own share: held-out runs (harness)",
         _finished(load_results(scarce / "replay_heldout" / "results.jsonl"), replay), len(replay)),
        ("section 5, replay's own share: held-out launches (fully-async)",
         _finished(threshold_sweep.results(scarce / "replay_pipeline"), replay_leg),
         len(protocol.REPLAY_CONFIGS) * len(protocol.REPLAY_HELDOUT_SEEDS)),
        ("section 6, where the preset starts to pay: held-out launches (fully-async)",
         _finished(threshold_sweep.results(scarce / "threshold_heldout"), sweep), len(sweep)),
        ("section 7, chains testbed: validation runs", len(validation_done), validation),
    ]
    if chains_stopped:
        return out + [("section 7, chains testbed: development and held-out runs (not run: staleness does not hurt "
                       "there)", 0, 0)]
    return out + [
        ("section 7, chains testbed: development runs",
         _finished(load_results(chain / "dev" / "results.jsonl"), dev), len(dev)),
        ("section 7, chains testbed: held-out runs",
         _finished(load_results(chain / "heldout" / "results.jsonl"), seeds=chains.HELDOUT_SEEDS), heldout),
    ]


def table(root: Path) -> str:
    lines = ["| study | finished | planned |", "|---|---|---|"]
    lines += [f"| {study} | {done} | {planned} |" for study, done, planned in rows(root)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="a study folder (runs/protocol) or its archive (docs/evidence/protocol)")
    print(table(p.parse_args(argv).root), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
