#!/usr/bin/env bash
# Qwen3-1.7B on GSM8K, FSDP2 trainer on 1 GPU, vLLM rollout on 1 GPU through verl's V1 trainer
# (separate_async, 32 prompts a step: shells/common.sh, darl_v1_run), configuration `_async`:
# verl's one-step-off trainer as shipped: no replay, PPO-clip against the rollout log-probs (bypass mode).
# Environment variables (model, data, GPUs, logger, checkpoints): see shells/common.sh.
# Extra arguments are Hydra overrides, e.g. `bash v1_separate_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_async.sh trainer.total_training_steps=200`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-32}" MINI_BATCH_SIZE="${MINI_BATCH_SIZE:-${TRAIN_BATCH_SIZE:-32}}"
darl_setup 1.7b gsm8k 1 1

darl_v1_run \
    algorithm.rollout_correction.bypass_mode=true \
    replay.enable=false \
    "$@"
