#!/usr/bin/env bash
# Qwen3-1.7B on GSM8K, fully-async: FSDP2 trainer on 1 GPU(s), vLLM rollout on 1 GPU(s);
# verl's trainer as shipped (preset naive: PPO-clip against the rollout's log-probs).
# The name says what runs (shells/common.sh); PRESET=<name> runs another configuration (docs/config.md); variables:
# shells/common.sh; extra arguments are Hydra overrides, e.g. trainer.total_training_steps=200.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_script "${BASH_SOURCE[0]}" "$@"
