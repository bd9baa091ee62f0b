#!/usr/bin/env bash
# The built-in example on CPU, configuration `_async`: verl one-step-off as shipped, no replay,
# PPO-clip against the rollout log-probs (bypass mode). Variables: shells/cpu/common.sh.
# Extra arguments are Hydra overrides, e.g. `bash shells/cpu/..._async.sh trainer.total_training_steps=10`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_cpu_setup
darl_cpu_run \
    algorithm.rollout_correction.bypass_mode=true \
    replay.enable=false \
    "$@"
