"""One short launch of each trainer through its CPU `_pmis_sg` script (the preset, `darl_tokens_e2`, with replay
K = 3 and no warm-up): one-step-off, fully-async and V1 `colocate_async`, end to end through Ray, verl's FSDP2 engine
and the tests' transformers rollout, four steps each. `make test` runs these; the long launches (verl's vLLM rollout,
kills and resumes, stop signals, two jobs at once) run in `make test-all`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from e2e_helpers import build_inputs, run_script, updates

SHELLS = Path(__file__).resolve().parents[2] / "shells" / "cpu"
STEPS = 4


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    return build_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.mark.parametrize("trainer", ["one_step_off", "fully_async", "v1_colocate_async"])
def test_each_trainer_trains_the_preset_with_replay(trainer, inputs, tmp_path):
    env = {"STEPS": str(STEPS), "TEST_FREQ": "-1", "SAVE_FREQ": "-1", "RESUME_MODE": "disable", "ROLLOUT": "hf",
           "TRAIN_BATCH_SIZE": "4"}
    if trainer == "fully_async":  # 4 prompts a step as the others: mini-batch 2 x 2 batches, a sync every step
        env.update(REQUIRE_BATCHES="2", SYNC_STEPS="1")
    run_script(SHELLS / f"{trainer}_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh", inputs, tmp_path, "log.jsonl", env,
               "trainer.val_before_train=false", timeout=900)
    steps = updates(tmp_path / "log.jsonl")
    assert len(steps) >= STEPS - 1, [sorted(s) for s in steps]
    assert all(math.isfinite(s["actor/pg_loss"]) for s in steps)
    # the preset's controls ran in the actor's loss, and replay trained groups out of the buffer
    assert all("replay/selected" in s for s in steps)
    assert sum(s.get("replay/replayed_trained", 0) for s in steps) > 0, [s.get("replay/candidates") for s in steps]
