"""Speed and memory of the D-ARL core on a GPU-scale candidate set, on CPU.

Builds K versions x P prompts x n responses x L response tokens of synthetic log-probs, and reports
the median time of: buffer insert (one fresh batch packed into groups), chi2 scoring of every
candidate, group selection, and the multi-behavior weights of the selected batch; plus the bytes
the buffer holds per stored response token. Prints a markdown table (docs/performance.md).

    python benchmarks/bench_core.py                       # 512 x 8 x 4096 x K=4, as in docs/
    python benchmarks/bench_core.py --prompts 64 --length 512 --repeats 3   # a quick look
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from recipe.darl.core import Group, ReplayBuffer, ReplayConfig, batch_weights, gather_recorded, group_scores, sample_chi2, select_groups


def median_seconds(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def fresh_batch(prompts: int, n: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """A verl-shaped batch: right-padded responses, lengths uniform in [length/4, length]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 4, length + 1, (prompts * n,), generator=g)
    valid = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    return {
        "responses": torch.randint(0, 150_000, (prompts * n, length), generator=g) * valid,
        "lengths": lengths,
        "mask": valid,
        "rollout_log_probs": torch.where(valid, -torch.rand(prompts * n, length, generator=g) * 2, 0.0),
        "rewards": torch.randint(0, 2, (prompts * n,), generator=g).float(),
        "prompts": torch.randint(0, 150_000, (prompts, 256), generator=g),
    }


def to_groups(batch: dict[str, torch.Tensor], version: int, n: int) -> list[Group]:
    groups = []
    for p in range(batch["prompts"].shape[0]):
        rows = slice(p * n, (p + 1) * n)
        groups.append(Group.from_padded(
            f"{version}-{p}", version, batch["prompts"][p], 256, batch["responses"][rows], batch["lengths"][rows],
            batch["mask"][rows], batch["rollout_log_probs"][rows], batch["rewards"][rows]))
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    P, n, L, K = args.prompts, args.n, args.length, args.k

    buffer = ReplayBuffer(ReplayConfig(pmis=False, k=K, warmup=0, filter_zero_adv=False))
    insert_times = []
    for step in range(1, K + 1):
        batch = fresh_batch(P, n, L, seed=step)
        t, groups = median_seconds(lambda: to_groups(batch, step - 1, n), 1)
        insert_times.append(t)
        cands = buffer.begin_step(groups, step)
        for g in cands.candidates:  # every stored group gets the proximal log-probs of this step
            g.record(step, g.rollout_log_probs - 0.05)
        buffer.end_step(cands, [])
    stats = buffer.stats()
    recorded_versions = sum(len(g.recorded) for g in buffer.groups) / len(buffer.groups)

    # the step-(K+1) candidate set, padded as the trainer has it after the old-log-prob recompute
    cands = buffer.begin_step([], K + 1)
    groups = cands.candidates
    mask = torch.cat([g.padded("response_mask", L) for g in groups])
    rollout = torch.cat([g.padded("rollout_log_probs", L) for g in groups])
    noise = torch.randn(rollout.shape, generator=torch.Generator().manual_seed(0)) * 0.3
    old = torch.where(mask, rollout + noise, 0.0)
    group_index = torch.arange(len(groups)).repeat_interleave(n)
    versions = torch.tensor([g.version for g in groups])
    arrival = torch.tensor([g.seq for g in groups])

    t_score, scores = median_seconds(lambda: group_scores(sample_chi2(old, rollout, mask), group_index, len(groups)), args.repeats)
    # newest first (uniform replay), the trained set the weights below are timed on
    t_select, sel = median_seconds(lambda: select_groups(P, versions, arrival, multiple=1), args.repeats)

    rows = torch.cat([torch.arange(i * n, (i + 1) * n) for i in sel.selected])
    chosen = [groups[i] for i in sel.selected]
    recorded = gather_recorded(chosen, L)
    sample_versions = versions[sel.selected].repeat_interleave(n)
    t_weights, _ = median_seconds(
        lambda: batch_weights(mask[rows], old[rows], rollout[rows], sample_versions, "pmis", "ess", 2.0, recorded=recorded),
        args.repeats,
    )

    t_gated, gated = median_seconds(
        lambda: batch_weights(mask[rows], old[rows], rollout[rows], sample_versions, "pmis", "ess", 2.0, recorded=recorded,
                              m2_budget=0.04),
        args.repeats,
    )
    # the preset's selection: fresh first, then least-reused replayed groups (no scores needed)
    fresh = torch.tensor([g.version == K - 1 for g in groups])
    reuse = torch.arange(len(groups)) % 3
    t_preset, _ = median_seconds(
        lambda: select_groups(P, versions, arrival, multiple=1, order="least_reused", reuse=reuse, fresh=fresh,
                              extra=P // 2), args.repeats)

    tokens = stats["tokens"]
    figures = {
        "candidates": f"{len(groups)} groups x {n} responses x <= {L} tokens ({int(mask.sum()):,} response tokens)",
        "insert_s": statistics.median(insert_times),
        "score_s": t_score,
        "select_s": t_select,
        "score_plus_select_s": t_score + t_select,
        "weights_s": t_weights,
        "weights_m2_gate_s": t_gated,
        "m2_gated_fraction": gated.metrics["m2_gated_fraction"],
        "preset_select_s": t_preset,
        "buffer_bytes": stats["bytes"],
        "bytes_per_token": stats["bytes"] / tokens,
        "recorded_versions_per_group": recorded_versions,
        "bytes_per_token_without_recorded": (stats["bytes"] - 4 * recorded_versions * tokens) / tokens,
        "threads": args.threads,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }
    print(f"| figure | value |\n|---|---|")
    print(f"| candidate set | {figures['candidates']} |")
    print(f"| buffer insert, one batch of {P} groups (median) | {figures['insert_s']:.3f} s |")
    print(f"| chi2 scoring of all candidates (median of {args.repeats}) | {figures['score_s']:.3f} s |")
    print(f"| selection (median of {args.repeats}) | {figures['select_s'] * 1000:.1f} ms |")
    print(f"| scoring + selection | {figures['score_plus_select_s']:.3f} s |")
    print(f"| pmis + ESS weights of the selected batch (median) | {figures['weights_s']:.3f} s |")
    print(f"| the same with the m2 gate, budget 0.04 (median; gated {figures['m2_gated_fraction']:.1%} of tokens) | "
          f"{figures['weights_m2_gate_s']:.3f} s |")
    print(f"| the preset's selection: fresh first + least reused (median) | {figures['preset_select_s'] * 1000:.1f} ms |")
    print(f"| buffer bytes per stored response token | {figures['bytes_per_token']:.2f} "
          f"(with {recorded_versions:.1f} recorded versions per group; "
          f"{figures['bytes_per_token_without_recorded']:.2f} without them) |")
    print(f"| buffer size | {stats['bytes'] / 2**30:.2f} GiB for {stats['groups']} groups |")
    print(f"| threads / torch | {args.threads} / {torch.__version__} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
