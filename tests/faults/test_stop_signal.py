"""SIGUSR1 to the driver of a fully-async job, as shells/run.sh forwards Slurm's ten minutes before the time limit,
through Ray: the trainer saves a checkpoint at its next weight sync and the job exits 0 long before its configured
end; the requeued job (the same command) resumes from that checkpoint with its buffer, its queue of generated but
untrained samples and its DARTS state, and trains the remaining steps, none twice. (The one-step-off stop and its
resume: test_kill_resume.py; run.sh's forwarding with stand-in Slurm commands: tests/cluster; the trainer side
without Ray: tests/trainer/test_graceful_stop.py.)

The launch also runs DARTS (rollout_shaping) with the tests' transformers rollout, fixed redundancy r = 6 and L = 1: every
request finishes and the middle ones are dropped. (One-step-off with adaptive r_i, L = 0 and aborts on verl's vLLM
server: tests/vllm/test_pipeline_one_step_off.py.)"""

from __future__ import annotations

import json
import math

import pytest

from kill_helpers import FULLY_ASYNC, build_inputs, launch, usr1_to_driver
from recipe.darl.robustness.checkpoint_files import read_checked

pytestmark = pytest.mark.full  # a long launch: make test-all

STEPS = 30  # the configured run; the signal comes after the first update
N = 4  # the launch's responses per prompt
DARTS = ("rollout_shaping.enable=true", "rollout_shaping.responses=6", "rollout_shaping.keep_last=1")


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    root = tmp_path_factory.mktemp("stop_fully_async")
    env = dict(STEPS=str(STEPS), SAVE_FREQ="1000", REQUIRE_BATCHES="1", STALENESS_THRESHOLD="1")  # only the stop saves
    inputs = build_inputs(root)
    run = launch(FULLY_ASYNC, root, inputs, "stopped", env=env, overrides=DARTS, after_step=1, action=usr1_to_driver,
                 timeout=600)
    records = _records(root / "stopped.jsonl")
    updates = [m for m in records if "actor/pg_loss" in m]
    folder = root / "out" / "checkpoints" / f"global_step_{run.tracker}"
    saved = {name: read_checked(str(folder / name)) for name in ("darl_replay.pt", "darl_queue.pt", "darts_state.pt")}
    # the requeued job: resume_mode=auto, configured for two steps more than the stopped one trained
    resumed = launch(FULLY_ASYNC, root, inputs, "resumed", env=dict(env, STEPS=str(len(updates) + 2)),
                     overrides=DARTS, timeout=600)
    return {"run": run, "records": records, "updates": updates, "folder": folder, "saved": saved,
            "resumed": resumed, "resumed_updates": [m for m in _records(root / "resumed.jsonl") if "actor/pg_loss" in m]}


def _records(path) -> list[dict]:
    """Every record of verl's file logger (the fully-async trainer logs its last two updates under one step)."""
    return [json.loads(line)["data"] for line in path.read_text().splitlines()]


def test_usr1_saves_at_the_next_weight_sync_and_exits_early(stopped):
    run, updates = stopped["run"], stopped["updates"]
    assert run.rc == 0, run.text[-3000:]
    assert "SIGUSR1: stop requested" in run.text
    # checkpoints are named by parameter version, one per trainer step here (the sync after an update is that
    # version); the stop's own update is the last one logged
    assert run.tracker == len(updates) and updates[-1]["fully_async/count/current_param_version"] == run.tracker - 1
    assert run.folders == [run.tracker]
    assert run.trained()[-1] < STEPS // 2, "the job did not end early"


def test_the_stop_checkpoint_holds_what_a_resume_needs(stopped):
    """verl's files, the actor's shards, the buffer (its step count the number of updates), the rollouter's queue of
    untrained samples and the DARTS state."""
    folder = stopped["folder"]
    files = {p.name for p in folder.iterdir()} | {p.name for p in (folder / "actor").iterdir()}
    assert {"data.pt", "darl_replay.pt", "darl_queue.pt", "darts_state.pt", "model_world_size_1_rank_0.pt",
            "optim_world_size_1_rank_0.pt", "extra_state_world_size_1_rank_0.pt"} <= files, files
    replay = stopped["saved"]["darl_replay.pt"]["replay"]
    assert replay["steps_done"] == len(stopped["updates"]) and replay["groups"]


def test_the_requeued_job_resumes_with_buffer_queue_and_darts_state_and_trains_the_rest_once(stopped):
    run, tracker, folder = stopped["resumed"], stopped["run"].tracker, stopped["folder"]
    assert run.rc == 0, run.text[-3000:]
    assert f"Load from checkpoint folder: {folder}" in run.text
    replay, queued = stopped["saved"]["darl_replay.pt"]["replay"], stopped["saved"]["darl_queue.pt"]["samples"]
    versions = sorted({g["version"] for g in replay["groups"]})
    assert (f"restored the replay buffer: {len(replay['groups'])} groups, versions {versions}, "
            f"steps_done {replay['steps_done']}, next_seq {replay['next_seq']}") in run.text
    assert f"requeued {len(queued)} generated but untrained sample(s) from {folder}/darl_queue.pt" in run.text
    assert f"restored the length-spread EMA of {len(stopped['saved']['darts_state.pt']['ema'])} prompts" in run.text
    # the two remaining steps: trained once each (none repeated, none skipped), the last checkpoint two versions on
    steps = [m["training/global_step"] for m in stopped["resumed_updates"]]
    assert steps and min(steps) > len(stopped["updates"]) and steps[-1] == len(stopped["updates"]) + 2, steps
    assert run.tracker == tracker + 2


def test_darts_keeps_first_and_last_finishers(stopped):
    steps = [m for m in stopped["records"] if "rollout_shaping/kept" in m]
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
    assert all(math.isfinite(m["actor/pg_loss"]) for m in stopped["updates"])
