#!/usr/bin/env bash
# Qwen3-4B on MATH, FSDP2 trainer on 2 GPU, vLLM rollout on 2 GPU (one-step-off), configuration `_pmis_sg`:
# D-ARL, the preset (docs/algorithm.md): replay over the K = 4 most recent behavior versions, fresh groups first plus
# least-reused replay, pmis weights with stop-gradient, the m2 gate and the behavior trust region, per-prompt replay in the
# place of groups without advantage, warmup 5, C = 2.
# Environment variables (model, data, GPUs, logger, checkpoints): see shells/common.sh.
# Extra arguments are Hydra overrides, e.g. `bash one_step_off_grpo_4b_math_fsdp2_2_2_replay_4_pmis_sg.sh trainer.total_training_steps=200`.
# Two passes a step (ppo_epochs=2), sources weighted by tokens: the preset held-out seeds support (docs/evidence.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_setup 4b math 2 2

darl_run \
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
