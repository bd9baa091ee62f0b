#!/usr/bin/env bash
# The study through what users run: the CPU seed scripts through verl's pipeline (Ray, FSDP2 trainer, hf rollout
# server, weight sync), for each trainer in TRAINERS, config in CONFIGS and seed in SEEDS; then the report
# (benchmarks/staleness/pipeline_report.py: tables, paired differences, figures).
#   bash benchmarks/staleness/pipeline_check.sh [OUT]      (default runs/pipeline; about 4 min a run of 40 steps on 2 cores)
#   SEEDS="0 1 2" STEPS=20 bash benchmarks/staleness/pipeline_check.sh runs/pipeline
#   TASK=scarce LR=1e-4 TRAINERS="one_step_off fully_async" CONFIGS="decoupled gates_only pmis_sg" SEEDS="0 1 2" \
#       STEPS=40 bash benchmarks/staleness/pipeline_check.sh runs/pipeline-scarce     # the scarce regime (docs/evidence.md)
# TRAINERS: one_step_off (samples one version old) and/or fully_async (STALENESS_THRESHOLD, default 2: up to 3 old).
# CONFIGS: the seed scripts' suffixes (async = naive, decoupled) and, as Hydra overrides on the pmis_sg script, each
# config pinning every per-prompt key it ran with, so the archived runs keep their meaning after the preset changed:
#   pmis_sg          the group-replay preset of sessions 1-8 (replay.prompt_replay=false)
#   pmis_sg_prompt_zero    the preset since the ninth session (the pmis_sg script as shipped: per-prompt replay in the
#                    place of fresh groups without advantage, replay.prompt_replay=16 replay.prompt_replay_when=zero_adv)
#   gates_only       the preset's controls without replay (replay.k=1: m2 gate + trust region on decoupled PPO)
#   equal_update     decoupled PPO with two passes over each batch (actor.ppo_epochs=2)
#   pmis_sg_e2       the preset with two passes over each batch (actor.ppo_epochs=2)
#   sync             decoupled PPO on-policy: fully_async with staleness_threshold 0, no partial rollout (fully_async only)
#   pmis_sg_success  the preset plus success replay (replay.success=1)
#   success_only     decoupled PPO plus success replay (no group replay, no m2 gate, no trust region)
#   pmis_sg_prompt   the preset plus per-prompt replay (replay.prompt_replay=16: RePO's 2n responses kept per prompt)
#   pmis_sg_prompt_shared  the same, history groups inside the group-replay budget (replay.prompt_replay_budget=shared)
#   pmis_sg_prompt_mixed   the same, advantages over a prompt's fresh and history groups together (prompt_replay_norm=mixed)
#   prompt_only      decoupled PPO plus per-prompt replay (no group replay, no m2 gate, no trust region)
# A seed sets the rollout sampler (actor_rollout_ref.rollout.seed) and the data order (data.seed). Finished runs
# (their last step logged) are skipped, so an interrupted study goes on where it stopped.
set -euo pipefail
OUT="$(realpath -m "${1:-runs/pipeline}")"
mkdir -p "$OUT"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SEEDS="${SEEDS:-0}"
TRAINERS="${TRAINERS:-one_step_off}"
CONFIGS="${CONFIGS:-async decoupled pmis_sg}"
STEPS="${STEPS:-30}"
export TASK="${TASK:-arithmetic}"
for seed in $SEEDS; do
    for trainer in $TRAINERS; do
        for cfg in $CONFIGS; do
            extra=()
            envs=()
            script="$cfg"
            case "$cfg" in
                async|decoupled) ;;
                pmis_sg) extra=(replay.prompt_replay=false) ;;
                gates_only) script=pmis_sg; extra=(replay.k=1 replay.warmup=0 replay.filter_zero_adv=false replay.prompt_replay=false) ;;
                equal_update) script=decoupled; extra=(actor_rollout_ref.actor.ppo_epochs=2) ;;
                pmis_sg_e2) script=pmis_sg; extra=(actor_rollout_ref.actor.ppo_epochs=2 replay.prompt_replay=false) ;;
                sync)
                    [ "$trainer" = fully_async ] || { echo "pipeline_check: sync runs under fully_async only (skipped for $trainer)"; continue; }
                    script=decoupled; envs=(STALENESS_THRESHOLD=0 PARTIAL_ROLLOUT=false) ;;
                pmis_sg_success) script=pmis_sg; extra=(replay.success=1 replay.prompt_replay=false) ;;
                pmis_sg_prompt) script=pmis_sg; extra=(replay.prompt_replay=16 replay.prompt_replay_when=always) ;;
                pmis_sg_prompt_shared) script=pmis_sg; extra=(replay.prompt_replay=16 replay.prompt_replay_when=always
                                                             replay.prompt_replay_budget=shared) ;;
                pmis_sg_prompt_mixed) script=pmis_sg; extra=(replay.prompt_replay=16 replay.prompt_replay_when=always
                                                            replay.prompt_replay_norm=mixed) ;;
                pmis_sg_prompt_zero) script=pmis_sg; extra=(replay.prompt_replay=16 replay.prompt_replay_when=zero_adv) ;;
                prompt_only)
                    script=pmis_sg
                    extra=(replay.k=1 replay.warmup=0 replay.filter_zero_adv=false replay.behavior_clip=false
                           replay.m2_budget=false replay.prompt_replay=16 replay.prompt_replay_when=always) ;;
                success_only)
                    script=pmis_sg
                    extra=(replay.k=1 replay.warmup=0 replay.filter_zero_adv=false replay.behavior_clip=false
                           replay.m2_budget=false replay.success=1 replay.prompt_replay=false) ;;
                *) echo "pipeline_check: unknown config '$cfg' in CONFIGS" >&2; exit 2 ;;
            esac
            case "$trainer" in
                one_step_off|fully_async) ;;
                *) echo "pipeline_check: unknown trainer '$trainer' in TRAINERS (one_step_off, fully_async)" >&2; exit 2 ;;
            esac
            dir="$OUT/$trainer/seed$seed"
            [ -s "$dir/$cfg/metrics.jsonl" ] && grep -q "\"step\": *$STEPS[,}]" "$dir/$cfg/metrics.jsonl" && continue
            rm -rf "${dir:?}/$cfg"
            mkdir -p "$dir"
            start=$(date +%s)
            env "${envs[@]}" OUT_DIR="$dir/$cfg" STEPS="$STEPS" TEST_FREQ="${TEST_FREQ:-10}" SAVE_FREQ=1000 RESUME_MODE=disable \
                bash "$ROOT/shells/cpu/${trainer}_grpo_tiny_arith_cpu_replay_4_${script}.sh" \
                actor_rollout_ref.rollout.seed=$((42 + seed)) data.seed=$seed "${extra[@]}" \
                > "$dir/$cfg.log" 2>&1 || { echo "$trainer $cfg seed $seed failed: $dir/$cfg.log"; exit 1; }
            echo "$trainer $cfg seed $seed done in $(( $(date +%s) - start )) s: $dir/$cfg/metrics.jsonl"
        done
    done
done
PYTHONPATH="$ROOT" "${PYTHON:-$ROOT/.venv/bin/python}" -m benchmarks.staleness.pipeline_report "$OUT"
