"""Both trainers with two FSDP2 trainer ranks over gloo (TRAINER_RANKS=2), D-ARL preset with replay, on CPU
through Ray: the replay step sized by dp 2, each step's groups split over the two ranks, weight sync from
two ranks (rank 0 sends, rank 1 walks the stream), sharded checkpoints, and a one-step-off resume from one.
That the two-rank update equals the single-rank one on the same batch: tests/glue/test_dp_update.py."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from e2e_helpers import build_inputs, run_script

REPO = Path(__file__).resolve().parents[2]
SHELLS = REPO / "shells" / "cpu"
RANKS = dict(TRAINER_RANKS="2")


def _updates(path: Path) -> list[dict]:
    """verl's file-logger records that hold an actor update, in order (the fully-async trainer logs its
    last two updates under one step, which read_log would merge)."""
    records = [json.loads(line)["data"] for line in path.read_text().splitlines()]
    return [r for r in records if "actor/pg_loss" in r]


def _assert_trained(updates: list[dict]) -> None:
    for m in updates:
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), m
        assert m["replay/selected"] > 0 and m["replay/skipped_update"] == 0.0, m
    # the rollout starts from random weights (load_format=dummy); the first trained batch was generated with
    # the weights the two ranks synced, which are the ones the trainer recomputed its old log-probs with
    assert updates[0]["training/rollout_probs_diff_max"] < 1e-5, updates[0]
    # buffered groups competed with the fresh ones, and groups two versions old were trained
    assert max(m["replay/candidates"] for m in updates) > updates[0]["replay/candidates"]
    assert max(m["replay/staleness_max"] for m in updates) >= 2


def _checkpoint(checkpoints: Path) -> dict:
    """The latest checkpoint's step and files (the actor's and those beside it)."""
    step = int((checkpoints / "latest_checkpointed_iteration.txt").read_text())
    folder = checkpoints / f"global_step_{step}"
    return {"step": step, "files": {p.name for p in folder.iterdir()} | {p.name for p in (folder / "actor").iterdir()}}


def _assert_sharded(checkpoint: dict, step: int) -> None:
    """The checkpoint is `step`'s, with the actor saved as two shards and the replay buffer beside it."""
    assert checkpoint["step"] == step
    expected = {f"{kind}_world_size_2_rank_{r}.pt" for kind in ("model", "optim") for r in (0, 1)} | {"darl_replay.pt"}
    assert expected <= checkpoint["files"], checkpoint


@pytest.fixture(scope="module")
def one_step_off(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_ranks_osp")
    inputs = build_inputs(root)
    script = SHELLS / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"

    def run(steps: int, log: str) -> subprocess.CompletedProcess:
        env = dict(RANKS, STEPS=str(steps), TEST_FREQ="10", SAVE_FREQ="10", TRAIN_BATCH_SIZE="4", RESUME_MODE="auto")
        return run_script(script, inputs, root, log, env, timeout=600)

    run(3, "run1.jsonl")  # a checkpoint at its last step
    first = _checkpoint(root / "out" / "checkpoints")
    second = run(4, "run2.jsonl")  # resumed from it
    return {"checkpoint": first, "second": second, "run1": root / "run1.jsonl", "run2": root / "run2.jsonl"}


@pytest.fixture(scope="module")
def fully_async(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_ranks_fa")
    inputs = build_inputs(root)
    script = SHELLS / "fully_async_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"
    env = dict(RANKS, STEPS="3", TEST_FREQ="10", SAVE_FREQ="10", REQUIRE_BATCHES="1", STALENESS_THRESHOLD="2")
    run_script(script, inputs, root, "run.jsonl", env, timeout=900)
    return {"checkpoint": _checkpoint(root / "out" / "checkpoints"), "run": root / "run.jsonl"}


def test_one_step_off_trains_over_two_ranks(one_step_off):
    updates = _updates(one_step_off["run1"])
    assert [m["training/global_step"] for m in updates] == [1, 2, 3]
    _assert_trained(updates)
    assert max(m["replay/selected"] for m in updates) > 4  # replayed groups beside a step's 4 fresh ones
    _assert_sharded(one_step_off["checkpoint"], 3)


def test_one_step_off_resumes_from_the_two_rank_checkpoint(one_step_off):
    updates = _updates(one_step_off["run2"])
    assert [m["training/global_step"] for m in updates] == [4]  # steps 1-3 came from the checkpoint
    assert math.isfinite(updates[0]["actor/pg_loss"]) and updates[0]["replay/selected"] > 0
    text = one_step_off["second"].stdout + one_step_off["second"].stderr
    assert "restored the replay buffer" in text and "steps_done 3" in text


def test_fully_async_trains_over_two_ranks(fully_async):
    updates = _updates(fully_async["run"])
    assert len(updates) == 3
    _assert_trained(updates)
    _assert_sharded(fully_async["checkpoint"], 3)
