"""D-ARL's loss inside verl's real FSDP2 engine gives the gradient of its formula (docs/algorithm.md, 'Loss').

A subprocess (VERL_PLATFORM=cpu) builds verl's `TrainingWorker` (FSDP2 over gloo, world size 1,
sdpa, fp32, no torch.compile), installs `partial(darl_loss, config=<FSDPActorConfig>, threshold, stop_grad)`
with `set_loss_fn`, and trains one mini-batch with `train_mini_batch`, the call verl's actor makes,
after preparing the batch as `RayPPOTrainer._update_actor` does. The optimizer is replaced by one that
records the gradients it is asked to apply. This runs for several micro-batch cuts, with and without
remove-padding, with dynamic batch sizes, and over two data-parallel ranks (torch.multiprocessing, the
mini-batch cut as verl's Ray dispatch cuts it).

On a GPU, `test_engine_gradient_on_cuda` runs the same mini-batch through the engine on CUDA (NCCL) in fp32
and in verl's default bf16 mixed precision (skipped without one; docs/performance.md, 'Measured on an H100',
has its figures).

This process builds the batch (three behavior versions, `pmis` with rescored log-probs, `ess` source
weights, per-source clip decay) and computes the loss directly, written out
below, on the same weights loaded into a plain transformers model; the gradients must agree.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()

# the batch: B samples, prompts left-padded to P, responses right-padded to R
B, P, R = 6, 7, 6
PROMPT_LENS = [7, 5, 6, 3, 7, 4]
RESPONSE_LENS = [6, 4, 5, 2, 6, 3]
VERSIONS = [2, 3, 4, 2, 3, 4]  # behavior version of each sample; the step trains version 5
STEP = 5
# versions at which samples were rescored while in the buffer (proximal log-probs known)
RESCORED = {3: [True, False, False, True, False, False], 4: [True, True, False, False, False, False]}
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 2.0, -1.5]
THRESHOLD = 2.0  # rollout_is_threshold C
CLIP_LOW, CLIP_HIGH, CLIP_DECAY, CLIP_C = 0.2, 0.28, 0.8, 3.0
# log(pi_theta / pi_old) per token, kept away from every clip boundary; e^1.3 > CLIP_C
LOG_RATIOS = [-0.6, -0.02, 0.03, 0.3, 0.7, 1.3]
# log(pi_old / q) per token for the behavior densities q; e^1.2 > THRESHOLD
LOG_RHOS = [-0.4, 0.1, 1.2, 0.5, -0.1, 0.9, 0.0]

# (use_remove_padding, micro_batch_size_per_gpu, use_dynamic_bsz, calculate_entropy)
ENGINE_RUNS = {
    "rmpad/micro1": (True, 1, False, False),
    "rmpad/micro2": (True, 2, False, False),
    "rmpad/micro3": (True, 3, False, False),
    "rmpad/micro6": (True, 6, False, False),
    "rmpad/dynamic": (True, None, True, False),
    "rmpad/micro2/entropy": (True, 2, False, True),
    "padded/micro2": (False, 2, False, False),
}
DP_RUN = "dp2/rmpad/micro1"  # two data-parallel ranks (three samples each), one sample per micro-batch
ALL_RUNS = [*ENGINE_RUNS, DP_RUN]
DYNAMIC_MAX_TOKENS = 16  # per micro-batch with use_dynamic_bsz: micro-batches of 1 and 2 samples


# ----------------------------------------------------------------------------------------------
# the batch (this process)


def _response_log_probs(model, input_ids, attention_mask, position_ids, responses):
    """log pi(response token | prefix), teacher-forced: [B, R]."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    log_probs = torch.log_softmax(logits[:, P - 1:-1].float(), dim=-1)
    return log_probs.gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def _cycle(values, offset):
    return torch.tensor([values[(offset + l) % len(values)] for l in range(R)])


def make_batch(model) -> dict:
    from recipe.darl.core import batch_weights, clip_ranges

    g = torch.Generator().manual_seed(1)
    prompts = torch.zeros(B, P, dtype=torch.long)
    responses = torch.zeros(B, R, dtype=torch.long)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    response_mask = torch.zeros(B, R, dtype=torch.long)
    vocab = model.config.vocab_size
    for i, (lp, lr) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        prompts[i, P - lp:] = torch.randint(4, vocab, (lp,), generator=g)
        prompt_mask[i, P - lp:] = 1
        responses[i, :lr] = torch.randint(4, vocab, (lr,), generator=g)
        response_mask[i, :lr] = 1
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        current = _response_log_probs(model, input_ids, attention_mask, position_ids, responses)

    mask = response_mask.float()
    old = torch.stack([current[i] - _cycle(LOG_RATIOS, i) for i in range(B)]) * mask
    rollout = torch.stack([old[i] - _cycle(LOG_RHOS, i) for i in range(B)]) * mask
    recorded_lp = {j: torch.stack([old[i] - _cycle(LOG_RHOS, i + j) for i in range(B)]) * mask for j in RESCORED}
    versions = torch.tensor(VERSIONS)
    advantages = torch.tensor(ADVANTAGES).unsqueeze(-1) * mask

    # the four per-token tensors the D-ARL trainer puts in the batch
    recorded = {j: (torch.tensor(RESCORED[j]), recorded_lp[j]) for j in RESCORED}
    weights = batch_weights(response_mask, old, rollout, versions, "pmis", "ess", THRESHOLD, recorded=recorded)
    clip_low, clip_high = clip_ranges(versions, STEP, CLIP_LOW, CLIP_HIGH, CLIP_DECAY)
    return {
        "prompts": prompts, "responses": responses, "input_ids": input_ids, "attention_mask": attention_mask,
        "position_ids": position_ids, "response_mask": response_mask, "old_log_probs": old, "advantages": advantages,
        "rollout_log_probs": rollout, "darl_log_denominator": weights.log_denominator,
        "darl_token_coef": weights.token_coef,
        "darl_clip_low": clip_low.unsqueeze(-1).expand(B, R).contiguous(),
        "darl_clip_high": clip_high.unsqueeze(-1).expand(B, R).contiguous(),
        # not sent to the engine: what the reference needs
        "_versions": versions, "_recorded_lp": recorded_lp, "_current": current,
    }


# ----------------------------------------------------------------------------------------------
# the loss (docs/algorithm.md, 'Loss'), written out


def reference_terms(log_prob: torch.Tensor, batch: dict) -> dict:
    """Per-token pieces of the multi-behavior objective, straight from the formulas."""
    mask = batch["response_mask"].bool()
    versions = batch["_versions"]
    old, adv = batch["old_log_probs"], batch["advantages"]

    # pmis, balance heuristic: rho = pi_old / sum_{j in A_i} beta_j q_j, beta_j = n_j / sum_{k in A_i} n_k,
    # A_i = own version (q = mu, the rollout log-probs) + versions the sample was rescored at
    n = {v: int((versions == v).sum()) for v in set(VERSIONS)}
    denominator = torch.zeros(B, R)
    sizes = []
    for i in range(B):
        known = {VERSIONS[i]: batch["rollout_log_probs"][i]}
        known.update({j: batch["_recorded_lp"][j][i] for j in RESCORED if RESCORED[j][i] and j != VERSIONS[i]})
        total = sum(n[j] for j in known)
        denominator[i] = sum(n[j] / total * q.exp() for j, q in known.items())
        sizes.append(len(known))
    rho_bar = torch.clamp(old.exp() / denominator, max=THRESHOLD)  # truncated at C, a constant

    # clip range of source v: verl's clip ratios times clip_decay ** (step - v)
    decay = torch.tensor([CLIP_DECAY ** (STEP - v) for v in VERSIONS]).unsqueeze(-1)
    eps_low, eps_high = CLIP_LOW * decay, CLIP_HIGH * decay
    ratio = torch.exp(log_prob - old)
    # l = -rho_bar * min(r A, clip(r) A), and verl's dual clip: for A < 0 at most -A * c
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
    token_loss = -surrogate
    token_loss = torch.where(adv < 0, torch.minimum(token_loss, -adv * CLIP_C), token_loss)
    token_loss = rho_bar * token_loss

    # L = sum_v alpha_v * (masked sum of l over S_v) / tokens(S_v), alpha_v ~ ESS_v = (sum rho_bar)^2 / sum rho_bar^2
    loss, ess, tokens = 0.0, {}, {}
    for v in n:
        in_v = mask & (versions == v).unsqueeze(-1)
        tokens[v] = in_v.sum()
        ess[v] = rho_bar[in_v].sum() ** 2 / rho_bar[in_v].square().sum()
    for v in n:
        in_v = mask & (versions == v).unsqueeze(-1)
        loss = loss + ess[v] / sum(ess.values()) * (token_loss * in_v).sum() / tokens[v]
    return {
        "loss": loss, "rho": old.exp() / denominator, "surrogate_clipped":
            (torch.clamp(ratio, 1 - eps_low, 1 + eps_high) != ratio) & mask,
        "dual_clipped": (adv < 0) & (-adv * ratio > -adv * CLIP_C) & mask, "sources_per_sample": sizes,
        "log_denominator": denominator.log(), "mask": mask,
    }


# ----------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def setup(tiny_model_path, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa", dtype=torch.float32)
    batch = make_batch(model)
    return {"model": model, "batch": batch, "dir": tmp_path_factory.mktemp("engine_loss")}


@pytest.fixture(scope="module")
def engine(setup, tiny_model_path, run_python):
    """Runs the engine subprocess once: {"runs": {name: {"grads", "metrics", ...}}, "infer_log_probs", "config"}."""
    batch_file, out_file = setup["dir"] / "batch.pt", setup["dir"] / "engine.pt"
    torch.save({k: v for k, v in setup["batch"].items() if not k.startswith("_")}, batch_file)
    run_python([str(HERE), tiny_model_path, str(batch_file), str(out_file)], platform="cpu", timeout=300)
    return torch.load(out_file)


@pytest.fixture(scope="module")
def reference(setup):
    """Gradients of the written-out loss, by autograd through the transformers model."""
    model, batch = setup["model"], setup["batch"]
    model.zero_grad()
    log_prob = _response_log_probs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                   batch["responses"])
    terms = reference_terms(log_prob, batch)
    terms["loss"].backward()
    terms["loss"] = terms["loss"].item()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad()
    return {"grads": grads, **terms}


# ----------------------------------------------------------------------------------------------
# tests


def test_tiny_model(tiny_model_path, tmp_path):
    """The model under test: Qwen3, vocab_size == len(tokenizer), character tokens, ChatML, deterministic."""
    from transformers import AutoConfig, AutoTokenizer

    from recipe.darl.example.tiny_model import build_tiny_model

    config = AutoConfig.from_pretrained(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    assert config.model_type == "qwen3" and config.vocab_size == len(tokenizer)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert config.eos_token_id == tokenizer.eos_token_id and config.pad_token_id == tokenizer.pad_token_id
    text = "12 + 345 = 357\n\\boxed{357}"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tokenizer.decode(ids) == text
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], add_generation_prompt=True,
                                           tokenize=False)
    assert prompt == "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer(prompt)["input_ids"][0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    again = Path(build_tiny_model(tmp_path / "again", seed=0))
    assert (again / "model.safetensors").read_bytes() == (Path(tiny_model_path) / "model.safetensors").read_bytes()


def test_batch_exercises_every_case(reference, setup):
    """Clipping on both sides, dual clip, truncation of rho, and samples with 1, 2 and 3 known behaviors."""
    mask = reference["mask"]
    assert reference["surrogate_clipped"].any()
    assert reference["dual_clipped"].any()
    assert (reference["rho"][mask] > THRESHOLD).any() and (reference["rho"][mask] < THRESHOLD).any()
    assert set(reference["sources_per_sample"]) == {1, 2, 3}
    # the driver-side tensors are the same denominators as the formula above
    torch.testing.assert_close(setup["batch"]["darl_log_denominator"][mask], reference["log_denominator"][mask])


def test_engine_configuration(engine):
    cfg = engine["config"]
    assert cfg["platform"] == "PlatformCPU" and cfg["engine"] == "FSDPEngineWithLMHead"
    assert cfg["strategy"] == "fsdp2" and cfg["backend"] == "gloo" and cfg["world_size"] == 1
    assert cfg["param_dtype"] == cfg["autocast_dtype"] == "torch.float32" and cfg["attn_implementation"] == "sdpa"
    assert cfg["fsdp2_module"] is True
    assert engine["runs"][DP_RUN]["dp_size"] == 2
    # the comparison is exact only without entropy bonus and KL term
    assert cfg["entropy_coeff"] == 0.0 and cfg["use_kl_loss"] is False


@pytest.mark.parametrize("run", ALL_RUNS)
def test_engine_gradient_matches_section_4(engine, reference, run):
    grads = engine["runs"][run]["grads"]
    assert set(grads) == set(reference["grads"])
    for name, expected in reference["grads"].items():
        assert expected.abs().max() > 1e-4, f"{name}: the reference gradient vanishes"
        torch.testing.assert_close(grads[name], expected, atol=1e-5, rtol=1e-4, msg=lambda m: f"{run} {name}: {m}")


@pytest.mark.parametrize("run", ALL_RUNS)
def test_engine_loss_metric_is_the_loss(engine, reference, run):
    metrics = engine["runs"][run]["metrics"]
    # pg_loss is summed over micro-batches (token_coef normalizes over the mini-batch)
    assert metrics["actor/pg_loss"] == pytest.approx(reference["loss"], abs=1e-6)
    assert metrics["loss"] == pytest.approx(reference["loss"], abs=1e-6)
    assert "kl_loss" not in metrics
    assert ("actor/entropy_loss" in metrics) == (run == "rmpad/micro2/entropy")


def test_micro_batch_cuts_give_one_gradient(engine):
    """R4 inside the engine: every cut, padded or packed, over one or two ranks, gives the same gradient."""
    runs = ALL_RUNS
    first = engine["runs"][runs[0]]["grads"]
    dynamic_sizes = engine["runs"]["rmpad/dynamic"]["micro_batch_sizes"]
    assert len(dynamic_sizes) > 1 and len(set(dynamic_sizes)) > 1, dynamic_sizes
    for run in runs[1:]:
        for name, g in engine["runs"][run]["grads"].items():
            torch.testing.assert_close(g, first[name], atol=1e-6, rtol=1e-5, msg=lambda m: f"{run} {name}: {m}")


def test_forward_only_engine_log_probs(engine, setup):
    """A forward-only engine (as verl builds the reference policy's: FSDP2 CPU offload) gives the log-probs."""
    batch = setup["batch"]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(engine["infer_log_probs"][mask], batch["_current"][mask], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# on a GPU: verl's CUDA platform, NCCL, fp32 and verl's default bf16 mixed precision

# name: (param_dtype, use_remove_padding, micro_batch_size_per_gpu, use_dynamic_bsz)
CUDA_RUNS = {
    "fp32/rmpad/micro2": ("fp32", True, 2, False),
    "fp32/rmpad/dynamic": ("fp32", True, None, True),
    "fp32/padded/micro2": ("fp32", False, 2, False),
    "bf16/rmpad/micro2": ("bf16", True, 2, False),
    "bf16/rmpad/dynamic": ("bf16", True, None, True),
    "bf16/padded/micro2": ("bf16", False, 2, False),
}
BF16_GRAD_REL_ERR = 0.05  # ||g - g_ref|| / ||g_ref|| over all parameters; bf16 keeps 8 significant bits


def _flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.flatten() for _, g in sorted(grads.items())])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run there: pytest -s -k cuda)")
def test_engine_gradient_on_cuda(setup, reference, tiny_model_path, run_python):
    """The same mini-batch through verl's engine on CUDA: fp32 gives the written-out loss's gradient, bf16 gives it to bf16's
    precision, for packed, padded and dynamic micro-batches. Prints the errors (docs/performance.md quotes them)."""
    batch_file, out_file = setup["dir"] / "batch_cuda.pt", setup["dir"] / "engine_cuda.pt"
    torch.save({k: v for k, v in setup["batch"].items() if not k.startswith("_")}, batch_file)
    run_python([str(HERE), tiny_model_path, str(batch_file), str(out_file), "cuda"], platform=None, timeout=600)
    engine = torch.load(out_file)
    cfg = engine["config"]
    assert cfg["platform"] != "PlatformCPU" and "cuda:nccl" in cfg["backend"] and cfg["fsdp2_module"], cfg
    expected = _flat(reference["grads"])
    errors = {}
    for run, out in engine["runs"].items():
        got = _flat(out["grads"])
        errors[run] = {"grad_rel_err": ((got - expected).norm() / expected.norm()).item(),
                       "loss": out["metrics"]["actor/pg_loss"], "loss_ref": reference["loss"]}
        if run.startswith("fp32"):
            for name, exp in reference["grads"].items():
                torch.testing.assert_close(out["grads"][name], exp, atol=1e-4, rtol=1e-3, msg=lambda m: f"{run} {name}: {m}")
            assert out["metrics"]["actor/pg_loss"] == pytest.approx(reference["loss"], rel=1e-4, abs=1e-5)
        else:
            assert errors[run]["grad_rel_err"] < BF16_GRAD_REL_ERR, (run, errors[run])
            assert out["metrics"]["actor/pg_loss"] == pytest.approx(reference["loss"], rel=0.02, abs=1e-3)
    assert engine["runs"]["bf16/rmpad/micro2"]["autocast_dtype"] == "torch.bfloat16"
    print(json.dumps({"cuda_engine_loss": {"config": cfg, "errors": errors}}))


# ----------------------------------------------------------------------------------------------
# the engine side (run as a script with VERL_PLATFORM=cpu)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Engine:
    """verl's TrainingWorker (in this process) with the D-ARL loss and a gradient-recording optimizer."""

    def __init__(self, model_path: str, tensors: dict, param_dtype: str = "fp32"):
        torch.set_num_threads(1)
        self.param_dtype = param_dtype
        from verl.workers.config import FSDPActorConfig

        from recipe.darl.workers.actor_loss import darl_loss

        self.model_path = model_path
        self.tensors = tensors
        self.actor_config = FSDPActorConfig(
            strategy="fsdp2", ppo_mini_batch_size=B, ppo_micro_batch_size_per_gpu=2, rollout_n=1,
            clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, clip_ratio_c=CLIP_C,
            entropy_coeff=0.0, use_kl_loss=False, loss_agg_mode="token-mean",
        )
        # what the D-ARL trainer installs with actor_wg.set_loss_fn
        self.loss_fn = functools.partial(darl_loss, config=self.actor_config, threshold=THRESHOLD, stop_grad=True)

    def worker(self, use_remove_padding: bool, forward_only: bool = False):
        from verl.trainer.config import CheckpointConfig
        from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig
        from verl.workers.engine_workers import TrainingWorker

        # verl's GPU default is bf16 parameters in compute, fp32 reduction and master weights
        precision = {"param_dtype": self.param_dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
        config = TrainingWorkerConfig(
            model_type="language_model",
            model_config=HFModelConfig(path=self.model_path, override_config={"attn_implementation": "sdpa"},
                                       use_remove_padding=use_remove_padding),
            engine_config=FSDPEngineConfig(strategy="fsdp2", forward_only=forward_only, use_torch_compile=False,
                                           mixed_precision=precision, use_dynamic_bsz=False, micro_batch_size_per_gpu=2,
                                           infer_micro_batch_size_per_gpu=2),
            optimizer_config=None if forward_only else FSDPOptimizerConfig(lr=1e-3, clip_grad=1e9, total_training_steps=1),
            checkpoint_config=CheckpointConfig(),
        )
        worker = TrainingWorker(config)
        worker.reset()
        if not forward_only:
            worker.set_loss_fn(self.loss_fn)
        return worker

    def trainer_batch(self, calculate_entropy: bool):
        """The mini-batch as RayPPOTrainer._update_actor hands it to update_actor."""
        from verl import DataProto
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        batch = DataProto.from_dict(tensors={k: v.clone() for k, v in self.tensors.items()},
                                    meta_info={"temperature": 1.0})
        td = left_right_2_no_padding(batch.to_tensordict())
        tu.assign_non_tensor(td, calculate_entropy=calculate_entropy, distillation_use_topk=False,
                             distillation_only=False, global_batch_size=B, mini_batch_size=B, epochs=1, seed=42,
                             dataloader_kwargs={"shuffle": False}, compute_loss=True)
        return td

    @staticmethod
    def train(worker, td, micro: int | None, dynamic: bool) -> dict:
        """One train_mini_batch; returns the gradients the optimizer was given, the metrics, the micro-batches."""
        from torch.distributed.tensor import DTensor
        from verl.utils import tensordict_utils as tu

        class GradientRecorder(torch.optim.Optimizer):
            """Stands in for the optimizer: step() keeps the full gradients and changes nothing."""

            def __init__(self, params):
                super().__init__(list(params), {})
                self.steps = []

            @torch.no_grad()
            def step(self, closure=None):
                grads = []
                for group in self.param_groups:
                    for p in group["params"]:
                        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                        grads.append(grad.detach().to("cpu", torch.float32, copy=True))
                self.steps.append(grads)

        engine = worker.engine
        recorder = GradientRecorder(engine.module.parameters())
        engine.optimizer = recorder
        worker.engine_config.use_dynamic_bsz = dynamic
        worker.engine_config.micro_batch_size_per_gpu = micro
        worker.engine_config.max_token_len_per_gpu = DYNAMIC_MAX_TOKENS if dynamic else None
        sizes = []
        forward_step = engine.forward_step

        def counting_forward_step(micro_batch, *args, **kwargs):
            sizes.append(micro_batch.batch_size[0])
            return forward_step(micro_batch, *args, **kwargs)

        engine.forward_step = counting_forward_step
        try:
            output = worker.train_mini_batch(td)
        finally:
            engine.forward_step = forward_step
        assert len(recorder.steps) == 1, len(recorder.steps)
        names = [n for n, _ in engine.module.named_parameters()]
        metrics = tu.get(output, "metrics") if output is not None else {}
        return {
            "grads": dict(zip(names, recorder.steps[0])),
            "metrics": {k: float(v[0] if isinstance(v, list) else v) for k, v in metrics.items()},
            "micro_batch_sizes": sizes,
        }


def _dp_rank_main(rank: int, world_size: int, port: int, model_path: str, batch_file: str, out_file: str) -> None:
    """One rank of a data-parallel group: trains on its share of the mini-batch as verl's dispatch cuts it."""
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from verl.protocol import BatchData

    runner = _Engine(model_path, torch.load(batch_file))
    worker = runner.worker(use_remove_padding=True)
    # the rank's share as RayWorkerGroup dispatches it: verl's chunk, then a serialization round trip
    shard = pickle.loads(pickle.dumps(BatchData(runner.trainer_batch(False)).chunk(chunks=world_size)[rank]))
    result = runner.train(worker, shard, micro=1, dynamic=False)
    if rank == 0:
        result["dp_size"] = worker.engine.get_data_parallel_size()
        torch.save(result, out_file)
    torch.distributed.barrier()


def _engine_main(model_path: str, batch_file: str, out_file: str) -> None:
    from verl import DataProto
    from verl.plugin.platform import get_platform
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    tensors = torch.load(batch_file)
    result = {"runs": {}}

    # data parallel: two ranks, each with half the mini-batch (torch.multiprocessing; before this process
    # joins a process group of its own)
    dp_file = out_file + ".dp2"
    torch.multiprocessing.spawn(_dp_rank_main, args=(2, _free_port(), model_path, batch_file, dp_file), nprocs=2)
    result["runs"][DP_RUN] = torch.load(dp_file)

    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    runner = _Engine(model_path, tensors)
    workers = {}
    for name, (rmpad, micro, dynamic, entropy) in ENGINE_RUNS.items():
        if rmpad not in workers:
            workers[rmpad] = runner.worker(rmpad)
        result["runs"][name] = runner.train(workers[rmpad], runner.trainer_batch(entropy), micro, dynamic)

    # a forward-only engine, as verl builds the reference policy's
    ref = runner.worker(True, forward_only=True)
    td = runner.trainer_batch(False)
    tu.assign_non_tensor(td, compute_loss=False)
    out = ref.infer_batch(td)
    padded = DataProto.from_dict(tensors={k: tensors[k] for k in ("prompts", "responses", "attention_mask")})
    result["infer_log_probs"] = no_padding_2_padding(tu.get(out, "log_probs"), padded.to_tensordict())

    engine = workers[True].engine
    result["config"] = {
        "platform": type(get_platform()).__name__,
        "engine": type(engine).__name__,
        "strategy": engine.engine_config.strategy,
        "backend": torch.distributed.get_backend(),
        "world_size": torch.distributed.get_world_size(),
        "param_dtype": str(next(engine.module.parameters()).dtype),
        "autocast_dtype": str(engine._autocast_dtype),
        "attn_implementation": engine.model_config.hf_config._attn_implementation,
        "fsdp2_module": type(engine.module).__name__.startswith("FSDP"),
        "entropy_coeff": float(runner.actor_config.entropy_coeff),
        "use_kl_loss": bool(runner.actor_config.use_kl_loss),
    }
    torch.save(result, out_file)
    print(json.dumps({k: v["micro_batch_sizes"] for k, v in result["runs"].items()}))


def _cuda_main(model_path: str, batch_file: str, out_file: str) -> None:
    """The CUDA_RUNS on one GPU, world size 1 (verl picks its CUDA platform and NCCL)."""
    from verl.plugin.platform import get_platform

    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    tensors = torch.load(batch_file)
    result, workers = {"runs": {}}, {}
    for name, (dtype, rmpad, micro, dynamic) in CUDA_RUNS.items():
        runner = _Engine(model_path, tensors, param_dtype=dtype)
        if (dtype, rmpad) not in workers:
            workers[dtype, rmpad] = runner.worker(rmpad)
        worker = workers[dtype, rmpad]
        result["runs"][name] = runner.train(worker, runner.trainer_batch(False), micro, dynamic)
        result["runs"][name]["autocast_dtype"] = str(worker.engine._autocast_dtype)
    engine = workers["bf16", True].engine
    result["config"] = {
        "platform": type(get_platform()).__name__, "device": torch.cuda.get_device_name(),
        "backend": torch.distributed.get_backend(), "torch": str(torch.__version__),
        "attn_implementation": engine.model_config.hf_config._attn_implementation,
        "fsdp2_module": type(engine.module).__name__.startswith("FSDP"),
    }
    torch.save(result, out_file)
    print(json.dumps({k: v["micro_batch_sizes"] for k, v in result["runs"].items()}))


if __name__ == "__main__":
    (_cuda_main if sys.argv[4:] == ["cuda"] else _engine_main)(*sys.argv[1:4])
