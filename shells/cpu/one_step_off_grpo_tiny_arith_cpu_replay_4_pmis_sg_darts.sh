#!/usr/bin/env bash
# The preset on CPU (as in the `_pmis_sg` script) plus DARTS (docs/darts.md): adaptive redundancy (r_i in [n, 2n],
# 1.25 n on average), each group's tail aborted once n responses finished (L = 0). On the long-tail example by default
# (TASK=longtail: the untrained tiny model, whose response lengths have a long tail); variables: shells/cpu/common.sh.
set -euo pipefail
export TASK="${TASK:-longtail}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_cpu_setup
darl_cpu_run \
    algorithm.rollout_correction.bypass_mode=false \
    algorithm.rollout_is=true \
    algorithm.rollout_is_threshold=2.0 \
    replay.enable=true \
    replay.k=4 \
    replay.pmis=true \
    replay.stop_grad=true \
    replay.warmup=2 \
    rollout_shaping.enable=true \
    rollout_shaping.adaptive=true \
    "$@"
