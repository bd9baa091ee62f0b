#!/usr/bin/env bash
# The testbed validation (docs/evidence.md, "Does the testbed model the problem?"), into OUT (default
# runs/validation); finished runs are skipped, so an interrupted validation goes on where it stopped.
#   bash benchmarks/staleness/validate.sh [OUT]
# Stage 1: on-policy training (sync, s = 0) at every learning rate of LRS over SYNC_SEEDS (development seeds).
# Stage 2: at sync's best learning rate, decoupled PPO and naive async at s = 4 and 8, with sync, over STALE_SEEDS.
# TASK picks the regime (scarce: the fixed pool of 256 hard sums; arithmetic: fresh sums every step).
set -euo pipefail
OUT="${1:-runs/validation}"
TASK="${TASK:-scarce}"
LRS="${LRS:-3e-5 1e-4 2e-4 4e-4}"
SYNC_SEEDS="${SYNC_SEEDS:-0 1 2 3 4 5}"
STALE_SEEDS="${STALE_SEEDS:-0 1 2 3 4 5 6 7}"
STEPS="${STEPS:-50}"
JOBS="${JOBS:-2}"
export OMP_NUM_THREADS=1
PY="${PYTHON:-python}"
common=(--task "$TASK" --steps "$STEPS" --eval-every 10 --val-size 500 --minibatches 2 --jobs "$JOBS")
for lr in $LRS; do
    "$PY" -m benchmarks.staleness.run_study --out "$OUT/$TASK/lr$(printf %g "$lr")" --lr "$lr" "${common[@]}" \
        --staleness 4 --seeds $SYNC_SEEDS --methods sync
done
best=$("$PY" -c "
from pathlib import Path; from benchmarks.staleness.validation import by_lr, best_lr
print(format(best_lr(by_lr(Path('$OUT/$TASK'))), 'g'))")
echo "sync's best learning rate: $best"
"$PY" -m benchmarks.staleness.run_study --out "$OUT/$TASK/lr$best" --lr "$best" "${common[@]}" \
    --staleness 4 8 --seeds $STALE_SEEDS --methods sync decoupled naive
"$PY" -m benchmarks.staleness.validation "$OUT/$TASK" --out "$OUT/$TASK/validation.md"
