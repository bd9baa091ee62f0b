"""One step's actor update over two FSDP2 ranks gives the weights of the single-rank update on the same batch.

This process prepares one D-ARL step as the trainer does: a generated batch packed into groups
(`groups_from_batch`), rebuilt in verl's layout (`batch_from_groups`), log pi_old recorded as the step's
version, GRPO advantages, the four per-token loss inputs (`LossInputs.batch_fields`: pmis over three behavior versions,
ESS source weights per optimizer mini-batch, assigned by `minibatch_index` for the trainer's dp size), then
verl's own `RayPPOTrainer._update_actor` turns the batch into the TensorDict the workers receive (its
worker group is a stand-in that keeps it). A subprocess (VERL_PLATFORM=cpu) trains it with verl's
`TrainingWorker` (FSDP2 over gloo, fp32, AdamW, gradient clipping at 1.0, the D-ARL loss via `set_loss_fn`):

- `dp2`: two ranks (torch.multiprocessing), each given its share as verl's dispatch cuts it;
- `dp1`: one rank, the same groups in the order that puts each of dp2's mini-batches together
  (with two ranks, mini-batch m joins the m-th half of each rank's half, not the m-th half of the batch);
- `dp2_as_dp1`: two ranks, loss inputs prepared for dp 1: what a driver that ignored the split would send.

Eight groups of two, mini-batches of four groups: two optimizer steps, each over two micro-batches per rank
(four on the single rank). The loss's gradient over two ranks is also checked against the formulas in
test_engine_loss.py; this file covers what follows it (the driver's split, clipping, AdamW on sharded parameters).
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve()

N = 2  # responses per group
VERSIONS = [4, 4, 4, 3, 2, 2, 3, 4]  # behavior version of each group, in arrival order
STEP = 5  # the version of pi_old: the step that trains
MINI_GROUPS = 4  # actor.ppo_mini_batch_size: two mini-batches
RESCORED = {3: [4], 2: [3, 4]}  # versions a group of this version was rescored at while buffered
P, R = 7, 6  # prompt and response widths
THRESHOLD, CLIP_LOW, CLIP_HIGH = 2.0, 0.2, 0.28
MICRO = 2  # ppo_micro_batch_size_per_gpu
LR = 1e-3
RTOL = 1e-5


# ----------------------------------------------------------------------------------------------
# the driver side (this process)


def _log_probs(model, batch) -> torch.Tensor:
    """log pi(response token | prefix) under `model`, teacher-forced: [B, R]."""
    with torch.no_grad():
        logits = model(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                       position_ids=batch.batch["position_ids"]).logits
    log_probs = torch.log_softmax(logits[:, P - 1:-1].float(), dim=-1)
    return log_probs.gather(-1, batch.batch["responses"].unsqueeze(-1)).squeeze(-1)


def generated_batch(model):
    """The fresh batch as the rollout returns it: one uid per group, version stamps, rewards, behavior log-probs."""
    from verl import DataProto
    from verl.utils.model import compute_position_id_with_mask

    g = torch.Generator().manual_seed(7)
    B = N * len(VERSIONS)
    prompts, responses = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, R, dtype=torch.long)
    attention = torch.zeros(B, P + R, dtype=torch.long)
    scores = torch.zeros(B, R)
    vocab = model.config.vocab_size
    for group in range(len(VERSIONS)):
        plen = int(torch.randint(3, P + 1, (1,), generator=g))
        prompt = torch.randint(4, vocab, (plen,), generator=g)
        for i in range(group * N, group * N + N):
            rlen = int(torch.randint(2, R + 1, (1,), generator=g))
            prompts[i, P - plen:] = prompt
            responses[i, :rlen] = torch.randint(4, vocab, (rlen,), generator=g)
            attention[i, P - plen:P + rlen] = 1
            scores[i, rlen - 1] = float(torch.rand(1, generator=g))
    batch = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "response_mask": attention[:, P:].clone(),
                 "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention,
                 "position_ids": compute_position_id_with_mask(attention), "rm_scores": scores},
        non_tensors={"uid": np.array([f"g{i // N}" for i in range(B)], dtype=object),
                     "min_global_steps": np.array([VERSIONS[i // N] for i in range(B)], dtype=object)})
    mask = batch.batch["response_mask"].float()
    # the behavior policies drifted from pi_old: log(pi_old / mu) of either sign, some above log C
    drift = 0.6 * torch.randn(B, R, generator=g)
    batch.batch["rollout_log_probs"] = (_log_probs(model, batch) - drift) * mask
    return batch, drift


def trainer_batch(model, dp_size: int, order: list[int] | None = None):
    """The DataProto DarlOneStepOffTrainer hands to verl's `_update_actor` (groups in `order`, loss inputs for `dp_size`),
    and the replay config it used."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from recipe.darl.core import ReplayConfig, ReplayStep, Selection, StepPlan
    from recipe.darl.core.packing import minibatch_index
    from recipe.darl.trainers.dataproto_plane import batch_from_groups, groups_from_batch

    fresh, drift = generated_batch(model)
    groups = groups_from_batch(fresh, fresh.batch["rm_scores"])
    current = _log_probs(model, fresh)
    g = torch.Generator().manual_seed(11)
    # pi_old recomputed at the step: the current weights, moved so that the first update clips some tokens
    old = (current - 0.15 * torch.randn(current.shape, generator=g)) * fresh.batch["response_mask"]
    for k, group in enumerate(groups):
        rows = slice(k * N, k * N + N)
        for j in RESCORED.get(group.version, []):  # proximal log-probs recorded while buffered
            group.record(j, old[rows] - drift[rows] * (STEP - j) / (STEP - group.version))
        group.record(STEP, old[rows])
    order = list(range(len(groups))) if order is None else order
    chosen = [groups[k] for k in order]
    rows = torch.cat([torch.arange(k * N, k * N + N) for k in order])
    batch = batch_from_groups(chosen, P, R, {"temperature": 1.0})
    batch.batch["old_log_probs"] = old[rows]
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    advantages, returns = compute_grpo_outcome_advantage(batch.batch["token_level_rewards"], batch.batch["response_mask"],
                                                         batch.non_tensor_batch["uid"])
    batch.batch["advantages"], batch.batch["returns"] = advantages, returns
    replay = ReplayConfig(enable=True, k=4)
    plan = StepPlan(STEP, Selection(list(range(len(chosen))), len(chosen), len(chosen), False), chosen)
    mask = batch.batch["response_mask"]
    inputs = ReplayStep(replay).loss_inputs(plan, mask, batch.batch["old_log_probs"], batch.batch["rollout_log_probs"],
                                            THRESHOLD, CLIP_LOW, CLIP_HIGH,
                                            minibatch_index(len(batch), MINI_GROUPS * N, dp_size))
    batch.batch.update(inputs.batch_fields(mask.shape[1]))
    return batch, replay


def update_actor_input(batch) -> "TensorDict":
    """What verl's `RayPPOTrainer._update_actor` sends to `actor_rollout_wg.update_actor` for `batch`."""
    from hydra import compose, initialize_config_module
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils import tensordict_utils as tu

    with initialize_config_module(config_module="recipe.darl.config", version_base=None):
        config = compose(config_name="one_step_off_trainer", overrides=[
            f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI_GROUPS}", f"actor_rollout_ref.rollout.n={N}"])

    class StandIn:
        """`self` of `_update_actor`: the trainer's config and a worker group that keeps what it is sent."""

        def __init__(self):
            self.config, self.actor_rollout_wg, self.sent = config, self, None

        def update_actor(self, td):
            self.sent = td
            return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"mfu": 0.0}})

    trainer = StandIn()
    RayPPOTrainer._update_actor(trainer, batch)
    return trainer.sent


@pytest.fixture(scope="module")
def prepared(tiny_model_path):
    from transformers import AutoModelForCausalLM

    from recipe.darl.core.packing import minibatch_index

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa", dtype=torch.float32)
    samples = N * len(VERSIONS)
    # dp 2's mini-batch of each sample, per group: the single-rank order that trains the same mini-batches
    index = minibatch_index(samples, MINI_GROUPS * N, 2)[::N]
    order = sorted(range(len(VERSIONS)), key=lambda k: (int(index[k]), k))
    dp2, replay = trainer_batch(model, 2)
    dp1, _ = trainer_batch(model, 1, order)
    as_dp1, _ = trainer_batch(model, 1)
    return {"order": order, "replay": replay, "batches": {"dp2": dp2, "dp1": dp1, "dp2_as_dp1": as_dp1}}


@pytest.fixture(scope="module")
def engine(prepared, tiny_model_path, run_python, tmp_path_factory):
    """Runs the engine subprocess once: {run: {"weights", "initial", "metrics", "optimizer_steps", "dp_size"}}."""
    folder = tmp_path_factory.mktemp("dp_update")
    inputs, out = folder / "inputs.pkl", folder / "out.pt"
    with open(inputs, "wb") as f:
        pickle.dump({"behavior_clip": prepared["replay"].behavior_clip_range(),
                     "batches": {k: update_actor_input(b) for k, b in prepared["batches"].items()}}, f)
    run_python([str(HERE), tiny_model_path, str(inputs), str(out)], platform="cpu", timeout=400)
    return torch.load(out, weights_only=False)


# ----------------------------------------------------------------------------------------------
# tests


def test_driver_side_split(prepared):
    """dp 2's mini-batch m joins the m-th half of each rank's half; each mini-batch's coefficients sum to 1."""
    from recipe.darl.core.packing import minibatch_index

    assert prepared["order"] == [0, 1, 4, 5, 2, 3, 6, 7]
    for name, dp in (("dp2", 2), ("dp1", 1)):
        batch = prepared["batches"][name]
        coef = (batch.batch["darl_token_coef"] * batch.batch["response_mask"]).sum(-1)
        index = minibatch_index(len(coef), MINI_GROUPS * N, dp)
        for m in (0, 1):
            assert coef[index == m].sum().item() == pytest.approx(1.0, abs=1e-6), (name, m)
    # the same per-token inputs, row for row, once the single-rank batch is put in dp 2's order
    rows = torch.cat([torch.arange(k * N, k * N + N) for k in prepared["order"]])
    inverse = torch.empty_like(rows)
    inverse[rows] = torch.arange(len(rows))
    for key in ("darl_token_coef", "darl_log_denominator", "darl_clip_low", "advantages", "old_log_probs"):
        torch.testing.assert_close(prepared["batches"]["dp1"].batch[key][inverse], prepared["batches"]["dp2"].batch[key])
    # prepared for dp 1, the coefficients of the arrival order differ: the split matters
    assert not torch.allclose(prepared["batches"]["dp2_as_dp1"].batch["darl_token_coef"],
                              prepared["batches"]["dp2"].batch["darl_token_coef"], atol=1e-3)


def test_engine_ran_two_optimizer_steps_per_update(engine):
    assert {name: run["dp_size"] for name, run in engine.items()} == {"dp2": 2, "dp1": 1, "dp2_as_dp1": 2}
    for name, run in engine.items():
        assert run["optimizer_steps"] == 2, name


def test_two_rank_update_equals_the_single_rank_update(engine):
    """Per parameter tensor: the two-rank weights are the single-rank ones to 1e-5 of their norm, and to 1e-4 of
    the update's norm. (Element by element AdamW's first steps divide by sqrt(v) + 1e-8: an element whose
    gradient is near 1e-8 turns a rounding difference of the gradient into a visible one, so a few of the
    5e5 elements differ by up to ~1e-6 while the rest agree to ~1e-8; bounded below at 1% of one step.)"""
    dp2, dp1 = engine["dp2"], engine["dp1"]
    assert set(dp2["weights"]) == set(dp1["weights"])
    for name, expected in dp1["weights"].items():
        update = (expected - dp1["initial"][name]).norm()
        difference = (dp2["weights"][name] - expected).norm()
        assert update > 1e-3, f"{name}: the update did not move it ({update})"
        assert difference <= RTOL * expected.norm(), (name, difference / expected.norm())
        assert difference <= 10 * RTOL * update, (name, difference / update)
        assert (dp2["weights"][name] - expected).abs().max() <= 1e-2 * LR, name
    # the same loss and gradient norm (summed over the two mini-batches; AdamW clips the gradient at 1.0)
    assert dp1["metrics"]["grad_norm"] > 2.0
    for key in ("actor/pg_loss", "grad_norm"):
        assert dp2["metrics"][key] == pytest.approx(dp1["metrics"][key], rel=RTOL), key


def test_loss_inputs_for_the_wrong_dp_size_give_another_update(engine):
    """The check above can fail: the same batch with loss inputs prepared for one rank moves every tensor
    elsewhere, by a sizeable part of the update."""
    dp1, wrong = engine["dp1"], engine["dp2_as_dp1"]
    for name, expected in dp1["weights"].items():
        update = (expected - dp1["initial"][name]).norm()
        assert (wrong["weights"][name] - expected).norm() > 0.1 * update, name


# ----------------------------------------------------------------------------------------------
# the engine side (run as a script with VERL_PLATFORM=cpu)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(model_path: str, inputs: dict, name: str, rank: int, world_size: int) -> dict:
    """verl's TrainingWorker with the D-ARL loss trains this rank's share of batch `name` (one update_actor)."""
    from torch.distributed.tensor import DTensor
    from verl.protocol import BatchData
    from verl.trainer.config import CheckpointConfig
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import (FSDPActorConfig, FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig,
                                     TrainingWorkerConfig)
    from verl.workers.engine_workers import TrainingWorker

    from recipe.darl.workers.actor_loss import darl_loss

    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    worker = TrainingWorker(TrainingWorkerConfig(
        model_type="language_model",
        model_config=HFModelConfig(path=model_path, override_config={"attn_implementation": "sdpa"},
                                   use_remove_padding=False),
        engine_config=FSDPEngineConfig(strategy="fsdp2", use_torch_compile=False, mixed_precision=fp32,
                                       use_dynamic_bsz=False, micro_batch_size_per_gpu=MICRO,
                                       infer_micro_batch_size_per_gpu=MICRO),
        optimizer_config=FSDPOptimizerConfig(lr=LR, total_training_steps=1),
        checkpoint_config=CheckpointConfig(),
    ))
    worker.reset()
    actor_config = FSDPActorConfig(strategy="fsdp2", ppo_mini_batch_size=MINI_GROUPS, ppo_micro_batch_size_per_gpu=MICRO,
                                   rollout_n=N, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, entropy_coeff=0.0,
                                   use_kl_loss=False, loss_agg_mode="token-mean")
    # what DarlRun.install_loss installs
    worker.set_loss_fn(functools.partial(darl_loss, config=actor_config, threshold=THRESHOLD, stop_grad=True,
                                         behavior_clip=inputs["behavior_clip"]))
    engine = worker.engine

    def full_weights():
        return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                for n, p in engine.module.named_parameters()}

    initial = full_weights()
    steps = []
    step = engine.optimizer.step
    engine.optimizer.step = lambda *a, **k: (steps.append(1), step(*a, **k))[1]
    # this rank's share as RayWorkerGroup dispatches it: verl's chunk, then a serialization round trip
    td = inputs["batches"][name]
    shard = pickle.loads(pickle.dumps(BatchData(td).chunk(chunks=world_size)[rank]))
    output = worker.train_mini_batch(shard)
    metrics = tu.get(output, "metrics") if output is not None else {}
    return {"weights": full_weights(), "initial": initial, "optimizer_steps": len(steps),
            "dp_size": engine.get_data_parallel_size(),
            "metrics": {k: [float(x) for x in v] if isinstance(v, list) else float(v) for k, v in metrics.items()}}


def _dp_rank_main(rank: int, world_size: int, port: int, model_path: str, inputs_file: str, out_file: str) -> None:
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with open(inputs_file, "rb") as f:
        inputs = pickle.load(f)
    names = ["dp2", "dp2_as_dp1"] if world_size == 2 else ["dp1"]
    results = {name: _train(model_path, inputs, name, rank, world_size) for name in names}
    if rank == 0:
        torch.save(results, out_file)
    if world_size > 1:
        torch.distributed.barrier()


def _engine_main(model_path: str, inputs_file: str, out_file: str) -> None:
    # two ranks first (torch.multiprocessing), before this process joins a process group of its own
    torch.multiprocessing.spawn(_dp_rank_main, args=(2, _free_port(), model_path, inputs_file, out_file + ".dp2"),
                                nprocs=2)
    _dp_rank_main(0, 1, _free_port(), model_path, inputs_file, out_file + ".dp1")
    results = {**torch.load(out_file + ".dp2", weights_only=False), **torch.load(out_file + ".dp1", weights_only=False)}
    for run in results.values():
        run["metrics"] = {k: sum(v) if isinstance(v, list) else v for k, v in run["metrics"].items()}
    torch.save(results, out_file)
    print("{}")


if __name__ == "__main__":
    _engine_main(*sys.argv[1:4])
