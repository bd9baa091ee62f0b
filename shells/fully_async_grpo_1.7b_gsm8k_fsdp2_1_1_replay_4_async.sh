#!/usr/bin/env bash
# Qwen3-1.7B on GSM8K through verl's fully-async pipeline, FSDP2 trainer on 1 GPU, vLLM rollouter on 1 GPU,
# configuration `_async`: verl's fully-async trainer as shipped: no replay, PPO-clip against the rollout log-probs (bypass mode).
# Environment variables: shells/common.sh (REQUIRE_BATCHES, SYNC_STEPS, STALENESS_THRESHOLD among them).
# Not yet run on a GPU (docs/running.md, 'What has run where').
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_setup 1.7b gsm8k 1 1

darl_fully_async_run \
    algorithm.rollout_correction.bypass_mode=true \
    replay.enable=false \
    "$@"
