"""DARTS (rollout_shaping.*) end to end on CPU through Ray, hf rollout server, D-ARL preset on: the one-step-off
trainer with adaptive redundancy and L = 0 (a group's tail aborted on the server once n responses finished), a
checkpoint holding the length-spread EMA and a resume that restores it; the fully-async trainer with fixed
redundancy and L = 1 (every request finishes, the middle ones are dropped)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from e2e_helpers import build_inputs, read_log, run_script
from recipe.darl.robustness.checkpoint_files import read_checked

REPO = Path(__file__).resolve().parents[2]
SHELLS = REPO / "shells" / "cpu"
N = 4  # run_script's responses per prompt


@pytest.fixture(scope="module")
def one_step_off(tmp_path_factory):
    root = tmp_path_factory.mktemp("darts_osp")
    inputs = build_inputs(root)
    darts = ("rollout_shaping.enable=true", "rollout_shaping.adaptive=true", "rollout_shaping.mean_ratio=1.5")

    def run(steps: int, log: str) -> subprocess.CompletedProcess:
        env = dict(STEPS=str(steps), TEST_FREQ="10", SAVE_FREQ="3", TRAIN_BATCH_SIZE="4", RESUME_MODE="auto")
        return run_script(SHELLS / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh", inputs, root, log, env,
                          *darts, timeout=600)

    first = run(3, "run1.jsonl")
    state = read_checked(root / "out" / "checkpoints" / "global_step_3" / "darts_state.pt")
    second = run(4, "run2.jsonl")
    return {"log1": read_log(root / "run1.jsonl"), "log2": read_log(root / "run2.jsonl"), "state": state,
            "first": first, "second": second}


def test_one_step_off_keeps_n_of_r_and_aborts_the_tail(one_step_off):
    log = one_step_off["log1"]
    for step in (1, 2, 3):
        m = log[step]
        assert m["rollout_shaping/kept"] == 4 * N  # the trainer's batch: exactly n responses per prompt
        assert m["rollout_shaping/generated"] == 1.5 * N * 4  # adaptive r_i, mean_ratio * n per prompt
        # L = 0: the first n finishers kept, every other request aborted, none finished and dropped
        assert m["rollout_shaping/aborted"] == m["rollout_shaping/generated"] - 4 * N
        assert m["rollout_shaping/dropped"] == 0
        assert math.isfinite(m["actor/pg_loss"]) and m["replay/selected"] > 0
    assert log[3]["rollout_shaping/ema_prompts"] > log[1]["rollout_shaping/ema_prompts"] > 0


def test_one_step_off_checkpoint_holds_the_ema_and_resume_restores_it(one_step_off):
    ema = one_step_off["state"]["ema"]
    assert len(ema) == one_step_off["log1"][3]["rollout_shaping/ema_prompts"]
    assert all(v >= 0 and math.isfinite(v) for v in ema.values())
    text = one_step_off["second"].stdout + one_step_off["second"].stderr
    assert f"restored the length-spread EMA of {len(ema)} prompts" in text
    log = one_step_off["log2"]
    assert [s for s in sorted(log) if "actor/pg_loss" in log[s]] == [4]  # steps 1-3 came from the checkpoint
    assert log[4]["rollout_shaping/ema_prompts"] >= len(ema)


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
    assert all(math.isfinite(m["actor/pg_loss"]) for m in fully_async["records"] if "actor/pg_loss" in m)
    assert (fully_async["folder"] / "darts_state.pt").exists()
