#!/usr/bin/env bash
# Qwen3-1.7B on GSM8K, FSDP2 trainer on 1 GPU, vLLM rollout on 1 GPU (one-step-off), configuration `_async`:
# verl's one-step-off trainer as shipped: no replay, PPO-clip against the rollout log-probs (bypass mode).
# Environment variables (model, data, GPUs, logger, checkpoints): see shells/common.sh.
# Extra arguments are Hydra overrides, e.g. `bash one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_async.sh trainer.total_training_steps=200`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_setup 1.7b gsm8k 1 1

darl_run \
    algorithm.rollout_correction.bypass_mode=true \
    replay.enable=false \
    "$@"
