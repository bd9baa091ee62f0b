#!/usr/bin/env bash
# The built-in example on CPU, configuration `_decoupled`: recomputed proximal policy,
# token-level truncated IS (C = 2), no replay. Variables: shells/cpu/common.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_cpu_setup
darl_cpu_run \
    algorithm.rollout_correction.bypass_mode=false \
    algorithm.rollout_is=true \
    algorithm.rollout_is_threshold=2.0 \
    replay.enable=false \
    "$@"
