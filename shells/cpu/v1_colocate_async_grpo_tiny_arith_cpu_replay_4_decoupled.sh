#!/usr/bin/env bash
# The built-in example on CPU through verl's V1 trainer (V1_MODE: colocate_async, or separate_async), configuration
# `_decoupled`: verl's own V1 step with a recomputed proximal policy, token-level truncated IS (C = 2), no replay.
# Variables: shells/cpu/common.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_cpu_setup
darl_cpu_v1_run \
    algorithm.rollout_correction.bypass_mode=false \
    algorithm.rollout_is=true \
    algorithm.rollout_is_threshold=2.0 \
    replay.enable=false \
    "$@"
