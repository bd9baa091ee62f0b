#!/usr/bin/env bash
# The preset on CPU (as in the `_pmis_sg` script) plus DARTS (docs/darts.md) with the released code's defaults:
# adaptive redundancy (r_i in [1.25n, 2n], 1.5 n on average; n = 8: [10, 16], mean 12), L_i = (2n - r_i) // 2, after
# 10 warm-up steps of r = 1.5 n with every tail aborted once n finished (L = 0). On the long-tail example by default
# (TASK=longtail: the untrained tiny model, whose response lengths have a long tail); variables: shells/cpu/common.sh.
# Two passes a step (ppo_epochs=2), sources weighted by tokens: the preset held-out seeds support (docs/evidence.md).
set -euo pipefail
export TASK="${TASK:-longtail}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_cpu_setup
darl_cpu_run \
    algorithm.rollout_correction.bypass_mode=false \
    algorithm.rollout_is=true \
    algorithm.rollout_is_threshold=2.0 \
    actor_rollout_ref.actor.ppo_epochs=2 \
    replay.enable=true \
    replay.k=4 \
    replay.pmis=true \
    replay.stop_grad=true \
    replay.warmup=2 \
    rollout_shaping.enable=true \
    rollout_shaping.adaptive=true \
    "$@"
