"""DARTS (rollout_shaping.*) end to end on CPU through Ray with the fully-async trainer, the test suite's rollout
backend, D-ARL preset on: fixed redundancy and L = 1 (every request finishes, the middle ones are dropped). The
one-step-off trainer with adaptive redundancy and L = 0, its checkpointed length-spread EMA and a resume:
tests/vllm/test_pipeline_one_step_off.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from e2e_helpers import build_inputs, run_script

REPO = Path(__file__).resolve().parents[2]
SHELLS = REPO / "shells" / "cpu"
N = 4  # run_script's responses per prompt


@pytest.fixture(scope="module")
def fully_async(tmp_path_factory):
    root = tmp_path_factory.mktemp("darts_fa")
    inputs = build_inputs(root)
    env = dict(STEPS="3", TEST_FREQ="10", SAVE_FREQ="10", REQUIRE_BATCHES="2", STALENESS_THRESHOLD="1")
    done = run_script(SHELLS / "fully_async_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh", inputs, root, "run.jsonl", env,
                      "rollout_shaping.enable=true", "rollout_shaping.responses=6", "rollout_shaping.keep_last=1",
                      timeout=900)
    folder = max((root / "out" / "checkpoints").glob("global_step_*"), key=lambda p: int(p.name.split("_")[-1]))
    # raw records: the fully-async trainer logs its last two updates under one step, which read_log would merge
    records = [json.loads(line)["data"] for line in (root / "run.jsonl").read_text().splitlines()]
    return {"records": records, "folder": folder, "done": done}


def test_fully_async_keeps_first_and_last_finishers(fully_async):
    steps = [m for m in fully_async["records"] if "rollout_shaping/kept" in m]
    assert steps, "no rollout_shaping metrics logged"
    kept = sum(m["rollout_shaping/kept"] for m in steps)
    generated = sum(m["rollout_shaping/generated"] for m in steps)
    assert kept > 0 and kept % N == 0 and generated == kept / N * 6  # r = 6 per prompt, n = 4 kept
    # L = 1: every request runs to its end (no abort); of 6 finished, the middle 2 are dropped
    assert sum(m["rollout_shaping/aborted"] for m in steps) == 0
    assert sum(m["rollout_shaping/dropped"] for m in steps) == generated - kept
    assert sum(m["rollout_shaping/tokens_dropped"] for m in steps) > 0  # the dropped middles decoded to their end
    assert sum(m["rollout_shaping/tokens_aborted"] for m in steps) == 0
    assert all(m["rollout_shaping/generation_s"] > 0 for m in steps)
    assert all(math.isfinite(m["actor/pg_loss"]) for m in fully_async["records"] if "actor/pg_loss" in m)
    assert (fully_async["folder"] / "darts_state.pt").exists()
