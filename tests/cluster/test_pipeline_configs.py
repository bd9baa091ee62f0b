"""Each configuration of the study (benchmarks/staleness/run_study.py, METHODS) through the CPU launch scripts
(benchmarks/staleness/pipeline_configs.py): the script and overrides compose, through the entry point's own
preparation, to the replay settings the harness trains with, the same number of passes, and verl's IcePop bounds."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from cluster_helpers import SHELLS, base_env, compose

from benchmarks.staleness.harness import HarnessConfig
from benchmarks.staleness.pipeline_configs import launch
from benchmarks.staleness.pipeline_report import samples_per_step
from benchmarks.staleness.protocol import DEV_CONFIGS
from benchmarks.staleness.run_study import METHODS, parse_args
from recipe.darl.core.config import PRESET, ReplayConfig


def _resolved(rc: ReplayConfig) -> dict:
    return {f.name: rc.resolved(f.name) if f.name in PRESET else getattr(rc, f.name) for f in dataclasses.fields(rc)}


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline_configs")
    env = base_env(tmp)
    env.update(MODEL_PATH=str(tmp / "model"), TRAIN_FILES=str(tmp / "data/math/train.parquet"),
               VAL_FILES=str(tmp / "data/math500/test.parquet"), **STAGE_BATCH)
    jobs, keys = [], []
    for trainer, name in CELLS:
        script, overrides, extra = launch(name)
        jobs.append((SHELLS / "cpu" / f"{trainer}_grpo_tiny_arith_cpu_replay_4_{script}.sh", overrides, {**env, **extra}))
        keys.append((trainer, name))
    return dict(zip(keys, compose(jobs)))


# the batch protocol.sh's pipeline stage hands the launch scripts, and the development stage's harness arguments
PROTOCOL_SH = (Path(__file__).resolve().parents[2] / "benchmarks" / "staleness" / "protocol.sh").read_text()
STAGE_BATCH = dict(re.findall(r"\b(TRAIN_BATCH_SIZE|MINI_BATCH_SIZE|STEPS)=(\d+)",
                              PROTOCOL_SH.split("STAGE\" == pipeline")[1]))
HARNESS = parse_args(["--out", "x", *re.search(r"common=\((.*?)\)", PROTOCOL_SH).group(1).replace('"$TASK"', "scarce")
                      .replace('"$LR"', "1").replace('"$JOBS"', "1").split()])

# the pipeline stage runs its configurations through both trainers; sync holds the fully-async rollouter at staleness 0
CELLS = [(t, n) for n in DEV_CONFIGS for t in ("one_step_off", "fully_async") if t == "fully_async" or n != "sync"]


@pytest.mark.parametrize("trainer,name", CELLS)
def test_a_study_configuration_through_the_launch_scripts_is_the_harness_configuration(composed, trainer, name):
    cfg, spec = composed[(trainer, name)], METHODS[name]
    replay = ReplayConfig.from_dict(cfg["replay"])
    assert cfg["actor_rollout_ref"]["actor"]["ppo_epochs"] == spec.get("epochs", 1)
    corr = cfg["algorithm"]["rollout_correction"]
    if spec["method"] == "darl":
        assert replay.enable and _resolved(replay) == _resolved(HarnessConfig(**spec).replay_config())
    else:
        assert not replay.enable
        assert corr["bypass_mode"] == (spec["method"] == "naive")  # naive: PPO against the rollout's log-probs
    if spec["method"] == "icepop":
        assert corr["rollout_is"] == "token" and corr["rollout_is_threshold"] == "0.5_5.0"
    elif spec["method"] == "decoupled":
        assert corr["rollout_is"] == "token" and corr["rollout_is_threshold"] == 2.0  # C = 2, as the harness
    if spec.get("staleness") == 0:
        assert cfg["async_training"]["staleness_threshold"] == 0 and cfg["async_training"]["partial_rollout"] is False


@pytest.mark.parametrize("trainer", ["one_step_off", "fully_async"])
def test_the_pipeline_stage_trains_on_the_harness_batch(composed, trainer):
    """Prompts a step, prompts an optimizer step, group size and steps as the development stage's harness runs:
    the launch scripts' own batch (16 prompts in mini-batches of 8) does not train at the validated rate."""
    cfg = composed[(trainer, "decoupled")]
    assert samples_per_step({"resolved_config": cfg}, 0) == HARNESS.prompts * HARNESS.n  # the report's samples axis
    assert cfg["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] == HARNESS.prompts // HARNESS.minibatches
    assert int(STAGE_BATCH["STEPS"]) == HARNESS.steps


def test_an_unknown_name_is_refused():
    with pytest.raises(KeyError, match="not a configuration"):
        launch("darl_v9")
