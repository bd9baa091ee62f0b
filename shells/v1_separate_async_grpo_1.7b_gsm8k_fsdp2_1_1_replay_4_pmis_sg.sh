#!/usr/bin/env bash
# Qwen3-1.7B on GSM8K, FSDP2 trainer on 1 GPU, vLLM rollout on 1 GPU through verl's V1 trainer
# (separate_async, 32 prompts a step: shells/common.sh, darl_v1_run), configuration `_pmis_sg`:
# D-ARL, the preset (docs/algorithm.md): replay over the K = 4 most recent behavior versions, fresh groups first plus
# least-reused replay, pmis weights with stop-gradient, the m2 gate and the behavior trust region, per-prompt replay in the
# place of groups without advantage, warmup 5, C = 2.
# Environment variables (model, data, GPUs, logger, checkpoints): see shells/common.sh.
# Extra arguments are Hydra overrides, e.g. `bash v1_separate_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh trainer.total_training_steps=200`.
# Two passes a step (ppo_epochs=2), sources weighted by tokens: the preset held-out seeds support (docs/evidence.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-32}" MINI_BATCH_SIZE="${MINI_BATCH_SIZE:-${TRAIN_BATCH_SIZE:-32}}"
darl_setup 1.7b gsm8k 1 1

darl_v1_run \
    algorithm.rollout_correction.bypass_mode=false \
    algorithm.rollout_is=true \
    algorithm.rollout_is_threshold=2.0 \
    actor_rollout_ref.actor.ppo_epochs=2 \
    replay.enable=true \
    replay.k=4 \
    replay.pmis=true \
    replay.stop_grad=true \
    replay.warmup=5 \
    "$@"
