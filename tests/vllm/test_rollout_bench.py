"""The DARTS rollout-only benchmark (benchmarks/darts/rollout_bench.py, docs/darts.md) at its smallest setting on verl's
vLLM server on CPU: 2 prompts x n = 8, lengths of at most 32 tokens, one repetition of `base` and of adaptive
redundancy with the tail cut, driving the DARTS manager's `planner` as training does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.full  # a long launch: make test-all

ROOT = Path(__file__).resolve().parents[2]


def test_rollout_bench_smallest_setting(tmp_path, vllm_installed):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "benchmarks/darts/rollout_bench.py", "--out", str(out), "--prompts", "2",
                           "--reps", "1", "--dists", "heavy", "--settings", "base,adapt0", "--max-tokens", "32"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled",
                               **os.environ, "VERL_PLATFORM": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| heavy | base |" in done.stdout and "| heavy | adapt, L = 0 |" in done.stdout
    bench = json.loads(out.read_text())
    assert bench["prompts"] == 2 and bench["max_tokens"] == 32 and bench["provenance"]["commit"]
    runs = {run["setting"]: run for run in bench["runs"]}
    assert set(runs) == {"base", "adapt0"} and all(run["rep"] == 1 for run in bench["runs"])
    base, adapt = runs["base"], runs["adapt0"]
    # base: r = n, every request kept and run to its forced length (at most 32 tokens)
    assert base["r"] == [8, 8] and base["L"] == [0, 0] and base["kept"] == 16 and base["aborted"] == 0
    assert base["tokens_kept"] == base["tokens_decoded"] == sum(sum(row[:8]) for row in base["lengths"])
    # adaptive: r_i in [10, 16] with mean 12, L = 0; each group keeps its n and aborts the rest once n finished
    assert sum(adapt["r"]) == 24 and all(10 <= r <= 16 for r in adapt["r"]) and adapt["L"] == [0, 0]
    assert adapt["generated"] == 24 and adapt["kept"] == 16
    # the requests past each group's n are cut (or, finishing in the same engine step as the n-th, dropped)
    assert adapt["aborted"] + adapt["dropped"] == 8 and adapt["aborts_missed"] <= adapt["aborted"]
    assert adapt["tokens_decoded"] == adapt["tokens_kept"] + adapt["tokens_dropped"] + adapt["tokens_aborted"]
    assert adapt["kept_length_p95"] <= 32 and 0 < adapt["generation_s"] < 300
