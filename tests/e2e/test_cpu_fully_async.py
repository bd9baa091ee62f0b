"""The fully-async pipeline on CPU through Ray with D-ARL replay: verl's rollouter streaming into its
MessageQueue, the D-ARL fully-async trainer on two FSDP2 ranks over gloo, weight sync from two ranks every
step, a sharded checkpoint taken while the rollouter runs ahead, and a run resumed from it. An untrained tiny model with a dense reward (share of
digits in the response), so groups have non-zero advantages from the first step."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import torch

from recipe.darl.robustness.checkpoint_files import read_checked
from e2e_helpers import RANKS, assert_sharded, assert_trained, build_inputs, read_log, run_script, updates

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "shells" / "cpu" / "fully_async_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"
STEPS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e_fa")
    inputs = build_inputs(root)
    out = root / "out"

    def run(log: str, *extra: str) -> subprocess.CompletedProcess:
        env = dict(RANKS, STEPS=str(STEPS), TEST_FREQ="2", SAVE_FREQ="2", REQUIRE_BATCHES="1", STALENESS_THRESHOLD="2")
        # the step-2 actor must survive step 4's save
        return run_script(SCRIPT, inputs, root, log, env, "trainer.max_actor_ckpt_to_keep=null", *extra, timeout=900)

    first = run("run1.jsonl", "trainer.resume_mode=auto")
    steps = updates(root / "run1.jsonl")
    step2 = out / "checkpoints" / "global_step_2"
    saved = read_checked(step2 / "darl_replay.pt")["replay"]
    queued = read_checked(step2 / "darl_queue.pt")["samples"]
    # a preemption after the step-2 checkpoint: resume from it while the first run's later steps are ignored
    second = run("run2.jsonl", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={step2}")
    return {"out": out, "first": first, "second": second, "saved": saved, "queued": queued, "step2": step2,
            "log1": read_log(root / "run1.jsonl"), "log2": read_log(root / "run2.jsonl"), "updates1": steps}


def _trained(log: dict[int, dict]) -> list[int]:
    return sorted(s for s, m in log.items() if "actor/pg_loss" in m)


def test_the_d_arl_trainer_trains_every_step_with_finite_losses(runs):
    log = runs["log1"]
    assert _trained(log) == list(range(2, STEPS + 1))  # verl's fully-async logs step t's update at t + 1
    for step in _trained(log):
        m = log[step]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), step
        assert sum(k.startswith("replay/") for k in m) >= 20, step
    assert "[D-ARL]" in runs["first"].stdout + runs["first"].stderr


def test_two_ranks_train_with_replay_and_save_sharded_checkpoints(runs):
    assert_trained(runs["updates1"])
    assert_sharded(runs["out"] / "checkpoints", STEPS)  # the resumed run's last save


def test_staleness_above_one_is_trained(runs):
    log = runs["log1"]
    assert max(m.get("replay/staleness_max", 0) for m in log.values()) >= 2
    hist = {k for m in log.values() for k in m if k.startswith("replay/staleness_hist/s")}
    assert len(hist) >= 2, hist


def test_checkpoint_holds_buffer_and_queue(runs):
    step2 = runs["step2"]
    assert (step2 / "actor").is_dir() and (step2 / "data.pt").exists()
    assert runs["saved"]["steps_done"] >= 1 and len(runs["saved"]["groups"]) > 0
    text = runs["first"].stdout + runs["first"].stderr
    # the rollouter runs up to 2 syncs ahead and generates far faster than the trainer trains on CPU, so
    # the queue holds samples at the step-2 checkpoint: the requeue below is not vacuous
    assert len(runs["queued"]) > 0
    assert f"saved {len(runs['queued'])} generated but untrained sample(s) to {step2}/darl_queue.pt" in text


def test_resume_restores_the_buffer_and_requeues_the_queue(runs):
    saved, text = runs["saved"], runs["second"].stdout + runs["second"].stderr
    versions = sorted({g["version"] for g in saved["groups"]})
    assert (f"restored the replay buffer: {len(saved['groups'])} groups, versions {versions}, "
            f"steps_done {saved['steps_done']}, next_seq {saved['next_seq']}") in text
    assert f"requeued {len(runs['queued'])} generated but untrained sample(s) from {runs['step2']}/darl_queue.pt" in text
    # the resumed run trains exactly the steps the first run trained after its step-2 checkpoint: the
    # requeued samples count against the rollouter's total, so none is generated twice or left over
    log1, log2 = runs["log1"], runs["log2"]
    after = [s for s in _trained(log1) if log1[s]["fully_async/count/current_param_version"] >= 2]
    assert _trained(log2) == after
    assert [log2[s]["fully_async/count/current_param_version"] for s in after] == \
        [log1[s]["fully_async/count/current_param_version"] for s in after]
