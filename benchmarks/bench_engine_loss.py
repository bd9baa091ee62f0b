"""Step time and peak memory of one mini-batch in verl's FSDP2 engine: verl's decoupled ppo_loss vs darl_loss.

Builds a randomly initialised Qwen3 of the chosen shape (`--model qwen3-1.7b` is Qwen3-1.7B's config: 28 layers,
hidden 2048, vocab 151,936), verl's `TrainingWorker` as the actor uses it (FSDP2, verl's default bf16 mixed
precision, remove-padding, gradient checkpointing, dynamic micro-batches of `--max-tokens` tokens, AdamW;
torch.compile only with `--compile`, although verl's default and the GPU scripts have it on), and
one verl-shaped mini-batch: `--prompts` x `--n` samples, prompts left-padded to `--prompt-length`, responses
right-padded to `--response-length` (lengths uniform in [1/4, 1] of each), samples spread over `--k` behavior
versions. The same mini-batch is trained alternately with

- `decoupled`: verl's `ppo_loss` with rollout-IS weights min(pi_old / mu, 2) (the `_decoupled` launch scripts)
- `darl`: `darl_loss` with the four D-ARL tensors (`pmis` denominators, `ess` source weights, clip decay)

and the median wall time of `train_mini_batch` (forward, backward, optimizer step) and the peak device memory
of each are printed as a markdown table (docs/performance.md). The launch scripts' mini-batch is 32 x 8.

    python benchmarks/bench_engine_loss.py --json out.json          # on one GPU: Qwen3-1.7B shape, 32 x 8
    VERL_PLATFORM=cpu python benchmarks/bench_engine_loss.py --model tiny --prompts 2 --n 2 \\
        --prompt-length 16 --response-length 16 --max-tokens 64 --repeats 1        # a CPU check of the script
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch

# Qwen3's published configs (config.json of Qwen/Qwen3-1.7B and Qwen/Qwen3-4B)
SHAPES = {
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, vocab_size=151936),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=151936),
}
THRESHOLD = 2.0  # rollout_is_threshold, as the launch scripts set it


def build_model(kind: str, out: Path) -> str:
    """A model directory verl's HFModelConfig loads: the tiny model's tokenizer, the chosen shape, random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config

    from recipe.darl.example.tiny_model import build_tiny_model

    path = build_tiny_model(out, seed=0)
    if kind == "tiny":
        return path
    tiny = AutoConfig.from_pretrained(path)
    config = Qwen3Config(**SHAPES[kind], head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0,
                         tie_word_embeddings=True, rms_norm_eps=1e-6, bos_token_id=tiny.bos_token_id,
                         eos_token_id=tiny.eos_token_id, pad_token_id=tiny.pad_token_id)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    del model
    return path


def make_batch(args, vocab: int) -> dict[str, torch.Tensor]:
    """A mini-batch with everything both losses read: [B, P] prompts, [B, R] responses and per-token tensors."""
    from recipe.darl.core import batch_weights, clip_ranges

    g = torch.Generator().manual_seed(0)
    b, p, r = args.prompts * args.n, args.prompt_length, args.response_length
    prompt_lens = torch.randint(p // 4, p + 1, (args.prompts,), generator=g).repeat_interleave(args.n)
    response_lens = torch.randint(r // 4, r + 1, (b,), generator=g)
    prompt_mask = (torch.arange(p) >= p - prompt_lens.unsqueeze(1)).long()
    response_mask = (torch.arange(r) < response_lens.unsqueeze(1)).long()
    prompts = torch.randint(4, vocab, (b, p), generator=g) * prompt_mask
    responses = torch.randint(4, vocab, (b, r), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    mask = response_mask.float()
    old = -torch.rand(b, r, generator=g) * 2 * mask
    rollout = (old + (torch.rand(b, r, generator=g) - 0.5)) * mask
    versions = torch.arange(args.prompts).repeat_interleave(args.n) % args.k + 10 - args.k  # step 10 trains
    advantages = torch.randn(args.prompts, 1, generator=g).repeat_interleave(args.n, 0) * mask
    weights = batch_weights(response_mask, old, rollout, versions, "pmis", "ess", THRESHOLD)
    low, high = clip_ranges(versions, 10, 0.2, 0.28, 0.8)
    return {
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask, "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": response_mask, "old_log_probs": old, "advantages": advantages,
        "rollout_log_probs": rollout, "rollout_is_weights": (old - rollout).exp().clamp(max=THRESHOLD) * mask,
        "darl_log_denominator": weights.log_denominator, "darl_token_coef": weights.token_coef,
        "darl_clip_low": low.unsqueeze(-1).expand(b, r).contiguous(),
        "darl_clip_high": high.unsqueeze(-1).expand(b, r).contiguous(),
    }


def build_worker(model_path: str, args):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker

    config = TrainingWorkerConfig(
        model_type="language_model",
        model_config=HFModelConfig(path=model_path, override_config={"attn_implementation": args.attn},
                                   use_remove_padding=not args.padded, enable_gradient_checkpointing=True,
                                   use_fused_kernels=args.fused is not None,
                                   fused_kernel_options={"impl_backend": args.fused} if args.fused else {}),
        engine_config=FSDPEngineConfig(strategy="fsdp2", use_dynamic_bsz=True, max_token_len_per_gpu=args.max_tokens,
                                       use_torch_compile=args.compile),
        optimizer_config=FSDPOptimizerConfig(lr=1e-6, clip_grad=1.0, total_training_steps=1000),
        checkpoint_config=CheckpointConfig(),
    )
    worker = TrainingWorker(config)
    worker.reset()
    return worker


def losses(args) -> dict:
    from verl.workers.config import FSDPActorConfig
    from verl.workers.utils.losses import ppo_loss

    from recipe.darl.workers.actor_loss import darl_loss

    actor = FSDPActorConfig(strategy="fsdp2", ppo_mini_batch_size=args.prompts, rollout_n=args.n, use_dynamic_bsz=True,
                            ppo_max_token_len_per_gpu=args.max_tokens,
                            clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, entropy_coeff=0.0,
                            use_kl_loss=False, loss_agg_mode="token-mean")
    return {"decoupled": functools.partial(ppo_loss, config=actor),
            "darl": functools.partial(darl_loss, config=actor, threshold=THRESHOLD, stop_grad=True)}


def trainer_batch(tensors: dict, samples: int):
    """The mini-batch as RayPPOTrainer._update_actor hands it to the actor (packed, no padding)."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(DataProto.from_dict(tensors=dict(tensors), meta_info={"temperature": 1.0})
                                 .to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
                         global_batch_size=samples, mini_batch_size=samples, epochs=1, seed=42,
                         dataloader_kwargs={"shuffle": False}, compute_loss=True)
    return td


def raw_step(model_path: str, args, device: str) -> None:
    """transformers alone: fp32 weights, bf16 autocast, gradient checkpointing, sdpa; one padded micro-batch of
    about --max-tokens tokens (rows of prompt + response length); log-prob loss. Prints seconds and TFLOP/s."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation=args.attn)
    model.to(device).gradient_checkpointing_enable()
    model.config.use_cache = False
    length = args.prompt_length + args.response_length
    rows = max(1, args.max_tokens // length)
    ids = torch.randint(4, model.config.vocab_size, (rows, length), device=device)
    params = sum(p.numel() for p in model.parameters())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for rep in range(args.repeats + 1):
        sync()
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        loss = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).mean()
        sync()
        mid = time.perf_counter()
        loss.backward()
        sync()
        end = time.perf_counter()
        model.zero_grad(set_to_none=True)
        flops = 8 * params * rows * length  # forward 2, recomputed forward 2, backward 4 per parameter and token
        print(f"raw pass {rep}: forward {mid - start:.2f} s, backward {end - mid:.2f} s, {rows * length} tokens, "
              f"{flops / (end - start) / 1e12:.0f} TFLOP/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", *SHAPES], default="qwen3-1.7b")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=512)
    parser.add_argument("--response-length", type=int, default=1024)
    parser.add_argument("--k", type=int, default=4, help="behavior versions in the mini-batch")
    parser.add_argument("--max-tokens", type=int, default=24576, help="ppo_max_token_len_per_gpu (1.7B scripts)")
    parser.add_argument("--attn", default="sdpa", help="attn_implementation (flash_attention_2 needs flash-attn)")
    parser.add_argument("--padded", action="store_true", help="use_remove_padding=false (verl's default: true)")
    parser.add_argument("--fused", choices=["torch", "triton"],
                        help="verl's use_fused_kernels with this impl_backend (log-probs without the logits)")
    parser.add_argument("--compile", action="store_true", help="verl's use_torch_compile (its default; off here)")
    parser.add_argument("--repeats", type=int, default=3, help="timed mini-batches per loss, after one warm-up each")
    parser.add_argument("--raw", action="store_true",
                        help="only time transformers' forward + backward of one --max-tokens micro-batch, no verl")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    cuda = torch.cuda.is_available() and os.environ.get("VERL_PLATFORM") != "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        model_path = build_model(args.model, Path(tmp) / "model")
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(model_path)
        if args.raw:
            return raw_step(model_path, args, "cuda" if cuda else "cpu")
        tensors = make_batch(args, hf.vocab_size)
        worker = build_worker(model_path, args)
        fns = losses(args)
        samples = args.prompts * args.n
        times = {name: [] for name in fns}
        peak = {name: 0 for name in fns}
        for rep in range(args.repeats + 1):
            for name in (list(fns) if rep % 2 == 0 else list(fns)[::-1]):
                worker.set_loss_fn(fns[name])
                td = trainer_batch(tensors, samples)
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                start = time.perf_counter()
                worker.train_mini_batch(td)
                if cuda:
                    torch.cuda.synchronize()
                    peak[name] = max(peak[name], torch.cuda.max_memory_allocated())
                seconds = time.perf_counter() - start
                print(f"{name} pass {rep}{' (warm-up)' if rep == 0 else ''}: {seconds:.2f} s", flush=True)
                if rep > 0:  # the first pass of each loss warms up kernels and the allocator
                    times[name].append(seconds)
        params = sum(p.numel() for p in worker.engine.module.parameters())
    tokens = int(tensors["attention_mask"].sum())
    result = {
        "model": args.model, "parameters": params, "samples": samples, "tokens": tokens,
        "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "attn": args.attn,
        "remove_padding": not args.padded, "fused_kernels": args.fused,
        "compile": args.compile, "max_tokens": args.max_tokens, "repeats": args.repeats,
        "seconds": times, "median_s": {k: statistics.median(v) for k, v in times.items()},
        "peak_gib": {k: v / 2**30 for k, v in peak.items()},
    }
    result["ratio"] = result["median_s"]["darl"] / result["median_s"]["decoupled"]
    print(f"| loss | median s / mini-batch | tokens/s | peak GiB |  ({args.model}, {params / 1e9:.2f}B params, "
          f"{samples} samples, {tokens} tokens, {result['device']})")
    print("|---|---|---|---|")
    for name in fns:
        print(f"| {name} | {result['median_s'][name]:.2f} | {tokens / result['median_s'][name]:,.0f} "
              f"| {result['peak_gib'][name]:.1f} |")
    print(f"darl / decoupled: {result['ratio']:.3f}")
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
