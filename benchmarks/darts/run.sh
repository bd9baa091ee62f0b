#!/usr/bin/env bash
# DARTS side by side on the long-tail example (TASK=longtail, docs/darts.md), one-step-off CPU pipeline, n = 8:
#   bash benchmarks/darts/run.sh [OUT]                       (default runs/darts; about 5 min per run on 2 cores)
#   SEEDS="0 1 2" CONFIGS="base adapt0" bash benchmarks/darts/run.sh runs/darts
#   PRESET=off CONFIGS="base adapt0" bash benchmarks/darts/run.sh runs/darts    # decoupled PPO, no replay
#   ROLLOUT=vllm CONFIGS="base adapt0" bash benchmarks/darts/run.sh runs/darts-vllm
# CONFIGS: base (r = n: every response kept, the reference), fixed0 / fixed1 (r = 10, L = 0 / 1),
# adapt0 / adapt1 (adaptive r_i, mean 1.25 n in [n, 2n], L = 0 / 1, no warm-up), released (adaptive=true, every
# other key at its default: the released code's adaptive r_i in [10, 16] with mean 12, L_i = (16 - r_i) // 2, 10
# warm-up steps).
# Summary: benchmarks/darts/summary.py.
set -euo pipefail
OUT="$(realpath -m "${1:-runs/darts}")"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/benchmarks/rollout_env.sh"  # the rollout the archived runs used (hf), unless ROLLOUT is set
SEEDS="${SEEDS:-0}"
CONFIGS="${CONFIGS:-base fixed0 fixed1 adapt0 adapt1 released}"
PRESET="${PRESET:-on}"
export TASK=longtail
case "$PRESET" in
    on) script=one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh ;;
    off) script=one_step_off_grpo_tiny_arith_cpu_replay_4_decoupled.sh ;;
    *) echo "PRESET must be on or off (got '$PRESET')" >&2; exit 1 ;;
esac
for seed in $SEEDS; do
    for cfg in $CONFIGS; do
        case "$cfg" in
            base) darts=(rollout_shaping.responses=8 rollout_shaping.keep_last=0) ;;
            fixed0) darts=(rollout_shaping.responses=10 rollout_shaping.keep_last=0) ;;
            fixed1) darts=(rollout_shaping.responses=10 rollout_shaping.keep_last=1) ;;
            adapt0|adapt1) darts=(rollout_shaping.adaptive=true rollout_shaping.keep_last=${cfg#adapt}
                                  rollout_shaping.mean_ratio=1.25 rollout_shaping.min_responses=8
                                  rollout_shaping.warmup_steps=0) ;;
            released) darts=(rollout_shaping.adaptive=true) ;;
            *) echo "unknown config '$cfg'" >&2; exit 1 ;;
        esac
        run="$OUT/preset_$PRESET/seed$seed/$cfg"
        [ -s "$run/metrics.jsonl" ] && grep -q '"step":'"${STEPS:-15}"',' "$run/metrics.jsonl" && continue
        mkdir -p "$run"
        OUT_DIR="$run" STEPS="${STEPS:-15}" TEST_FREQ="${STEPS:-15}" SAVE_FREQ=1000 RESUME_MODE=disable N_RESPONSES=8 \
            bash "$ROOT/shells/cpu/$script" rollout_shaping.enable=true "${darts[@]}" \
            actor_rollout_ref.rollout.seed=$((42 + seed)) data.seed=$seed > "$run.log" 2>&1 \
            || { echo "$cfg seed $seed failed: $run.log"; exit 1; }
        echo "$cfg seed $seed (preset $PRESET) done: $run/metrics.jsonl"
    done
done
