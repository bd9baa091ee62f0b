#!/usr/bin/env bash
# The study through what users run: the CPU launch scripts through verl's pipeline (Ray, FSDP2 trainer, hf rollout
# server, weight sync), for each trainer in TRAINERS, config in CONFIGS and seed in SEEDS; then the report
# (benchmarks/staleness/pipeline_report.py: tables, paired differences with 95% intervals, figures).
#   bash benchmarks/staleness/pipeline_check.sh [OUT]      (default runs/pipeline; about 4 min a run of 40 steps on 2 cores)
#   TASK=scarce LR=1e-4 TRAINERS="one_step_off fully_async" CONFIGS="decoupled pmis_sg" SEEDS="0 1 2" \
#       STEPS=40 bash benchmarks/staleness/pipeline_check.sh runs/pipeline-scarce     # docs/evidence/before_protocol.md
# TRAINERS: one_step_off (samples one version old), fully_async (STALENESS_THRESHOLD, default 2: up to 3 old) and/or
# v1_colocate_async (verl's V1 trainer: the next batch is generated during the update, partial rollouts).
# CONFIGS: the launch scripts' suffixes, each pinned by Hydra overrides to what it ran so that a later change of the
# preset cannot change what an archived name means:
#   async              naive async (the _async script)
#   decoupled          decoupled PPO (the _decoupled script)
#   pmis_sg            the preset until 2026-12-02 (the _pmis_sg script, one pass, ESS source weights: per-prompt
#                      replay in the place of fresh groups without advantage); the preset now: darl_tokens_e2
#   pmis_sg_no_prompt  the group-replay preset: pmis_sg with replay.prompt_replay=false
#   gates_only         pmis_sg's controls without replay (replay.k=1: m2 gate + trust region on decoupled PPO)
#   equal_update       decoupled PPO with two passes over each batch (actor.ppo_epochs=2)
#   sync               decoupled PPO on-policy: fully_async with staleness_threshold 0, no partial rollout (fully_async only)
#   any other name of the study's configurations (benchmarks/staleness/run_study.py, METHODS): the script and the
#   overrides benchmarks/staleness/pipeline_configs.py gives it, every replay setting pinned (e.g. darl_tokens_e2)
# A seed sets the rollout sampler (actor_rollout_ref.rollout.seed) and the data order (data.seed). Finished runs
# (their last step logged) are skipped, so an interrupted study goes on where it stopped; a failed run is named and
# the others still run. VERSUS: the configurations every other one is compared with, paired [decoupled gates_only].
set -euo pipefail
OUT="$(realpath -m "${1:-runs/pipeline}")"
mkdir -p "$OUT"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/benchmarks/rollout_env.sh"  # the rollout the archived runs used (hf), unless ROLLOUT is set
SEEDS="${SEEDS:-0}"
unset SEED  # each run sets its seeds below, as the archived runs did
TRAINERS="${TRAINERS:-one_step_off}"
CONFIGS="${CONFIGS:-async decoupled pmis_sg}"
STEPS="${STEPS:-30}"
export TASK="${TASK:-arithmetic}"
failed=()
before=(replay.source_weight=ess actor_rollout_ref.actor.ppo_epochs=1)
commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
# every launch's start, finish or failure in OUT/attempts.jsonl (benchmarks/staleness/attempts.py): a failed or
# interrupted launch leaves a trace after its folder is cleared for the retry
attempt() {
    printf '{"event": "%s", "trainer": "%s", "config": "%s", "seed": %s, "host": "%s", "commit": "%s", "time": "%s"}\n' \
        "$1" "$trainer" "$cfg" "$seed" "$(hostname)" "$commit" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$OUT/attempts.jsonl"
}
for seed in $SEEDS; do
    for trainer in $TRAINERS; do
        for cfg in $CONFIGS; do
            extra=()
            envs=()
            script="$cfg"
            case "$cfg" in
                async|decoupled) ;;
                # the archived names: one pass, ESS source weights (the script's preset until 2026-12-02)
                pmis_sg) extra=(replay.prompt_replay=16 "${before[@]}") ;;
                pmis_sg_no_prompt) script=pmis_sg; extra=(replay.prompt_replay=false "${before[@]}") ;;
                gates_only) script=pmis_sg; extra=(replay.k=1 replay.warmup=0 replay.filter_zero_adv=false replay.prompt_replay=false "${before[@]}") ;;
                equal_update) script=decoupled; extra=(actor_rollout_ref.actor.ppo_epochs=2) ;;
                sync)
                    [ "$trainer" = fully_async ] || { echo "pipeline_check: sync runs under fully_async only (skipped for $trainer)"; continue; }
                    script=decoupled; envs=(STALENESS_THRESHOLD=0 PARTIAL_ROLLOUT=false) ;;
                *)  # any other configuration of the study, as benchmarks/staleness/pipeline_configs.py maps it
                    line=$(PYTHONPATH="$ROOT" "${PYTHON:-$ROOT/.venv/bin/python}" -m benchmarks.staleness.pipeline_configs "$cfg" 2>/dev/null) \
                        || { echo "pipeline_check: unknown config '$cfg' in CONFIGS" >&2; exit 2; }
                    read -r -a words <<< "$line"
                    script="${words[0]}"; i=1
                    while [[ "${words[i]}" != -- ]]; do envs+=("${words[i]}"); i=$((i + 1)); done
                    extra=("${words[@]:i+1}")
                    if [[ ${#envs[@]} -gt 0 && "$trainer" != fully_async ]]; then
                        echo "pipeline_check: $cfg runs under fully_async only (skipped for $trainer)"; continue
                    fi ;;
            esac
            case "$trainer" in
                one_step_off|fully_async|v1_colocate_async) ;;
                *) echo "pipeline_check: unknown trainer '$trainer' in TRAINERS (one_step_off, fully_async, v1_colocate_async)" >&2; exit 2 ;;
            esac
            dir="$OUT/$trainer/seed$seed"
            [ -s "$dir/$cfg/metrics.jsonl" ] && grep -q "\"step\": *$STEPS[,}]" "$dir/$cfg/metrics.jsonl" && continue
            rm -rf "${dir:?}/$cfg"
            mkdir -p "$dir"
            start=$(date +%s)
            attempt started
            env "${envs[@]}" OUT_DIR="$dir/$cfg" STEPS="$STEPS" TEST_FREQ="${TEST_FREQ:-10}" SAVE_FREQ=1000 RESUME_MODE=disable \
                bash "$ROOT/shells/cpu/${trainer}_grpo_tiny_arith_cpu_replay_4_${script}.sh" \
                actor_rollout_ref.rollout.seed=$((42 + seed)) data.seed=$seed "${extra[@]}" \
                > "$dir/$cfg.log" 2>&1 || {
                    attempt failed; echo "$trainer $cfg seed $seed failed: $dir/$cfg.log"; failed+=("$dir/$cfg.log"); continue; }
            attempt finished
            echo "$trainer $cfg seed $seed done in $(( $(date +%s) - start )) s: $dir/$cfg/metrics.jsonl"
        done
    done
done
# shellcheck disable=SC2086  # VERSUS is a list of names
PYTHONPATH="$ROOT" "${PYTHON:-$ROOT/.venv/bin/python}" -m benchmarks.staleness.pipeline_report "$OUT" --versus ${VERSUS:-decoupled gates_only}
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "pipeline_check: ${#failed[@]} run(s) failed (the rest ran; a relaunch retries them): ${failed[*]}" >&2
    exit 1
fi
