#!/usr/bin/env bash
# The built-in example on CPU through verl's fully-async pipeline, configuration `_pmis_sg`:
# D-ARL, the preset (docs/algorithm.md): replay over K = 4 parameter versions, fresh groups first plus
# least-reused replay, pmis weights with stop-gradient, the m2 gate and the behavior trust region, C = 2;
# per-prompt replay in the place of groups without advantage (replay.prompt_replay=false turns it off).
# Variables: shells/cpu/common.sh (REQUIRE_BATCHES, SYNC_STEPS, STALENESS_THRESHOLD, PARTIAL_ROLLOUT among them).
# Two passes a step (ppo_epochs=2), sources weighted by tokens: the preset held-out seeds support (docs/evidence.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_cpu_setup
darl_cpu_fully_async_run \
    algorithm.rollout_correction.bypass_mode=false \
    algorithm.rollout_is=true \
    algorithm.rollout_is_threshold=2.0 \
    actor_rollout_ref.actor.ppo_epochs=2 \
    replay.enable=true \
    replay.k=4 \
    replay.pmis=true \
    replay.stop_grad=true \
    replay.warmup=2 \
    "$@"
