"""What the end-to-end runs on verl's vLLM rollout share (test_pipeline_*.py): the launch, a launch with an action
and the vLLM server's kill (both from tests/faults/kill_helpers.py), and the version-stamp report of a run's samples
(stamps.py)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import stamps

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "faults"))
from e2e_helpers import K, assert_sharded, build_inputs, read_log, run_script, updates  # noqa: E402,F401 (for the tests)
from kill_helpers import kill_vllm_server, launch  # noqa: E402,F401 (for the tests)

SCRIPTS = {"one_step_off": REPO / "shells" / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh",
           "fully_async": REPO / "shells" / "cpu" / "fully_async_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"}
# a rollout log-prob and the teacher-forced one under the same fp32 weights: measured <= 1e-6 on both backends;
# under the neighbouring versions' weights the same samples differ by >= 4e-2 (lr 5e-5, dense reward)
STAMP_TOL = 1e-4
ONE_STEP_OFF_STEPS = 4
FULLY_ASYNC_STEPS = 12  # trainer steps; verl's fully-async logs once per weight sync, under the new version + 1
SYNC_STEPS = 2
SYNCS = FULLY_ASYNC_STEPS // SYNC_STEPS


def run(trainer: str, backend: str, root: Path, inputs: dict, log: str, steps: int, *extra: str,
         resume: str = "disable", ranks: int = 2) -> subprocess.CompletedProcess:
    env = dict(STEPS=str(steps), SAVE_FREQ="1", RESUME_MODE=resume, ROLLOUT=backend, TRAINER_RANKS=str(ranks))
    if trainer == "one_step_off":
        env.update(TEST_FREQ=str(steps), TRAIN_BATCH_SIZE="4")
    else:
        env.update(TEST_FREQ="100", REQUIRE_BATCHES="1", SYNC_STEPS=str(SYNC_STEPS), STALENESS_THRESHOLD="2",
                   PARTIAL_ROLLOUT="true")
    done = run_script(SCRIPTS[trainer], inputs, root, log, env, "trainer.max_actor_ckpt_to_keep=null",
                      "trainer.val_before_train=false", *extra, timeout=1200)
    (root / (log + ".out")).write_text(done.stdout + done.stderr)  # for a look after a failure
    return done


def weights_of(trainer: str, resumed_at: tuple[int, ...] = ()):
    """The checkpoint step whose weights a stamp names (0: the initial model).

    one-step-off (verl's `_fit_update_weights` with `global_steps`): the trainer syncs at the start of step s,
    before that step's update, and stamps the sync s; the weights are those saved at the end of step s - 1. The
    first sync of a run is stamped with the step the run starts from (0, or N when it resumes from global_step_N)
    and sends that step's weights; so stamps 0 and 1 both name the initial weights, and after a resume from N
    stamps N and N + 1 both name checkpoint N.
    fully-async: the stamp is verl's `current_param_version`, and the actor is saved at
    global_step_<current_param_version> when it is synced."""
    if trainer == "one_step_off":
        return lambda v: v if v == 0 or v in resumed_at else v - 1
    return lambda v: v


def stamp_report(trainer: str, root: Path, inputs: dict, resumed_at: tuple[int, ...] = ()) -> dict:
    errors = stamps.stamp_errors(root / "out" / "checkpoints", inputs["MODEL_PATH"], weights_of(trainer, resumed_at))
    n = len(errors["samples"])
    named = [sorted(set(c)) for c in errors["claimed"]]
    return {
        "n": n,
        "missing": errors["missing"],
        "stamps": sorted({(s.vmin, s.vmax) for s in errors["samples"]}),
        "spanning": sum(s.vmin < s.vmax for s in errors["samples"]),
        "inconsistent": [(s.uid, s.index, s.vmin, s.vmax) for i, s in enumerate(errors["samples"])
                         if not stamps.consistent(errors, i, STAMP_TOL)],
        # per sample, the smallest error under weights its stamps do NOT name (that the check can fail)
        "other_min": [min((stamps.sample_error(errors, i, step) for step in errors["steps"] if step not in named[i]),
                          default=math.inf) for i in range(n)],
        "own_max": max((stamps.sample_error(errors, i, named[i][0]) for i in range(n) if len(named[i]) == 1),
                       default=None),
        "steps": errors["steps"],
    }



def trained(log: dict[int, dict]) -> list[int]:
    return sorted(s for s, m in log.items() if "actor/pg_loss" in m)


def assert_stamps_name_the_generating_weights(report: dict) -> None:
    """Every sample's log-probs match the weights its stamp names (and the check has samples to look at)."""
    assert report["n"] >= 32 and report["missing"] == 0
    assert report["inconsistent"] == []
    assert report["own_max"] is not None and report["own_max"] < STAMP_TOL


def assert_stamps_tell_versions_apart(report: dict) -> None:
    """The check could fail: several versions were generated and saved; nearly every sample (all but 2%) is past the
    tolerance under weights its stamp does not name, 95% of them 10x past it, the median 100x (measured: most 5e-2 to
    3e-1). A sample whose tokens have the same log-probs under two neighbouring versions cannot tell them apart
    (measured: one of 96 samples in one run, 2.4e-5 from a neighbouring version's)."""
    assert len({vmin for vmin, _ in report["stamps"]}) >= 3, report["stamps"]
    other = sorted(report["other_min"])
    assert sum(o <= STAMP_TOL for o in other) <= len(other) // 50, other[:5]
    assert other[len(other) // 20] > 10 * STAMP_TOL and other[len(other) // 2] > 100 * STAMP_TOL, other[:5]
