"""The DARTS rollout simulator (benchmarks/darts/simulator.py) on hand-computed schedules, and the rollout benchmark's
forced lengths (benchmarks/darts/rollout_bench.py)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.darts.rollout_bench import draw_lengths
from benchmarks.darts.simulator import Engine, simulate


def test_tail_abort_by_hand():
    # one group, n = 2 of r = 3, lengths 2, 4, 9, 1 ms per decode step: 3 run 2 steps (6 tokens), 2 run 2 more (4);
    # the 2nd finisher ends the group at step 4 and the 9-token request is aborted
    out = simulate([[2, 4, 9]], [3], [0], 2, Engine(fixed_ms=1.0))
    assert out["ms"] == 4.0 and out["decoded"] == 10 and out["kept"] == 2 + 4
    # contexts: steps 1-2 hold 3 x (1, 2) tokens = 9; steps 3-4 hold 4 + 2 x (1, 2) tokens = 14
    assert out["features"] == {"steps": 4.0, "seq_steps": 10.0, "ctx_steps": 23.0, "prefill": 0.0}


def test_dual_end_waits_for_the_last_and_keeps_it():
    out = simulate([[2, 4, 9]], [3], [1], 2, Engine(fixed_ms=1.0, per_seq_ms=0.5))
    assert out["features"]["steps"] == 9 and out["decoded"] == 15 and out["kept"] == 2 + 9
    assert out["ms"] == 9 + 0.5 * 15


def test_admission_limit_and_preemption():
    # one sequence at a time: 2 then 4 tokens, the third request never starts
    assert simulate([[2, 4, 9]], [3], [0], 2, Engine(fixed_ms=1.0, max_num_seqs=1))["ms"] == 6.0
    # a KV cache of 6 tokens, two 5-token requests: both admitted, the cache is full after 3 steps and the later one
    # is preempted; the first ends alone (2 steps), then the second re-prefills its 3 tokens and decodes 2 more
    out = simulate([[5, 5]], [2], [0], 2, Engine(fixed_ms=1.0, kv_tokens=6))
    assert out["preempted"] == 1 and out["kept"] == out["decoded"] == 10
    assert out["features"]["steps"] == 3 + 2 + 2 and out["features"]["prefill"] == 3
    assert simulate([[5, 5]], [2], [0], 2, Engine(fixed_ms=1.0))["features"]["steps"] == 5


def test_base_decodes_what_it_keeps_and_linear_in_the_constants():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 50, (4, 16)).tolist()
    base = simulate(lengths, [8] * 4, [0] * 4, 8, Engine(1.0, 0.1, 0.01))
    assert base["decoded"] == base["kept"] == sum(sum(row[:8]) for row in lengths)
    f = base["features"]
    assert base["ms"] == pytest.approx(f["steps"] + 0.1 * f["seq_steps"] + 0.01 * f["ctx_steps"])
    # the longest request bounds the step count; a cut tail can only shorten it
    assert f["steps"] == max(max(row[:8]) for row in lengths)
    cut = simulate(lengths, [12] * 4, [0] * 4, 8, Engine(1.0))
    assert cut["features"]["steps"] <= f["steps"]


def test_forced_lengths_are_paired_and_shaped():
    a, b = draw_lengths("heavy", 16, 1, seed=0), draw_lengths("heavy", 16, 1, seed=0)
    assert a.shape == (16, 16) and (a == b).all() and (a != draw_lengths("heavy", 16, 2, seed=0)).any()
    capped = draw_lengths("capped", 64, 1, seed=0)
    cap = round(96 * np.log(1 / 0.17))
    assert capped.max() <= cap and 0.05 < (capped >= cap).mean() < 0.4
    heavy = draw_lengths("heavy", 64, 1, seed=0)
    assert heavy.max() > 6 * np.median(heavy)  # a few responses several times longer than the rest


def test_the_adaptive_setting_sees_only_earlier_draws_of_the_same_prompts():
    from benchmarks.darts.simulator import N, WORKLOADS, steps_with_spread

    workload = WORKLOADS["heavy tail"]
    pairs = list(steps_with_spread(workload, 16, 4, np.random.default_rng(3)))
    for (before, _), (_, spread) in zip(pairs, pairs[1:]):
        assert np.allclose(spread, before[:, :N].std(1, ddof=1))  # step t's spread is step t - 1's kept lengths
    for lengths, spread in pairs:
        assert not np.allclose(spread, lengths[:, :N].std(1, ddof=1))  # never the draw it is scored on
    # the same prompts every step: a prompt's typical length persists (median ratio between steps near 1)
    medians = np.array([np.median(lengths, 1) for lengths, _ in pairs])
    assert np.corrcoef(medians[0], medians[-1])[0, 1] > 0.5


def test_the_cpu_validation_scores_fitted_and_unfitted_cells_apart():
    """`--validate` on the archived CPU benchmark: the base cells it is fitted on are the in-sample ones, every other
    cell is scored out of sample (docs/darts.md quotes the summary; tests/test_figure_scripts.py holds it there)."""
    import json
    from pathlib import Path

    from benchmarks.darts.simulator import validate

    root = Path(__file__).resolve().parents[2] / "docs" / "evidence" / "darts"
    table = validate(json.loads((root / "rollout_cpu.json").read_text()))
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and " s |" not in line
            and not line.startswith("|---")]
    assert {(r[1], r[2]) for r in rows if r[2] == "in"} == {("base", "in")}
    assert sum(r[2] == "out of" for r in rows) == 12 and "out of sample (12 cells)" in table
