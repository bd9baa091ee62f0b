"""D-ARL on verl's V1 trainer end to end on CPU (shells/cpu/v1_colocate_async_*_pmis_sg.sh: `colocate_async`, two
FSDP2 ranks over gloo, the test suite's rollout backend inside the trainer's workers, TransferQueue, replay K = 3
with pmis): a job configured for 8 steps gets SIGUSR1 after its third update, saves and exits early; the requeued
job (the same command) resumes with its buffer and trains two more steps.

- the replay step over TransferQueue: buffered groups compete with the fresh ones and are trained again; the rows a step writes back are the rollout's own (at step 1 the trainer's recomputed log-probs
  equal the rollout's: the rebuilt input ids and positions are right);
- the D-ARL loss runs in verl's actor (its own metrics are logged);
- the buffer is saved with verl's checkpoint and restored on resume.
(The row conversion alone: tests/trainer/test_transferqueue_plane.py.)"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from kill_helpers import V1, build_inputs, launch, usr1_to_driver  # noqa: E402
from recipe.darl.robustness.checkpoint_files import read_checked  # noqa: E402

pytestmark = pytest.mark.full  # a long launch: make test-all

CONFIGURED = 8  # steps the first job is configured for; the stop request comes after its third update
FRESH = 4  # prompts per step (launch's TRAIN_BATCH_SIZE)
ENV = dict(ROLLOUT="hf", TRAINER_RANKS="2")


@pytest.fixture(scope="module")
def v1_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("v1_colocate_async")
    inputs = build_inputs(root)
    overrides = ("trainer.max_actor_ckpt_to_keep=null",)
    probes = root / "probes.txt"
    stopped = launch(V1, root, inputs, "stopped", env=dict(ENV, STEPS=str(CONFIGURED), DARL_PROBE_LOG=str(probes)),
                     overrides=overrides, after_step=3, action=usr1_to_driver, timeout=600, grace_s=20.0)
    assert stopped.rc == 0 and stopped.tracker is not None, stopped.text[-3000:]
    saved = read_checked(str(root / "out" / "checkpoints" / f"global_step_{stopped.tracker}" / "darl_replay.pt"))
    # the resumed job's reward is NaN for about one response in three: the reward guard must score them 0.0
    (root / "nan_reward.py").write_text(NAN_REWARD)
    nan_inputs = dict(inputs, reward=f"reward.custom_reward_function.path={root / 'nan_reward.py'}")
    resumed = launch(V1, root, nan_inputs, "resumed", env=dict(ENV, STEPS=str(stopped.tracker + 2)),
                     overrides=overrides, timeout=600)
    return {"stopped": stopped, "resumed": resumed, "saved": saved["replay"], "probes": probes.read_text().split("\n")}


NAN_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float("nan") if sum(map(ord, solution_str)) % 3 == 0 else len(solution_str) % 7 / 7
'''


def test_v1_trains_with_replay_over_transfer_queue(v1_runs):
    run = v1_runs["stopped"]
    assert "DarlColocateAsyncTrainer" in run.text or "DarlTaskRunnerV1Impl" in run.text
    steps = run.trained()
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 3, steps
    log = run.log
    for step in steps:
        m = log[step]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), step
        assert m["replay/selected"] > 0 and m["replay/skipped_update"] == 0.0, step
        assert "actor/rho_bar_mean" in m and "actor/behavior_clipfrac" in m  # the D-ARL loss's own metrics
    # step 1: initial weights on both sides, so the recomputed log-probs of the rebuilt rows equal the rollout's
    assert log[1]["training/rollout_probs_diff_max"] < 1e-4
    assert max(log[s]["replay/candidates"] for s in steps) > FRESH  # buffered groups compete with the fresh ones
    assert max(log[s]["replay/replayed_trained"] for s in steps) > 0  # and some are trained again
    assert max(log[s]["replay/staleness_max"] for s in steps) >= 1  # against pi_old of version step - 1
    assert [k for k in log[1] if k.startswith("replay/buffer_groups/s")]


def test_a_stop_request_saves_and_ends_the_v1_job_early(v1_runs):
    run = v1_runs["stopped"]
    assert "SIGUSR1: stop requested" in run.text and "stop request: checkpoint saved at step" in run.text
    assert run.tracker == max(run.trained()) < CONFIGURED
    # Ray tears the job down after the driver's exit: within seconds alone, longer on a loaded machine
    assert run.leftovers == 0  # nothing of the job is alive 20 s after its end


def test_the_resumed_v1_job_restores_its_buffer(v1_runs):
    stopped, resumed, saved = v1_runs["stopped"], v1_runs["resumed"], v1_runs["saved"]
    assert resumed.rc == 0, resumed.text[-3000:]
    assert resumed.resumed_from() == stopped.tracker
    assert resumed.restored() is not None
    assert resumed.restored()["groups"] == len(saved["groups"]) and resumed.restored()["steps_done"] == saved["steps_done"]
    assert resumed.trained() == [stopped.tracker + 1, stopped.tracker + 2]
    first = resumed.log[stopped.tracker + 1]
    assert first["replay/candidates"] > FRESH - first["replay/dropped_zero_adv"]  # the restored groups compete
    assert saved["steps_done"] == stopped.tracker


def test_v1_has_the_reward_guard_and_the_update_probe(v1_runs):
    """NaN rewards are scored 0.0 before the groups take them (the update stays finite and the count is logged), and
    the trainer's `update` probe point fires on V1 at every trained step, as on the V0 trainers."""
    log = v1_runs["resumed"].log
    steps = v1_runs["resumed"].trained()
    assert steps and all(math.isfinite(log[s]["actor/pg_loss"]) and math.isfinite(log[s]["actor/grad_norm"])
                         for s in steps)
    assert sum(log[s]["faults/nonfinite_rewards"] for s in steps) > 0
    assert "NaN or infinite reward scored 0.0" in v1_runs["resumed"].text
    updates = {int(line.split()[1]) for line in v1_runs["probes"] if line.startswith("update ")}
    assert {1, 2, 3} <= updates, v1_runs["probes"]
