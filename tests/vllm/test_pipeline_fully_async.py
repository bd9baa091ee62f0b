"""The fully-async trainer end to end on CPU with verl's own vLLM rollout: two FSDP2 ranks, weights synced every 2
trainer steps (trigger_parameter_sync_step = 2), partial rollouts, staleness threshold 2, 12 trainer steps (6 syncs);
a checkpoint taken while the rollouter runs ahead (buffer and message queue); the version-stamp check on the samples
(stamps.py); DARTS with fixed redundancy (r = 6 for n = 4, every tail cut in vLLM's engine). The resume from such a checkpoint (the buffer and the queue restored, the remaining steps trained once):
tests/faults/test_stop_signal.py.
"""

from __future__ import annotations

import math

import pytest

from pipelines import (FULLY_ASYNC_STEPS, SYNCS, assert_sharded, assert_stamps_name_the_generating_weights,
                       assert_stamps_tell_versions_apart, build_inputs, read_log, run, stamp_report, trained)
from recipe.darl.robustness.checkpoint_files import read_checked

pytestmark = pytest.mark.full  # a long launch: make test-all

DARTS = ("rollout_shaping.enable=true",)  # fixed r = ceil(1.5 n) = 6, L = 0: two requests of each group aborted


@pytest.fixture(scope="module")
def vllm_fully_async(tmp_path_factory, vllm_installed):
    root = tmp_path_factory.mktemp("vllm_fully_async")
    inputs = build_inputs(root, hidden_size=128)
    first = run("fully_async", "vllm", root, inputs, "run1.jsonl", FULLY_ASYNC_STEPS, *DARTS)
    report = stamp_report("fully_async", root, inputs)
    ckpt = root / "out" / "checkpoints" / "global_step_2"
    saved = read_checked(ckpt / "darl_replay.pt")["replay"]
    queued = read_checked(ckpt / "darl_queue.pt")["samples"]
    return {"root": root, "first": first, "saved": saved, "queued": queued, "ckpt": ckpt, "stamps": report,
            "log1": read_log(root / "run1.jsonl")}


def test_fully_async_trains_on_vllm_rollouts_with_staleness_above_one(vllm_fully_async):
    log, text = vllm_fully_async["log1"], vllm_fully_async["first"].stdout + vllm_fully_async["first"].stderr
    assert "(vLLMHttpServer pid=" in text and "HFRolloutServer" not in text and "[D-ARL]" in text
    steps = trained(log)
    assert steps == list(range(1, SYNCS + 1))  # one record per weight sync
    for step in steps:
        m = log[step]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), step
        # weights synced every SYNC_STEPS trainer steps: the version counts syncs, not steps
        assert m["fully_async/count/current_param_version"] == step - 1
    assert log[steps[-1]]["training/global_step"] == FULLY_ASYNC_STEPS  # SYNCS syncs over all trainer steps
    assert max(m.get("replay/staleness_max", 0) for m in log.values()) >= 2
    assert len({k for m in log.values() for k in m if k.startswith("replay/staleness_hist/s")}) >= 2


def test_fully_async_checkpoint_on_vllm_holds_buffer_and_queue(vllm_fully_async):
    saved, queued, ckpt = vllm_fully_async["saved"], vllm_fully_async["queued"], vllm_fully_async["ckpt"]
    assert_sharded(ckpt.parent, int((ckpt.parent / "latest_checkpointed_iteration.txt").read_text()))
    assert (ckpt / "data.pt").exists() and saved["steps_done"] >= 1 and len(saved["groups"]) > 0
    # the rollouter runs up to 2 syncs ahead of the trainer, so the queue holds samples at the checkpoint
    first = vllm_fully_async["first"].stdout + vllm_fully_async["first"].stderr
    assert len(queued) > 0 and f"saved {len(queued)} generated but untrained sample(s) to {ckpt}/darl_queue.pt" in first


def test_each_sample_was_generated_by_the_weights_its_stamp_names(vllm_fully_async):
    assert_stamps_name_the_generating_weights(vllm_fully_async["stamps"])


def test_the_stamp_check_tells_versions_apart(vllm_fully_async):
    assert_stamps_tell_versions_apart(vllm_fully_async["stamps"])


def test_darts_cuts_each_groups_tail_in_the_engine(vllm_fully_async):
    """The fully-async rollouter plans one prompt at a time; once four of a group's six requests finished, the other
    two are aborted by their ids in vLLM's engine. Every group keeps exactly its n = 4 finished responses and cuts
    exactly its two. Most cut requests come back stopped by the abort (vLLM's `aborted`); the rest finished in the
    same engine step as the fourth (this model's answers have nearly equal lengths and decode in lockstep), which
    `aborts_missed` counts. Were the abort not reaching the engine (verl's own `abort_request` finds no such id),
    every cut request would run to its end and count as missed."""
    log = vllm_fully_async["log1"]
    steps = [m for m in log.values() if "rollout_shaping/kept" in m]
    assert len(steps) >= SYNCS // 2
    for m in steps:
        prompts = m["rollout_shaping/kept"] / 4
        assert prompts >= 1 and m["rollout_shaping/generated"] == 6 * prompts
        assert m["rollout_shaping/aborted"] == 2 * prompts and m["rollout_shaping/dropped"] == 0
        assert m["rollout_shaping/tokens_dropped"] == 0 and m["rollout_shaping/tokens_kept"] > 0
    aborted = sum(m["rollout_shaping/aborted"] for m in steps)
    missed = sum(m["rollout_shaping/aborts_missed"] for m in steps)
    assert aborted >= SYNCS * 2 and missed < aborted / 2, (missed, aborted)
