"""The issue-10 targets, met or missed, from one study's two regimes (docs/evidence.md).

    python -m benchmarks.staleness.targets --benign runs/study/benign --stress runs/study/stress [--out FILE]

Stress (s = 8): the preset ends >= 5 points above the better of naive and decoupled, <= 3 points below
sync, with no collapse (an evaluation 0.15 below an earlier best). Benign (s = 1, 4, 8): the preset ends at
or above decoupled; at s = 4 and 8 it reaches decoupled's final accuracy with <= 0.75x its samples.
Cost: the preset's median step time <= 1.2x decoupled's in every cell where both ran.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchmarks.staleness.run_study import collapse_events, load_results, samples_to_reach, steady_step_time

PRESET = "darl"


def _cells(results: list[dict[str, Any]]) -> dict[tuple[int, str], list[dict[str, Any]]]:
    cells: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in results:
        cells.setdefault((r["staleness"], r["method_name"]), []).append(r)
    return cells


def _final(runs: list[dict[str, Any]]) -> float:
    return statistics.mean(r["final_accuracy"] for r in runs)


def _fmt(x: float) -> str:
    return f"{x:+.3f}"


def targets(benign: list[dict[str, Any]], stress: list[dict[str, Any]]) -> list[tuple[str, str, str, bool]]:
    """(target, measured, needed, met) rows."""
    rows = []
    cells = _cells(stress)
    if (8, PRESET) in cells:
        preset = _final(cells[(8, PRESET)])
        rivals = {m: _final(cells[(8, m)]) for m in ("naive", "decoupled") if (8, m) in cells}
        if rivals:
            best = max(rivals, key=rivals.get)
            gap = preset - rivals[best]
            rows.append(("stress s=8: preset - better of naive/decoupled", f"{_fmt(gap)} ({preset:.3f} vs {best} {rivals[best]:.3f})",
                         ">= +0.050", gap >= 0.05))
        if (0, "sync") in cells:
            sync = _final(cells[(0, "sync")])
            rows.append(("stress s=8: preset - sync", f"{_fmt(preset - sync)} ({preset:.3f} vs {sync:.3f})", ">= -0.030",
                         preset - sync >= -0.03))
        falls = sum(collapse_events(r["evals"]) for r in cells[(8, PRESET)])
        rows.append(("stress s=8: preset collapses", f"{falls} in {len(cells[(8, PRESET)])} runs", "0", falls == 0))
    cells_b = _cells(benign)
    for s in (1, 4, 8):
        if (s, PRESET) in cells_b and (s, "decoupled") in cells_b:
            preset, dec = _final(cells_b[(s, PRESET)]), _final(cells_b[(s, "decoupled")])
            rows.append((f"benign s={s}: preset - decoupled", f"{_fmt(preset - dec)} ({preset:.3f} vs {dec:.3f})", ">= 0",
                         preset - dec >= 0))
            if s in (4, 8):
                ratios = []
                dec_by_seed = {r["seed"]: r for r in cells_b[(s, "decoupled")]}
                for r in cells_b[(s, PRESET)]:
                    ref = dec_by_seed.get(r["seed"])
                    if ref is None:
                        continue
                    got = samples_to_reach(r["evals"], ref["final_accuracy"])
                    ratios.append(float("inf") if got is None else got / ref["samples"])
                if ratios:
                    mean = statistics.mean(ratios)
                    text = ", ".join("not reached" if x == float("inf") else f"{x:.2f}" for x in ratios)
                    rows.append((f"benign s={s}: preset's samples to decoupled's final (per seed)", text, "<= 0.75x",
                                 mean <= 0.75))
    for regime, cs in (("stress", cells), ("benign", cells_b)):
        for (s, m), runs in sorted(cs.items()):
            if m != PRESET or (s, "decoupled") not in cs:
                continue
            # only runs timed side by side in this study (not those copied from the first study)
            ref = [r for r in cs[(s, "decoupled")] if "reused_from" not in r]
            if not ref:
                continue
            ratio = statistics.median(steady_step_time(r) for r in runs) / statistics.median(
                steady_step_time(r) for r in ref)
            rows.append((f"{regime} s={s}: preset step time / decoupled's", f"{ratio:.2f}x", "<= 1.2x", ratio <= 1.2))
    return rows


def table(rows: list[tuple[str, str, str, bool]]) -> str:
    lines = ["| target | measured | needed | met |", "|---|---|---|---|"]
    lines += [f"| {t} | {m} | {n} | {'yes' if ok else '**no**'} |" for t, m, n, ok in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--benign", type=Path, required=True)
    p.add_argument("--stress", type=Path, required=True)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    text = table(targets(load_results(args.benign / "results.jsonl"), load_results(args.stress / "results.jsonl")))
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
