#!/usr/bin/env bash
# Qwen3-4B on MATH, FSDP2 trainer on 2 GPU, vLLM rollout on 2 GPU (one-step-off), configuration `_async`:
# verl's one-step-off trainer as shipped: no replay, PPO-clip against the rollout log-probs (bypass mode).
# Environment variables (model, data, GPUs, logger, checkpoints): see shells/common.sh.
# Extra arguments are Hydra overrides, e.g. `bash one_step_off_grpo_4b_math_fsdp2_2_2_replay_4_async.sh trainer.total_training_steps=200`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_setup 4b math 2 2

darl_run \
    algorithm.rollout_correction.bypass_mode=true \
    replay.enable=false \
    "$@"
