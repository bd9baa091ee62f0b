"""The whole pipeline on CPU through Ray: the FSDP2 trainer on two ranks over gloo, hf rollout server, weight sync
from two ranks every step, replay K = 3 with pmis, sharded checkpoints, and a run resumed from one. An untrained tiny
model with a dense reward (share of digits in the response), so groups have non-zero advantages from the first step.
That the two-rank update equals the single-rank one on the same batch: tests/workers/test_dp_update.py."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

from recipe.darl.robustness.checkpoint_files import read_checked
from e2e_helpers import K, RANKS, assert_sharded, assert_trained, build_inputs, read_log, run_script, updates

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "shells" / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    inputs = build_inputs(root)
    model = inputs["MODEL_PATH"]
    out = root / "out"

    def run(steps: int, log: str) -> subprocess.CompletedProcess:
        env = dict(RANKS, STEPS=str(steps), TEST_FREQ="4", SAVE_FREQ="4", TRAIN_BATCH_SIZE="4", RESUME_MODE="auto")
        return run_script(SCRIPT, inputs, root, log, env, timeout=600)

    first = run(4, "run1.jsonl")
    saved = read_checked(out / "checkpoints" / "global_step_4" / "darl_replay.pt")["replay"]
    second = run(6, "run2.jsonl")  # stopped after the step-4 checkpoint, resumed to step 6
    return {"root": root, "model": model, "out": out, "first": first, "second": second, "saved": saved,
            "log1": read_log(root / "run1.jsonl"), "log2": read_log(root / "run2.jsonl"),
            "updates1": updates(root / "run1.jsonl")}



def test_training_steps_are_finite_and_logged(runs):
    log = runs["log1"]
    assert sorted(log) == [0, 1, 2, 3, 4]
    assert "val-core/darl/arithmetic/acc/mean@1" in log[0] and "val-core/darl/arithmetic/acc/mean@1" in log[4]
    for step in range(1, 5):
        m = log[step]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), step
        assert m["replay/selected"] > 0 and m["replay/skipped_update"] == 0.0
        assert sum(k.startswith("replay/") for k in m) >= 20


def test_two_ranks_train_and_save_sharded_checkpoints(runs):
    steps = runs["updates1"]
    assert [m["training/global_step"] for m in steps] == [1, 2, 3, 4]
    assert_trained(steps)
    assert max(m["replay/selected"] for m in steps) > 4  # replayed groups beside a step's 4 fresh ones
    assert_sharded(runs["out"] / "checkpoints", 6)  # the resumed run's last save


def test_rollout_versions_advance_with_every_sync(runs):
    log = runs["log1"]
    assert [log[s]["replay/fresh_version"] for s in range(1, 5)] == [0, 1, 2, 3]


def test_buffer_holds_k_versions_after_k_steps(runs):
    log = runs["log1"]
    for step in range(1, 5):
        versions = [k for k in log[step] if k.startswith("replay/buffer_groups/s")]
        assert len(versions) == min(step, K), (step, versions)
    assert log[4]["replay/candidates"] > 4  # buffered groups compete with the 4 fresh ones


def test_actor_weights_changed(runs):
    from safetensors.torch import load_file

    initial = load_file(os.path.join(runs["model"], "model.safetensors"))
    actor = runs["out"] / "checkpoints" / "global_step_4" / "actor"
    shards = [torch.load(actor / f"model_world_size_2_rank_{r}.pt", weights_only=False) for r in (0, 1)]
    assert shards[0].keys() == initial.keys()
    # FSDP2 shards dim 0 as torch.chunk does: the two local shards, concatenated, are the whole tensor
    trained = {k: torch.cat([s[k].to_local() for s in shards]) for k in initial}
    assert all(trained[k].shape == initial[k].shape for k in initial)
    changed = [k for k in initial if not torch.equal(trained[k], initial[k])]
    assert len(changed) == len(initial)


def test_resume_continues_from_the_checkpoint_with_its_buffer(runs):
    log2, saved = runs["log2"], runs["saved"]
    assert min(s for s in log2 if s > 4) == 5 and max(log2) == 6
    text = runs["second"].stdout + runs["second"].stderr
    versions = sorted({g["version"] for g in saved["groups"]})
    assert (f"restored the replay buffer: {len(saved['groups'])} groups, versions {versions}, "
            f"steps_done {saved['steps_done']}, next_seq {saved['next_seq']}") in text
    assert saved["steps_done"] == 4 and len(versions) == K
    # step 5's candidates: the saved groups still in the window plus the fresh ones
    in_window = [g for g in saved["groups"] if g["version"] > versions[0]]
    assert log2[5]["replay/candidates"] == len(in_window) + 4 - log2[5]["replay/dropped_zero_adv"]
