#!/usr/bin/env bash
# The built-in example on CPU through verl's fully-async pipeline, configuration `_decoupled`:
# decoupled PPO: old log-probs recomputed by the trainer, token-level truncated IS, C = 2; no replay.
# Variables: shells/cpu/common.sh (REQUIRE_BATCHES, SYNC_STEPS, STALENESS_THRESHOLD, PARTIAL_ROLLOUT among them).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_cpu_setup
darl_cpu_fully_async_run \
    algorithm.rollout_correction.bypass_mode=false \
    algorithm.rollout_is=true \
    algorithm.rollout_is_threshold=2.0 \
    replay.enable=false \
    "$@"
