#!/usr/bin/env bash
# The built-in example on CPU through verl's fully-async pipeline, configuration `_async`:
# verl's fully-async trainer as shipped: no replay, PPO-clip against the rollout log-probs (bypass mode).
# Variables: shells/cpu/common.sh (REQUIRE_BATCHES, SYNC_STEPS, STALENESS_THRESHOLD, PARTIAL_ROLLOUT among them).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_cpu_setup
darl_cpu_fully_async_run \
    algorithm.rollout_correction.bypass_mode=true \
    replay.enable=false \
    "$@"
