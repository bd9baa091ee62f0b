#!/usr/bin/env bash
# Qwen3-1.7B on GSM8K, one-step-off: FSDP2 trainer on 1 GPU(s), vLLM rollout on 1 GPU(s);
# D-ARL (preset darl_tokens_e2) with DARTS's redundant rollouts and tail cutting.
# The name says what runs (shells/common.sh); PRESET=<name> runs another configuration (docs/config.md); variables:
# shells/common.sh; extra arguments are Hydra overrides, e.g. trainer.total_training_steps=200.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_script "${BASH_SOURCE[0]}" "$@"
