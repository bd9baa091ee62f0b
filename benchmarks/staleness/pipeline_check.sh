#!/usr/bin/env bash
# The confirmation point of docs/evidence.md: the three CPU seed scripts through the verl pipeline
# (one-step-off, s = 1, the same task and model as the harness), for each seed in SEEDS.
#   bash benchmarks/staleness/pipeline_check.sh [OUT]      (default runs/pipeline; about 15 min per seed on 2 cores)
#   SEEDS="0 1 2" STEPS=20 bash benchmarks/staleness/pipeline_check.sh runs/pipeline
#   TASK=scarce CONFIGS="decoupled pmis_sg pmis_sg_success" SEEDS="0 1 2" STEPS=20 \
#       bash benchmarks/staleness/pipeline_check.sh runs/pipeline-scarce     # the scarce regime
# CONFIGS: seed-script suffixes (async, decoupled, pmis_sg), pmis_sg_success (the preset with replay.success=1), or
# success_only (decoupled PPO plus success replay: no group replay, no m2 gate, no trust region).
# A seed sets the rollout sampler (actor_rollout_ref.rollout.seed) and the data order (data.seed).
set -euo pipefail
OUT="$(realpath -m "${1:-runs/pipeline}")"
mkdir -p "$OUT"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SEEDS="${SEEDS:-0}"
CONFIGS="${CONFIGS:-async decoupled pmis_sg}"
export TASK="${TASK:-arithmetic}"
for seed in $SEEDS; do
    for cfg in $CONFIGS; do
        extra=()
        script="$cfg"
        if [ "$cfg" = pmis_sg_success ]; then script=pmis_sg; extra=(replay.success=1); fi
        if [ "$cfg" = success_only ]; then
            script=pmis_sg
            extra=(replay.k=1 replay.warmup=0 replay.filter_zero_adv=false replay.behavior_clip=false
                   replay.m2_budget=false replay.success=1)
        fi
        name="one_step_off_grpo_tiny_arith_cpu_replay_4_${script}"
        [ -s "$OUT/seed$seed/$cfg/metrics.jsonl" ] && grep -q '"step": '"${STEPS:-30}"'' "$OUT/seed$seed/$cfg/metrics.jsonl" && continue
        mkdir -p "$OUT/seed$seed"
        OUT_DIR="$OUT/seed$seed/$cfg" STEPS="${STEPS:-30}" TEST_FREQ=10 SAVE_FREQ=1000 RESUME_MODE=disable \
            bash "$ROOT/shells/cpu/$name.sh" actor_rollout_ref.rollout.seed=$((42 + seed)) data.seed=$seed "${extra[@]}" \
            > "$OUT/seed$seed/$cfg.log" 2>&1 || { echo "$cfg seed $seed failed: $OUT/seed$seed/$cfg.log"; exit 1; }
        echo "$cfg seed $seed done: $OUT/seed$seed/$cfg/metrics.jsonl"
    done
done
PYTHONPATH="$ROOT" CONFIGS="$CONFIGS" "${PYTHON:-$ROOT/.venv/bin/python}" - "$OUT" $SEEDS <<'PY'
import os
import statistics
import sys
from pathlib import Path
from recipe.darl.demo import VAL_KEY
from recipe.darl.plot import read_log
out, seeds = Path(sys.argv[1]), sys.argv[2:]
print("| config | seed | greedy val accuracy at step |\n|---|---|---|")
finals = {}
for cfg in os.environ["CONFIGS"].split():
    for seed in seeds:
        accs = read_log(out / f"seed{seed}" / cfg / "metrics.jsonl").get(VAL_KEY, [])
        if accs:
            finals.setdefault(cfg, []).append(accs[-1][1])
        print(f"| {cfg} | {seed} | " + ", ".join(f"{s}: {a:.3f}" for s, a in accs) + " |")
print("\n| config | final, mean ± std over seeds |\n|---|---|")
for cfg, vals in finals.items():
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    print(f"| {cfg} | {statistics.mean(vals):.3f} ± {std:.3f} (n={len(vals)}) |")
PY
