#!/usr/bin/env bash
# Qwen3-1.7B on GSM8K through verl's fully-async pipeline, FSDP2 trainer on 1 GPU, vLLM rollouter on 1 GPU: the
# preset (as in the `_pmis_sg` script) plus DARTS (docs/darts.md) with the released code's defaults: adaptive
# redundancy (n = 8: r_i in [10, 16], mean 12, planned per prompt against the 1,024 most recent), L_i = (16 - r_i) // 2,
# after 10 warm-up steps of r = 12 with every tail aborted once n finished (L = 0). Variables: shells/common.sh.
# Not yet run on a GPU (docs/running.md, 'What has run where').
# Two passes a step (ppo_epochs=2), sources weighted by tokens: the preset held-out seeds support (docs/evidence.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_setup 1.7b gsm8k 1 1

darl_fully_async_run \
    algorithm.rollout_correction.bypass_mode=false \
    algorithm.rollout_is=true \
    algorithm.rollout_is_threshold=2.0 \
    actor_rollout_ref.actor.ppo_epochs=2 \
    replay.enable=true \
    replay.k=4 \
    replay.pmis=true \
    replay.stop_grad=true \
    replay.warmup=5 \
    rollout_shaping.enable=true \
    rollout_shaping.adaptive=true \
    "$@"
