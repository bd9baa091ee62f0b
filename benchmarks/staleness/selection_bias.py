"""What the chi2 selection prefers: rank correlations of a buffered group's score with its traits.

    OMP_NUM_THREADS=1 python -m benchmarks.staleness.selection_bias    # about 2 min on one core

Runs `darl` (the study's settings, s = 4, seed 0) for 14 steps and pools the buffered groups of
steps 8-13: for each, its last chi2 score, its per-token NLL under the behavior policy (a
confidence proxy), how many updates already used it, its staleness and its mean response length.
Prints Spearman correlations with the score and the means of the low- and high-score halves.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks.staleness.harness import Harness, HarnessConfig

TRAITS = ("nll per token under mu", "updates already trained on", "staleness", "response length")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(x.argsort().argsort(), y.argsort().argsort())[0, 1])


def collect(staleness: int, seed: int, steps: int, first: int) -> np.ndarray:
    """[G, 5] rows of (score, nll, times trained, staleness, length) over the buffered groups."""
    torch.set_num_threads(1)
    harness = Harness(HarnessConfig(method="darl", staleness=staleness, seed=seed, steps=steps, lr=5e-5,
                                    minibatches=2))
    rows = []
    for i in range(steps):
        harness.step()
        if i < first:
            continue
        t = harness.version - 1
        for g in harness.buffer.groups:
            if g.score is not None:
                nll = float(-g.rollout_log_probs[g.response_mask].mean())
                rows.append((g.score, nll, g.times_trained, t - g.version, float(g.lengths.float().mean())))
    return np.array(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--staleness", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--first", type=int, default=8, help="first step whose buffer is pooled")
    args = p.parse_args(argv)
    rows = collect(args.staleness, args.seed, args.steps, args.first)
    low = rows[:, 0] <= np.median(rows[:, 0])
    print(f"{len(rows)} buffered groups, steps {args.first}-{args.steps - 1}, s = {args.staleness}\n")
    print("| trait | Spearman with chi2 score | low-score half | high-score half |\n|---|---|---|---|")
    for j, name in enumerate(TRAITS, start=1):
        print(f"| {name} | {spearman(rows[:, 0], rows[:, j]):+.2f} | {rows[low, j].mean():.3f} | {rows[~low, j].mean():.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
