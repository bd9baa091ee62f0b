"""`TrainerMode`: the one object that says, per trainer, what a version counts, the step budget and the dp size."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from recipe.darl import main_fully_async, main_one_step_off, main_v1
from recipe.darl.trainer_mode import DRY_RUN_MODE, FULLY_ASYNC, ONE_STEP_OFF, TrainerMode, mode_of_dry_run


def _cfg(**extra):
    return OmegaConf.create({"data": {"train_batch_size": 16}, "trainer": {"n_gpus_per_node": 4, "nnodes": 2,
                                                                          "v1": {"trainer_mode": "separate_async"}},
                             "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4,
                                                             "ulysses_sequence_parallel_size": 2}}, **extra})


def test_each_mode_counts_its_own_versions():
    trainer = SimpleNamespace(global_steps=7, current_param_version=3)
    assert TrainerMode(ONE_STEP_OFF).version(trainer) == 7
    assert TrainerMode(FULLY_ASYNC).version(trainer) == 3
    assert TrainerMode("colocate_async").version(trainer) == 6  # V1 syncs step t's weights at its end
    assert [TrainerMode(m).version_unit for m in (ONE_STEP_OFF, FULLY_ASYNC, "separate_async")] == [
        "global_steps", "current_param_version", "global_steps - 1"]


@pytest.mark.parametrize("launch, extra, name, budget", [
    (lambda cfg: main_one_step_off.MODE, {}, ONE_STEP_OFF, 16),
    # ppo_mini_batch_size x require_batches
    (lambda cfg: main_fully_async.MODE, {"async_training": {"require_batches": 3}}, FULLY_ASYNC, 12),
    (main_v1.launch_mode, {}, "separate_async", 16),
])
def test_each_entry_point_decides_its_mode_and_its_budget(launch, extra, name, budget):
    cfg = _cfg(**extra)
    mode = launch(cfg)
    v1 = name not in (ONE_STEP_OFF, FULLY_ASYNC)
    assert mode.name == name and mode.v1 == v1 and mode.fully_async == (name == FULLY_ASYNC)
    assert mode.step_budget(cfg) == budget
    assert mode.dp_size(cfg) == 4  # 4 x 2 GPUs over sequence-parallel 2


def test_the_dry_run_hands_the_mode_to_the_estimate():
    text = f"[D-ARL] config: a line\n{DRY_RUN_MODE}fully_async\ndata:\n  train_batch_size: 0\n"
    assert mode_of_dry_run(text) == TrainerMode(FULLY_ASYNC)
    with pytest.raises(ValueError, match="trainer mode"):
        mode_of_dry_run("data:\n  train_batch_size: 0\n")
