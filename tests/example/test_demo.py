"""`make demo`'s figure and its configurations (benchmarks/demo.py): the three curves drawn from the harness's
results, and the names it runs are the study's configurations."""

from __future__ import annotations

from benchmarks import demo
from benchmarks.staleness.run_study import METHODS


def test_the_demo_runs_the_study_configurations_and_draws_three_curves(tmp_path):
    assert set(demo.NAMES) <= set(METHODS) and METHODS["sync"]["staleness"] == 0
    runs = {m: {"evals": [{"step": 0, "accuracy": 0.2}, {"step": 50, "accuracy": a}]}
            for m, a in (("decoupled", 0.1), ("darl_tokens_e2", 0.5), ("sync", 0.45))}
    png = demo.draw(runs, staleness=8, seed=4, out=tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
