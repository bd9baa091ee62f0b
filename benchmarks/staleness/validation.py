"""Does a regime model the problem? The testbed validation that comes before any method is compared.

    python -m benchmarks.staleness.validation runs/validation/scarce [--out FILE]

ROOT holds one study folder per learning rate, `lr<LR>/results.jsonl` (run_study's output). Two tables:

1. on-policy training (`sync`, s = 0) at every learning rate: final accuracy over seeds; the regime's learning
   rate is sync's best mean;
2. at that rate, each stale baseline (decoupled PPO, naive async) at each staleness minus sync, paired over seeds
   with a 95% interval. Staleness hurts in the regime when every such interval lies below zero.

Pairs are counted side by side only when both records share commit and machine (`provenance.same_origin`).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchmarks.staleness.paired import mean_std, paired
from benchmarks.staleness.provenance import same_origin
from benchmarks.staleness.run_study import load_results

STALE_BASELINES = ("decoupled", "naive")


def by_lr(root: Path) -> dict[float, list[dict[str, Any]]]:
    """lr -> the runs of ROOT/lr*/results.jsonl (read from each record's own config, not from the folder's name)."""
    out: dict[float, list[dict[str, Any]]] = {}
    for folder in sorted(root.glob("lr*")):
        for r in load_results(folder / "results.jsonl"):
            out.setdefault(float(r["common"]["lr"]), []).append(r)
    return out


def _finals(runs: list[dict[str, Any]], method: str, staleness: int) -> dict[int, dict[str, Any]]:
    return {r["seed"]: r for r in runs if r["method_name"] == method and r["staleness"] == staleness}


def best_lr(runs: dict[float, list[dict[str, Any]]], min_seeds: int = 1) -> float | None:
    """The learning rate with the highest mean final accuracy of sync over at least `min_seeds` seeds."""
    means = {lr: statistics.fmean(r["final_accuracy"] for r in _finals(rs, "sync", 0).values())
             for lr, rs in runs.items() if len(_finals(rs, "sync", 0)) >= min_seeds}
    return max(means, key=means.get) if means else None


def sync_table(runs: dict[float, list[dict[str, Any]]]) -> str:
    lines = ["| lr | sync seeds | sync final | sync best during run | start |", "|---|---|---|---|---|"]
    for lr in sorted(runs):
        sync = _finals(runs[lr], "sync", 0)
        if sync:
            rs = list(sync.values())
            lines.append(f"| {lr:g} | {len(rs)} | {mean_std([r['final_accuracy'] for r in rs])} | "
                         f"{mean_std([r['best_accuracy'] for r in rs])} | "
                         f"{mean_std([r['initial_accuracy'] for r in rs])} |")
    return "\n".join(lines) + "\n"


def staleness_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (baseline, s > 0) that ran beside sync: baseline minus sync, paired over seeds."""
    sync = _finals(runs, "sync", 0)
    rows = []
    for s in sorted({r["staleness"] for r in runs if r["staleness"] > 0}):
        for m in STALE_BASELINES:
            other = _finals(runs, m, s)
            seeds = sorted(set(sync) & set(other))
            if not seeds:
                continue
            diff = paired({x: other[x]["final_accuracy"] for x in seeds}, {x: sync[x]["final_accuracy"] for x in seeds})
            side = sum(same_origin(other[x].get("provenance"), sync[x].get("provenance")) for x in seeds)
            rows.append({"s": s, "method": m, "seeds": len(seeds), "side_by_side": side, "diff": diff,
                         "sync": mean_std([sync[x]["final_accuracy"] for x in seeds]),
                         "other": mean_std([other[x]["final_accuracy"] for x in seeds]),
                         "hurts": diff.n > 1 and diff.high < 0})
    return rows


def staleness_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| s | method | paired seeds (side by side) | method final | sync final | method minus sync, points "
             "[95% interval], seeds above | staleness hurts (interval below 0) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['s']} | {r['method']} | {r['seeds']} ({r['side_by_side']}) | {r['other']} | {r['sync']} | "
              f"{r['diff'].points()} | {'yes' if r['hurts'] else '**no**'} |" for r in rows]
    return "\n".join(lines) + "\n"


def report(root: Path, min_seeds: int = 1) -> str:
    runs = by_lr(root)
    if not runs:
        raise SystemExit(f"no runs under {root}/lr*/results.jsonl")
    lr = best_lr(runs, min_seeds)
    text = f"On-policy training (sync, s = 0) by learning rate, {root.name}:\n\n" + sync_table(runs)
    if lr is None:
        return text
    rows = staleness_rows(runs[lr])
    text += f"\nThe regime's learning rate: {lr:g} (sync's best mean final accuracy).\n"
    if rows:
        verdict = "yes" if all(r["hurts"] for r in rows) else "no"
        text += (f"\nStale training against sync at lr {lr:g}:\n\n" + staleness_table(rows)
                 + f"\nStaleness hurts in every cell: **{verdict}**.\n")
    return text


def validated(root: Path, stalenesses: tuple[int, ...] = (4, 8), seeds: int = 8) -> bool:
    """The regime under `root` models the problem (docs/evidence/protocol.md, section 1): at sync's best learning rate
    every baseline at every s of `stalenesses`, paired with sync over `seeds` seeds, ends below it (interval < 0)."""
    runs = by_lr(root)
    lr = best_lr(runs) if runs else None
    if lr is None:
        return False
    rows = staleness_rows(runs[lr])
    needed = {(s, m) for s in stalenesses for m in STALE_BASELINES}
    done = {(r["s"], r["method"]) for r in rows if r["seeds"] >= seeds}
    return needed <= done and all(r["hurts"] for r in rows if (r["s"], r["method"]) in needed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="a folder of lr<LR>/results.jsonl studies")
    p.add_argument("--min-seeds", type=int, default=1, help="sync seeds a learning rate needs to be chosen")
    p.add_argument("--out", type=Path)
    p.add_argument("--check", action="store_true", help="exit 0 when the regime is validated, 1 otherwise")
    args = p.parse_args(argv)
    if args.check:
        ok = validated(args.root)
        print(f"{args.root}: {'validated' if ok else 'not validated'}: staleness "
              f"{'hurts' if ok else 'does not hurt'} in every cell at s = 4 and 8 over 8 paired seeds")
        return 0 if ok else 1
    text = report(args.root, args.min_seeds)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
