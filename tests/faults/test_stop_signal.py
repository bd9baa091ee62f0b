"""SIGUSR1 to the driver, as shells/run.sh forwards Slurm's ten minutes before the time limit, through Ray, under
both trainers: the trainer saves a checkpoint at its next step boundary (fully-async: its next weight sync) and the
job exits 0 long before its configured end; the requeued job resumes from that checkpoint with its buffer and loses
no step. (run.sh's forwarding with stand-in Slurm commands: tests/cluster; the trainer side without Ray:
tests/trainer/test_graceful_stop.py.)"""

from __future__ import annotations

import json

import pytest

from kill_helpers import FULLY_ASYNC, ONE_STEP_OFF, build_inputs, launch, usr1_to_driver

STEPS = 30  # the configured run; the signal comes after the first update


def _records(path) -> list[dict]:
    """Every record of verl's file logger (the fully-async trainer logs its last two updates under one step)."""
    return [json.loads(line)["data"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize("trainer", ["one_step_off", "fully_async"])
def test_usr1_saves_at_the_next_step_boundary_and_the_resumed_job_loses_no_step(trainer, tmp_path):
    inputs = build_inputs(tmp_path)
    script = ONE_STEP_OFF if trainer == "one_step_off" else FULLY_ASYNC
    env = dict(STEPS=str(STEPS), SAVE_FREQ="1000")  # no periodic checkpoint: only the stop's
    if trainer == "fully_async":
        env.update(REQUIRE_BATCHES="1", STALENESS_THRESHOLD="1")
    stopped = launch(script, tmp_path, inputs, "stopped", env=env, after_step=1, action=usr1_to_driver, timeout=600)
    assert stopped.rc == 0, stopped.text[-3000:]
    assert "SIGUSR1: stop requested" in stopped.text
    last = stopped.trained()[-1]
    # saved where it stopped, after the last logged update: one-step-off names checkpoints by trainer step;
    # fully-async by parameter version, one per trainer step here (the sync after an update is that version)
    updates = [m for m in _records(tmp_path / "stopped.jsonl") if "actor/pg_loss" in m]
    assert stopped.tracker == (last if trainer == "one_step_off" else len(updates))
    if trainer == "fully_async":
        assert updates[-1]["fully_async/count/current_param_version"] == stopped.tracker - 1  # the stop's own update
    assert stopped.folders == [stopped.tracker]
    assert last < STEPS // 2, "the job did not end early"
    if trainer == "fully_async":
        return  # the fully-async resume from a checkpoint with its queue: tests/vllm/test_pipeline_fully_async.py resumes the same files
    resumed = launch(script, tmp_path, inputs, "resumed", env=dict(env, STEPS=str(last + 1)), timeout=600)
    assert resumed.rc == 0, resumed.text[-3000:]
    assert resumed.resumed_from() == last and resumed.restored()["steps_done"] == last
    assert resumed.trained() == [last + 1]  # no step lost, none repeated
