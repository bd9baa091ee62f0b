"""What a launch costs, before it starts: step time, tokens per second, GPU and host memory, hours for the schedule.

    python -m recipe.darl.estimate shells/one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh [overrides]
    python -m recipe.darl.estimate SCRIPT --mean-response 900 --gpu-gib 141      # your lengths, an H200

The script's resolved config comes from its dry run (DARL_DRY_RUN=1, no GPU needed). Every figure is an estimate from
costs measured on one H100 80GB (MODELS; docs/performance.md, docs/darts.md), scaled by the model's size and the
config: trainer GPUs and rollout replicas are assumed to scale linearly, vLLM's own scheduling is not in it, and
one-step-off and fully-async overlap training with generation (a step takes the longer of them).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Optional

import yaml

from recipe.darl.core.config import ReplayConfig
from recipe.darl.trainer_mode import TrainerMode, mode_of_dry_run

GIB = 2**30


@dataclass(frozen=True)
class ModelCost:
    """Measured on one H100 80GB (bf16): training throughput, activation memory and the decode-step fit."""

    params: float  # parameters
    train_tokens_per_s: float  # verl's FSDP2 engine, one GPU, sdpa, one mini-batch update
    activation_gib: float  # peak minus 16 bytes per parameter, 8,192-token micro-batches
    decode_fixed_ms: float
    decode_per_seq_ms: float
    decode_per_ctx_token_ms: float


# decode fits: docs/evidence/darts/gpu/decode_cost_h100.json; training: docs/performance.md (2026-11-27)
MODELS = {
    "qwen3-1.7b": ModelCost(1.72e9, 58469 / 15.3, 32.9 - 16 * 1.72e9 / GIB, 2.591, 0.00334, 3.727e-5),
    "qwen3-4b": ModelCost(4.02e9, 58469 / 20.2, 75.4 - 16 * 4.02e9 / GIB, 4.689, 0.00747, 4.791e-5),
}
MEAN_RESPONSE = {"gsm8k": 250, "math": 700}  # tokens: the DARTS simulator's GSM8K-like and MATH-like medians
TRAIN_ROWS = {"gsm8k": 7473, "math": 7500}  # the prepared training sets (recipe.darl.data.prepare)
BUFFER_BYTES_PER_TOKEN = 19.04  # token ids, masks and log-probs with 2.5 recorded versions (`make bench`)
_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d[ T]|darl\] |D-ARL\] |validate_config\] )")


def resolved_config(script: str, overrides: list[str]) -> tuple[dict, TrainerMode]:
    """The config `script` would run with `overrides` and its trainer's mode, from its dry run."""
    env = {"PYTHON": sys.executable, **os.environ, "DARL_DRY_RUN": "1"}
    done = subprocess.run(["bash", script, *overrides], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{script}: the dry run failed:\n{done.stderr[-3000:]}")
    config = yaml.safe_load("\n".join(line for line in done.stdout.splitlines() if not _LOG_LINE.match(line)))
    return config, mode_of_dry_run(done.stdout)


def model_of(path: str) -> str:
    name = os.path.basename(str(path).rstrip("/")).lower()
    for key in MODELS:
        if key in name:
            return key
    raise SystemExit(f"actor_rollout_ref.model.path={path}: costs are measured for {', '.join(MODELS)} only")


def dataset_of(cfg: dict) -> Optional[str]:
    files = str(cfg["data"]["train_files"]).lower()
    return next((d for d in MEAN_RESPONSE if f"/{d}/" in files or f"{d}" in os.path.basename(files)), None)


def generation_s(cost: ModelCost, sequences: int, prompt: int, mean: float, longest: float, replicas: int) -> float:
    """Decode time of `sequences` responses on `replicas` engines: every step pays the fixed cost while the longest
    runs, each token its sequence's and its context's share."""
    per_replica = math.ceil(sequences / max(replicas, 1))
    ctx_token_steps = per_replica * (prompt * mean + mean * mean / 2)  # sum over steps of each sequence's context
    ms = longest * cost.decode_fixed_ms + per_replica * mean * cost.decode_per_seq_ms \
        + ctx_token_steps * cost.decode_per_ctx_token_ms
    return ms / 1e3


def estimate(cfg: dict, mode: TrainerMode, mean_response: Optional[float] = None, gpu_gib: float = 80.0,
             train_rows: Optional[int] = None) -> dict[str, Any]:
    ar, data, trainer = cfg["actor_rollout_ref"], cfg["data"], cfg["trainer"]
    cost = MODELS[model_of(ar["model"]["path"])]
    dataset = dataset_of(cfg)
    mean = float(mean_response or MEAN_RESPONSE.get(dataset or "", 0) or data["max_response_length"] / 3)
    longest = min(2.5 * mean, float(data["max_response_length"]))
    prompt = min(float(data["max_prompt_length"]) / 2, 250.0)
    n = int(ar["rollout"]["n"])
    groups = mode.step_budget(cfg)
    replay = cfg.get("replay") or {}
    ratio = ReplayConfig.from_dict(replay).resolved("ratio") if replay.get("enable") else None
    trained_groups = groups * (1 + (ratio or 0))  # additive replay trains up to `ratio` more groups than fresh ones
    trainer_gpus = int(trainer["nnodes"]) * int(trainer["n_gpus_per_node"])
    rollout = cfg.get("rollout") or {}
    rollout_gpus = int(rollout.get("nnodes", 0) or 0) * int(rollout.get("n_gpus_per_node", 0) or 0)
    tp = int(ar["rollout"].get("tensor_model_parallel_size", 1) or 1)
    replicas = max(rollout_gpus // tp, 1)
    epochs = int(ar["actor"].get("ppo_epochs", 1) or 1)
    train_tokens = trained_groups * n * (prompt + mean)
    bypass = ((cfg.get("algorithm") or {}).get("rollout_correction") or {}).get("bypass_mode")
    recompute = 0 if bypass else 1 / 3  # the old log-prob forward, skipped when pi_old is the rollout's (naive async)
    train = train_tokens * (epochs + recompute) / (cost.train_tokens_per_s * max(trainer_gpus, 1))
    gen = generation_s(cost, groups * n, int(prompt), mean, longest, replicas)
    step = max(train, gen)
    micro = float(ar["actor"].get("ppo_max_token_len_per_gpu") or 8192)
    rows = train_rows or TRAIN_ROWS.get(dataset or "")
    if trainer.get("total_training_steps"):
        steps = int(trainer["total_training_steps"])
    elif mode.fully_async and rollout.get("total_rollout_steps"):
        steps = int(rollout["total_rollout_steps"]) // groups  # the rollouter's prompts in all, a step's groups each
    else:
        steps = int(trainer["total_epochs"]) * rows // max(int(data["train_batch_size"]), 1) if rows else None
    k = int(replay.get("k", 4)) if replay.get("enable") else 0
    return {
        "mean response tokens (assumed)": mean, "groups per step (trained, at most)": f"{groups} ({trained_groups:g})",
        "training s/step": train, "generation s/step": gen, "step s": step,
        "tokens/s (generated)": groups * n * mean / step,
        "trainer GPU memory GiB": 16 * cost.params / GIB / max(trainer_gpus, 1) + cost.activation_gib * micro / 8192,
        "rollout GPU memory GiB": float(ar["rollout"].get("gpu_memory_utilization", 0.8)) * gpu_gib,
        "replay buffer host MiB": k * groups * n * (mean + prompt / n) * BUFFER_BYTES_PER_TOKEN / 2**20,
        "steps": steps, "hours": steps * step / 3600 if steps else None,
    }


# bytes a parameter takes in a verl FSDP checkpoint, by actor.checkpoint.save_contents: the fp32 model shards (verl's
# FSDP model_dtype is fp32), AdamW's two fp32 moments, and with hf_model a full fp32 Hugging Face copy ("extra": the
# scheduler and RNG states, a few KiB)
CHECKPOINT_BYTES_PER_PARAM = {"model": 4, "optimizer": 8, "hf_model": 4}


def checkpoint_disk(cfg: dict, steps: Optional[int], replay_mib: float = 0.0) -> dict[str, Any]:
    """One checkpoint's size (its save_contents, plus D-ARL's replay buffer), how many are saved and kept, and the disk
    the run's checkpoint folder needs at most: the trainer writes a new checkpoint before it removes the oldest one
    beyond trainer.max_actor_ckpt_to_keep (None: every one is kept)."""
    ar, trainer = cfg["actor_rollout_ref"], cfg["trainer"]
    params = MODELS[model_of(ar["model"]["path"])].params
    contents = (ar["actor"].get("checkpoint") or {}).get("save_contents") or ["model", "optimizer", "extra"]
    size = params * sum(CHECKPOINT_BYTES_PER_PARAM.get(c, 0) for c in contents) / GIB + replay_mib / 1024
    freq = int(trainer.get("save_freq") or -1)
    saves = -(-steps // freq) if steps and freq > 0 else (0 if freq <= 0 else None)  # the last step saves too
    keep = 1 if trainer.get("remove_previous_ckpt_in_save") else trainer.get("max_actor_ckpt_to_keep")
    keep = None if keep is None or int(keep) <= 0 else int(keep)
    peak = saves if keep is None else (keep + 1 if saves is None else min(saves, keep + 1))
    return {"checkpoint GiB (each)": size, "checkpoints saved": saves,
            "checkpoints kept (max_actor_ckpt_to_keep)": keep if keep is not None else saves,
            "checkpoint disk GiB (at most)": size * peak if peak is not None else None}


def table(script: str, figures: dict[str, Any]) -> str:
    def fmt(v):
        return "-" if v is None else f"{v:,.1f}" if isinstance(v, float) else str(v)

    return "\n".join([f"estimate for {script} (from costs measured on one H100; docs/performance.md)"]
                     + [f"  {k:<32} {fmt(v)}" for k, v in figures.items()])


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("script")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--mean-response", type=float, help="mean response tokens [GSM8K 250, MATH 700]")
    p.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU [80]")
    args = p.parse_args(argv)
    cfg, mode = resolved_config(args.script, args.overrides)
    figures = estimate(cfg, mode, args.mean_response, args.gpu_gib)
    figures.update(checkpoint_disk(cfg, figures["steps"], figures["replay buffer host MiB"]))  # disk for checkpoints
    print(table(args.script, figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
