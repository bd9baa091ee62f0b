#!/usr/bin/env bash
# Qwen3-1.7B on GSM8K through verl's fully-async pipeline, FSDP2 trainer on 1 GPU, vLLM rollouter on 1 GPU,
# configuration `_decoupled`: decoupled PPO: old log-probs recomputed by the trainer (under the last sync's parameters),
# token-level truncated IS, C = 2; no replay.
# Environment variables: shells/common.sh (REQUIRE_BATCHES, SYNC_STEPS, STALENESS_THRESHOLD among them).
# Not yet run on a GPU (docs/running.md, 'What has run where').
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_setup 1.7b gsm8k 1 1

darl_fully_async_run \
    algorithm.rollout_correction.bypass_mode=false \
    algorithm.rollout_is=true \
    algorithm.rollout_is_threshold=2.0 \
    replay.enable=false \
    "$@"
