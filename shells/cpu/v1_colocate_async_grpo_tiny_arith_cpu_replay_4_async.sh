#!/usr/bin/env bash
# The built-in example on CPU through verl's V1 trainer (V1_MODE: colocate_async, or separate_async), configuration
# `_async`: verl's own V1 step, no replay, PPO-clip against the rollout log-probs (bypass mode).
# Variables: shells/cpu/common.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_cpu_setup
darl_cpu_v1_run \
    algorithm.rollout_correction.bypass_mode=true \
    replay.enable=false \
    "$@"
