#!/usr/bin/env bash
# The built-in example on CPU (tiny Qwen3, sums), one-step-off; D-ARL (preset darl_tokens_e2).
# The name says what runs (shells/cpu/common.sh); PRESET=<name> runs another configuration (docs/config.md); variables:
# shells/cpu/common.sh; extra arguments are Hydra overrides.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
darl_cpu_script "${BASH_SOURCE[0]}" "$@"
