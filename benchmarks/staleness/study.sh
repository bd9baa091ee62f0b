#!/usr/bin/env bash
# The studies docs/evidence/before_protocol.md reports, into OUT (default runs/study); finished runs are skipped, so
# an interrupted study goes on where it stopped. Times are in the Makefile's `make evidence`. The protocol's study
# (docs/evidence.md) is protocol.sh.
#   bash benchmarks/staleness/study.sh [OUT]
#   STEPS=10 SEEDS=0 bash benchmarks/staleness/study.sh runs/study-mini    # reduced: 1 seed, 10 steps, minutes
# SCARCE_ONLY=1 stops after the scarce regime in the harness; NO_PIPELINE=1 skips the runs through verl's trainers.
set -euo pipefail
OUT="${1:-runs/study}"
STEPS="${STEPS:-50}"
SEEDS="${SEEDS:-0 1 2 3 4 5 6 7 8 9 10 11}"
JOBS="${JOBS:-2}"
export OMP_NUM_THREADS=1
PY="${PYTHON:-python}"
common=(--steps "$STEPS" --eval-every 10 --val-size 500 --minibatches 2 --jobs "$JOBS")
# scarce: a fixed pool of 256 hard sums revisited for epochs (start: 15% of samples right, 47% of groups all wrong)
scarce() { "$PY" -m benchmarks.staleness.run_study --out "$OUT/scarce" --task scarce --lr 1e-4 "${common[@]}" "$@"; }
scarce --staleness 4 --seeds $SEEDS --methods decoupled darl gates_only naive sync equal_update
scarce --staleness 8 1 --seeds $SEEDS --methods decoupled darl
scarce --staleness 4 8 1 --seeds $(echo $SEEDS | cut -d' ' -f1-6) --methods darl_no_prompt   # the group-replay preset
scarce --report-only
"$PY" -m benchmarks.staleness.targets "$OUT/scarce" --out "$OUT/scarce/headline.md"
[ -n "${SCARCE_ONLY:-}" ] && exit 0
# the same regime through what users run: the CPU launch scripts through verl's two trainers (Ray, FSDP2, hf rollout)
if [ -z "${NO_PIPELINE:-}" ]; then
    TASK=scarce LR=1e-4 STEPS="$(( STEPS < 40 ? STEPS : 40 ))" SEEDS="$SEEDS" PYTHON="$PY" TRAINERS="one_step_off fully_async" \
        CONFIGS="decoupled pmis_sg" bash "$(dirname "${BASH_SOURCE[0]}")/pipeline_check.sh" "$OUT/pipeline_scarce"
fi
# where prompts do not come back (fresh sums every step) per-prompt replay builds nothing: the preset is the
# group-replay preset there. Stress: lr 2e-4 at s = 8, where decoupled PPO collapses; benign: lr 5e-5 at s = 4.
few=$(echo $SEEDS | cut -d' ' -f1-3)
"$PY" -m benchmarks.staleness.run_study --out "$OUT/stress_shipped" --lr 2e-4 "${common[@]}" --staleness 8 --seeds $few \
    --methods decoupled darl_no_prompt naive
"$PY" -m benchmarks.staleness.run_study --out "$OUT/benign_shipped" --lr 5e-5 "${common[@]}" --staleness 4 --seeds $few \
    --methods decoupled darl darl_no_prompt gates_only naive
